"""The wire model: the single source of truth for a job.

Everything that describes a job travels as one of these pydantic models: the REST API, the
client, the magics, the widgets, the CLI and the TypeScript types of the labextension (generated
from :func:`json_schemas`).  Unknown fields are rejected everywhere, so a typo in a field name
is an error and never a silently ignored setting.

The field rules follow the platform's task-style training job: a regular job has one algorithm
and one command, a batch job one algorithm and command per task with outputs in
``<name>-<N>/``; fault restart and checkpoint resume exclude each other; a node name excludes a
driver version and a dedicated pool; the parameter-server count belongs to TensorFlow only and
0 means AllReduce.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .commands import parse_command

# The wire's plain parts (names, enumerations, durations) live in wire.py, which needs no
# pydantic: a command line reads answers through them without importing this module.
from .wire import (  # noqa: F401 - re-exported: `from ma_jupyter.models import JobStatus` stays true
    API_PREFIX,
    FORWARDED_USER_HEADER,
    MAX_DURATION,
    OBJECT_SCHEMES,
    TERMINAL_STATUSES,
    TRANSITIONS,
    Access,
    Convention,
    DatasetSource,
    HangPolicy,
    JobSort,
    JobStatus,
    JobType,
    Mode,
    ModelSource,
    PerfPolicy,
    Priority,
    clone_name,
    is_object_uri,
    parse_duration,
)
from .workspace_paths import ALGORITHM_VIEW, OUTPUTS_VIEW

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
#: Size bounds of the spec's free fields (rule: every string and list a request carries is
#: bounded, so a hostile body is a 400 naming the field, never a 500 or a huge row):
#: a path is at most PATH_MAX; a command at most Linux's single-argument limit
#: (MAX_ARG_STRLEN, 128 KiB), since a node receives it as one argument.
MAX_PATH = 4096
MAX_COMMAND = 128 << 10
MAX_SHORT = 128
MAX_MOUNTS = 64
MAX_SPECS = 16
MAX_TASKS = 256
MAX_ENV = 1024
#: no NUL byte: no path, argument or name the kernel takes can carry one
NO_NUL = r"^[^\x00]*$"
Path_ = Annotated[str, Field(max_length=MAX_PATH, pattern=NO_NUL)]
Short = Annotated[str, Field(max_length=MAX_SHORT, pattern=NO_NUL)]
Command = Annotated[str, Field(max_length=MAX_COMMAND, pattern=NO_NUL)]
#: an algorithm folder's content identity (:mod:`ma_jupyter.algorithm_content`)
DIGEST_PATTERN = r"^sha256:[0-9a-f]{64}$"
Digest = Annotated[str, Field(pattern=DIGEST_PATTERN)]


#: A user name: letters, digits and ``_ . @ -`` (JupyterHub names may be e-mail addresses).
USER_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.@-]{0,63}$"
#: The namespace of the hub users the Jupyter server extension forwards: ``hub:<name>``, which
#: no service user can be named (``:`` is not in :data:`USER_PATTERN`), see ``service/users.py``.
FORWARDED_PREFIX = "hub:"
#: A service user's name or a forwarded hub user's (``hub:<name>``).
ANY_USER_PATTERN = r"^(?:hub:)?[A-Za-z0-9_][A-Za-z0-9_.@-]{0,63}$"
#: A job's id as the service makes it (the name's start, ``-`` and random hex: letters, digits,
#: ``_ -``) and a node's name (``ROLE-INDEX``: ``worker-0``, ``ps-1``, ``task-3``): what a front end
#: checks an id or node it did not get from the service against (a notebook's output) before it
#: acts on it. No space, no control character, no leading ``-``.
JOB_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
NODE_NAME_PATTERN = r"^[a-z]+-[0-9]{1,6}$"


def check_node_target(job_id: object, node: object) -> tuple[str, str]:
    """``(job_id, node)`` when both are strings of :data:`JOB_ID_PATTERN` and
    :data:`NODE_NAME_PATTERN` (the whole string: no trailing newline either).

    Raises:
        InvalidSpec: naming the field (``job`` or ``node``), the value as Python writes it
            (control characters escaped) and the shape expected.
    """
    from .errors import InvalidSpec

    if not isinstance(job_id, str) or not re.fullmatch(JOB_ID_PATTERN, job_id):
        raise InvalidSpec(
            f"not a job id: {job_id!r}: a job id is 1 to 128 letters, digits, '_', '.' or '-', "
            "starting with a letter or digit (as `ma-jupyter jobs` shows it)",
            field="job",
        )
    if not isinstance(node, str) or not re.fullmatch(NODE_NAME_PATTERN, node):
        raise InvalidSpec(
            f"not a node name: {node!r}: a node is ROLE-INDEX, e.g. worker-0, ps-1, task-3 "
            "(as `ma-jupyter get JOB` lists them)",
            field="node",
        )
    return job_id, node


def utcnow() -> datetime:
    """Timezone-aware now, the only clock the models use."""
    return datetime.now(UTC)


class Strict(BaseModel):
    """Base of every wire model: unknown fields are an error, enums travel as their values."""

    # defer_build: a model's validator is built when first used, not at import (building all
    # of them took most of a CLI call's time, and a call uses a few)
    model_config = ConfigDict(
        extra="forbid", use_enum_values=False, populate_by_name=True, allow_inf_nan=False, defer_build=True
    )


# ----------------------------------------------------------------------------------- mounts


class DatasetMount(Strict):
    """A dataset shown at ``/workspace/dataset/<source>/<name>[/<version>]`` (read-only by default)."""

    name: str = Field(pattern=NAME_PATTERN)
    path: Path_ = Field(description="Host folder holding the data.")
    source: DatasetSource = DatasetSource.private
    version: str | None = Field(default=None, pattern=NAME_PATTERN)
    read_only: bool = True


class AnnotationMount(Strict):
    """An annotation set shown at ``/workspace/anno_dataset/<name>/annotation`` (read-only)."""

    name: str = Field(pattern=NAME_PATTERN)
    path: Path_


class ModelMount(Strict):
    """A model shown at ``/workspace/model/<source>/<name>[/<version>]``; always read-only."""

    name: str = Field(pattern=NAME_PATTERN)
    path: Path_
    source: ModelSource = ModelSource.private
    version: str | None = Field(default=None, pattern=NAME_PATTERN)


class VolumeMount(Strict):
    """A writable storage volume shown at ``/workspace/volume/<name>``."""

    name: str = Field(pattern=NAME_PATTERN)
    path: Path_


# ------------------------------------------------------------------------------ job pieces


class Image(Strict):
    """The job's Python environment (the platform's image).

    Exactly one of ``python`` (an interpreter path), ``venv`` (a virtualenv folder) or
    ``conda_env`` (an env name, or a path, run through ``conda run -n``) may be set; none means
    the interpreter the service itself runs on.  ``name`` picks a registered image
    (:class:`RegisteredImage`, ``GET /images``) instead: the service checks its scope, card
    type and visibility and fills in its environment at the submit (a value sent beside the
    name is replaced).
    """

    python: Path_ | None = None
    venv: Path_ | None = None
    conda_env: Path_ | None = None
    name: str | None = Field(
        default=None,
        pattern=NAME_PATTERN,
        description="A registered image (GET /images); its environment is filled in by the service.",
    )

    @model_validator(mode="after")
    def _one_kind(self) -> Image:
        given = [k for k in ("python", "venv", "conda_env") if getattr(self, k)]
        if len(given) > 1:
            raise ValueError(f"image: give one of python, venv or conda_env, not {' and '.join(given)}")
        return self


#: what a registered image may be used for (seed 002: "the image's scope must include
#: task-style training"): ``training`` jobs, ``devenv`` dev environments
ImageScope = Literal["training", "devenv"]
#: the cards a registered image is built for (seed 002: "the image's card type must match the
#: node spec"): ``cpu`` matches a spec without cards, the others a spec's ``accelerator_type``
ImageCardType = Literal["cpu", "gpu", "mlu", "npu"]


class RegisteredImage(Strict):
    """An image registered with the service (``POST /images``), as ModelArts' image management
    keeps one: a name for a Python environment, what it may be used for, the cards it is built
    for and who may use it."""

    name: str = Field(pattern=NAME_PATTERN, description="What --image names it by: unique in the service.")
    environment: Image = Field(description="The environment: one of python, venv or conda_env (never name).")
    card_type: ImageCardType = Field(
        default="cpu", description="cpu, gpu, mlu or npu: the only specs it runs on are of this type."
    )
    scopes: list[ImageScope] = Field(
        default=["training", "devenv"],
        min_length=1,
        max_length=2,
        description="training (jobs), devenv (dev environments): what it may be used for.",
    )
    visibility: Literal["public", "private"] = Field(
        default="private",
        description="private: its owner's jobs only; public: everyone's (registered by admins only).",
    )
    description: str = Field(default="", max_length=500)
    owner: Short | None = Field(default=None, description="Set by the service: who registered it.")
    created_at: datetime | None = Field(default=None, description="Set by the service.")

    @model_validator(mode="after")
    def _an_environment(self) -> RegisteredImage:
        env = self.environment
        if env.name is not None or not (env.python or env.venv or env.conda_env):
            raise ValueError("environment: give one of python, venv or conda_env (not another image's name)")
        if len(set(self.scopes)) != len(self.scopes):
            raise ValueError("scopes: each scope may be listed once")
        return self


class BatchTask(Strict):
    """One task of a batch job: its own algorithm folder and command; outputs go to ``<name>-<N>/``."""

    algorithm: Path_ | None = None
    command: Command
    algorithm_digest: Digest | None = Field(
        default=None,
        description="The content the task ran from its algorithm folder (sha256 over its files, "
        "read when the job was accepted and again when it first started); set by the service, a "
        "value sent is replaced.",
    )

    @field_validator("command")
    @classmethod
    def _command_rules(cls, v: str) -> str:
        parse_command(v, field="tasks.command")
        return v


class FaultRestart(Strict):
    """Restart the whole job when it fails, at most ``max_restarts`` times."""

    max_restarts: int = Field(default=3, ge=1, le=100)


class CheckpointResume(Strict):
    """Checkpoint resume: on a fault the job gets SIGTERM, ``grace_period`` seconds to save a
    checkpoint, and is scheduled again (at most ``max_resumes`` times), continuing from it.

    ``elastic_min_nodes`` lets it start or resume on fewer nodes than asked when resources are
    short; ``allow_scale_up`` (the seed's "allow scale-up") lets such a shrunk job grow back when
    nodes free up (saved, requeued and resumed with more nodes).  ``perf_threshold`` watches the log for ``hardware time is X and e2e time is Y`` lines
    and applies ``perf_policy`` when hardware/e2e exceeds it.
    """

    max_resumes: int = Field(default=3, ge=1, le=100)
    grace_period: float = Field(default=30.0, gt=0, le=3600)
    elastic_min_nodes: int | None = Field(default=None, ge=1, le=64)
    allow_scale_up: bool = False
    perf_threshold: float | None = Field(default=None, gt=0, le=1e6)
    perf_policy: PerfPolicy = PerfPolicy.alert


class Lifecycle(Strict):
    """Lifecycle scripts (each a command under the run-command rules) run on every node."""

    on_start: Command | None = None
    on_stop: Command | None = None

    @field_validator("on_start", "on_stop")
    @classmethod
    def _command_rules(cls, v: str | None) -> str | None:
        if v:
            parse_command(v, field="lifecycle")
        return v


EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=256)]
#: An environment value: no NUL byte (the kernel cannot pass one; it ends the value) and at
#: most 64 KiB (each value travels as one argument of the node's launcher).
EnvValue = Annotated[str, Field(max_length=65536)]
#: What a secret value is shown as, everywhere but the node's own environment.
SECRET_MASK = "***"
#: An ``env`` value starting with this is a secret: it moves to ``secret_env`` without it.
SECRET_PREFIX = "secret:"


class DevEnvOrigin(Strict):
    """What a dev environment (``POST /jobs/{id}/devenv``) was made from; set by the service
    only (a submit naming it is refused)."""

    job_id: str = Field(max_length=128, description="The job whose node's sandbox it is.")
    node: Short = Field(description="That job's node whose view and variables it has, e.g. worker-1.")
    variables: dict[EnvName, EnvValue] = Field(
        default={},
        max_length=MAX_ENV,
        description="The platform's variables of that node as the job's plan gives them (RANK, "
        "WORLD_SIZE, MA_TASK_INDEX...); they win over the dev environment's own.",
    )


class JobSpec(Strict):
    """Everything a user says about a job; what the service stores and the backends run."""

    name: str = Field(pattern=NAME_PATTERN, description="Job name: letters, digits, '-', '_', '.'.")
    type: JobType = JobType.regular
    priority: Priority = Priority.normal
    access: Access = Access.ro
    creator: Short | None = Field(default=None, description="Filled in by the service from the caller.")
    datasets: list[DatasetMount] = Field(default=[], max_length=MAX_MOUNTS)
    annotations: list[AnnotationMount] = Field(default=[], max_length=MAX_MOUNTS)
    models: list[ModelMount] = Field(default=[], max_length=MAX_MOUNTS)
    volumes: list[VolumeMount] = Field(default=[], max_length=MAX_MOUNTS)
    algorithm: Path_ | None = Field(default=None, description=f"Host folder shown at {ALGORITHM_VIEW}.")
    algorithm_read_only: bool = True
    algorithm_origin: Path_ | None = Field(
        default=None,
        description=(
            "The folder the algorithm was shipped from, when ``algorithm`` is a snapshot of it "
            "(the client fills it in): search by algorithm finds the job under it, and the "
            "ModelArts layout names the code folder after it."
        ),
    )
    algorithm_digest: Digest | None = Field(
        default=None,
        description=(
            "The content the job runs from ``algorithm`` (sha256 over its files, as the service "
            "read them when it accepted the job, and for a folder used as is again when the job "
            "first started; None: it could not be read whole).  Set by the service, a value sent "
            "is replaced: search by algorithm finds the job under it, wherever the same code lies."
        ),
    )
    outputs: Path_ | None = Field(
        default=None, description=f"Host folder shown at {OUTPUTS_VIEW} (writable)."
    )
    mode: Mode = Mode.single
    specs: list[Short] = Field(default_factory=lambda: ["cpu.small"], min_length=1, max_length=MAX_SPECS)
    node_name: Short | None = None
    driver_version: Short | None = None
    pool: Short | None = None
    image: Image = Image.model_construct()  # a default that builds no validator at import
    nodes: int = Field(default=1, ge=1, le=64)
    ps: int = Field(default=0, ge=0, le=64, description="TensorFlow parameter servers; 0 = AllReduce.")
    chief: bool = Field(default=False, description="TensorFlow: add a chief task (ParameterServerStrategy).")
    convention: Convention = Convention.platform
    command: Command | None = None
    tasks: list[BatchTask] = Field(default=[], max_length=MAX_TASKS)
    fault_restart: FaultRestart | None = None
    checkpoint_resume: CheckpointResume | None = None
    data_preparation: bool = False
    debug_terminal: bool = False
    hang_policy: HangPolicy = Field(
        default=HangPolicy.alert,
        description="A job that writes nothing to its logs and uses almost no CPU for [limits] "
        "hang_minutes looks hung: alert (an event naming what its processes wait on) or stop (also "
        "end it in error).",
    )
    duration: float | None = Field(
        default=None, gt=0, le=MAX_DURATION, description="Run duration in seconds; past it the job expires."
    )
    lifecycle: Lifecycle = Lifecycle.model_construct()  # (as above)
    env: dict[EnvName, EnvValue] = Field(default={}, max_length=MAX_ENV)
    secret_env: dict[EnvName, EnvValue] = Field(
        default={},
        max_length=MAX_ENV,
        description="Variables whose values are secret: kept apart from the job, given to its nodes "
        "at launch only, shown as *** everywhere else.  An env value 'secret:V' is the same as V here.",
    )
    storage_credentials: dict[EnvName, EnvValue] = Field(
        default={},
        max_length=MAX_ENV,
        description="The submitter's object storage credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, "
        "AWS_SESSION_TOKEN, AWS_ENDPOINT_URL, AWS_REGION) for its s3:// and obs:// paths: kept apart "
        "from the job like secret_env, used by its data steps only, shown as *** everywhere else.",
    )
    storage_env: bool = Field(
        default=False,
        description="Give storage_credentials to the job's own environment too (as secret variables).",
    )
    workdir: Path_ | None = Field(
        default=None, description=f"Working directory inside the node; default {ALGORITHM_VIEW}."
    )
    grace_period: float = Field(
        default=10.0, gt=0, le=3600, description="Seconds between SIGTERM and SIGKILL on stop."
    )
    devenv_of: DevEnvOrigin | None = Field(
        default=None,
        description="Set on a dev environment only: the job and node it is the environment of "
        "(its command is a Jupyter kernel).",
    )

    @model_validator(mode="before")
    @classmethod
    def _secret_prefix(cls, data: Any) -> Any:
        # ``env: {K: "secret:V"}`` is ``secret_env: {K: "V"}``: one way to say it on a command line
        env = data.get("env") if isinstance(data, dict) else None
        if not isinstance(env, dict) or not any(
            isinstance(v, str) and v.startswith(SECRET_PREFIX) for v in env.values()
        ):
            return data
        secrets = dict(data.get("secret_env") or {}) if isinstance(data.get("secret_env"), dict) else {}
        plain = {}
        for key, value in env.items():
            if isinstance(value, str) and value.startswith(SECRET_PREFIX):
                secrets[key] = value.removeprefix(SECRET_PREFIX)
            else:
                plain[key] = value
        return {**data, "env": plain, "secret_env": secrets}

    @field_validator("duration", mode="before")
    @classmethod
    def _duration(cls, v: Any) -> float | None:
        return parse_duration(v)

    @field_validator("specs")
    @classmethod
    def _unique_specs(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("specs: each spec may be listed once")
        return v

    @field_validator("command")
    @classmethod
    def _command_rules(cls, v: str | None) -> str | None:
        if v is not None:
            parse_command(v)
        return v

    @field_validator("env", "secret_env")
    @classmethod
    def _env_values(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if "\x00" in value:
                raise ValueError(
                    f"env {key}: the value holds a NUL byte, which no process environment can carry; remove it"
                )
        return v

    def masked(self) -> JobSpec:
        """This spec with each secret value (``secret_env``, ``storage_credentials``) replaced by
        :data:`SECRET_MASK` (names kept)."""
        if not self.secret_env and not self.storage_credentials:
            return self
        return self.model_copy(
            update={
                "secret_env": dict.fromkeys(self.secret_env, SECRET_MASK),
                "storage_credentials": dict.fromkeys(self.storage_credentials, SECRET_MASK),
            }
        )

    def object_sources(self) -> list[tuple[str, DatasetMount | ModelMount]]:
        """The datasets and models that name object storage, as (field, mount)."""
        return [("datasets", d) for d in self.datasets if is_object_uri(d.path)] + [
            ("models", m) for m in self.models if is_object_uri(m.path)
        ]

    def prepares_data(self) -> bool:
        """Whether the job's launch first prepares data: ``data_preparation``, a dataset or
        model in object storage (always downloaded into the prepared store first), or outputs
        in object storage (their current content downloaded into the outputs folder first)."""
        return self.data_preparation or bool(self.object_sources()) or is_object_uri(self.outputs)

    @model_validator(mode="after")
    def _cross_field_rules(self) -> JobSpec:
        both = sorted(set(self.env) & set(self.secret_env))
        if both:
            raise ValueError(f"secret_env: {', '.join(both)} also in env; give each variable once")
        if self.node_name and (self.driver_version or self.pool):
            raise ValueError(
                "node_name cannot be combined with driver_version or pool: choose a node, or let the scheduler pick one"
            )
        if self.fault_restart and self.checkpoint_resume:
            raise ValueError("fault_restart and checkpoint_resume exclude each other: choose one")
        if self.ps and self.mode is not Mode.tensorflow:
            raise ValueError(
                "ps (parameter servers) applies to the tensorflow mode only; set ps=0 or mode=tensorflow"
            )
        if (
            self.ps
            and self.mode is Mode.tensorflow
            and self.convention is Convention.modelarts
            and self.ps != (self.nodes if self.nodes > 1 else 0)
        ):
            raise ValueError(
                f"ps={self.ps}: the ModelArts convention's TensorFlow layout runs one parameter server "
                f"beside each worker (ps={self.nodes if self.nodes > 1 else 0} for nodes={self.nodes}); "
                "leave ps out, or drop convention=modelarts to choose a ps count"
            )
        if self.chief and self.mode is not Mode.tensorflow:
            raise ValueError("chief applies to the tensorflow mode only")
        if self.mode is Mode.single and self.nodes != 1:
            raise ValueError(
                "the single mode runs on one node: set nodes=1, or mode=distributed for the "
                "distributed variables on every node with the command run as written"
            )
        if self.type is JobType.regular:
            if self.tasks:
                raise ValueError("tasks belong to batch jobs; a regular job has one command (set type=batch)")
            if not self.command:
                raise ValueError(
                    f"command is required: the command that starts training, e.g. python {ALGORITHM_VIEW}/train.py"
                )
        else:
            if not self.tasks:
                raise ValueError("a batch job needs at least one task (algorithm and command)")
            if self.command:
                raise ValueError("a batch job takes its commands from tasks, not from command")
            if self.checkpoint_resume:
                raise ValueError("checkpoint_resume is only for regular jobs")
            if self.mode is not Mode.single or self.nodes != 1:
                raise ValueError(
                    "a batch job runs each task on one node in the single mode: set mode=single, nodes=1"
                )
        if self.checkpoint_resume and self.checkpoint_resume.allow_scale_up:
            if not self.checkpoint_resume.elastic_min_nodes:
                raise ValueError(
                    "checkpoint_resume.allow_scale_up grows a job that started on fewer nodes: "
                    "it needs elastic_min_nodes too"
                )
        if self.checkpoint_resume and self.checkpoint_resume.elastic_min_nodes:
            if self.checkpoint_resume.elastic_min_nodes > self.nodes:
                raise ValueError("checkpoint_resume.elastic_min_nodes cannot exceed nodes")
        if self.data_preparation and any(not d.read_only for d in self.datasets):
            raise ValueError("data_preparation needs every dataset mounted read-only")
        if any(not d.read_only and is_object_uri(d.path) for d in self.datasets):
            raise ValueError("a dataset in object storage (s3://, obs://) is mounted read-only: drop ':rw'")
        names: dict[str, set[str]] = {}
        for kind, items in (
            ("datasets", self.datasets),
            ("models", self.models),
            ("volumes", self.volumes),
            ("annotations", self.annotations),
        ):
            seen = names.setdefault(kind, set())
            for item in items:
                key = f"{getattr(item, 'source', '')}/{item.name}/{getattr(item, 'version', '') or ''}"
                if key in seen:
                    raise ValueError(f"{kind}: {item.name!r} is mounted twice")
                seen.add(key)
        return self


# ------------------------------------------------------------------------ catalog, inventory


class Spec(Strict):
    """A compute flavor for one node of a job."""

    name: str
    cpus: float = Field(gt=0)
    memory_gb: float = Field(gt=0)
    accelerators: int = Field(default=0, ge=0)
    accelerator_type: Literal["none", "gpu", "mlu", "npu"] = "none"
    accelerator_model: str = Field(
        default="", description="Board model the cards must be (e.g. MLU370); empty: any of the type."
    )
    emulated: bool = Field(
        default=False, description="Cards are indices only (no device): for scheduling and SLOTS logic."
    )
    driver_versions: list[str] = []
    description: str = ""

    @property
    def slots(self) -> int:
        """Processes per node: the card count, or 1 for a CPU spec."""
        return self.accelerators or 1


class Node(Strict):
    """One compute node of the cluster and what is in use on it now."""

    name: str
    status: Literal["idle", "busy", "full", "down", "drained", "faulty"] = Field(
        default="idle",
        description="drained (an admin's) and faulty (its runners stopped beating) take no new placements.",
    )
    health: str = Field(default="", description="Why the node is drained or faulty, and by whom.")
    os: str = ""
    kernel: str = ""
    cpus: float
    cpus_used: float = 0
    memory_gb: float
    memory_used_gb: float = 0
    accelerators: int = 0
    accelerator_type: Literal["none", "gpu", "mlu", "npu"] = "none"
    accelerator_model: str = Field(default="", description="Board model of the cards (e.g. MLU370).")
    accelerator_memory_gb: float = Field(default=0, ge=0, description="Memory of one card (0: unknown).")
    devices: list[int] = Field(
        default=[],
        description="The machine's indices of its cards (nvidia-smi's, /dev/nvidia<N>); empty: 0 to "
        "accelerators-1. Real cards listed by several nodes of one machine go to one node at a time.",
    )
    emulated: bool | None = Field(
        default=None,
        description="True: its cards are indices only; False: real cards, their device nodes bound into "
        "the sandbox of the job node holding them. Unset in cluster.toml: real when this machine shows "
        "the type's device nodes.",
    )
    accelerators_used: list[int] = []
    driver_version: str | None = None
    pools: list[str] = []
    specs: list[str] = Field(default=[], description="Specs that fit this node.")
    usage: list[str] = Field(default=[], description="'card:job-name' entries for what runs here.")

    @model_validator(mode="after")
    def _devices_match(self) -> Node:
        if self.devices and (
            len(self.devices) != self.accelerators or len(set(self.devices)) != len(self.devices)
        ):
            raise ValueError(
                f"node {self.name}: devices must list {self.accelerators} distinct card indices "
                f"(one per card of accelerators = {self.accelerators}), not {self.devices}"
            )
        return self

    @property
    def card_indices(self) -> list[int]:
        """The machine's indices of its cards: ``devices``, else 0..accelerators-1."""
        return list(self.devices) if self.devices else list(range(self.accelerators))


class NodeDrain(Strict):
    """The body of ``POST /nodes/{name}/drain``: why the admin takes the node out of placement."""

    reason: str | None = Field(default=None, max_length=256)


class ClusterNode(Strict):
    """One node in the cluster view: the node with its use, and what holds its cards."""

    node: Node
    model: str = Field(
        default="", description="Board model: the node's accelerator_model, else its card type."
    )
    cards: list[str] = Field(
        default=[],
        description="Cards in use as 'card(virtual):application' (seed notation, e.g. 1(0):train-a): the "
        "board's index on the node, the virtual card cut from it (0: the whole board) and the job's name.",
    )
    jobs: list[str] = Field(default=[], description="Ids of the visible jobs running here.")
    card_percent: float | None = Field(
        default=None, description="Mean use of its cards in use now (real cards the driver reads), 0..100."
    )
    fits: bool = Field(
        default=True, description="Whether one node of a chosen spec fits here now (idle vs tight)."
    )


class SpecRoom(Strict):
    """One spec in the cluster view and how many more job nodes of it could start now."""

    spec: Spec
    models: list[str] = Field(
        default=[], description="Board models it can run on (its own, else its nodes')."
    )
    nodes: int = Field(default=0, description="Nodes it fits on at all (up ones).")
    can_start: int = Field(
        default=0,
        description="How many more one-node jobs of it the scheduler would place now, one after another.",
    )


class QueuedJob(Strict):
    """One queued job in the cluster view, in the scheduler's order."""

    position: int
    job_id: str | None = Field(
        default=None, description="None for another user's job the caller may not see."
    )
    name: str
    priority: Priority
    specs: list[str] = []
    nodes: int = 1
    cards: int = Field(default=0, description="Cards it asks for in all (first spec with cards x nodes).")
    model: str = Field(default="", description="Board model of those cards.")


class ClusterView(Strict):
    """The cluster's resources now (seed 002 cluster resources): nodes and their use, how many
    more of each spec could start, the queue by priority and queued card demand per board model."""

    nodes: list[ClusterNode] = []
    specs: list[SpecRoom] = []
    queue: list[QueuedJob] = []
    demand: dict[str, int] = Field(default={}, description="Cards queued jobs ask for, per board model.")
    models: list[str] = Field(default=[], description="Every board model of the inventory (for the filter).")


# ---------------------------------------------------------------------------- job and state


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


class LogFile(Strict):
    """Where a reader on the service's machine may read a log stream itself: the file its node
    writes, whose bytes at each offset are the ones ``GET /jobs/{id}/logs/read`` answers."""

    root: str = Field(
        description="A folder the job cannot replace (its job folder): open the file from here, "
        "following no symbolic link on the way (the job controls everything below it)."
    )
    path: str = Field(description="The stream's file, relative to root.")


class LogStream(Strict):
    """One log file of a job: per node, and per rank where the launcher allows."""

    node: str
    rank: int | None = None
    size: int = 0
    file: LogFile | None = Field(
        default=None,
        description="Where a client on the service's machine may read this stream directly "
        "(only the backend knows); None: through the service only (the file is on another machine).",
    )


class LogChunk(Strict):
    """Bytes of one log stream from ``offset`` to ``next_offset`` (decoded as UTF-8, replaced)."""

    job_id: str
    node: str
    rank: int | None = None
    offset: int
    next_offset: int
    data: str
    eof: bool = Field(description="True when the job is terminal and nothing more will be written.")
    file: LogFile | None = Field(
        default=None,
        description="On a read from offset 0: where a reader on the service's machine may read the "
        "stream's file itself (as GET /jobs/{id}/logs describes it), so it need not ask apart.",
    )


class KernelRelay(Strict):
    """The relay of a dev environment's kernel on the machine that runs it (Ray): a TCP listener
    there that carries one kernel socket's bytes per connection, once the connection proves
    ``secret`` (``ma_jupyter.kernel_access`` spells the wire)."""

    host: str = Field(description="The address of the machine (Ray node) that runs the dev environment.")
    port: int = Field(ge=1, le=65535)
    secret: str = Field(description="The relay's own secret: in no file, and never seen by the job.")


class KernelRoute(Strict):
    """How a running dev environment's kernel is reached (``POST /jobs/{id}/kernel``, its owner
    or an admin): through its kernel folder on the service's machine (``folder``), or through
    the relay on the machine that runs it (``relay``); exactly one is set."""

    node: str
    folder: str | None = Field(
        default=None, description="The node's kernel folder on the service's machine (local backend)."
    )
    relay: KernelRelay | None = None


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


class User(Strict):
    """A user of the service (never with a token: only its hash is stored)."""

    name: str = Field(pattern=ANY_USER_PATTERN)
    admin: bool = False
    created_at: datetime = Field(default_factory=utcnow)


class NewUser(Strict):
    """``POST /users``: the user to add."""

    name: str = Field(max_length=64, description="Letters, digits and _ . @ -; at most 64.")
    admin: bool = False


class NotifySettings(Strict):
    """``GET|PUT /users/me/notify``: where the caller's own jobs' alerts and terminal states go,
    besides the administrator's ``[notify]`` hook."""

    webhook: str | None = Field(
        default=None,
        max_length=2048,
        description="http(s) URL that gets each event as a JSON POST; null: none.",
    )
    address: str | None = Field(
        default=None,
        max_length=320,
        # no control character, C1 (NEL) and Unicode line separators included: the admin's
        # command may write it into a mail header or a line-based protocol
        pattern=r"^[^\x00-\x1f\x7f-\x9f\u2028\u2029]+$",
        description="Where the administrator's [notify] command delivers your events (a mail "
        "address, a chat handle...): each event of your jobs carries it as 'address'; null: none. "
        "A PUT changes only the fields it names.",
    )


class UserToken(User):
    """A user with a token just made for it: the only time the token is shown."""

    token: str


class AlgorithmVersion(Strict):
    """One content an algorithm folder's jobs ran (a version of the folder)."""

    digest: Digest | None = Field(description="sha256 over its files; None: jobs whose content is not known.")
    jobs: int = Field(description="How many of the caller's jobs ran it.")
    last_used: datetime = Field(description="When the newest of them was submitted.")


class Algorithm(Strict):
    """An algorithm folder of the caller's: one their jobs used (the seed's "my algorithm
    volumes") or one they marked a favourite (its "favourite algorithms")."""

    path: str = Field(description="The folder, an absolute normalised path.")
    favourite: bool = False
    jobs: int = Field(default=0, description="How many of the caller's jobs use it.")
    versions: list[AlgorithmVersion] = Field(
        default=[],
        description="The contents those jobs ran, one per version, the most recently used first.",
    )


class FavouriteAlgorithm(Strict):
    """``POST /algorithms/favourites``: the folder to mark."""

    path: Path_ = Field(description="An absolute folder path.")


class CacheInfo(Strict):
    """One user's persistent cache (``~/.cache`` in their jobs' nodes) and what it holds."""

    user: str
    path: str = Field(description="Its host folder.")
    bytes: int = 0
    files: int = 0
    refused: str | None = Field(
        None,
        description="Why its size could not be measured whole (a chain of folders too deep, too "
        "many entries: what to remove); bytes and files are then what was counted before.",
    )


class PreparedData(Strict):
    """One prepared copy of a dataset source, shared by the jobs that name that source."""

    key: str = Field(description="Its store key (source path and contents, see service/prepared.py).")
    source: str
    path: str = Field(description="The copy on the service's machine.")
    bytes: int = 0
    files: int = 0
    created: float = 0.0
    last_used: float = Field(default=0.0, description="When a job last took or gave it back (epoch s).")
    jobs: list[str] = Field(default=[], description="The queued or running jobs that use it.")


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


def describe_validation_error(exc: Any) -> str:
    """One readable line per problem of a pydantic ``ValidationError``: ``field: message``."""
    lines = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "__root__") or "job"
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        if err.get("type") == "extra_forbidden":
            msg = "unknown field: check its spelling (see JobSpec for the fields)"
        elif err.get("type") == "string_pattern_mismatch" and (err.get("ctx") or {}).get("pattern") == NO_NUL:
            msg = "holds a NUL byte, which no path, command or name can carry; remove it"
        elif (
            err.get("type") == "string_pattern_mismatch"
            and (err.get("ctx") or {}).get("pattern") == NAME_PATTERN
        ):
            msg = "a name is 1 to 63 letters, digits, '-', '_' or '.', starting with a letter or digit"
        lines.append(f"{where}: {msg}")
    return "; ".join(lines)


def parse_spec(data: JobSpec | dict[str, Any]) -> JobSpec:
    """A validated :class:`JobSpec` from a dict (or the spec itself).

    Raises:
        InvalidSpec: with every problem as ``field: what to do``.
    """
    from pydantic import ValidationError

    from .errors import InvalidSpec

    if isinstance(data, JobSpec):
        return data
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0].get("loc", ()) if exc.errors() else ()
        raise InvalidSpec(describe_validation_error(exc), field=str(first[0]) if first else None) from exc
