"""What ``/proc`` says about one process: its start time and the node marker in its environment.

Standard library only: the node runners' fork server imports it (see :mod:`.forkserver`), and
every module imported there is paid for once per server and shared by every runner it forks.
"""

from __future__ import annotations

import os

#: the environment variable marking every process of one node run (found again after a restart)
NODE_MARKER = "MA_NODE_RUN"

_BOOT_TIME: float | None = None


def process_start_time(pid: int, *, ended: bool = False) -> float | None:
    """When ``pid`` started, in seconds since the epoch (from ``/proc/<pid>/stat``); None if it
    does not exist, or (unless ``ended``) has ended and waits to be reaped (a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X") and not ended:
        return None
    ticks = int(fields[19])
    return round(_boot_time() + ticks / os.sysconf("SC_CLK_TCK"), 2)


def _boot_time() -> float:
    global _BOOT_TIME
    if _BOOT_TIME is None:
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
