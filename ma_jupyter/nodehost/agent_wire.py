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
   may run the node as another account).
2. The request's secret equals the server's (compared in constant time); a server without one
   serves nobody.

Standard library only: it runs inside a node, under the job's own interpreter.
"""

from __future__ import annotations

import hmac
import os
import socket
import struct
import threading

#: set by the backend for the nodes of one attempt (backends.base.JOB_SECRET_ENV)
JOB_SECRET_ENV = "MA_JOB_SECRET"
#: every frame: channel (1 byte), payload length (4 bytes), payload
HEADER = struct.Struct("!BI")


def abstract_name(kind: str, job_id: str, node: str) -> bytes:
    """The abstract socket address of one node's ``kind`` agent (leading NUL: abstract)."""
    return f"\0ma_jupyter-{kind}/{job_id}/{node}".encode()


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


def recv_frame(conn: socket.socket) -> tuple[int, bytes]:
    """One frame: (channel, payload).

    Raises:
        EOFError: the peer closed the connection.
    """
    channel, size = HEADER.unpack(recv_exact(conn, HEADER.size))
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
