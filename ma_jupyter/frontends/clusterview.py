"""The cluster view as text, for ``ma-jupyter cluster`` and ``%ma_cluster`` (one rendering for both)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .render import text_table

if TYPE_CHECKING:  # annotations only: the CLI reads answers without pydantic
    from ..models import ClusterView


def cluster_text(view: ClusterView) -> str:
    """Four tables: nodes (used/total cards with the use of those in use, cards as
    ``card(virtual):job``, emulated ones said so), specs with how many more
    could start now, the queue by priority, and the cards queued jobs ask for per board model."""
    out = []
    rows = [["NODE", "STATUS", "CPUS", "MEMORY", "CARDS", "MODEL", "IN USE"]]
    for entry in view.nodes:
        n = entry.node
        cards = f"{len(n.accelerators_used)}/{n.accelerators}" if n.accelerators else "-"
        if entry.card_percent is not None:
            cards += f" ({entry.card_percent:.0f}%)"  # the use of those in use
        rows.append(
            [
                n.name,
                n.status if n.status == "down" else ("idle" if entry.fits else "tight"),
                f"{n.cpus_used:g}/{n.cpus:g}",
                f"{n.memory_used_gb:g}/{n.memory_gb:g} GB",
                cards,
                (entry.model or "-") + (" (emulated)" if n.accelerators and n.emulated else ""),
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
