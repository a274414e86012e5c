"""The kernel of a dev environment as Jupyter starts it: ``python -m ma_jupyter.client.kernel_bridge
--job JOB --node NODE [--devenv ID] -f {connection_file}`` (the argv of the kernelspec
:mod:`.kernelspec` installs).

Why a bridge: the dev environment's node has its own network namespace, so no TCP port of the
kernel is reachable from the Jupyter server.  Both see one folder, the node's kernel folder
(``<job folder>/nodes/<node>/kernel`` here, ``/run/ma_jupyter/kernel`` there): the kernel binds
its five ZMQ channels there as ``ipc://`` sockets, and this process relays each of them to the TCP
port Jupyter chose for it.  Messages pass through unchanged (they stay signed with Jupyter's key).

Contract, in order:

1. bind Jupyter's five TCP ports at once (what Jupyter sends before the kernel runs waits there);
2. attach to the dev environment ``--devenv`` while it is queued or running and holds no kernel
   yet, else start a new one of job ``--job``'s node ``--node`` (:meth:`~ma_jupyter.client.http.Client.create_devenv`: it
   queues like any job) and wait until it runs; a dev environment that ends before that ends
   this process with its reason;
3. find its kernel folder through the service (the job folder a log stream's ``file`` names:
   only the backend knows where a node's files are, and a node on another machine has none
   here: then stop it and say so);
4. write the kernel's connection file there (``ipc`` transport, sockets ``k-1`` ... ``k-5``,
   Jupyter's key and signature scheme), whole, never over one a bridge wrote before (a second
   notebook on the same kernelspec gets a dev environment of its own).  The folder's contents
   are the job's (its processes write there), so nothing in it is trusted: the folder is opened
   without following a link and every name is used through its descriptor; the file is created
   under a fresh random name that must not exist (``O_EXCL``: a planted link is never followed)
   and then linked to its name, never replacing one; each socket is opened as the very inode it
   is (``O_PATH | O_NOFOLLOW``, refused unless a socket) and connected through that descriptor
   (``/proc/self/fd/N``), so a socket swapped for a link to anything else on this machine is
   never reached, and the path stays short (a Unix socket's is at most 107 bytes);
5. relay: ROUTER (Jupyter's side) to DEALER (the kernel's) for shell, control, stdin and
   heartbeat; XPUB to XSUB for iopub (subscriptions forwarded).  The shell and stdin DEALERs
   share one identity, as a Jupyter client's do, so the kernel's input requests come back;
6. end when the dev environment does (Jupyter's shutdown request ends the kernel, and with it the
   job), or on SIGTERM/SIGHUP (Jupyter's kill): the dev environment is stopped first, which
   frees what it holds.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import stat
import sys
import threading
import time
import uuid
from pathlib import Path

import zmq

from ..jobdir import CHANNEL_PORTS, CONNECTION_FILE, KERNEL_FOLDER, KERNEL_VIEW, SOCKET_PREFIX
from ..models import Job, JobStatus
from .http import Client

#: seconds one status poll waits at the service
_POLL = 20.0
_ROUTED = ("shell_port", "control_port", "stdin_port", "hb_port")


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


def _kernel_folder(client: Client, job: Job) -> Path:
    """Rule 3."""
    node = job.nodes[0].name if job.nodes else "worker-0"
    where = client.local_log_file(job.id, node)
    if where is None:
        raise LookupError(
            f"this machine does not see the files of dev environment {job.id} (its node runs on "
            "another machine): run Jupyter where the node's job folder is visible (the Ray node's "
            "machine, or shared storage mounted at the same path)"
        )
    return Path(where.root) / "nodes" / node / KERNEL_FOLDER


def _open_folder(folder: Path) -> int:
    """The kernel folder's descriptor (rule 4: never through a link)."""
    return os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)


def _write_connection(folder_fd: int, conn: dict) -> bool:
    """Rule 4's connection file, whole or not at all; False when the folder has one already
    (another notebook's kernel runs there: its key is not this one's)."""
    kernel = {
        **CHANNEL_PORTS,
        "transport": "ipc",
        "ip": f"{KERNEL_VIEW}/{SOCKET_PREFIX}",
        "key": conn["key"],
        "signature_scheme": conn.get("signature_scheme", "hmac-sha256"),
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
        # never replaces one: the first bridge wins
        os.link(temporary, CONNECTION_FILE, src_dir_fd=folder_fd, dst_dir_fd=folder_fd, follow_symlinks=False)
    except FileExistsError:
        return False
    finally:
        os.unlink(temporary, dir_fd=folder_fd)
    return True


def _socket_endpoint(folder_fd: int, name: str, deadline: float) -> str:
    """Rule 4: the ``ipc://`` endpoint of the kernel's socket ``name``, through a descriptor of
    that very socket (kept open for the bridge's life: ZMQ reconnects through it), once the
    kernel made it.

    Raises:
        LookupError: it did not appear by ``deadline``, or the job put something else there.
    """
    while True:
        try:
            fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder_fd)
        except FileNotFoundError:
            if time.monotonic() > deadline:
                raise LookupError(
                    f"the kernel did not make its socket {name}: see the dev environment's log"
                ) from None
            time.sleep(0.05)
            continue
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            os.close(fd)
            raise LookupError(
                f"{name} in the kernel folder is not the kernel's socket: refusing to connect to it"
            )
        return f"ipc:///proc/self/fd/{fd}"


def _relay(front: zmq.Socket, back: zmq.Socket) -> None:
    try:
        zmq.proxy(front, back)
    except zmq.ContextTerminated:
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
            folder = _kernel_folder(client, job)
            deadline = time.monotonic() + 60
            while not folder.is_dir():
                if time.monotonic() > deadline:
                    raise LookupError(f"the kernel folder {folder} did not appear")
                time.sleep(0.1)
            folder_fd = _open_folder(folder)
            if _write_connection(folder_fd, conn):
                break
            os.close(folder_fd)
            # a dev environment holds one kernel: this notebook gets one of its own
            _say(f"dev environment {job.id} already runs another notebook's kernel: starting a new one")
            job = None  # the other notebook's: never stopped by this bridge
            job = client.create_devenv(args.job, args.node).info
        deadline = time.monotonic() + 120  # the kernel starts once it reads the connection file
        identity = f"bridge-{uuid.uuid4().hex}".encode()
        backs: dict[str, zmq.Socket] = {}
        for key in _ROUTED:
            sock = ctx.socket(zmq.DEALER)
            sock.linger = 0
            if key in ("shell_port", "stdin_port"):
                sock.setsockopt(zmq.IDENTITY, identity)
            sock.connect(_socket_endpoint(folder_fd, f"{SOCKET_PREFIX}-{CHANNEL_PORTS[key]}", deadline))
            backs[key] = sock
        iopub = ctx.socket(zmq.XSUB)
        iopub.linger = 0
        iopub.connect(_socket_endpoint(folder_fd, f"{SOCKET_PREFIX}-{CHANNEL_PORTS['iopub_port']}", deadline))
        backs["iopub_port"] = iopub
        for key, front in fronts.items():
            threading.Thread(target=_relay, args=(front, backs[key]), daemon=True, name=key).start()
        _say(f"relaying Jupyter's ports to the kernel in {job.id}")
        while not job.status.is_terminal():
            job = client.wait_status(job.id, since=job.status, wait=_POLL)
        _say(f"dev environment {job.id} ended ({job.status.value}): {job.reason}")
        return 0
    except (LookupError, SystemExit) as exc:
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


if __name__ == "__main__":
    sys.exit(main())
