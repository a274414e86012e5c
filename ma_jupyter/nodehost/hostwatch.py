"""The process whose end ends a node: a node runner watches the process hosting it (a Ray
node's raylet) and ends its node when that process is gone.

A runner is detached from what started it (a session of its own, :mod:`.forkserver` rule 5):
the local backend's service may restart while its nodes run on.  On a Ray node the machine's
cluster process is the raylet; once it is gone the job node is lost to the cluster (its
placement, its agent, its logs through the agent), and nothing of it may keep running (holding
cards, writing to shared outputs).  The backend that knows such a process names it in the
runner's instructions (``end_with`` in ``node-run.json``, made by :func:`host_process`):

1. ``{"pid": N, "start": <its start time>, "what": "<words naming it>"}``;
2. :func:`watch` opens a descriptor of the process (``pidfd_open``), which wakes it when the
   process ends; where the kernel has none it looks every :data:`LOOK_EVERY` seconds;
3. the process counts as gone when its pid is gone, is a zombie, or names another process (its
   start time is not ``start``: the pid was reused); that is checked after the descriptor is
   opened, so a descriptor never watches a reused pid;
4. once it is gone, ``on_gone(what)`` runs once, on the watch's thread;
5. the runner then ends its node with :func:`end_node`: the node's failure sentence (naming what
   ended and the processes it ends) is said in the node's log and handed to the runner first
   (which starts no further phase), then TERM to the node's processes, and after
   :data:`HOST_GRACE` seconds KILL to every process below the runner until the node has ended
   (``on_stop`` included: nothing outlives the host).

Standard library only: every node runner imports it.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable

from .procfs import command_name, process_start_time, process_tree

#: seconds between looks at the host process where no process descriptor can be opened
LOOK_EVERY = 0.5
#: seconds between looks even with a descriptor (a safety net: its wake-up is what counts)
RECHECK = 5.0
#: seconds the processes of a node whose host process ended get between TERM and KILL (rule 5)
HOST_GRACE = 3.0


def host_process(pid: int, what: str) -> dict | None:
    """The ``end_with`` entry naming process ``pid`` (rule 1); None when it is not running."""
    start = process_start_time(pid)
    if start is None:
        return None
    return {"pid": pid, "start": start, "what": what}


def alive(end_with: dict) -> bool:
    """Whether the process ``end_with`` names still runs (rule 3)."""
    try:
        pid, start = int(end_with["pid"]), end_with.get("start")
    except (KeyError, TypeError, ValueError):
        return False
    now = process_start_time(pid)
    return now is not None and (start is None or abs(now - float(start)) < 0.05)


def watch(end_with: dict, on_gone: Callable[[str], None]) -> threading.Thread:
    """Start a daemon thread that calls ``on_gone(what)`` once the process ``end_with`` names is
    gone (rules 2-4); returns the thread."""
    what = str(end_with.get("what") or f"process {end_with.get('pid')}")

    def run() -> None:
        fd = None
        try:
            fd = os.pidfd_open(int(end_with["pid"]))
        except (AttributeError, OSError, KeyError, TypeError, ValueError):
            fd = None  # gone already, or no descriptors here: the look below decides
        try:
            poller = None
            if fd is not None:
                poller = select.poll()
                poller.register(fd, select.POLLIN)
            while alive(end_with):
                if poller is None:
                    threading.Event().wait(LOOK_EVERY)
                elif poller.poll(RECHECK * 1000):
                    break  # it ended (a zombie it may still be: its end is what counts)
        finally:
            if fd is not None:
                os.close(fd)
        on_gone(what)

    thread = threading.Thread(target=run, name="ma-host-watch", daemon=True)
    thread.start()
    return thread


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # ended meanwhile (its pid not reused yet)
        pass


def end_node(
    node: str,
    what: str,
    ended: threading.Event,
    on_ending: Callable[[str], None],
    terminate: Callable[[], None],
) -> None:
    """Rule 5: ``what`` (the process hosting ``node``) ended; end every process below this one
    (the node's runner) until ``ended`` is set.  ``on_ending(sentence)`` records the node's
    failure before any signal; ``terminate()`` sends TERM to the node's processes."""
    below = process_tree(os.getpid())
    names = ", ".join(f"{command_name(pid)} ({pid})" for pid in below[:8]) + (
        ", ..." if len(below) > 8 else ""
    )
    sentence = (
        f"{what} ended: the processes of {node} on that machine were ended with it "
        f"(TERM, KILL after {HOST_GRACE:g} s): {names or 'none left'}"
    )
    print(f"[ma_jupyter] {sentence}", file=sys.stderr, flush=True)
    on_ending(sentence)
    terminate()
    deadline = time.monotonic() + HOST_GRACE
    while time.monotonic() < deadline and process_tree(os.getpid()) and not ended.wait(0.1):
        pass
    while not ended.is_set():  # what is left, and on_stop: nothing outlives the host
        for pid in process_tree(os.getpid()):
            _kill(pid)
        ended.wait(0.2)
