"""A job's resource samples (``GET /jobs/{id}/resources``): each node's use over time and
what its spec lets it use."""

from __future__ import annotations

from pydantic import Field

from .common import Strict


class ResourceSample(Strict):
    """One node's use at one moment, as the service sampled it while the job ran."""

    t: float = Field(description="Unix time of the sample.")
    node: str
    cpu_percent: float = Field(description="CPU use since the previous sample; 100 is one core busy.")
    memory_mb: float = Field(description="Resident memory of the node's processes.")
    card_percent: float | None = Field(
        default=None, description="Use of the node's cards (0..100), when it has real cards the driver reads."
    )
    card_memory_mb: float | None = Field(
        default=None, description="Card memory the node's processes hold, when it has real cards."
    )


class NodeLimits(Strict):
    """What one node of a job may use (from its spec), to read its samples against."""

    node: str
    cpus: float | None = None
    memory_mb: float | None = None
    cards: int = 0


class ResourceUsage(Strict):
    """A job's resource samples, oldest first (``GET /jobs/{id}/resources``).

    Samples are taken every ``interval`` seconds while the job runs; older ones are thinned out
    (every other one dropped, repeatedly) so a long job keeps a bounded number per node.
    """

    job_id: str
    interval: float
    nodes: list[NodeLimits] = []
    samples: list[ResourceSample] = []
