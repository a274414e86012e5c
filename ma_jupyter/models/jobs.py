"""A submitted job and its state: its launched nodes, a batch job's per-task status
(:func:`task_states`, derived from the nodes), and the events of its life."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field, model_validator

from ..wire import JobStatus, JobType, Mode
from .common import Strict, utcnow
from .spec import JobSpec


class NodeRun(Strict):
    """One launched node (task) of one attempt of a job."""

    name: str = Field(description="e.g. worker-0, ps-0, chief-0")
    role: str = "worker"
    index: int = 0
    host: str = Field(default="", description="Inventory node it runs on.")
    hostname: str = Field(default="", description="Hostname seen inside the node.")
    address: str = "127.0.0.1"
    pid: int | None = None
    start_time: float | None = Field(default=None, description="Process start time (re-attach check).")
    primary: bool = Field(default=True, description="Whether the job's status follows this node.")
    state: Literal["pending", "running", "exited", "lost", "stopped"] = "pending"
    exit_code: int | None = None
    ranks: list[int] = []
    log_start: int = Field(
        default=0, description="Size of the node's log when this attempt started (the log spans attempts)."
    )


class TaskState(Strict):
    """One task of a batch job as it stands: a task has its own status, so one failing task
    leaves the others running to their own end (the job fails once they all have)."""

    name: str = Field(description="The node that runs it, e.g. task-0.")
    index: int = 0
    outputs: str = Field(default="", description="Its subfolder of the job's outputs folder (<name>-<N>).")
    status: Literal["queued", "running", "succeeded", "failed", "stopped"] = "queued"
    exit_code: int | None = None


def task_states(spec: JobSpec, nodes: list[NodeRun]) -> list[TaskState]:
    """The state of each task of a batch job from its nodes (empty for a regular job): a task
    whose node has not been launched is ``queued``; one that exited 0 ``succeeded``; one that
    exited otherwise or was lost ``failed``."""
    if spec.type is not JobType.batch:
        return []
    by_name = {n.name: n for n in nodes}
    out = []
    for index in range(len(spec.tasks)):
        name = f"task-{index}"
        run = by_name.get(name)
        status = "queued"
        if run is not None:
            if run.state == "exited":
                status = "succeeded" if run.exit_code == 0 else "failed"
            elif run.state == "lost":
                status = "failed"
            elif run.state == "stopped":
                status = "stopped"
            else:
                status = "running"
        out.append(
            TaskState(
                name=name,
                index=index,
                outputs=f"{spec.name}-{index}",
                status=status,
                exit_code=run.exit_code if run is not None else None,
            )
        )
    return out


class Job(Strict):
    """A submitted job as the service reports it."""

    id: str
    spec: JobSpec
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
    #: inventory nodes this job's next placements avoid: a node performance detection found
    #: slow (``perf_policy = reschedule``); kept with the job, so a restarted service honours it
    excluded_nodes: list[str] = []
    queue_position: int | None = None
    nodes: list[NodeRun] = []
    workspace_isolation: Literal["bubblewrap", "symlink", "none"] | None = None
    tensorboard_url: str | None = None
    #: the job's outputs folder on the service's machine: the spec's ``outputs``, or the folder
    #: made for a job that names none (TensorBoard and the scalar plots read it)
    outputs_folder: str | None = None
    #: a batch job's tasks, each with its own status; derived from ``nodes`` whenever a job is
    #: read (any value given is replaced), empty for a regular job
    tasks: list[TaskState] = []
    #: a queued job's estimated start, when the service can tell (``GET /jobs/{id}`` only)
    estimated_start: datetime | None = None
    #: what the caller of the request may do with the job (the access rules' operations:
    #: view, tensorboard, duration, priority, stop, delete, shell), as the service answers it;
    #: front ends disable what is missing, the service still checks each request
    allowed: list[str] = []

    @model_validator(mode="after")
    def _derive_tasks(self) -> Job:
        self.tasks = task_states(self.spec, self.nodes)
        return self

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def log_node(self) -> str:
        """The node whose log a reader gets without naming one: the first primary node of the
        launched ones; before the launch, the node that will be (TensorFlow's chief when the
        job has one, else worker-0)."""
        for run in self.nodes:
            if run.primary:
                return run.name
        if self.spec.mode is Mode.tensorflow and self.spec.chief:
            return "chief-0"
        return "worker-0"

    def rank_elsewhere(self, node: str, rank: int) -> str | None:
        """When the launched ``node`` does not run ``rank`` but another node does, a sentence
        saying where it runs (a reader asking for that rank's log on ``node`` would get
        nothing); None otherwise (not launched yet, or no node reports its ranks)."""
        here = next((run for run in self.nodes if run.name == node), None)
        if here is None or not here.ranks or rank in here.ranks:
            return None
        owner = next((run.name for run in self.nodes if rank in run.ranks), None)
        if owner is None:
            ranks = sorted(r for run in self.nodes for r in run.ranks)
            return f"job {self.id} has no rank {rank} (its ranks: {', '.join(map(str, ranks))})"
        return f"rank {rank} of job {self.id} runs on {owner}, not {node}: use --node {owner}"


class Event(Strict):
    """One change in a job's life: a status (or a notice while the status stays) with a reason."""

    seq: int = 0
    job_id: str
    time: datetime = Field(default_factory=utcnow)
    status: JobStatus
    reason: str
    node: str | None = None
    rank: int | None = None
    exit_code: int | None = None
    alert: bool = Field(
        default=False, description="Something the user should see at once (a performance alert)."
    )
    by: str | None = Field(default=None, description="The user who made this change (None: the platform).")
