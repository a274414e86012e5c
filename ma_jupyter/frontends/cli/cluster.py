"""``ma-jupyter specs``, ``nodes``, ``cluster``: the compute specs and the machines jobs run on."""

from __future__ import annotations

import argparse
import sys

from ...client import Client
from ...client.plain import as_json
from .. import render
from ..clusterview import cluster_text
from .output import (
    EXIT_OK,
    EXIT_USAGE,
    out,
)


def _specs(args: argparse.Namespace) -> int:
    specs = Client(plain=True).specs()
    if args.json:
        out(as_json(specs), args)
        return EXIT_OK
    rows = [["NAME", "CPUS", "MEMORY", "CARDS", "DESCRIPTION"]]
    for s in specs:
        cards = (
            f"{s.accelerators} {s.accelerator_type}" + (" (emulated)" if s.emulated else "")
            if s.accelerators
            else "-"
        )
        rows.append([s.name, f"{s.cpus:g}", f"{s.memory_gb:g} GB", cards, s.description])
    print(render.text_table(rows), end="")
    return EXIT_OK


def _nodes(args: argparse.Namespace) -> int:
    if args.action:
        if not args.node:
            print(
                f"ma-jupyter nodes {args.action} needs a node name (see `ma-jupyter nodes`)", file=sys.stderr
            )
            return EXIT_USAGE
        client = Client(plain=True)
        if args.action == "drain":
            node = client.drain_node(args.node, args.reason)
        else:
            node = client.undrain_node(args.node)
        print(f"{node.name}: {node.status}" + (f" ({node.health})" if node.health else ""))
        return EXIT_OK
    nodes = Client(plain=True).nodes(spec=args.spec)
    if args.json:
        out(as_json(nodes), args)
        return EXIT_OK
    rows = [["NAME", "STATUS", "CPUS USED", "MEMORY USED", "CARDS USED", "POOLS", "RUNNING"]]
    for n in nodes:
        cards = "-"
        if n.accelerators:
            cards = f"{len(n.accelerators_used)}/{n.accelerators} {n.accelerator_model or n.accelerator_type}"
            cards += " (emulated)" if n.emulated else ""
        rows.append(
            [
                n.name,
                n.status,
                f"{n.cpus_used:g}/{n.cpus:g}",
                f"{n.memory_used_gb:g}/{n.memory_gb:g} GB",
                cards,
                ",".join(n.pools) or "-",
                ", ".join(n.usage) or "-",
            ]
        )
        if n.health:  # why it takes no new jobs, under its row
            rows.append(["", f"  {n.health}", "", "", "", "", ""])
    print(render.text_table(rows), end="")
    return EXIT_OK


def _cluster(args: argparse.Namespace) -> int:
    view = Client(plain=True).cluster(specs=args.spec, models=args.model)
    if args.json:
        out(as_json(view), args)
        return EXIT_OK
    print(cluster_text(view), end="")
    return EXIT_OK


#: the commands of this module, by name (see the package's ``_command``)
COMMANDS = {"specs": _specs, "nodes": _nodes, "cluster": _cluster}
