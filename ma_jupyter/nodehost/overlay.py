"""A job's own network across machines: a namespace per job and machine, joined by VXLAN.

On the Ray backend a job's nodes run on several machines, and must reach each other on ports
their frameworks pick as they go (gloo, NCCL, TensorFlow's servers, torch's store) while
nothing else of any machine's network is theirs.  So each machine's part of an attempt gets its
own network namespace, as the local backend's attempt does, and the namespaces of one attempt
are joined by one VXLAN segment (docs/network.md):

1. the service gives each machine of the attempt a :class:`Segment`: an overlay address
   (``10.253.x.y/16``, :func:`overlay_address`), a UDP port on that machine (the first port
   the machine's agent reserved for the attempt's first node there, free over TCP and UDP when
   reserved: no other attempt of that agent holds it while this one runs; another agent of the
   same machine may hand out the same number, and the two devices then share one socket, told
   apart by their ids) and a VXLAN id (random per machine and attempt);
2. the machine's agent makes the namespace (``lo`` up, nothing else), then, from its own
   namespace, the VXLAN device ``ma0`` with the job's namespace as its home (one rtnetlink
   request naming the namespace, ``IFLA_NET_NS_FD``): the device lives in the job's namespace,
   its UDP socket in the machine's, so the job's frames travel encapsulated over the machine's
   network while nothing of that network is visible or reachable inside;
3. every device's hardware address is fixed by its overlay address (:func:`overlay_mac`), so
   inside, the device gets the overlay address, and per peer machine a forwarding entry for the
   peer's hardware address (its machine's address, port and VXLAN id: a frame for one peer goes
   to that peer only), a permanent neighbour entry (no ARP needed), and an all-zero forwarding
   entry (what little is broadcast goes to each peer); address learning is off, so the job's
   frames reach its own machines' namespaces only;
4. the node runners enter the namespace before they start anything (as on the local backend);
   the namespace, its device and the device's UDP socket end with the job's last process.

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

from . import network

#: the job's device in its namespace
LINK = "ma0"
#: the overlay's prefix: one address per machine of an attempt
OVERLAY_NET, OVERLAY_PREFIX = (10, 253), 16
#: machines of one attempt the overlay can hold (its /16, minus network and broadcast)
MAX_MACHINES = (1 << (32 - OVERLAY_PREFIX)) - 2
#: the kernel that lets the local bypass be turned off (:func:`_add_vxlan`)
MIN_KERNEL = (6, 7)

IFLA_ADDRESS, IFLA_NET_NS_FD = 1, 28
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
        address: the job's address on the overlay there (every node of the attempt on that
            machine has it).
    """

    underlay: str
    port: int
    vni: int
    address: str


@dataclass(frozen=True)
class Overlay:
    """A machine's part of an attempt's overlay: its own segment and every other machine's."""

    own: Segment
    peers: tuple[Segment, ...]


def overlay_address(index: int) -> str:
    """The overlay address of the ``index``-th machine (from 0) of an attempt.

    Raises:
        ValueError: more machines than the overlay holds.
    """
    if not 0 <= index < MAX_MACHINES:
        raise ValueError(f"an attempt's overlay holds at most {MAX_MACHINES} machines")
    host = index + 1
    return f"{OVERLAY_NET[0]}.{OVERLAY_NET[1]}.{host >> 8}.{host & 0xFF}"


def overlay_mac(address: str) -> bytes:
    """The hardware address of the device holding overlay ``address`` (locally administered,
    ``02:00`` then the address's four bytes): each peer's is known without asking."""
    return b"\x02\x00" + socket.inet_aton(address)


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


def _add_vxlan(name: str, vni: int, port: int, namespace_fd: int | None, mac: bytes | None = None) -> None:
    """Make VXLAN device ``name`` from the calling thread's namespace (its UDP socket's home),
    placed in the namespace of ``namespace_fd`` (rule 2), learning off, with hardware address
    ``mac`` where given (rule 3)."""
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
    if mac is not None:
        body += network.rt_attr(IFLA_ADDRESS, mac)
    if namespace_fd is not None:
        body += network.rt_attr(IFLA_NET_NS_FD, struct.pack("I", namespace_fd))
    network.netlink_request(
        network.RTM_NEWLINK,
        network.NLM_F_CREATE | network.NLM_F_EXCL,
        body,
        f"cannot make the job's VXLAN device (id {vni}, UDP port {port})",
    )


def _neighbour(family: int, flags: int, ndm_flags: int, attrs: bytes, what: str) -> None:
    """One RTM_NEWNEIGH on device :data:`LINK` of the calling thread's namespace, permanent."""
    ndmsg = struct.pack("BxxxiHBB", family, socket.if_nametoindex(LINK), NUD_PERMANENT, ndm_flags, 0)
    network.netlink_request(RTM_NEWNEIGH, network.NLM_F_CREATE | flags, ndmsg + attrs, what)


def _add_peer(peer: Segment) -> None:
    """Rule 3 for ``peer``, from the device's namespace: its forwarding entry, its neighbour
    entry and its all-zero forwarding entry."""
    mac = overlay_mac(peer.address)
    where = (
        network.rt_attr(NDA_DST, socket.inet_aton(peer.underlay))
        + network.rt_attr(NDA_PORT, struct.pack("!H", peer.port))
        + network.rt_attr(NDA_VNI, struct.pack("I", peer.vni))
    )
    what = f"cannot add the peer {peer.underlay}:{peer.port} to the job's VXLAN device"
    _neighbour(AF_BRIDGE, NLM_F_REPLACE, NTF_SELF, network.rt_attr(NDA_LLADDR, mac) + where, what)
    _neighbour(AF_BRIDGE, NLM_F_APPEND, NTF_SELF, network.rt_attr(NDA_LLADDR, b"\0" * 6) + where, what)
    address = network.rt_attr(NDA_DST, socket.inet_aton(peer.address)) + network.rt_attr(NDA_LLADDR, mac)
    _neighbour(socket.AF_INET, NLM_F_REPLACE, 0, address, f"cannot add the neighbour {peer.address}")


def make(path: Path, overlay: Overlay) -> int:
    """Make the attempt's namespace on this machine, joined to its peers (rules 2-3), kept at
    ``path`` as :func:`.network.make_namespace` keeps one; its inode number.

    The calling thread must be in this machine's own network namespace (the device's UDP socket
    is made there).

    Raises:
        OSError: it cannot be made (no CAP_NET_ADMIN, no VXLAN in this kernel, the UDP port
            taken); nothing of it is left.
    """
    inode = network.make_namespace(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            _add_vxlan(LINK, overlay.own.vni, overlay.own.port, fd, overlay_mac(overlay.own.address))
        finally:
            os.close(fd)

        def inside() -> None:
            network.enter(str(path))
            try:
                # up opens the UDP socket, in the machine's namespace
                network.set_up(LINK, overlay.own.address, OVERLAY_PREFIX)
            except OSError as exc:
                raise OSError(
                    exc.errno,
                    f"cannot open UDP port {overlay.own.port} of this machine for the job's "
                    f"network: {os.strerror(exc.errno or 0)}",
                ) from None
            for peer in overlay.peers:
                _add_peer(peer)

        network.in_thread(inside)
    except BaseException:
        network.remove_namespace(path)
        raise
    return inode


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
        _add_vxlan(LINK, 1, 4789, None)

    try:
        network.in_thread(probe)
    except OSError as exc:
        return f"this machine cannot make VXLAN devices: {exc.strerror or exc}"
    return None
