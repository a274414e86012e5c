"""The /workspace layout, its validation, and the sandbox argv (pure functions, no process)."""

from __future__ import annotations

import os
import pwd
import shutil
import sys
from pathlib import Path

import pytest

from ma_jupyter.backends.base import OUTPUTS_VIEW, Attempt
from ma_jupyter.errors import InvalidSpec
from ma_jupyter.models import DatasetMount, DatasetSource, Image, JobSpec, Spec
from ma_jupyter.modes import Placement, TaskSlot, plan_job
from ma_jupyter.nodehost.bwrap import SHOWN_FD, bwrap_argv, reader_argv
from ma_jupyter.nodehost.host_policy import RunAs
from ma_jupyter.nodehost.image import resolve_image
from ma_jupyter.nodehost.launch import command_argv, node_launches
from ma_jupyter.nodehost.mounts import mounts_for, node_workdir
from ma_jupyter.nodehost.view import EXEC_ENV, SYSTEM_PATH, hosts_file, node_env, node_view, to_host
from ma_jupyter.nodeside.exec_env import ENV_FD, ENV_FILE
from tests.helpers import writable_dir


@pytest.fixture
def ma_paths(ma_home, tmp_path):
    paths = {n: tmp_path / n for n in ("data", "data2", "model", "out", "vol", "algo", "anno")}
    for p in paths.values():
        writable_dir(p)
    return paths


def full_spec(p, **extra) -> JobSpec:
    return JobSpec(
        name="j",
        command="python train.py",
        algorithm=str(p["algo"]),
        datasets=[
            {"name": "d", "path": str(p["data"])},
            {"name": "e", "path": str(p["data2"]), "source": "favorite", "version": "v2", "read_only": False},
        ],
        annotations=[{"name": "a", "path": str(p["anno"])}],
        models=[{"name": "m", "path": str(p["model"]), "source": "pretrained"}],
        volumes=[{"name": "v", "path": str(p["vol"])}],
        outputs=str(p["out"]),
        **extra,
    )


def test_layout_follows_the_platform(ma_paths):
    mounts = {m.target: m for m in mounts_for(full_spec(ma_paths))}
    assert {t: (m.read_only, m.kind) for t, m in mounts.items()} == {
        "/workspace/algorithm": (True, "algorithm"),
        "/workspace/anno_dataset/a/annotation": (True, "annotation"),
        "/workspace/dataset/private/d": (True, "dataset"),
        "/workspace/dataset/favorite/e/v2": (False, "dataset"),
        "/workspace/model/pretrained/m": (True, "model"),
        "/workspace/outputs": (False, "outputs"),
        "/workspace/volume/v": (False, "volume"),
    }
    assert mounts["/workspace/dataset/private/d"].source == str(ma_paths["data"].resolve())


def test_outputs_default_and_batch_subfolder(ma_paths, tmp_path):
    spec = JobSpec(name="j", command="python x.py")
    [out] = mounts_for(spec, job_dir=tmp_path / "jobs" / "j-1")
    assert (out.source, out.create) == (str(tmp_path / "jobs" / "j-1" / "outputs"), True)
    spec = JobSpec(name="j", command="python x.py", outputs=str(ma_paths["out"]))
    [out] = mounts_for(spec, outputs_subdir="j-3")
    assert out.source == str(ma_paths["out"].resolve() / "j-3") and out.create
    with pytest.raises(InvalidSpec):
        mounts_for(spec, outputs_subdir="../escape")


def test_missing_or_relative_paths_say_what_to_do(tmp_path):
    missing = tmp_path / "nope"
    spec = JobSpec(name="j", command="python x.py", datasets=[{"name": "d", "path": str(missing)}])
    with pytest.raises(InvalidSpec) as exc:
        mounts_for(spec)
    assert str(missing) in exc.value.message and "mkdir -p" in exc.value.message
    assert exc.value.field == "datasets"
    with pytest.raises(InvalidSpec, match="absolute"):
        mounts_for(JobSpec(name="j", command="python x.py", volumes=[{"name": "v", "path": "rel/dir"}]))
    file = tmp_path / "f.txt"
    file.write_text("x")
    with pytest.raises(InvalidSpec, match="not a folder"):
        mounts_for(JobSpec(name="j", command="python x.py", outputs=str(file)))


def test_symlinks_are_resolved_and_escapes_refused(ma_paths, tmp_path):
    link = tmp_path / "link"
    link.symlink_to(ma_paths["data"])
    [data, _] = mounts_for(
        JobSpec(name="j", command="python x.py", datasets=[{"name": "d", "path": str(link)}])
    )
    assert data.source == str(ma_paths["data"].resolve())
    # names are validated by the model; a spec built around that validation is still refused
    sneaky = JobSpec(name="j", command="python x.py")
    sneaky.datasets.append(
        DatasetMount.model_construct(
            name="../../etc",
            path=str(ma_paths["data"]),
            source=DatasetSource.private,
            version=None,
            read_only=True,
        )
    )
    with pytest.raises(InvalidSpec, match="folder name"):
        mounts_for(sneaky)


def test_overlapping_mounts_are_refused(ma_paths):
    spec = JobSpec(
        name="j",
        command="python x.py",
        datasets=[
            {"name": "d", "path": str(ma_paths["data"])},
            {"name": "d", "path": str(ma_paths["data2"]), "version": "v1"},
        ],
    )
    with pytest.raises(InvalidSpec, match="inside"):
        mounts_for(spec)


def test_workdir(ma_paths):
    # a job without an algorithm works in an empty folder of its own at the same place
    assert node_workdir(JobSpec(name="j", command="python x.py")) == "/workspace/algorithm"
    assert node_workdir(full_spec(ma_paths)) == "/workspace/algorithm"
    assert (
        node_workdir(JobSpec(name="j", command="python x.py", workdir="/workspace/outputs/"))
        == "/workspace/outputs"
    )
    with pytest.raises(InvalidSpec):
        node_workdir(JobSpec(name="j", command="python x.py", workdir="relative"))


def test_images(tmp_path):
    default = resolve_image(Image())
    assert default.python == sys.executable
    assert any(sys.executable.startswith(r + "/") for r in default.roots)
    assert any(os.path.realpath(sys.executable).startswith(r + "/") for r in default.roots)
    venv = resolve_image(Image(venv=sys.prefix))
    assert venv.python == str(Path(sys.prefix).resolve() / "bin" / "python")
    assert venv.env == {"VIRTUAL_ENV": str(Path(sys.prefix).resolve())}
    with pytest.raises(InvalidSpec, match="python -m venv"):
        resolve_image(Image(venv=str(tmp_path)))
    with pytest.raises(InvalidSpec, match="conda env"):
        resolve_image(Image(conda_env="surely-not-an-env"))
    with pytest.raises(InvalidSpec):
        resolve_image(Image(python=str(tmp_path / "python9")))


def _attempt(tmp_path, spec, tasks=2):
    slots = tuple(TaskSlot("worker", i, f"worker-{i}", f"127.0.1.{i + 1}", (0, 0)) for i in range(tasks))
    placement = Placement("job-1", Spec(name="s", cpus=1, memory_gb=1), slots)
    return Attempt(
        "job-1", spec, 0, tmp_path / "jobs" / "job-1", tuple(plan_job(spec, placement, ["python", "x.py"]))
    )


def test_hosts_file_lists_every_task_with_its_own_name_first():
    tasks = [TaskSlot("worker", i, f"worker-{i}", f"127.0.1.{i + 1}", (0,)) for i in range(3)]
    lines = hosts_file(tasks[1], tasks).splitlines()
    assert lines[0] == "127.0.1.2\tworker-1"
    assert "127.0.0.1\tlocalhost" in lines
    assert "127.0.1.1\tworker-0" in lines and "127.0.1.3\tworker-2" in lines
    single = TaskSlot("worker", 0, "worker-0", "127.0.0.1", (0,))
    assert hosts_file(single, [single]).splitlines()[0] == "127.0.0.1\tworker-0 localhost"


def test_bwrap_argv_is_a_minimal_root_without_capabilities(ma_paths, tmp_path):
    attempt = _attempt(tmp_path, full_spec(ma_paths))
    view = node_view(attempt, attempt.plans[1], "bubblewrap")
    argv = bwrap_argv(view, ["python", "x.py"])
    joined = " ".join(argv)
    assert "--dev-bind / /" not in joined and "--bind / /" not in joined
    assert argv[argv.index("--cap-drop") + 1] == "ALL"
    assert "--unshare-pid" in argv and "--die-with-parent" in argv
    assert argv[argv.index("--hostname") + 1] == "worker-1"
    assert argv[argv.index("--chdir") + 1] == "/workspace/algorithm"
    assert f"--ro-bind {ma_paths['data'].resolve()} /workspace/dataset/private/d" in joined
    assert f"--bind {ma_paths['data2'].resolve()} /workspace/dataset/favorite/e/v2" in joined
    assert f"--ro-bind {ma_paths['model'].resolve()} /workspace/model/pretrained/m" in joined
    assert f"--bind {ma_paths['out'].resolve()} /workspace/outputs" in joined
    assert f"--ro-bind {view.node_dir}/hosts /etc/hosts" in joined
    # the system folders read-only: seed 000's /usr/local/nvidia (the host's NVIDIA libraries,
    # read-only) is where the machine has it
    assert "--ro-bind /usr /usr" in joined and "/usr/local/nvidia" not in joined
    # bubblewrap runs from a system path with a cleared environment; inside, the node switches to
    # its account (root's jobs: nobody) before the job's variables apply to its command
    assert argv[0] == shutil.which("bwrap", path=SYSTEM_PATH) and "--clearenv" in argv
    inner = argv[argv.index("--") + 1 :]
    # the job's variables come from a file the runner hands over, never from the command line
    assert inner[-7:] == [view.image.python, "-I", "-S", EXEC_ENV, ENV_FILE, "--", "python", "x.py"][-7:]
    assert argv[argv.index("--ro-bind-data") + 1 : argv.index("--ro-bind-data") + 3] == [ENV_FD, ENV_FILE]
    if os.geteuid() == 0:
        assert inner[:2] == [
            shutil.which("setpriv", path=SYSTEM_PATH),
            f"--reuid={pwd.getpwnam('nobody').pw_uid}",
        ]
        assert argv[argv.index("--cap-drop") + 1 :][:5] == [
            "ALL",
            "--cap-add",
            "CAP_SETUID",
            "--cap-add",
            "CAP_SETGID",
        ]


def test_env_and_argv_of_a_node(ma_paths, tmp_path):
    spec = full_spec(ma_paths, env={"LR": "0.1", "PYTHONPATH": "/mine"})
    attempt = _attempt(tmp_path, spec)
    view = node_view(attempt, attempt.plans[0], "bubblewrap")
    env = node_env(view, attempt.plans[0].env, "m")
    assert env["PATH"].split(":")[0] == str(Path(sys.executable).parent)
    assert env["MA_WORKSPACE"] == "/workspace" and env["MA_RANK_LOG_DIR"] == "/job/logs"
    assert env["LR"] == "0.1" and env["PYTHONUNBUFFERED"] == "1" and env["PYTHONPATH"].startswith("/mine:")
    assert env["MA_TASK_INDEX"] == "0" and env["MA_NODE_RUN"] == "m"
    assert command_argv(view, ["python", "t.py", "--lr", "${LR}"], env) == [
        sys.executable,
        "t.py",
        "--lr",
        "0.1",
    ]


def test_the_jobs_env_expands_from_the_node_env_and_the_dry_run_shows_it(ma_paths, tmp_path):
    env = {"DATA": "${MA_WORKSPACE}/outputs/${MA_TASK_NAME}-${MA_TASK_INDEX}", "PATH": "/opt/bin:$PATH"}
    env |= {"LOG": "$DATA/log on $HOSTNAME", "SECRET": "[$MA_NODE_RUN]", "MA_JOB_ID": "$HOME"}
    attempt = _attempt(tmp_path, full_spec(ma_paths, env=env))
    attempt.plans[0].argv = ["python", "train.py", "--data", "${DATA}"]
    launch = node_launches(attempt, "bubblewrap")[0]
    assert launch.env["DATA"] == "/workspace/outputs/worker-0"
    assert launch.env["PATH"] == f"/opt/bin:{Path(sys.executable).parent}:{SYSTEM_PATH}"
    assert launch.env["LOG"] == f"/workspace/outputs/worker-0/log on {launch.hostname}"
    assert launch.env["SECRET"] == "[]"  # the launch-only marker is never seen
    assert launch.env["MA_JOB_ID"] == attempt.job_id  # the platform's value, not expanded
    # the command expands from the expanded env
    assert launch.command[-2:] == ["--data", "/workspace/outputs/worker-0"]


def test_symlink_mode_rewrites_in_view_paths(ma_paths, tmp_path):
    attempt = _attempt(tmp_path, full_spec(ma_paths))
    attempt.plans[0].files["/etc/mpi/hostfile"] = "x"
    view = node_view(attempt, attempt.plans[0], "symlink")
    tree = str(view.tree)
    assert to_host(view, "/workspace/outputs/m.pt") == f"{tree}/outputs/m.pt"
    assert to_host(view, "--out=/workspace/outputs") == f"--out={tree}/outputs"
    assert to_host(view, "/workspacex") == "/workspacex"
    assert to_host(view, "/etc/mpi/hostfile") == f"{view.files_dir}/etc/mpi/hostfile"
    assert to_host(view, "/job/logs") == view.rank_log_dir
    env = node_env(view, {}, "m")
    assert env["MA_WORKSPACE"] == tree and env["MA_RANK_LOG_DIR"] == view.rank_log_dir
    bwrap_view = node_view(attempt, attempt.plans[0], "bubblewrap")
    assert to_host(bwrap_view, "/workspace/outputs") == "/workspace/outputs"


def test_plan_files_must_stay_in_their_roots(ma_paths, tmp_path):
    attempt = _attempt(tmp_path, full_spec(ma_paths))
    for bad in ("/etc/passwd", "/job/../etc/shadow", "relative/file", "/job/logs/rank-0.log", "/job"):
        attempt.plans[0].files.clear()
        attempt.plans[0].files[bad] = "x"
        with pytest.raises(InvalidSpec):
            node_view(attempt, attempt.plans[0], "bubblewrap")


def test_the_dry_run_checks_image_and_workdir_too(ma_paths, tmp_path):
    def validate(spec):
        return node_launches(_attempt(tmp_path, spec), "bubblewrap")[0].mounts

    assert [m.target for m in validate(full_spec(ma_paths))][0] == "/workspace/algorithm"
    with pytest.raises(InvalidSpec, match="virtualenv"):
        validate(full_spec(ma_paths, image={"venv": str(tmp_path)}))
    with pytest.raises(InvalidSpec, match="workdir"):
        validate(full_spec(ma_paths, workdir="rel"))


# ------------------------------------------------------------- working copy and cache


def test_every_node_works_in_its_own_copy_of_the_algorithm(ma_paths, tmp_path):
    attempt = _attempt(tmp_path, full_spec(ma_paths))
    launches = node_launches(attempt, "bubblewrap")
    for launch in launches:
        [copy] = [m for m in launch.mounts if m.target == "/workspace/algorithm"]
        assert copy.kind == "workdir" and not copy.read_only and copy.create
        assert copy.copy_of == str(ma_paths["algo"].resolve())
        assert copy.source == str(tmp_path / "jobs" / "job-1" / "workdir" / launch.name)
        assert launch.workdir == "/workspace/algorithm"
        # two nodes share the outputs folder: each keeps what it wrote under its own name
        assert f"kept in /workspace/outputs/workdir/{launch.name}" in " ".join(launch.notes)
    view = node_view(attempt, attempt.plans[0], "bubblewrap")
    assert view.export_to == "/workspace/outputs/workdir/worker-0"
    joined = " ".join(bwrap_argv(view, ["python", "x.py"]))
    assert f"--bind {view.working_copy.source} /workspace/algorithm" in joined
    assert str(ma_paths["algo"].resolve()) not in joined  # the original only while it is copied
    first = bwrap_argv(view, ["python", "x.py"], copy=True)
    assert f"--ro-bind {ma_paths['algo'].resolve()} /run/ma_jupyter/algorithm" in " ".join(first)
    inner = first[first.index(EXEC_ENV) :]
    limit = str(view.copy_limit)
    assert inner[2:9] == [
        "--copy",
        "/run/ma_jupyter/algorithm",
        "/workspace/algorithm",
        limit,
        "{copy-fd}",
        "--",
        "python",
    ]


def test_a_single_node_keeps_its_files_in_workdir(ma_paths, tmp_path):
    attempt = _attempt(tmp_path, full_spec(ma_paths), tasks=1)
    assert node_view(attempt, attempt.plans[0], "bubblewrap").export_to == "/workspace/outputs/workdir"


def test_a_writable_or_too_large_algorithm_is_shown_itself(ma_paths, ma_home, tmp_path):
    writable = [
        m
        for m in node_launches(
            _attempt(tmp_path, full_spec(ma_paths, algorithm_read_only=False)), "bubblewrap"
        )[0].mounts
        if m.target == "/workspace/algorithm"
    ]
    assert [(m.kind, m.read_only, m.copy_of) for m in writable] == [("algorithm", False, None)]
    (ma_paths["algo"] / "big.bin").write_bytes(b"x" * (2 << 20))
    cluster = ma_home / "cluster.toml"
    cluster.write_text(cluster.read_text().replace("[mounts]\n", "[mounts]\nworkdir_copy_mb = 1\n"))
    [launch, _] = node_launches(_attempt(tmp_path, full_spec(ma_paths)), "bubblewrap")
    [shown] = [m for m in launch.mounts if m.target == "/workspace/algorithm"]
    assert (shown.kind, shown.read_only, shown.source) == ("algorithm", True, str(ma_paths["algo"].resolve()))
    assert any("holds more than the 1 MB a working copy may take" in n for n in launch.notes)


def test_the_users_cache_is_mounted_at_home_dot_cache(ma_paths, ma_home, tmp_path):
    spec = full_spec(ma_paths).model_copy(update={"creator": "alice"})
    attempt = _attempt(tmp_path, spec)
    view = node_view(attempt, attempt.plans[0], "bubblewrap")
    assert view.cache.source == str(ma_home / "caches" / "alice") and view.cache.target == "/tmp/.cache"
    joined = " ".join(bwrap_argv(view, ["true"]))
    assert f"--bind {ma_home / 'caches' / 'alice'} /tmp/.cache" in joined
    env = node_env(view, {"XDG_CACHE_HOME": "/mine"}, "m")
    assert env["XDG_CACHE_HOME"] == "/mine"  # the job's own variables win
    assert env["TORCH_EXTENSIONS_DIR"].startswith("/tmp/.cache/torch_extensions/")
    # a user name that is no folder name gets a folder of its own all the same
    odd = _attempt(tmp_path, spec.model_copy(update={"creator": "../x y"}))
    source = node_view(odd, odd.plans[0], "bubblewrap").cache.source
    assert Path(source).parent == ma_home / "caches" and Path(source).name.startswith("user-")
    symlink = node_view(attempt, attempt.plans[0], "symlink")
    assert node_env(symlink, {}, "m")["XDG_CACHE_HOME"] == str(symlink.nd.home / ".cache")


WS = "/workspace"


def _hint_mounts():
    from ma_jupyter.nodehost.mounts import Mount

    return [
        Mount("/h/copy", f"{WS}/algorithm", False, "workdir", True, "/h/algo"),
        Mount("/h/d", f"{WS}/dataset/private/mnist", True, "dataset"),
        Mount("/h/m", f"{WS}/model/pretrained/resnet/v1", True, "model"),
        Mount("/h/o", f"{WS}/outputs", False, "outputs"),
    ]


def test_path_hints_name_the_mount_and_the_way_out():
    from ma_jupyter.nodehost.mounts import Mount, path_hint

    mounts = _hint_mounts()

    def hint(*lines, workdir=f"{WS}/algorithm", extra=()):
        return path_hint(list(lines), mounts + list(extra), workdir)

    python = "OSError: [Errno 30] Read-only file system: '/workspace/dataset/private/mnist/cache.pt'"
    text = hint("Traceback (most recent call last):", python)
    assert text.startswith(
        "/workspace/dataset/private/mnist/cache.pt is in /workspace/dataset/private/mnist, "
    )
    assert "the dataset mnist, mounted read-only" in text and "--dataset mnist=PATH:rw" in text
    # torch names no path on its last line: the traceback's code line does
    torch = [
        '  File "/train.py", line 9, in <module>',
        '    torch.save(model, "/workspace/model/pretrained/resnet/v1/best.pt")',
        '  File "/usr/lib/python3/dist-packages/torch/serialization.py", line 828, in __init__',
        "RuntimeError: [enforce fail at inline_container.cc:747] . open file failed with strerror: Read-only file system",
    ]
    assert "the model resnet, which is always read-only" in hint(*torch)
    assert hint("touch: cannot touch '/etc/foo': Read-only file system").startswith(
        "/etc/foo lies in the node's read-only system folders"
    )
    # a relative path is the working directory's; a read-only original names --code-writable
    original = Mount("/h/algo", f"{WS}/algorithm", True, "algorithm")
    only = [m for m in mounts if m.kind != "workdir"] + [original]
    text = path_hint(["OSError: [Errno 30] Read-only file system: 'model.pt'"], only, f"{WS}/algorithm")
    assert "the algorithm folder itself" in text and "--code-writable" in text
    assert hint("bash: line 1: x: Read-only file system").startswith("a write to a read-only folder failed")
    # /workspace itself and the root are read-only: a tutorial's ../data and ../../Datasets
    text = hint("PermissionError: [Errno 13] Permission denied: '../data'")
    assert text.startswith("/workspace/data (written ../data) is in /workspace itself")
    assert "read-only" in text and "/workspace/outputs" in text and "--volume NAME=PATH" in text
    assert "./data instead of ../data" in text
    coreutils = "mkdir: cannot create directory \u2018/workspace/dataset/new\u2019: Permission denied"
    assert hint(coreutils).startswith("/workspace/dataset/new is in /workspace itself")
    text = hint("PermissionError: [Errno 13] Permission denied: '../../Datasets'")
    assert text.startswith("/Datasets lies in the node's read-only system folders (written ../../Datasets)")
    # a denied read elsewhere, or a script that is not executable, says nothing of the view
    assert hint("PermissionError: [Errno 13] Permission denied: '/root/.netrc'") is None
    assert hint("bash: ./run.sh: Permission denied") is None
    # a file missing from what a node has of its own: only on a job of several nodes
    tmp = "FileNotFoundError: [Errno 2] No such file or directory: '/tmp/ps/ckpt-1.index'"
    cache = "FileNotFoundError: [Errno 2] No such file or directory: '/tmp/.cache/x'"
    assert hint(tmp) is None
    text = path_hint(
        [tmp], mounts + [Mount("/h/c", "/tmp/.cache", False, "cache")], f"{WS}/algorithm", nodes=2
    )
    assert text.startswith("/tmp/ps/ckpt-1.index is missing in this node's own /tmp")
    assert "/workspace/outputs" in text
    assert (
        path_hint(
            [cache], mounts + [Mount("/h/c", "/tmp/.cache", False, "cache")], f"{WS}/algorithm", nodes=2
        )
        is None
    )
    text = path_hint(
        ["FileNotFoundError: [Errno 2] No such file: 'data/MNIST/raw'"], mounts, f"{WS}/algorithm", nodes=2
    )
    assert "own working copy" in text and "--code-writable" in text
    # a module that is not installed is no missing file of the working copy
    assert (
        path_hint(["ModuleNotFoundError: No module named 'torch'"], mounts, f"{WS}/algorithm", nodes=2)
        is None
    )
    # a file the command names, missing because no folder was shipped
    empty = [Mount("/h/copy", f"{WS}/algorithm", False, "workdir", True)] + mounts[1:]
    missing = "python: can't open file '/workspace/algorithm/train.py': [Errno 2] No such file or directory"
    text = path_hint([missing], empty, f"{WS}/algorithm")
    assert text.startswith("/workspace/algorithm/train.py is missing: the job has no algorithm folder")
    assert "--code-dir DIR" in text
    assert hint(missing) is None  # with an algorithm folder it is only a missing file
    # writes that worked, or other errors, explain nothing
    assert hint("OSError: [Errno 2] No such file or directory: '/workspace/dataset/private/mnist/x'") is None
    assert hint("saved /workspace/outputs/m.pt") is None


def test_a_readers_sandbox_shows_one_folder_by_descriptor_read_only(ma_home):
    image = resolve_image(Image())
    argv = reader_argv(image, RunAs(65534, 65534, "nobody"), OUTPUTS_VIEW, ["python", "-c", "pass"])
    joined = " ".join(argv)
    # the folder comes from the descriptor the caller opened and checked, never a path
    assert argv[argv.index("--ro-bind-fd") + 1 : argv.index("--ro-bind-fd") + 3] == [SHOWN_FD, OUTPUTS_VIEW]
    assert " --bind " not in joined and "--dev-bind" not in joined  # nothing writable but /tmp
    assert str(ma_home) not in joined  # no path of the service's home at all
    assert argv[argv.index("--cap-drop") + 1] == "ALL" and "--unshare-pid" in argv
    # it ends with the thread that started it; no session of its own (one killpg ends it all)
    assert "--die-with-parent" in argv and "--new-session" not in argv
    inner = argv[argv.index("--") + 1 :]
    assert inner[0].endswith("setpriv") and "--reuid=65534" in inner
    assert inner[inner.index(EXEC_ENV) + 1] == ENV_FILE and f"--ro-bind-data {ENV_FD} {ENV_FILE}" in joined


def test_the_memory_backed_folders_are_no_larger_than_the_nodes_memory(ma_paths, tmp_path):
    """/tmp, /run and /dev/shm are tmpfs: uncapped, each could take half the host's memory, outside
    the node's limit (issue 24, item 5); bubblewrap's --size caps each at the spec's memory."""
    import dataclasses

    spec = full_spec(ma_paths)
    task = TaskSlot("worker", 0, "worker-0", "127.0.1.1", (0,), memory_gb=1.0)
    placement = Placement("job-1", Spec(name="s", cpus=1, memory_gb=1), (task,))
    attempt = Attempt("job-1", spec, 0, tmp_path / "jobs" / "job-1", tuple(plan_job(spec, placement, ["x"])))
    view = node_view(attempt, attempt.plans[0], "bubblewrap")
    assert view.tmpfs_limit == 1 << 30  # the task's memory_gb
    argv = bwrap_argv(view, ["python", "x.py"])
    for folder in ("/tmp", "/run", "/dev/shm"):
        at = argv.index(folder, argv.index("--dev"))
        assert argv[at - 3 : at] == ["--size", str(1 << 30), "--tmpfs"], folder
    uncapped = dataclasses.replace(view, tmpfs_limit=0)
    assert "--size" not in bwrap_argv(uncapped, ["python", "x.py"])


OLD_BWRAP = """#!/bin/sh
# bubblewrap before 0.7: no --size option
for arg in "$@"; do
    if [ "$arg" = "--size" ]; then echo "bwrap: Unknown option --size" >&2; exit 1; fi
done
exec {bwrap} "$@"
"""


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
def test_a_bubblewrap_that_cannot_cap_a_tmpfs_leaves_it_uncapped_with_one_warning(
    ma_paths, tmp_path, monkeypatch, caplog
):
    """``--size`` exists since bubblewrap 0.7 and a setuid install refuses it: the probe finds out
    (this machine's bubblewrap, then one that refuses the option), the service log says so, and
    the sandbox starts with uncapped folders rather than not at all."""
    import logging

    from ma_jupyter.nodehost import bwrap

    assert bwrap.tmpfs_size_works(shutil.which("bwrap"))  # bubblewrap 0.8 here
    old = tmp_path / "bwrap"
    old.write_text(OLD_BWRAP.format(bwrap=shutil.which("bwrap")))
    old.chmod(0o755)
    with caplog.at_level(logging.WARNING, logger=bwrap.__name__):
        assert not bwrap.tmpfs_size_works(str(old))
    warned = [r.getMessage() for r in caplog.records if "cannot cap a tmpfs" in r.getMessage()]
    assert len(warned) == 1 and "bubblewrap 0.7" in warned[0] and "Unknown option --size" in warned[0]
    monkeypatch.setattr(bwrap, "_TMPFS_SIZE_OK", False)  # what the probe remembers on such a host
    spec = full_spec(ma_paths)
    task = TaskSlot("worker", 0, "worker-0", "127.0.1.1", (0,), memory_gb=1.0)
    placement = Placement("job-1", Spec(name="s", cpus=1, memory_gb=1), (task,))
    attempt = Attempt("job-1", spec, 0, tmp_path / "jobs" / "job-1", tuple(plan_job(spec, placement, ["x"])))
    argv = bwrap_argv(node_view(attempt, attempt.plans[0], "bubblewrap"), ["python", "x.py"])
    tmpfs = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--tmpfs"]
    assert "--size" not in argv and tmpfs[-3:] == ["/tmp", "/run", "/dev/shm"]  # and /sys/fs/cgroup


def test_a_node_in_its_own_network_looks_host_names_up_in_its_hosts_file_only():
    """No name server is reachable from a job's own network namespace: glibc would answer an
    address /etc/hosts does not hold with a temporary failure (torch's store warned for every
    client), so the node's nsswitch.conf keeps the host's lines but for hosts."""
    from ma_jupyter.nodehost.view import nsswitch_conf

    host = "passwd:         files systemd\nhosts:          files mdns4_minimal [NOTFOUND=return] dns\n"
    assert nsswitch_conf(host) == "passwd:         files systemd\nhosts: files\n"
    assert nsswitch_conf(None) == "hosts: files\n"
