"""Who delivers a stop's SIGTERM to a node's processes (:mod:`ma_jupyter.nodehost.stopping`):
the claim on real files, the targets on a real process tree."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ma_jupyter.nodehost import stopping
from tests.fixtures.node_runner import bubblewrap_node
from tests.helpers import wait_for


def test_the_first_claim_wins_and_the_other_side_sends_nothing(tmp_path):
    claim = tmp_path / "stop-claim"
    assert stopping.holder(claim) is None
    assert stopping.claim(claim, stopping.RUNNER)
    assert stopping.holder(claim) == stopping.RUNNER
    assert not stopping.claim(claim, stopping.BACKEND)  # the runner relays: the backend stays quiet
    assert stopping.claim(claim, stopping.RUNNER)  # a repeated signal to the runner is its own
    claim.unlink()
    assert stopping.claim(claim, stopping.BACKEND)
    assert not stopping.claim(claim, stopping.RUNNER)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stop-claim"]  # no helper file left


def test_a_claim_that_is_a_link_is_never_followed_and_leaves_the_relay_to_the_runner(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    (tmp_path / "stop-claim").symlink_to(elsewhere)
    assert stopping.holder(tmp_path / "stop-claim") is None
    assert not stopping.claim(tmp_path / "stop-claim", stopping.BACKEND)
    assert stopping.claim(tmp_path / "stop-claim", stopping.RUNNER)
    assert not elsewhere.exists()


def test_the_targets_spare_the_sandboxs_own_two_levels_in_bubblewrap(tmp_path):
    # runner (this test's child) -> "outer" -> "first" -> "command" -> "below": the shape of
    # bwrap outside -> bwrap as pid 1 -> the node's command -> what it starts
    chain = "import subprocess, sys; subprocess.run(sys.argv[1:])"
    leaf = [sys.executable, "-c", "import time; time.sleep(60)"]
    argv = [sys.executable, "-c", chain] * 4 + leaf
    runner = subprocess.Popen(argv)
    try:
        below = wait_for(lambda: len(found := _tree(runner.pid)) == 4 and found, timeout=30)
        outer, first, command, leaf_pid = below
        assert stopping.targets(runner.pid, "bubblewrap") == [command, leaf_pid]
        assert stopping.targets(runner.pid, "symlink") == [outer, first, command, leaf_pid]
    finally:
        _kill_tree(runner)


def _kill_tree(runner: subprocess.Popen) -> None:
    """KILL the test's runner and what it started (by pid: only what this test started)."""
    for pid in [runner.pid, *_tree(runner.pid)]:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    runner.wait()


def _tree(pid: int) -> list[int]:
    from ma_jupyter.nodehost.procfs import descendants

    return [p for p, _, state in descendants(pid) if state != "Z"]


def test_a_stop_that_comes_while_the_sandbox_starts_reaches_the_command_once_it_runs(tmp_path):
    """The real runner (``python -m ma_jupyter.nodehost.noderun``) is stopped while its command
    phase has only its sandbox's two levels (bubblewrap outside and as pid 1, here two Python
    processes, the inner one 3 s slow to start the command): nothing can take the signal yet.  The
    runner delivers it to the command once it exists, so the node ends on SIGTERM at once (143:
    the levels pass on the command's end), not after the command's 600 s or a backend's grace
    period."""
    started = tmp_path / "command-started"
    # each level ends as bubblewrap does: with its child's code, 128+N for a signal N
    chain = "import subprocess, sys; code = subprocess.run(sys.argv[1:]).returncode; sys.exit(128 - code if code < 0 else code)"
    slow_chain = chain.replace("code =", "import time; time.sleep(3); code =", 1)
    command = f"open({str(started)!r}, 'w').close(); import time; time.sleep(600)"
    argv = [sys.executable, "-c", chain, sys.executable, "-c", slow_chain, sys.executable, "-c", command]
    node_dir, spec = bubblewrap_node(tmp_path, argv)
    runner = subprocess.Popen(
        [sys.executable, "-m", "ma_jupyter.nodehost.noderun", str(spec)],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    try:
        # the sandbox's first level runs (the runner is waiting on its phase), the command not yet
        wait_for(lambda: len(_tree(runner.pid)) >= 2, timeout=60, interval=0.02)
        assert not started.exists()
        runner.send_signal(signal.SIGTERM)
        assert runner.wait(timeout=60) == 128 + signal.SIGTERM
        # (the command may end before it writes its file: the signal can come first)
        assert (node_dir / "exit_code").read_text().strip() == str(128 + signal.SIGTERM)
        assert stopping.holder(node_dir / "stop-claim") == stopping.RUNNER
    finally:
        _kill_tree(runner)


def test_a_late_relay_that_finds_no_process_in_time_ends_the_sandbox_itself(tmp_path):
    """Rule 4's bound: a sandbox whose first level never starts the phase's processes (here a
    level that only sleeps) leaves the stop nothing to reach.  The runner does not wait on it
    for ever: after ``LATE_RELAY_LIMIT`` (shortened to 1 s for the test) it TERMs that level,
    bubblewrap itself, and the node ends with 143 instead of the level's 600 s."""
    # a first level that never starts its child
    node_dir, spec = bubblewrap_node(tmp_path, [sys.executable, "-c", "import time; time.sleep(600)"])
    driver = (
        "import os, sys; from ma_jupyter.nodehost import noderun; noderun.LATE_RELAY_LIMIT = 1.0; "
        "code = noderun.main(sys.argv[1:]); sys.stdout.flush(); os._exit(code)"
    )
    runner = subprocess.Popen(
        [sys.executable, "-c", driver, str(spec)],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    try:
        wait_for(lambda: len(_tree(runner.pid)) >= 1, timeout=60, interval=0.02)
        stopped = time.monotonic()
        runner.send_signal(signal.SIGTERM)
        assert runner.wait(timeout=60) == 128 + signal.SIGTERM
        assert time.monotonic() - stopped >= 1.0  # the relay waited its bound first
        assert (node_dir / "exit_code").read_text().strip() == str(128 + signal.SIGTERM)
    finally:
        _kill_tree(runner)
