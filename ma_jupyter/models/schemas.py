"""The JSON schemas of the wire models the labextension's TypeScript types are generated
from (``python -m ma_jupyter.tsgen``)."""

from __future__ import annotations

from typing import Any

from .cluster import ClusterView, Node, Spec
from .jobs import Event, Job
from .listing import JobPage
from .logs import LogChunk, LogStream
from .plans import Plan
from .samples import ResourceUsage
from .spec import JobSpec


def json_schemas() -> dict[str, Any]:
    """JSON schemas of the wire models, for the labextension's generated TypeScript types."""
    return {
        m.__name__: m.model_json_schema()
        for m in (
            JobSpec,
            Job,
            Event,
            LogChunk,
            LogStream,
            Spec,
            Node,
            JobPage,
            Plan,
            ClusterView,
            ResourceUsage,
        )
    }
