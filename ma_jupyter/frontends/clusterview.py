"""The cluster view as text, for ``ma-jupyter cluster`` and ``%ma_cluster`` (one rendering for both)."""

from __future__ import annotations

from .render import text_table

TYPE_CHECKING = False  # typing's, without importing typing (a command line's call: ~5 ms)
if TYPE_CHECKING:  # annotations only: the CLI reads answers without pydantic
    from ..models import ClusterNode, ClusterView

#: node states that say more than whether a spec fits: no job is placed there at all
OUT_OF_PLACEMENT = ("down", "drained", "faulty")


def node_state(entry: ClusterNode) -> str:
    """The STATUS column: ``down``, ``drained`` or ``faulty`` as the node is; else the seed's
    ``idle`` (one node of the chosen spec, or of some spec, fits now) or ``tight``."""
    status = entry.node.status
    if status in OUT_OF_PLACEMENT:
        return status
    return "idle" if entry.fits else "tight"


def cluster_text(view: ClusterView) -> str:
    """Four tables: nodes in the seed's columns (name, status, OS and kernel, memory, cores,
    used/total cards with the use of those in use, board model (emulated ones said so), driver,
    the specs that fit the node, and cards in use as ``card(virtual):job``), specs with how many
    more could start now, the queue by priority, and the cards queued jobs ask for per board
    model."""
    out = []
    rows = [
        ["NODE", "STATUS", "OS / KERNEL", "MEMORY", "CPUS", "CARDS", "MODEL", "DRIVER", "SPECS", "IN USE"]
    ]
    for entry in view.nodes:
        n = entry.node
        cards = f"{len(n.accelerators_used)}/{n.accelerators}" if n.accelerators else "-"
        if entry.card_percent is not None:
            cards += f" ({entry.card_percent:.0f}%)"  # the use of those in use
        rows.append(
            [
                n.name,
                node_state(entry),
                " / ".join(p for p in (n.os, n.kernel) if p) or "-",
                f"{n.memory_used_gb:g}/{n.memory_gb:g} GB",
                f"{n.cpus_used:g}/{n.cpus:g}",
                cards,
                (entry.model or "-") + (" (emulated)" if n.accelerators and n.emulated else ""),
                n.driver_version or "-",
                ",".join(n.specs) or "-",
                ", ".join(entry.cards or entry.jobs) or "-",
            ]
        )
    out.append(text_table(rows))
    rows = [["SPEC", "CPUS", "MEMORY", "CARDS", "MODELS", "NODES", "CAN START NOW"]]
    for room in view.specs:
        s = room.spec
        rows.append(
            [
                s.name,
                f"{s.cpus:g}",
                f"{s.memory_gb:g} GB",
                (f"{s.accelerators} {s.accelerator_type}" + (" (emulated)" if s.emulated else ""))
                if s.accelerators
                else "-",
                ",".join(room.models) or "-",
                str(room.nodes),
                str(room.can_start),
            ]
        )
    out.append(text_table(rows))
    if view.queue:
        rows = [["#", "PRIORITY", "JOB", "NAME", "SPECS", "NODES", "CARDS"]]
        for q in view.queue:
            rows.append(
                [
                    str(q.position + 1),
                    q.priority.value,
                    q.job_id or "-",
                    q.name,
                    ",".join(q.specs),
                    str(q.nodes),
                    f"{q.cards} {q.model}" if q.cards else "-",
                ]
            )
        out.append(text_table(rows))
    else:
        out.append("queue: empty\n")
    demand = ", ".join(f"{model}: {cards}" for model, cards in sorted(view.demand.items()))
    out.append(f"queued card demand: {demand or 'none'}\n")
    return "\n".join(out)
