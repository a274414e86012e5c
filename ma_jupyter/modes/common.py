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


def ports_env(placement: Placement, task: TaskSlot) -> dict[str, str]:
    """Every reserved port named, for frameworks that need a port of their own.

    ``MA_PORTS``: this node's reserved ports, comma-separated (the first is its main one, worker-0's
    is ``MASTER_PORT``); ``MA_MASTER_PORTS``: worker-0's, in the same order, so every node knows
    where a service started on worker-0 listens (XGBoost's tracker, Ray's head).  Under torch's
    launcher ``MASTER_PORT`` is taken by its store: the second port is the one left free.
    """
    return {
        "MA_PORTS": ",".join(str(p) for p in task.ports),
        "MA_MASTER_PORTS": ",".join(str(p) for p in master(placement).ports),
    }


def jax_env(placement: Placement, task: TaskSlot) -> dict[str, str]:
    """The variables ``jax.distributed.initialize()`` reads when given no arguments.

    ``JAX_COORDINATOR_ADDRESS``: worker-0's address and its *second* reserved port (the first is
    ``MASTER_PORT``, torch's store under the pytorch mode's launcher); ``JAX_NUM_PROCESSES``: the
    nodes; ``JAX_PROCESS_ID``: this node's index.  One JAX process per node, JAX's own model
    (each process drives every local device).
    """
    head = master(placement)
    port = head.ports[1] if len(head.ports) > 1 else head.port
    return {
        "JAX_COORDINATOR_ADDRESS": f"{head.address}:{port}",
        "JAX_NUM_PROCESSES": str(len(placement.workers)),
        "JAX_PROCESS_ID": str(task.index),
    }


#: option names that give the processes per node of a launcher on its command line
_PER_NODE_OPTIONS = {
    "torchrun": ("--nproc_per_node", "--nproc-per-node"),
    "mpirun": ("-npernode", "--npernode", "-N"),
}
#: option names that give the processes of the whole job to mpirun
_MPI_TOTAL_OPTIONS = ("-np", "-n", "--np", "-c")
_TORCH_MODULES = ("torch.distributed.run", "torch.distributed.launch", "ma_jupyter.nodeside.torch_run")


def _option(argv: list[str], names: tuple[str, ...]) -> str | None:
    """The value of the first of ``names`` in ``argv`` (``--name value`` or ``--name=value``)."""
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                return argv[i + 1]
            if arg.startswith(name + "="):
                return arg[len(name) + 1 :]
    return None


def ranks_per_node(argv: list[str], default: int, nodes: int) -> int:
    """The processes a node's command starts on it, read from the command's launcher.

    Rules, in order (``argv`` with ``${VAR}`` already expanded):

    1. torch's launcher (``torchrun``, ``python -m torch.distributed.run``, the platform's
       wrapper): its ``--nproc_per_node`` when a number, else ``default`` (``PET_NPROC_PER_NODE``,
       what torchrun reads without the option);
    2. ``mpirun``/``mpiexec``: ``-npernode``/``-N`` when given, else ``-np`` shared by the
       ``nodes`` (rounded up);
    3. anything else: ``default`` (the node's slots).
    """
    name = program(argv)
    if name == "torchrun" or python_module(argv) in _TORCH_MODULES:
        value = _option(argv, _PER_NODE_OPTIONS["torchrun"])
        return int(value) if value and value.isdigit() and int(value) > 0 else default
    if name in ("mpirun", "mpiexec", "orterun", "prterun"):
        value = _option(argv, _PER_NODE_OPTIONS["mpirun"])
        if value and value.isdigit() and int(value) > 0:
            return int(value)
        total = _option(argv, _MPI_TOTAL_OPTIONS)
        if total and total.isdigit() and int(total) > 0:
            return -(-int(total) // max(1, nodes))
    return default
