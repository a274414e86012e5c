"""The local backend with real node processes in real bubblewrap sandboxes (no service needed).

Attempts are built straight from ``modes.plan_job`` and a hand-made placement, so each test
controls hostnames, addresses, cores and the files a mode would write.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from ma_jupyter.backends.base import LAUNCH_ENV, Attempt
from ma_jupyter.backends.local import LocalBackend
from ma_jupyter.backends.local.backend import task_address
from ma_jupyter.errors import InvalidSpec, RefusedFile
from ma_jupyter.models import JobSpec, Spec
from ma_jupyter.modes import Placement, TaskSlot, plan_job
from tests.fixtures.local_backend import log_of, make_attempt, marked, run_to_end, start, tree_script
from tests.helpers import wait_for, writable_dir

PY = sys.executable
pytestmark = pytest.mark.skipif(not os.path.exists("/usr/bin/bwrap"), reason="needs bubblewrap")


@pytest.fixture
def ma_folders(tmp_path):
    """Host folders for a job's data, model, outputs and volume."""
    folders = {name: tmp_path / name for name in ("data", "model", "out", "vol", "algo")}
    for path in folders.values():
        writable_dir(path)
    (folders["data"] / "numbers.txt").write_text("1 2 3 4\n")
    (folders["model"] / "weights.bin").write_text("w")
    (folders["algo"] / "train.py").write_text("print('algorithm file ran')\n")
    return folders


def test_isolation_is_bubblewrap_here(ma_home):
    assert LocalBackend().isolation() == "bubblewrap"


def test_read_only_data_and_models_writable_outputs_and_volumes_even_for_root(
    ma_home, ma_root_jobs, ma_folders
):
    script = """
        import errno, os, subprocess
        ws = '/workspace'
        nums = open(f'{ws}/dataset/private/numbers/numbers.txt').read().split()
        open(f'{ws}/outputs/sum.txt', 'w').write(str(sum(map(int, nums))))
        open(f'{ws}/volume/scratch/v.txt', 'w').write('vol')
        for target in ('dataset/private/numbers/hack.txt', 'model/pretrained/net/hack.txt', 'algorithm/hack.py'):
            try:
                open(f'{ws}/{target}', 'w').write('x')
                print('WRITABLE', target)
            except OSError as exc:
                print('read-only', target, errno.errorcode[exc.errno])
        # root without capabilities cannot make the bind writable again
        r = subprocess.run(['mount', '-o', 'remount,rw', f'{ws}/dataset/private/numbers'], capture_output=True)
        print('remount exit', r.returncode)
        try:
            open(f'{ws}/dataset/private/numbers/hack.txt', 'w').write('x')
            print('WRITABLE after remount')
        except OSError:
            print('still read-only after remount')
        print('uid', os.getuid(), 'cwd', os.getcwd(), 'files', sorted(os.listdir('.')))
    """
    attempt = make_attempt(
        ma_home,
        "rw-1",
        script,
        datasets=[{"name": "numbers", "path": str(ma_folders["data"])}],
        models=[{"name": "net", "path": str(ma_folders["model"]), "source": "pretrained"}],
        volumes=[{"name": "scratch", "path": str(ma_folders["vol"])}],
        algorithm=str(ma_folders["algo"]),
        outputs=str(ma_folders["out"]),
    )
    [run] = run_to_end(LocalBackend(), attempt)
    log = log_of(attempt)
    assert run.state == "exited" and run.exit_code == 0, log
    assert (ma_folders["out"] / "sum.txt").read_text() == "10"
    assert (ma_folders["vol"] / "v.txt").read_text() == "vol"
    for target in ("dataset/private/numbers/hack.txt", "model/pretrained/net/hack.txt"):
        assert f"read-only {target} EROFS" in log, log
    # /workspace/algorithm is the node's own copy: written there, never in the user's folder
    assert (
        "WRITABLE algorithm/hack.py" in log and "WRITABLE dataset" not in log and "WRITABLE model" not in log
    )
    assert sorted(p.name for p in ma_folders["algo"].iterdir()) == ["train.py"]
    assert (ma_folders["out"] / "workdir" / "hack.py").read_text() == "x"
    assert "remount exit 0" not in log and "still read-only after remount" in log
    assert "uid 0 cwd /workspace/algorithm files ['hack.py', 'train.py']" in log or os.getuid() != 0
    assert not (ma_folders["data"] / "hack.txt").exists()
    assert not (ma_folders["model"] / "hack.txt").exists()


def test_hostname_hosts_files_and_cpus_are_the_tasks(ma_home):
    script = """
        import json, os, socket
        print(json.dumps({
            'hostname': socket.gethostname(),
            'resolves': socket.gethostbyname(socket.gethostname()),
            'peer': socket.gethostbyname('worker-1' if socket.gethostname() == 'worker-0' else 'worker-0'),
            'hostfile': open('/job/hostfile').read(),
            'mpi': open('/etc/mpi/hostfile').read(),
            'table': open('/user/config/jobstart_hccl.json').read(),
            'cpus': sorted(os.sched_getaffinity(0)),
            'rank_dir': os.environ['MA_RANK_LOG_DIR'],
            'task': os.environ['MA_TASK_INDEX'],
            'passwd': os.path.exists('/etc/passwd'),
        }))
        open(os.environ['MA_RANK_LOG_DIR'] + '/rank-0.log', 'w').write('rank zero')
    """
    attempt = make_attempt(ma_home, "hosts-1", script, tasks=2, cpus=(0,))
    for plan in attempt.plans:
        plan.files.update(
            {
                "/job/hostfile": "worker-0 slots=1\nworker-1 slots=1\n",
                "/etc/mpi/hostfile": f"mpi for {plan.name}\n",
                "/user/config/jobstart_hccl.json": json.dumps({"node": plan.name}),
            }
        )
    backend = LocalBackend()
    runs = run_to_end(backend, attempt)
    assert [(r.name, r.exit_code) for r in runs] == [("worker-0", 0), ("worker-1", 0)]
    for i, run in enumerate(runs):
        seen = json.loads(log_of(attempt, run.name).strip().splitlines()[-1])
        assert seen["hostname"] == run.hostname == f"worker-{i}"
        assert seen["resolves"] == task_address(i)
        assert seen["peer"] == task_address(1 - i)
        assert seen["hostfile"] == "worker-0 slots=1\nworker-1 slots=1\n"
        assert seen["mpi"] == f"mpi for worker-{i}\n"
        assert json.loads(seen["table"]) == {"node": f"worker-{i}"}
        assert seen["cpus"] == [0]
        assert seen["rank_dir"] == "/job/logs" and seen["task"] == str(i)
        assert seen["passwd"] is True
        assert (attempt.job_dir / "logs" / run.name / "rank-0.log").read_text() == "rank zero"
        assert attempt.jobdir.rank_logs(run.name) == [(0, attempt.job_dir / "logs" / run.name / "rank-0.log")]


def test_stop_kills_the_whole_tree_after_the_grace_period_without_bubblewrap(ma_home, ma_root_jobs):
    """Contract rule 8 in the symlink mode (the bubblewrap mode: tests/backends)."""
    sandbox = "symlink"
    marker = f"ma-tree-{os.getpid()}-{time.time_ns()}"
    attempt = make_attempt(ma_home, f"tree-{sandbox}", tree_script(marker))
    backend = LocalBackend(sandbox=sandbox)
    runs = start(backend, attempt)
    wait_for(lambda: "tree started" in log_of(attempt), timeout=30)
    # main (its script holds the marker too), the TERM-ignoring child, the setsid'd grandchild
    wait_for(lambda: len(marked(marker)) >= 3, timeout=10)
    grace = 1.5
    started = time.monotonic()
    backend.stop(attempt, runs, grace)
    took = time.monotonic() - started
    assert marked(marker) == []
    assert not psutil.pid_exists(runs[0].pid) or psutil.Process(runs[0].pid).status() == psutil.STATUS_ZOMBIE
    assert "main got SIGTERM" in log_of(attempt)  # the grace period was offered first
    assert grace <= took < grace + 10, took
    assert backend.poll(attempt, runs[0]).state in ("lost", "exited")


def test_launch_failing_midway_leaves_nothing_running(ma_home):
    marker = f"ma-midway-{os.getpid()}-{time.time_ns()}"
    attempt = make_attempt(ma_home, "midway-1", f"import time; time.sleep(600)  # {marker}", tasks=2)
    # the second node's rank-log folder cannot be created: its launch fails after the first started
    (attempt.job_dir / "logs").mkdir(parents=True)
    (attempt.job_dir / "logs" / "worker-1").write_text("in the way")
    with pytest.raises(RefusedFile, match="where the folder"):
        start(LocalBackend(), attempt)
    assert (attempt.job_dir / "nodes" / "worker-0" / "run.json").exists()  # it did start
    assert marked(marker) == []


def test_invalid_plans_start_nothing(ma_home, tmp_path):
    attempt = make_attempt(ma_home, "files-1", "print(1)")
    attempt.plans[0].files["/job/../etc/passwd"] = "x"
    with pytest.raises(InvalidSpec, match="must lie under"):
        start(LocalBackend(), attempt)
    assert not (attempt.job_dir / "nodes").exists()
    missing = make_attempt(
        ma_home, "files-2", "print(1)", datasets=[{"name": "d", "path": str(tmp_path / "gone")}]
    )
    with pytest.raises(InvalidSpec, match="does not exist"):
        start(LocalBackend(), missing)


def test_failure_report_lifecycle_and_env(ma_home, ma_folders):
    script = """
        import json, os
        print('PATH', os.environ['PATH'].split(':')[0], 'HOME', os.environ['HOME'], 'JOBVAR', os.environ['JOBVAR'])
        print('started before', os.path.exists('/workspace/outputs/started'))
        json.dump({'rank': 1, 'exit_code': 4}, open(os.environ['MA_RANK_LOG_DIR'] + '/failure.json', 'w'))
        raise SystemExit(4)
    """
    attempt = make_attempt(
        ma_home,
        "life-1",
        script,
        outputs=str(ma_folders["out"]),
        env={"JOBVAR": "from-the-job"},
        lifecycle={
            "on_start": "python -c \"open('/workspace/outputs/started', 'w').write('1')\"",
            "on_stop": "python -c \"open('/workspace/outputs/stopped', 'w').write('1')\"",
        },
    )
    [run] = run_to_end(LocalBackend(), attempt)
    log = log_of(attempt)
    assert run.exit_code == 4, log
    assert f"PATH {Path(PY).parent} HOME /tmp JOBVAR from-the-job" in log
    assert "started before True" in log
    assert (ma_folders["out"] / "stopped").exists()
    report = attempt.job_dir / "nodes" / "worker-0" / "failure.json"
    assert json.loads(report.read_text()) == {"rank": 1, "exit_code": 4}


def test_symlink_fallback(ma_home, ma_root_jobs, ma_folders, monkeypatch):
    monkeypatch.setenv("MA_JUPYTER_SANDBOX", "none")
    backend = LocalBackend()
    assert backend.isolation() == "symlink"
    script = """
        import os, sys
        ws = os.environ['MA_WORKSPACE']
        nums = open(ws + '/dataset/private/numbers/numbers.txt').read().split()
        open(sys.argv[1], 'w').write(str(sum(map(int, nums))))
        print('workspace', ws, 'cwd', os.getcwd())
    """
    spec = JobSpec(
        name="sym",
        command=f"python -c {shlex.quote(textwrap.dedent(script))} /workspace/outputs/sum.txt",
        datasets=[{"name": "numbers", "path": str(ma_folders["data"])}],
        algorithm=str(ma_folders["algo"]),
        outputs=str(ma_folders["out"]),
    )
    slot = TaskSlot("worker", 0, "worker-0", task_address(0), (0, 0))
    placement = Placement("sym-1", Spec(name="cpu.small", cpus=1, memory_gb=1), (slot,))
    attempt = Attempt("sym-1", spec, 0, ma_home / "jobs" / "sym-1", tuple(plan_job(spec, placement)))
    [run] = run_to_end(backend, attempt)
    log = log_of(attempt)
    assert run.exit_code == 0, log
    assert (ma_folders["out"] / "sum.txt").read_text() == "10"
    tree = attempt.job_dir / "nodes" / "worker-0" / "workspace"
    # the working directory is the tree's algorithm link to the node's working copy (the kernel
    # reports it resolved), never the user's folder
    assert f"workspace {tree} cwd {attempt.jobdir.workdir('worker-0')}" in log
    assert (attempt.jobdir.workdir("worker-0") / "train.py").read_text() == (
        ma_folders["algo"] / "train.py"
    ).read_text()


def test_a_planted_node_log_or_exit_code_is_never_followed_or_blocked_on(ma_home, tmp_path):
    """A later attempt reuses the node's files; in the symlink mode a job could replace them."""
    from ma_jupyter.errors import RefusedFile
    from ma_jupyter.nodehost.processes import read_exit_code

    attempt = make_attempt(ma_home, "planted-1", "print('hi')")
    (attempt.job_dir / "logs").mkdir(parents=True)
    victim = tmp_path / "victim.txt"
    victim.write_text("untouched\n")
    attempt.jobdir.node_log("worker-0").symlink_to(victim)
    with pytest.raises(RefusedFile, match="worker-0 left a symbolic link"):
        start(LocalBackend(), attempt)
    assert victim.read_text() == "untouched\n"
    attempt.jobdir.node_log("worker-0").unlink()
    os.mkfifo(attempt.jobdir.node_log("worker-0"))
    with pytest.raises(RefusedFile, match="worker-0 left a FIFO"):
        start(LocalBackend(), attempt)
    exit_file = tmp_path / "exit_code"
    os.mkfifo(exit_file)
    assert read_exit_code(exit_file) is None  # refused at once, not an open that never returns


@pytest.mark.parametrize("sandbox", ["bubblewrap", "symlink"])
def test_the_dry_run_is_what_runs(ma_home, ma_root_jobs, ma_folders, sandbox):
    attempt = make_attempt(
        ma_home,
        f"exact-{sandbox}",
        "import os; print(os.environ['LR'])",
        tasks=2,
        env={"LR": "0.5", "PYTHONPATH": "/workspace/algorithm/lib"},
        datasets=[{"name": "d", "path": str(ma_folders["data"])}],
    )
    backend = LocalBackend(sandbox=sandbox)
    launches = backend.dryrun(attempt)
    assert [launch.name for launch in launches] == [p.name for p in attempt.plans]
    assert not (attempt.job_dir / "nodes").exists()  # a dry run creates nothing
    assert not set(LAUNCH_ENV) & set(launches[0].env)
    assert launches[0].command[0] != "python" and launches[0].argv[0] == "python"
    runs = backend.launch(attempt, launches)
    wait_for(lambda: all(backend.poll(attempt, r).state != "running" for r in runs), timeout=60)
    for launch in launches:
        assert launch.isolation == sandbox
        assert any(m.target == "/workspace/dataset/private/d" and m.read_only for m in launch.mounts)
        runner = json.loads(attempt.jobdir.node(launch.name).runner_spec.read_text())
        argv = runner["argv"]
        assert argv[len(argv) - len(launch.command) :] == launch.command
        # bubblewrap: the variables travel beside the argv (handed over as a file), never in it
        env = runner["job_env"] if sandbox == "bubblewrap" else runner["env"]
        assert set(env) - set(launch.env) == set(LAUNCH_ENV)
        assert {k: v for k, v in env.items() if k not in LAUNCH_ENV} == launch.env
        assert "0.5" in log_of(attempt, launch.name)


def test_post_plan_shows_the_dry_run_of_the_bound_placement(ma_service, ma_folders):
    import getpass

    from ma_jupyter import config
    from ma_jupyter.jobdir import PLACEHOLDER
    from ma_jupyter.models import Job
    from ma_jupyter.service import policies
    from ma_jupyter.service.scheduler import Scheduler

    body = {
        "name": "plan-1",
        "command": "python -c 'print(1)' --lr ${LR}",
        "env": {"LR": "0.1"},
        "datasets": [{"name": "d", "path": str(ma_folders["data"])}],
        "creator": getpass.getuser(),
    }
    response = ma_service.session().post(f"{ma_service.api}/plan", json=body, timeout=30)
    assert response.status_code == 200, response.text
    nodes = response.json()["nodes"]

    spec = JobSpec(**body)
    backend = LocalBackend()
    scheduler = Scheduler(config.load_cluster())
    placement = backend.bind(scheduler.place("dry-run", spec, scheduler.usage([])), reserve=False)
    plans = plan_job(spec, placement)
    for plan in plans:
        plan.env.update(policies.attempt_env(Job(id="<job-id>", spec=spec)))
    expected = backend.dryrun(Attempt("<job-id>", spec, 0, PLACEHOLDER.root, tuple(plans)))
    assert [n["name"] for n in nodes] == [e.name for e in expected]
    for node, launch in zip(nodes, expected, strict=True):
        for key in ("argv", "command", "env", "mounts", "files", "workdir", "isolation"):
            assert node[key] == launch.model_dump(mode="json")[key], key
        assert launch.argv[-1] == "${LR}" and launch.command[-1] == "0.1"
        assert any(m.source.startswith("<jobs>/<job-id>/outputs") for m in launch.mounts)
