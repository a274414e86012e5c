"""What ``/proc`` says about a process, for the hang alert: its name, state and kernel wait channel."""

from __future__ import annotations

import subprocess
import sys

from ma_jupyter.nodehost import procfs
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
