"""Distributed mode: every node gets the platform's distributed variables, the command runs as written.

For any framework that starts its own processes or needs no launcher (JAX, XGBoost, Ray inside a
job, MindSpore's ``msrun``, a ``bash -c`` script, ``torchrun`` as the user writes it): no
launcher is put around the command, whatever it starts with.  Every node gets

* the PyTorch mode's variables (:func:`~ma_jupyter.modes.common.distributed_env`):
  ``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE`` (nodes), ``RANK`` (node index), ``SLOTS``,
  ``NODE_RANK``/``GROUP_RANK`` and torchrun's ``PET_*`` (a bare ``torchrun train.py`` joins);
* JAX's (:func:`~ma_jupyter.modes.common.jax_env`): ``JAX_COORDINATOR_ADDRESS``,
  ``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID``, so ``jax.distributed.initialize()`` needs no argument;
* every reserved port named (:func:`~ma_jupyter.modes.common.ports_env`): ``MA_PORTS`` (this
  node's) and ``MA_MASTER_PORTS`` (worker-0's).

One node of this mode is the ``single`` mode with those variables.  As in the pytorch mode, a
torch launcher told to make a one-node job of its own (``torchrun --standalone``, ``--nnodes 1``)
on several nodes is refused (:func:`~ma_jupyter.modes.pytorch.check_multi_node`): ``PET_NNODES``
counts every node, so each would wait for the others forever.
"""

from __future__ import annotations

from ..models import JobSpec
from .base import NodePlan, Placement
from .common import distributed_env, jax_env, ports_env
from .pytorch import check_multi_node


def plan(spec: JobSpec, placement: Placement, argv: list[str]) -> list[NodePlan]:
    """Per-node plans of a distributed job: the variables above, the command untouched."""
    check_multi_node(placement, argv)
    return [
        NodePlan(
            task=task,
            argv=list(argv),
            env={
                **distributed_env(placement, task),
                **jax_env(placement, task),
                **ports_env(placement, task),
            },
            notes=["command runs as written on every node (the distributed mode starts no launcher)"],
        )
        for task in placement.workers
    ]
