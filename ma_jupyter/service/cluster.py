"""The cluster view (seed 002, cluster resources): nodes and what holds them, how many more job
nodes of each spec could start now, the queue by priority and the cards queued jobs ask for.

Everything is read from the scheduler and the supervisor's own state, never re-derived:

1. Node use is :meth:`Scheduler.usage` over the running placements (what admission sees).
2. "Can start" for a spec is :meth:`Scheduler.place` of a one-node job of that spec, repeated
   on the usage plus what the earlier probes took, until it no longer fits (capped at
   :data:`MAX_PROBES`).  It counts free resources only: queued jobs may take them first.
3. A node is ``fits`` (the seed's idle) when one node of any chosen spec fits on it now, else
   tight; with no spec chosen, when anything of the catalog fits.
4. A node's real cards in use show their mean use now (NVML, read at each view).
5. The queue is the scheduler's order (priority, then age); demand per board model sums each
   queued job's cards: its first spec with cards, times its nodes.

Jobs the caller may not see show as another user's, without id or name (the ``/nodes`` rule).
"""

from __future__ import annotations

from collections.abc import Callable

from .. import accelerators
from ..errors import InvalidSpec, NotFound
from ..models import ClusterNode, ClusterView, Job, JobSpec, Node, QueuedJob, Spec, SpecRoom
from .scheduler import NodeUse, Scheduler

#: most probes per spec: the view says "64+" beyond it, and a large cluster stays cheap
MAX_PROBES = 64
HIDDEN = "(another user's job)"


def masked(node: Node, seen: Callable[[str], bool]) -> Node:
    """``node`` with each usage entry (``<card>:<job id>``) of a job the caller may not see
    (``seen(job_id)`` false) shown as another user's, without its id."""

    def entry(text: str) -> str:
        card, _, job_id = text.partition(":")
        return text if seen(job_id) else f"{card}:{HIDDEN}"

    return node.model_copy(update={"usage": [entry(e) for e in node.usage]})


def board_model(node: Node) -> str:
    """A node's board model: its ``accelerator_model``, else its card type; "" for a CPU node."""
    if not node.accelerators:
        return ""
    return node.accelerator_model or node.accelerator_type


def spec_models(spec: Spec, nodes: list[Node], scheduler: Scheduler) -> list[str]:
    """The board models a spec runs on: its own model, else those of the nodes it fits."""
    if not spec.accelerators:
        return []
    if spec.accelerator_model:
        return [spec.accelerator_model]
    return sorted({board_model(n) for n in nodes if scheduler.cluster.fits(spec, n)})


def can_start(scheduler: Scheduler, spec: Spec, use: dict[str, NodeUse]) -> int:
    """Rule 2: how many one-node jobs of ``spec`` the scheduler places now, one after another."""
    probe = JobSpec(name="probe", command="true", specs=[spec.name])
    count = 0
    while count < MAX_PROBES:
        placed = scheduler.place("probe", probe, use)
        if placed is None:
            break
        use = scheduler.with_held(use, placed)
        count += 1
    return count


def view(
    scheduler: Scheduler,
    use: dict[str, NodeUse],
    queued: list[Job],
    visible: Callable[[str], Job | None],
    specs: list[str] | None = None,
    models: list[str] | None = None,
) -> ClusterView:
    """The cluster view, filtered by spec names and board models (either may be empty: all).

    Args:
        use: the running placements' usage (:meth:`Supervisor.usage`).
        queued: the queued jobs in the scheduler's order.
        visible: the job of an id if the caller may see it, else None.
        specs: show the nodes that fit any of these specs, and only these specs.
        models: show the nodes and specs of these board models only.

    Raises:
        InvalidSpec: an unknown spec or board model (naming the known ones).
    """
    inventory = scheduler.nodes()
    known_models = sorted({board_model(n) for n in inventory} - {""})
    chosen = [scheduler.cluster.spec(name) for name in specs or []]  # unknown names raise
    for model in models or []:
        if model not in known_models:
            raise InvalidSpec(
                f"unknown board model {model!r}: choose one of {', '.join(known_models) or '(none)'}",
                field="model",
            )
    catalog = chosen or list(scheduler.cluster.specs)
    if models:
        catalog = [s for s in catalog if set(spec_models(s, inventory, scheduler)) & set(models)]
    names: dict[str, str] = {}  # job id -> name shown

    def shown(job_id: str) -> str:
        if job_id not in names:
            job = visible(job_id)
            names[job_id] = job.spec.name if job is not None else HIDDEN
        return names[job_id]

    nodes = []
    for node in scheduler.node_views(use):
        model = board_model(node)
        if models and model not in models:
            continue
        if chosen and not any(scheduler.cluster.fits(s, node) for s in chosen):
            continue
        held = use.get(node.name, NodeUse())
        cards, jobs = [], []
        for entry in node.usage:  # "card:job id" or "-:job id" (a CPU task)
            card, _, job_id = entry.partition(":")
            name = shown(job_id)
            if name != HIDDEN and job_id not in jobs:
                jobs.append(job_id)
            if card != "-":
                # boards are not cut into virtual cards here: each is its own virtual card 0
                cards.append(f"{card}(0):{name}")
        hidden = masked(node, lambda job_id: shown(job_id) != HIDDEN)
        fits = any(scheduler.fits_now(node, held, s, use) for s in catalog if scheduler.cluster.fits(s, node))
        percent = None
        if node.emulated is False and node.accelerators_used:
            sampled = accelerators.sample(node.accelerator_type, node.accelerators_used)
            percent = sampled.percent if sampled else None
        nodes.append(
            ClusterNode(node=hidden, model=model, cards=cards, jobs=jobs, card_percent=percent, fits=fits)
        )

    rooms = [
        SpecRoom(
            spec=s,
            models=spec_models(s, inventory, scheduler),
            nodes=sum(
                1
                for n in inventory
                if n.status != "down" and n.name not in scheduler.unusable and scheduler.cluster.fits(s, n)
            ),
            can_start=can_start(scheduler, s, use),
        )
        for s in catalog
    ]

    queue, demand = [], {}
    for position, job in enumerate(queued):
        cards, model = _cards(job.spec, scheduler, inventory)
        if model:
            demand[model] = demand.get(model, 0) + cards
        seen = visible(job.id) is not None
        queue.append(
            QueuedJob(
                position=position,
                job_id=job.id if seen else None,
                name=job.spec.name if seen else HIDDEN,
                priority=job.spec.priority,
                specs=list(job.spec.specs),
                nodes=job.spec.nodes,
                cards=cards,
                model=model,
            )
        )
    return ClusterView(nodes=nodes, specs=rooms, queue=queue, demand=demand, models=known_models)


def _cards(spec: JobSpec, scheduler: Scheduler, inventory: list[Node]) -> tuple[int, str]:
    """Rule 5: the cards a queued job asks for and their board model (0, "" for a CPU job)."""
    for name in spec.specs:
        try:
            flavor = scheduler.cluster.spec(name)
        except InvalidSpec:  # a spec removed from the catalog since the job was queued
            continue
        if flavor.accelerators:
            models = spec_models(flavor, inventory, scheduler)
            count = len(spec.tasks) if spec.type.value == "batch" else spec.nodes
            return flavor.accelerators * count, "/".join(models) or flavor.accelerator_type
    return 0, ""


def queued_jobs(ids: list[str], get: Callable[[str], Job]) -> list[Job]:
    """The jobs of ``ids`` (queue order), skipping any that left the store meanwhile."""
    jobs = []
    for job_id in ids:
        try:
            jobs.append(get(job_id))
        except NotFound:
            continue
    return jobs
