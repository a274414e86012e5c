"""One Ray attempt's launches: made as the local backend makes them, then sent to each machine
(item 4 of :mod:`.backend`).

1. **dry run** (:func:`dry_run`) -- the local backend's launches (:func:`~ma_jupyter.nodehost.launch.node_launches`),
   each in its Ray node's isolation, with the job folder on the nodes, the datasets and models
   downloaded there mounted from each node's folder, and the algorithm folder read from the
   node's shipped copy (:func:`shipped`: ``nodes/<node>/algorithm``, :mod:`.ship`);
2. **pack** -- the algorithm folder is packed once per attempt and source; an archive up to
   :data:`INLINE_ARCHIVE` bytes travels inside each call, a bigger one is put in Ray's object
   store once and fetched by each machine that unpacks it;
3. **send** (:func:`send`) -- one agent call per Ray node of the attempt with all its nodes
   (one secret shared by the attempt's nodes only, its overlay segment or the cluster's ports
   to fence off), all at once, each answered within :data:`LAUNCH_TIMEOUT` seconds; the runs
   come back in the attempt's node order, with the first error (the backend then stops every
   node of the attempt: all or nothing).
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from ...models import Mount, NodeLaunch, NodeRun
from ...modes.base import NodePlan
from ...nodehost.host_policy import load_policy
from ...nodehost.launch import node_launches
from ...nodehost.mounts import WORKDIR_KIND, mounts_for
from ...nodehost.overlay import Overlay
from ..base import Attempt
from . import ship
from .agents import Agents

LAUNCH_TIMEOUT = 180.0  # seconds for an agent to unpack the algorithm and start a node
#: bytes up to which the shipped algorithm folder travels inside the launch calls (below Ray's
#: limit for arguments it inlines, 100 KiB)
INLINE_ARCHIVE = 64 << 10


def dry_run(on_nodes: Attempt, kinds: list[str], fetched: list[Mount]) -> list[NodeLaunch]:
    """Rule 1: the launches of ``on_nodes`` (without the downloaded datasets and models, whose
    ``fetched`` mounts are added), each node's in its Ray node's isolation ``kinds``."""
    made = {kind: node_launches(on_nodes, kind) for kind in set(kinds)}
    launches = []
    for i, (plan, kind) in enumerate(zip(on_nodes.plans, kinds, strict=True)):
        launch = made[kind][i]
        if fetched:
            launch = launch.model_copy(update={"mounts": [*launch.mounts, *fetched]})
        launches.append(shipped(on_nodes, plan, launch))
    return launches


def shipped(on_nodes: Attempt, plan: NodePlan, launch: NodeLaunch) -> NodeLaunch:
    """``launch`` reading the algorithm folder from the node's own shipped copy: the source of
    an algorithm mount shown itself (writable, or too big for a working copy), or the
    original a working copy is made from."""
    mounts = []
    copy = str(ship_target(on_nodes, launch.name))
    for mount in launch.mounts:
        original = _shipped_original(mount)
        if original is not None:
            size = ship.folder_size(original)
            field = "source" if mount.kind == "algorithm" else "copy_of"
            mount = Mount(**{**mount.model_dump(), field: copy})
            note = f"algorithm folder ({size / 1e6:.1f} MB) shipped to Ray node {plan.task.host}: {copy}"
            launch = launch.model_copy(update={"notes": [*launch.notes, note]})
        mounts.append(mount)
    return launch.model_copy(update={"mounts": mounts})


def send(
    ray: Any,
    agents: Agents,
    on_nodes: Attempt,
    launches: list[NodeLaunch],
    overlays: dict[str, Overlay] | None,
    cluster_ports: Any,
) -> tuple[list[NodeRun], BaseException | None]:
    """Rules 2-3: the runs each machine started (in the attempt's node order), and the first
    error of a machine's call (None: every one answered).

    Args:
        on_nodes: the attempt, with its job folder on the Ray nodes and without the datasets and
            models downloaded there (as the dry run made them).
        overlays: each Ray node's part of the attempt's overlay; None: fenced, off ``cluster_ports``.
    """
    job_secret = secrets.token_hex(16)  # shared by this attempt's nodes only (see NodeHost.launch)
    archives: dict[str, Any] = {}  # one packed folder per algorithm source
    by_host: dict[str, list[tuple[NodeLaunch, str | None, str]]] = {}
    for plan, launch in zip(on_nodes.plans, launches, strict=True):
        source = None
        shipped_to = ship_target(on_nodes, launch.name)
        if any(m.source == str(shipped_to) or m.copy_of == str(shipped_to) for m in launch.mounts):
            source = _algorithm_source(on_nodes, plan)
            if source is not None and source not in archives:
                packed = ship.pack(source)
                # A small archive travels inside each call (Ray inlines small arguments):
                # fetching an object from another node's store costs a round trip of
                # ~15 ms, on the start of every node but the first.  A big one is put in
                # the object store once and fetched by each machine that unpacks it.
                archives[source] = packed if len(packed) <= INLINE_ARCHIVE else ray.put(packed)
        by_host.setdefault(plan.task.host, []).append((launch, source, str(shipped_to)))
    calls = []
    for host, items in by_host.items():
        # each machine gets the archives its own nodes unpack, as top-level arguments (Ray
        # resolves those, not references inside a list)
        used = list(dict.fromkeys(source for _, source, _ in items if source is not None))
        calls.append(
            agents.agent_of(host).launch.remote(
                on_nodes,
                [launch for launch, _, _ in items],
                job_secret,
                [(None if source is None else used.index(source), folder) for _, source, folder in items],
                cluster_ports,
                overlays[host] if overlays else None,
                *(archives[source] for source in used),
            )
        )
    runs: list[NodeRun] = []
    error: BaseException | None = None
    for ref in calls:
        try:
            runs.extend(agents.get(ref, LAUNCH_TIMEOUT))
        except Exception as exc:
            error = error or exc
    order = {p.name: i for i, p in enumerate(on_nodes.plans)}
    runs.sort(key=lambda run: order[run.name])
    return runs, error


def ship_target(on_nodes: Attempt, node: str) -> Path:
    """Where a job node's copy of the algorithm folder goes on its Ray node."""
    return on_nodes.jobdir.node(node).root / ship.FOLDER


def _shipped_original(mount: Mount) -> str | None:
    """The folder on this machine a launch's mount reads the algorithm from, or None: an
    algorithm mount shown itself, or the original of a working copy."""
    if mount.kind == "algorithm":
        return mount.source
    if mount.kind == WORKDIR_KIND and mount.copy_of:
        return mount.copy_of
    return None


def _algorithm_source(on_nodes: Attempt, plan: NodePlan) -> str | None:
    """The folder on this machine that a node's algorithm mount ships (None: no such mount)."""
    mounts = mounts_for(
        on_nodes.spec,
        job_dir=on_nodes.jobdir.root,
        outputs_subdir=plan.outputs_subdir,
        algorithm=plan.algorithm,
        policy=load_policy(),
    )
    return next((m.source for m in mounts if m.kind == "algorithm"), None)
