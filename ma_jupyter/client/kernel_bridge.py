"""The kernel of a dev environment as Jupyter starts it: ``python -m ma_jupyter.client.kernel_bridge
--job JOB --node NODE [--devenv ID] -f {connection_file}`` (the argv of the kernelspec
:mod:`.kernelspec` installs).

Why a bridge: the dev environment's node has its own network namespace, so no TCP port of the
kernel is reachable from the Jupyter server.  The kernel binds its five ZMQ channels as ``ipc://``
sockets in the node's kernel folder (``<job folder>/nodes/<node>/kernel`` on the node's machine,
``/run/ma_jupyter/kernel`` inside it), and this process relays each of them to the TCP port
Jupyter chose for it.  Messages pass through unchanged (they stay signed with Jupyter's key).

Contract, in order:

1. bind Jupyter's five TCP ports at once (what Jupyter sends before the kernel runs waits there);
2. attach to the dev environment ``--devenv`` while it is queued or running and holds no kernel
   yet, else start a new one of job ``--job``'s node ``--node`` (:meth:`~ma_jupyter.client.http.Client.create_devenv`: it
   queues like any job) and wait until it runs; a dev environment that ends before that ends
   this process with its reason;
3. ask the service how its kernel is reached (:meth:`~ma_jupyter.client.http.Client.kernel_route`,
   ``POST /jobs/{id}/kernel``: only the backend knows where a node's files are): its kernel
   folder on this machine (the local backend: :class:`_Folder`), or the relay on the Ray node that
   runs it (the Ray backend, always: :class:`_Relay`).  A Unix socket connects processes of one
   machine only, so a node on another machine is reached over TCP through that relay, which
   admits a connection only once it proves the relay's secret (handed to this process by the
   service in that answer, and kept in memory only);
4. write the kernel's connection file there (``ipc`` transport, sockets ``k-1`` ... ``k-5``,
   Jupyter's key and signature scheme), whole, never over one a bridge wrote before (a second
   notebook on the same kernelspec gets a dev environment of its own).  The folder's contents
   are the job's, so nothing in it is trusted (:mod:`ma_jupyter.kernel_access`, which this bridge
   and the relay share): the folder is opened without following a link, the file is created
   under a fresh random name that must not exist and then linked to its name, and each socket is
   opened as the very inode it is (``O_PATH | O_NOFOLLOW``, refused unless a socket owned by the
   kernel folder's owner, the job's account) and connected to through that descriptor, so a
   socket swapped for a link, or a hard link, to anything else on that machine is never reached.  Through the relay, the relay does exactly this on its machine;
   this process waits until each of the kernel's sockets answers (at most two minutes);
5. relay: ROUTER (Jupyter's side) to DEALER (the kernel's) for shell, control, stdin and
   heartbeat; XPUB to XSUB for iopub (subscriptions forwarded).  The shell and stdin DEALERs
   share one identity, as a Jupyter client's do, so the kernel's input requests come back.
   Through the relay, the DEALERs and the XSUB connect to Unix sockets in a folder of this
   process's own (mode 0700: no other account reaches them), and each connection made there
   opens one relay connection, proves the secret, names its kernel socket and then carries
   bytes both ways: ZMTP over ``ipc`` and over ``tcp`` is the same byte stream.  A relay that
   is gone (its agent restarted) is asked for again through the service once per connection.
   The sockets towards the kernel take no message over
   :data:`~ma_jupyter.kernel_access.MAX_KERNEL_MESSAGE` bytes (``zmq.MAXMSGSIZE``): whatever
   answers there is the job's, and a peer declaring a larger frame is disconnected before ZMQ
   allocates it (ZMQ connects again, to a well-behaved kernel as before);
6. end when the dev environment does (Jupyter's shutdown request ends the kernel, and with it the
   job, and the relay with its node), or on SIGTERM/SIGHUP (Jupyter's kill): the dev environment
   is stopped first, which frees what it holds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import zmq

from .. import kernel_access
from ..errors import MaJupyterError
from ..kernel_access import CHANNELS
from ..models import Job, JobStatus, KernelRelay
from .http import Client

#: seconds one status poll waits at the service
_POLL = 20.0
_ROUTED = ("shell_port", "control_port", "stdin_port", "hb_port")
#: seconds to connect to the relay, and to wait for its answer (it waits up to two minutes for
#: a kernel socket to appear)
RELAY_CONNECT = 10.0
RELAY_ANSWER = 150.0
#: ms between ZMQ's tries to connect again, doubling up to this: a relay that is gone is asked
#: for again through the service on each try, which must not become a storm
_RECONNECT_MAX = 2000


def _say(text: str) -> None:
    print(f"ma_jupyter kernel bridge: {text}", file=sys.stderr, flush=True)


def _bind(ctx: zmq.Context, kind: int, conn: dict, key: str) -> zmq.Socket:
    sock = ctx.socket(kind)
    sock.linger = 0
    if kind == zmq.ROUTER:
        # as ipykernel's own: a peer reconnecting with an identity already known (Jupyter's
        # kernel manager and its client share one session, so one identity) takes it over
        # instead of being ignored
        sock.router_handover = 1
    sock.bind(f"{conn.get('transport', 'tcp')}://{conn['ip']}:{conn[key]}")
    return sock


def kernel_socket(ctx: zmq.Context, kind: int) -> zmq.Socket:
    """A socket towards the kernel (rule 5): no linger, reconnects backing off, and no message
    over :data:`~ma_jupyter.kernel_access.MAX_KERNEL_MESSAGE` taken from it."""
    sock = ctx.socket(kind)
    sock.linger = 0
    sock.reconnect_ivl_max = _RECONNECT_MAX
    sock.setsockopt(zmq.MAXMSGSIZE, kernel_access.MAX_KERNEL_MESSAGE)
    return sock


def _attach(client: Client, args: argparse.Namespace) -> Job:
    """Rule 2: the dev environment to use, queued or running."""
    if args.devenv:
        job = client.get(args.devenv)
        if not job.status.is_terminal():
            return job
        _say(f"dev environment {job.id} has ended ({job.status.value}): starting a new one")
    return client.create_devenv(args.job, args.node).info


def _wait_running(client: Client, job: Job) -> Job:
    while job.status is not JobStatus.running:
        if job.status.is_terminal():
            raise SystemExit(
                f"dev environment {job.id} ended {job.status.value} before its kernel ran: {job.reason}"
            )
        _say(f"dev environment {job.id} is {job.status.value}: waiting until it runs")
        job = client.wait_status(job.id, since=job.status, wait=_POLL)
    return job


class _Folder:
    """Rule 4 on this machine: the kernel folder itself (the local backend)."""

    def __init__(self, folder: Path):
        deadline = time.monotonic() + 60
        while True:
            try:
                self._fd = kernel_access.open_folder(folder)
                break
            except FileNotFoundError:
                if time.monotonic() > deadline:
                    raise LookupError(
                        f"the kernel folder {folder} is not on this machine: run Jupyter on the "
                        "service's machine"
                    ) from None
                time.sleep(0.1)
        self._sockets: list[int] = []

    def write_connection(self, conn: dict) -> bool:
        return kernel_access.write_connection(
            self._fd, conn["key"], conn.get("signature_scheme", "hmac-sha256")
        )

    def endpoint(self, name: str, deadline: float) -> str:
        """The ``ipc://`` endpoint of the kernel's socket ``name``, through a descriptor of that
        very socket (kept open for the bridge's life: ZMQ reconnects through it)."""
        fd = kernel_access.open_socket(self._fd, name, deadline)
        self._sockets.append(fd)
        return f"ipc://{kernel_access.socket_path(fd)}"

    def close(self) -> None:
        for fd in [self._fd, *self._sockets]:
            os.close(fd)


class _Relay:
    """Rules 3 to 5 through the relay on the Ray node that runs the dev environment.

    Args:
        relay: the relay's address and secret, as the service answered.
        again: asks the service for the relay again (after its agent restarted, it is another).
    """

    def __init__(self, relay: KernelRelay, again: Callable[[], KernelRelay]):
        self._relay = relay
        self._again = again
        self._lock = threading.Lock()
        self._said: set[str] = set()
        self._folder = Path(tempfile.mkdtemp(prefix="ma-kernel-"))  # 0700: this account's only
        self._listeners: list[socket.socket] = []

    def _open(self, request: dict) -> tuple[socket.socket | None, bytes, str]:
        """One relay connection that made ``request``: the connection, the relay's answer and
        its refusal's line.  A relay that closes without an answer, or that is not there, is
        asked for again through the service once (a wrong secret gets no answer)."""
        for attempt in (0, 1):
            with self._lock:
                if attempt:
                    self._relay = self._again()
                relay = self._relay
            try:
                conn = socket.create_connection((relay.host, relay.port), timeout=RELAY_CONNECT)
            except OSError:
                if attempt:
                    raise
                continue
            try:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                # the relay waits up to two minutes for a kernel socket to appear
                conn.settimeout(RELAY_ANSWER)
                conn.sendall(kernel_access.hello(relay.secret, **request))
                answer, text = kernel_access.read_answer(conn)
                conn.settimeout(None)
            except OSError:
                conn.close()
                if attempt:
                    raise
                continue
            if answer:
                return conn, answer, text
            conn.close()
        return None, b"", ""

    def _refused(self, what: str, answer: bytes, text: str) -> LookupError:
        if answer == kernel_access.REFUSED:
            return LookupError(text or f"the relay refused {what}")
        return LookupError(f"the dev environment's relay did not answer {what}: it has ended")

    def write_connection(self, conn: dict) -> bool:
        request = {"key": conn["key"], "signature_scheme": conn.get("signature_scheme", "hmac-sha256")}
        sock, answer, text = self._open({"connection": request})
        if sock is not None:
            sock.close()
        if answer not in (kernel_access.WRITTEN, kernel_access.EXISTS):
            raise self._refused("the connection file", answer, text)
        return answer == kernel_access.WRITTEN

    def endpoint(self, name: str, deadline: float) -> str:
        """The ``ipc://`` endpoint, in this process's own folder, that reaches the kernel's socket
        ``name`` through the relay, once the relay reached that socket (a first connection made
        and closed: the kernel is up, and the relay found its socket as rule 4 wants)."""
        while True:
            sock, answer, text = self._open({"channel": name})
            if sock is not None:
                sock.close()
            if answer == kernel_access.READY:
                break
            if time.monotonic() > deadline:
                raise self._refused(f"the kernel's socket {name}", answer, text)
            if answer == kernel_access.REFUSED:  # not a socket, no such name: it stays so
                raise self._refused(f"the kernel's socket {name}", answer, text)
            time.sleep(0.2)
        path = str(self._folder / name)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(8)
        self._listeners.append(listener)
        threading.Thread(
            target=self._accept, args=(listener, name), daemon=True, name=f"relay-{name}"
        ).start()
        return f"ipc://{path}"

    def _accept(self, listener: socket.socket, name: str) -> None:
        while True:
            try:
                local, _ = listener.accept()
            except OSError:
                return  # closed
            threading.Thread(
                target=self._carry, args=(local, name), daemon=True, name=f"relay-{name}"
            ).start()

    def _carry(self, local: socket.socket, name: str) -> None:
        """One ZMQ connection to the kernel's socket ``name``: a relay connection for it, then
        bytes both ways until either side ends."""
        try:
            remote, answer, text = self._open({"channel": name})
        except Exception as exc:  # the service or the relay is gone: ZMQ connects again later
            self._say_once(f"cannot reach the kernel's socket {name} through the relay: {exc}")
            local.close()
            return
        if remote is None or answer != kernel_access.READY:
            if remote is not None:
                remote.close()
            self._say_once(str(self._refused(f"the kernel's socket {name}", answer, text)))
            local.close()
            return
        threading.Thread(target=_copy, args=(remote, local), daemon=True, name=f"relay-{name}").start()
        _copy(local, remote)

    def _say_once(self, text: str) -> None:
        with self._lock:
            if text in self._said:
                return
            self._said.add(text)
        _say(text)

    def close(self) -> None:
        for listener in self._listeners:
            listener.close()
        shutil.rmtree(self._folder, ignore_errors=True)


def _copy(source: socket.socket, target: socket.socket) -> None:
    """Bytes from ``source`` to ``target`` until one side ends; then both end."""
    try:
        kernel_access.copy_bytes(source, target)
    finally:
        for sock in (source, target):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()


def _door(client: Client, job: Job) -> _Folder | _Relay:
    """Rule 3: the way to the dev environment's kernel, as the service says."""
    route = client.kernel_route(job.id)
    if route.relay is not None:
        fresh = Client(autostart=False)  # its own: the main thread's client is in a long poll

        def again() -> KernelRelay:
            relay = fresh.kernel_route(job.id).relay
            if relay is None:
                raise LookupError(f"the service no longer names a relay for dev environment {job.id}")
            return relay

        return _Relay(route.relay, again)
    if route.folder is None:
        raise LookupError(f"the service named no way to the kernel of dev environment {job.id}")
    return _Folder(Path(route.folder))


def _proxy(front: zmq.Socket, back: zmq.Socket) -> None:
    try:
        zmq.proxy(front, back)
    except zmq.ZMQError:  # the context ended (its sockets closed under the proxy): this process ends
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ma_jupyter.client.kernel_bridge")
    parser.add_argument("--job", required=True, help="the job whose node the dev environment is")
    parser.add_argument("--node", default=None, help="its node (default its first)")
    parser.add_argument("--devenv", default=None, help="a dev environment already started to attach to")
    parser.add_argument("-f", dest="connection_file", required=True, help="Jupyter's connection file")
    args = parser.parse_args(argv)
    conn = json.loads(Path(args.connection_file).read_text())

    ctx = zmq.Context()
    fronts = {key: _bind(ctx, zmq.ROUTER, conn, key) for key in _ROUTED}
    fronts["iopub_port"] = _bind(ctx, zmq.XPUB, conn, "iopub_port")

    client = Client(autostart=False)
    job: Job | None = None
    door: _Folder | _Relay | None = None
    ending = threading.Event()

    def stop(signum: int, frame: object) -> None:
        ending.set()
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # interrupts come as messages (interrupt_mode)
    try:
        job = _attach(client, args)
        while True:
            _say(f"dev environment {job.id} ({job.name}) of job {args.job}")
            job = _wait_running(client, job)
            door = _door(client, job)
            if door.write_connection(conn):
                break
            door.close()
            door = None
            # a dev environment holds one kernel: this notebook gets one of its own
            _say(f"dev environment {job.id} already runs another notebook's kernel: starting a new one")
            job = None  # the other notebook's: never stopped by this bridge
            job = client.create_devenv(args.job, args.node).info
        deadline = time.monotonic() + 120  # the kernel starts once it reads the connection file
        identity = f"bridge-{uuid.uuid4().hex}".encode()
        backs: dict[str, zmq.Socket] = {}
        for key in _ROUTED:
            sock = kernel_socket(ctx, zmq.DEALER)
            if key in ("shell_port", "stdin_port"):
                sock.setsockopt(zmq.IDENTITY, identity)
            sock.connect(door.endpoint(CHANNELS[key], deadline))
            backs[key] = sock
        iopub = kernel_socket(ctx, zmq.XSUB)
        iopub.connect(door.endpoint(CHANNELS["iopub_port"], deadline))
        backs["iopub_port"] = iopub
        for key, front in fronts.items():
            threading.Thread(target=_proxy, args=(front, backs[key]), daemon=True, name=key).start()
        _say(f"relaying Jupyter's ports to the kernel in {job.id}")
        while not job.status.is_terminal():
            job = client.wait_status(job.id, since=job.status, wait=_POLL)
        _say(f"dev environment {job.id} ended ({job.status.value}): {job.reason}")
        return 0
    except (LookupError, OSError, MaJupyterError, SystemExit) as exc:
        if isinstance(exc, SystemExit) and not isinstance(exc.code, str):
            return exc.code or 0
        _say(str(exc.code if isinstance(exc, SystemExit) else exc))
        return 1
    finally:
        if job is not None and not job.status.is_terminal():
            try:
                client.stop(job.id)
                _say(f"stopped dev environment {job.id}")
            except Exception as exc:  # the service may be gone: say so, end anyway
                _say(f"could not stop dev environment {job.id}: {exc}")
        ctx.destroy(linger=0)
        if door is not None:
            door.close()


if __name__ == "__main__":
    sys.exit(main())
