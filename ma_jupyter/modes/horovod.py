"""Horovod (MPI) mode: hostfiles, the MPI variables, and mpirun on worker-0.

Every node gets (seed 002):

* ``/etc/mpi/hostfile`` (Open MPI: ``<hostname> slots=<n>`` per node) and
  ``/etc/mpi/mpich_hostfile`` (MPICH: ``<hostname>:<n>``), where ``n`` is the node's cards on a
  spec with cards (seed 003: a rank per card), else the number of cores the backend pinned the
  node to (at least SLOTS): MPI counts one slot per core, and ``MPI_Comm_spawn``
  (mpi4py.futures) starts its processes in the slots the ranks left free;
* ``OPENMPI_NP`` (seed 003): the job's processes, cards x nodes (nodes on a CPU spec), and
  ``OPENMPI_HOST_FILE_PATH``, the Open MPI hostfile, for boot files written for ModelArts;
* ``OMPI_MCA_orte_default_hostfile=/etc/mpi/hostfile`` as the seed sets it (Open MPI 4), and
  ``PRTE_MCA_prte_default_hostfile`` with the same value, the name Open MPI 5 reads;
* ``HYDRA_HOST_FILE=/etc/mpi/mpich_hostfile`` and ``HYDRA_IFACE=lo`` (the seed's ``eth0`` is the
  cluster network; simulated nodes talk over the host's loopback);
* the remote agent mpirun uses instead of ssh (``OMPI_MCA_plm_rsh_agent`` for Open MPI 4,
  ``PRTE_MCA_plm_ssh_agent`` for Open MPI 5): the backend's remote shell, from the bound
  placement (a backend without one cannot run MPI jobs: they are refused);
* ``OMPI_ALLOW_RUN_AS_ROOT=1`` and ``OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1``, so that a user's own
  ``mpirun`` command also runs when the nodes run as root.

mpirun runs on worker-0 only.  A command without ``mpirun`` gets the seed's prefix, as Open MPI
4 and 5 both accept it::

    mpirun --allow-run-as-root --oversubscribe -np <nodes x SLOTS> --bind-to none
           --map-by ppr:<SLOTS>:node --stdin none
           [-x NCCL_DEBUG] [-x LD_LIBRARY_PATH] -x PATH -mca pml ob1 -mca btl ^openib

and each rank runs through :mod:`ma_jupyter.nodeside.rank_log` (``rank-<OMPI_COMM_WORLD_RANK>.log``
in the rank's own node's ``$MA_RANK_LOG_DIR``).  Where it differs from the seed's, and why:

1. ``--bind-to``/``--map-by`` with two dashes: Open MPI 5 refuses the seed's single dash; the
   double dash means the same to Open MPI 4 and 5.
2. ``--map-by ppr:<SLOTS>:node`` instead of ``slot``: the hostfile declares every core as a
   slot, and ``slot`` mapping would fill worker-0's cores first; this keeps SLOTS ranks on each
   node, numbered node by node, as the seed's hostfile of SLOTS slots did.
3. ``--stdin none``: mpirun forwards its own standard input to rank 0, and Open MPI 5 never
   delivers the end of ``/dev/null`` to it, so a rank reading stdin would wait forever; with
   ``none`` every rank reads an empty stdin.
4. ``-x LD_LIBRARY_PATH`` only when the job sets it (its ``env``, or the ModelArts conda rule):
   mpirun prints a warning banner for a variable that is not set, and the backends set none.
5. ``--oversubscribe``: simulated nodes may declare more slots than this machine has cores.
6. ``-x NCCL_DEBUG`` (forwarding the job's value) only when the job sets it, instead of the
   seed's ``NCCL_DEBUG=INFO``: on real cards INFO prints dozens of lines per rank at every
   start, and the level is the job's to choose.

A command that contains ``mpirun`` is left exactly as written: the variables above give it the
hostfile and the agent (its ``-np`` ranks fill each node's slots before the next, MPI's rule).
mpirun exits with the first failing rank's exit code, and kills every rank.

The other nodes wait like sshd on a real cluster: they run the remote shell's server, through
which mpirun starts its daemon on them: OpenSSH's sshd where the backend runs it in the nodes
(``RemoteShell.sshd``, :mod:`.ssh`: every node gets ``SSHD_PORT`` and its sshd, and worker-0
waits for the others' before mpirun starts; the agent is plain ``ssh``), else the backend's own
agent (the local backend's enters each node's own sandbox).  They never exit by themselves, so they are
not primary: the job's status follows worker-0, and the supervisor stops them afterwards.

Ranks on different nodes need the nodes' private hostnames (the bubblewrap sandbox): without
them every node has the host's name and Open MPI merges them into one, so multi-node MPI jobs
fail where bubblewrap is missing (single-node MPI jobs run either way).

With the ModelArts convention (seed 003) mpirun also forwards, with ``-x``, the variables the
platform knows of whose names start with ``MA_``, ``SHARED_``, ``S3_``, ``PATH``,
``VC_WORKER_``, ``SCC`` or ``CRED`` (the job's own env and the platform's ``MA_`` variables).
"""

from __future__ import annotations

import re

from ..errors import InvalidSpec
from ..models import Convention, JobSpec
from .base import NodePlan, Placement, RemoteShell, TaskSlot
from .common import hostfile, mpi_slots, mpich_hostfile, total_slots, with_rank_log
from .ssh import add_ssh

HOSTFILE = "/etc/mpi/hostfile"
MPICH_HOSTFILE = "/etc/mpi/mpich_hostfile"
#: variables plan_job sets on every node (forwarded under the ModelArts convention)
PLATFORM_VARIABLES = ("MA_JOB_ID", "MA_JOB_NAME", "MA_TASK_NAME", "MA_TASK_INDEX", "MA_NUM_NODES", "MA_SPEC")
MODELARTS_FORWARD = re.compile(r"^(MA_|SHARED_|S3_|PATH|VC_WORKER_|SCC|CRED)")
_MPIRUN = re.compile(r"(^|[\s/])(mpirun|mpiexec)(\s|$)")


def has_mpirun(argv: list[str]) -> bool:
    """Whether the command already runs mpirun (as its program or inside ``bash -c "..."``)."""
    return any(_MPIRUN.search(arg) for arg in argv)


def mpi_env(shell: RemoteShell) -> dict[str, str]:
    """The MPI variables every node gets (see the module docstring)."""
    env = {
        "OMPI_MCA_orte_default_hostfile": HOSTFILE,
        "PRTE_MCA_prte_default_hostfile": HOSTFILE,
        "HYDRA_HOST_FILE": MPICH_HOSTFILE,
        "OMPI_MCA_plm_rsh_agent": shell.agent,
        "PRTE_MCA_plm_ssh_agent": shell.agent,
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    }
    if shell.interface:
        env["HYDRA_IFACE"] = shell.interface
    return env


def mpirun_prefix(np: int, per_node: int, forward: list[str]) -> list[str]:
    """The seed's mpirun prefix for ``np`` processes, ``per_node`` on each node, forwarding the
    variables ``forward`` (see the module docstring for each difference from the seed's)."""
    command = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(np)]
    command += ["--bind-to", "none", "--map-by", f"ppr:{per_node}:node", "--stdin", "none"]
    for name in forward:
        command += ["-x", name]
    return command + ["-mca", "pml", "ob1", "-mca", "btl", "^openib"]


def forwarded(spec: JobSpec) -> list[str]:
    """The seed's forwarded variables that the node has: ``NCCL_DEBUG`` and ``LD_LIBRARY_PATH``
    when the job sets them, ``PATH`` always (every backend sets it)."""
    return [name for name in ("NCCL_DEBUG", "LD_LIBRARY_PATH") if name in spec.env] + ["PATH"]


def modelarts_forwarded(spec: JobSpec) -> list[str]:
    """Names mpirun forwards under the ModelArts convention (PATH is in the prefix already)."""
    names = sorted({*spec.env, *spec.secret_env, *PLATFORM_VARIABLES})
    return [n for n in names if MODELARTS_FORWARD.match(n) and n != "PATH"]


def head_plan(spec: JobSpec, placement: Placement, task: TaskSlot, argv: list[str]) -> NodePlan:
    """worker-0: mpirun (added unless the command has it) over every node's slots."""
    if has_mpirun(argv):
        return NodePlan(task=task, argv=list(argv), notes=["command runs as written (it runs mpirun itself)"])
    workers = placement.workers
    command = mpirun_prefix(total_slots(workers), task.slots, forwarded(spec))
    if spec.convention is Convention.modelarts:
        for name in modelarts_forwarded(spec):
            command += ["-x", name]
    command += with_rank_log(argv, rank_var="OMPI_COMM_WORLD_RANK")
    return NodePlan(
        task=task,
        argv=command,
        rank_logs=True,
        notes=[f"mpirun prefix added ({total_slots(placement.workers)} processes)"],
    )


def waiting_plan(placement: Placement, task: TaskSlot, shell: RemoteShell) -> NodePlan:
    """Another node: the remote shell's server, through which mpirun reaches this node."""
    return NodePlan(
        task=task,
        argv=shell.serve_argv(placement.job_id, task.hostname),
        primary=False,
        notes=["waits for mpirun on worker-0 (like sshd); stopped when worker-0 ends"],
    )


def ssh_waiting_plan(task: TaskSlot) -> NodePlan:
    """Another node where the nodes run sshd: sshd only (:func:`.ssh.add_ssh` adds it)."""
    return NodePlan(
        task=task,
        argv=[],
        primary=False,
        notes=["waits for mpirun on worker-0 (sshd); stopped when worker-0 ends"],
    )


def plan(spec: JobSpec, placement: Placement, argv: list[str]) -> list[NodePlan]:
    """Per-node plans of an MPI job (see the module docstring for the rules)."""
    shell = placement.remote_shell
    if shell is None:
        raise InvalidSpec(
            "this backend offers no remote shell for MPI, so the horovod mode cannot start its ranks here: "
            "use another mode (e.g. pytorch) or the local backend",
            field="mode",
        )
    workers = placement.workers
    files = {HOSTFILE: hostfile(workers, mpi_slots), MPICH_HOSTFILE: mpich_hostfile(workers, mpi_slots)}
    plans = [head_plan(spec, placement, workers[0], argv)]
    if shell.sshd:  # the nodes run sshd (modes/ssh.py): the other nodes run nothing else
        plans += [ssh_waiting_plan(task) for task in workers[1:]]
        add_ssh(plans, placement, launcher=plans[0] if len(plans) > 1 else None)
    else:
        plans += [waiting_plan(placement, task, shell) for task in workers[1:]]
    for node in plans:
        node.env.update(mpi_env(shell))
        node.env["SLOTS"] = str(node.task.slots)
        node.env["OPENMPI_NP"] = str(total_slots(workers))
        node.env["OPENMPI_HOST_FILE_PATH"] = HOSTFILE
        node.files.update(files)
    return plans
