"""Per-node launcher of the MindSpore-Ascend mode: the boot file once per card.

``python -m ma_jupyter.nodeside.ascend_launch --slots=S --first-rank=R --rank-size=N
--listen=ADDR:PORT [--peers=ADDR:PORT,...] [--barrier-timeout=SECONDS] -- CMD ...``

Starts CMD ``S`` times (seed 000: the boot file runs once per card), process ``k`` with
``ASCEND_DEVICE_ID=k`` and ``DEVICE_ID=k`` (the logical card index), ``RANK_ID=R+k`` (the job-wide index),
``RANK_SIZE=N`` (cards in the rank table) and ``RANK_TABLE_FILE`` (the folder holding
``jobstart_hccl.json``).  Each process's output goes to ``$MA_RANK_LOG_DIR/rank-<RANK_ID>.log``
and, prefixed with ``[rank r]``, to the node log.

The rank table arrives (as a plan file) with ``status`` ``initializing``.  The launcher
listens on ``--listen``, connects to every peer node's launcher and says who it is (its first
rank).  Once it has reached every peer *and* every peer has reached it, it replaces the table
with ``status`` ``completed`` (in place when its folder is writable, otherwise in a private copy
that ``RANK_TABLE_FILE`` then points at).  Both halves matter: a node that completed on reaching
its peers alone could finish and close its listener before a slower peer ever reached it, and
that peer would wait for the table forever.  The boot files are started before that, as on the
platform, so they must wait for the status themselves
(:func:`ma_jupyter.nodeside.rank_table.wait_completed`).

Exit status: 0 when every process succeeded; otherwise the first failing process's code (128 +
signal number if it was killed), after the other processes were stopped; that rank and code go
to ``$MA_RANK_LOG_DIR/failure.json`` for the job's error event.  SIGTERM/SIGINT are
forwarded to every process.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from . import rank_table
from .rank_log import RANK_LOG_ENV, Copier, open_rank_log, report_failure, resolve

USAGE = (
    "usage: python -m ma_jupyter.nodeside.ascend_launch --slots=S --first-rank=R --rank-size=N "
    "--listen=ADDR:PORT [--peers=ADDR:PORT,...] [--barrier-timeout=SECONDS] -- CMD ..."
)


def parse(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """(options, command): ``--key=value`` options up to ``--``, then the command."""
    options: dict[str, str] = {}
    for i, arg in enumerate(argv):
        if arg == "--":
            return options, argv[i + 1 :]
        if not arg.startswith("--") or "=" not in arg:
            raise ValueError(f"unexpected argument {arg!r}")
        key, _, value = arg[2:].partition("=")
        options[key] = value
    raise ValueError("missing '--' before the command")


def _endpoint(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def rank_env(
    base: dict[str, str], local: int, first_rank: int, rank_size: int, table_dir: str
) -> dict[str, str]:
    """The environment of the process on card ``local``."""
    return {
        **base,
        "ASCEND_DEVICE_ID": str(local),
        # the name MindSpore's model-zoo scripts read (context.set_context(device_id=...))
        "DEVICE_ID": str(local),
        "RANK_ID": str(first_rank + local),
        "RANK_SIZE": str(rank_size),
        "RANK_TABLE_FILE": table_dir,
    }


class Barrier:
    """Flips the rank table to ``completed`` once this node and every peer have reached each other.

    Each connection to a peer carries this node's identity (its first rank) on one line; the
    identities heard on the listener tell which peers have reached this node.
    """

    def __init__(self, listen: str, peers: list[str], table_dir: Path, timeout: float, identity: str):
        self.peers = peers
        self.table_dir = table_dir
        self.timeout = timeout
        self.identity = identity
        self.heard: set[str] = set()
        self.heard_changed = threading.Condition()
        self.server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.server.bind(_endpoint(listen))
        self.server.listen(64)
        self.done = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._accept, daemon=True).start()
        threading.Thread(target=self._wait_peers, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._hear, args=(conn,), daemon=True).start()

    def _hear(self, conn: socket.socket) -> None:
        # the peer may already have closed: what it sent stays readable
        with conn:
            conn.settimeout(10.0)
            try:
                identity = conn.recv(64).decode("ascii", "replace").strip()
            except OSError:
                return
        if identity:
            with self.heard_changed:
                self.heard.add(identity)
                self.heard_changed.notify_all()

    def _reach(self, deadline: float) -> list[str]:
        """Say who we are to every peer; the peers not reached by ``deadline``."""
        pending = list(self.peers)
        while pending and time.monotonic() < deadline:
            for peer in list(pending):
                try:
                    with socket.create_connection(_endpoint(peer), timeout=1.0) as conn:
                        conn.sendall(f"{self.identity}\n".encode("ascii"))
                    pending.remove(peer)
                except OSError:
                    pass
            if pending:
                time.sleep(0.1)
        return pending

    def _wait_peers(self) -> None:
        deadline = time.monotonic() + self.timeout
        pending = self._reach(deadline)
        with self.heard_changed:
            self.heard_changed.wait_for(
                lambda: len(self.heard) >= len(self.peers), timeout=max(0.0, deadline - time.monotonic())
            )
            unheard = len(self.peers) - len(self.heard)
        if pending or unheard > 0:
            missing = ", ".join(pending) if pending else f"{unheard} peer(s) that never reached this node"
            print(f"[ascend_launch] peers {missing} never came up; rank table stays initializing", flush=True)
            return
        path = self.table_dir / rank_table.FILE_NAME
        table = rank_table.read(path)
        table["status"] = rank_table.COMPLETED
        rank_table.write_atomic(path, table)
        print("[ascend_launch] every node is up: rank table status is completed", flush=True)
        self.done.set()


def writable_table_dir(table_dir: Path) -> Path:
    """``table_dir`` if the launcher may replace files in it, else a private copy of the table."""
    probe = table_dir / ".ma_write_probe"
    try:
        probe.write_text("")
        probe.unlink()
        return table_dir
    except OSError:
        copy = Path(tempfile.mkdtemp(prefix="ma_rank_table-"))
        (copy / rank_table.FILE_NAME).write_text((table_dir / rank_table.FILE_NAME).read_text())
        return copy


def _stop(children: list[subprocess.Popen], grace: float = 5.0) -> None:
    for child in children:
        if child.poll() is None:
            child.terminate()
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(c.poll() is None for c in children):
        time.sleep(0.05)
    for child in children:
        if child.poll() is None:
            child.kill()
            child.wait()


def main(argv: list[str] | None = None) -> int:
    """Run the boot file once per card (see the module docstring); returns the node's exit status."""
    try:
        options, command = parse(list(sys.argv[1:] if argv is None else argv))
        slots = int(options["slots"])
        first_rank = int(options["first-rank"])
        rank_size = int(options["rank-size"])
        listen = options["listen"]
    except (ValueError, KeyError) as exc:
        print(f"ascend_launch: {exc}\n{USAGE}", file=sys.stderr)
        return 2
    if not command:
        print(USAGE, file=sys.stderr)
        return 2
    peers = [p for p in options.get("peers", "").split(",") if p]
    table_dir = writable_table_dir(Path(os.environ.get("RANK_TABLE_FILE", "/user/config")))
    barrier = Barrier(listen, peers, table_dir, float(options.get("barrier-timeout", "300")), str(first_rank))
    barrier.start()

    command = resolve(command)
    log_dir = os.environ.get(RANK_LOG_ENV) or tempfile.mkdtemp(prefix="ma_rank_logs-")
    os.makedirs(log_dir, exist_ok=True)
    lock = threading.Lock()
    children: list[subprocess.Popen] = []
    copiers: list[tuple[threading.Thread, Copier]] = []
    rank_files = []
    base = dict(os.environ)

    stopped = []

    def forward(signum, _frame):
        stopped.append(signum)
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    for local in range(slots):
        rank = first_rank + local
        rank_file = open_rank_log(log_dir, rank)  # closed below
        rank_files.append(rank_file)
        read_end, write_end = os.pipe()
        try:
            child = subprocess.Popen(
                command,
                env=rank_env(base, local, first_rank, rank_size, str(table_dir)),
                stdout=write_end,
                stderr=write_end,
            )
        except OSError as exc:
            os.close(read_end)
            print(f"[ascend_launch] cannot start {command[0]}: {exc}", flush=True)
            _stop(children)
            return 127
        finally:
            os.close(write_end)
        children.append(child)
        copier = Copier(read_end, rank_file, f"[rank {rank}] ".encode(), lock)
        thread = threading.Thread(target=copier.run, daemon=True)
        thread.start()
        copiers.append((thread, copier))

    status = 0
    while True:
        codes = [c.poll() for c in children]  # poll every child: each poll() reaps its own
        if all(code is not None for code in codes) or any(code not in (None, 0) for code in codes):
            break
        time.sleep(0.05)
    for i, child in enumerate(children):
        if child.returncode not in (None, 0):
            code = child.returncode
            status = code if code > 0 else 128 - code
            with lock:
                print(f"[ascend_launch] rank {first_rank + i} exited with code {status}", flush=True)
            if not stopped:
                report_failure(log_dir, first_rank + i, status)
            break
    _stop(children)
    for thread, copier in copiers:
        thread.join(timeout=2.0)
        copier.finish()
    for rank_file in rank_files:
        rank_file.close()
    return status


if __name__ == "__main__":
    sys.exit(main())
