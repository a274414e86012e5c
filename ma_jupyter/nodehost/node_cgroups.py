"""The nodes' cgroups as the machine hosting them names, makes and removes them (:mod:`.cgroup`
is what the runner does with one; standard library only, so it cannot read the service's home).

1. :func:`node_cgroup`: where a node's runner makes its cgroup, or None where no memory cgroup
   can be made here (said once in the service log; the first call sweeps what crashed runners
   left);
2. :func:`remove_node_cgroups`: the empty cgroups of an attempt's nodes that their runners left
   (killed) removed; a live node's stays.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterable
from typing import Protocol

from .. import config
from ..models import NodeRun
from . import cgroup


class _Attempt(Protocol):
    @property
    def job_id(self) -> str: ...

    @property
    def number(self) -> int: ...


def _cgroup_scope() -> str:
    """This service's part of its nodes' cgroup names (:func:`.cgroup.node_name`): its home's
    digest, as two services' job ids may repeat."""
    return hashlib.sha256(str(config.home()).encode()).hexdigest()[:8]


#: seconds a killed process may take to leave its node's cgroup (longer on a loaded machine)
EXITING_WAIT = 5.0


def remove_node_cgroups(attempt: _Attempt, runs: Iterable[NodeRun]) -> None:
    """Remove the cgroups of ``runs`` (:mod:`.cgroup`) that their runners left (killed): only
    empty ones go, a live node's stays.  Called once no process carries the nodes' marker: a
    process killed a moment ago may still be leaving its cgroup (its memory being freed, its
    environment, and so its marker, already gone), so each removal waits up to
    :data:`EXITING_WAIT` seconds for it."""
    where, _ = cgroup.detect()
    if where is None:
        return
    for run in runs:
        cgroup.NodeCgroup(
            {**where, "name": cgroup.node_name(attempt.job_id, attempt.number, run.name, _cgroup_scope())}
        ).remove(wait=EXITING_WAIT)


_CGROUP_SAID = False


def node_cgroup(job_id: str, attempt: int, node: str) -> dict | None:
    """Where the node's runner makes the node's cgroup (:mod:`.cgroup`), or None where no memory
    cgroup can be made here: then the service log says why, once, and the node's memory is the
    watchdog's to bound.  The first call also removes what crashed runners left."""
    global _CGROUP_SAID
    where, why = cgroup.detect()
    if not _CGROUP_SAID:
        _CGROUP_SAID = True
        if where is None:
            print(
                f"[ma_jupyter] no memory cgroup for the nodes here ({why}): each node's memory is "
                "bounded by its runner's watchdog, which does not see memory a job holds unmapped "
                "(a memfd, System V shared memory)",
                file=sys.stderr,
                flush=True,
            )
        else:
            cgroup.sweep(where)
    if where is None:
        return None
    return {**where, "name": cgroup.node_name(job_id, attempt, node, _cgroup_scope())}
