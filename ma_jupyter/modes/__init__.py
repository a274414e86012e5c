"""Distributed modes: one module per mode, each a pure ``plan(spec, placement, argv)``.

:func:`plan_job` is the single entry point backends and ``--dry-run`` use.  It adds what every
mode shares (the platform's env for the node, the job's own env) around the mode's plan.
"""

from __future__ import annotations

from collections.abc import Callable

from ..commands import parse_command
from ..models import JobSpec, Mode
from . import deepspeed, horovod, mindspore, pytorch, single, tensorflow
from .base import PS_SPEC_NAME, NodePlan, Placement, TaskSlot, task_roles
from .modelarts import with_conventions

PlanFunction = Callable[[JobSpec, Placement, list[str]], list[NodePlan]]

# Filled by the mode modules as they are added; a mode missing here is refused at submit time.
# The distributed modes share the ModelArts conda rule (modes/modelarts.py).
PLANNERS: dict[Mode, PlanFunction] = {
    Mode.single: with_conventions(single.plan),
    Mode.pytorch: with_conventions(pytorch.plan),
    Mode.pytorch_deepspeed: with_conventions(deepspeed.plan),
    Mode.tensorflow: with_conventions(tensorflow.plan),
    Mode.horovod: with_conventions(horovod.plan),
    Mode.mindspore_ascend: with_conventions(mindspore.plan),
}


def plan_job(spec: JobSpec, placement: Placement, argv: list[str] | None = None) -> list[NodePlan]:
    """Per-node plans for one attempt of a job.

    Args:
        spec: the job.
        placement: where the scheduler put its tasks, bound by the backend
            (:meth:`~ma_jupyter.backends.base.Backend.bind`).
        argv: the command to run (a batch task's, or a resumed one); default the job's command.

    Returns:
        One :class:`NodePlan` per task, each with the common variables set: ``MA_JOB_ID``,
        ``MA_JOB_NAME``, ``MA_TASK_NAME``, ``MA_TASK_INDEX``, ``MA_NUM_NODES`` and the job's
        own ``env`` (which the mode's variables override, since the launch depends on them);
        ``job_env`` names the job's variables that survived, for the backend to expand.
        ``OMP_NUM_THREADS`` is the spec's cores shared by the node's processes (at least 1),
        unless the job sets it: OpenMP, MKL and torch would otherwise start a thread per core
        of the whole machine on a backend that does not pin a node to its cores (Ray).
        ``docs/variables.md`` lists every variable per mode.  A dev environment
        (``spec.devenv_of``) gets its source node's platform variables over its own, and
        ``MA_DEVENV_OF`` (the source job's id).
    """
    if not placement.bound:
        raise ValueError("plan_job needs a placement bound by a backend (hostnames, addresses, ports)")
    planner = PLANNERS.get(spec.mode)
    if planner is None:
        from ..errors import InvalidSpec

        raise InvalidSpec(f"the {spec.mode.value} mode is not available in this version", field="mode")
    if spec.type.value == "batch":
        command = []  # each task brings its own command
    else:
        command = argv if argv is not None else parse_command(spec.command or "")
    plans = planner(spec, placement, command)
    for node in plans:
        common = {
            "MA_JOB_ID": placement.job_id,
            "MA_JOB_NAME": spec.name,
            "MA_TASK_NAME": node.task.role,
            "MA_TASK_INDEX": str(node.task.index),
            "MA_NUM_NODES": str(len(placement.workers)),
            # a parameter server runs with its own spec, not the workers'
            "MA_SPEC": PS_SPEC_NAME if node.task.role == "ps" else placement.spec.name,
        }
        if node.task.devices:  # the seeds' card count of the node (Horovod's MY_MPI_SLOTS default)
            common["MA_NUM_GPUS"] = str(len(node.task.devices))
        platform = {**common, **node.env}
        if spec.devenv_of is not None:
            # a dev environment is the source job's node: that node's platform variables (its
            # RANK, WORLD_SIZE, MA_TASK_INDEX...), its own identity kept (MA_JOB_ID, MA_JOB_NAME)
            platform.update(spec.devenv_of.variables)
            platform["MA_DEVENV_OF"] = spec.devenv_of.job_id
        job_env = {**spec.env, **spec.secret_env}
        threads = max(1, int(placement.spec.cpus // max(1, node.task.slots)))
        defaults = {"OMP_NUM_THREADS": str(threads)}
        node.env = {**defaults, **job_env, **platform}
        node.job_env = tuple(k for k in job_env if k not in platform)
    return plans


__all__ = ["NodePlan", "Placement", "TaskSlot", "plan_job", "task_roles", "PLANNERS"]
