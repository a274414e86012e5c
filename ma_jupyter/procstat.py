"""The package's one reader of ``/proc/<pid>/stat``: a process's status fields.

A foundation module: standard library only, it imports nothing of the package, so every layer
may import it (``tests/unit/test_layers.py``): the node machinery's looks at processes
(:mod:`ma_jupyter.nodehost.procfs`, which builds its start times, trees and memory on it) and the
client's look at the service it started alike.  A look, never a change: None for a process that
ended meanwhile (or never was), nothing raised.
"""

from __future__ import annotations

#: indexes in :func:`stat_fields` (``proc(5)``'s field numbers less 3: counted after "pid (comm)")
STATE, PPID, UTIME, CSTIME, NUM_THREADS, STARTTIME, RSS = 0, 1, 11, 14, 17, 19, 21


def stat_fields(pid: int | str) -> list[bytes] | None:
    """The fields of ``/proc/<pid>/stat`` after "pid (comm)" (so :data:`STATE` is ``[0]``); None
    once the process is gone.  The name may hold spaces and parentheses: the fields are split
    after its last ``)``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:  # ended meanwhile
        return None
    return stat[stat.rfind(b")") + 2 :].split()
