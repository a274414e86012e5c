"""Public tutorials run unchanged: the paths they write meet refusals that name the mount, why
and the fix; ``bash -c`` ships the folder as ``python file.py`` does; ``--code-writable`` works
with the automatic shipping; caches frameworks keep in ``HOME`` persist per user; a job sees no
platform path on its ``PYTHONPATH``; the launchers print no warning the user did not cause.

Real service, real node processes in bubblewrap (the symlink mode where it behaves the same).
"""

from __future__ import annotations

import ast
import os
import re
import secrets
import shutil
import sys
from pathlib import Path

import pytest

from tests.fixtures.real_jobs import algorithm
from tests.fixtures.real_jobs import run_job as _run_job
from tests.fixtures.workdir import finished, log_of, submit

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/bin/bwrap"), reason="needs bubblewrap")
REPO = Path(__file__).resolve().parents[2]


def run_job(client, **fields):
    """:func:`tests.fixtures.real_jobs.run_job` with a name (the wire model needs one)."""
    return _run_job(client, **{"name": "t", **fields})


# ------------------------------------------------------------------------- path refusals


@pytest.mark.parametrize(
    ("written", "start"),
    [
        # pytorch/examples mnist: datasets.MNIST('../data', download=True)
        ("../data", "/workspace/data (written ../data) is in /workspace itself"),
        # Lightning's examples: PATH_DATASETS = "../../Datasets"
        ("../../Datasets", "/Datasets lies in the node's read-only system folders (written ../../Datasets)"),
    ],
)
def test_a_tutorials_data_folder_above_the_working_directory_names_the_mount_and_the_fix(
    ma_module_client, tmp_path, written, start
):
    algo = algorithm(
        tmp_path / "algo",
        train=f"""
            import os
            os.makedirs({written!r}, exist_ok=True)  # as the tutorial's dataset download does
        """,
    )
    job, _, logs = run_job(ma_module_client, command="python train.py", algorithm=str(algo))
    assert job.status.value == "error", logs
    first = job.reason.splitlines()[0]
    assert first.startswith(f"node worker-0 exited with code 1: {start}"), first
    assert "read-only" in first and "/workspace/outputs" in first
    if written == "../data":
        assert "it is the working directory's parent" in first and "./data instead of ../data" in first
        assert "--volume NAME=PATH" in first
    assert "PermissionError" in logs


def test_a_write_into_a_read_only_algorithm_folder_names_code_writable(ma_client, ma_home, tmp_path):
    # a folder above the admin's working-copy limit is shown itself, read-only
    cluster = ma_home / "cluster.toml"
    cluster.write_text(cluster.read_text().replace("[mounts]\n", "[mounts]\nworkdir_copy_mb = 0\n", 1))
    algo = algorithm(tmp_path / "algo", train='open("model.pt", "w").write("weights")\n')
    job, _, logs = run_job(ma_client, command="python train.py", algorithm=str(algo))
    assert job.status.value == "error", logs
    first = job.reason.splitlines()[0]
    assert (
        "/workspace/algorithm/model.pt is in /workspace/algorithm, the algorithm folder itself, read-only"
        in first
    )
    assert "/workspace/outputs" in first and "--code-writable" in first
    assert not (algo / "model.pt").exists()


TF_PS_STYLE = """
    import os, sys, time
    index = int(os.environ["MA_TASK_INDEX"])
    if index == 0:  # the chief saves its checkpoint under /tmp, as the tutorial does
        os.makedirs("/tmp/ps_ckpt", exist_ok=True)
        open("/tmp/ps_ckpt/checkpoint", "w").write("step 1")
        print("chief saved /tmp/ps_ckpt/checkpoint")
    else:
        time.sleep(1)
        print(open("/tmp/ps_ckpt/checkpoint").read())  # another node restores it
"""


def test_a_checkpoint_another_node_wrote_in_its_own_tmp_gets_the_per_node_hint(ma_module_client, tmp_path):
    algo = algorithm(tmp_path / "algo", train=TF_PS_STYLE)
    job, _, logs = run_job(
        ma_module_client, command="python train.py", algorithm=str(algo), mode="tensorflow", nodes=2
    )
    assert job.status.value == "error", logs
    assert "chief saved" in logs
    first = job.reason.splitlines()[0]
    assert first.startswith(
        "node worker-1 exited with code 1: /tmp/ps_ckpt/checkpoint is missing in this node's own /tmp"
    )
    assert "each node of the job has a /tmp of its own" in first and "/workspace/outputs" in first
    # one node alone: a missing file is only a missing file
    single = algorithm(tmp_path / "single", train='open("/tmp/nothing-here").read()\n')
    job, _, logs = run_job(ma_module_client, command="python train.py", algorithm=str(single))
    assert job.status.value == "error" and job.reason.splitlines()[0] == "node worker-0 exited with code 1", (
        logs
    )


# ------------------------------------------------------------------- automatic shipping


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A user's project folder (outside the service's home), the current folder."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "train.py").write_text('import os\nprint("trained in", os.getcwd())\n')
    monkeypatch.chdir(folder)
    return folder


def test_bash_c_with_a_pipe_ships_the_folder_as_python_does(ma_module_client, project):
    handle = ma_module_client.submit(name="t", command='bash -c "python train.py | tee train.log"')
    assert handle.shipped and "shipped" in handle.shipped and str(project) in handle.shipped
    job = handle.wait(timeout=120)
    log = ma_module_client.read_log(job.id, node="worker-0").data
    assert job.status.value == "succeeded", (job.reason, log)
    assert "trained in /workspace/algorithm" in log
    assert not (project / "train.log").exists()  # the job wrote its working copy, not the folder


def test_a_command_whose_file_is_not_here_ships_nothing_and_its_failure_says_why(ma_module_client, project):
    handle = ma_module_client.submit(
        name="t", command='bash -c "set -o pipefail; python elsewhere/train.py | tee log"'
    )
    assert handle.shipped is None
    job = handle.wait(timeout=120, check=False)
    first = job.reason.splitlines()[0]
    assert "/workspace/algorithm/elsewhere/train.py is missing: the job has no algorithm folder" in first
    assert "--code-dir DIR" in first


def test_code_writable_with_automatic_shipping_shows_the_folder_itself(ma_root_jobs, ma_client, project):
    (project / "train.py").write_text('open("result.txt", "w").write("written by the job")\n')
    handle = ma_client.submit(name="t", command="python train.py", algorithm_read_only=False)
    assert handle.shipped and "writable (--code-writable)" in handle.shipped
    job = handle.wait(timeout=120)
    assert job.status.value == "succeeded", job.reason
    assert job.spec.algorithm == str(project)
    assert (project / "result.txt").read_text() == "written by the job"
    # a dry run mounts it too, and removes nothing
    plan = ma_client.plan(name="t", command="python train.py", algorithm_read_only=False)
    assert any("would mount" in n for n in plan.notes) and (project / "train.py").exists()


# ------------------------------------------------------------------------------ caches

KERAS_STYLE = """
    import os, sys
    datasets = os.path.expanduser("~/.keras/datasets")  # keras.utils.get_file's folder
    os.makedirs(datasets, exist_ok=True)
    if sys.argv[1] == "download":
        open(os.path.join(datasets, "mnist.npz"), "w").write("downloaded")
    print("cached:", sorted(os.listdir(datasets)))
"""


def test_a_keras_cache_in_home_is_kept_for_the_users_next_job_and_no_one_elses(ma_module_service, tmp_path):
    algo = algorithm(tmp_path / "algo", keras=KERAS_STYLE)
    alice, bob = f"alice-{secrets.token_hex(3)}", f"bob-{secrets.token_hex(3)}"
    logs = {}
    for name, user, action in (("first", alice, "download"), ("next", alice, "load"), ("other", bob, "load")):
        job = submit(
            ma_module_service, user, name=name, command=f"python keras.py {action}", algorithm=str(algo)
        )
        final = finished(ma_module_service, job["id"])
        logs[name] = log_of(ma_module_service, job["id"])
        assert final["status"] == "succeeded", (final["reason"], logs[name])
    assert "cached: ['mnist.npz']" in logs["next"]
    assert "cached: []" in logs["other"]
    kept = ma_module_service.home / "caches" / alice / "home" / ".keras" / "datasets" / "mnist.npz"
    assert kept.read_text() == "downloaded"


def test_a_job_that_turns_its_cache_folders_into_links_gets_nothing_made_through_them(
    ma_module_service, tmp_path
):
    """A hostile job replaces ``~/.cache/home`` and ``~/.cache/home/.keras`` with links to a folder
    of the host; the next launch makes the cache's folders without following them."""
    victim = tmp_path / "victim"
    victim.mkdir()
    plant = algorithm(
        tmp_path / "plant",
        plant=f"""
            import os, shutil
            cache = os.path.expanduser("~/.cache")
            shutil.rmtree(os.path.join(cache, "home", ".keras"))
            os.symlink({str(victim)!r}, os.path.join(cache, "home", ".keras"))
            os.rename(os.path.join(cache, "home"), os.path.join(cache, "old-home"))
            os.symlink({str(victim)!r}, os.path.join(cache, "home"))
        """,
        keras=KERAS_STYLE,
    )
    user = f"mallory-{secrets.token_hex(3)}"
    for command in ("python plant.py", "python keras.py download"):
        job = submit(ma_module_service, user, command=command, algorithm=str(plant))
        final = finished(ma_module_service, job["id"])
        log = log_of(ma_module_service, job["id"])
        if command.startswith("python plant"):
            assert final["status"] == "succeeded", (final["reason"], log)
    assert list(victim.iterdir()) == []  # nothing made or written through the links
    cache = ma_module_service.home / "caches" / user
    assert (cache / "home").is_symlink() and (cache / "old-home" / ".keras").is_symlink()


def test_home_caches_are_kept_in_the_symlink_mode_too(ma_home, ma_root_jobs, monkeypatch, request, tmp_path):
    monkeypatch.setenv("MA_JUPYTER_SANDBOX", "none")
    client = request.getfixturevalue("ma_client")
    algo = algorithm(tmp_path / "algo", keras=KERAS_STYLE)
    for action in ("download", "load"):
        job, _, logs = run_job(client, command=f"python keras.py {action}", algorithm=str(algo))
        assert job.status.value == "succeeded", (job.reason, logs)
    assert "cached: ['mnist.npz']" in logs


# -------------------------------------------------------------------------- PYTHONPATH

IMPORTS = """
    import os, sys
    import ma_jupyter.nodeside.rank_log  # the platform's own helpers still import
    print("PYTHONPATH", os.environ["PYTHONPATH"])
    print("HELPERS", sorted(os.listdir(os.environ["PYTHONPATH"])))
    try:
        import tests
        print("IMPORTED tests from", tests.__file__)
    except ImportError:
        print("no module tests")
"""


def test_a_job_sees_only_the_platform_package_on_its_pythonpath(any_service, tmp_path):
    algo = algorithm(tmp_path / "algo", imports=IMPORTS)
    job = submit(any_service, command="python imports.py", algorithm=str(algo))
    final = finished(any_service, job["id"])
    log = log_of(any_service, job["id"])
    assert final["status"] == "succeeded", (final["reason"], log)
    helpers = ast.literal_eval(log.split("HELPERS ", 1)[1].splitlines()[0])
    # the package and the node's sitecustomize (symlink mode: its compiled file beside them)
    assert sorted(set(helpers) - {"__pycache__"}) == ["ma_jupyter", "sitecustomize.py"], log
    assert str(REPO) not in log.split("PYTHONPATH ", 1)[1].splitlines()[0]
    if any_service.sandbox == "bubblewrap":
        assert "PYTHONPATH /run/ma_jupyter/python\n" in log
        # the repository's tests/ (an editable install's folder) is no package of the job's
        assert "no module tests" in log


# ---------------------------------------------------------------------- launcher noise

DDP = """
    import torch.distributed as dist
    dist.init_process_group("gloo")
    print(f"rank {dist.get_rank()} of {dist.get_world_size()}")
    dist.destroy_process_group()
"""


@pytest.mark.torch
@pytest.mark.timeout(300)
def test_a_two_node_torch_job_prints_no_launcher_warning(ma_module_client, tmp_path):
    algo = algorithm(tmp_path / "algo", ddp=DDP)
    job, _, logs = run_job(
        ma_module_client,
        command="python ddp.py",
        algorithm=str(algo),
        mode="pytorch",
        nodes=2,
        specs=["gpu.emu-2"],
    )
    assert job.status.value == "succeeded", (job.reason, logs)
    assert "OMP_NUM_THREADS" not in logs, logs  # torchrun's banner where nothing set it
    # every line is the job's own (or the platform's, which says so)
    assert sorted(_foreign_lines(logs, r"\[rank \d\] rank \d of 4")) == [], logs
    assert logs.count(" of 4") == 4, logs  # two processes per node


def _foreign_lines(logs: str, own: str) -> list[str]:
    """The lines of ``logs`` (:func:`run_job`'s) that neither the job (``own``) nor the
    platform (``[ma_jupyter]``, ``[rsh_agent]``) printed."""
    return [
        line
        for line in logs.splitlines()
        if line.strip()
        and not line.startswith(("-----", "[ma_jupyter]", "[rsh_agent]"))
        and not re.fullmatch(own, line)
    ]


MPI = """
    from mpi4py import MPI
    print("mpi rank", MPI.COMM_WORLD.Get_rank(), "of", MPI.COMM_WORLD.Get_size())
"""


@pytest.mark.mpi
@pytest.mark.timeout(300)
def test_a_two_node_mpi_job_prints_no_open_mpi_warning(ma_module_client, tmp_path):
    if shutil.which("mpirun", path=os.path.dirname(sys.executable)) is None:
        pytest.skip("needs Open MPI in the environment")
    algo = algorithm(tmp_path / "algo", mpi=MPI)
    job, _, logs = run_job(
        ma_module_client, command="python mpi.py", algorithm=str(algo), mode="horovod", nodes=2
    )
    assert job.status.value == "succeeded", (job.reason, logs)
    assert logs.count("mpi rank") == 2, logs
    assert "local probe returned unhandled shell" not in logs, logs
    assert _foreign_lines(logs, r"\[rank \d\] mpi rank \d of 2|" + PRRTE_SETPGID_RACE) == [], logs


#: Open MPI 5's launcher (PRRTE's plm/ssh) forks the remote shell and both sides put the child
#: in a process group of its own; when the child has already exec'd the agent (a loaded
#: machine schedules it first), the parent's setpgid fails with EACCES and PRRTE prints this
#: warning, unconditionally, on any machine: the child's own setpgid(0,0) already did the work
#: ("Ignore this error since the child is off and running", its source says)
PRRTE_SETPGID_RACE = (
    r"\[worker-0:\d+\] plm:ssh: Warning: setpgid\((\d+),\1\) failed in parent with "
    r"errno=Permission denied\(13\)"
)


def test_the_home_cache_names_are_documented():
    from ma_jupyter.nodehost.caches import HOME_CACHES

    readme = (REPO / "README.md").read_text()
    assert [name for name in HOME_CACHES if f"`~/{name}`" not in readme] == []
