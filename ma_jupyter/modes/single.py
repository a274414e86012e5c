"""Single mode: one node runs the command exactly as written."""

from __future__ import annotations

from ..commands import parse_command
from ..models import JobSpec
from .base import NodePlan, Placement


def plan(spec: JobSpec, placement: Placement, argv: list[str] | None = None) -> list[NodePlan]:
    """One node, the user's command untouched."""
    command = argv if argv is not None else parse_command(spec.command or "")
    return [NodePlan(task=t, argv=list(command)) for t in placement.tasks]
