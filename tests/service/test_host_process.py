"""A node ends with the process hosting it (a Ray node's raylet): the runner's watch
(``noderun`` rule 8, :mod:`ma_jupyter.nodehost.hostwatch`) and the next agent's sweep of
what runners of dead hosts left (:mod:`ma_jupyter.backends.ray.leftovers`).

The host is a real process this test starts and kills with SIGKILL, as a crash or the OOM
killer ends a raylet; the nodes are real runners in real sandboxes whose command ignores SIGTERM
and leaves a TERM-ignoring child and a ``setsid`` grandchild behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time

import psutil
import pytest

from ma_jupyter import config
from ma_jupyter.backends.local import LocalBackend
from ma_jupyter.backends.ray import leftovers
from ma_jupyter.nodehost import hostwatch
from ma_jupyter.nodehost.procfs import NODE_MARKER
from tests.fixtures.local_backend import log_of, make_attempt, marked, start, tree_script
from tests.helpers import wait_for


def _host() -> tuple[subprocess.Popen, dict]:
    """A process standing for a raylet, and the ``end_with`` entry naming it."""
    proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
    entry = hostwatch.host_process(proc.pid, f"the test's host process (pid {proc.pid})")
    assert entry is not None
    return proc, entry


def _kill(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait()


def test_a_reused_or_ended_host_pid_is_not_alive():
    proc, entry = _host()
    try:
        assert hostwatch.alive(entry)
        assert not hostwatch.alive({**entry, "start": entry["start"] - 100})  # the pid, reused
    finally:
        _kill(proc)
    assert not hostwatch.alive(entry)
    assert hostwatch.host_process(proc.pid, "gone") is None


@pytest.mark.parametrize("sandbox", ["bubblewrap", "symlink"])
def test_the_node_ends_within_seconds_of_its_host_and_says_what_it_ended(ma_home, ma_root_jobs, sandbox):
    if sandbox == "bubblewrap" and not os.path.exists("/usr/bin/bwrap"):
        pytest.skip("needs bubblewrap")
    marker = f"ma-host-{os.getpid()}-{time.time_ns()}"
    attempt = make_attempt(ma_home, f"host-{sandbox}", tree_script(marker))
    host, entry = _host()
    backend = LocalBackend(sandbox=sandbox)
    backend.node_host.end_with = entry
    try:
        [run] = start(backend, attempt)
        wait_for(lambda: "tree started" in log_of(attempt), timeout=30)
        wait_for(lambda: len(marked(marker)) >= 3, timeout=10)
        _kill(host)
        killed_at = time.monotonic()
        # the report is there while the node still ends (its processes ignore TERM for the
        # grace): a backend told of the host's end first reads it at once
        failure = attempt.jobdir.node("worker-0").failure
        wait_for(failure.exists, timeout=hostwatch.HOST_GRACE + 20)
        assert marked(marker), "the failure report was written only once the node had ended"
        wait_for(lambda: marked(marker) == [], timeout=hostwatch.HOST_GRACE + 20)
        took = time.monotonic() - killed_at
        done = wait_for(lambda: (r := backend.poll(attempt, run)).state != "running" and r, timeout=20)
    finally:
        if host.poll() is None:
            _kill(host)
        backend.stop(attempt, [run], 0.5) if "run" in locals() else None
    assert took < hostwatch.HOST_GRACE + 8, took  # "within a few seconds" even on a loaded machine
    assert done.state == "exited"
    assert done.exit_code != 0  # never a success
    log = log_of(attempt)
    assert "main got SIGTERM" in log  # offered the grace period first, as a stop does
    assert f"the test's host process (pid {entry['pid']}) ended" in log
    report = json.loads(attempt.jobdir.node("worker-0").failure.read_text())["reason"]
    assert "ended with it" in report and "python" in report, report
    assert backend.failure(attempt, done) == report


def test_without_a_host_process_a_node_runs_on(ma_home):
    """The local backend's nodes name no host: nothing ends them but their end or a stop."""
    marker = f"ma-nohost-{os.getpid()}-{time.time_ns()}"
    attempt = make_attempt(
        ma_home, "nohost", f"import time; print('up', flush=True); time.sleep(600)  # {marker}"
    )
    backend = LocalBackend()
    [run] = start(backend, attempt)
    try:
        wait_for(lambda: "up" in log_of(attempt), timeout=30)
        spec = json.loads(attempt.jobdir.node("worker-0").runner_spec.read_text())
        assert spec["end_with"] is None
    finally:
        backend.stop(attempt, [run], 0.5)
    assert marked(marker) == []


def test_the_next_agent_ends_what_a_runner_of_a_dead_host_left(ma_home):
    """A runner that cannot act (stopped) outlives its host: the sweep an agent makes at its
    start kills its node's processes and says so; a node whose host lives is left alone."""
    dead_marker = f"ma-left-{os.getpid()}-{time.time_ns()}"
    live_marker = f"ma-live-{os.getpid()}-{time.time_ns()}"
    left = make_attempt(
        ma_home, "left", f"import time; print('up', flush=True); time.sleep(600)  # {dead_marker}"
    )
    live = make_attempt(
        ma_home, "live", f"import time; print('up', flush=True); time.sleep(600)  # {live_marker}"
    )
    dead_host, dead_entry = _host()
    live_host, live_entry = _host()
    backend = LocalBackend()
    runs = []
    try:
        backend.node_host.end_with = dead_entry
        runs.append((left, start(backend, left)[0]))
        backend.node_host.end_with = live_entry
        runs.append((live, start(backend, live)[0]))
        wait_for(lambda: "up" in log_of(left) and "up" in log_of(live), timeout=30)
        wait_for(lambda: marked(dead_marker) and marked(live_marker), timeout=10)
        os.kill(runs[0][1].pid, signal.SIGSTOP)  # frozen: it cannot see its host end
        _kill(dead_host)
        time.sleep(hostwatch.HOST_GRACE + 1)  # long past the time it would have acted
        assert marked(dead_marker), "a stopped runner ended its node: the sweep is not what is tested"
        ended = leftovers.end_leftovers(config.jobs_root())
        [ours] = [e for e in ended if e["node_dir"] == str(left.jobdir.node("worker-0").root)]
        assert runs[0][1].pid in ours["pids"]
        wait_for(lambda: marked(dead_marker) == [], timeout=10)
        assert not psutil.pid_exists(runs[0][1].pid) or psutil.Process(runs[0][1].pid).status() == "zombie"
        report = json.loads(left.jobdir.node("worker-0").failure.read_text())["reason"]
        assert "were ended by the next agent" in report, report
        assert marked(live_marker), "the node of a live host was touched"
        assert backend.poll(live, runs[1][1]).state == "running"
    finally:
        for host in (dead_host, live_host):
            if host.poll() is None:
                _kill(host)
        for attempt, run in runs:
            backend.stop(attempt, [run], 0.5)


def _marked_process(cwd, marker: str) -> subprocess.Popen:
    """A process carrying a node marker, as every process of a job inherits it, in ``cwd``."""
    env = {**os.environ, NODE_MARKER: marker}
    return subprocess.Popen(["sleep", "600"], cwd=cwd, env=env, start_new_session=True)


def test_the_sweep_opens_nothing_a_job_planted_and_looks_only_below_node_root(ma_home, tmp_path):
    """A job's process (it inherits the node marker) moves to a folder it can write and plants
    FIFOs named ``marker`` and ``node-run.json`` there: an agent starting on that machine must
    neither block on them nor read them.  The same plant inside a job's node folder is refused
    without blocking; a folder outside ``node_root`` with a forged runner is left alone."""
    dead, dead_entry = _host()
    _kill(dead)
    planted = tmp_path / "planted"
    planted.mkdir()
    for name in ("marker", "node-run.json"):
        os.mkfifo(planted / name)
    inside = config.jobs_root() / "job-x" / "nodes" / "worker-0"
    inside.mkdir(parents=True)
    os.mkfifo(inside / "node-run.json")
    (inside / "marker").write_text("m-inside")
    forged = tmp_path / "j" / "nodes" / "worker-0"  # elsewhere, with what a real runner has
    forged.mkdir(parents=True)
    (forged / "marker").write_text("m-forged")
    (forged / "node-run.json").write_text(json.dumps({"end_with": dead_entry}))
    procs = [
        _marked_process(planted, "m-planted"),
        _marked_process(inside, "m-inside"),
        _marked_process(forged, "m-forged"),
    ]
    result: list = []
    sweep = threading.Thread(
        target=lambda: result.append(leftovers.end_leftovers(config.jobs_root())), daemon=True
    )
    try:
        sweep.start()
        sweep.join(timeout=60)
        assert not sweep.is_alive(), "the agent's sweep blocked on a FIFO a job planted"
        assert result == [[]], result
        assert all(p.poll() is None for p in procs), "a process was ended on what a job planted"
    finally:
        for fifo in (planted / "marker", planted / "node-run.json", inside / "node-run.json"):
            try:  # a sweep blocked on it reads an end of file and goes on
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
        for p in procs:
            _kill(p)
