"""A job's spec and its parts: what a user says about a job (mounts, the image, batch tasks,
fault restart, checkpoint resume, lifecycle scripts, variables and secrets, a dev
environment's origin), the cross-field rules of :class:`JobSpec`, and :func:`parse_spec`, the
one parser that turns a dict into a spec or an :class:`~ma_jupyter.errors.InvalidSpec`."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, field_validator, model_validator

from ..commands import parse_command
from ..wire import (
    MAX_DURATION,
    Access,
    Convention,
    DatasetSource,
    HangPolicy,
    JobType,
    Mode,
    ModelSource,
    PerfPolicy,
    Priority,
    is_object_uri,
    parse_duration,
)
from ..workspace_paths import ALGORITHM_VIEW, OUTPUTS_VIEW
from .common import (
    MAX_ENV,
    MAX_MOUNTS,
    MAX_SPECS,
    MAX_TASKS,
    NAME_PATTERN,
    NO_NUL,
    Command,
    Digest,
    Path_,
    Short,
    Strict,
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

    from ..errors import InvalidSpec

    if isinstance(data, JobSpec):
        return data
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0].get("loc", ()) if exc.errors() else ()
        raise InvalidSpec(describe_validation_error(exc), field=str(first[0]) if first else None) from exc
