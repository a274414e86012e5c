"""Who delivers a stop's SIGTERM to a node's processes (:mod:`ma_jupyter.nodehost.stopping`):
the claim on real files, the targets on a real process tree."""

from __future__ import annotations

import os
import subprocess
import sys

from ma_jupyter.nodehost import stopping
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
        for pid in [runner.pid, *_tree(runner.pid)]:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        runner.wait()


def _tree(pid: int) -> list[int]:
    from ma_jupyter.nodehost.procfs import descendants

    return [p for p, _, state in descendants(pid) if state != "Z"]
