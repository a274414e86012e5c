"""Placement and queue order: where each task of a job runs, and whether it can start now.

The cluster is the catalog of specs from :mod:`ma_jupyter.config` and the node inventory: the
backend's own when it has one (the Ray backend: the Ray cluster's nodes, live), else the
``[[node]]`` tables of ``cluster.toml``.  A job lists one or more equivalent specs; the first one whose tasks all fit right now wins.
Workers (and the TensorFlow chief) are spread one per inventory node, like a STRICT_SPREAD
placement group; parameter servers take the small ``cpu.ps`` resources and may share a node
(in the ModelArts TensorFlow layout each ps goes beside its worker, the two splitting the spec).
The queue is ordered by priority (very-urgent, urgent, normal), then age (:mod:`.queue`).  The
first queued job that does not fit (the *head*) gets a :class:`Reservation`: the nodes it will
take once enough running jobs end, by their durations.  A job behind it may start meanwhile
(backfill) only if it cannot delay the head (EASY backfill, :meth:`Scheduler.backfill`).
Real cards (a node with ``emulated = false``) are the machine's: nodes listing the same card
index of one type share that card, and it goes to one node at a time (:meth:`Scheduler.pooled`),
so simulated nodes of one machine split its cards between the jobs that run.
Nodes the service's inspection marks drained or faulty (:attr:`Scheduler.unusable`, kept by
:mod:`.health`) take no new placement; they still count as nodes that exist, so a job is never
refused at submit for a node that is only out for now.

Why one module (over 600 lines): placement, the head's reservation, backfill and card pooling
are one algorithm over one look at the inventory: a backfill is allowed only if the same fit
that starts a job shows it cannot delay the reservation, so the fit, the reservation and the
pools share their state and move together; the queue's order is :mod:`.queue`'s, the nodes'
health :mod:`.health`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field

from ..config import Cluster
from ..errors import InvalidSpec
from ..models import JobSpec, Mode, Node, Spec
from ..modes.base import MODELARTS_TF_PORTS, PS_SPEC_NAME, Placement, TaskSlot, ps_beside_workers, task_roles

PS_SPEC = Spec(name=PS_SPEC_NAME, cpus=1, memory_gb=1, description="parameter server")


@dataclass
class NodeUse:
    """What running jobs hold on one inventory node."""

    cpus: float = 0.0
    memory_gb: float = 0.0
    cards: set[int] = field(default_factory=set)
    usage: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Running:
    """A running job's placement and when it will end (``end``: epoch seconds, from its start
    and duration; None when it has no duration, so it may run for ever)."""

    placement: Placement
    end: float | None


@dataclass(frozen=True)
class Reservation:
    """Where and from when the head of the queue will run.

    ``start`` is the estimated start (epoch seconds; ``inf`` when running jobs without a
    duration hold what it needs), ``placement`` the nodes and cards it will take then.
    """

    job_id: str
    start: float
    placement: Placement


class Scheduler:
    """Pure placement logic over the cluster; the supervisor supplies what is in use.

    Args:
        cluster: the spec catalog (and the inventory when ``inventory`` gives None).
        inventory: the backend's live inventory (:meth:`ma_jupyter.backends.base.Backend.inventory`);
            asked at each placement, so nodes that join or leave count at once.
    """

    def __init__(self, cluster: Cluster, inventory: Callable[[], list[Node] | None] | None = None):
        self.cluster = cluster
        self._inventory = inventory
        #: node name -> ``drained`` or ``faulty``: no new placement goes there (the supervisor
        #: hands in its :class:`.health.NodeHealth`'s live mapping)
        self.unusable: dict[str, str] = {}

    def nodes(self) -> list[Node]:
        """The inventory now: the backend's, else the cluster file's."""
        if self._inventory is not None:
            live = self._inventory()
            if live is not None:
                return live
        return self.cluster.nodes

    # ------------------------------------------------------------------------ validation

    def check(self, spec: JobSpec) -> None:
        """Refuse a job that could never run on this cluster, saying why (before it is queued)."""
        specs = [self.cluster.spec(name) for name in spec.specs]  # unknown names raise
        inventory = self.nodes()
        self._check_limits(spec)
        if spec.driver_version:  # seed 002: a driver version is chosen for GPU and MLU specs only
            other = [s.name for s in specs if s.accelerator_type not in ("gpu", "mlu")]
            if other:
                raise InvalidSpec(
                    f"driver_version applies to GPU and MLU specs only; {', '.join(other)} "
                    f"{'is' if len(other) == 1 else 'are'} not: drop driver_version or choose GPU/MLU specs",
                    field="driver_version",
                )
        self._check_pool(spec)
        if spec.node_name and spec.node_name not in {n.name for n in inventory}:
            known = ", ".join(n.name for n in inventory)
            raise InvalidSpec(f"unknown node {spec.node_name!r}: choose one of {known}", field="node_name")
        reasons = []
        for s in specs:
            candidates = self._candidates(spec, s, inventory, usable_only=False)
            needed = spec.nodes if not spec.node_name and spec.type.value != "batch" else 1
            if spec.checkpoint_resume and spec.checkpoint_resume.elastic_min_nodes:
                needed = min(needed, spec.checkpoint_resume.elastic_min_nodes)
            needed += 1 if spec.mode is Mode.tensorflow and spec.chief else 0
            card_reason = self._cards_reason(s, inventory, candidates, needed)
            if len(candidates) >= needed and card_reason is None:
                return
            reasons.append(card_reason or f"{s.name}: {len(candidates)} node(s) can hold it, {needed} needed")
        offer = self.card_offer(inventory)
        raise InvalidSpec(
            "no spec of this job can ever be placed on this cluster (" + "; ".join(reasons) + "): "
            "choose other specs, fewer nodes, or drop node_name/driver_version/pool (see `ma-jupyter nodes`)"
            + (f"; this cluster offers {offer}" if offer else ""),
            field="specs",
        )

    def _cards_reason(
        self, flavor: Spec, inventory: list[Node], candidates: list[Node], needed: int
    ) -> str | None:
        """Why a spec with cards can never run ``needed`` nodes here, naming the cards there are
        (None: the cards are no obstacle)."""
        if not flavor.accelerators:
            return None
        kind = flavor.accelerator_type
        of_type = [
            n for n in inventory if n.accelerator_type == kind and n.accelerators and n.status != "down"
        ]
        if not of_type:
            return f"{flavor.name} asks for {flavor.accelerators} {kind} card(s) per node and no node has {kind} cards"
        most = max(of_type, key=lambda n: n.accelerators)
        if most.accelerators < flavor.accelerators:
            return (
                f"{flavor.name} asks for {flavor.accelerators} {kind} cards per node and the most any node "
                f"has is {most.accelerators} ({most.name}: {describe_cards(most)})"
            )
        pooled = {(n.accelerator_type, i) for n in candidates if n.emulated is False for i in n.card_indices}
        if (
            pooled
            and all(n.emulated is False for n in candidates)
            and needed * flavor.accelerators > len(pooled)
        ):
            return (
                f"{flavor.name} on {needed} node(s) needs {needed * flavor.accelerators} real {kind} cards "
                f"and the machine has {len(pooled)}, each on one node at a time"
            )
        return None

    def card_offer(self, inventory: list[Node] | None = None) -> str:
        """What the cluster offers in cards, for messages: each spec with cards that fits some
        node, and the cards of the nodes (\"gpu.1 (1 card); nodes: node-0..: 1 × NVIDIA H100 80GB
        HBM3\"); "" when nothing has cards."""
        inventory = self.nodes() if inventory is None else inventory
        specs = [
            s.name
            for s in self.cluster.specs
            if s.accelerators and any(self.cluster.fits(s, n) for n in inventory)
        ]
        cards = sorted({describe_cards(n) for n in inventory if n.accelerators})
        if not cards:
            return "no node with cards (CPU specs only)"
        return f"specs {', '.join(specs) or '(none that fits)'} on nodes with {'; '.join(cards)}"

    def _check_limits(self, spec: JobSpec) -> None:
        """Refuse what passes the admin's caps (``[limits]`` in ``cluster.toml``)."""
        limits = self.cluster.limits
        asked = [("grace_period", spec.grace_period, limits.max_grace_period, "max_grace_period")]
        if spec.fault_restart:
            asked.append(
                (
                    "fault_restart.max_restarts",
                    spec.fault_restart.max_restarts,
                    limits.max_restarts,
                    "max_restarts",
                )
            )
        if spec.checkpoint_resume:
            resume = spec.checkpoint_resume
            asked.append(
                ("checkpoint_resume.max_resumes", resume.max_resumes, limits.max_resumes, "max_resumes")
            )
            asked.append(
                (
                    "checkpoint_resume.grace_period",
                    resume.grace_period,
                    limits.max_grace_period,
                    "max_grace_period",
                )
            )
        for name, value, cap, key in asked:
            if value > cap:
                raise InvalidSpec(
                    f"{name} {value:g} is above this cluster's cap of {cap:g} ([limits] {key} in "
                    f"cluster.toml): ask for at most {cap:g}",
                    field=name,
                )

    def _check_pool(self, spec: JobSpec) -> None:
        """Seed 002: checkpoint resume runs in a dedicated pool.  A job that names none may run
        where the cluster is one pool and it is dedicated (a cluster without ``[[pool]]`` tables:
        :data:`.config.DEFAULT_POOL`); elsewhere it names one with ``--pool``."""
        pools = self.cluster.pools
        if not spec.checkpoint_resume:
            return
        dedicated = sorted(name for name, flag in pools.items() if flag)
        if spec.pool and pools.get(spec.pool):
            return
        if not spec.pool and len(pools) == 1 and dedicated:
            return  # no choice to make: the cluster is the user's dedicated pool
        what = f"pool {spec.pool!r} is not a dedicated pool" if spec.pool else "no pool is chosen"
        choice = (
            f"choose one with --pool ({', '.join(dedicated)})"
            if dedicated
            else "this cluster has none ([[pool]] dedicated = true in cluster.toml), so drop checkpoint resume"
        )
        raise InvalidSpec(
            f"checkpoint resume needs a dedicated resource pool on this cluster and {what}: {choice}",
            field="pool",
        )

    def _candidates(
        self, spec: JobSpec, flavor: Spec, inventory: list[Node], *, usable_only: bool = True
    ) -> list[Node]:
        nodes = []
        for node in inventory:
            if node.status == "down" or not self.cluster.fits(flavor, node):
                continue
            if usable_only and node.name in self.unusable:
                continue
            if spec.node_name and node.name != spec.node_name:
                continue
            if spec.driver_version and node.driver_version != spec.driver_version:
                continue
            if spec.pool and spec.pool not in node.pools:
                continue
            nodes.append(node)
        return nodes

    # ------------------------------------------------------------------------- placement

    def usage(self, placements: Iterable[Placement]) -> dict[str, NodeUse]:
        """Resources held on each inventory node by these (running) placements."""
        use = {n.name: NodeUse() for n in self.nodes()}
        for placement in placements:
            for task in placement.tasks:
                flavor = self.task_flavor(placement.spec, task.role)
                held = use.setdefault(task.host, NodeUse())
                # what the task was placed with (a ModelArts ps and worker split their node);
                # a placement stored before those fields were kept: its role's flavor
                held.cpus += task.cpu_request or flavor.cpus
                held.memory_gb += task.memory_gb or flavor.memory_gb
                held.cards.update(task.devices)
                held.usage += [f"{c}:{placement.job_id}" for c in task.devices] or [f"-:{placement.job_id}"]
        return use

    def task_flavor(self, spec: Spec, role: str, *, beside: bool = False) -> Spec:
        """The resources one task of ``role`` takes when its job runs with ``spec``: the spec
        itself, but for a parameter server (the catalog's ``cpu.ps``, else :data:`PS_SPEC`).

        ``beside``: the job has the ModelArts layout (:func:`~ma_jupyter.modes.base.ps_beside_workers`):
        a ps takes half the spec's cores and memory and no card, its worker the rest and the
        cards (seed 001)."""
        if beside and role in ("ps", "worker"):
            ps = spec.model_copy(
                update={"cpus": spec.cpus / 2, "memory_gb": spec.memory_gb / 2, "accelerators": 0}
            )
            if role == "ps":
                return ps
            return spec.model_copy(
                update={"cpus": spec.cpus - ps.cpus, "memory_gb": spec.memory_gb - ps.memory_gb}
            )
        if role != "ps":
            return spec
        for s in self.cluster.specs:
            if s.name == PS_SPEC.name:
                return s
        return PS_SPEC

    def fits_now(
        self, node: Node, held: NodeUse, flavor: Spec, use: dict[str, NodeUse] | None = None
    ) -> bool:
        """Whether one task of ``flavor`` fits on ``node`` beside what ``held`` says is in use
        (and, for real cards, what ``use`` says other nodes hold of them)."""
        return (
            node.status != "down"
            and node.name not in self.unusable  # drained or faulty: nothing new goes there
            and self._free(node, held, flavor, self.pooled(use) if use else None, _machine_held(use))
            is not None
        )

    def pooled(self, use: dict[str, NodeUse]) -> set[tuple[str, int]]:
        """The real cards held on any node, as (type, index): a real card is the machine's, and
        goes to one node at a time whichever nodes list it."""
        real = {n.name: n.accelerator_type for n in self.nodes() if n.emulated is False and n.accelerators}
        return {(real[name], card) for name, held in use.items() if name in real for card in held.cards}

    def _free(
        self,
        node: Node,
        held: NodeUse,
        flavor: Spec,
        taken: set[tuple[str, int]] | None = None,
        machine_held: float | None = None,
    ) -> list[int] | None:
        """The machine's card indices for one task of ``flavor`` on ``node`` (``[]`` for CPU),
        or None if it does not fit; a real card in ``taken`` (held by another node) is not free.

        Where the nodes share one machine's memory (``Cluster.machine_memory_gb``; ``machine_held``
        the memory held on all of them, None: unknown), the memory held on all nodes stays within
        it, and a task larger than a node's share fits only a node holding nothing (``cpu.all``).
        """
        machine = self.cluster.machine_memory_gb
        if held.cpus + flavor.cpus > node.cpus + 1e-9:
            return None
        if held.memory_gb + flavor.memory_gb > node.memory_gb + 1e-9:
            oversized = machine and machine_held is not None and flavor.memory_gb > node.memory_gb
            if not (oversized and held.memory_gb == 0):
                return None
        if machine and machine_held is not None and machine_held + flavor.memory_gb > machine + 1e-9:
            return None
        if not flavor.accelerators:
            return []
        shared = taken if node.emulated is False and taken else set()
        free = [
            i for i in node.card_indices if i not in held.cards and (node.accelerator_type, i) not in shared
        ]
        return free[: flavor.accelerators] if len(free) >= flavor.accelerators else None

    @staticmethod
    def shape(spec: JobSpec) -> Hashable:
        """Everything :meth:`place` reads of a spec, as a hashable value.

        Two jobs of one shape are placed alike on the same usage, and usage only grows while
        jobs start: once a job of some shape does not fit, no job of that shape fits until
        resources are freed.  The admission pass relies on it to try one job per shape instead
        of every queued job, so this must name every field :meth:`place` and
        :meth:`_place_with` (with :func:`~ma_jupyter.modes.base.task_roles`) look at.
        """
        resume = spec.checkpoint_resume
        return (
            tuple(spec.specs),
            spec.node_name,
            spec.driver_version,
            spec.pool,
            spec.type.value,
            len(spec.tasks),
            spec.mode.value,
            spec.convention.value,  # the ModelArts TensorFlow layout (ps_beside_workers)
            spec.ps,
            spec.chief,
            spec.nodes,
            resume.elastic_min_nodes if resume else None,
        )

    def place(
        self, job_id: str, spec: JobSpec, use: dict[str, NodeUse], exclude: Iterable[str] = ()
    ) -> Placement | None:
        """The placement of one attempt with the first spec that fits now, or None.

        The placement names inventory nodes, slots and cards only: a backend binds it
        (hostnames, addresses, ports, cores) before anything is planned.  With checkpoint resume
        and ``elastic_min_nodes``, fewer workers than asked (but at least the minimum) are
        accepted when resources are short.  No task goes to a node in ``exclude`` (the job's own
        :attr:`~ma_jupyter.models.Job.excluded_nodes`).
        """
        return self._fit(job_id, spec, use, exclude=exclude)

    def place_anywhere(self, job_id: str, spec: JobSpec, exclude: Iterable[str] = ()) -> Placement | None:
        """A placement on the empty cluster, drained and faulty nodes counted (they are only
        out for now): how a job that must wait is planned, never how one is launched."""
        return self._fit(job_id, spec, self.usage([]), anywhere=True, exclude=exclude)

    def exclusions(self, job_id: str, spec: JobSpec, excluded: Iterable[str]) -> tuple[str, ...]:
        """The nodes of ``excluded`` a job's placement honours: all of them, unless without them
        no node could ever hold the job (then none: a job must never wait for ever on a cluster
        whose only fitting node it was told to avoid)."""
        excluded = tuple(excluded)
        if excluded and self.place_anywhere(job_id, spec, excluded) is None:
            return ()
        return excluded

    def _fit(
        self,
        job_id: str,
        spec: JobSpec,
        use: dict[str, NodeUse],
        *,
        anywhere: bool = False,
        exclude: Iterable[str] = (),
    ) -> Placement | None:
        """:meth:`place`'s work (reservations call it too: :meth:`place` is the admission's own)."""
        counts = [spec.nodes]
        if spec.checkpoint_resume and spec.checkpoint_resume.elastic_min_nodes:
            counts = list(range(spec.nodes, spec.checkpoint_resume.elastic_min_nodes - 1, -1))
        for name in spec.specs:
            flavor = self.cluster.spec(name)
            for count in counts:
                placed = self._place_with(job_id, spec, flavor, count, use, anywhere, exclude)
                if placed is not None:
                    return placed
        return None

    def _place_with(
        self,
        job_id,
        spec: JobSpec,
        flavor: Spec,
        workers: int,
        use,
        anywhere: bool = False,
        exclude: Iterable[str] = (),
    ) -> Placement | None:
        trial = {k: NodeUse(v.cpus, v.memory_gb, set(v.cards)) for k, v in use.items()}
        unusable = {} if anywhere else dict(self.unusable)  # one read: a drain may come meanwhile
        unusable.update(dict.fromkeys(exclude, "excluded"))
        inventory = [n for n in self.nodes() if n.name not in unusable]
        candidates = self._candidates(spec, flavor, inventory, usable_only=False)
        sized = spec.model_copy(update={"nodes": workers})
        roles = task_roles(sized)
        beside = ps_beside_workers(sized) and any(role == "ps" for role, _ in roles)
        spread_taken: set[str] = set()
        chosen: list[tuple[str, int, Node, list[int]]] = []
        for role, index in roles:
            task_flavor = self.task_flavor(flavor, role, beside=beside)
            if role == "ps" and beside:
                continue  # placed with its worker, below
            if role == "ps":
                # the job's node, driver and pool choices hold for its parameter servers too
                pool = self._candidates(spec, task_flavor, inventory, usable_only=False)
                # parameter servers prefer the least loaded node; they may share with workers
                pool.sort(key=lambda n: trial.get(n.name, NodeUse()).cpus)
            elif role == "task":
                # batch tasks are independent runs: any node that fits, least loaded first
                pool = sorted(candidates, key=lambda n: trial.get(n.name, NodeUse()).cpus)
            else:
                pool = [n for n in candidates if n.name not in spread_taken or spec.node_name]
            taken = self.pooled(trial)
            for node in pool:
                held = trial.setdefault(node.name, NodeUse())
                # a worker with its ps beside it needs the whole spec on its node
                cards = self._free(
                    node,
                    held,
                    flavor if beside and role == "worker" else task_flavor,
                    taken,
                    _machine_held(trial),
                )
                if cards is None:
                    continue
                held.cpus += task_flavor.cpus
                held.memory_gb += task_flavor.memory_gb
                held.cards.update(cards)
                if role not in ("ps", "task"):
                    spread_taken.add(node.name)
                chosen.append((role, index, node, cards))
                if beside and role == "worker":
                    ps = self.task_flavor(flavor, "ps", beside=True)
                    held.cpus += ps.cpus
                    held.memory_gb += ps.memory_gb
                    chosen.append(("ps", index, node, []))
                break
            else:
                return None
        order = {task: k for k, task in enumerate(roles)}
        chosen.sort(key=lambda c: order[(c[0], c[1])])  # launch order: ps, chief, workers
        real = not flavor.emulated
        tasks = tuple(
            TaskSlot(
                role=role,
                index=index,
                slots=flavor.slots if role != "ps" else 1,
                host=node.name,
                devices=tuple(cards),
                # bound into the node's sandbox: real cards of a real node, for a spec not emulated
                card_type=node.accelerator_type if cards and real and node.emulated is False else "",
                cpu_request=self.task_flavor(flavor, role, beside=beside).cpus,
                memory_gb=self.task_flavor(flavor, role, beside=beside).memory_gb,
            )
            for role, index, node, cards in chosen
        )
        ports = MODELARTS_TF_PORTS if ps_beside_workers(spec) else None
        return Placement(job_id=job_id, spec=flavor, tasks=tasks, port_range=ports, creator=spec.creator)

    # ---------------------------------------------------------------- reservation (EASY)

    def reserve(
        self, job_id: str, spec: JobSpec, running: list[Running], now: float, exclude: Iterable[str] = ()
    ) -> Reservation | None:
        """When and where a job that does not fit now would run, if nothing else started.

        Running jobs are taken away in the order they end (jobs without a duration last); the
        first moment the job fits on what is left is its estimated start, and its placement
        then is what it reserves.  None: it never fits (nodes down).
        """
        ordered = sorted(running, key=lambda r: (r.end is None, r.end or 0.0))
        for cut in range(len(ordered) + 1):
            left = [r.placement for r in ordered[cut:]]
            placed = self._fit(job_id, spec, self.usage(left), exclude=exclude)
            if placed is not None:
                if cut == 0:
                    return Reservation(job_id, now, placed)
                end = ordered[cut - 1].end
                return Reservation(job_id, float("inf") if end is None else max(end, now), placed)
        return None

    def backfill(
        self,
        job_id: str,
        spec: JobSpec,
        use: dict[str, NodeUse],
        head: Reservation,
        now: float,
        exclude: Iterable[str] = (),
    ) -> Placement | None:
        """A placement for a job behind the blocked head that cannot delay it, or None.

        1. It fits in what is free now *and* not reserved for the head: the head's placement is
           counted as held, so the job takes only resources the head will not use; or
        2. it fits now and its duration ends it before the head's estimated start.
        """
        placed = self._fit(job_id, spec, self.with_held(use, head.placement), exclude=exclude)
        if placed is not None:
            return placed
        if spec.duration is not None and now + spec.duration <= head.start:
            return self._fit(job_id, spec, use, exclude=exclude)
        return None

    def with_held(self, use: dict[str, NodeUse], placement: Placement) -> dict[str, NodeUse]:
        """``use`` plus what ``placement`` would hold (a copy)."""
        extra = self.usage([placement])
        out = {}
        for name in set(use) | set(extra):
            a, b = use.get(name, NodeUse()), extra.get(name, NodeUse())
            out[name] = NodeUse(
                a.cpus + b.cpus, a.memory_gb + b.memory_gb, a.cards | b.cards, a.usage + b.usage
            )
        return out

    # ------------------------------------------------------------------------ reporting

    def node_views(self, use: dict[str, NodeUse], spec: str | None = None) -> list[Node]:
        """The inventory with current use, optionally only nodes that fit ``spec``."""
        flavor = self.cluster.spec(spec) if spec else None
        views = []
        taken = self.pooled(use)
        for node in self.nodes():
            if flavor and not self.cluster.fits(flavor, node):
                continue
            held = use.get(node.name, NodeUse())
            fitting = [s.name for s in self.cluster.specs if self.cluster.fits(s, node)]
            if node.status == "down":
                status = "down"
            elif mark := self.unusable.get(node.name):  # one read: an undrain may come meanwhile
                status = mark
            elif flavor is not None:
                status = (
                    "idle"
                    if self._free(node, held, flavor, taken, _machine_held(use)) is not None
                    else "busy"
                )
            else:
                status = "idle" if held.cpus == 0 else ("full" if held.cpus >= node.cpus else "busy")
            views.append(
                node.model_copy(
                    update={
                        "status": status,
                        "cpus_used": held.cpus,
                        "memory_used_gb": round(held.memory_gb, 2),
                        "accelerators_used": sorted(held.cards),
                        "specs": fitting,
                        "usage": held.usage,
                    }
                )
            )
        return views


def describe_cards(node: Node) -> str:
    """A node's cards in words: ``4 × NVIDIA H100 80GB HBM3 (80 GB, driver 580.159.04)``,
    ``4 × gpu (emulated)``."""
    what = f"{node.accelerators} × {node.accelerator_model or node.accelerator_type}"
    details = [f"{node.accelerator_memory_gb:g} GB"] if node.accelerator_memory_gb else []
    if node.driver_version:
        details.append(f"driver {node.driver_version}")
    if node.emulated:
        details.append("emulated")
    return what + (f" ({', '.join(details)})" if details else "")


def _machine_held(use: dict[str, NodeUse] | None) -> float | None:
    """The memory held on all nodes together (None when the use is not known)."""
    return None if use is None else sum(held.memory_gb for held in use.values())
