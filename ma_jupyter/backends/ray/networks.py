"""Which network a Ray attempt gets: an overlay of namespaces of its own, or the fence
(docs/network.md; the pure planning is :mod:`.overlay_plan`, the fence :mod:`.fence`).

1. :meth:`Networks.overlay` decides, per attempt, from what the agents reported (the rules are
   in its docstring): never with ``network = "fence"``, else only where every machine can;
2. :meth:`Networks.segments` gives each Ray node its part of an overlaid attempt;
3. :meth:`Networks.fault` is the node inspection's network check (contract rule 28): the last
   answer of the node's agent (:mod:`.network_check`), never waiting; None on a fenced cluster.
"""

from __future__ import annotations

import logging

from ...nodehost import overlay as job_overlay
from ...nodehost.overlay import Overlay
from ..base import Attempt
from . import overlay_plan
from .agents import Agents
from .network_check import AgentAnswers

log = logging.getLogger("ma_jupyter.ray")


class Networks:
    """The rules of the module docstring.

    Args:
        agents: the cluster's agents.
        network: ``auto`` (each attempt on an overlay where its machines can make them, else
            fenced) or ``fence`` (always fenced).
    """

    def __init__(self, agents: Agents, network: str):
        self._agents = agents
        self.fenced = network == "fence"
        if network == "auto":  # said once: jobs that download or install at run time fail there
            log.info(
                "jobs on Ray run in network namespaces of their own where the agents can make them: "
                'no outbound network (network = "fence" under [backend] keeps the machines\' network)'
            )
        self._fenced_hosts: set[str] = set()  # hosts whose fallback to the fence was logged
        self._answers = AgentAnswers()  # fault's (.network_check)

    def overlay(self, hosts: list[str]) -> bool:
        """Whether an attempt on ``hosts`` gets an overlay (docs/network.md), in this order:

        1. never where the cluster file says ``network = "fence"``;
        2. every host's agent can make one, and every host's address is IPv4 and outside the
           overlay's range (``10.253.0.0/16``: a machine's own address there would be taken
           for an overlay address);
        3. and so can every other live Ray node's agent that answered already: a cluster is
           all overlay or all fenced, since a fenced job shares its machine's network, from
           which it could send frames to the overlays' UDP ports.

        The agents of ``hosts`` are waited for (as the dry run's launches wait for them): a
        submit just after the service's start must not be planned fenced, and so refused as an
        MPI job, for an agent still starting.  A host that cannot is logged once, with why; the
        attempt is then fenced.
        """
        if self.fenced:
            return False
        live = self._agents.live()
        for host in dict.fromkeys([*hosts, *live]):
            node = live.get(host) or self._agents.node(host)
            if host in hosts:
                info = self._agents.info(host)
            else:
                answered = self._agents.answered(node.node_id)
                if answered is None:
                    continue  # another node whose agent has not answered: judged once it has
                info = answered
            why = ""
            if info.get("network") != "namespace":
                why = info.get("network_why") or "its agent cannot make network namespaces"
            elif not job_overlay.is_ipv4(node.address):
                why = f"its address {node.address} is not IPv4"
            elif job_overlay.is_overlay_address(node.address):
                why = f"its address {node.address} lies in the overlay's range"
            if why:
                if host not in self._fenced_hosts:
                    self._fenced_hosts.add(host)
                    log.warning(
                        "jobs on this Ray cluster are fenced, not in namespaces of their own: Ray node %s: %s",
                        host,
                        why,
                    )
                return False
        return True

    def segments(self, attempt: Attempt) -> dict[str, Overlay] | None:
        """Each Ray node's part of the attempt's overlay (:func:`.overlay_plan.segments`), where
        bind gave the tasks overlay addresses; None where it did not (or the cluster file says
        ``network = "fence"``)."""
        if self.fenced:
            return None
        return overlay_plan.segments(
            [plan.task for plan in attempt.plans], lambda host: self._agents.node(host).address
        )

    def fault(self, host: str) -> str | None:
        """The last answer of the node's agent (:mod:`.network_check`), never waiting for one;
        None on a fenced cluster (its jobs share their machines' networks)."""
        if self.fenced:
            return None
        return self._answers.fault(
            host,
            lambda: (
                self._agents.agent_of(host).network_fault.remote(self._agents.node(host).address).future()
            ),
        )
