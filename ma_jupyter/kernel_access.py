"""A dev environment's kernel reached from outside its node: its kernel folder used without
trusting it, and the wire format of the relay that reaches it from another machine.

The kernel folder (``<job folder>/nodes/<node>/kernel``, the node's
:data:`~ma_jupyter.jobdir.KERNEL_VIEW`) holds the connection file and the kernel's five ZMQ
``ipc://`` sockets ``k-1`` ... ``k-5``.  Two programs use it from outside the node: the kernel
bridge (:mod:`ma_jupyter.client.kernel_bridge`) where the folder is on its machine, and the
relay of a Ray node's agent (:mod:`ma_jupyter.backends.ray.kernel_relay`) where it is not.  The
folder's contents are the job's (its processes write there), so both use it the same way:

1. the folder is opened without following a link (:func:`open_folder`), and every name in it is
   used through that descriptor;
2. the connection file is created whole under a fresh random name that must not exist
   (``O_EXCL``: a planted link is never followed), then linked to its name, never replacing one
   (:func:`write_connection`: the first writer wins);
3. a socket is opened as the very inode it is (``O_PATH | O_NOFOLLOW``, refused unless a socket
   owned by the job's account, the owner of the kernel folder the platform made for the node)
   and connected to through that descriptor, ``/proc/self/fd/N`` (:func:`open_socket`): a socket
   swapped for a link to anything else on the machine is never reached, nor a hard link to a
   socket of another account (where ``fs.protected_hardlinks`` is 0 a job may hard-link one it
   does not own), and the path stays short (a Unix socket's is at most 107 bytes).  Only the
   names :data:`CHANNELS` are ever opened.

The relay's wire (TCP to the Ray node holding the dev environment, one connection per channel
or request):

1. the client sends one line, at most :data:`HELLO_LIMIT` bytes, within :data:`HELLO_WAIT`
   seconds: JSON ``{"secret": S, "channel": "k-N"}`` (carry that kernel socket's bytes) or
   ``{"secret": S, "connection": {"key": K, "signature_scheme": SCHEME}}`` (write the kernel's
   connection file, rule 2);
2. a line that is not that, or whose secret is not the relay's (compared in constant time): the
   relay closes the connection having sent nothing;
3. a channel: the relay answers :data:`READY` once it is connected to the kernel's socket, then
   carries bytes both ways unchanged (ZMTP over ``tcp`` and over ``ipc`` is the same byte
   stream, so both ZMQ ends see an ordinary peer); a connection file: :data:`WRITTEN` or
   :data:`EXISTS`, then it closes; either refused: :data:`REFUSED`, one line saying why, close.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import threading
import time
import uuid

from .jobdir import CHANNEL_PORTS, CONNECTION_FILE, KERNEL_VIEW, SOCKET_PREFIX

#: the kernel's socket names, by channel (``shell_port`` -> ``k-1``...)
CHANNELS = {key: f"{SOCKET_PREFIX}-{number}" for key, number in CHANNEL_PORTS.items()}
#: the largest first line of a relay connection (bytes)
HELLO_LIMIT = 4096
#: seconds the relay waits for a connection's first line
HELLO_WAIT = 10.0
#: the relay's answers (wire rule 3); a refusal is followed by one line of text
READY, WRITTEN, EXISTS, REFUSED = b"+", b"w", b"x", b"-"
#: the largest ZMQ message the bridge takes from a kernel (``zmq.MAXMSGSIZE`` on its sockets to
#: it): a kernel's peer declaring a larger frame is disconnected before anything of it is
#: allocated, where ZMQ would otherwise allocate what the frame declares (the relay between
#: them copies bytes a chunk at a time, holding no message whole)
MAX_KERNEL_MESSAGE = 256 << 20


def open_folder(folder: str | os.PathLike) -> int:
    """Rule 1: the kernel folder's descriptor, never through a link (OSError otherwise)."""
    return os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)


def write_connection(folder_fd: int, key: str, signature_scheme: str = "hmac-sha256") -> bool:
    """Rule 2: the kernel's connection file (``ipc`` transport, sockets ``k-1`` ... ``k-5`` as the
    node sees them, Jupyter's ``key``), whole or not at all; False when the folder has one
    already (another notebook's kernel runs there: its key is not this one's)."""
    kernel = {
        **CHANNEL_PORTS,
        "transport": "ipc",
        "ip": f"{KERNEL_VIEW}/{SOCKET_PREFIX}",
        "key": key,
        "signature_scheme": signature_scheme,
        "kernel_name": "",
    }
    temporary = f".{CONNECTION_FILE}.{uuid.uuid4().hex}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    # readable by the job's account (its kernel reads it); the key is this dev environment's own
    fd = os.open(temporary, flags, 0o644, dir_fd=folder_fd)
    try:
        data = json.dumps(kernel).encode()
        while data:
            data = data[os.write(fd, data) :]
    finally:
        os.close(fd)
    try:
        # never replaces one: the first writer wins
        os.link(temporary, CONNECTION_FILE, src_dir_fd=folder_fd, dst_dir_fd=folder_fd, follow_symlinks=False)
    except FileExistsError:
        return False
    finally:
        os.unlink(temporary, dir_fd=folder_fd)
    return True


def open_socket(
    folder_fd: int,
    name: str,
    deadline: float,
    cancel: threading.Event | None = None,
    owner: int | None = None,
) -> int:
    """Rule 3: an ``O_PATH`` descriptor of the kernel's socket ``name`` (one of
    :data:`CHANNELS`), once the kernel made it; connect to :func:`socket_path` of it.

    Args:
        owner: the uid the socket must belong to, the job's account; None: the kernel folder's
            owner (the platform gives the folder to the account the node runs as).

    Raises:
        LookupError: ``name`` is no channel's, it did not appear by ``deadline`` (a
            ``time.monotonic()`` value) or before ``cancel`` was set, or the job put something
            else than a socket of its own account there.
    """
    cancel = cancel or threading.Event()
    if owner is None:
        owner = os.fstat(folder_fd).st_uid
    if name not in CHANNELS.values():
        raise LookupError(f"{name!r} is not one of the kernel's sockets ({', '.join(CHANNELS.values())})")
    while True:
        try:
            fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder_fd)
        except FileNotFoundError:
            if time.monotonic() > deadline or cancel.wait(0.05):
                raise LookupError(
                    f"the kernel did not make its socket {name}: see the dev environment's log"
                ) from None
            continue
        found = os.fstat(fd)
        # a hard link keeps its inode's owner: one to another account's socket is refused too
        if not stat.S_ISSOCK(found.st_mode) or found.st_uid != owner:
            os.close(fd)
            raise LookupError(
                f"{name} in the kernel folder is not the kernel's socket (a socket of the job's "
                "account): refusing to connect to it"
            )
        return fd


def socket_path(fd: int) -> str:
    """The path that reaches the very socket ``fd`` (from :func:`open_socket`) names, in this
    process: ``/proc/self/fd/N``."""
    return f"/proc/self/fd/{fd}"


def connect_socket(fd: int) -> socket.socket:
    """A stream connection to the kernel's socket ``fd`` names (ZMQ's ``ipc`` is a Unix stream
    socket)."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(socket_path(fd))
    except OSError:
        conn.close()
        raise
    return conn


def hello(secret: str, **request: object) -> bytes:
    """Wire rule 1: the first line of a relay connection."""
    line = json.dumps({"secret": secret, **request}).encode() + b"\n"
    if len(line) > HELLO_LIMIT:
        raise ValueError(f"a relay request is at most {HELLO_LIMIT} bytes")
    return line


def read_hello(conn: socket.socket, wait: float = HELLO_WAIT) -> dict | None:
    """Wire rule 1, on the relay's side: the first line as a dict, or None when the peer sent
    more than :data:`HELLO_LIMIT` bytes without a line break, closed, sent no JSON object, or
    took more than ``wait`` seconds in all (a peer trickling bytes holds nothing longer).  Reads
    byte by byte up to the line's end, so nothing of what follows it is taken."""
    deadline = time.monotonic() + wait
    line = bytearray()
    while len(line) <= HELLO_LIMIT:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        try:
            conn.settimeout(left)
            byte = conn.recv(1)
        except OSError:
            return None
        if not byte:
            return None
        if byte == b"\n":
            try:
                request = json.loads(line)
            except ValueError:
                return None
            return request if isinstance(request, dict) else None
        line += byte
    return None


def read_answer(conn: socket.socket) -> tuple[bytes, str]:
    """Wire rule 3, on the client's side: the relay's answer and, for a refusal, its line; an
    empty answer when the relay closed without one (a wrong secret, or no relay any more)."""
    first = _recv_exact(conn, 1)
    if first != REFUSED:
        return first, ""
    text = bytearray()
    while len(text) < HELLO_LIMIT:
        byte = _recv_exact(conn, 1)
        if byte in (b"", b"\n"):
            break
        text += byte
    return REFUSED, text.decode("utf-8", "replace")


def copy_bytes(source: socket.socket, target: socket.socket, chunk: int = 1 << 16) -> None:
    """Bytes from ``source`` to ``target`` until ``source`` ends or either fails (the relay's and
    the bridge's splice: ZMTP passes through unchanged); the caller then ends both."""
    try:
        while True:
            data = source.recv(chunk)
            if not data:
                return
            target.sendall(data)
    except OSError:
        return


def _recv_exact(conn: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        try:
            chunk = conn.recv(count - len(data))
        except OSError:
            return data
        if not chunk:
            return data
        data += chunk
    return data
