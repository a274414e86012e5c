"""A Ray attempt's way out where the admin's policy opens one (``[network] egress``,
docs/network.md "Egress by policy").

A job on Ray runs in its attempt's overlay (each machine's part a switch namespace with a
namespace per node, :mod:`ma_jupyter.nodehost.overlay`), so the local backend's gate
(:mod:`ma_jupyter.nodehost.egress`) sits in each Ray node's agent, for the nodes of that
machine:

1. **service** (:func:`gated`, at each launch): the policy as ``cluster.toml`` says then, its
   host names' addresses as the service's one cache knows them (never waiting on a name
   server: :mod:`ma_jupyter.nodehost.egress_names`), the bounds, the attempt's user, and what
   is never reached whatever the list says: the service's machine's addresses, every Ray node's
   address (alive or not: whatever listens there, a worker's random port included, is the
   cluster's), and on any address the cluster's ports (:func:`.fence.cluster_ports`: the GCS,
   every port of the node table, dashboard, client server, agents) and every agent's machine's
   raylet ports and worker port ranges as it said at its start (``info()``'s ``ray_ports``: a
   Ray machine reachable at a second address a policy lists still shows no worker); sent with
   the launch,
   inside each machine's :class:`~ma_jupyter.nodehost.overlay.Overlay` (``egress``);
2. **agent** (:func:`on_this_machine`, root, at the launch): adds its machine's raylets' ports
   and worker port ranges (:func:`.fence.raylet_ports`) to the denied ports, then the node
   host makes the switch's gateway (:data:`~ma_jupyter.nodehost.overlay.EGRESS_GATEWAY`) and
   every node's default route to it, loads the rules into the switch and runs the forwarder,
   which checks each connection again, this machine's own addresses included, and connects
   from the agent's (the machine's) network;
3. an attempt that cannot get an overlay (fenced: its nodes would share their machines' whole
   outbound network, which no gate governs) is refused with the reason (:data:`FENCED`); a
   service whose cluster file fences every attempt (``network = "fence"``) does not start
   (:func:`refusal`).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import sys
from collections.abc import Iterable
from typing import Any

from ... import config
from ...config import EgressRule
from ...errors import BackendUnavailable
from ...nodehost import egress
from ...nodehost import overlay as job_overlay
from ...nodehost.overlay import Overlay
from ..base import Attempt
from . import fence

#: the network a Ray attempt's nodes are on (its overlay)
OVERLAY_NETWORK = ipaddress.IPv4Network(
    f"{job_overlay.OVERLAY_NET[0]}.{job_overlay.OVERLAY_NET[1]}.0.0/{job_overlay.OVERLAY_PREFIX}"
)
#: why a fenced attempt cannot have a way out
FENCED = (
    "[network] egress lists destinations, but this attempt's nodes could not get their overlay "
    "and would be fenced: a fenced node shares its machine's whole outbound network, which no "
    "gate governs, so the policy cannot be enforced; run every Ray node's agent as root on "
    "Linux 6.7+ with VXLAN (the service log says which Ray node cannot, and why), or set "
    'egress = "none" (docs/network.md)'
)


def refusal(rules: Iterable[EgressRule], network: str) -> str | None:
    """Why a service on the Ray backend refuses the policy ``rules`` at its start (None: it
    takes it): a cluster file that fences every attempt (``network``), or an entry that is one
    of this machine's own addresses."""
    if network == "fence":
        return (
            "the Ray backend's [backend] network = \"fence\" keeps the machines' network for every "
            'job, which no gate governs: set network = "auto" (each attempt on its overlay, the '
            'gate in each Ray node\'s agent) or egress = "none"'
        )
    return egress.own_entry(rules)


def gated(
    overlays: dict[str, Overlay] | None, attempt: Attempt, ray: Any, agents: Iterable[dict] = ()
) -> dict[str, Overlay] | None:
    """Rule 1: each machine's part of the attempt's overlay with the attempt's gate, where
    ``cluster.toml`` lists destinations (``ray``: the Ray module, the service's driver;
    ``agents``: the agents' ``info()`` answers); ``overlays`` as they are where it does not.

    Raises:
        BackendUnavailable: a policy, and the attempt is fenced (``overlays`` None): rule 3.
    """
    policy = config.load_egress()
    if policy is None:
        return overlays
    if overlays is None:
        raise BackendUnavailable(f"{config.cluster_file()}: {FENCED}")
    gate = egress.gate_for(policy, attempt.spec.creator, config.load_egress_bounds())
    for problem in gate.problems:
        print(f"[ma_jupyter] job {attempt.job_id}: [network] egress: {problem}", file=sys.stderr, flush=True)
    gate = dataclasses.replace(
        gate,
        job_network=OVERLAY_NETWORK,
        refused=cluster_addresses(ray),
        denied_ports=(*((port, port) for port in fence.cluster_ports(ray)), *agents_ports(agents)),
    )
    return {host: dataclasses.replace(part, egress=gate) for host, part in overlays.items()}


def agents_ports(agents: Iterable[dict]) -> tuple[tuple[int, int], ...]:
    """Every agent's machine's raylet ports and worker port ranges (``info()``'s ``ray_ports``),
    as ``(low, high)`` ranges, each once."""
    found: set[tuple[int, int]] = set()
    for info in agents:
        ports, ranges = info.get("ray_ports") or ([], [])
        found.update((int(port), int(port)) for port in ports)
        found.update((int(low), int(high)) for low, high in ranges)
    return tuple(sorted(found))


def cluster_addresses(ray: Any) -> tuple[ipaddress.IPv4Network, ...]:
    """The service's machine's IPv4 addresses and every Ray node's (the node table's, alive or
    not), each a ``/32``."""
    found = set(egress.own_addresses())
    for record in ray.nodes():
        try:
            found.add(ipaddress.IPv4Address(str(record.get("NodeManagerAddress", ""))))
        except ValueError:
            continue  # an IPv6 node: the gate takes IPv4 destinations only
    return tuple(ipaddress.IPv4Network(address) for address in sorted(found))


def on_this_machine(overlay: Overlay) -> Overlay:
    """Rule 2: ``overlay`` with this machine's raylets' ports and worker port ranges added to its
    gate's denied ports (as it is without a gate); on the agent, before the launch."""
    if overlay.egress is None:
        return overlay
    ports, ranges = fence.raylet_ports()
    denied = (*overlay.egress.denied_ports, *((p, p) for p in sorted(ports)), *ranges)
    return dataclasses.replace(overlay, egress=dataclasses.replace(overlay.egress, denied_ports=denied))
