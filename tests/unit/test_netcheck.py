"""The network check's rules as the node inspection asks them (``nodehost/netcheck.py``, the Ray
agents' check): an answer at once, one probe at a time on a thread of its own, a fault said only
after two failed in a row."""

from __future__ import annotations

import threading

import pytest

from ma_jupyter.nodehost.netcheck import NetworkCheck
from tests.helpers import wait_for


def test_a_look_never_waits_for_its_probe_and_only_two_failures_in_a_row_are_said():
    answers = iter(["cannot: once", None, "cannot: first", "cannot: second", None])
    release = threading.Event()
    calls = []

    def probe() -> str | None:
        calls.append(1)
        release.wait(60)
        return next(answers)

    check = NetworkCheck(probe)

    def look() -> str | None:  # one look, then its probe let through and waited for
        why = check.answer()
        release.set()
        wait_for(lambda: not check.running, timeout=30)
        release.clear()
        return why

    assert check.answer() is None and check.running  # the first probe runs, nothing known yet
    assert check.answer() is None and len(calls) == 1  # one probe at a time: the look returned
    release.set()
    wait_for(lambda: not check.running, timeout=30)
    release.clear()
    assert look() is None  # failed once: not said, and this look probed again at once: passed
    check.every = 0.0  # each look starts a probe
    assert look() is None  # the passed answer; this look's probe fails once
    assert look() is None  # still not said; this look's probe fails again
    assert look() == "cannot: second"  # two in a row: said; this look's probe passes
    assert look() is None  # one pass clears it
    assert len(calls) == 6


def test_a_probe_that_raises_is_a_failure_with_its_reason():
    def probe() -> str | None:
        raise OSError("no netlink here")

    check = NetworkCheck(probe, every=0.0)
    for _ in range(2):
        check.answer()
        wait_for(lambda: not check.running, timeout=30)
    assert check.answer() == "the network probe failed: no netlink here"


# the SystemExit ends the probe's thread as it would in the service: pytest reports it as unhandled
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_probe_ended_by_a_base_exception_leaves_the_check_free_to_probe_again():
    """A probe thread ended by what is not an Exception (SystemExit, KeyboardInterrupt) must not
    leave the check marked running: no probe would ever start again."""
    ends = iter([SystemExit(1), None])

    def probe() -> str | None:
        end = next(ends)
        if end is not None:
            raise end
        return None

    check = NetworkCheck(probe, every=0.0)
    check.answer()
    wait_for(lambda: not check.running, timeout=30)
    check.answer()  # a second probe starts
    wait_for(lambda: not check.running, timeout=30)
    assert next(ends, "both ran") == "both ran"
