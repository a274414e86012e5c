"""mpirun's remote agent for simulated nodes: an "ssh" that enters another node's sandbox.

On a real cluster mpirun on worker-0 reaches the other nodes through ssh, and those nodes run
nothing but sshd until it does.  Simulated nodes are sandboxes on one host, so this module plays
both parts:

* ``python -m ma_jupyter.nodehost.rsh_agent --serve --job JOB --host worker-1`` is what the waiting
  nodes (worker-1 ... worker-N-1) run: a small server that listens on the abstract Unix socket
  ``ma_jupyter-rsh/<JOB>/<host>`` and runs each command it receives with ``sh -c`` *inside its
  own sandbox* (its hostname, its mounts, its env), streaming stdout/stderr back and finally the
  exit status.  It serves until the node is stopped.
* ``python -m ma_jupyter.nodehost.rsh_agent [ssh options] HOST CMD ...`` is the agent mpirun calls
  (``plm_rsh_agent``) like ``ssh HOST CMD``: it connects to HOST's server of the same job
  (``$MA_JOB_ID``), waiting up to ``MA_RSH_CONNECT_TIMEOUT`` seconds (default 60) for it to come
  up, relays the output and exits with the remote command's status.  Closing the connection (the
  agent is killed) makes the server kill the remote command's process group.  HOST equal to
  ``$HOSTNAME`` (the node's own name) runs the command right here: where nodes have no private
  hostname (no sandbox), mpirun does not recognise its own node in the hostfile.

Why an abstract socket: where the nodes share the host's network namespace (a service that may
not make namespaces), they share its abstract socket names but not their filesystems, and the
kernel tells the server the connecting process's uid (``SO_PEERCRED``): commands are accepted
only from the server's own uid, the same trust ssh between one user's own nodes gives.  Where
each node is a machine of its own on the job's network (:mod:`.network`; the backend then adds
``--port`` to both command lines), abstract names are each node's own: the server listens on that TCP port of
the node's address instead, as sshd does, and the agent connects to HOST's address; only the
job's nodes reach it, and the attempt's secret is checked either way.  The remote command's stdin is ``/dev/null``:
Open MPI's daemons do not read it (mpirun forwards stdin to rank 0, which runs on worker-0).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from .agent_wire import JOB_SECRET_ENV, AgentServer, abstract_name, recv_frame, send_frame

STDOUT, STDERR, EXIT = 1, 2, 3
MAX_REQUEST = 1 << 20  # bytes of one command request
USAGE = (
    "usage: python -m ma_jupyter.nodehost.rsh_agent --serve --job JOB --host HOST [--port PORT]\n"
    "       python -m ma_jupyter.nodehost.rsh_agent [--port=PORT] [ssh options] HOST CMD ..."
)


#: the port the backend gives (``--port``) where nodes reach each other's server over TCP, on
#: each node's job-network address: sshd's alternative port, on no node but for this server
#: (each node's address is its own, and the waiting node runs nothing else before mpirun)
JOB_NETWORK_PORT = 2222


def parse_port(value: str) -> int:
    """A ``--port`` value.

    Raises:
        ValueError: not a TCP port number.
    """
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise ValueError(f"--port must be a TCP port number (1-65535), not {value!r}")
    return int(value)


def socket_name(job_id: str, host: str) -> bytes:
    """The abstract socket address of one node's server."""
    return abstract_name("rsh", job_id, host)


# -------------------------------------------------------------------------------- server


class Server(AgentServer):
    """Runs commands for the agent inside this node (see the module docstring); the serving loop
    is :class:`.agent_wire.AgentServer`'s, the peer checked before anything is read."""

    KIND = "rsh"
    READY = "[rsh_agent] {node} waiting for mpirun"
    BACKLOG = 64
    MAX_REQUEST = MAX_REQUEST
    CHECK_PEER_FIRST = True
    REFUSAL_CHANNEL = STDERR
    EXIT_CHANNEL = EXIT
    REFUSED_PEER = b"rsh_agent: refused: not the node's user\n"
    # Every job runs as the same user, so the uid alone does not tell this job's mpirun from
    # another job's process: the attempt's secret does.
    REFUSED_SECRET = b"rsh_agent: refused: not a node of this job\n"

    def __init__(self, job_id: str, host: str, port: int | None = None):
        super().__init__(job_id, host, port)
        self.host = host
        self.children: set[subprocess.Popen] = set()

    def parse(self, request: dict) -> str:
        return str(request["command"])

    def serve_one(self, conn: socket.socket, command: str, send_lock: threading.Lock) -> None:
        child = subprocess.Popen(
            ["sh", "-c", command],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        with self.lock:
            self.children.add(child)
        pumps = [
            threading.Thread(target=self._pump, args=(child.stdout, STDOUT, conn, send_lock), daemon=True),
            threading.Thread(target=self._pump, args=(child.stderr, STDERR, conn, send_lock), daemon=True),
        ]
        for pump in pumps:
            pump.start()
        # The agent closing its end (mpirun gone) means the command must go too.
        threading.Thread(target=self._watch_hangup, args=(conn, child), daemon=True).start()
        code = child.wait()
        for pump in pumps:
            pump.join(timeout=2.0)
        with self.lock:
            self.children.discard(child)
        try:
            send_frame(conn, EXIT, str(code if code >= 0 else 128 - code).encode(), send_lock)
        except OSError:
            pass

    @staticmethod
    def _pump(stream, channel: int, conn: socket.socket, send_lock: threading.Lock) -> None:
        try:
            while True:
                data = os.read(stream.fileno(), 65536)
                if not data:
                    break
                send_frame(conn, channel, data, send_lock)
        except OSError:
            pass

    @staticmethod
    def _watch_hangup(conn: socket.socket, child: subprocess.Popen) -> None:
        try:
            while conn.recv(4096):
                pass
        except OSError:
            pass
        if child.poll() is None:
            _kill_group(child, grace=2.0)

    def stop(self) -> None:
        """Kill every command still running (the node is being stopped)."""
        with self.lock:
            children = list(self.children)
        for child in children:
            _kill_group(child, grace=1.0)


def _kill_group(child: subprocess.Popen, grace: float) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(child.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if child.poll() is not None:
                break
            time.sleep(0.05)


def serve(job_id: str, host: str, port: int | None = None) -> int:
    """Run the server (on TCP ``port`` where one is given) until SIGTERM/SIGINT; returns 0."""
    return Server(job_id, host, port).run()


# -------------------------------------------------------------------------------- agent


def connect(job_id: str, host: str, timeout: float, port: int | None = None) -> socket.socket:
    """A connection to HOST's server (its abstract socket, or with ``port`` that port of HOST's
    address), retried until ``timeout`` while it is not up yet."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if port is not None:  # HOST's address on the job network (its /etc/hosts line)
                sock = socket.create_connection((host, port), timeout=max(1.0, deadline - time.monotonic()))
                sock.settimeout(None)
                return sock
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(socket_name(job_id, host))
            except BaseException:
                sock.close()
                raise
            return sock
        except (ConnectionRefusedError, FileNotFoundError):
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.1)


def split_ssh_args(argv: list[str]) -> tuple[str, str]:
    """(host, command) from an ssh-like argv: options first, then HOST, then the command words."""
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        # ssh options that take a value (e.g. "-p 22" from plm_rsh_args) consume the next word
        if argv[i] in ("-p", "-l", "-o", "-i", "-F") and i + 1 < len(argv):
            i += 1
        i += 1
    if i >= len(argv) - 1:
        raise ValueError("expected HOST and a command")
    return argv[i], " ".join(argv[i + 1 :])


def run_remote(job_id: str, host: str, command: str, timeout: float = 60.0, port: int | None = None) -> int:
    """Run ``command`` on ``host``'s server and relay its output; returns its exit status."""
    try:
        sock = connect(job_id, host, timeout, port)
    except OSError as exc:
        print(
            f"rsh_agent: node {host} of job {job_id} did not come up within {timeout:.0f} s ({exc})",
            file=sys.stderr,
        )
        return 255

    def hang_up(signum, _frame):
        sock.close()
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, hang_up)
    signal.signal(signal.SIGINT, hang_up)
    sock.sendall(
        json.dumps({"command": command, "secret": os.environ.get(JOB_SECRET_ENV, "")}).encode() + b"\n"
    )
    outputs = {STDOUT: sys.stdout.buffer, STDERR: sys.stderr.buffer}
    with sock:
        try:
            while True:
                channel, data = recv_frame(sock)
                if channel == EXIT:
                    return int(data)
                outputs[channel].write(data)
                outputs[channel].flush()
        except (EOFError, OSError, ValueError):  # ValueError: a frame over agent_wire.MAX_FRAME
            print(f"rsh_agent: lost the connection to {host}", file=sys.stderr)
            return 255


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``--serve`` runs the server, anything else is an ssh-like call."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--serve"]:
        options = dict(zip(args[1::2], args[2::2], strict=False))
        if not options.get("--job") or not options.get("--host"):
            print(USAGE, file=sys.stderr)
            return 2
        try:
            port = parse_port(options["--port"]) if "--port" in options else None
        except ValueError as exc:
            print(f"rsh_agent: {exc}", file=sys.stderr)
            return 2
        return serve(options["--job"], options["--host"], port)
    port = None
    if args[:1] and args[0].startswith("--port="):  # ours, before mpirun's ssh arguments
        try:
            port = parse_port(args.pop(0).split("=", 1)[1])
        except ValueError as exc:
            print(f"rsh_agent: {exc}", file=sys.stderr)
            return 2
    try:
        host, command = split_ssh_args(args)
    except ValueError:
        print(USAGE, file=sys.stderr)
        return 2
    if host == os.environ.get("HOSTNAME"):
        # this node itself: without a private hostname (no sandbox) mpirun cannot tell it is local
        os.execvp("sh", ["sh", "-c", command])
    job_id = os.environ.get("MA_JOB_ID", "")
    if not job_id:
        print("rsh_agent: MA_JOB_ID is not set: run it inside a job's node", file=sys.stderr)
        return 255
    timeout = float(os.environ.get("MA_RSH_CONNECT_TIMEOUT", "60"))
    return run_remote(job_id, host, command, timeout, port)


if __name__ == "__main__":
    sys.exit(main())
