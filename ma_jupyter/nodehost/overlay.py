"""A job's own network across machines: every node a machine of its own, joined by VXLAN.

On the Ray backend a job's nodes run on several machines, and must reach each other on ports
their frameworks pick as they go (gloo, NCCL, TensorFlow's servers, torch's store) while
nothing else of any machine's network is theirs.  So each machine's part of an attempt is the
local backend's job network (:func:`.network.make_job_network`: a switch namespace holding a
bridge, and per node a namespace of its own with ``ma0`` at the node's own address, a veth into
the bridge), and the switches of one attempt are joined by one VXLAN segment (docs/network.md):

1. the service gives each node of the attempt an overlay address (``10.253.x.y/16``,
   :func:`overlay_address`, in launch order) and each machine of the attempt a
   :class:`Segment`: a UDP port on that machine (the first port the machine's agent reserved
   for the attempt's first node there, free over TCP and UDP when reserved: no other attempt
   of that agent holds it while this one runs; another agent of the same machine may hand out
   the same number, and the two devices then share one socket, told apart by their ids), a
   VXLAN id (random per machine and attempt) and the addresses of its nodes;
2. the machine's agent makes the job network of its nodes, then, from its own namespace, the
   VXLAN device :data:`VXLAN_LINK` with the switch's namespace as its home (one rtnetlink
   request naming the namespace, ``IFLA_NET_NS_FD``), plugged into the switch's bridge: the
   device lives in the switch, its UDP socket in the machine's namespace, so the job's frames
   travel encapsulated over the machine's network while nothing of that network is visible or
   reachable inside, and no node sees the device at all (a node holds ``lo`` and ``ma0``);
3. every node's hardware address is fixed by its overlay address (:func:`overlay_mac`), so the
   device gets, per node of each peer machine, a forwarding entry for that node's hardware
   address (its machine's address, port and VXLAN id: a frame for one node goes to that node's
   machine only), and per peer machine an all-zero forwarding entry (what little is broadcast
   goes to each peer); address learning on the device is off, so the job's frames reach its own
   machines' switches only; and every node gets a permanent neighbour entry for every other node
   of the attempt (no ARP needed);
4. the node runners hold the switch open and enter their own namespaces before they start
   anything (as on the local backend); the switch, its device and the device's UDP socket end
   with the attempt's last runner there, each node's namespace with that node's last process.

A frame arriving at a machine's port is handed to the device of that port and VXLAN id only, so
another attempt's segment on the same machine (another port, another id) never sees it; a job
cannot send one, since it has no route to any machine's address.  What can: anything that sends
UDP to the machines and guesses a port and a 24-bit id (other Ray work on the machines, other
hosts of their network).  VXLAN has no authentication: the segment is as private as the
machines' network, which a Ray cluster must be anyway (its own ports take unauthenticated
connections that run code as the raylets' account).

Standard library only, like :mod:`.network`.
"""

from __future__ import annotations

import os
import re
import socket
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from . import network

if TYPE_CHECKING:
    from .egress import Gate

#: the attempt's VXLAN device, in a machine's switch namespace (a port of its bridge)
VXLAN_LINK = "vx0"
#: the overlay's prefix: one address per node of an attempt
OVERLAY_NET, OVERLAY_PREFIX = (10, 253), 16
#: nodes of one attempt the overlay can hold (its /16, minus network and broadcast addresses,
#: and :data:`EGRESS_GATEWAY`)
MAX_NODES = (1 << (32 - OVERLAY_PREFIX)) - 3
#: the switch's own address where the admin's policy lets jobs out (``[network] egress``): every
#: machine's switch of the attempt holds it (and one hardware address,
#: :func:`.network.make_job_network`), and each node reaches its own machine's only
EGRESS_GATEWAY = f"{OVERLAY_NET[0]}.{OVERLAY_NET[1]}.255.254"
#: the kernel that lets the local bypass be turned off (:func:`_add_vxlan`)
MIN_KERNEL = (6, 7)

IFLA_NET_NS_FD = 28
IFLA_VXLAN_ID, IFLA_VXLAN_LEARNING, IFLA_VXLAN_PORT, IFLA_VXLAN_LOCALBYPASS = 1, 7, 15, 31
RTM_NEWNEIGH = 28
NDA_DST, NDA_LLADDR, NDA_PORT, NDA_VNI = 1, 2, 6, 7
NUD_PERMANENT, NTF_SELF = 0x80, 0x02
AF_BRIDGE = 7
NLM_F_REPLACE, NLM_F_APPEND = 0x100, 0x800


@dataclass(frozen=True)
class Segment:
    """One machine's end of an attempt's overlay (rule 1).

    Attributes:
        underlay: the machine's IPv4 address (the Ray node's).
        port: the UDP port its device listens on, on that machine.
        vni: the VXLAN id its device answers to.
        addresses: the overlay addresses of the attempt's nodes on that machine, each node's
            own.
    """

    underlay: str
    port: int
    vni: int
    addresses: tuple[str, ...]


@dataclass(frozen=True)
class Overlay:
    """A machine's part of an attempt's overlay: its own segment and every other machine's,
    and the attempt's way out where the admin's policy opens one (``egress``: the gate as the
    service resolved it, :mod:`.egress`; None: no way out)."""

    own: Segment
    peers: tuple[Segment, ...]
    egress: Gate | None = None


def overlay_address(index: int) -> str:
    """The overlay address of the ``index``-th node (from 0, launch order) of an attempt.

    Raises:
        ValueError: more nodes than the overlay holds.
    """
    if not 0 <= index < MAX_NODES:
        raise ValueError(f"an attempt's overlay holds at most {MAX_NODES} nodes, not {index + 1}")
    host = index + 1
    return f"{OVERLAY_NET[0]}.{OVERLAY_NET[1]}.{host >> 8}.{host & 0xFF}"


def overlay_mac(address: str) -> bytes:
    """The hardware address of the node holding overlay ``address`` (:func:`.network.node_mac`):
    each peer's is known without asking."""
    return network.node_mac(address)


def is_overlay_address(address: str) -> bool:
    """Whether ``address`` is one :func:`overlay_address` gives."""
    parts = address.split(".")
    return len(parts) == 4 and (parts[0], parts[1]) == tuple(map(str, OVERLAY_NET))


def is_ipv4(address: str) -> bool:
    """Whether ``address`` is a dotted IPv4 address (the only underlay the overlay uses)."""
    try:
        socket.inet_pton(socket.AF_INET, address)
    except OSError:
        return False
    return True


def _ifinfo() -> bytes:
    return struct.pack("BxHiII", socket.AF_UNSPEC, 0, 0, 0, 0)


def _add_vxlan(name: str, vni: int, port: int, namespace_fd: int | None) -> None:
    """Make VXLAN device ``name`` from the calling thread's namespace (its UDP socket's home),
    placed in the namespace of ``namespace_fd`` (rule 2), learning off (rule 3)."""
    data = (
        network.rt_attr(IFLA_VXLAN_ID, struct.pack("I", vni))
        + network.rt_attr(IFLA_VXLAN_PORT, struct.pack("!H", port))
        + network.rt_attr(IFLA_VXLAN_LEARNING, b"\0")
        # a peer on this very machine (two Ray nodes of one machine) still gets the frame over
        # the machine's network: the kernel's shortcut into the peer's device (Linux 6.7+)
        # keeps the sender's route on it, and the peer's namespace drops it
        + network.rt_attr(IFLA_VXLAN_LOCALBYPASS, b"\0")
    )
    linkinfo = network.rt_attr(network.IFLA_INFO_KIND, b"vxlan") + network.rt_attr(
        network.IFLA_INFO_DATA, data
    )
    body = _ifinfo() + network.rt_attr(network.IFLA_IFNAME, name.encode() + b"\0")
    body += network.rt_attr(network.IFLA_LINKINFO, linkinfo)
    if namespace_fd is not None:
        body += network.rt_attr(IFLA_NET_NS_FD, struct.pack("I", namespace_fd))
    network.netlink_request(
        network.RTM_NEWLINK,
        network.NLM_F_CREATE | network.NLM_F_EXCL,
        body,
        f"cannot make the job's VXLAN device (id {vni}, UDP port {port})",
    )


def _neighbour(device: str, family: int, flags: int, ndm_flags: int, attrs: bytes, what: str) -> None:
    """One RTM_NEWNEIGH on ``device`` of the calling thread's namespace, permanent."""
    ndmsg = struct.pack("BxxxiHBB", family, socket.if_nametoindex(device), NUD_PERMANENT, ndm_flags, 0)
    network.netlink_request(RTM_NEWNEIGH, network.NLM_F_CREATE | flags, ndmsg + attrs, what)


def _add_peer(peer: Segment) -> None:
    """Rule 3 for ``peer``, from the switch's namespace: a forwarding entry per node of the
    peer machine, and its all-zero forwarding entry."""
    where = (
        network.rt_attr(NDA_DST, socket.inet_aton(peer.underlay))
        + network.rt_attr(NDA_PORT, struct.pack("!H", peer.port))
        + network.rt_attr(NDA_VNI, struct.pack("I", peer.vni))
    )
    what = f"cannot add the peer {peer.underlay}:{peer.port} to the job's VXLAN device"
    for address in peer.addresses:
        mac = network.rt_attr(NDA_LLADDR, overlay_mac(address))
        _neighbour(VXLAN_LINK, AF_BRIDGE, NLM_F_REPLACE, NTF_SELF, mac + where, what)
    zero = network.rt_attr(NDA_LLADDR, b"\0" * 6)
    _neighbour(VXLAN_LINK, AF_BRIDGE, NLM_F_APPEND, NTF_SELF, zero + where, what)


def _add_neighbour(address: str, device: str = network.NODE_LINK) -> None:
    """Rule 3's neighbour entry for node ``address`` (or the gateway), from a node's namespace
    (or the switch's, ``device`` its bridge)."""
    attrs = network.rt_attr(NDA_DST, socket.inet_aton(address)) + network.rt_attr(
        NDA_LLADDR, overlay_mac(address)
    )
    _neighbour(device, socket.AF_INET, NLM_F_REPLACE, 0, attrs, f"cannot add the neighbour {address}")


def make(folder: Path, key: str, nodes: list[tuple[str, str]], overlay: Overlay) -> network.JobNetwork:
    """This machine's part of the attempt's network (rules 2-3): the job network of ``nodes``
    (``(name, overlay address)``, :func:`.network.make_job_network`, kept in ``folder`` under
    ``key``) with the attempt's VXLAN device in its switch, joined to the peers of ``overlay``.

    With ``overlay.egress`` (the admin's policy), the switch's bridge also holds
    :data:`EGRESS_GATEWAY` and every node routes the TCP that is not for the overlay there
    (:func:`.network.make_job_network`'s ``gateway``); each node, and the bridge for each node of
    this machine, gets the other's hardware address as a permanent neighbour, so no ARP for the
    gateway or a node of this machine ever crosses to the other machines' switches (each of which
    holds the same gateway).

    The calling thread must be in this machine's own network namespace (the device's UDP socket
    is made there).

    Raises:
        OSError: it cannot be made (no CAP_NET_ADMIN, no VXLAN in this kernel, the UDP port
            taken); nothing of it is left.
    """
    gated = overlay.egress is not None
    made = network.make_job_network(folder, key, nodes, gateway=gated, gateway_at=EGRESS_GATEWAY)
    try:
        switch = made.switch
        if switch is None:  # make_job_network always makes one
            raise OSError(0, "the job network has no switch")
        fd = os.open(switch, os.O_RDONLY | os.O_CLOEXEC)
        try:
            _add_vxlan(VXLAN_LINK, overlay.own.vni, overlay.own.port, fd)
        finally:
            os.close(fd)

        def in_switch() -> None:
            network.enter(str(switch))
            try:
                # up opens the UDP socket, in the machine's namespace
                network.set_link(VXLAN_LINK, master=socket.if_nametoindex(network.SWITCH_BRIDGE))
            except OSError as exc:
                raise OSError(
                    exc.errno,
                    f"cannot open UDP port {overlay.own.port} of this machine for the job's "
                    f"network: {os.strerror(exc.errno or 0)}",
                ) from None
            for peer in overlay.peers:
                _add_peer(peer)
            if gated:  # the gateway answers its own nodes without asking the overlay
                for _name, address in nodes:
                    _add_neighbour(address, network.SWITCH_BRIDGE)

        network.in_thread(in_switch)
        everyone = [a for segment in (overlay.own, *overlay.peers) for a in segment.addresses]
        for (_name, own), (path, _inode) in zip(nodes, made.nodes.values(), strict=True):

            def in_node(path: Path = path, own: str = own) -> None:
                network.enter(str(path))
                for address in everyone:
                    if address != own:
                        _add_neighbour(address)
                if gated:
                    _add_neighbour(EGRESS_GATEWAY)

            network.in_thread(in_node)
    except BaseException:
        network.remove_job_network(made)
        raise
    return made


def supported() -> str | None:
    """None where this process can make overlays (root, a kernel with VXLAN), else why not.

    It makes one in a namespace of a short thread, gone with it (a few milliseconds).
    """
    if not network.namespaces_supported():
        return "the platform's agent does not run as root"
    release = tuple(int(part) for part in re.findall(r"\d+", os.uname().release)[:2])
    if release < MIN_KERNEL:
        # before 6.7 the local bypass cannot be turned off: two Ray nodes of one machine
        # could not reach each other (rule 3's note in _add_vxlan)
        return f"Linux {MIN_KERNEL[0]}.{MIN_KERNEL[1]} or later is needed (this is {os.uname().release})"

    def probe() -> None:
        network.unshare_network()
        _add_vxlan(VXLAN_LINK, 1, 4789, None)

    try:
        network.in_thread(probe)
    except OSError as exc:
        return f"this machine cannot make VXLAN devices: {exc.strerror or exc}"
    return None


def probe(folder: Path, key: str, underlay: str, ports: tuple[int, int], timeout: float = 2.0) -> str | None:
    """Whether this machine can give an attempt its part of an overlay and reach its peers over
    it, tried as an attempt would: why not in a sentence, or None when it can (the Ray node
    checks, ``backends/ray/network_check.py``).

    1. two parts of one overlay are made in ``folder`` (``<key>a``, ``<key>b``), as two machines
       of an attempt would make theirs (:func:`make`): each a switch with its VXLAN device on
       UDP port ``ports[k]`` of this machine's ``underlay`` address (its Ray node's), and one
       node; each the other's peer;
    2. the first part's node crosses to the second's (:func:`.network.cross_probe`): the frames
       leave through the first device, travel UDP over the machine's own network to
       ``underlay`` (the kernel's local shortcut is off, rule 3's note in :func:`_add_vxlan`)
       and enter through the second: what stops a peer machine's frames at this machine's
       network (a firewall, a port that cannot be opened, no VXLAN) stops these;
    3. both parts are forgotten, whatever happened.

    The calling thread must be in this machine's own network namespace (as for :func:`make`).
    """
    addresses = (overlay_address(0), overlay_address(1))
    first = 1 + int.from_bytes(os.urandom(3), "big") % ((1 << 24) - 2)
    vnis = (first, first % ((1 << 24) - 2) + 1)  # two ids, each device its own
    segments = [
        Segment(underlay, port, vni, (address,))
        for port, vni, address in zip(ports, vnis, addresses, strict=True)
    ]
    made: list[network.JobNetwork] = []
    try:
        for k, part in enumerate("ab"):
            nodes = [(f"probe-{k}", addresses[k])]
            made.append(make(folder, f"{key}{part}", nodes, Overlay(segments[k], (segments[1 - k],))))
        ends = [str(next(iter(m.nodes.values()))[0]) for m in made]
        why = network.cross_probe(ends[0], ends[1], addresses[1], addresses[0], timeout)
        return None if why is None else f"{why} (over the overlay: VXLAN, UDP through {underlay})"
    except OSError as exc:
        return f"the job's overlay cannot be made: {exc.strerror or exc}"
    finally:
        for m in made:
            network.remove_job_network(m)
