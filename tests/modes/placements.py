"""Placements like the scheduler makes them and the local backend binds them, for the planners'
unit tests.

Each task gets hostname ``<role>-<index>``, address ``127.0.1.<k>`` (k = launch order + 1) and the
ports ``20000 + 10 k`` and ``20001 + 10 k``, so expected values can be written down literally.
"""

from __future__ import annotations

from ma_jupyter.backends.local import LocalBackend
from ma_jupyter.config import cpu_specs, emulated_specs
from ma_jupyter.models import JobSpec
from ma_jupyter.modes.base import Placement, TaskSlot, task_roles

#: the default cluster's specs on a machine without cards, whatever this machine has
SPECS = {s.name: s for s in cpu_specs() + emulated_specs()}


def card_spec(cards: int):
    """A GPU spec with ``cards`` emulated cards (the seed's examples use 4)."""
    return SPECS["gpu.emu-2"].model_copy(update={"name": f"gpu.emu-{cards}", "accelerators": cards})


def placement_for(spec: JobSpec, flavor=None, job_id: str = "job-1") -> Placement:
    """Tasks for every role the job needs, in the scheduler's launch order."""
    flavor = flavor or SPECS[spec.specs[0]]
    tasks = []
    for order, (role, index) in enumerate(task_roles(spec)):
        k = order + 1
        slots = 1 if role == "ps" else flavor.slots
        devices = tuple(range(slots)) if flavor.accelerators and role != "ps" else ()
        tasks.append(
            TaskSlot(
                role=role,
                index=index,
                hostname=f"{role}-{index}",
                address=f"127.0.1.{k}",
                ports=(20000 + 10 * k, 20001 + 10 * k),
                slots=slots,
                host=f"node-{order}",
                devices=devices,
            )
        )
    return Placement(job_id=job_id, spec=flavor, tasks=tuple(tasks), remote_shell=LocalBackend.remote_shell)
