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
4. once it is gone, ``on_gone(what)`` runs once, on the watch's thread.

Standard library only: every node runner imports it.
"""

from __future__ import annotations

import os
import select
import threading
from collections.abc import Callable

from .procfs import process_start_time

#: seconds between looks at the host process where no process descriptor can be opened
LOOK_EVERY = 0.5
#: seconds between looks even with a descriptor (a safety net: its wake-up is what counts)
RECHECK = 5.0


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
