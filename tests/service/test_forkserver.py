"""The node runners' fork server (``nodehost/forkserver.py``) with real runners running real
nodes: what a forked runner is, the server's own end, and the slow way where it cannot start."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import psutil
import pytest

from ma_jupyter.backends.local import LocalBackend
from ma_jupyter.models import NodeRun
from ma_jupyter.nodehost import probes
from ma_jupyter.nodehost.bwrap import user_namespace_probe_argv
from ma_jupyter.nodehost.forkserver import RUNNER_NAME, RunnerForkServer, ServerUnavailable
from ma_jupyter.nodehost.procfs import is_marked
from ma_jupyter.nodehost.runner_env import runner_env
from ma_jupyter.nodehost.userns import CHECK_USER_NAMESPACE
from ma_jupyter.nodehost.view import SYSTEM_PATH
from tests.fixtures.local_backend import log_of, make_attempt, run_to_end, start
from tests.helpers import wait_for

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/bin/bwrap"), reason="needs bubblewrap")

SLEEPER = "import time; print('up', flush=True); time.sleep(120)"


@pytest.fixture
def backend():
    """A local backend (bubblewrap) whose fork server ends with the test."""
    made = LocalBackend()
    yield made
    made.close()


def _server(backend: LocalBackend) -> psutil.Process:
    proc = backend.node_host._forks._proc
    assert proc is not None and proc.poll() is None
    return psutil.Process(proc.pid)


def test_a_forked_runner_is_a_session_of_its_own_writing_to_its_log_with_nothing_of_the_server(
    ma_home, ma_root_jobs, backend
):
    attempt = make_attempt(ma_home, "forked-1", SLEEPER)
    [run] = start(backend, attempt)
    try:
        wait_for(lambda: "up" in log_of(attempt), timeout=30)
        runner = psutil.Process(run.pid)
        server = _server(backend)
        assert runner.ppid() == server.pid and runner.name() == RUNNER_NAME
        assert os.getsid(run.pid) == run.pid and os.getpgid(run.pid) == run.pid
        assert runner.cwd() == str(attempt.jobdir.node("worker-0").root)
        assert abs(runner.create_time() - run.start_time) < 0.05
        # it carries its node's marker, as every process of the node does (stop and re-attach)
        marker = attempt.jobdir.node("worker-0").marker.read_text().strip()
        assert is_marked(run.pid, marker) and not is_marked(server.pid, marker)
        fds = {int(fd): os.readlink(f"/proc/{run.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{run.pid}/fd")}
        assert fds[0] == "/dev/null"
        assert fds[1] == fds[2] == str(attempt.jobdir.node_log("worker-0"))
        # the server's socket (and anything else it held) stayed behind
        assert not [target for target in fds.values() if target.startswith("socket:")], fds
        with open(f"/proc/{run.pid}/status") as fh:
            status = dict(line.split(":", 1) for line in fh if ":" in line)
        # nothing blocked; neither the server's ignored Ctrl-C nor its handler reaping children
        bit = {signum: 1 << (signum - 1) for signum in (signal.SIGINT, signal.SIGCHLD)}
        assert int(status["SigBlk"], 16) == 0, status
        assert not int(status["SigIgn"], 16) & bit[signal.SIGINT], status
        assert not int(status["SigCgt"], 16) & bit[signal.SIGCHLD], status
    finally:
        backend.stop(attempt, [run], grace=1.0)


def test_an_ended_runner_is_reaped_at_once_and_its_node_ends_right(ma_home, ma_root_jobs, backend):
    attempt = make_attempt(ma_home, "forked-2", "import sys; print('bye', flush=True); sys.exit(3)")
    [run] = run_to_end(backend, attempt)
    assert run.state == "exited" and run.exit_code == 3, log_of(attempt)
    assert backend.node_host._forks._proc is not None  # forked, not started the slow way
    # no zombie is left that looks alive to a poll by pid
    wait_for(lambda: not psutil.pid_exists(run.pid), timeout=5)
    assert "bye" in log_of(attempt)


def test_the_server_ends_with_its_backend_and_the_runners_go_on(ma_home, ma_root_jobs):
    backend = LocalBackend()
    attempt = make_attempt(ma_home, "forked-3", SLEEPER)
    [run] = start(backend, attempt)
    try:
        wait_for(lambda: "up" in log_of(attempt), timeout=30)
        server = _server(backend)
        backend.close()
        assert backend.node_host._forks._proc is None and not server.is_running()
        assert psutil.Process(run.pid).status() != psutil.STATUS_ZOMBIE
        assert backend.poll(attempt, run).state == "running"
    finally:
        backend.stop(attempt, [run], grace=1.0)
    assert backend.poll(attempt, run).state == "exited"


def test_a_stop_by_name_alone_ends_a_forked_runner_before_its_command_starts(ma_home, ma_root_jobs, tmp_path):
    """A crash recovery, or a launch on Ray whose answer was lost, knows a node by its name only:
    its marker must find the runner too, or a runner still copying the algorithm folder (it does
    that itself in the symlink mode, with no other process of the node yet) would run the
    node's command after the stop."""
    algo = tmp_path / "algo"
    algo.mkdir()
    for i in range(4):  # 160 MB: the copy takes a while
        (algo / f"blob{i}.bin").write_bytes(os.urandom(40 << 20))
    backend = LocalBackend(sandbox="symlink")
    attempt = make_attempt(ma_home, "forked-7", "print('the command ran', flush=True)", algorithm=str(algo))
    try:
        [run] = start(backend, attempt)
        backend.stop(attempt, [NodeRun(name="worker-0")], grace=1.0)
        assert not psutil.pid_exists(run.pid) or psutil.Process(run.pid).status() == psutil.STATUS_ZOMBIE
        time.sleep(3)  # the copy's end and the command's start, had the runner survived the stop
        assert "the command ran" not in log_of(attempt)
    finally:
        backend.close()


def test_a_server_killed_between_two_nodes_is_started_again(ma_home, ma_root_jobs, backend):
    first = make_attempt(ma_home, "forked-4", "print('first', flush=True)")
    [run] = run_to_end(backend, first)
    assert run.exit_code == 0
    killed = _server(backend)
    killed.send_signal(signal.SIGKILL)
    killed.wait(timeout=10)
    second = make_attempt(ma_home, "forked-5", "print('second', flush=True)")
    [run] = run_to_end(backend, second)
    assert run.exit_code == 0 and "second" in log_of(second)
    assert _server(backend).pid != killed.pid


def test_a_server_that_cannot_start_says_so_and_nodes_start_the_slow_way(ma_home, ma_root_jobs):
    def broken() -> dict[str, str]:  # an interpreter that cannot find its standard library
        return {**runner_env(), "PYTHONHOME": "/nonexistent"}

    forks = RunnerForkServer(broken)
    started = time.monotonic()
    with pytest.raises(ServerUnavailable, match="fork server did not start"):
        forks.start()
    assert time.monotonic() - started < 30
    # and it is not tried again at every node meanwhile
    with pytest.raises(ServerUnavailable, match="failed to start a moment ago"):
        forks.start()
    forks.close()

    backend = LocalBackend()
    backend.node_host._forks = RunnerForkServer(broken)
    try:
        attempt = make_attempt(ma_home, "forked-6", "print('slow way', flush=True)")
        [run] = run_to_end(backend, attempt)
        assert run.exit_code == 0 and "slow way" in log_of(attempt)
        assert backend.node_host._forks._proc is None  # no server runs: the runner was a process of its own
    finally:
        backend.close()


def test_the_user_namespace_check_is_forked_by_the_server_and_answers_as_its_own_interpreter(
    ma_home, tmp_path, monkeypatch
):
    bwrap = shutil.which("bwrap", path=SYSTEM_PATH)
    if os.geteuid() != 0 or bwrap is None:
        pytest.skip("the user namespace check runs as root with bubblewrap")
    slow_way = subprocess.run(
        [
            sys.executable,
            "-m",
            "ma_jupyter.nodehost.noderun",
            CHECK_USER_NAMESPACE,
            *user_namespace_probe_argv(bwrap),
        ],
        env=runner_env(),
        capture_output=True,
        timeout=120,
    ).returncode
    if slow_way != 0:
        pytest.skip("user namespaces do not work here: both ways answer 1")
    hang = f"{600 + os.getpid() % 1000}.{time.time_ns() % 1000:03d}"  # this test's own sleep
    hangs = tmp_path / "hanging-bwrap"
    hangs.write_text(f"#!/bin/sh\nexec sleep {hang}\n")
    hangs.chmod(0o755)

    def hanging() -> list[int]:
        return [p.pid for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", hang]]

    forks = RunnerForkServer(runner_env)
    try:
        assert forks.check_user_namespace(user_namespace_probe_argv(bwrap), timeout=120) == 0
        assert forks.check_user_namespace(["/bin/false"], timeout=120) == 1  # a sandbox that cannot start
        # a check that does not answer in time says so (probes rule 3) and holds nothing up
        with pytest.raises(TimeoutError):
            forks.check_user_namespace([str(hangs)], timeout=1)
        # killed with its session (its own sandbox timeout, 20 s, would end it only later)
        wait_for(lambda: hanging() == [], timeout=10)
        assert forks.check_user_namespace(["/bin/false"], timeout=120) == 1
        # the probe asks the server, never a new interpreter; one that does not answer in time
        # keeps the isolation and is asked again (probes rule 3)
        monkeypatch.setattr(probes, "_USERNS_OK", None)
        monkeypatch.setattr(probes.subprocess, "run", lambda *a, **k: pytest.fail(f"started {a}"))
        with monkeypatch.context() as busy:
            busy.setattr(probes.shutil, "which", lambda *a, **k: str(hangs))
            busy.setattr(probes, "USERNS_CHECK_TIMEOUT", 1.0)
            assert probes.user_namespace_works(forks) is True and probes._USERNS_OK is None
        assert probes.user_namespace_works(forks) is True
        wait_for(lambda: hanging() == [], timeout=10)
    finally:
        forks.close()
