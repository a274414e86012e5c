"""Single mode: one node runs the command exactly as written."""

from __future__ import annotations

from ..commands import parse_command
from ..models import JobSpec
from .base import NodePlan, Placement


def plan(spec: JobSpec, placement: Placement, argv: list[str] | None = None) -> list[NodePlan]:
    """One node, the user's command untouched; a batch job: one node per task, each with its own
    command and algorithm, writing into ``<outputs>/<name>-<N>/``."""
    if spec.type.value == "batch":
        plans = []
        for slot in placement.tasks:
            task = spec.tasks[slot.index]
            plans.append(
                NodePlan(
                    task=slot,
                    argv=parse_command(task.command, field="tasks.command"),
                    algorithm=task.algorithm,
                    outputs_subdir=f"{spec.name}-{slot.index}",
                )
            )
        return plans
    command = argv if argv is not None else parse_command(spec.command or "")
    return [NodePlan(task=t, argv=list(command)) for t in placement.tasks]
