"""What a job's processes may reach on the network.

Two mechanisms, one per kind of host (docs/network.md):

* **a job network per attempt** (the local backend, where every node of a job is on this
  machine): each node is a machine of its own (:func:`make_job_network`): a namespace holding
  ``lo`` and ``ma0`` at the node's own address (``10.254.0.<k+1>``/16, :func:`node_address`),
  whose veth peer is a port of a bridge in the attempt's switch namespace, which holds nothing
  else.  The service keeps the namespaces for a moment as bind-mounted files under
  ``<home>/netns/`` (as ``ip netns add`` does), and each node's runner holds the switch's open
  (:func:`hold_switch`) and enters its own (:func:`enter`) before it starts anything.  Once
  every runner is in, the files are removed (:func:`remove_job_network`): a node's namespace
  then lives exactly as long as a process of it does, the switch as long as a runner of the
  attempt, and a service that crashed has nothing to clean but leftover files, removed at the
  next start (:func:`sweep`).  Nothing of the host's network is there: no service port, no
  other job's port, no Ray port, no route out, and abstract Unix sockets (which the kernel keeps
  per network namespace) are the node's own, so ``/proc/net/unix`` lists only them.  The
  service reaches a node's abstract sockets (the debug terminal) from a short thread that
  enters the namespace of the node's runner first (:func:`connect_in`).
* **a fence** (a Ray node's agent, where a job's nodes on different machines must reach each
  other over the real network): each node's runner restricts itself before it starts anything
  (:mod:`.fence`, a room of its own: Landlock and seccomp, no namespace).

Standard library only: the node runner imports this module, and its start time counts in every
node's.

Why one module (over 600 lines): the local attempt's job network is one mechanism: namespaces,
netlink, the bridge, the probe and the entry into a node's namespace work on the same devices
and files; the fence of a node sharing its machine's network is :mod:`.fence`.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import socket
import stat
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from .agent_wire import IO_TIMEOUT

T = TypeVar("T")

CLONE_NEWNET = 0x40000000
CLONE_NEWNS = 0x00020000
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
MNT_DETACH = 2
UMOUNT_NOFOLLOW = 8
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
SIOCSIFADDR = 0x8916
SIOCSIFNETMASK = 0x891C
IFF_UP = 0x1
RTM_NEWLINK = 16
NLMSG_ERROR = 2
NLM_F_REQUEST, NLM_F_ACK, NLM_F_EXCL, NLM_F_CREATE = 0x1, 0x4, 0x200, 0x400
IFLA_IFNAME, IFLA_LINKINFO, IFLA_INFO_KIND, IFLA_INFO_DATA, VETH_INFO_PEER = 3, 18, 1, 2, 1
IFLA_ADDRESS, IFLA_MASTER, IFLA_NET_NS_FD = 1, 10, 28
#: a simulated node's one device besides ``lo`` (see :func:`make_job_network`), the switch's
#: bridge, and the job network every attempt of the local backend uses (each attempt's is its own)
NODE_LINK, SWITCH_BRIDGE, JOB_NETWORK, JOB_PREFIX = "ma0", "br0", "10.254.0.0", 16
#: how many nodes a job network holds (the /16 less its network and broadcast addresses, and
#: :data:`EGRESS_GATEWAY`)
MAX_JOB_NODES = (1 << (32 - JOB_PREFIX)) - 3
#: the switch's own address where the admin's policy lets jobs out (``[network] egress``,
#: :mod:`.egress`): the nodes' default route; the job network's last address, never a node's
EGRESS_GATEWAY = "10.254.255.254"
RTM_NEWROUTE, RTA_GATEWAY, RT_TABLE_MAIN, RTPROT_STATIC, RTN_UNICAST = 24, 5, 254, 4, 1
RTM_NEWRULE, FRA_DST, FRA_PRIORITY, FRA_TABLE, FRA_IP_PROTO = 32, 1, 6, 15, 22
FR_ACT_TO_TBL, FR_ACT_UNREACHABLE = 1, 7
#: the interface a node reaches the job's other nodes on, as the node names it (MPICH's
#: ``HYDRA_IFACE``, the seed's ``eth0``): its own on its attempt's job network
NODE_INTERFACE = NODE_LINK
#: the same for nodes sharing the host's network (a service that may not make namespaces):
#: they reach each other on its loopback
SHARED_INTERFACE = "lo"

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> int:
    if result == -1:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")
    return result


# ------------------------------------------------------------------- namespaces


def namespaces_supported() -> bool:
    """Whether this process may make and enter network namespaces (it needs CAP_SYS_ADMIN:
    the service runs as root, as it does when jobs run as their users' accounts)."""
    return os.geteuid() == 0 and os.path.exists("/proc/self/ns/net")


def rt_attr(kind: int, data: bytes) -> bytes:
    """One rtnetlink attribute, padded to 4 bytes."""
    head = struct.pack("HH", 4 + len(data), kind)
    return head + data + b"\0" * (-len(data) % 4)


def netlink_request(kind: int, flags: int, body: bytes, what: str) -> None:
    """Send one rtnetlink request (``NLM_F_REQUEST | NLM_F_ACK`` added) from the calling thread's
    network namespace and wait for its answer (so no ``ip`` program is needed).

    Raises:
        OSError: the kernel refused it; the message starts with ``what``.
    """
    flags |= NLM_F_REQUEST | NLM_F_ACK
    message = struct.pack("IHHII", 16 + len(body), kind, flags, 1, 0) + body
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as nl:
        nl.bind((0, 0))
        nl.sendall(message)
        answer = nl.recv(65536)
    answer_kind = struct.unpack_from("H", answer, 4)[0]
    code = -struct.unpack_from("i", answer, 16)[0] if answer_kind == NLMSG_ERROR else 0
    if code:
        raise OSError(code, f"{what}: {os.strerror(code)}")


def _add_veth(name: str, peer: str, peer_namespace_fd: int | None = None, mac: bytes | None = None) -> None:
    """Make a veth pair ``name`` <-> ``peer`` in the calling thread's network namespace (the
    peer in the namespace of ``peer_namespace_fd`` where one is given), ``name`` with hardware
    address ``mac`` where one is given."""
    ifinfo = struct.pack("BxHiII", socket.AF_UNSPEC, 0, 0, 0, 0)
    peer_attrs = rt_attr(IFLA_IFNAME, peer.encode() + b"\0")
    if peer_namespace_fd is not None:
        peer_attrs += rt_attr(IFLA_NET_NS_FD, struct.pack("I", peer_namespace_fd))
    peer_info = rt_attr(VETH_INFO_PEER, ifinfo + peer_attrs)
    linkinfo = rt_attr(IFLA_INFO_KIND, b"veth") + rt_attr(IFLA_INFO_DATA, peer_info)
    body = ifinfo + rt_attr(IFLA_IFNAME, name.encode() + b"\0") + rt_attr(IFLA_LINKINFO, linkinfo)
    if mac is not None:
        body += rt_attr(IFLA_ADDRESS, mac)
    netlink_request(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, body, f"cannot make the veth pair {name}/{peer}")


def set_up(name: str, address: str | None = None, prefix: int = 32) -> None:
    """Bring interface ``name`` (of the calling thread's namespace) up, with the IPv4
    ``address``/``prefix`` where one is given."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        ifname = name.encode()
        if address is not None:
            inet = struct.pack("H2s4s8x", socket.AF_INET, b"\0\0", socket.inet_aton(address))
            fcntl.ioctl(sock.fileno(), SIOCSIFADDR, struct.pack("16s16s", ifname, inet))
            netmask = struct.pack("!I", (0xFFFFFFFF << (32 - prefix)) & 0xFFFFFFFF)
            mask = struct.pack("H2s4s8x", socket.AF_INET, b"\0\0", netmask)
            fcntl.ioctl(sock.fileno(), SIOCSIFNETMASK, struct.pack("16s16s", ifname, mask))
        request = struct.pack("16sH14x", ifname, 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock.fileno(), SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock.fileno(), SIOCSIFFLAGS, struct.pack("16sH14x", ifname, flags | IFF_UP))


def in_thread(fn: Callable[[], T]) -> T:
    """Run ``fn`` on a thread of its own and return its result (or raise its exception): a
    thread that changes its network namespace never serves anything else afterwards."""
    box: list = []

    def run() -> None:
        try:
            box.append((True, fn()))
        except BaseException as exc:  # handed to the caller
            box.append((False, exc))

    thread = threading.Thread(target=run, name="netns", daemon=True)
    thread.start()
    thread.join()
    ok, value = box[0]
    if not ok:
        raise value
    return value


def unshare_network() -> None:
    """Move the calling thread into a new network namespace (``unshare(CLONE_NEWNET)`` moves
    only the calling thread: the process's other threads stay where they are)."""
    _check(_libc.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")


def make_namespace(path: Path) -> int:
    """Make a network namespace holding ``lo`` (up) and nothing else, and keep it at ``path``
    (a bind mount of its nsfs file, replacing whatever ``path`` was); its inode number.

    Raises:
        OSError: the namespace cannot be made (no CAP_SYS_ADMIN).
    """
    private_folder(path.parent)
    _new_file(path)

    def make() -> int:
        unshare_network()
        set_up("lo")
        return _keep(path)

    try:
        return in_thread(make)
    except BaseException:
        remove_namespace(path)
        raise


def private_folder(folder: Path) -> Path:
    """``folder``, made where missing (mode 0700), checked to be a real folder of this account
    that no one else may write (its place is one only this account may write, or the
    temporary folder): what a root service or agent keeps there
    (the namespace files below it are bind mounts made as root; an agent's home holds the
    runners' modules) must never be where another account made a folder or put a link first.

    Raises:
        OSError: it is not (a link, another owner, writable by others).
    """
    folder.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        folder.mkdir(mode=0o700)
    except FileExistsError:
        pass
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise OSError(
            errno.EPERM,
            f"{folder} must be a folder of this account that no one else may write: remove it, "
            "it is made again",
        )
    return folder


def remove_namespace(path: Path) -> None:
    """Forget the namespace kept at ``path`` (it lives on while a process is in it); nothing
    happens when there is none."""
    # fails harmlessly where nothing is mounted; a link is never followed
    _libc.umount2(os.fsencode(path), MNT_DETACH | UMOUNT_NOFOLLOW)
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def sweep(folder: Path) -> None:
    """Remove every namespace file left in ``folder`` (by a service that ended while launching)."""
    try:
        entries = list(folder.iterdir())
    except OSError:
        return
    for entry in entries:
        remove_namespace(entry)


def node_address(index: int) -> str:
    """The job-network address of an attempt's node ``index`` (0-based, launch order):
    ``10.254.0.1``, ``10.254.0.2``, ... (every attempt's network is its own, so all use these).

    Raises:
        ValueError: past :data:`MAX_JOB_NODES`.
    """
    if not 0 <= index < MAX_JOB_NODES:
        raise ValueError(f"a job network holds at most {MAX_JOB_NODES} nodes, not {index + 1}")
    return socket.inet_ntoa(
        struct.pack("!I", struct.unpack("!I", socket.inet_aton(JOB_NETWORK))[0] + index + 1)
    )


def node_mac(address: str) -> bytes:
    """The hardware address of the interface holding job-network ``address`` (locally
    administered, ``02:00`` then the address's four bytes): a peer's is known without asking,
    which a Ray attempt's overlay needs to send a frame to the one machine holding that node
    (:mod:`.overlay`)."""
    return b"\x02\x00" + socket.inet_aton(address)


@dataclass(frozen=True)
class JobNetwork:
    """An attempt's network on the local backend, kept as files until its runners are in
    (:func:`make_job_network`).

    Attributes:
        switch: the file of the switch's namespace (the bridge every node is plugged into,
            and on a Ray machine the attempt's VXLAN device, :mod:`.overlay`); None where there
            is none.
        nodes: per node name, the file of its own namespace and that namespace's inode.
    """

    switch: Path | None
    nodes: dict[str, tuple[Path, int]]


def _new_file(path: Path) -> None:
    """A fresh, empty file at ``path`` for a namespace's bind mount, never made through a link
    (the folder is this account's alone anyway); whatever was there is forgotten first."""
    remove_namespace(path)
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))


def _keep(path: Path) -> int:
    """Bind-mount the calling thread's network namespace on ``path``; its inode."""
    own = f"/proc/self/task/{threading.get_native_id()}/ns/net"
    _check(_libc.mount(own.encode(), os.fsencode(path), None, MS_BIND, None), f"mount --bind {own} {path}")
    return os.stat(own).st_ino


def add_default_route(gateway: str) -> None:
    """Route everything of the calling thread's namespace that no other route takes through
    ``gateway`` (an address on one of its links)."""
    rtmsg = struct.pack("BBBBBBBBI", socket.AF_INET, 0, 0, 0, RT_TABLE_MAIN, RTPROT_STATIC, 0, RTN_UNICAST, 0)
    body = rtmsg + rt_attr(RTA_GATEWAY, socket.inet_aton(gateway))
    netlink_request(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL, body, f"cannot route through {gateway}")


def only_tcp_out(local: str, prefix: int) -> None:
    """In the calling thread's namespace, make every packet that is neither TCP nor for
    ``local``/``prefix`` (the job network) unroutable (policy rules: the job network's
    addresses by the main table, then anything else not TCP ``Network is unreachable``): where
    only TCP leaves (the egress gate), a UDP send fails at once rather than waiting out its
    timeouts (a resolver of its own reading ``/etc/resolv.conf``); the machine's own addresses
    (the ``local`` table, rule 0) are untouched."""
    for priority, proto, dst, action in (
        (100, None, local, FR_ACT_TO_TBL),
        (101, socket.IPPROTO_UDP, None, FR_ACT_UNREACHABLE),
        (102, socket.IPPROTO_ICMP, None, FR_ACT_UNREACHABLE),
    ):
        header = struct.pack(
            "BBBBBBBBI",
            socket.AF_INET,
            prefix if dst else 0,
            0,
            0,
            RT_TABLE_MAIN if action == FR_ACT_TO_TBL else 0,
            0,
            0,
            action,
            0,
        )
        attrs = rt_attr(FRA_PRIORITY, struct.pack("I", priority))
        if dst:
            attrs += rt_attr(FRA_DST, socket.inet_aton(dst)) + rt_attr(
                FRA_TABLE, struct.pack("I", RT_TABLE_MAIN)
            )
        if proto is not None:
            attrs += rt_attr(FRA_IP_PROTO, struct.pack("B", proto))
        netlink_request(RTM_NEWRULE, NLM_F_CREATE | NLM_F_EXCL, header + attrs, "cannot add a routing rule")


def set_link(name: str, *, master: int | None = None) -> None:
    """Bring link ``name`` of the calling thread's namespace up, made a port of bridge ``master``
    (an interface index) where one is given."""
    ifinfo = struct.pack("BxHiII", socket.AF_UNSPEC, 0, 0, IFF_UP, IFF_UP)
    body = ifinfo + rt_attr(IFLA_IFNAME, name.encode() + b"\0")
    if master is not None:
        body += rt_attr(IFLA_MASTER, struct.pack("I", master))
    netlink_request(RTM_NEWLINK, 0, body, f"cannot bring {name} up")


def _no_ipv6_here() -> None:
    """Give the calling thread's namespace's devices made from now on no IPv6 address (the
    switch: it is no host of the job network, so it has no address at all)."""
    for scope in ("default", "all"):
        try:
            with open(f"/proc/sys/net/ipv6/conf/{scope}/disable_ipv6", "w") as fh:
                fh.write("1")
        except OSError:  # a kernel without IPv6
            pass


def network_of(address: str, prefix: int) -> str:
    """The first address of the network ``address``/``prefix`` lies in."""
    mask = (0xFFFFFFFF << (32 - prefix)) & 0xFFFFFFFF
    return socket.inet_ntoa(struct.pack("!I", struct.unpack("!I", socket.inet_aton(address))[0] & mask))


def make_job_network(
    folder: Path,
    key: str,
    addresses: list[tuple[str, str]],
    *,
    gateway: bool = False,
    gateway_at: str = EGRESS_GATEWAY,
) -> JobNetwork:
    """An attempt's network: one namespace per node, each a machine on one switch.

    Rules, in the order they are made:

    1. the switch: a namespace holding a bridge (``br0``, up, no address, no IPv6), and
       nothing else: nothing of the host, no process ever runs there;
    2. per node ``(name, address)`` of ``addresses``, in order: a namespace holding ``lo`` (up)
       and ``ma0`` (up, at ``address``/16, hardware address :func:`node_mac`), one end of a
       veth pair whose other end is a port of the switch's bridge: the node reaches its peers'
       addresses on any port, TCP and UDP, and nothing else (no route out: ``Network is
       unreachable``);
    3. every namespace is kept as a file in ``folder`` (``<key>.switch``, ``<key>.<k>``) until
       :func:`remove_job_network`; the caller's runners enter their node's, holding the
       switch's open first (its devices live as long as a runner holds it);
    4. with ``gateway`` (the admin's egress policy, :mod:`.egress`): the bridge also holds
       :data:`EGRESS_GATEWAY`/16 and every node routes the TCP that is not for the job network
       there (its default route; anything else out is unroutable, :func:`only_tcp_out`), where
       the policy's rules and forwarder decide what goes further; ``gateway_at`` is that
       address (a Ray attempt's overlay has its own, :data:`.overlay.EGRESS_GATEWAY`), and the
       bridge's hardware address is fixed by it (:func:`node_mac`: a node of an overlay is given
       it as a permanent neighbour, never asking the other machines' switches, which hold the
       same address).

    Raises:
        OSError: a namespace or device cannot be made (no CAP_SYS_ADMIN); nothing is left.
    """
    private_folder(folder)
    inside = network_of(gateway_at, JOB_PREFIX)  # the nodes' own network, the gateway's too
    switch = folder / f"{key}.switch"
    files = [folder / f"{key}.{k}" for k in range(len(addresses))]
    made = JobNetwork(switch=switch, nodes={})
    try:
        _new_file(switch)

        def make_switch() -> None:
            unshare_network()
            _no_ipv6_here()
            ifinfo = struct.pack("BxHiII", socket.AF_UNSPEC, 0, 0, 0, 0)
            linkinfo = rt_attr(IFLA_LINKINFO, rt_attr(IFLA_INFO_KIND, b"bridge"))
            body = ifinfo + rt_attr(IFLA_IFNAME, SWITCH_BRIDGE.encode() + b"\0") + linkinfo
            if gateway:
                body += rt_attr(IFLA_ADDRESS, node_mac(gateway_at))
            netlink_request(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, body, "cannot make the job's switch")
            set_link(SWITCH_BRIDGE)
            if gateway:
                set_up(SWITCH_BRIDGE, gateway_at, JOB_PREFIX)
            _keep(switch)

        in_thread(make_switch)
        switch_fd = os.open(switch, os.O_RDONLY | os.O_CLOEXEC)
        try:
            for k, ((name, address), path) in enumerate(zip(addresses, files, strict=True)):
                _new_file(path)

                def make_node(path: Path = path, address: str = address, port: str = f"p{k}") -> int:
                    unshare_network()
                    set_up("lo")
                    _add_veth(NODE_LINK, port, switch_fd, node_mac(address))
                    set_up(NODE_LINK, address, JOB_PREFIX)
                    if gateway:
                        add_default_route(gateway_at)
                        only_tcp_out(inside, JOB_PREFIX)
                    return _keep(path)

                made.nodes[name] = (path, in_thread(make_node))
        finally:
            os.close(switch_fd)

        def plug_ports() -> None:
            enter(str(switch))
            bridge = socket.if_nametoindex(SWITCH_BRIDGE)
            for k in range(len(addresses)):
                set_link(f"p{k}", master=bridge)

        in_thread(plug_ports)
    except BaseException:
        remove_namespace(switch)
        for path in files:
            remove_namespace(path)
        raise
    return made


def remove_job_network(made: JobNetwork) -> None:
    """Forget the files of ``made`` (:func:`remove_namespace`): each namespace lives on while a
    process is in it, the switch while a runner holds it."""
    for path, _inode in made.nodes.values():
        remove_namespace(path)
    if made.switch is not None:
        remove_namespace(made.switch)


#: what the network probe sends across (and expects back)
PROBE_BYTES = b"ma_jupyter network probe\n"


def probe_job_network(folder: Path, key: str, timeout: float = 2.0) -> str | None:
    """Whether this machine can give a job its network, tried as an attempt would: why not in
    a sentence, or None when it can (the service's node inspection, every node's idle time too).

    1. a two-node job network is made in ``folder`` as :func:`make_job_network` makes an
       attempt's (``<key>.switch``, ``<key>.0``, ``<key>.1``): a namespace that cannot be made
       is the answer;
    2. node 0 crosses the switch to node 1 (:func:`cross_probe`);
    3. the namespaces are forgotten, whatever happened: nothing of the probe lives on (each
       namespace dies with its last socket);
    4. all of it runs on a thread of its own in a mount namespace of its own
       (:func:`private_mounts`), where the namespaces' bind mounts are made: they end with
       that thread even when the process is killed mid-probe (a service stopped by SIGKILL),
       and never stay mounted in ``folder`` (a home, or a test's temporary folder that could
       then not be removed).  Where that namespace cannot be made, the probe runs here.
    """
    addresses = [("probe-0", node_address(0)), ("probe-1", node_address(1))]

    def probe() -> str | None:
        try:
            private_mounts()
            made = make_job_network(folder, key, addresses)
        except OSError as exc:
            return f"the job network cannot be made: {exc}"
        try:
            first, second = (str(made.nodes[name][0]) for name, _ in addresses)
            return cross_probe(first, second, addresses[1][1], addresses[0][1], timeout)
        finally:
            remove_job_network(made)

    return in_thread(probe)


def private_mounts() -> bool:
    """Move the calling thread into a mount namespace of its own, where every mount is private
    (nothing made there propagates back): what it and the threads it starts mount lasts as
    long as they do, whatever ends the process.  False where it cannot (not root), the thread
    then staying where it was."""
    if _libc.unshare(CLONE_NEWNS) != 0:
        return False
    # the copy's mounts may be shared with the host's (systemd makes / shared): made private
    # here, a bind mount below never appears outside
    _check(_libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
    return True


def cross_probe(first: str, second: str, address: str, source: str, timeout: float = 2.0) -> str | None:
    """Why a node in namespace ``first`` (at ``source``) does not exchange bytes with one in
    namespace ``second`` listening at ``address``, or None when it does (the network probes):

    1. the second listens on ``address``, the first connects to it and sends
       :data:`PROBE_BYTES`, which the second must read whole and send back, every step within
       ``timeout`` seconds (a path that drops the frames answers, never hangs);
    2. the sockets are closed, whatever happened.
    """
    socks: list[socket.socket] = []
    try:

        def sockets() -> None:  # each socket lives in the namespace it was made in
            enter(second)
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(listener)
            listener.bind((address, 0))
            listener.listen(1)
            enter(first)
            socks.append(socket.socket(socket.AF_INET, socket.SOCK_STREAM))

        in_thread(sockets)
        listener, client = socks
        listener.settimeout(timeout)
        client.settimeout(timeout)
        port = listener.getsockname()[1]
        try:
            client.connect((address, port))
            peer, _ = listener.accept()
        except OSError as exc:
            return f"node {source} of a job network does not reach its peer {address}:{port}: {exc}"
        socks.append(peer)
        peer.settimeout(timeout)
        try:
            client.sendall(PROBE_BYTES)
            got = b""
            while len(got) < len(PROBE_BYTES):
                chunk = peer.recv(len(PROBE_BYTES) - len(got))
                if not chunk:
                    break
                got += chunk
            peer.sendall(got)
            back = b""
            while len(back) < len(got):
                chunk = client.recv(len(got) - len(back))
                if not chunk:
                    break
                back += chunk
        except OSError as exc:
            return f"a job network's nodes connect but cannot exchange bytes: {exc}"
        if back != PROBE_BYTES:
            return f"a job network's nodes connect but {len(back)} of {len(PROBE_BYTES)} bytes came back"
        return None
    except OSError as exc:
        return f"a job network's nodes cannot open sockets: {exc}"
    finally:
        for sock in socks:
            sock.close()


def on_job_network(address: str) -> bool:
    """Whether ``address`` is a node address of the job network (:func:`node_address`)."""
    try:
        value = struct.unpack("!I", socket.inet_aton(address))[0]
    except OSError:
        return False
    base = struct.unpack("!I", socket.inet_aton(JOB_NETWORK))[0]
    return 0 < value - base <= MAX_JOB_NODES and address.count(".") == 3


#: the switch of the job network this runner's node is on, held open for the runner's life
_held_switch: list[int] = []


def hold_switch(path: str) -> None:
    """Keep the namespace at ``path`` (the node's switch) alive as long as the calling process
    lives: an open descriptor, closed at every ``exec`` (nothing the runner starts has it).

    Raises:
        OSError: it cannot be opened.
    """
    _held_switch.append(os.open(path, os.O_RDONLY | os.O_CLOEXEC))


def namespace_of(pid: int) -> int | None:
    """The inode of process ``pid``'s network namespace (None: it is gone)."""
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def enter(path: str) -> None:
    """Move the calling thread (the node runner's only one, before it starts any) into the
    network namespace kept at ``path``.

    Raises:
        OSError: it cannot (the caller must then run nothing of the job).
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        _check(_libc.setns(fd, CLONE_NEWNET), f"setns({path})")
    finally:
        os.close(fd)


def connect_in(pid: int, address: bytes, timeout: float = IO_TIMEOUT) -> socket.socket:
    """A Unix stream socket connected to ``address`` in process ``pid``'s network namespace
    (where abstract socket names live), from a short thread that enters it first.

    The connection waits at most ``timeout`` seconds (a listener that is stopped or never
    accepts: its backlog full, the kernel would otherwise hold the caller without end), and the
    socket returned keeps that timeout for its reads and writes.

    Raises:
        OSError: cannot enter it, or cannot connect.
    """

    def connect() -> socket.socket:
        fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            _check(_libc.setns(fd, CLONE_NEWNET), f"setns(network namespace of {pid})")
        finally:
            os.close(fd)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect(address)
        except BaseException:
            sock.close()
            raise
        return sock

    return in_thread(connect)
