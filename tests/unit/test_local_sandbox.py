"""The /workspace layout, its validation, and the sandbox argv (pure functions, no process)."""

from __future__ import annotations

import os
import pwd
import shutil
import sys
from pathlib import Path

import pytest

from ma_jupyter.backends.base import Attempt
from ma_jupyter.backends.local.sandbox import (
    EXEC_ENV,
    SYSTEM_PATH,
    bwrap_argv,
    command_argv,
    hosts_file,
    mounts_for,
    node_env,
    node_launches,
    node_view,
    resolve_image,
    to_host,
    workdir_for,
)
from ma_jupyter.errors import InvalidSpec
from ma_jupyter.models import DatasetMount, DatasetSource, Image, JobSpec, Spec
from ma_jupyter.modes import Placement, TaskSlot, plan_job
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
    assert workdir_for(JobSpec(name="j", command="python x.py")) == "/workspace"
    assert workdir_for(full_spec(ma_paths)) == "/workspace/algorithm"
    assert (
        workdir_for(JobSpec(name="j", command="python x.py", workdir="/workspace/outputs/"))
        == "/workspace/outputs"
    )
    with pytest.raises(InvalidSpec):
        workdir_for(JobSpec(name="j", command="python x.py", workdir="relative"))


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
