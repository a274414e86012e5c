"""The cluster: ``%ma_specs`` (the specs and how many nodes could take one now) and
``%ma_cluster`` (nodes, what can start, the queue).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .parsing import MagicParser, parse

if TYPE_CHECKING:
    from IPython.core.magic import Magics


def ma_specs(magics: Magics, line: str):
    """The specs and how many nodes could take one more job node of each right now."""
    from ... import render
    from ..session import get_client

    parser = MagicParser(prog="%ma_specs", description="Specs (flavors) and what is free now.")
    if parse(parser, line) is None:
        return None
    client = get_client()
    nodes = client.nodes()
    rows = []
    held = _real_cards_held(nodes)
    for spec in client.specs():
        fit = [n for n in nodes if _fits_now(spec, n, held)]
        cards = f"{spec.accelerators} {spec.accelerator_type}" if spec.accelerators else "-"
        rows.append(
            [
                spec.name,
                f"{spec.cpus:g}",
                f"{spec.memory_gb:g} GB",
                cards + (" (emulated)" if spec.emulated else ""),
                f"{len(fit)}/{len(nodes)} nodes" + (f" ({', '.join(n.name for n in fit)})" if fit else ""),
                spec.description,
            ]
        )
    from IPython.display import display

    display(
        render.table_bundle(["spec", "cpus", "memory", "cards", "free now", "description"], rows),
        raw=True,
    )
    return None


def ma_cluster(magics: Magics, line: str):
    """The cluster's resources: ``%ma_cluster [--spec S ...] [--model M ...]``: nodes and their
    use (cards as ``card(virtual):job``), how many more of each spec could start now, the
    queue by priority and queued card demand per board model."""
    from ...clusterview import cluster_text
    from ..session import get_client

    parser = MagicParser(prog="%ma_cluster", description="Nodes, specs that can start, the queue.")
    parser.add_argument("--spec", action="append", default=[], help="only nodes that fit this spec")
    parser.add_argument("--model", action="append", default=[], help="only this board model")
    args = parse(parser, line)
    if args is None:
        return None
    print(cluster_text(get_client().cluster(specs=args.spec, models=args.model)), end="")
    return None


def _real_cards_held(nodes: list) -> set[tuple[str, int]]:
    """The real cards held on any node, as (type, machine index): such a card is held for every
    node that lists it (the scheduler gives it to one node at a time)."""
    return {(n.accelerator_type, c) for n in nodes if n.emulated is False for c in n.accelerators_used}


def _fits_now(spec: Any, node: Any, held: set[tuple[str, int]] = frozenset()) -> bool:
    """Whether ``node`` could take one more job node of ``spec`` now (``held``: the real cards
    held anywhere, :func:`_real_cards_held`)."""
    if node.status in ("down", "drained", "faulty"):  # drained and faulty nodes take no new job
        return False
    if spec.cpus > node.cpus - node.cpus_used or spec.memory_gb > node.memory_gb - node.memory_used_gb:
        return False
    if spec.accelerators:
        if node.emulated is False:
            indices = node.devices or list(range(node.accelerators))
            free = sum(1 for i in indices if (node.accelerator_type, i) not in held)
        else:
            free = node.accelerators - len(node.accelerators_used)
        return node.accelerator_type == spec.accelerator_type and free >= spec.accelerators
    return True
