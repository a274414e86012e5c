"""PyTorch-DeepSpeed mode: the PyTorch mode's variables plus a DeepSpeed hostfile at ``/job/hostfile``.

Every node gets ``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE``, ``RANK`` and ``SLOTS`` exactly
as in the PyTorch mode, and the file ``/job/hostfile`` with one ``<hostname> slots=<SLOTS>`` line
per node (seed 002: ``worker-0 slots=4`` / ``worker-1 slots=4`` for 2 nodes x 4 cards), where
DeepSpeed's launcher finds it by itself.

The command follows the PyTorch rules: a ``python ...`` command is wrapped in
``torch.distributed.run`` (``deepspeed.init_distributed()`` reads the launcher's per-process
variables); any other command runs untouched on every node.

On more than one node, where the backend runs OpenSSH in the nodes (``RemoteShell.sshd``,
:mod:`.ssh`), every node runs its sshd (``SSHD_PORT``, ``ssh worker-1`` without a prompt) and a
plain ``deepspeed ...`` command (DeepSpeed's own launcher, without ``--no_ssh``) runs on node 0
only, as seed 002 has it: the launcher reads ``/job/hostfile`` and starts every node's processes
through pdsh/ssh, once every node's sshd answers; the other nodes run sshd only and are not
primary (the job's status follows node 0; they are stopped once it ends).  Elsewhere (no sshd
in the nodes: a machine without openssh-server, nodes running as root, a Ray attempt whose
machines lack sshd or share their networks) ``deepspeed ...`` runs on every node, and on more
than one node it needs ``--no_ssh --node_rank ${RANK} --master_addr ${MASTER_ADDR}
--master_port ${MASTER_PORT}`` so that each node starts its own processes.
"""

from __future__ import annotations

from ..models import JobSpec
from . import pytorch
from .base import NodePlan, Placement
from .common import hostfile, program
from .ssh import add_ssh

HOSTFILE = "/job/hostfile"


def plan(spec: JobSpec, placement: Placement, argv: list[str]) -> list[NodePlan]:
    """Per-node plans of a DeepSpeed job: the PyTorch plan plus ``/job/hostfile``."""
    text = hostfile(placement.workers)
    plans = pytorch.plan(spec, placement, argv)
    for node in plans:
        node.files[HOSTFILE] = text
    shell = placement.remote_shell
    if len(plans) < 2 or shell is None or not shell.sshd:
        return plans
    if not launches_over_ssh(argv):
        add_ssh(plans, placement)
        return plans
    for node in plans[1:]:
        node.argv, node.primary, node.rank_logs = [], False, False
        node.notes = ["waits for DeepSpeed's launcher on node 0 (sshd); stopped when node 0 ends"]
    plans[0].notes = ["DeepSpeed's launcher starts every node's processes over ssh (/job/hostfile)"]
    add_ssh(plans, placement, launcher=plans[0])
    return plans


def launches_over_ssh(argv: list[str]) -> bool:
    """Whether the command is DeepSpeed's launcher reaching the other nodes itself (pdsh/ssh)."""
    return program(argv) == "deepspeed" and "--no_ssh" not in argv
