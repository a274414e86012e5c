"""A job's resolved launch plan (``--dry-run``): per node, its mounts, environment, image,
account and the command it execs, as the backend launches it."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from ..workspace_paths import ALGORITHM_VIEW
from .common import Strict


class Mount(Strict):
    """One folder of a node's ``/workspace``: ``source`` on the host shown at ``target``."""

    source: str
    target: str
    read_only: bool
    kind: str = Field(
        description=(
            "algorithm, dataset, annotation, model, outputs, volume, workdir (the node's working copy), "
            "cache (the user's) or modelarts (the ModelArts layout's folders)"
        )
    )
    create: bool = Field(default=False, description="The backend creates source at launch.")
    copy_of: str | None = Field(
        default=None,
        description="A working copy's original: copied into source before the node's first phase.",
    )


class ImageInfo(Strict):
    """The Python environment a node runs with."""

    python: str
    bin_dir: str
    roots: list[str] = []
    env: dict[str, str] = {}


class RunAs(Strict):
    """The Unix account a node's processes run as."""

    name: str
    uid: int
    gid: int


class NodeLaunch(Strict):
    """Everything one node of an attempt runs, resolved: what ``--dry-run`` shows and what the
    backend launches unchanged (it adds only ``MA_NODE_RUN`` and ``MA_JOB_SECRET`` to ``env``)."""

    name: str
    role: str
    index: int
    primary: bool = True
    host: str = ""
    hostname: str
    address: str = ""
    ports: list[int] = []
    cpus: list[int] = []
    devices: list[int] = Field(default=[], description="The machine's indices of the node's cards.")
    device_nodes: list[str] = Field(
        default=[], description="Device nodes bound into its sandbox: its real cards' and their driver's."
    )
    argv: list[str] = Field(description="The command as planned (${VAR} unexpanded, python as written).")
    command: list[str] = Field(
        default=[], description="What the node execs: ${VAR} expanded, the interpreter resolved."
    )
    env: dict[str, str] = Field(description="The node's complete environment but the launch-only variables.")
    files: dict[str, str] = {}
    mounts: list[Mount] = []
    workdir: str = ALGORITHM_VIEW
    image: ImageInfo | None = None
    isolation: str = ""
    run_as: RunAs | None = None
    on_start: list[str] | None = None
    on_stop: list[str] | None = None
    notes: list[str] = []


class Plan(Strict):
    """The resolved launch plan of a job (``--dry-run``), per node."""

    spec: str
    nodes: list[NodeLaunch]
    can_start_now: bool = False
    queue_ahead: int = 0
    #: when it would start by the queue's rules and running jobs' durations (or, for running
    #: jobs without one, how long similar jobs ran); None: unknown
    estimated_start: datetime | None = None
    #: how far to trust ``estimated_start``: ``high`` when it rests on durations alone, else the
    #: weakest confidence of the history it took running jobs' ends from; None: no estimate
    estimate_confidence: Literal["high", "medium", "low"] | None = None
    notes: list[str] = []
