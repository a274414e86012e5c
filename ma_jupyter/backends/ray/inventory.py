"""The Ray cluster's nodes as the platform's inventory.

Each live Ray node is one inventory node named ``ray-<first 8 hex digits of its node id>``
(unique and stable for the node's life; two Ray nodes on one machine get different names),
with the CPUs, memory and accelerators Ray reports as its total resources: ``GPU``, ``NPU`` or
``MLU`` become the node's cards of that type, and the ``accelerator_type:<model>`` resource Ray
reports for them (``accelerator_type:H100``) their board model.  Ray's ``memory`` resource is
what Ray lets tasks use on that node; the scheduler checks specs against it.  The cards a job node
gets are those Ray assigns to its bundle (the backend's ``bind``), not indices of the inventory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...models import Node

#: Ray resource name -> the platform's accelerator type
ACCELERATORS = {"GPU": "gpu", "NPU": "npu", "MLU": "mlu"}
POOL = "default"


@dataclass(frozen=True)
class RayNode:
    """One Ray node as the backend needs it.

    Attributes:
        name: its inventory name (``ray-<id prefix>``).
        node_id: Ray's node id (hex).
        address: the address its processes are reached on (``NodeManagerAddress``).
        hostname: its machine's hostname.
        alive: whether Ray reports it alive.
        accelerator: the Ray resource name of its cards (``GPU``...), or None.
    """

    name: str
    node_id: str
    address: str
    hostname: str
    alive: bool
    accelerator: str | None = None


def node_name(node_id: str) -> str:
    """The inventory name of a Ray node."""
    return f"ray-{node_id[:8]}"


def ray_nodes(records: list[dict]) -> list[RayNode]:
    """The nodes of ``ray.nodes()``'s records (alive or not), in Ray's order."""
    found = []
    for record in records:
        resources = record.get("Resources") or {}
        accelerator = next((key for key in ACCELERATORS if resources.get(key, 0) >= 1), None)
        found.append(
            RayNode(
                name=node_name(record["NodeID"]),
                node_id=record["NodeID"],
                address=record.get("NodeManagerAddress", ""),
                hostname=record.get("NodeManagerHostname", ""),
                alive=bool(record.get("Alive")),
                accelerator=accelerator,
            )
        )
    return found


def model_of(resources: dict) -> str:
    """The board model Ray reports for a node's cards (its ``accelerator_type:<model>``
    resource), "" when it reports none."""
    prefix = "accelerator_type:"
    return next((key[len(prefix) :] for key in sorted(resources) if key.startswith(prefix)), "")


def inventory(records: list[dict]) -> list[Node]:
    """The live Ray nodes as inventory nodes, sorted by name."""
    nodes = []
    for record in records:
        if not record.get("Alive"):
            continue
        resources = record.get("Resources") or {}
        accelerator = next((key for key in ACCELERATORS if resources.get(key, 0) >= 1), None)
        nodes.append(
            Node(
                name=node_name(record["NodeID"]),
                cpus=float(resources.get("CPU", 0.0)),
                # rounded down: a spec the scheduler fits here must fit Ray's bundle too
                memory_gb=math.floor(float(resources.get("memory", 0.0)) / 2**30 * 10) / 10,
                accelerators=int(resources.get(accelerator, 0)) if accelerator else 0,
                accelerator_type=ACCELERATORS[accelerator] if accelerator else "none",
                accelerator_model=model_of(resources) if accelerator else "",
                pools=[POOL],
            )
        )
    return sorted(nodes, key=lambda n: n.name)
