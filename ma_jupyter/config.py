"""Paths, the spec catalog and the node inventory.

Everything lives under ``$MA_JUPYTER_HOME`` (default ``~/.ma_jupyter``)::

    jobs.db          SQLite (WAL): jobs, events, the queue
    service.json     url, owner's token, proxy token, pid of the running service (mode 0600)
    service.log      the service's own log
    cluster.toml     optional: [[spec]] and [[node]] tables replacing the defaults, [backend]
    jobs/<id>/       one folder per job: logs/, nodes/<node>/ (per-node files)
    prepared/        data preparation's copies of datasets (:func:`prepared_root`; ``[data] root`` moves them)

The folder itself, ``service.json`` and ``service.log`` are named by :mod:`ma_jupyter.statehome`
(re-exported here), which a command line imports without this module.

``cluster.toml`` is read by :func:`read_cluster_file` only; each room that applies one of its
tables (``[users]``, ``[mounts]``, ``[data]``, ``[resources]``...) asks it for the file's tables.

``[backend]`` chooses what runs the nodes (:func:`load_backend`): ``kind = "local"`` (the
default: processes on this machine, the inventory from ``[[node]]``) or ``kind = "ray"`` with
``address = "HOST:PORT"`` (an existing Ray cluster, whose nodes are the inventory).

Without a ``cluster.toml`` the cluster is derived from this machine (:func:`default_nodes`, :func:`default_specs`):
a few simulated nodes that each see every core (the nodes are processes on one host).  Where the
machine has cards (:mod:`ma_jupyter.accelerators`: NVML / ``nvidia-smi``, ``npu-smi``), every
simulated node lists all of them with their model, memory and driver version, and the specs are
``gpu.1``, ``gpu.2``, ``gpu.4``... up to the machine's count; the scheduler gives each real card to
one node at a time, so the nodes split the cards between them (``--nodes 2 --spec gpu.4`` on
eight cards: two nodes of four).  Without cards, the specs declare emulated cards (indices
only, no device) so the scheduler and the SLOTS logic work without hardware.

A ``[[node]]`` of ``cluster.toml`` may say ``emulated = true`` (indices only) or ``false`` (real
cards: their device nodes are bound into the sandbox); without it, its cards are real when this
machine shows that type's device nodes.  ``devices = [2, 3]`` names the machine's cards it has
(default ``0..accelerators-1``).

Why one module (over 600 lines): it is the one reader of ``cluster.toml`` and the owner of every
setting's defaults and checks (the house rule: new settings are read only here), so its sections
grow with the settings; the home folder's names are ``statehome.py``'s, the file's schema
``cluster_schema.py``'s.
"""

from __future__ import annotations

import os
import re
import shlex
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from . import accelerators
from .errors import InvalidSpec
from .jobdir import JobDir, check_job_id
from .statehome import ENV_HOME, ENV_PROJECT_DIR, home, runtime_file, service_log  # noqa: F401 (re-exported)
from .wire import is_object_uri

if TYPE_CHECKING:  # the models are imported where a spec or node is made: a client reads the
    # home's paths from here without pydantic
    from .models import Node, Spec


def db_path() -> Path:
    """The SQLite database of the job service."""
    return home() / "jobs.db"


def jobs_root() -> Path:
    """The folder holding one folder per job, created on first use."""
    path = home() / "jobs"
    path.mkdir(parents=True, exist_ok=True)
    return path


def jobdir(job_id: str) -> JobDir:
    """The folder of one job (logs, per-node files); never outside :func:`jobs_root`."""
    return JobDir(jobs_root() / check_job_id(job_id))


def outputs_folder(job_id: str, outputs: str | None) -> str:
    """The host folder a job shows at ``/workspace/outputs``: its spec's ``outputs``, else the
    default, ``outputs/`` of its job folder (:attr:`JobDir.outputs`), which is also where a job
    whose outputs go to object storage (``s3://``) writes before they are uploaded."""
    return str(jobdir(job_id).outputs) if not outputs or is_object_uri(outputs) else outputs


def prepared_root(path: Path | None = None) -> Path:
    """The store of data preparation's copies (``service/prepared.py`` owns what is inside):
    ``[data] root`` of ``cluster.toml`` (default :func:`cluster_file`), the folder an admin
    chose for them (fast storage), else ``<home>/prepared``.

    Raises:
        InvalidSpec: ``root`` is not an absolute path (the message names the file and the key).
    """
    path = path or cluster_file()
    root = read_cluster_file(path).get("data", {}).get("root")
    if root is None:
        return home() / "prepared"
    if not isinstance(root, str) or not os.path.isabs(root):
        raise InvalidSpec(
            f"{path}: [data] root {root!r}: give an absolute folder for prepared copies "
            '(e.g. root = "/fast/ma-prepared")'
        )
    return Path(os.path.normpath(root))


#: the admin's file of this home (see the module docstring)
CLUSTER_FILE = "cluster.toml"


def cluster_file() -> Path:
    """This home's ``cluster.toml`` (it need not exist)."""
    return home() / CLUSTER_FILE


#: the most bytes a ``cluster.toml`` may hold (its every read is held in memory at once)
MAX_CLUSTER_FILE_BYTES = 4 * 1024 * 1024


def read_cluster_file(path: Path | None = None) -> dict:
    """The tables of ``cluster.toml`` (default :func:`cluster_file`), read afresh on each call so
    an admin's edit applies without a restart; ``{}`` when there is no file.  Every table and
    key is checked against the one schema, :mod:`ma_jupyter.cluster_schema` (unknown keys and
    wrong types refused); each caller applies its own table's defaults and meanings.

    Raises:
        InvalidSpec: the file cannot be read, is over :data:`MAX_CLUSTER_FILE_BYTES` or is
            not TOML ("<path> is not a valid cluster file: ...", nesting too deep for the
            parser included), or breaks the schema (the message names the file, the table and the key).
    """
    import tomllib  # here: a client reading the home's paths never parses TOML

    path = path or cluster_file()
    if not path.exists():
        return {}
    try:
        # opened without blocking (a FIFO there would hang every read until a writer came) and
        # read only as a regular file, at most one byte past the cap: a huge file never fills memory
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise InvalidSpec(f"{path} is not a regular file: write the cluster's settings in one")
            raw = fh.read(MAX_CLUSTER_FILE_BYTES + 1)
        if len(raw) > MAX_CLUSTER_FILE_BYTES:
            raise InvalidSpec(
                f"{path} is over {MAX_CLUSTER_FILE_BYTES} bytes, the most a cluster file may hold: "
                "keep it to its settings, specs and nodes"
            )
        data = tomllib.loads(raw.decode())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise InvalidSpec(f"{path} is not a valid cluster file: {exc}") from exc
    except RecursionError:  # tomllib recurses once per nested array or inline table
        raise InvalidSpec(
            f"{path} is not a valid cluster file: its arrays or inline tables are nested too deep "
            "(no setting takes more than two levels)"
        ) from None
    from .cluster_schema import check  # here: pydantic's models are built for a service only

    return check(data, path)


def _memory_gb() -> float:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return 8.0


#: simulated nodes of the default cluster
DEFAULT_NODES = 4


def card_counts(total: int) -> list[int]:
    """The card counts the default specs offer on a machine of ``total`` cards: 1, 2, 4...
    below it, and ``total`` itself (8 cards: 1, 2, 4, 8; 6 cards: 1, 2, 4, 6)."""
    counts, k = [], 1
    while k < total:
        counts.append(k)
        k *= 2
    return [*counts, total] if total else []


def card_specs(cards: list[accelerators.Card], emulated: bool, count: int = DEFAULT_NODES) -> list[Spec]:
    """One spec per count of :func:`card_counts` for the machine's ``cards`` of one type: its
    share of the cores and of a simulated node's memory (at least 8 GB where the node has it: a
    CUDA process alone holds a few GB), the driver version the cards run."""
    from .models import Spec

    first = cards[0]
    cores = os.cpu_count() or 1
    node_memory = round(_memory_gb() / count, 1)
    specs = []
    for k in card_counts(len(cards)):
        cpus = max(1, cores * k // len(cards))
        memory = round(min(node_memory, max(8.0, node_memory * k / len(cards))), 1)
        what = f"{k} × {first.model}" + (f" ({first.memory_mb / 1024:.0f} GB)" if first.memory_mb else "")
        specs.append(
            Spec(
                name=f"{first.type}.{k}",
                cpus=cpus,
                memory_gb=memory,
                accelerators=k,
                accelerator_type=first.type,  # type: ignore[arg-type]
                emulated=emulated,
                driver_versions=[first.driver_version] if first.driver_version else [],
                description=f"{what}{' emulated' if emulated else ''}, {cpus} cores, {memory:g} GB",
            )
        )
    return specs


def cpu_specs() -> list[Spec]:
    """The CPU specs of every default cluster."""
    from .models import Spec

    return [
        Spec(name="cpu.small", cpus=1, memory_gb=2, description="1 core, 2 GB"),
        Spec(name="cpu.medium", cpus=2, memory_gb=4, description="2 cores, 4 GB"),
        Spec(name="cpu.ps", cpus=1, memory_gb=1, description="parameter server: 1 core, 1 GB"),
    ]


def machine_specs(count: int = DEFAULT_NODES) -> list[Spec]:
    """The default cluster's whole-node and whole-machine CPU specs: ``cpu.node`` (every core and
    one simulated node's share of the memory) and ``cpu.all`` (every core and all of this
    machine's memory, placed only while the other simulated nodes hold no memory:
    :attr:`Cluster.machine_memory_gb`)."""
    from .models import Spec

    cores = os.cpu_count() or 1
    memory = _memory_gb()
    node = round(memory / count, 1)
    return [
        Spec(
            name="cpu.node",
            cpus=cores,
            memory_gb=node,
            description=f"a whole simulated node: {cores} cores, {node:g} GB",
        ),
        Spec(
            name="cpu.all",
            cpus=cores,
            memory_gb=memory,
            description=f"the whole machine: {cores} cores, {memory:g} GB",
        ),
    ]


def default_specs() -> list[Spec]:
    """Specs of the default cluster: the CPU specs and :func:`machine_specs`, plus one spec per
    card count of each card type this machine has (:func:`card_specs`), or the emulated
    ``gpu.emu-2``/``npu.emu-2`` where it has none."""
    found = accelerators.detect_all()
    if found:
        specs = cpu_specs() + machine_specs()
        for kind, cards in found.items():
            specs += card_specs(cards, emulated=not accelerators.has_device_nodes(kind))
        return specs
    return cpu_specs() + machine_specs() + emulated_specs()


def emulated_specs() -> list[Spec]:
    """The emulated card specs of a default cluster on a machine without cards."""
    from .models import Spec

    return [
        Spec(
            name="gpu.emu-2",
            cpus=1,
            memory_gb=2,
            accelerators=2,
            accelerator_type="gpu",
            emulated=True,
            driver_versions=["535.0"],
            description="2 emulated GPU cards (indices only)",
        ),
        Spec(
            name="npu.emu-2",
            cpus=1,
            memory_gb=2,
            accelerators=2,
            accelerator_type="npu",
            emulated=True,
            description="2 emulated Ascend cards (indices only)",
        ),
    ]


#: the pool of a cluster that defines no ``[[pool]]`` tables: all of its nodes, dedicated
DEFAULT_POOL = "default"


def default_nodes(count: int = DEFAULT_NODES) -> list[Node]:
    """Simulated nodes of this machine: each sees every core and a share of the memory; every
    one lists all of the machine's cards of one type (types taken in turn), or 4 emulated cards
    (GPU and NPU in turn) where it has none."""
    import platform

    from .models import Node

    cores = float(os.cpu_count() or 1)
    memory = _memory_gb()

    def simulated(i: int) -> dict:
        # Simulated nodes share one host: oversubscribe cores so multi-node jobs fit on 2
        # cores, but keep memory honest by splitting it.
        return {
            "name": f"node-{i}",
            "os": platform.system(),
            "kernel": platform.release(),
            "cpus": max(cores, 4.0),
            "memory_gb": round(memory / count, 1),
            "pools": [DEFAULT_POOL],
        }

    found = accelerators.detect_all()
    if found:
        kinds = sorted(found)
        nodes = []
        for i in range(count):
            cards = found[kinds[i % len(kinds)]]
            first = cards[0]
            nodes.append(
                Node(
                    **simulated(i),
                    accelerators=len(cards),
                    accelerator_type=first.type,  # type: ignore[arg-type]
                    accelerator_model=first.model,
                    accelerator_memory_gb=round(first.memory_mb / 1024, 1),
                    devices=[c.index for c in cards],
                    driver_version=first.driver_version or None,
                    emulated=not accelerators.has_device_nodes(first.type),
                )
            )
        return nodes
    return [
        Node(
            **simulated(i),
            accelerators=4,
            accelerator_type="gpu" if i % 2 == 0 else "npu",
            driver_version="535.0" if i % 2 == 0 else None,
            emulated=True,
        )
        for i in range(count)
    ]


#: bytes per second a job must be writing on the jobs folder's disk, as it falls under
#: ``[limits] disk_reserve_mb``, to be ended for it; proportionally less the fuller the disk
#: (the supervisor's look and the node runner's, see :mod:`ma_jupyter.service.policies`)
DISK_FLOOD_RATE = 1 << 20


@dataclass(frozen=True)
class Limits:
    """The admin's caps on what a job may ask (``[limits]`` in ``cluster.toml``); the defaults
    are the wire model's own bounds."""

    max_restarts: int = 100  # fault_restart.max_restarts
    max_resumes: int = 100  # checkpoint_resume.max_resumes
    max_grace_period: float = 3600.0  # seconds: grace_period and checkpoint_resume.grace_period
    # seconds without a heartbeat from a node's runner before its node is marked faulty
    heartbeat_timeout: float = 10.0
    # seconds an elastic job runs on fewer nodes than asked before it may scale up again
    elastic_scale_up_interval: float = 300.0
    # hours a node of a --debug-terminal job whose command failed keeps its sandbox for the
    # debug terminal (its processes stopped, its files and mounts kept)
    debug_keep_hours: float = 4.0
    # processes and threads one node may have at once (its own count, not its account's: see
    # the node runner's rule 1)
    max_node_processes: int = 4096
    # megabytes a job's logs may take, all its nodes together; past it the job ends in error
    max_log_mb: float = 1024.0
    # megabytes kept free on the jobs folder's disk: under it, the job writing the most there is
    # ended, so one job's writing never ends another user's job or stops every submit
    disk_reserve_mb: float = 256.0
    # megabytes a node's job folders' disk must have free for the node to take jobs: under it
    # the node inspection marks the node faulty, and clears the mark once space returns
    node_disk_free_mb: float = 4.0
    # megabytes one TensorBoard may hold (its processes' resident memory together): past it
    # the board is ended with the reason, never the service
    tensorboard_memory_mb: float = 1024.0
    # TensorBoards one user may have started and running at once (reused boards count once)
    max_tensorboards_per_user: int = 4
    # queued jobs one user may have at once; a submit past it is refused (429)
    max_queued_jobs_per_user: int = 2000
    # bytes one job's spec may take, as stored (env, command, mounts...); past it a submit is
    # refused (413): with the queued bound, what one user's queue holds is bounded
    max_spec_bytes: int = 262144
    # what one user may hold open at once, per job and in all (service.session_caps): debug
    # terminals, dev environments and log followers (TensorBoards: max_tensorboards_per_user above) (long polls that wait)
    max_shells_per_job: int = 8
    max_shells_per_user: int = 16
    max_devenvs_per_job: int = 4
    max_devenvs_per_user: int = 8
    max_log_followers_per_job: int = 64
    max_log_followers_per_user: int = 128
    # minutes a running job may write nothing to its logs and use almost no CPU before it looks
    # hung (an alert in its events; stopped with --hang-policy stop); 0 turns the watch off; a
    # fraction is allowed (0.05: 3 seconds)
    hang_minutes: float = 30.0

    @classmethod
    def parse(cls, data: dict, path: Path) -> Limits:
        """The ``[limits]`` table; InvalidSpec naming a key that is unknown or not a positive
        number (:mod:`ma_jupyter.cluster_schema` checks it)."""
        from .cluster_schema import check

        check({"limits": data}, path)
        return cls(**data)


@dataclass
class Cluster:
    """The spec catalog, the node inventory the scheduler places jobs on, and the admin's caps."""

    specs: list[Spec] = field(default_factory=default_specs)
    nodes: list[Node] = field(default_factory=default_nodes)
    limits: Limits = field(default_factory=Limits)
    #: the resource pools (name -> dedicated): the ``[[pool]]`` tables; a cluster without them
    #: (this machine's default cluster too) is one organisation's own machines, one dedicated
    #: pool :data:`DEFAULT_POOL` holding every node (seed 002: checkpoint resume runs in a
    #: dedicated pool, :meth:`.scheduler.Scheduler.check`)
    pools: dict[str, bool] = field(default_factory=lambda: {DEFAULT_POOL: True})
    #: the memory the nodes share as one machine, in GB: this machine's, for the default
    #: inventory's simulated nodes (each lists its share); 0 for a ``cluster.toml``'s nodes.
    #: A task larger than a node's share may take a node holding nothing, while the memory held
    #: on all nodes stays within it (:meth:`.scheduler.Scheduler.fits_now`)
    machine_memory_gb: float = 0.0

    def spec(self, name: str) -> Spec:
        """The spec called ``name``; InvalidSpec naming the known ones otherwise."""
        for spec in self.specs:
            if spec.name == name:
                return spec
        known = ", ".join(s.name for s in self.specs)
        raise InvalidSpec(
            f"unknown spec {name!r}: choose one of {known} (see `ma-jupyter specs`)", field="specs"
        )

    def fits(self, spec: Spec, node: Node) -> bool:
        """Whether one job node of ``spec`` could ever run on ``node`` (ignoring current use)."""
        if spec.cpus > node.cpus or spec.memory_gb > max(node.memory_gb, self.machine_memory_gb):
            return False
        if spec.accelerators:
            if spec.accelerator_model and node.accelerator_model != spec.accelerator_model:
                return False
            return node.accelerator_type == spec.accelerator_type and node.accelerators >= spec.accelerators
        return True


def load_cluster(path: Path | None = None) -> Cluster:
    """The cluster from ``cluster.toml`` if present, else the defaults derived from this machine."""
    from .models import Node, Spec

    path = path or cluster_file()
    if not path.exists():
        return Cluster(machine_memory_gb=_memory_gb())
    data = read_cluster_file(path)
    try:
        specs = [Spec(**s) for s in data.get("spec", [])] or default_specs()
        nodes = [resolve_emulated(Node(**n)) for n in data.get("node", [])] or default_nodes()
    except ValueError as exc:
        raise InvalidSpec(f"{path} is not a valid cluster file: {exc}") from exc
    pools = _pools(data.get("pool", []), path)
    if not pools:  # no [[pool]]: every node is in the one dedicated pool
        pools = {DEFAULT_POOL: True}
        nodes = [n if n.pools else n.model_copy(update={"pools": [DEFAULT_POOL]}) for n in nodes]
    shared = 0.0 if data.get("node") else _memory_gb()  # the default simulated nodes share it
    return Cluster(
        specs=specs,
        nodes=nodes,
        limits=Limits.parse(data.get("limits", {}), path),
        pools=pools,
        machine_memory_gb=shared,
    )


def resolve_emulated(node: Node) -> Node:
    """``node`` with ``emulated`` decided: as the file says, else real when this machine shows
    device nodes of its card type (a node without cards: None, nothing to decide)."""
    if not node.accelerators or node.emulated is not None:
        return node
    return node.model_copy(update={"emulated": not accelerators.has_device_nodes(node.accelerator_type)})


def _pools(tables, path: Path) -> dict[str, bool]:
    """The ``[[pool]]`` tables (``name``, ``dedicated``, checked by the schema) as name ->
    dedicated."""
    return {table["name"]: table.get("dedicated", False) for table in tables}


#: the backends ``[backend] kind`` may name
BACKEND_KINDS = ("local", "ray")
#: what ``[backend] network`` may name (Ray's jobs' network)
RAY_NETWORKS = ("auto", "fence")


@dataclass(frozen=True)
class BackendConfig:
    """What runs the nodes of jobs: ``[backend]`` of ``cluster.toml``, or the service's options.

    Attributes:
        kind: ``local`` (processes on this machine) or ``ray`` (an existing Ray cluster).
        address: the Ray cluster's address (``HOST:PORT`` of its GCS, or ``auto``); Ray only.
        node_root: the folder holding the job folders on each Ray node (default: this service's
            ``jobs/`` folder, at the same path on every node); Ray only.
        network: a job's network on Ray (docs/network.md): ``auto`` (a namespace per node,
            the machines joined by the attempt's overlay, where every machine of the attempt can make one,
            else the fence) or ``fence`` (always the fence: jobs keep the machines' outbound
            network, with the fence's gaps); Ray only.
    """

    kind: str = "local"
    address: str | None = None
    node_root: str | None = None
    network: str = "auto"


def load_notify(path: Path | None = None) -> str | None:
    """The command of ``[notify]`` in ``cluster.toml`` (run for alerts and jobs' terminal
    states, :mod:`ma_jupyter.service.notify`), or None without one.

    Raises:
        InvalidSpec: ``[notify]`` is not a table of ``command`` (one non-empty string) and
            ``webhook_allow`` (:func:`load_webhook_allow`; the schema checks both), or the
            command cannot be split into words.
    """
    path = path or cluster_file()
    table = read_cluster_file(path).get("notify")
    if table is None or "command" not in table:
        return None
    try:
        shlex.split(table["command"])
    except ValueError as exc:
        raise InvalidSpec(f"{path}: [notify] command cannot be split into words: {exc}") from exc
    return table["command"]


def load_webhook_allow(path: Path | None = None) -> tuple[str, ...]:
    """``[notify] webhook_allow`` of ``cluster.toml``: the ``HOST`` or ``HOST:PORT``
    destinations (lower case) users' webhooks may reach although they resolve to loopback,
    link-local, private, multicast or unspecified addresses (:mod:`ma_jupyter.service.webhooks`
    rule 1); ``()`` without one.

    Raises:
        InvalidSpec: ``webhook_allow`` is not a list of non-empty strings (the schema's check).
    """
    path = path or cluster_file()
    table = read_cluster_file(path).get("notify")
    if table is None or "webhook_allow" not in table:
        return ()
    return tuple(a.strip().lower() for a in table["webhook_allow"])


@dataclass(frozen=True)
class StorageConfig:
    """``[storage]`` of ``cluster.toml``: object storage for datasets, models and outputs.

    Attributes:
        obs_endpoint: the endpoint of ``obs://`` URIs (OBS's S3-compatible API, e.g.
            ``https://obs.cn-north-4.myhuaweicloud.com``); None: a user must give
            ``AWS_ENDPOINT_URL``.
        upload_interval: seconds between two uploads of a running job's changed outputs to its
            ``s3://`` outputs prefix.
        allow_endpoints: the users' ``AWS_ENDPOINT_URL`` values the service may reach though
            they resolve to a loopback, link-local or private address (an in-house S3 server);
            any other such endpoint is refused.
    """

    obs_endpoint: str | None = None
    upload_interval: float = 60.0
    allow_endpoints: tuple[str, ...] = ()


def load_storage(path: Path | None = None) -> StorageConfig:
    """The ``[storage]`` table of ``cluster.toml`` (re-read on each call).

    Raises:
        InvalidSpec: an unknown key, an endpoint that is not an http(s) URL, an interval that
            is not a positive number of seconds.
    """
    path = path or cluster_file()
    table = read_cluster_file(path).get("storage") or {}  # keys and types: the schema's
    allowed = table.get("allow_endpoints", [])
    if not all(a.startswith(("http://", "https://")) for a in allowed):
        raise InvalidSpec(f"{path}: [storage] allow_endpoints must be a list of http:// or https:// URLs")
    endpoint = table.get("obs_endpoint")
    if endpoint is not None and (
        not isinstance(endpoint, str) or not endpoint.startswith(("http://", "https://"))
    ):
        raise InvalidSpec(
            f"{path}: [storage] obs_endpoint must be an http:// or https:// URL, not {endpoint!r}"
        )
    interval = table.get("upload_interval", 60.0)
    if isinstance(interval, bool) or not isinstance(interval, int | float) or not 0 < interval <= 86400:
        raise InvalidSpec(
            f"{path}: [storage] upload_interval must be seconds between 0 and 86400, not {interval!r}"
        )
    return StorageConfig(endpoint, float(interval), tuple(allowed))


def load_backend(path: Path | None = None) -> BackendConfig:
    """The ``[backend]`` table of ``cluster.toml`` (the local backend without one).

    Raises:
        InvalidSpec: the table names an unknown kind, or ``ray`` without an address.
    """
    path = path or cluster_file()
    if not path.exists():
        return BackendConfig()
    table = read_cluster_file(path).get("backend", {})
    if not isinstance(table, dict):
        raise InvalidSpec(f"{path}: [backend] must be a table")
    return backend_config(
        str(table.get("kind", "local")),
        table.get("address"),
        table.get("node_root"),
        table.get("network", "auto"),
        source=f"{path} [backend]",
    )


def backend_config(
    kind: str,
    address: str | None = None,
    node_root: str | None = None,
    network: str = "auto",
    *,
    source: str = "the options",
) -> BackendConfig:
    """A checked :class:`BackendConfig`.

    Raises:
        InvalidSpec: an unknown kind, ``ray`` without an address, a relative ``node_root``, an
            unknown ``network``.
    """
    if kind not in BACKEND_KINDS:
        raise InvalidSpec(f"{source}: unknown backend {kind!r}: choose one of {', '.join(BACKEND_KINDS)}")
    if kind == "ray" and not address:
        raise InvalidSpec(
            f"{source}: the ray backend needs the cluster's address "
            '(address = "HOST:PORT", or --ray-address HOST:PORT)'
        )
    if node_root is not None and not (isinstance(node_root, str) and os.path.isabs(node_root)):
        raise InvalidSpec(f"{source}: node_root must be an absolute path")
    if network not in RAY_NETWORKS:
        raise InvalidSpec(f"{source}: unknown network {network!r}: choose one of {', '.join(RAY_NETWORKS)}")
    return BackendConfig(
        kind=kind, address=str(address) if address else None, node_root=node_root, network=network
    )


@dataclass(frozen=True)
class EgressRule:
    """One destination of ``[network] egress`` (:func:`load_egress`).

    Attributes:
        text: the entry as the admin wrote it (for messages).
        host: a host name (resolved by the service when an attempt starts), else None.
        network: an IPv4 address or network (``"10.0.0.0/8"``, ``"192.0.2.7/32"``), else None.
        ports: ``(low, high)`` TCP port ranges allowed; ``()``: every port.
    """

    text: str
    host: str | None
    network: str | None
    ports: tuple[tuple[int, int], ...] = ()


#: what a host name of ``[network] egress`` may look like (RFC 1123 labels)
_HOST_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")
#: the most destinations ``[network] egress`` may list (each is a rule in every attempt's switch)
MAX_EGRESS_RULES = 256


def _egress_rule(entry: object, path: Path) -> EgressRule:
    """One entry of ``[network] egress``; InvalidSpec naming the file, the key and the entry."""
    import ipaddress

    def bad(why: str) -> InvalidSpec:
        return InvalidSpec(
            f"{path}: [network] egress entry {str(entry)[:200]!r}: {why}; write HOST, ADDRESS or "
            'CIDR with optional ports, e.g. egress = ["10.0.0.0/8:443", "pypi.mirror.local:3128", '
            '"192.0.2.7", "198.51.100.0/24:80,8000-8100"], or egress = "none"'
        )

    if not isinstance(entry, str) or not entry.strip():
        raise bad("each entry is a non-empty string")
    text = entry.strip().lower()
    where, _, port_text = text.partition(":")
    ports: list[tuple[int, int]] = []
    if port_text:
        for part in port_text.split(","):
            low, _, high = part.strip().partition("-")
            if not (low.isdigit() and (not high or high.isdigit())):
                raise bad(f"{part.strip()!r} is not a port or a range of ports (LOW-HIGH)")
            first, last = int(low), int(high or low)
            if not 1 <= first <= last <= 65535:
                raise bad(f"ports run from 1 to 65535, low to high, not {part.strip()!r}")
            ports.append((first, last))
    if where.replace(".", "").replace("/", "").isdigit():
        try:
            network = ipaddress.IPv4Network(where, strict=False)
        except ValueError as exc:
            raise bad(f"not an IPv4 address or network ({exc})") from None
        special = [
            ("the machine's own loopback", ipaddress.IPv4Network("127.0.0.0/8")),
            ("'this network'", ipaddress.IPv4Network("0.0.0.0/8")),
            ("every job's own network", ipaddress.IPv4Network("10.254.0.0/16")),
        ]
        for what, net in special:
            if network.subnet_of(net):
                raise bad(f"it lies in {net} ({what}), which jobs never reach this way")
        return EgressRule(entry.strip(), None, str(network), tuple(ports))
    labels = where.rstrip(".").split(".")
    if len(where) > 253 or not all(_HOST_LABEL.match(label) for label in labels):
        raise bad("not a host name, an IPv4 address or a CIDR (IPv6 is not supported)")
    if where.rstrip(".") == "localhost" or where.endswith(".localhost"):
        raise bad("localhost is the machine itself, which jobs never reach")
    return EgressRule(entry.strip(), where.rstrip("."), None, tuple(ports))


def load_egress(path: Path | None = None) -> tuple[EgressRule, ...] | None:
    """``[network] egress`` of ``cluster.toml``: where a job's nodes may connect beyond their
    own (docs/network.md, *Egress by policy*); None for ``"none"`` (the default: nothing).

    An entry is ``WHERE[:PORTS]``: ``WHERE`` an IPv4 address, a CIDR or a host name (resolved
    by the service when each attempt starts), ``PORTS`` a comma list of ports and ``LOW-HIGH``
    ranges (none: every port).

    Raises:
        InvalidSpec: ``[network]`` has another key, ``egress`` is neither ``"none"`` nor a list
            of at most :data:`MAX_EGRESS_RULES` such entries, or an entry is malformed or lies in
            the machine's loopback or the job network; the message names the file and the key.
    """
    path = path or cluster_file()
    table = read_cluster_file(path).get("network")
    if table is None:
        return None
    if not isinstance(table, dict) or set(table) - {"egress", *EGRESS_BOUND_KEYS}:
        raise InvalidSpec(
            f'{path}: [network] takes egress (egress = "none" or a list of destinations) and '
            f"{', '.join(EGRESS_BOUND_KEYS)}"
        )
    egress = table.get("egress", "none")
    if egress == "none":
        return None
    if not isinstance(egress, list) or len(egress) > MAX_EGRESS_RULES:
        raise InvalidSpec(
            f'{path}: [network] egress is "none" or a list of at most {MAX_EGRESS_RULES} destinations, '
            f'e.g. egress = ["10.0.0.0/8:443", "pypi.mirror.local:3128"], not {str(egress)[:200]!r}'
        )
    return tuple(_egress_rule(entry, path) for entry in egress)


@dataclass(frozen=True)
class EgressBounds:
    """What one user's jobs may hold of the egress gate's relays (``[network]``,
    :func:`load_egress_bounds`; the gate is ``nodehost/egress.py``).

    Attributes:
        idle_timeout: seconds a relayed connection may stay silent both ways before it is
            closed (``egress_idle_timeout``).
        connect_timeout: seconds the gate tries to reach a destination before the job's
            connection is closed (``egress_connect_timeout``).
        relays_per_user: relayed connections one user's attempts may hold at once, all
            together (``egress_relays_per_user``); one more is reset.
    """

    idle_timeout: float = 300.0
    connect_timeout: float = 10.0
    relays_per_user: int = 128


#: the keys of ``[network]`` besides ``egress``, each a field of :class:`EgressBounds`, with the
#: range it must lie in
EGRESS_BOUND_KEYS = {
    "egress_idle_timeout": ("idle_timeout", 1, 86400),
    "egress_connect_timeout": ("connect_timeout", 1, 300),
    "egress_relays_per_user": ("relays_per_user", 1, 65536),
}


def load_egress_bounds(path: Path | None = None) -> EgressBounds:
    """``[network]``'s bounds on the egress gate's relays (:class:`EgressBounds`; a key left out
    keeps its default).

    Raises:
        InvalidSpec: a value out of its range; the message names the file, the key and the range.
    """
    path = path or cluster_file()
    table = read_cluster_file(path).get("network") or {}
    values = {}
    for key, (name, low, high) in EGRESS_BOUND_KEYS.items():
        if key not in table:
            continue
        value = table[key]
        if not low <= value <= high:
            raise InvalidSpec(f"{path}: [network] {key} must lie between {low} and {high}, not {value!r}")
        values[name] = value
    return EgressBounds(**values)
