"""What ``/proc`` says about processes: one process's status fields, start time, resident
memory, name, kernel wait channel and node marker, and the tree of processes below one.

The runner, its watchdog, the resource sampler and the host watch read ``/proc/<pid>/stat``
through here, from the package's one reader of it (:mod:`ma_jupyter.procstat`).
Every function here is a look, never a change: it answers None, 0 or an empty list for a process
that ended meanwhile (or never was), and raises nothing.

Read from ``/proc`` directly rather than with psutil: its import (15 ms) would delay every node's
start, and the runner needs nothing else from it.  Standard library only: the node runners' fork
server imports it (see :mod:`.forkserver`), and every module imported there is paid for once per
server and shared by every runner it forks.
"""

from __future__ import annotations

import os

# the one reader of /proc/<pid>/stat, and its field indexes (named here for this room's users)
from ..procstat import CSTIME, NUM_THREADS, PPID, RSS, STARTTIME, STATE, UTIME, stat_fields  # noqa: F401

#: the environment variable marking every process of one node run (found again after a restart)
NODE_MARKER = "MA_NODE_RUN"
#: the environment variable handing a backend's boot time (:func:`boot_time`) down to the
#: processes it starts: the node runners' fork server and the runners (:mod:`.runner_env`)
BOOT_TIME_ENV = "MA_BOOT_TIME"

_BOOT_TIME: float | None = None
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def process_start_time(pid: int, *, ended: bool = False) -> float | None:
    """When ``pid`` started, in seconds since the epoch (from ``/proc/<pid>/stat``); None if it
    does not exist, or (unless ``ended``) has ended and waits to be reaped (a zombie)."""
    fields = stat_fields(pid)
    if fields is None:
        return None
    if fields[STATE] in (b"Z", b"X") and not ended:
        return None
    ticks = int(fields[STARTTIME])
    return round(boot_time() + ticks / os.sysconf("SC_CLK_TCK"), 2)


def descendants(root: int) -> list[tuple[int, int, str]]:
    """``(pid, parent pid, state)`` of every process below ``root``, parents before children
    (a scan of all of ``/proc``)."""
    table: dict[int, list[tuple[int, str]]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = stat_fields(entry)
        if fields is None:
            continue
        table.setdefault(int(fields[PPID]), []).append((int(entry), fields[STATE].decode()))
    found: list[tuple[int, int, str]] = []
    parents = [root]
    while parents:
        parent = parents.pop(0)
        for pid, state in table.get(parent, ()):
            found.append((pid, parent, state))
            parents.append(pid)
    return found


def process_tree(root: int) -> list[int]:
    """Every process below ``root``, walked through ``/proc/<pid>/task/<tid>/children`` (it
    reads only the tree, not all of ``/proc``: the memory watchdog samples it often); the whole
    ``/proc`` scan of :func:`descendants` where the kernel has no such files."""
    if not os.path.exists(f"/proc/{root}/task/{root}/children"):
        return [pid for pid, _, state in descendants(root) if state != "Z"]
    found: list[int] = []
    todo = [root]
    while todo:
        pid = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:  # ended meanwhile
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/children", "rb") as fh:
                    children = [int(c) for c in fh.read().split()]
            except (OSError, ValueError):
                continue
            found += children
            todo += children
    return found


def resident(pid: int) -> int:
    """Resident memory of one process in bytes (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as fh:
            return int(fh.read().split()[1]) * PAGE
    except (OSError, ValueError, IndexError):
        return 0


#: ``proc(5)``'s process states, as a hang alert names them
STATE_NAMES = {
    "R": "running",
    "S": "sleeping",
    "D": "in uninterruptible wait",
    "T": "stopped",
    "t": "stopped by a tracer",
    "Z": "a zombie",
    "X": "dead",
    "I": "idle",
}


def wait_channel(pid: int) -> str:
    """The kernel function a sleeping process waits in (``/proc/<pid>/wchan``: ``futex_wait``,
    ``hrtimer_nanosleep``, ``do_select``...); empty when it runs, is gone, or the kernel hides it."""
    try:
        with open(f"/proc/{pid}/wchan", "rb") as fh:
            name = fh.read(256).decode("ascii", "replace").strip()
    except OSError:
        return ""
    return "" if name in ("0", "") else name


def process_look(pid: int) -> tuple[str, str, str] | None:
    """``(name, state, wait channel)`` of one process (:data:`STATE_NAMES` spells the state);
    None once it is gone."""
    fields = stat_fields(pid)
    if fields is None:
        return None
    state = fields[STATE].decode("ascii", "replace")
    # the name is the job's to set (prctl PR_SET_NAME): kept to printable characters
    name = "".join(c if c.isprintable() else "?" for c in command_name(pid))
    return name, STATE_NAMES.get(state, state), wait_channel(pid)


def command_name(pid: int) -> str:
    """A process's command name (``?`` once it is gone)."""
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return "?"


def command_line(pid: int) -> list[str] | None:
    """A process's arguments (``/proc/<pid>/cmdline``); None once it is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().decode(errors="replace").split("\0")
    except OSError:
        return None


def ignores_signal(pid: int, signum: int) -> bool:
    """Whether ``pid`` ignores ``signum`` now (``SigIgn`` of ``/proc/<pid>/status``: the kernel
    discards one sent to it); False once it is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"SigIgn:"):
                    return bool(int(line.split()[1], 16) & (1 << (signum - 1)))
    except (OSError, ValueError, IndexError):
        pass
    return False


def boot_time() -> float:
    """When this machine booted (seconds since the epoch) as this process counts start times
    (:func:`process_start_time`): one value for the process's whole life.

    The kernel records no boot time: ``/proc/stat``'s ``btime`` is the wall clock less the time
    since boot, computed at each read, so a step of the clock (a time sync, a virtual machine
    resumed) moves it by whole seconds, and two processes that read it on either side of a step
    disagree on every start time.  Start times are compared across processes within 0.05 s: the
    runner's as its fork server answered it with the backend's own look (``NodeHost._alive``,
    on which the wait for the runners to enter their network namespace ends), the raylet's as
    its agent saw it with the runner's (:mod:`.hostwatch`).  So:

    1. a process started with :data:`BOOT_TIME_ENV` (a backend's fork server and runners,
       :func:`.runner_env.runner_env`) counts from the value it names, its starter's;
    2. any other reads ``btime`` once, at its first start time, and keeps it.
    """
    global _BOOT_TIME
    if _BOOT_TIME is None:
        try:
            given = float(os.environ.get(BOOT_TIME_ENV, ""))
        except ValueError:
            given = 0.0
        if given > 0.0 and given != float("inf"):  # rule 1 (never a value that is not a time)
            _BOOT_TIME = given
            return _BOOT_TIME
        with open("/proc/stat") as fh:
            for line in fh:
                if line.startswith("btime"):
                    _BOOT_TIME = float(line.split()[1])
                    break
            else:
                _BOOT_TIME = 0.0
    return _BOOT_TIME


def is_marked(pid: int, marker: str) -> bool:
    """Whether process ``pid``'s environment carries ``MA_NODE_RUN=<marker>``."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return f"{NODE_MARKER}={marker}".encode() in fh.read().split(b"\0")
    except OSError:
        return False
