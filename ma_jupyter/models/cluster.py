"""The cluster: compute specs (flavors), its nodes and their use, and the cluster view
(``GET /cluster``): what each spec could start now and the queue by priority."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from ..wire import Priority
from .common import Strict


class Spec(Strict):
    """A compute flavor for one node of a job."""

    name: str
    cpus: float = Field(gt=0)
    memory_gb: float = Field(gt=0)
    accelerators: int = Field(default=0, ge=0)
    accelerator_type: Literal["none", "gpu", "mlu", "npu"] = "none"
    accelerator_model: str = Field(
        default="", description="Board model the cards must be (e.g. MLU370); empty: any of the type."
    )
    emulated: bool = Field(
        default=False, description="Cards are indices only (no device): for scheduling and SLOTS logic."
    )
    driver_versions: list[str] = []
    description: str = ""

    @property
    def slots(self) -> int:
        """Processes per node: the card count, or 1 for a CPU spec."""
        return self.accelerators or 1


class Node(Strict):
    """One compute node of the cluster and what is in use on it now."""

    name: str
    status: Literal["idle", "busy", "full", "down", "drained", "faulty"] = Field(
        default="idle",
        description="drained (an admin's) and faulty (its runners stopped beating) take no new placements.",
    )
    health: str = Field(default="", description="Why the node is drained or faulty, and by whom.")
    os: str = ""
    kernel: str = ""
    cpus: float
    cpus_used: float = 0
    memory_gb: float
    memory_used_gb: float = 0
    accelerators: int = 0
    accelerator_type: Literal["none", "gpu", "mlu", "npu"] = "none"
    accelerator_model: str = Field(default="", description="Board model of the cards (e.g. MLU370).")
    accelerator_memory_gb: float = Field(default=0, ge=0, description="Memory of one card (0: unknown).")
    devices: list[int] = Field(
        default=[],
        description="The machine's indices of its cards (nvidia-smi's, /dev/nvidia<N>); empty: 0 to "
        "accelerators-1. Real cards listed by several nodes of one machine go to one node at a time.",
    )
    emulated: bool | None = Field(
        default=None,
        description="True: its cards are indices only; False: real cards, their device nodes bound into "
        "the sandbox of the job node holding them. Unset in cluster.toml: real when this machine shows "
        "the type's device nodes.",
    )
    accelerators_used: list[int] = []
    driver_version: str | None = None
    pools: list[str] = []
    specs: list[str] = Field(default=[], description="Specs that fit this node.")
    usage: list[str] = Field(default=[], description="'card:job-name' entries for what runs here.")

    @model_validator(mode="after")
    def _devices_match(self) -> Node:
        if self.devices and (
            len(self.devices) != self.accelerators or len(set(self.devices)) != len(self.devices)
        ):
            raise ValueError(
                f"node {self.name}: devices must list {self.accelerators} distinct card indices "
                f"(one per card of accelerators = {self.accelerators}), not {self.devices}"
            )
        return self

    @property
    def card_indices(self) -> list[int]:
        """The machine's indices of its cards: ``devices``, else 0..accelerators-1."""
        return list(self.devices) if self.devices else list(range(self.accelerators))


class NodeDrain(Strict):
    """The body of ``POST /nodes/{name}/drain``: why the admin takes the node out of placement."""

    reason: str | None = Field(default=None, max_length=256)


class ClusterNode(Strict):
    """One node in the cluster view: the node with its use, and what holds its cards."""

    node: Node
    model: str = Field(
        default="", description="Board model: the node's accelerator_model, else its card type."
    )
    cards: list[str] = Field(
        default=[],
        description="Cards in use as 'card(virtual):application' (seed notation, e.g. 1(0):train-a): the "
        "board's index on the node, the virtual card cut from it (0: the whole board) and the job's name.",
    )
    jobs: list[str] = Field(default=[], description="Ids of the visible jobs running here.")
    card_percent: float | None = Field(
        default=None, description="Mean use of its cards in use now (real cards the driver reads), 0..100."
    )
    fits: bool = Field(
        default=True, description="Whether one node of a chosen spec fits here now (idle vs tight)."
    )


class SpecRoom(Strict):
    """One spec in the cluster view and how many more job nodes of it could start now."""

    spec: Spec
    models: list[str] = Field(
        default=[], description="Board models it can run on (its own, else its nodes')."
    )
    nodes: int = Field(default=0, description="Nodes it fits on at all (up ones).")
    can_start: int = Field(
        default=0,
        description="How many more one-node jobs of it the scheduler would place now, one after another.",
    )


class QueuedJob(Strict):
    """One queued job in the cluster view, in the scheduler's order."""

    position: int
    job_id: str | None = Field(
        default=None, description="None for another user's job the caller may not see."
    )
    name: str
    priority: Priority
    specs: list[str] = []
    nodes: int = 1
    cards: int = Field(default=0, description="Cards it asks for in all (first spec with cards x nodes).")
    model: str = Field(default="", description="Board model of those cards.")


class ClusterView(Strict):
    """The cluster's resources now (seed 002 cluster resources): nodes and their use, how many
    more of each spec could start, the queue by priority and queued card demand per board model."""

    nodes: list[ClusterNode] = []
    specs: list[SpecRoom] = []
    queue: list[QueuedJob] = []
    demand: dict[str, int] = Field(default={}, description="Cards queued jobs ask for, per board model.")
    models: list[str] = Field(default=[], description="Every board model of the inventory (for the filter).")
