"""A job listing (``GET /jobs``): each job's bounded summary (names and shape, never its
variables, secrets, mounts or commands) and the page that holds them."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from ..wire import Access, JobStatus, JobType, Mode, Priority
from .common import Digest, Strict, utcnow
from .jobs import Job
from .spec import DevEnvOrigin

#: the spec fields a listing shows (:class:`JobSpecSummary`): names and shape, nothing a user
#: may make large (variables, mounts, commands, tasks)
SUMMARY_SPEC_FIELDS = (
    "name",
    "type",
    "priority",
    "access",
    "creator",
    "algorithm",
    "algorithm_origin",
    "algorithm_digest",
    "outputs",
    "mode",
    "specs",
    "node_name",
    "pool",
    "nodes",
    "ps",
    "chief",
    "debug_terminal",
    "duration",
    "devenv_of",
)
#: a summary's reason is cut here (a failure's reason holds the log's last lines)
SUMMARY_REASON_CHARS = 1000
#: a summary names at most this many failed tasks of a batch job
SUMMARY_FAILED_TASKS = 20


class JobSpecSummary(Strict):
    """What a job listing shows of a job's spec: its names and shape, never its variables,
    secrets, mounts or commands (``GET /jobs/{id}`` has the whole :class:`JobSpec`)."""

    name: str
    type: JobType = JobType.regular
    priority: Priority = Priority.normal
    access: Access = Access.ro
    creator: str | None = None
    algorithm: str | None = None
    algorithm_origin: str | None = None
    algorithm_digest: str | None = None
    outputs: str | None = None
    mode: Mode = Mode.single
    specs: list[str] = []
    node_name: str | None = None
    pool: str | None = None
    nodes: int = 1
    ps: int = 0
    chief: bool = False
    debug_terminal: bool = False
    duration: float | None = None
    devenv_of: DevEnvOrigin | None = None


class JobSummary(Strict):
    """A job as ``GET /jobs`` lists it: bounded whatever its spec holds (no variables, mounts,
    commands or nodes; the reason cut at :data:`SUMMARY_REASON_CHARS`); ``GET /jobs/{id}`` has
    the whole :class:`Job`."""

    id: str
    spec: JobSpecSummary
    status: JobStatus = JobStatus.queued
    reason: str = ""
    created_at: datetime = Field(default_factory=utcnow)
    started_at: datetime | None = None
    finished_at: datetime | None = None
    exit_code: int | None = None
    chosen_spec: str | None = None
    backend: str = "local"
    attempt: int = 0
    restarts: int = 0
    queue_position: int | None = None
    workspace_isolation: Literal["bubblewrap", "symlink", "none"] | None = None
    outputs_folder: str | None = None
    #: every content the job runs (its own and its batch tasks'), for the listing's CODE column
    algorithm_digests: list[str] = []
    #: a batch job's tasks counted by status (empty for a regular job)
    task_counts: dict[str, int] = {}
    #: the first failed tasks' names (at most :data:`SUMMARY_FAILED_TASKS`)
    failed_tasks: list[str] = []
    allowed: list[str] = []

    @property
    def name(self) -> str:
        return self.spec.name

    @classmethod
    def of(cls, job: Job) -> JobSummary:
        """The summary of ``job``."""
        spec = job.spec
        digests = {spec.algorithm_digest, *(task.algorithm_digest for task in spec.tasks)} - {None}
        counts: dict[str, int] = {}
        for task in job.tasks:
            counts[task.status] = counts.get(task.status, 0) + 1
        reason = job.reason
        if len(reason) > SUMMARY_REASON_CHARS:
            reason = reason[: SUMMARY_REASON_CHARS - 1] + "…"
        return cls(
            id=job.id,
            spec=JobSpecSummary(**spec.model_dump(include=set(SUMMARY_SPEC_FIELDS))),
            status=job.status,
            reason=reason,
            created_at=job.created_at,
            started_at=job.started_at,
            finished_at=job.finished_at,
            exit_code=job.exit_code,
            chosen_spec=job.chosen_spec,
            backend=job.backend,
            attempt=job.attempt,
            restarts=job.restarts,
            queue_position=job.queue_position,
            workspace_isolation=job.workspace_isolation,
            outputs_folder=job.outputs_folder,
            algorithm_digests=sorted(digests),
            task_counts=counts,
            failed_tasks=[t.name for t in job.tasks if t.status == "failed"][:SUMMARY_FAILED_TASKS],
            allowed=job.allowed,
        )


class JobPage(Strict):
    """One page of a job listing: each job's :class:`JobSummary`."""

    items: list[JobSummary]
    total: int
    offset: int = 0
    limit: int = 50
    algorithm_digest: Digest | None = Field(
        default=None,
        description="The content the listing was searched by (the algorithm folder's current "
        "content, as the caller read it): the jobs whose algorithm_digest equals it ran that "
        "content, the others of the folder another version.",
    )
