"""The relay of one dev environment's kernel on the Ray node that runs it: how the kernel bridge on
the service's machine reaches the kernel's Unix sockets, which connect processes of one machine
only.

A :class:`KernelRelay` is started by the node's agent (:meth:`~.agent.NodeAgent.kernel_relay`)
when the service asks for a dev environment's route (``POST /jobs/{id}/kernel``, its owner or an
admin), and speaks the wire of :mod:`ma_jupyter.kernel_access`:

1. it listens on TCP on the Ray node's address, on a port the system picks, for as long as the
   dev environment's node runs, and no longer: the agent closes it when the node ends (stopped,
   or its kernel shut down), and closing ends its listener, every connection and every thread
   of it (:meth:`KernelRelay.close` returns once they have ended);
2. it holds a secret of its own (32 random bytes, hex), made when it starts and never written
   anywhere: the agent hands it to the service, the service to the bridge in the answer of that
   authorised call.  The job never sees it (it is in no file, variable or argument of the node);
3. a connection proves the secret in its first line (compared in constant time) before anything
   else happens; until then it gets nothing, and a wrong or missing proof closes it having sent
   nothing.  At most :data:`PENDING_PER_SOURCE` connections of one source address, and
   :data:`MAX_PENDING` in all, may be before their proof at once (more are closed at once), each
   for at most :data:`~ma_jupyter.kernel_access.HELLO_WAIT` seconds: a stranger that keeps
   opening connections it never proves fills its own source's share only, so the bridge's
   connections from the service's machine still get through;
4. a proven connection names one of the kernel's sockets, which the relay opens in the kernel
   folder as the untrusted-file rules of :mod:`ma_jupyter.kernel_access` say (the folder through
   no link, the socket as the inode it is and owned by the job's account, the kernel folder's
   owner: anything else refused, a hard link to another account's socket included; the relay
   runs as the Ray agent's account, root, which may connect to any socket) and connects to (a
   socket that does not listen yet, which the kernel binds before it listens on it, is tried again
   for up to :data:`SOCKET_WAIT` seconds: it is no refusal); the first
   socket found under a name stays the one that name reaches for the relay's life (a later swap
   in the folder changes nothing, as for the bridge's own descriptors); then it copies bytes both
   ways until either side closes.  Or it writes the connection file, once;
5. the listener is reachable by whatever reaches the Ray node's address.  Jobs do not: each
   attempt's nodes run in a network namespace of their own, joined to its other machines by its
   overlay, where nothing of the machine's network is reachable; where a machine cannot make
   one, the nodes are fenced off the ports that listen when they start (:mod:`.fence`), which a
   relay started after them is not.  The secret is what keeps every other caller out;
6. what a kernel sends is never held whole: the relay copies each direction a chunk
   (:data:`CHUNK`) at a time, so a kernel declaring a frame of any size costs it one chunk per
   connection; the bridge at the other end takes no message over
   :data:`~ma_jupyter.kernel_access.MAX_KERNEL_MESSAGE` and drops the connection of one that
   declares more, which ends the relay's connection too.
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
import socket
import threading
import time
from pathlib import Path

from ... import kernel_access
from ...kernel_access import EXISTS, READY, REFUSED, WRITTEN

log = logging.getLogger("ma_jupyter.ray.kernel_relay")

#: connections that may wait for their proof at once, in all and from one source address (rule 3)
MAX_PENDING = 64
PENDING_PER_SOURCE = 8
#: seconds a proven connection waits for the kernel folder and its socket (the kernel binds its
#: sockets once it read the connection file)
SOCKET_WAIT = 120.0
#: bytes copied per read
CHUNK = 1 << 16


class KernelRelay:
    """One dev environment's relay (see the module docstring).

    Args:
        folder: the node's kernel folder on this machine.
        address: the Ray node's address to listen on.
        owner: the uid of the job's account, which the kernel's sockets must belong to; None: the
            kernel folder's owner (the platform gives it to the account the node runs as).
    """

    def __init__(self, folder: Path, address: str, owner: int | None = None):
        self.folder = Path(folder)
        self.owner = owner
        self.secret = secrets.token_hex(32)  # rule 2
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        self._listener = socket.create_server((address, 0), family=family)
        self.address = address
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._closed = False
        self._closing = threading.Event()  # wakes the waits for the folder and the sockets
        self._pending: dict[str, int] = {}  # source address -> connections before their proof
        self._sockets: set[socket.socket] = set()
        self._threads: set[threading.Thread] = set()
        self._pinned: dict[str, int] = {}  # socket name -> O_PATH descriptor (rule 4)
        self._start(self._accept, "accept")

    # ----------------------------------------------------------------- threads

    def _start(self, target, what: str, *args) -> bool:
        """A thread of this relay, counted so :meth:`close` waits for it (False: closed)."""
        with self._lock:
            if self._closed:
                return False
            thread = threading.Thread(
                target=self._run, args=(target, *args), name=f"kernel-relay-{self.port}-{what}", daemon=True
            )
            self._threads.add(thread)
            # started under the lock: close() never sees a thread it cannot join yet (start()
            # waits for the thread's bootstrap only, which takes no lock of ours)
            thread.start()
        return True

    def _run(self, target, *args) -> None:
        try:
            target(*args)
        except Exception:  # a connection's failure ends that connection only
            log.warning("kernel relay on port %s", self.port, exc_info=True)
        finally:
            with self._lock:
                self._threads.discard(threading.current_thread())

    def _track(self, sock: socket.socket) -> bool:
        with self._lock:
            if self._closed:
                return False
            self._sockets.add(sock)
            return True

    def _drop(self, *socks: socket.socket) -> None:
        for sock in socks:
            with self._lock:
                self._sockets.discard(sock)
            _shut(sock)
            sock.close()

    def threads(self) -> int:
        """Threads of this relay still running (0 once closed)."""
        with self._lock:
            return sum(t.is_alive() for t in self._threads)

    @property
    def closed(self) -> bool:
        return self._closed

    # --------------------------------------------------------------- listening

    def _accept(self) -> None:
        while True:
            try:
                conn, peer = self._listener.accept()
            except OSError:
                return  # closed (rule 1)
            source = str(peer[0])
            with self._lock:
                busy = (
                    sum(self._pending.values()) >= MAX_PENDING
                    or self._pending.get(source, 0) >= PENDING_PER_SOURCE
                )
                if not busy:
                    self._pending[source] = self._pending.get(source, 0) + 1
            if busy:
                conn.close()
                continue
            if not self._track(conn):
                self._proved(source)
                conn.close()
                return
            if not self._start(self._serve, "conn", conn, source):
                self._proved(source)
                self._drop(conn)
                return

    def _proved(self, source: str) -> None:
        """One connection of ``source`` is no longer before its proof (proven, or dropped)."""
        with self._lock:
            left = self._pending.get(source, 0) - 1
            if left > 0:
                self._pending[source] = left
            else:
                self._pending.pop(source, None)

    def pending(self) -> dict[str, int]:
        """Connections before their proof, by source address."""
        with self._lock:
            return dict(self._pending)

    def _serve(self, conn: socket.socket, source: str) -> None:
        try:
            request = kernel_access.read_hello(conn)
        finally:
            self._proved(source)
        proof = request.get("secret") if request else None
        if not isinstance(proof, str) or not hmac.compare_digest(proof.encode(), self.secret.encode()):
            self._drop(conn)  # rule 3: nothing is sent
            return
        conn.settimeout(None)
        try:
            if "connection" in request:
                self._write_connection(conn, request["connection"])
                self._drop(conn)
                return
            kernel = self._connect(str(request.get("channel", "")))
        except (LookupError, OSError, ValueError, TypeError) as exc:
            _send(conn, REFUSED + str(exc).encode("utf-8", "replace")[:2000] + b"\n")
            self._drop(conn)
            return
        if not self._track(kernel):
            kernel.close()
            self._drop(conn)
            return
        _nodelay(conn)
        if not _send(conn, READY) or not self._start(self._copy, "copy", kernel, conn):
            self._drop(conn, kernel)
            return
        self._copy(conn, kernel)

    def _copy(self, source: socket.socket, target: socket.socket) -> None:
        """Bytes from ``source`` to ``target`` until one side ends; then both end (the other
        direction's thread wakes with the shutdown)."""
        try:
            kernel_access.copy_bytes(source, target, CHUNK)
        finally:
            self._drop(source, target)

    # ---------------------------------------------------------- kernel folder

    def _folder(self) -> int:
        deadline = time.monotonic() + SOCKET_WAIT
        while True:
            try:
                return kernel_access.open_folder(self.folder)
            except FileNotFoundError:
                if time.monotonic() > deadline or self._closing.wait(0.1):
                    raise LookupError(f"the kernel folder {self.folder} did not appear") from None

    def _connect(self, name: str) -> socket.socket:
        """Rule 4: a connection to the kernel's socket ``name``, made or given up within
        :data:`SOCKET_WAIT` seconds."""
        deadline = time.monotonic() + SOCKET_WAIT
        with self._lock:
            # a copy of the descriptor: close() may close the pinned one meanwhile, and its
            # number must not be reused under this connect
            fd = os.dup(self._pinned[name]) if name in self._pinned else None
        if fd is None:
            folder_fd = self._folder()
            try:
                found = kernel_access.open_socket(folder_fd, name, deadline, self._closing, owner=self.owner)
            finally:
                os.close(folder_fd)
            with self._lock:
                if self._closed:
                    os.close(found)
                    raise LookupError("the relay has closed")
                if name not in self._pinned:
                    self._pinned[name] = found
                else:  # another connection pinned it meanwhile: that one stays
                    os.close(found)
                fd = os.dup(self._pinned[name])
        try:
            return self._reach(fd, name, deadline)
        finally:
            os.close(fd)

    def _reach(self, fd: int, name: str, deadline: float) -> socket.socket:
        """Rule 4's connect to the socket ``fd`` names, waiting while it does not listen yet."""
        while True:
            try:
                return kernel_access.connect_socket(fd)
            except ConnectionRefusedError:
                # the kernel binds each socket before it listens on it (ZMQ's bind is two system
                # calls, which a loaded machine stretches apart): a socket found in between is
                # not listening yet, which is no refusal (the bridge would end on one); a kernel
                # that died leaves its node, whose end closes this relay and wakes this wait
                if time.monotonic() > deadline or self._closing.wait(0.05):
                    raise LookupError(
                        f"the kernel's socket {name} does not listen: see the dev environment's log"
                    ) from None

    def _write_connection(self, conn: socket.socket, connection: object) -> None:
        if not isinstance(connection, dict) or not isinstance(connection.get("key"), str):
            raise ValueError("a connection request holds the kernel's key")
        scheme = connection.get("signature_scheme", "hmac-sha256")
        folder_fd = self._folder()
        try:
            written = kernel_access.write_connection(folder_fd, connection["key"], str(scheme))
        finally:
            os.close(folder_fd)
        _send(conn, WRITTEN if written else EXISTS)

    # ------------------------------------------------------------------ close

    def close(self, wait: float = 10.0) -> None:
        """Rule 1: end the listener, every connection and every thread; returns once the
        threads ended (at most ``wait`` seconds)."""
        with self._lock:
            self._closed = True
            sockets = list(self._sockets)
            self._sockets.clear()
            threads = list(self._threads)
            pinned = list(self._pinned.values())
            self._pinned.clear()
        self._closing.set()
        _shut(self._listener)  # wakes the accepting thread
        self._listener.close()
        for sock in sockets:
            _shut(sock)  # wakes each copying thread
            sock.close()
        deadline = time.monotonic() + wait
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))
        for fd in pinned:
            os.close(fd)


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _send(conn: socket.socket, data: bytes) -> bool:
    try:
        conn.sendall(data)
        return True
    except OSError:
        return False


def _nodelay(conn: socket.socket) -> None:
    """Small ZMQ frames go out at once (Nagle's wait would add tens of ms to each reply)."""
    try:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        pass
