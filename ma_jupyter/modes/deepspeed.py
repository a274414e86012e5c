"""PyTorch-DeepSpeed mode: the PyTorch mode's variables plus a DeepSpeed hostfile at ``/job/hostfile``.

Every node gets ``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE``, ``RANK`` and ``SLOTS`` exactly
as in the PyTorch mode, and the file ``/job/hostfile`` with one ``<hostname> slots=<SLOTS>`` line
per node (seed 002: ``worker-0 slots=4`` / ``worker-1 slots=4`` for 2 nodes x 4 cards), where
DeepSpeed's launcher finds it by itself.

The command follows the PyTorch rules: a ``python ...`` command is wrapped in
``torch.distributed.run`` (``deepspeed.init_distributed()`` reads the launcher's per-process
variables); ``deepspeed ...`` or any other command runs untouched on every node.  DeepSpeed's own
launcher reaches other hosts through pdsh/ssh, which simulated nodes do not offer: on more than
one node give it ``--no_ssh --node_rank ${RANK} --master_addr ${MASTER_ADDR} --master_port
${MASTER_PORT}`` so that each node starts its own processes.
"""

from __future__ import annotations

from ..models import JobSpec
from . import pytorch
from .base import NodePlan, Placement
from .common import hostfile

HOSTFILE = "/job/hostfile"


def plan(spec: JobSpec, placement: Placement, argv: list[str]) -> list[NodePlan]:
    """Per-node plans of a DeepSpeed job: the PyTorch plan plus ``/job/hostfile``."""
    text = hostfile(placement.workers)
    plans = pytorch.plan(spec, placement, argv)
    for node in plans:
        node.files[HOSTFILE] = text
    return plans
