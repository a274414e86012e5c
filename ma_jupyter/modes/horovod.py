"""Horovod (MPI) mode: hostfiles, the MPI variables, and mpirun on worker-0.

Every node gets (seed 002):

* ``/etc/mpi/hostfile`` (Open MPI: ``<hostname> slots=<n>`` per node) and
  ``/etc/mpi/mpich_hostfile`` (MPICH: ``<hostname>:<n>``), where ``n`` is SLOTS: the spec's
  cards, 1 on a CPU spec (seed 002: "``slots`` is the card count of the spec; 1 for a CPU
  spec");
* ``OPENMPI_NP`` (seed 003): the job's processes, cards x nodes (nodes on a CPU spec), and
  ``OPENMPI_HOST_FILE_PATH``, the Open MPI hostfile, for boot files written for ModelArts;
* seed 003's ``OPENMPI_BIND_ARGS``, ``OPENMPI_X_ARGS``, ``OPENMPI_MCA_ARGS`` and
  ``OPENMPI_EXTRA_ARGS`` (:func:`seed_arguments`: the seed's defaults in words this machine's
  Open MPI 5 accepts; a job may give its own, as the seed's "default" says) and
  ``TUNE_ENV_FILE`` (:data:`TUNE_ENV_FILE`), which worker-0 writes before its command starts
  (:mod:`ma_jupyter.nodeside.mpi_head`), so that seed 003's ``mpirun -np ${OPENMPI_NP}
  -hostfile ${OPENMPI_HOST_FILE_PATH} -tune ${TUNE_ENV_FILE} ${OPENMPI_BIND_ARGS} ...`` runs;
* seed 004's ``MA_NUM_HOSTS`` (the nodes), ``MA_VJ_NAME`` (the job's id) and
  ``VC_TASK_INDEX``/``VK_TASK_INDEX`` (the node's index), which its ``run_mpi.sh`` reads;
* ``OMPI_MCA_orte_default_hostfile=/etc/mpi/hostfile`` as the seed sets it (Open MPI 4), and
  ``PRTE_MCA_prte_default_hostfile`` with the same value, the name Open MPI 5 reads;
* ``HYDRA_HOST_FILE=/etc/mpi/mpich_hostfile`` and ``HYDRA_IFACE``, the interface the node
  reaches its peers on as the backend names it (the local backend takes it from the network
  code, :data:`ma_jupyter.nodehost.network.NODE_INTERFACE` on the job's network; the seed's ``eth0``);
* the remote agent mpirun uses instead of ssh (``OMPI_MCA_plm_rsh_agent`` for Open MPI 4,
  ``PRTE_MCA_plm_ssh_agent`` for Open MPI 5): the backend's remote shell, from the bound
  placement (a backend without one cannot run MPI jobs: they are refused);
* ``OMPI_ALLOW_RUN_AS_ROOT=1`` and ``OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1``, so that a user's own
  ``mpirun`` command also runs when the nodes run as root.

mpirun runs on worker-0 only, behind :mod:`ma_jupyter.nodeside.mpi_head` (it writes
``$TUNE_ENV_FILE`` and sets an empty ``LD_LIBRARY_PATH`` where none is set, then becomes the
command).  A command without ``mpirun`` gets seed 002's prefix::

    mpirun --allow-run-as-root -np <nodes x SLOTS> --bind-to none --map-by slot
           -x NCCL_DEBUG=INFO -x LD_LIBRARY_PATH -x PATH -mca pml ob1 -mca btl ^openib
           --stdin none

and each rank runs through :mod:`ma_jupyter.nodeside.rank_log` (``rank-<OMPI_COMM_WORLD_RANK>.log``
in the rank's own node's ``$MA_RANK_LOG_DIR``).  Where it differs from the seed's, each shown
with its reason among the node's notes in the dry run:

1. ``--bind-to``/``--map-by`` with two dashes: Open MPI 5 refuses the seed's single dash
   (``-bind-to none`` makes it look for a program ``none``); two dashes mean the same to Open
   MPI 4 and 5.
2. ``--stdin none`` added: mpirun forwards its own standard input to rank 0, and Open MPI 5
   never delivers the end of ``/dev/null`` to it, so a rank reading stdin would wait forever.
3. ``-x NCCL_DEBUG`` (the job's value) instead of ``-x NCCL_DEBUG=INFO`` when the job sets
   ``NCCL_DEBUG`` itself: the seed's value would override the job's own.

A command that contains ``mpirun`` is left as written (behind the step above): the variables
give it the hostfile and the agent (its ``-np`` ranks fill each node's slots before the next,
MPI's rule).  Outside ``bash -c``, an argument that is exactly ``${OPENMPI_BIND_ARGS}``,
``${OPENMPI_X_ARGS}``, ``${OPENMPI_MCA_ARGS}`` or ``${OPENMPI_EXTRA_ARGS}`` becomes its words
(:func:`split_seed_arguments`, said in the dry run), so seed 003's command runs pasted as written.  mpirun exits with the first failing rank's exit code, and kills every rank.

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
``VC_WORKER_``, ``SCC`` or ``CRED`` and whose value is not empty (the job's own env and the
platform's ``MA_`` variables), as seed 003's ``grep -v '=$'`` drops empty ones: worker-0's
values for every rank, as seed 003's ``-tune`` file gives them (a note in the dry run says so).
"""

from __future__ import annotations

import re

from ..commands import is_shell_wrapper
from ..errors import InvalidSpec
from ..models import Convention, JobSpec
from .base import NodePlan, Placement, RemoteShell, TaskSlot
from .common import hostfile, mpich_hostfile, total_slots, with_rank_log
from .ssh import add_ssh

HOSTFILE = "/etc/mpi/hostfile"
MPICH_HOSTFILE = "/etc/mpi/mpich_hostfile"
#: seed 003's file of worker-0's variables (seed 004 keeps it in the home folder; the node's is
#: its private ``/tmp``), written by :data:`MPI_HEAD_MODULE` as worker-0 starts
TUNE_ENV_FILE = "/tmp/env_for_user_process"
MPI_HEAD_MODULE = "ma_jupyter.nodeside.mpi_head"
#: variables plan_job and this mode set on every node (forwarded under the ModelArts convention)
PLATFORM_VARIABLES = (
    "MA_JOB_ID",
    "MA_JOB_NAME",
    "MA_TASK_NAME",
    "MA_TASK_INDEX",
    "MA_NUM_NODES",
    "MA_SPEC",
    "MA_NUM_HOSTS",
    "MA_VJ_NAME",
)
MODELARTS_FORWARD = re.compile(r"^(MA_|SHARED_|S3_|PATH|VC_WORKER_|SCC|CRED)")
#: seed 003's mpirun argument variables, each several words (:func:`seed_arguments`)
SEED_ARGUMENTS = ("OPENMPI_BIND_ARGS", "OPENMPI_X_ARGS", "OPENMPI_MCA_ARGS", "OPENMPI_EXTRA_ARGS")
_WHOLE_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")
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


def seed_arguments(interface: str | None) -> dict[str, str]:
    """Seed 003's mpirun argument variables with its defaults, in words Open MPI 4 and 5 accept.

    1. ``OPENMPI_BIND_ARGS``: ``--bind-to none --map-by slot`` (the seed's single-dash
       ``-bind-to none -map-by slot`` is refused by Open MPI 5);
    2. ``OPENMPI_X_ARGS``: the seed's, with ``NCCL_SOCKET_IFNAME`` naming the node's interface
       ``interface`` instead of the seed's ``ib0,bond0,eth0`` (none of which a node here has;
       the seed's list when the backend names none);
    3. ``OPENMPI_MCA_ARGS``: the seed's, as written;
    4. ``OPENMPI_EXTRA_ARGS``: empty, as the seed's.
    """
    ifname = interface or "ib0,bond0,eth0"
    return {
        "OPENMPI_BIND_ARGS": "--bind-to none --map-by slot",
        "OPENMPI_X_ARGS": (
            "-x LD_LIBRARY_PATH -x HOROVOD_MPI_THREADS_DISABLE=1 -x NCCL_DEBUG=INFO "
            f"-x NCCL_SOCKET_IFNAME={ifname} -x NCCL_SOCKET_FAMILY=AF_INET -x NCCL_IB_DISABLE=0"
        ),
        "OPENMPI_MCA_ARGS": "-mca pml ob1 -mca btl ^openib -mca plm_rsh_no_tree_spawn true",
        "OPENMPI_EXTRA_ARGS": "",
    }


def mpirun_prefix(np: int, spec: JobSpec) -> tuple[list[str], list[str]]:
    """Seed 002's mpirun prefix for ``np`` processes, and a note per difference from the seed's
    text (see the module docstring)."""
    notes = ["--bind-to/--map-by with two dashes: this Open MPI 5 refuses the seed's -bind-to/-map-by"]
    nccl = "NCCL_DEBUG=INFO"
    if "NCCL_DEBUG" in spec.env or "NCCL_DEBUG" in spec.secret_env:
        nccl = "NCCL_DEBUG"
        notes.append("-x NCCL_DEBUG forwards the job's own NCCL_DEBUG instead of the seed's INFO")
    command = ["mpirun", "--allow-run-as-root", "-np", str(np), "--bind-to", "none", "--map-by", "slot"]
    command += f"-x {nccl} -x LD_LIBRARY_PATH -x PATH -mca pml ob1 -mca btl ^openib".split()
    command += ["--stdin", "none"]
    notes.append("--stdin none added: Open MPI 5 never gives rank 0 the end of mpirun's empty stdin")
    return command, notes


def split_seed_arguments(
    argv: list[str], spec: JobSpec, interface: str | None
) -> tuple[list[str], list[str]]:
    """``argv`` with each argument that is exactly one reference to a variable of
    :data:`SEED_ARGUMENTS` (``${OPENMPI_X_ARGS}``, as seed 003's command writes them, unquoted)
    replaced by the words of its value, none when it is empty, as the seed's shell splits them:
    the platform's own expansion keeps an argument one word, which mpirun would refuse.  The
    value is the job's ``--env`` one, else the seed's default; a secret one stays a reference
    (one word), never written into the argv a dry run shows.  Also the names split."""
    values = {**seed_arguments(interface), **{k: v for k, v in spec.env.items() if k in SEED_ARGUMENTS}}
    out: list[str] = []
    split: list[str] = []
    for arg in argv:
        whole = _WHOLE_REFERENCE.fullmatch(arg)
        name = whole and (whole.group(1) or whole.group(2))
        if name in SEED_ARGUMENTS and name not in spec.secret_env:
            out += values[name].split()
            split.append(name)
        else:
            out.append(arg)
    return out, split


def modelarts_forwarded(spec: JobSpec) -> list[str]:
    """Names mpirun forwards under the ModelArts convention (PATH is in the prefix already):
    the matching names whose value is not empty."""
    given = {**spec.env, **spec.secret_env}
    names = sorted({*(n for n, v in given.items() if v), *PLATFORM_VARIABLES})
    return [n for n in names if MODELARTS_FORWARD.match(n) and n != "PATH"]


def behind_mpi_head(argv: list[str]) -> list[str]:
    """``argv`` run behind worker-0's step (:data:`MPI_HEAD_MODULE`)."""
    return ["python", "-m", MPI_HEAD_MODULE, "--", *argv]


def head_plan(spec: JobSpec, placement: Placement, task: TaskSlot, argv: list[str]) -> NodePlan:
    """worker-0: mpirun (added unless the command has it) over every node's slots, behind the
    step that writes ``$TUNE_ENV_FILE``."""
    step = f"{MPI_HEAD_MODULE} first writes $TUNE_ENV_FILE (worker-0's variables for mpirun -tune)"
    if has_mpirun(argv):
        notes = ["command runs as written (it runs mpirun itself)"]
        if not is_shell_wrapper(argv):  # a shell splits them itself
            interface = placement.remote_shell.interface if placement.remote_shell else None
            argv, split = split_seed_arguments(list(argv), spec, interface)
            if split:
                notes.append(
                    f"{', '.join(dict.fromkeys(split))} given as their words, as seed 003's shell splits them"
                )
        return NodePlan(task=task, argv=behind_mpi_head(list(argv)), notes=[*notes, step])
    workers = placement.workers
    command, notes = mpirun_prefix(total_slots(workers), spec)
    if spec.convention is Convention.modelarts:
        forwarded = modelarts_forwarded(spec)
        for name in forwarded:
            command += ["-x", name]
        notes.append(
            f"-x {' -x '.join(forwarded)} added (ModelArts convention): every rank gets worker-0's "
            "values, as seed 003's -tune ${TUNE_ENV_FILE} gives them"
        )
    command += with_rank_log(argv, rank_var="OMPI_COMM_WORLD_RANK")
    return NodePlan(
        task=task,
        argv=behind_mpi_head(command),
        rank_logs=True,
        notes=[f"mpirun prefix added ({total_slots(workers)} processes)", *notes, step],
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
    files = {HOSTFILE: hostfile(workers), MPICH_HOSTFILE: mpich_hostfile(workers)}
    plans = [head_plan(spec, placement, workers[0], argv)]
    if shell.sshd:  # the nodes run sshd (modes/ssh.py): the other nodes run nothing else
        plans += [ssh_waiting_plan(task) for task in workers[1:]]
        add_ssh(plans, placement, launcher=plans[0] if len(plans) > 1 else None)
    else:
        plans += [waiting_plan(placement, task, shell) for task in workers[1:]]
    given = {**spec.env, **spec.secret_env}
    arguments = {k: v for k, v in seed_arguments(shell.interface).items() if k not in given}
    for node in plans:
        node.env.update(mpi_env(shell))
        node.env["SLOTS"] = str(node.task.slots)
        node.env["OPENMPI_NP"] = str(total_slots(workers))
        node.env["OPENMPI_HOST_FILE_PATH"] = HOSTFILE
        node.env.update(arguments)
        node.env["TUNE_ENV_FILE"] = TUNE_ENV_FILE
        node.env["MA_NUM_HOSTS"] = str(len(workers))
        node.env["MA_VJ_NAME"] = placement.job_id
        node.env["VC_TASK_INDEX"] = node.env["VK_TASK_INDEX"] = str(node.task.index)
        node.files.update(files)
    return plans
