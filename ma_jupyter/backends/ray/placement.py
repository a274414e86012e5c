"""An attempt's Ray nodes held: its placement group, its ports and its card ids (item 3 of
:mod:`.backend`).

1. **name** -- one placement group per real attempt, named ``ma-<home tag>-<job id>-<nonce>``
   (:func:`home_tag`: services of different homes sharing the cluster keep apart, since job
   ids are unique per home only); detached, so it outlives a service restart (the stored
   reservation finds it by name).  A group of the same job an earlier service left unrecorded
   is removed first: a job in the queue holds none;
2. **bundles** -- one per job node (its CPUs, memory and cards: :func:`bundle`), each pinned to
   its inventory node by Ray's :data:`NODE_LABEL`, ``STRICT_SPREAD`` when every job node has
   its own Ray node, else ``SPREAD``;
3. **wait** -- a group Ray cannot reserve within :data:`RESERVE_WAIT` seconds (other users of
   the cluster hold the resources) is removed again and :meth:`Groups.reserve` gives None: the
   job waits in the queue holding nothing (contract rule 15);
4. **ports and cards** -- each node's agent hands out two ports free on its node; the cards of a
   task are those Ray assigned to its bundle (:meth:`Groups.card_ids`), never indices chosen
   apart from Ray; a failure of either removes the group;
5. **release and hold** -- :meth:`Groups.release` gives the ports back and removes the group;
   :meth:`Groups.hold` declares the ports again after a restart (the group still holds the nodes).
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import socket
from dataclasses import replace
from typing import Any

from ... import config
from ...errors import NodeGone
from ...modes.base import Placement, TaskSlot
from .agents import AGENT_START, Agents
from .inventory import ACCELERATORS, RayNode

log = logging.getLogger("ma_jupyter.ray")

#: Ray's label naming a node by id (placement group bundles are pinned with it)
NODE_LABEL = "ray.io/node-id"
RESERVE_WAIT = 2.0  # seconds a placement group may take to be reserved before the job waits


def home_tag() -> str:
    """Rule 1: names this service's placement groups apart from those of services of other
    homes sharing the cluster."""
    where = f"{socket.gethostname()}:{config.home()}"
    return hashlib.sha256(where.encode()).hexdigest()[:6]


class Groups:
    """The rules of the module docstring over the cluster's agents.

    Args:
        ray: the ``ray`` module, connected.
        agents: the cluster's agents.
    """

    def __init__(self, ray: Any, agents: Agents):
        self._ray = ray
        self._agents = agents
        self._tag = home_tag()
        self._cards_task: Any = None  # the remote function reading a bundle's card ids

    def reserve(self, bound: Placement, nodes: list[RayNode]) -> Placement | None:
        """Rules 1-4: ``bound`` (its tasks named and addressed) holding its Ray ``nodes`` (one
        per task), with their ports and cards and the group's name as its reservation; None
        when Ray cannot reserve them now."""
        from ray.util.placement_group import placement_group, remove_placement_group

        placement = bound
        tasks = list(bound.tasks)
        prefix = f"ma-{self._tag}-{placement.job_id}-"
        self._remove_groups(prefix)
        name = prefix + secrets.token_hex(4)
        hosts = [t.host for t in tasks]
        group = placement_group(
            [bundle(task, node) for task, node in zip(tasks, nodes, strict=True)],
            strategy="STRICT_SPREAD" if len(set(hosts)) == len(hosts) else "SPREAD",
            name=name,
            lifetime="detached",  # a restarted service finds it by name (the stored reservation)
            bundle_label_selector=[{NODE_LABEL: node.node_id} for node in nodes],
        )
        if not group.wait(RESERVE_WAIT):
            remove_placement_group(group)  # never hold part of a job's nodes while it waits
            log.info("job %s: Ray could not reserve %s now; it waits", placement.job_id, ", ".join(hosts))
            return None
        refs = [self._agents.agent(node.node_id).ports.remote(2, placement.port_range) for node in nodes]
        try:
            ports = [tuple(self._agents.get(ref, AGENT_START)) for ref in refs]
            cards = self.card_ids(group, tasks, nodes)
        except BaseException:
            remove_placement_group(group)
            raise
        tasks = [
            replace(
                task,
                ports=p,
                devices=ids or task.devices,
                # real cards of the Ray node's machine where it shows their device nodes: bound
                # there by the agent's start (launch.with_machine_cards)
                card_type=ACCELERATORS.get(node.accelerator or "", "") if task.devices else "",
            )
            for task, node, p, ids in zip(tasks, nodes, ports, cards, strict=True)
        ]
        return replace(bound, tasks=tuple(tasks), reservation=name)

    def card_ids(
        self, group: Any, tasks: list[TaskSlot], nodes: list[RayNode]
    ) -> list[tuple[int, ...] | None]:
        """The cards Ray assigned to each task's bundle (its GPU/NPU ids on the Ray node), read by
        a task that asks for all of the bundle's cards inside it; None for a task without cards
        (and an empty tuple where Ray keeps no ids for the resource: the scheduler's stay).

        The job node then gets exactly those cards, never indices chosen apart from Ray, so it
        cannot collide with other Ray work on the same machine (Ray gives each bundle's card
        instances to one holder at a time)."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        refs: list[Any] = []
        for index, (task, node) in enumerate(zip(tasks, nodes, strict=True)):
            if not task.devices or not node.accelerator:
                refs.append(None)
                continue
            strategy = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index)
            options = {"num_cpus": 0, "resources": {node.accelerator: float(len(task.devices))}}
            if node.accelerator == "GPU":
                options = {"num_cpus": 0, "num_gpus": float(len(task.devices))}
            if self._cards_task is None:
                self._cards_task = self._ray.remote(_assigned_cards)
            refs.append(
                self._cards_task.options(scheduling_strategy=strategy, **options).remote(node.accelerator)
            )
        return [None if ref is None else tuple(self._agents.get(ref, AGENT_START)) for ref in refs]

    def _remove_groups(self, prefix: str) -> None:
        """Remove this home's placement groups of a job about to be bound: a job in the queue
        holds none, so any found is what a service killed between reserving it and recording the
        placement left behind."""
        from ray.util import placement_group_table
        from ray.util.placement_group import get_placement_group, remove_placement_group

        for group in placement_group_table().values():
            if group.get("name", "").startswith(prefix) and group.get("state") != "REMOVED":
                try:
                    remove_placement_group(get_placement_group(group["name"]))
                    log.warning("removed the placement group %s left by an earlier service", group["name"])
                except ValueError:
                    pass

    def release(self, placement: Placement) -> None:
        """Rule 5: give the ports back to the agents and remove the placement group."""
        for task in placement.tasks:
            if any(task.ports):
                try:
                    self._agents.agent_of(task.host).release_ports.remote(list(task.ports))
                except NodeGone:
                    pass
        if placement.reservation:
            from ray.util.placement_group import get_placement_group, remove_placement_group

            try:
                remove_placement_group(get_placement_group(placement.reservation))
            except ValueError:  # already gone
                pass

    def hold(self, placement: Placement) -> None:
        """Rule 5: declare the placement's ports to the agents again (its placement group is
        detached: it still holds the nodes)."""
        for task in placement.tasks:
            try:
                self._agents.agent_of(task.host).hold_ports.remote(list(task.ports))
            except NodeGone:
                pass


def _assigned_cards(resource: str) -> list[int]:
    """Runs as a Ray task inside a bundle: the ids of the cards of ``resource`` Ray gave it."""
    import ray

    ids = ray.get_runtime_context().get_accelerator_ids().get(resource, [])
    return sorted(int(i) for i in ids)


def bundle(task: TaskSlot, node: RayNode) -> dict[str, float]:
    """Rule 2: the resources of one job node in its placement group: its CPUs, memory and cards
    (so Ray's own tasks cannot take the memory the scheduler counted as the job's)."""
    resources = {"CPU": max(task.cpu_request, 0.01)}
    if task.memory_gb > 0:
        resources["memory"] = float(int(task.memory_gb * 2**30))
    if task.devices and node.accelerator:
        resources[node.accelerator] = float(len(task.devices))
    return resources
