"""The schema of ``cluster.toml``: every table and key an admin may write, and its type.

:func:`ma_jupyter.config.read_cluster_file` checks each file it reads against it; the rooms
that apply a table then read it as plain TOML (docs/admin.md describes each key).

1. One model per table, unknown keys forbidden: a table or key not declared here is refused
   with a message naming the file, the table, the key and the keys the table takes (a typo
   such as ``[users] sharng = false`` is never silently ignored).
2. The type (and the simple bounds) of every key is checked here, the message naming the file,
   the table, the key and what it must be.  What a well-typed value means (a path's form, a
   duration, a backend's kind and address, a command's words) is checked by the room that
   applies it.
3. Defaults are not kept here: a key left out stays out of the tables handed back, and its
   room applies its own default (``config.Limits``, ``access.Rules``, ``host_policy``...).
4. Adding a key is one line in its table's model below (and a row in docs/admin.md); a new
   table is a model and one line in :class:`ClusterFile`.
5. This module builds pydantic models: it is imported on the first read of a ``cluster.toml``
   (the service), never by a command line that only reads the home's paths.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
)

from .errors import InvalidSpec
from .models import Node, Spec

# ------------------------------------------------------------------------------ value types

#: a number of seconds, megabytes, hours...: an integer or a float
Number = StrictInt | StrictFloat
PositiveNumber = Annotated[Number, Field(gt=0)]
PositiveInt = Annotated[StrictInt, Field(gt=0)]
NonNegativeNumber = Annotated[Number, Field(ge=0)]
NonNegativeInt = Annotated[StrictInt, Field(ge=0)]
NonEmptyStr = Annotated[StrictStr, Field(min_length=1, pattern=r"\S")]
Strings = list[StrictStr]


def must(be: str) -> Any:
    """A key left out by default, ``be`` the end of the sentence that refuses a wrong value
    ("[users] sharing must be ``true or false``")."""
    return Field(default=None, description=be)


class Table(BaseModel):
    """A table of ``cluster.toml``: unknown keys are refused (rule 1)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, defer_build=True)

    #: how the refusal of an unknown key or a malformed table ends (None: the keys it takes)
    USAGE: ClassVar[str | None] = None


# ------------------------------------------------------------------------------ the tables

POSITIVE = "a positive number"
WHOLE = "a positive number, a whole one"


class LimitsTable(Table):
    """``[limits]``: the admin's caps (``config.Limits`` holds the defaults and meanings)."""

    max_restarts: PositiveInt | None = must(WHOLE)
    max_resumes: PositiveInt | None = must(WHOLE)
    max_grace_period: PositiveNumber | None = must(POSITIVE)
    heartbeat_timeout: PositiveNumber | None = must(POSITIVE)
    elastic_scale_up_interval: PositiveNumber | None = must(POSITIVE)
    debug_keep_hours: PositiveNumber | None = must(POSITIVE)
    max_node_processes: PositiveInt | None = must(WHOLE)
    max_log_mb: PositiveNumber | None = must(POSITIVE)
    disk_reserve_mb: PositiveNumber | None = must(POSITIVE)
    node_disk_free_mb: PositiveNumber | None = must(POSITIVE)
    tensorboard_memory_mb: PositiveNumber | None = must(POSITIVE)
    max_tensorboards_per_user: PositiveInt | None = must(WHOLE)
    max_queued_jobs_per_user: PositiveInt | None = must(WHOLE)
    max_spec_bytes: PositiveInt | None = must(WHOLE)
    max_shells_per_job: PositiveInt | None = must(WHOLE)
    max_shells_per_user: PositiveInt | None = must(WHOLE)
    max_devenvs_per_job: PositiveInt | None = must(WHOLE)
    max_devenvs_per_user: PositiveInt | None = must(WHOLE)
    max_log_followers_per_job: PositiveInt | None = must(WHOLE)
    max_log_followers_per_user: PositiveInt | None = must(WHOLE)
    hang_minutes: NonNegativeNumber | None = must(f"{POSITIVE} (or 0 to turn it off)")


class BackendTable(Table):
    """``[backend]``: what runs the nodes (``config.backend_config`` checks the values)."""

    kind: StrictStr | None = must("a backend's name: local or ray")
    address: StrictStr | None = must('the Ray cluster\'s address, "HOST:PORT"')
    node_root: StrictStr | None = must("an absolute path")
    network: StrictStr | None = must("auto or fence")


class NotifyTable(Table):
    """``[notify]``: the administrator's command and the webhooks' allowed destinations."""

    USAGE: ClassVar[str | None] = (
        '[notify] takes command = "PROGRAM ARGS..." (run without a shell) and '
        'webhook_allow = ["HOST[:PORT]", ...]'
    )

    command: NonEmptyStr | None = must('a command, "PROGRAM ARGS..." (run without a shell)')
    webhook_allow: list[NonEmptyStr] | None = must(
        'a list of destinations, e.g. ["127.0.0.1:8123", "hooks.internal"]'
    )


class MountsTable(Table):
    """``[mounts]``: where jobs may mount from, the working copy's size."""

    allowed_roots: Strings | None = must("a list of absolute paths")
    workdir_copy_mb: NonNegativeNumber | None = must("a number of megabytes (0 or more)")


class UsersTable(Table):
    """``[users]``: sharing and quotas (``service/access.py``), accounts (``nodehost/host_policy.py``)."""

    sharing: StrictBool | None = must("true or false")
    urgent_quota: NonNegativeInt | None = must("a whole number, 0 or more")
    allow_root: Strings | None = must("a list of user names")
    job_account: NonEmptyStr | None = must("an account's name")


class ResourcesTable(Table):
    """``[resources]``: the resource sampler (``service/resources.py`` bounds the interval)."""

    sample_interval: PositiveNumber | None = must("a positive number of seconds")


class DataTable(Table):
    """``[data]``: prepared copies (``service/prepared.py``: retention; ``config``: root)."""

    retention: StrictStr | Number | None = must('a duration: seconds, or "30m", "2h", "7d"')
    root: StrictStr | None = must("an absolute folder")


class StorageTable(Table):
    """``[storage]``: object storage (``config.load_storage`` checks the URLs and bounds)."""

    obs_endpoint: StrictStr | None = must("an http:// or https:// URL")
    upload_interval: PositiveNumber | None = must("seconds between 0 and 86400")
    allow_endpoints: Strings | None = must("a list of http:// or https:// URLs")


class NetworkTable(Table):
    """``[network]``: where jobs may connect beyond their own nodes (``config.load_egress``
    checks each destination), and the bounds of the gate's relays (``config.load_egress_bounds``)."""

    egress: StrictStr | list[StrictStr] | None = must(
        '"none" or a list of destinations, e.g. ["10.0.0.0/8:443", "pypi.mirror.local:3128"]'
    )
    egress_idle_timeout: PositiveNumber | None = must("seconds between 1 and 86400")
    egress_connect_timeout: PositiveNumber | None = must("seconds between 1 and 300")
    egress_relays_per_user: PositiveInt | None = must("a whole number between 1 and 65536")


class PoolTable(Table):
    """A ``[[pool]]``: a node pool."""

    USAGE: ClassVar[str | None] = "each [[pool]] has a name and an optional dedicated = true/false"

    name: StrictStr = Field(description="a pool's name")
    dedicated: StrictBool | None = must("true or false")


class ClusterFile(Table):
    """The whole file: its tables (an unknown table is refused like an unknown key)."""

    spec: list[Spec] | None = must("[[spec]] tables")
    node: list[Node] | None = must("[[node]] tables")
    pool: list[PoolTable] | None = must("[[pool]] tables with a name and dedicated = true/false")
    backend: BackendTable | None = None
    limits: LimitsTable | None = None
    notify: NotifyTable | None = None
    mounts: MountsTable | None = None
    users: UsersTable | None = None
    resources: ResourcesTable | None = None
    data: DataTable | None = None
    storage: StorageTable | None = None
    network: NetworkTable | None = None


# ------------------------------------------------------------------------------ checking


def check(data: dict, path: Path | str) -> dict:
    """``data``, the tables read from the ``cluster.toml`` at ``path``, when they keep the
    schema (rules 1 and 2).

    Raises:
        InvalidSpec: the first table or key that does not, naming ``path``, the table, the key
            and what it takes or must be.
    """
    try:
        ClusterFile.model_validate(data)
    except ValidationError as exc:
        raise InvalidSpec(_refusal(exc.errors()[0], path)) from None
    return data


def table_keys(table: str) -> tuple[str, ...]:
    """The keys ``[table]`` takes."""
    return tuple(_table_model(table).model_fields)


def _table_model(table: str) -> type[Table]:
    annotation = ClusterFile.model_fields[table].annotation
    for arg in getattr(annotation, "__args__", ()):
        for inner in (arg, *getattr(arg, "__args__", ())):
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                return inner  # type: ignore[return-value]
    raise KeyError(table)


def _refusal(error: Any, path: Path | str) -> str:
    loc = [part for part in error["loc"] if not isinstance(part, int)]
    if not loc:
        return f"{path} is not a valid cluster file: {error['msg']}"
    table = str(loc[0])
    if table not in ClusterFile.model_fields:
        tables = _listed([_header(name) for name in ClusterFile.model_fields])
        return f"{path}: there is no table [{table}]: use {tables}"
    header = _header(table)
    if table in ("spec", "node"):  # the wire model's own message names the field
        where = ".".join(str(part) for part in loc[1:])
        return f"{path} is not a valid cluster file: {header} {where}: {error['msg']}"
    model = _table_model(table)
    if len(loc) == 1:  # the table itself is not a table
        return f"{path}: {header} must be a table; " + (
            model.USAGE or f"it takes {_listed(model.model_fields)}"
        )
    key = str(loc[1])
    if error["type"] == "extra_forbidden":
        return f"{path}: {header} has no key {key!r}: " + (
            model.USAGE or f"use {_listed(model.model_fields)}"
        )
    be = model.model_fields[key].description
    return f"{path}: {header} {key} must be {be}" + (f"; {model.USAGE}" if model.USAGE else "")


def _header(table: str) -> str:
    return f"[[{table}]]" if table in ("spec", "node", "pool") else f"[{table}]"


def _listed(names: Any) -> str:
    """``a, b and c``."""
    names = list(names)
    return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else "".join(names)
