"""A job's way out, where the admin's policy opens one (``[network] egress``, docs/network.md).

The local backend's job network has no route out (:mod:`.network`).  With a policy, an
attempt's network gets one gate, in its switch namespace, which no process of the job can
enter or change (the job's nodes have no capability in their own namespace either):

1. **route**: the switch's bridge holds :data:`.network.EGRESS_GATEWAY` and every node routes
   the TCP that is not for the job network there (:func:`.network.make_job_network`,
   ``gateway``); anything else that is not for the job network is unroutable in the node
   (``Network is unreachable`` at once, :func:`.network.only_tcp_out`);
2. **filter** (the kernel, nftables in the switch namespace, :func:`ruleset`): a TCP
   connection to a destination of the policy (address or network, port) is redirected to the
   forwarder's port on the gateway; every other TCP connection from a node that is not for the
   job network is refused at once (a reset: ``Connection refused``), anything else that gets
   here is dropped, and so is any packet for the gateway itself that was not redirected;
3. **forward** (the service, :class:`Forwarder`): it accepts the redirected connection in the
   switch namespace, reads its original destination (``SO_ORIGINAL_DST``), checks it again
   against the policy and against this machine's own addresses (any interface's, and all of
   ``127.0.0.0/8``: a network in the policy that holds one of them never reaches it), and
   connects to it from the service's own network namespace, then copies bytes both ways.
   Nothing of the host's routing or firewall changes: no forwarding, no NAT rule, no address
   of the machine is touched; what leaves is a connection of the service's account.

Why one module: the gate's three steps are one contract (the rules the kernel loads, the
forwarder that checks each connection again, and the bounds it keeps) and change together; the
names it resolves live apart (:mod:`.egress_names`).

On the Ray backend the same gate sits in each Ray node's agent, for that machine's part of an
attempt's overlay (``backends/ray/egress_gate.py``): the service resolves the :class:`Gate`
(its :attr:`Gate.job_network` the overlay, with the cluster's addresses and ports
:attr:`Gate.refused` and :attr:`Gate.denied_ports`) and sends it with the launch; the agent
opens it and runs the forwarder, connecting from its machine's network.

Host names of the policy are looked up ahead of the launches (:class:`.egress_names.Names`: when first
listed or asked for, then every :data:`.egress_names.NAME_TTL` seconds, on a thread of their own), and an
attempt's gate takes the addresses known when it starts (:func:`gate_for`: a launch never waits
on a name server): they join the filter and are written into each node's ``/etc/hosts`` (the
nodes look names up there only), so a job reaches a listed name, and no other name resolves.  A
name not known (yet), or resolving to this machine's own address, is left out, with a problem
line (in the service log and as a comment in the nodes' ``/etc/hosts``); of a name with more
than :data:`.egress_names.MAX_NAME_ADDRESSES` addresses only the first are taken, with such a line.  Only TCP goes out:
UDP (a name server, QUIC) is unreachable.

Bounds (:class:`Forwarder`'s rules): at most :data:`MAX_CONNECTIONS` relayed connections per
attempt at once, ``[network] egress_relays_per_user`` per user over all of that user's
attempts, and :func:`max_relays` in the whole service (from its descriptor limit: 85 under the
common 1024; one more is reset at once); ``egress_connect_timeout`` seconds to reach a
destination, ``egress_idle_timeout`` seconds of silence both ways before a relay is reset
(:class:`..config.EgressBounds`); a pipe each way moving :data:`CHUNK` bytes at a time.  The
forwarder ends, and with it the gate, once no runner of the
attempt lives (within a second).  A service that restarts while the attempt runs opens the
gate's socket again in the switch a runner holds (:func:`reopen_gate`), checking with the policy
as the file says then (``"none"``: it stays closed, every redirected connection refused).
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import shutil
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from ..config import EgressBounds, EgressRule
from ..errors import BackendUnavailable
from . import egress_names, network

#: the forwarder's port on the gateway, in the switch namespace (each attempt's own)
FORWARDER_PORT = 1080
#: the nftables table of the gate, in the switch namespace
TABLE = "ma_egress"
#: relayed connections one attempt may hold at once
MAX_CONNECTIONS = 64
#: descriptors one relayed connection holds (two sockets, a pipe each way)
RELAY_DESCRIPTORS = 6
#: descriptors of the service's limit that relays never take (its API, database, logs, jobs)
KEPT_DESCRIPTORS = 512


def max_relays() -> int:
    """Relayed connections the whole service may hold at once: what its descriptor limit
    (``RLIMIT_NOFILE``) leaves after :data:`KEPT_DESCRIPTORS`, at most 1024 (a flood of
    connections by jobs never takes the descriptors the service needs)."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return 1024
    return max(0, min(1024, (soft - KEPT_DESCRIPTORS) // RELAY_DESCRIPTORS))


#: relayed connections of every attempt's forwarder now (guarded by ``_all_lock``)
_all_relays = [0]
#: relayed connections of each user's attempts now (guarded by ``_all_lock``; a user holding
#: none has no entry)
_user_relays: dict[str, int] = {}
_all_lock = threading.Lock()
#: seconds between two lines of the service log about one attempt's refusals of one kind
TELL_EVERY = 10.0
CHUNK = 65536
SO_ORIGINAL_DST = 80
NS_GET_NSTYPE = 0xB703  # _IO(0xb7, 0x3)
LOOPBACK = ipaddress.IPv4Network("127.0.0.0/8")
JOB_NETWORK = ipaddress.IPv4Network(f"{network.JOB_NETWORK}/{network.JOB_PREFIX}")
#: link-local addresses: a cloud's metadata service (169.254.169.254 answers with the machine's
#: identity) lies there, so a destination reaches them only when it names exactly one address
LINK_LOCAL = ipaddress.IPv4Network("169.254.0.0/16")


@dataclass(frozen=True)
class Destination:
    """One destination an attempt's nodes may connect to: an IPv4 network and its TCP port
    ranges (``()``: every port)."""

    network: ipaddress.IPv4Network
    ports: tuple[tuple[int, int], ...] = ()

    def allows(self, address: ipaddress.IPv4Address, port: int) -> bool:
        if address in LINK_LOCAL and self.network.num_addresses != 1:
            return False  # a broad entry (0.0.0.0/0, 169.254.0.0/16) never opens the metadata service
        return address in self.network and (not self.ports or any(lo <= port <= hi for lo, hi in self.ports))


@dataclass(frozen=True)
class Gate:
    """An attempt's policy as resolved when it starts (:func:`resolve`).

    Attributes:
        destinations: what its nodes may connect to.
        hosts: ``/etc/hosts`` lines for the policy's host names (address, name).
        problems: names left out, and why (told in the service log and as a comment in the
            nodes' ``/etc/hosts``).
        user: whose attempt it is (its relays count against that user's share), or None.
        bounds: the admin's bounds on relays (``[network]``: idle and connect time, per user).
        job_network: the network the attempt's nodes are on (the local backend's job network,
            or a Ray attempt's overlay); its last address but one is the gateway.
        refused: networks never reached, whatever the policy lists, besides this machine's own
            addresses (a Ray attempt's: the service's machine and every Ray node).
        denied_ports: TCP port ranges never reached on any address (a Ray attempt's: the
            cluster's ports, ``backends/ray/egress_gate.py``).
    """

    destinations: tuple[Destination, ...]
    hosts: tuple[tuple[str, str], ...] = ()
    problems: tuple[str, ...] = ()
    user: str | None = None
    bounds: EgressBounds = EgressBounds()
    job_network: ipaddress.IPv4Network = JOB_NETWORK
    refused: tuple[ipaddress.IPv4Network, ...] = ()
    denied_ports: tuple[tuple[int, int], ...] = ()

    @property
    def gateway(self) -> str:
        """The gateway's address on the job network (its last address but one)."""
        return str(self.job_network.broadcast_address - 1)

    def allows(self, address: str, port: int) -> bool:
        """Whether a node may connect to ``address:port``: a destination of the policy, never
        the job network, this machine's own address (:func:`is_own`), a refused network or a
        denied port."""
        try:
            ip = ipaddress.IPv4Address(address)
        except ValueError:
            return False
        if ip in self.job_network or is_own(ip) or any(ip in net for net in self.refused):
            return False
        if any(lo <= port <= hi for lo, hi in self.denied_ports):
            return False
        return any(d.allows(ip, port) for d in self.destinations)


#: (monotonic time, addresses) of the last look at this machine's interfaces: a job opening and
#: closing connections quickly makes the forwarder ask for each, which must not cost a walk each
_OWN: list = [float("-inf"), frozenset()]
#: seconds a look at the interfaces is used again
OWN_ADDRESSES_FRESH = 1.0


def own_addresses() -> frozenset[ipaddress.IPv4Address]:
    """This machine's IPv4 addresses now, every interface's (of the service's namespace), looked
    at again once the last look is :data:`OWN_ADDRESSES_FRESH` seconds old."""
    when, found = _OWN
    if time.monotonic() - when < OWN_ADDRESSES_FRESH:
        return found
    import psutil

    fresh = set()
    for addresses in psutil.net_if_addrs().values():
        for entry in addresses:
            if entry.family == socket.AF_INET:
                with contextlib.suppress(ValueError):
                    fresh.add(ipaddress.IPv4Address(entry.address))
    _OWN[:] = [time.monotonic(), frozenset(fresh)]
    return _OWN[1]


def is_own(address: ipaddress.IPv4Address) -> bool:
    """Whether ``address`` is this machine (loopback, unspecified, broadcast, multicast, or an
    address of one of its interfaces now)."""
    return (
        address in LOOPBACK
        or address.is_unspecified
        or address.is_multicast
        or address == ipaddress.IPv4Address("255.255.255.255")
        or address in own_addresses()
    )


def gate_for(
    rules: Iterable[EgressRule], user: str | None = None, bounds: EgressBounds | None = None
) -> Gate:
    """The policy ``rules`` for one attempt of ``user``, its host names' addresses as
    :data:`.egress_names.NAMES` knows them now (never waiting on a name server); a name not known, or that
    resolves to this machine's own address, is left out with a problem line."""
    rules = list(rules)
    looked, problems = egress_names.NAMES.addresses(sorted({r.host for r in rules if r.host}))
    return _gate(rules, looked, problems, user, bounds or EgressBounds())


def resolve(rules: Iterable[EgressRule], timeout: float = egress_names.RESOLVE_TIMEOUT, **kwargs) -> Gate:
    """:func:`gate_for`, once each host name was looked up (waiting up to ``timeout`` seconds):
    off the launch path only."""
    rules = list(rules)
    egress_names.NAMES.wait(sorted({r.host for r in rules if r.host}), timeout)
    return gate_for(rules, **kwargs)


def _gate(
    rules: list[EgressRule],
    looked: dict[str, tuple[str, ...]],
    problems: list[str],
    user: str | None,
    bounds: EgressBounds,
) -> Gate:
    usable: dict[str, tuple[str, ...]] = {}
    for name, addresses in looked.items():
        own = [
            a
            for a in addresses
            if is_own(ipaddress.IPv4Address(a)) or ipaddress.IPv4Address(a) in JOB_NETWORK
        ]
        if own:
            problems.append(
                f"{name}: resolves to this machine's own address {own[0]}, which jobs never reach"
            )
        elif len(addresses) > egress_names.MAX_NAME_ADDRESSES:
            problems.append(
                f"{name}: resolves to more than {egress_names.MAX_NAME_ADDRESSES} addresses: only the first "
                f"{egress_names.MAX_NAME_ADDRESSES} are reachable"
            )
            usable[name] = addresses[: egress_names.MAX_NAME_ADDRESSES]
        else:
            usable[name] = addresses
    destinations = []
    hosts = []
    for rule in rules:
        if rule.network:
            destinations.append(Destination(ipaddress.IPv4Network(rule.network), rule.ports))
        for address in usable.get(rule.host or "", ()):
            destinations.append(Destination(ipaddress.IPv4Network(address), rule.ports))
            if (address, rule.host) not in hosts:
                hosts.append((address, rule.host))
    return Gate(tuple(destinations), tuple(hosts), tuple(sorted(problems)), user, bounds)


def hosts_lines(gate: Gate) -> str:
    """The lines a node's ``/etc/hosts`` gets for the policy's names, and a comment per name
    left out (what a job's user can read for why a listed name does not resolve)."""
    left_out = "".join(f"# [network] egress left out {' '.join(p.split())}\n" for p in gate.problems)
    return left_out + "".join(f"{address}\t{name}\n" for address, name in gate.hosts)


def merged(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """``ranges`` (``(low, high)``, inclusive) as the fewest ranges covering the same ports, in
    order, none overlapping or touching another."""
    out: list[tuple[int, int]] = []
    for low, high in sorted(ranges):
        if out and low <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], high))
        else:
            out.append((low, high))
    return out


def ruleset(gate: Gate, own: Iterable[ipaddress.IPv4Address] = ()) -> str:
    """The nftables rules of the gate (module rule 2), for ``nft -f -`` in the switch namespace;
    ``own``: this machine's addresses now, never redirected (the forwarder checks again at each
    connection, since addresses change)."""
    # an interval set takes no overlapping elements (nft refuses them): merged first
    never = ipaddress.collapse_addresses([LOOPBACK, *(ipaddress.IPv4Network(a) for a in own), *gate.refused])
    mine = ", ".join(str(n) for n in never)
    redirects = [f"    ip daddr {{ {mine} }} return\n"]
    if gate.denied_ports:
        denied = ", ".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in merged(gate.denied_ports))
        redirects.append(f"    tcp dport {{ {denied} }} return\n")
    inside, gateway = gate.job_network, gate.gateway
    for d in gate.destinations:
        ports = ", ".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in d.ports)
        match = f"tcp dport {{ {ports} }} " if ports else "meta l4proto tcp "
        redirects.append(f"    ip daddr {d.network} {match}redirect to :{FORWARDER_PORT}\n")
    return (
        f"table ip {TABLE} {{\n"
        # the job's own traffic between its nodes (bridged, which the bridge's netfilter shows
        # here too) is never tracked: no cost, no connection table to fill
        "  chain untracked {\n"
        "    type filter hook prerouting priority raw; policy accept;\n"
        f"    ip saddr {inside} ip daddr {inside} ip daddr != {gateway} notrack\n"
        "  }\n"
        "  chain out {\n"
        "    type nat hook prerouting priority dstnat; policy accept;\n"
        f"    ip daddr {inside} return\n"
        f"{''.join(redirects)}"
        "  }\n"
        "  chain gate {\n"
        "    type filter hook prerouting priority filter; policy accept;\n"
        "    meta pkttype { broadcast, multicast } accept\n"
        f"    ct status dnat ip daddr {gateway} tcp dport {FORWARDER_PORT} accept\n"
        f"    ip daddr {gateway} meta l4proto tcp reject with tcp reset\n"
        f"    ip daddr {gateway} drop\n"
        f"    ip daddr {inside} accept\n"
        "    meta l4proto tcp reject with tcp reset\n"
        # ICMP sent from this bridge's prerouting never reaches the node's socket (measured):
        # anything but TCP is dropped (UDP: no answer)
        "    drop\n"
        "  }\n"
        "}\n"
    )


def nft_program() -> str | None:
    """The ``nft`` program (Debian's ``nftables``), or None."""
    return shutil.which("nft") or next((p for p in ("/usr/sbin/nft", "/sbin/nft") if Path(p).exists()), None)


def why_not_enforceable() -> str | None:
    """Why this service cannot enforce a policy (None: it can): its jobs need namespaces of their
    own (a root service) and the gate needs ``nft``."""
    if not network.namespaces_supported():
        return (
            "this service runs as an ordinary user: its jobs share its network (they reach what "
            "it reaches), so no egress policy can be enforced; run the service as root, or set "
            'egress = "none"'
        )
    if nft_program() is None:
        return "the gate needs the nft program: install Debian's nftables (./dev setup does)"
    return None


def refusal(rules: Iterable[EgressRule]) -> str | None:
    """Why this service refuses the policy ``rules`` at its start (None: it takes it):
    :func:`why_not_enforceable`, or an entry that is one of this machine's own addresses."""
    return why_not_enforceable() or own_entry(rules)


def own_entry(rules: Iterable[EgressRule]) -> str | None:
    """Why an entry of ``rules`` is refused at the start: one of this machine's own addresses
    (None: none is)."""
    for rule in rules:
        if rule.network:
            net = ipaddress.IPv4Network(rule.network)
            if net.num_addresses == 1 and is_own(net.network_address):
                return f"{rule.text!r} is this machine's own address, which jobs never reach"
    return None


def open_gate(switch: Path, gate: Gate) -> socket.socket:
    """Load the gate's rules into the switch namespace kept at ``switch`` and open the
    forwarder's listening socket there (it stays in that namespace, whichever thread uses it).

    Raises:
        BackendUnavailable: the rules cannot be loaded (the message has nft's).
    """
    program = nft_program()
    if program is None:
        raise BackendUnavailable(why_not_enforceable() or "no nft program")

    rules = ruleset(gate, own_addresses())  # the service's own namespace's, before entering

    def load() -> socket.socket:
        network.enter(str(switch))
        # a child starts in the namespace of the thread that starts it
        done = subprocess.run(
            [program, "-f", "-"],
            input=rules,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if done.returncode:
            raise BackendUnavailable(f"cannot load the job's egress rules: {done.stderr.strip()[:500]}")
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((gate.gateway, FORWARDER_PORT))
        listener.listen(MAX_CONNECTIONS)
        return listener

    return network.in_thread(load)


def switch_of(runner: int) -> str | None:
    """The path of the switch namespace node runner ``runner`` holds open
    (:func:`.network.hold_switch`): its one descriptor of a network namespace other than its
    own (the kernel says which kind a namespace descriptor is: ``NS_GET_NSTYPE``); None where it
    holds none (or is gone)."""
    try:
        own = os.stat(f"/proc/{runner}/ns/net")
        entries = os.listdir(f"/proc/{runner}/fd")
    except OSError:
        return None
    for entry in entries:
        path = f"/proc/{runner}/fd/{entry}"
        try:  # looked at before it is opened: nothing but a namespace is ever opened
            st = os.stat(path)
        except OSError:
            continue
        if st.st_dev != own.st_dev or st.st_ino == own.st_ino:
            continue  # not a namespace, or the runner's own
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            if os.fstat(fd).st_ino == st.st_ino and fcntl.ioctl(fd, NS_GET_NSTYPE) == network.CLONE_NEWNET:
                return path
        except OSError:
            continue
        finally:
            os.close(fd)
    return None


def reopen_gate(runner: int) -> socket.socket | None:
    """The forwarder's listening socket again, in the switch of a running attempt whose gate
    lost its forwarder (the service that launched it ended; its rules stay in the switch);
    None where that attempt has no gate (no gateway address on its switch) or is gone."""
    switch = switch_of(runner)
    if switch is None:
        return None

    def listen() -> socket.socket | None:
        network.enter(switch)
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((network.EGRESS_GATEWAY, FORWARDER_PORT))
            listener.listen(MAX_CONNECTIONS)
        except OSError:  # no gateway there: an attempt launched without a policy
            listener.close()
            return None
        return listener

    try:
        return network.in_thread(listen)
    except OSError:
        return None


def original_destination(conn: socket.socket) -> tuple[str, int]:
    """Where a redirected connection was headed (``SO_ORIGINAL_DST``)."""
    raw = conn.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    port, packed = struct.unpack_from("!2xH4s", raw)
    return socket.inet_ntoa(packed), port


@dataclass
class _Relay:
    """One relayed connection: the job's end, the destination's (once made), whether the
    destination answered, when a byte last moved either way (monotonic; set by the copying
    threads), and whether it was ended here."""

    conn: socket.socket
    address: str
    port: int
    upstream: socket.socket | None = None
    connected: bool = False
    moved_at: float = 0.0
    ended: bool = False


class Forwarder:
    """The service's end of an attempt's gate (module rule 3): accepts in the switch namespace,
    connects from the service's own, copies both ways; ends when ``alive()`` turns false (no
    runner of the attempt left), closing every connection.

    A hostile job neither stalls nor floods the service through it:

    1. a connection is relayed only while the attempt holds fewer than :data:`MAX_CONNECTIONS`,
       its user's attempts together fewer than ``gate.bounds.relays_per_user``, and the whole
       service fewer than :func:`max_relays`; else it is reset at once, never queued;
    2. the destination must answer within ``gate.bounds.connect_timeout`` seconds;
    3. a relay silent both ways for ``gate.bounds.idle_timeout`` seconds once its destination
       answered is reset (looked at every second);
    4. each refusal or closing of rules 1 to 3 is told in the service log, one line per kind and
       attempt at most every :data:`TELL_EVERY` seconds, with the count since the last.

    Args:
        listener: from :func:`open_gate`.
        gate: the attempt's resolved policy, its user and the bounds.
        alive: whether a runner of the attempt still lives (asked every second).
        name: for thread names and log lines (``<job id>-<attempt>``).
        tell: where log lines go (the service log by default).
    """

    def __init__(
        self,
        listener: socket.socket,
        gate: Gate,
        alive: Callable[[], bool],
        name: str,
        tell: Callable[[str], None] | None = None,
    ):
        self._listener = listener
        self._gate = gate
        self._alive = alive
        self._name = name
        self._tell = tell or _to_service_log
        self._lock = threading.Lock()
        self._relays: list[_Relay] = []  # connections being relayed now
        self._told: dict[str, tuple[float, int]] = {}  # kind -> (when last told, untold since)
        self._closed = threading.Event()
        listener.settimeout(1.0)
        self._thread = threading.Thread(target=self._serve, name=f"egress-{name}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """End the gate: no new connection, every relayed one closed."""
        self._closed.set()

    def running(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _serve(self) -> None:
        next_look = time.monotonic() + 1.0
        try:
            while not self._closed.is_set():
                if time.monotonic() >= next_look:
                    if not self._alive():
                        break
                    self._end_idle()
                    next_look = time.monotonic() + 1.0
                try:
                    conn, _peer = self._listener.accept()
                except TimeoutError:
                    continue
                except OSError:
                    break
                self._take(conn)
        finally:
            self._closed.set()
            self._listener.close()
            with self._lock:
                for relay in self._relays:
                    _end(relay)

    def _end_idle(self) -> None:
        """Rule 3: reset every relay silent both ways for the idle timeout."""
        idle = self._gate.bounds.idle_timeout
        now = time.monotonic()
        with self._lock:
            # a relay still connecting is bounded by the connect timeout instead
            silent = [r for r in self._relays if r.connected and not r.ended and now - r.moved_at >= idle]
            for relay in silent:
                _end(relay)
        for relay in silent:
            self._told_of(
                "idle",
                f"closed a relayed connection to {relay.address}:{relay.port} silent both ways for "
                f"{idle:g} s ([network] egress_idle_timeout = {idle:g})",
            )

    def _take(self, conn: socket.socket) -> None:
        try:
            address, port = original_destination(conn)
        except OSError:
            _drop(conn)
            return
        if not self._gate.allows(address, port):
            _drop(conn)
            return
        user, bounds = self._gate.user, self._gate.bounds
        with self._lock:
            if len(self._relays) >= MAX_CONNECTIONS:
                why = f"the attempt holds {MAX_CONNECTIONS} relayed connections, the most one attempt may"
            else:
                why = _take_slot(user, bounds.relays_per_user)
            if why is None:
                relay = _Relay(conn, address, port, moved_at=time.monotonic())
                thread = threading.Thread(target=self._relay, args=(relay,), name="egress-relay", daemon=True)
                try:
                    thread.start()
                except RuntimeError:  # no thread to be had now: this connection only is refused
                    _give_slot(user)
                    why = "the service could not start a thread for it"
                else:
                    self._relays.append(relay)
                    return
        _drop(conn)
        kind = why.split(" ", 2)[1]  # attempt, user('s), service: one line per kind
        self._told_of(f"refused-{kind}", f"refused a connection to {address}:{port}: {why}")

    def _told_of(self, kind: str, line: str) -> None:
        """Rule 4: ``line`` in the log, unless a line of ``kind`` was told less than
        :data:`TELL_EVERY` seconds ago (then it is counted, and the next line says how many)."""
        now = time.monotonic()
        with self._lock:
            last, untold = self._told.get(kind, (float("-inf"), 0))
            if now - last < TELL_EVERY:
                self._told[kind] = (last, untold + 1)
                return
            self._told[kind] = (now, 0)
        more = f" ({untold} more like it since the last line)" if untold else ""
        who = f" of user {self._gate.user}" if self._gate.user else ""
        self._tell(f"[ma_jupyter] job attempt {self._name}{who}: [network] egress {line}{more}")

    def _relay(self, relay: _Relay) -> None:
        conn, address, port = relay.conn, relay.address, relay.port
        ended: list[bool] = []  # per direction: whether it ended in order (its source's end)
        connect_timeout = self._gate.bounds.connect_timeout
        try:
            upstream = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            with self._lock:
                relay.upstream = upstream
                if self._closed.is_set() or relay.ended:
                    return
            upstream.settimeout(connect_timeout)
            try:
                upstream.connect((address, port))
            except TimeoutError:
                self._told_of(
                    "connect",
                    f"could not reach {address}:{port} within {connect_timeout:g} s "
                    f"([network] egress_connect_timeout = {connect_timeout:g})",
                )
                raise
            relay.moved_at = time.monotonic()
            relay.connected = True
            upstream.settimeout(None)  # blocking descriptors: what splice moves between
            conn.settimeout(None)
            other = threading.Thread(
                target=lambda: ended.append(_copy(upstream, conn, relay)), name="egress-relay", daemon=True
            )
            other.start()
            ended.append(_copy(conn, upstream, relay))
            other.join()
        except (OSError, RuntimeError):  # unreachable, refused, no descriptor or thread to be had
            pass
        finally:
            _give_slot(self._gate.user)
            with self._lock:
                self._relays.remove(relay)
            # in order: a plain close (the last bytes still go out); else a reset each way
            for sock in (conn, relay.upstream):
                if sock is None:
                    continue
                if ended == [True, True]:
                    sock.close()
                else:
                    _drop(sock)


def _to_service_log(line: str) -> None:
    import sys

    print(line, file=sys.stderr, flush=True)


def _end(relay: _Relay) -> None:
    """Reset both ends of ``relay`` (its threads wake and close them); under the forwarder's lock."""
    relay.ended = True
    _wake(relay.conn)
    if relay.upstream is not None:
        _wake(relay.upstream)


def _take_slot(user: str | None, per_user: int) -> str | None:
    """One of the service's :func:`max_relays` relays, and one of ``user``'s ``per_user``:
    None when taken, else why not."""
    with _all_lock:
        held = _user_relays.get(user or "", 0)
        if user is not None and held >= per_user:
            return (
                f"the user's jobs hold {held} relayed connections, the most "
                f"[network] egress_relays_per_user = {per_user} allows"
            )
        if _all_relays[0] >= max_relays():
            return (
                f"the service relays {_all_relays[0]} connections in all, the most its descriptor "
                "limit allows"
            )
        _all_relays[0] += 1
        if user is not None:
            _user_relays[user] = held + 1
        return None


def _give_slot(user: str | None) -> None:
    with _all_lock:
        _all_relays[0] -= 1
        if user is not None:
            left = _user_relays.get(user, 0) - 1
            if left > 0:
                _user_relays[user] = left
            else:
                _user_relays.pop(user, None)


def _copy(source: socket.socket, sink: socket.socket, relay: _Relay) -> bool:
    """Bytes from ``source`` to ``sink`` until ``source`` ends (then ``sink`` is told: its
    write side shut; True) or either fails (both shut for reading and writing; False), noting
    in ``relay`` when bytes last moved.  The bytes move through a pipe in the kernel
    (``splice``), never through the service's memory or its interpreter (whose lock its API
    shares)."""
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    try:
        while True:
            moved = os.splice(source.fileno(), write_end, CHUNK)
            if not moved:
                sink.shutdown(socket.SHUT_WR)
                return True
            relay.moved_at = time.monotonic()
            while moved:
                moved -= os.splice(read_end, sink.fileno(), moved)
                relay.moved_at = time.monotonic()
    except OSError:
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        return False
    finally:
        os.close(read_end)
        os.close(write_end)


def _wake(sock: socket.socket) -> None:
    """End ``sock``'s connection with a reset (``SO_LINGER`` 0: the job sees a refusal rather
    than an orderly end), waking a thread blocked on it; the descriptor stays open for that
    thread to close (closed under it, its number could be reused by anything the service opens
    next, and a ``splice`` would write there)."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def _drop(sock: socket.socket) -> None:
    """Close ``sock`` with a reset (``SO_LINGER`` 0, no orderly end first: the job reads
    ``Connection reset``, not an empty answer): for a socket no other thread uses."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()
