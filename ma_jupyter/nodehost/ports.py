"""The TCP ports a machine's nodes are handed: a pool that never hands one out twice.

One pool per machine (the local backend's; a Ray node's agent's): :meth:`PortPool.reserve_ports` is the
rule of which ports a task gets; a reserved port is held by no socket until the task binds it,
so the pool remembers it until it is released.
"""

from __future__ import annotations

import secrets
import socket
import threading
from pathlib import Path


class PortPool:
    """The ports reserved on this machine, taken from ``port_range`` (``[low, high)``; default:
    from :data:`PORT_POOL_LOW` to the kernel's ephemeral range, :func:`_port_pool`)."""

    def __init__(self, port_range: tuple[int, int] | None = None):
        # where reserved ports come from, [low, high); default: below the kernel's ephemeral range
        self._port_range = port_range if port_range is not None else _port_pool()
        self._reserved_ports: set[int] = set()
        self._ports_lock = threading.Lock()

    def reserve_ports(self, count: int, within: tuple[int, int] | None = None) -> tuple[int, ...]:
        """``count`` TCP ports, reserved until :meth:`release_ports`, each one:

        1. free on every address of this host: it binds on ``0.0.0.0``.  Where the nodes share
           the host's network a task is reached on its own ``127.0.1.k``, but programs bind the
           port on every interface (TensorFlow's
           gRPC servers listen on ``0.0.0.0:<port>``), so a port some process holds on any
           address (a listener, or the local end of an outgoing connection) fails them;
        2. never handed out twice while reserved: one pool for every address;
        3. taken from the backend's port range, by default the ports under the kernel's
           ephemeral range: a reserved port is not held by a socket until the task binds it,
           and inside the ephemeral range any outgoing connection of the host could take it as
           its local port in the meantime.  A random start keeps two services on one host
           from trying the same ports in the same order.  Only when the range has no free port
           left does the kernel pick one (on ``0.0.0.0``, so rule 1 still holds);
        4. ``within`` (``[low, high)``, the placement's :attr:`~ma_jupyter.modes.base.Placement.port_range`)
           replaces the backend's range where a job's convention names one.
        """
        ports: list[int] = []
        with self._ports_lock:
            low, high = within or self._port_range
            size = max(0, high - low)
            start = secrets.randbelow(size) if size else 0
            candidates = (low + (start + i) % size for i in range(size))
            while len(ports) < count:
                port = next(
                    (p for p in candidates if p not in self._reserved_ports and _free_everywhere(p)), None
                )
                if port is None:
                    port = _kernel_port()
                    if port in self._reserved_ports:
                        continue
                self._reserved_ports.add(port)
                ports.append(port)
        return tuple(ports)

    def release_ports(self, ports: list[int] | tuple[int, ...]) -> None:
        """Forget ports :meth:`reserve_ports` handed out."""
        with self._ports_lock:
            self._reserved_ports.difference_update(ports)

    def hold_ports(self, ports: list[int] | tuple[int, ...]) -> None:
        """Reserve ports again (a restarted process re-attaching)."""
        with self._ports_lock:
            self._reserved_ports.update(p for p in ports if p)


#: where the default port range starts: above the ports of well-known services (Jupyter 8888,
#: TensorBoard 6006, Ray 6379/8265/10001)
PORT_POOL_LOW = 20000


def _port_pool() -> tuple[int, int]:
    """The default port range ``[low, high)``: from :data:`PORT_POOL_LOW` to the start of the
    kernel's ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``; empty when that range
    starts lower, so the kernel picks every port)."""
    try:
        first = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        first = 32768  # Linux's default
    return (PORT_POOL_LOW, max(PORT_POOL_LOW, first))


def _free_everywhere(port: int) -> bool:
    """Whether ``port`` binds on ``0.0.0.0`` now, over TCP and UDP: no socket holds it on any
    address (no ``SO_REUSEADDR``, so a connection's local end or a ``TIME_WAIT`` counts as
    held).  UDP too: a Ray attempt's overlay listens on the first port of its first node on each
    machine (:mod:`ma_jupyter.nodehost.overlay`), and jobs' frameworks use both."""
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
        with socket.socket(socket.AF_INET, kind) as sock:
            try:
                sock.bind(("0.0.0.0", port))
            except OSError:
                return False
    return True


def _kernel_port() -> int:
    """A port the kernel picks as free on every address."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("0.0.0.0", 0))
        return sock.getsockname()[1]
