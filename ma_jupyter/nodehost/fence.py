"""The fence of a node that shares its machine's network (a Ray node's agent, where a job's
nodes on different machines must reach each other over the real network, and no overlay could
be made: docs/network.md): each node's runner restricts itself, and so everything it starts,
before it starts anything (:func:`fence`):

1. Landlock (``connect`` and ``bind`` over TCP, ABI 4): a connection to any port in the
   deny list, and a bind to one, is refused with EACCES; the list is every port of the Ray
   cluster (from its node table, the GCS, the worker port range, the dashboard and client
   ports) and every port something other than the job itself listens on on this machine when
   the node starts (the service, other jobs, any daemon).  The bind rule keeps a job from
   holding the ports Ray starts its workers on (the raylet would find none free); a bind to
   port 0 (the kernel picks) stays allowed;
2. Landlock scoping (ABI 6): no connection to an abstract Unix socket made outside the node;
3. seccomp: no Multipath TCP socket (this kernel's Landlock does not check MPTCP connects,
   and an MPTCP connect falls back to TCP against any listener), no send with
   ``MSG_FASTOPEN`` (TCP Fast Open connects from ``sendto``/``sendmsg``, which Landlock does
   not check either), and no io_uring (its operations create sockets and send without these
   system calls).

The deny list is planned by the Ray backend (``backends/ray/fence.py``, from
:func:`listening_ports` and :func:`as_ranges`); the namespaces of a local attempt's job network
are :mod:`.network`'s.  Standard library only (psutil is imported only by
:func:`listening_ports`): the node runner imports this module.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
from collections.abc import Iterable

# the C library and its error check, as the network's namespaces call them
from .network import _check, _libc

LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_ACCESS_NET_CONNECT_TCP = 2
LANDLOCK_ACCESS_NET_BIND_TCP = 1
#: what the fence restricts per port: both, with one deny list
FENCED_NET_ACCESS = LANDLOCK_ACCESS_NET_BIND_TCP | LANDLOCK_ACCESS_NET_CONNECT_TCP
LANDLOCK_RULE_NET_PORT = 2
LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET = 1
#: Landlock's system call numbers (the same on every architecture)
SYS_LANDLOCK = {"create": 444, "add": 445, "restrict": 446}
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
IPPROTO_MPTCP = 262
MSG_FASTOPEN = 0x20000000
#: the system call numbers the seccomp filter looks at, per machine
SECCOMP_ARCH = {
    "x86_64": {
        "arch": 0xC000003E,
        "socket": 41,
        "sendto": 44,
        "sendmsg": 46,
        "sendmmsg": 307,
        "io_uring_setup": 425,
        "io_uring_enter": 426,
        "io_uring_register": 427,
    },
    "aarch64": {
        "arch": 0xC00000B7,
        "socket": 198,
        "sendto": 206,
        "sendmsg": 211,
        "sendmmsg": 269,
        "io_uring_setup": 425,
        "io_uring_enter": 426,
        "io_uring_register": 427,
    },
}


def landlock_abi() -> int:
    """The Landlock ABI version of this kernel (0: none)."""
    version = _libc.syscall(SYS_LANDLOCK["create"], None, 0, LANDLOCK_CREATE_RULESET_VERSION)
    return max(version, 0)


def _ranges_to_set(deny: Iterable[Iterable[int]]) -> set[int]:
    ports: set[int] = set()
    for low, high in deny:
        ports.update(range(max(int(low), 1), min(int(high), 65535) + 1))
    return ports


class _NetPortRule(ctypes.Structure):
    """``struct landlock_net_port_attr`` (packed: two 64-bit fields)."""

    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64)]


class _SockFilter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_ushort),
        ("jt", ctypes.c_ubyte),
        ("jf", ctypes.c_ubyte),
        ("k", ctypes.c_uint),
    ]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def _seccomp_program() -> list[tuple[int, int, int, int]]:
    """The seccomp filter of rule 3: ``socket(*, *, IPPROTO_MPTCP)`` and any send with
    ``MSG_FASTOPEN`` fail with EPERM; the io_uring calls and any other architecture's calls
    (x32, 32-bit) with ENOSYS."""
    machine = platform.machine()
    if machine not in SECCOMP_ARCH:
        raise OSError(errno.ENOSYS, f"no seccomp filter for {machine} machines")
    calls = SECCOMP_ARCH[machine]
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, eperm, enosys = 0x7FFF0000, 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS

    def arg(n: int) -> int:  # offset of the low 32 bits of argument n in struct seccomp_data
        return 16 + 8 * n

    # (opcode, jump-if-true label, jump-if-false label, k); labels resolved below
    code: list[tuple] = [
        ("start", ld, None, None, 4),  # the calling convention
        (None, jeq, "native", "nosys", calls["arch"]),
        ("native", ld, None, None, 0),  # the system call number
        (None, jge, "nosys", None, 0x40000000),  # an x32 call
        (None, jeq, "nosys", None, calls["io_uring_setup"]),
        (None, jeq, "nosys", None, calls["io_uring_enter"]),
        (None, jeq, "nosys", None, calls["io_uring_register"]),
        (None, jeq, "socket", None, calls["socket"]),
        (None, jeq, "flags3", None, calls["sendto"]),
        (None, jeq, "flags3", None, calls["sendmmsg"]),
        (None, jeq, "flags2", None, calls["sendmsg"]),
        (None, ret, None, None, allow),
        ("socket", ld, None, None, arg(2)),  # the protocol
        (None, jeq, "perm", "allow", IPPROTO_MPTCP),
        ("flags3", ld, None, None, arg(3)),
        (None, jset, "perm", "allow", MSG_FASTOPEN),
        ("flags2", ld, None, None, arg(2)),
        (None, jset, "perm", "allow", MSG_FASTOPEN),
        ("perm", ret, None, None, eperm),
        ("nosys", ret, None, None, enosys),
        ("allow", ret, None, None, allow),
    ]
    where = {label: i for i, (label, *_rest) in enumerate(code) if label}

    def jump(i: int, label: str | None) -> int:
        return 0 if label is None else where[label] - i - 1

    return [(op, jump(i, jt), jump(i, jf), k) for i, (_label, op, jt, jf, k) in enumerate(code)]


def fence(deny: Iterable[Iterable[int]]) -> None:
    """Restrict the calling process, and all it starts from now on, as the module docstring's
    rules say: no TCP connection to, nor bind on, a port of ``deny`` (``[low, high]`` ranges), no abstract
    Unix socket made outside, no MPTCP, no io_uring.

    Raises:
        OSError: the kernel cannot enforce it (no Landlock ABI 4, i.e. Linux before 6.7): the
            caller must then run nothing of the job.
    """
    abi = landlock_abi()
    if abi < 4:
        raise OSError(
            errno.ENOSYS,
            f"this kernel's Landlock (ABI {abi}) cannot restrict TCP connections; jobs on Ray need "
            "Linux 6.7 or later (Landlock enabled: lsm=...,landlock on the kernel command line)",
        )
    denied = _ranges_to_set(deny)
    scoped = LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET if abi >= 6 else 0
    attr = struct.pack("QQQ", 0, FENCED_NET_ACCESS, scoped)
    size = len(attr) if abi >= 6 else 16
    ruleset = _check(
        _libc.syscall(SYS_LANDLOCK["create"], ctypes.create_string_buffer(attr[:size]), size, 0),
        "landlock_create_ruleset",
    )
    try:
        # one rule per allowed port (~65,000 calls): a structure updated in place and passed by
        # reference costs less than half of packing a buffer each time
        rule = _NetPortRule(FENCED_NET_ACCESS, 0)
        ref, add, syscall = ctypes.byref(rule), SYS_LANDLOCK["add"], _libc.syscall
        for port in range(0, 65536):
            if port in denied:
                continue
            rule.port = port
            if syscall(add, ruleset, LANDLOCK_RULE_NET_PORT, ref, 0) == -1:
                _check(-1, "landlock_add_rule")
        if os.geteuid() != 0:  # without CAP_SYS_ADMIN both need no_new_privs
            _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
        program = _seccomp_program()
        filters = (_SockFilter * len(program))(*program)
        prog = _SockFprog(len(program), filters)
        _check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0), "seccomp filter")
        _check(_libc.syscall(SYS_LANDLOCK["restrict"], ruleset, 0), "landlock_restrict_self")
    finally:
        os.close(ruleset)


def listening_ports(except_marker: str = "") -> set[int]:
    """Every TCP port something listens on on this machine now, but those of processes whose
    node marker starts with ``except_marker`` (a job's own nodes)."""
    import psutil

    from .procfs import NODE_MARKER

    found: set[int] = set()
    own = f"{NODE_MARKER}={except_marker}".encode()
    for conn in psutil.net_connections("tcp"):
        if conn.status != psutil.CONN_LISTEN or not conn.laddr:
            continue
        if except_marker and conn.pid:
            try:
                with open(f"/proc/{conn.pid}/environ", "rb") as fh:
                    if any(e.startswith(own) for e in fh.read().split(b"\0")):
                        continue
            except OSError:
                pass
        found.add(conn.laddr.port)
    return found


def as_ranges(ports: Iterable[int]) -> list[list[int]]:
    """``ports`` as sorted ``[low, high]`` ranges (the runner spec's form)."""
    ranges: list[list[int]] = []
    for port in sorted(set(ports)):
        if ranges and port == ranges[-1][1] + 1:
            ranges[-1][1] = port
        else:
            ranges.append([port, port])
    return ranges
