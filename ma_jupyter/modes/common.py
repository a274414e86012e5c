"""Pieces the distributed modes share: command classification, hostfiles, rank arithmetic.

Everything here is pure: it looks at argv lists and placements and returns text or lists.
"""

from __future__ import annotations

from collections.abc import Callable

from ..nodeside.argv import is_python, program
from .base import Placement, TaskSlot

#: the module every rank-splitting launch goes through (see :mod:`ma_jupyter.nodeside.rank_log`)
RANK_LOG_MODULE = "ma_jupyter.nodeside.rank_log"

__all__ = ["RANK_LOG_MODULE", "is_python", "program"]


def python_module(argv: list[str]) -> str | None:
    """The module of a ``python [-u ...] -m <module> ...`` command, else None."""
    if not is_python(argv):
        return None
    for i, arg in enumerate(argv[1:], start=1):
        if arg == "-m" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("-m") and len(arg) > 2:
            return arg[2:]
        if not arg.startswith("-"):
            return None
    return None


def hostfile(tasks: list[TaskSlot], slots: Callable[[TaskSlot], int] | None = None) -> str:
    """An Open MPI / DeepSpeed hostfile: ``<hostname> slots=<n>`` per task, one a line.

    ``slots(task)`` gives ``n``; default the task's processes (a DeepSpeed hostfile counts cards).
    """
    count = slots or (lambda t: t.slots)
    return "".join(f"{t.hostname} slots={count(t)}\n" for t in tasks)


def mpich_hostfile(tasks: list[TaskSlot], slots: Callable[[TaskSlot], int] | None = None) -> str:
    """An MPICH (Hydra) hostfile: ``<hostname>:<n>`` per task, one a line (``slots`` as in
    :func:`hostfile`)."""
    count = slots or (lambda t: t.slots)
    return "".join(f"{t.hostname}:{count(t)}\n" for t in tasks)


def total_slots(tasks: list[TaskSlot]) -> int:
    """Processes in the whole job: the sum of every task's slots."""
    return sum(t.slots for t in tasks)


def first_rank(tasks: list[TaskSlot], task: TaskSlot) -> int:
    """The global rank of the first process of ``task`` (tasks in order, each with its slots)."""
    rank = 0
    for t in tasks:
        if t == task:
            return rank
        rank += t.slots
    raise ValueError(f"{task.name} is not one of the tasks")


def master(placement: Placement) -> TaskSlot:
    """worker-0: the task whose address and first port are MASTER_ADDR / MASTER_PORT."""
    workers = placement.workers
    if not workers:
        raise ValueError("the placement has no worker task")
    return workers[0]


def distributed_env(placement: Placement, task: TaskSlot) -> dict[str, str]:
    """The platform's PyTorch variables for one node.

    Seed 002: ``MASTER_ADDR``/``MASTER_PORT`` (worker-0's address and first reserved port),
    ``WORLD_SIZE`` (the number of nodes), ``RANK`` (this node's index), ``SLOTS`` (cards per
    node, 1 for a CPU spec).  A launcher then sets the per-process values.

    What launchers read by themselves, so they need no argument:

    * ``NODE_RANK`` and ``GROUP_RANK``: this node's index (Lightning's environment reads
      ``NODE_RANK``, else ``GROUP_RANK``; accelerate's ``notebook_launcher`` reads ``NODE_RANK``;
      torchrun gives its workers ``GROUP_RANK``);
    * torchrun's own defaults, ``PET_<OPTION>`` for ``--<option>``: ``PET_NNODES``,
      ``PET_NPROC_PER_NODE`` (SLOTS), ``PET_NODE_RANK``, ``PET_MASTER_ADDR``,
      ``PET_MASTER_PORT``, ``PET_RDZV_BACKEND=static`` (ranks by node index: simulated nodes in
      private pid namespaces never wait on each other) and ``PET_RDZV_ID`` (the job id, shared
      by every node, for a command that picks ``--rdzv-backend c10d``).  An option on torchrun's
      command line still wins.  ``PET_RDZV_ENDPOINT`` is left unset on purpose: the static
      rendezvous takes its endpoint from the master address and port, and an endpoint in the
      environment would override a ``--master_port`` the command gives.
    """
    head = master(placement)
    nodes = str(len(placement.workers))
    index = str(task.index)
    return {
        "MASTER_ADDR": head.address,
        "MASTER_PORT": str(head.port),
        "WORLD_SIZE": nodes,
        "RANK": index,
        "SLOTS": str(task.slots),
        "NODE_RANK": index,
        "GROUP_RANK": index,
        "PET_NNODES": nodes,
        "PET_NPROC_PER_NODE": str(task.slots),
        "PET_NODE_RANK": index,
        "PET_MASTER_ADDR": head.address,
        "PET_MASTER_PORT": str(head.port),
        "PET_RDZV_BACKEND": "static",
        "PET_RDZV_ID": placement.job_id,
    }


def with_rank_log(argv: list[str], rank_var: str | None = None) -> list[str]:
    """``argv`` run through the per-rank log splitter (one process per rank)."""
    head = ["python", "-m", RANK_LOG_MODULE]
    if rank_var:
        # one token, so that launchers that pass "--" through untouched never see a separator
        head.append(f"--rank-var={rank_var}")
    return [*head, *argv]
