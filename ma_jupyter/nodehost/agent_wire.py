"""What the agents inside nodes share: their abstract socket names, their frames, who may connect.

Both :mod:`.rsh_agent` (mpirun's "ssh" between simulated nodes) and :mod:`.shell_agent` (the
debug terminal) listen on an abstract Unix socket ``ma_jupyter-<kind>/<job>/<node>``: the nodes
of a job share its network namespace (see :mod:`.network`), so its abstract names, but not
their filesystems; the service connects from inside that namespace.  The kernel
tells a server the connecting process's uid (``SO_PEERCRED``), and the attempt's secret
(``$MA_JOB_SECRET``, backends.base) tells one job's processes from another job's of the same
account.

Rules (in order) for a server deciding whether to serve a connection:

1. The peer's uid is the server's own, or root's where the agent allows it (the service, which
   may run the node as another account).  A server listening on its node's job-network address
   instead (``port``: mpirun's agent where each node is a machine of its own, :mod:`.network`)
   has no uid to check: only the nodes of its job reach that address;
2. The request's secret equals the server's (compared in constant time); a server without one
   serves nobody.

Standard library only: it runs inside a node, under the job's own interpreter.
"""

from __future__ import annotations

import hmac
import json
import os
import signal
import socket
import struct
import threading
import time

#: set by the backend for the nodes of one attempt (backends.base.JOB_SECRET_ENV)
JOB_SECRET_ENV = "MA_JOB_SECRET"
#: the node runner replaces these arguments of a shell agent's argv with the descriptors the
#: agent reports its node command's exit code on, and learns on when to end (see
#: :mod:`.shell_agent`, "the node's command")
STATUS_FD, RELEASE_FD = "{status-fd}", "{release-fd}"
#: every frame: channel (1 byte), payload length (4 bytes), payload
HEADER = struct.Struct("!BI")
#: the largest frame payload either side reads (a frame says its own length: one declaring more
#: ends the connection, so a peer never makes the other allocate what it declares)
MAX_FRAME = 1 << 20
#: seconds a connection to an agent, and the sending of its request, may take: an agent that
#: is stopped or never accepts refuses the caller in bounded time instead of holding it
IO_TIMEOUT = 5.0


def abstract_name(kind: str, job_id: str, node: str) -> bytes:
    """The abstract socket address of one node's ``kind`` agent (leading NUL: abstract)."""
    return f"\0ma_jupyter-{kind}/{job_id}/{node}".encode()


#: how long a connection's close waits for the peer to stop sending (:func:`close_after_peer`)
LINGER = 2.0


def close_after_peer(conn: socket.socket, linger: float = LINGER) -> None:
    """Close a served connection so that the peer still reads every frame sent to it.

    Closing a stream socket whose receive queue holds bytes the peer sent (keystrokes typed
    after the command ended, a script's end of input) makes the kernel report ECONNRESET to the
    peer before the frames it has not read yet, the exit status among them.  So: stop sending,
    read and drop what the peer still sends until it closes or ``linger`` seconds pass, then
    close.
    """
    try:
        conn.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + linger
        while (left := deadline - time.monotonic()) > 0:
            conn.settimeout(left)
            if not conn.recv(65536):
                break
    except OSError:
        pass
    finally:
        conn.close()


def send_frame(conn: socket.socket, channel: int, data: bytes, lock: threading.Lock | None = None) -> None:
    """Send one frame; ``lock`` serialises writers sharing the socket."""
    frame = HEADER.pack(channel, len(data)) + data
    if lock is None:
        conn.sendall(frame)
    else:
        with lock:
            conn.sendall(frame)


def recv_exact(conn: socket.socket, size: int) -> bytes:
    """Exactly ``size`` bytes.

    Raises:
        EOFError: the peer closed the connection first.
    """
    chunks = bytearray()
    while len(chunks) < size:
        data = conn.recv(size - len(chunks))
        if not data:
            raise EOFError("connection closed")
        chunks += data
    return bytes(chunks)


def recv_frame(conn: socket.socket, limit: int = MAX_FRAME) -> tuple[int, bytes]:
    """One frame: (channel, payload).

    Raises:
        EOFError: the peer closed the connection.
        ValueError: the frame declares a payload over ``limit`` bytes (nothing of it is read:
            the connection is to be closed).
    """
    channel, size = HEADER.unpack(recv_exact(conn, HEADER.size))
    if size > limit:
        raise ValueError(f"a frame of {size} bytes, over the {limit} a frame may carry")
    return channel, recv_exact(conn, size)


def peer_credentials(conn: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the other end of ``conn``, as the kernel saw them (a client's at connect, a
    server's at listen), the pid in this process's pid namespace."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    return pid, uid


def peer_allowed(conn: socket.socket, *, root_too: bool = False) -> bool:
    """Rule 1 for the connected peer of ``conn``."""
    uid = peer_credentials(conn)[1]
    return uid == os.getuid() or (root_too and uid == 0)


def secret_matches(given: str, secret: str) -> bool:
    """Rule 2: the request's secret against the server's."""
    return bool(secret) and hmac.compare_digest(given.encode(), secret.encode())


def read_request(conn: socket.socket, limit: int, *, chunk: int = 4096) -> dict | None:
    """The client's request: one JSON object on one line; None when the client closed first,
    sent more than ``limit`` bytes without a line's end, or sent no JSON object (nested too
    deep for the parser included).

    ``chunk`` 1 reads it byte by byte, for a protocol whose frames may follow the request at
    once and must stay in the socket for the frame reader.
    """
    line = bytearray()
    try:
        while not line.endswith(b"\n"):
            data = conn.recv(chunk)
            if not data or len(line) > limit:
                return None
            line += data
        request = json.loads(line)
    except (ValueError, OSError, RecursionError):
        return None
    return request if isinstance(request, dict) else None


class AgentServer:
    """The serving loop both agents run, on ``ma_jupyter-<KIND>/<job>/<node>``.

    For each connection, on a thread of its own, in order:

    1. :attr:`CHECK_PEER_FIRST`: the peer's uid is checked (rule 1) before anything is read;
    2. the request line is read (:func:`read_request`, :attr:`MAX_REQUEST`,
       :attr:`REQUEST_CHUNK`) and parsed by :meth:`parse`; a connection that sends no valid
       request is closed without an answer;
    3. the peer (rule 1, root too with :attr:`ROOT_TOO`) and the request's secret (rule 2) are
       checked: a refused connection gets ``REFUSED_PEER`` or ``REFUSED_SECRET`` on
       :attr:`REFUSAL_CHANNEL`, then :attr:`EXIT_CHANNEL` with ``255``, and is closed;
    4. :meth:`serve_one` serves it; the connection is closed when it returns.

    :meth:`stop` ends what the agent started (on SIGTERM, SIGINT and :attr:`STOP_SIGNALS`).
    """

    KIND = ""
    #: the line printed once the agent listens (``{address}`` filled in)
    READY = ""
    BACKLOG = 16
    MAX_REQUEST = 4096
    REQUEST_CHUNK = 4096
    CHECK_PEER_FIRST = False
    ROOT_TOO = False
    REFUSAL_CHANNEL = 2
    EXIT_CHANNEL = 3
    REFUSED_PEER = b"refused\n"
    REFUSED_SECRET = b"refused\n"
    STOP_SIGNALS: tuple[int, ...] = ()

    def __init__(self, job_id: str, node: str, port: int | None = None):
        self.address = abstract_name(self.KIND, job_id, node)
        self.node = node
        self.secret = os.environ.get(JOB_SECRET_ENV, "")
        #: a TCP port on every address of the node (rule 1's job network) instead of the
        #: abstract socket
        self.port = port
        if port is None:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        else:
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lock = threading.Lock()

    def parse(self, request: dict) -> object:
        """What :meth:`serve_one` needs from the request.

        Raises:
            ValueError, KeyError, TypeError, AttributeError, OverflowError: not a valid request.
        """
        raise NotImplementedError

    def serve_one(self, conn: socket.socket, parsed: object, send_lock: threading.Lock) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        """End everything this agent started (the node is being stopped)."""

    def serve_forever(self) -> None:
        """Accept connections until the process is told to stop."""
        self.sock.bind(self.address if self.port is None else ("0.0.0.0", self.port))
        self.sock.listen(self.BACKLOG)
        where = self.address[1:].decode() if self.port is None else f"port {self.port}"
        print(self.READY.format(node=self.node, address=where), flush=True)
        while True:
            conn, _ = self.sock.accept()
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _peer_allowed(self, conn: socket.socket) -> bool:
        """Rule 1: the peer's uid, or (on the job network) any peer."""
        return self.port is not None or peer_allowed(conn, root_too=self.ROOT_TOO)

    def _refuse(self, conn: socket.socket, why: bytes, send_lock: threading.Lock) -> None:
        send_frame(conn, self.REFUSAL_CHANNEL, why, send_lock)
        send_frame(conn, self.EXIT_CHANNEL, b"255", send_lock)

    def _handle(self, conn: socket.socket) -> None:
        try:
            self._serve_connection(conn)
        finally:
            close_after_peer(conn)

    def _serve_connection(self, conn: socket.socket) -> None:
        send_lock = threading.Lock()
        if self.CHECK_PEER_FIRST and not self._peer_allowed(conn):
            self._refuse(conn, self.REFUSED_PEER, send_lock)
            return
        request = read_request(conn, self.MAX_REQUEST, chunk=self.REQUEST_CHUNK)
        if request is None:
            return
        try:
            parsed = self.parse(request)
            given = str(request.get("secret", ""))
        except (ValueError, KeyError, TypeError, AttributeError, OverflowError):
            return
        if not self._peer_allowed(conn):
            self._refuse(conn, self.REFUSED_PEER, send_lock)
            return
        # one account may run many jobs' nodes: the attempt's secret tells this job's
        # processes from another job's
        if not secret_matches(given, self.secret):
            self._refuse(conn, self.REFUSED_SECRET, send_lock)
            return
        self.serve_one(conn, parsed, send_lock)

    def run(self) -> int:
        """Serve until SIGTERM, SIGINT or one of :attr:`STOP_SIGNALS`; then :meth:`stop`; 0."""

        def stop(_signum, _frame):
            self.stop()
            raise SystemExit(0)

        for signum in (signal.SIGTERM, signal.SIGINT, *self.STOP_SIGNALS):
            signal.signal(signum, stop)
        try:
            self.serve_forever()
        except SystemExit:
            pass
        return 0
