"""What ``/proc`` says about a process: for the hang alert its name, state and kernel wait channel; its
start time, counted from one boot time by a backend and the processes it starts."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from ma_jupyter.nodehost import procfs
from ma_jupyter.nodehost.forkserver import RunnerForkServer
from ma_jupyter.nodehost.runner_env import runner_env
from tests.helpers import wait_for


def test_a_sleeping_process_is_named_with_its_state_and_wait_channel_and_a_gone_one_is_none():
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import ctypes, time; ctypes.CDLL(None).prctl(15, b'odd\\x1b[2Jname'); time.sleep(60)",
        ]
    )
    try:
        look = wait_for(
            lambda: (seen := procfs.process_look(child.pid)) and seen[1] == "sleeping" and seen, timeout=30
        )
        name, state, wait = look
        assert name == "odd?[2Jname" and state == "sleeping"  # a name the job set, made printable
        # the kernel's sleep (hrtimer_nanosleep, do_nanosleep...), or nothing where it hides it
        assert wait == "" or ("sleep" in wait and wait.isidentifier()), wait
    finally:
        child.kill()
        child.wait()
    assert procfs.process_look(child.pid) is None and procfs.wait_channel(child.pid) == ""


def _btime() -> float:
    with open("/proc/stat") as fh:
        return float(next(line for line in fh if line.startswith("btime")).split()[1])


def _child_says(code: str, env: dict[str, str]) -> str:
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, timeout=60
    ).stdout.strip()


def test_the_runners_count_start_times_from_their_backends_boot_time_though_the_clock_was_stepped(
    monkeypatch,
):
    """``/proc/stat``'s btime moves with a step of the clock: a runner (or fork server) that read
    it after a step would see every start time a whole number of seconds off its backend's, and
    the backend would take its runner for another process (boot_time rule 1)."""
    monkeypatch.setattr(procfs, "_BOOT_TIME", _btime() + 7.0)  # read before a 7 s step
    mine = procfs.process_start_time(os.getpid())
    seen = _child_says(
        "import os; from ma_jupyter.nodehost import procfs; print(procfs.process_start_time(os.getppid()))",
        runner_env(),
    )
    assert float(seen) == mine


def test_a_fork_server_answers_its_runners_start_time_as_its_backend_counts_it(monkeypatch, tmp_path):
    """The start time a fork server answers (forkserver rule 2) is the one the backend's own look
    finds, which is how a backend tells its runner from another process (``NodeHost._alive``):
    the wait for its runners to enter their network namespace ends early otherwise, and their
    namespaces' files are gone before they open them."""
    step = 60.0
    monkeypatch.setattr(procfs, "_BOOT_TIME", _btime() + step)
    server = RunnerForkServer(runner_env)
    log = os.open(tmp_path / "log", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        before = time.time()
        # no instructions there: the runner ends at once, its start time answered all the same
        pid, start = server.fork_runner(str(tmp_path / "none.json"), str(tmp_path), "t/0/worker-0/ab", log)
        after = time.time()
    finally:
        os.close(log)
        server.close()
    assert pid > 0 and start is not None
    assert before + step - 1.0 <= start <= after + step + 1.0, (before, start, after)


def test_a_boot_time_handed_down_that_is_no_time_is_ignored():
    """Rule 2 where the variable names no time: the process reads btime itself."""
    for value in ("", "soon", "-5", "inf", "nan"):
        seen = _child_says(
            "from ma_jupyter.nodehost import procfs; print(procfs.boot_time())",
            {**os.environ, procfs.BOOT_TIME_ENV: value},
        )
        assert float(seen) == _btime(), value
