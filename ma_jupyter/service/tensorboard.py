"""One TensorBoard per job, over the job's outputs folder, served under ``/tb/<job_id>/<secret>``.

The service calls :class:`TensorBoardManager`: ``start`` launches (or reuses) the job's
TensorBoard on a free loopback port and returns its URL once it answers; ``stop`` ends it when
the job is deleted; a reaper thread ends the ones nobody has used for ``idle_timeout`` seconds;
``shutdown`` ends them all when the service exits.

Jobs share the host's loopback, so any of them could reach a board's port: the path's secret,
fresh per board and never on a command line, answers that.  Without it a board answers 404; the
URL is a capability the service hands out only after its access check (``Op.tensorboard``).

Each TensorBoard runs in its own process group and is stopped with TERM, then INT, then KILL:
TensorBoard has been seen ignoring SIGTERM for several seconds, and its helper processes must
go with it.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import requests

from ..errors import BackendUnavailable, InvalidSpec

log = logging.getLogger(__name__)

START_TIMEOUT = 90.0

# TensorBoard imports TensorFlow when it is installed, which costs seconds (up to ~20 s on a
# busy 2-core machine) before the first page; its TensorFlow stub reads local event files just
# as well, and TensorBoard picks it when a module ``tensorboard.compat.notf`` exists.
STUB = "sys.modules['tensorboard.compat.notf'] = types.ModuleType('tensorboard.compat.notf'); "
#: the TensorBoard's path prefix, which holds its secret, comes in this variable: a command line
#: is readable by every user of the host (jobs included), a process's environment by its own
#: account only
PREFIX_ENV = "MA_TENSORBOARD_PREFIX"
BOOTSTRAP = (
    "import os, sys, types; {stub}"
    f"sys.argv += ['--path_prefix', os.environ.pop('{PREFIX_ENV}')]; "
    "from tensorboard.main import run_main; run_main()"
)
DEFAULT_IDLE_TIMEOUT = 3600.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class _Board:
    """One running TensorBoard and when it was last used."""

    job_id: str
    logdir: str
    port: int
    proc: subprocess.Popen
    #: the secret part of its path: without it the board answers 404 to everything
    secret: str
    log_path: Path | None = None
    last_used: float = field(default_factory=time.monotonic)

    @property
    def prefix(self) -> str:
        return f"/tb/{self.job_id}/{self.secret}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.prefix}/"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def has_clients(self) -> bool:
        """Whether a browser (or anything) holds a connection to it right now."""
        try:
            conns = psutil.Process(self.proc.pid).net_connections(kind="tcp")
        except (psutil.Error, OSError):
            return False
        return any(
            c.status == psutil.CONN_ESTABLISHED and c.laddr and c.laddr.port == self.port for c in conns
        )


class TensorBoardManager:
    """Starts, reuses and stops the per-job TensorBoards of one service.

    Args:
        idle_timeout: seconds without use (no ``start`` call and no open connection) after
            which the reaper stops a TensorBoard; ``None`` disables the reaper thread.
        log_dir: folder for each TensorBoard's own output (``tensorboard-<job>.log``); none
            discards it.
        python: interpreter that runs TensorBoard (default: this one).
        use_tensorflow: let TensorBoard import TensorFlow (slow start); by default it reads the
            job's local event files with its own TensorFlow stub.
    """

    def __init__(
        self,
        idle_timeout: float | None = DEFAULT_IDLE_TIMEOUT,
        log_dir: Path | None = None,
        python: str | None = None,
        use_tensorflow: bool = False,
    ):
        self.idle_timeout = idle_timeout
        self.use_tensorflow = use_tensorflow
        self.log_dir = log_dir
        self.python = python or sys.executable
        self._boards: dict[str, _Board] = {}
        # One lock per job so two requests for the same job start one TensorBoard, while
        # different jobs start concurrently.
        self._lock = threading.Lock()
        self._job_locks: dict[str, threading.Lock] = {}
        self._closed = threading.Event()
        self._reaper: threading.Thread | None = None
        if idle_timeout is not None:
            self._reaper = threading.Thread(target=self._reap, name="tensorboard-reaper", daemon=True)
            self._reaper.start()

    # ------------------------------------------------------------------------- public API

    def start(self, job_id: str, logdir: str) -> str:
        """The URL of the job's TensorBoard over ``logdir``, started now if it is not running.

        Blocks until TensorBoard answers (``/data/runs`` returns 200), so the URL works at once.

        Raises:
            InvalidSpec: ``logdir`` is not an existing folder.
            BackendUnavailable: TensorBoard exited or did not answer in time (its output is
                in the message).
        """
        if not Path(logdir).is_dir():
            raise InvalidSpec(
                f"{logdir} is not a folder: TensorBoard needs the job's outputs folder to exist"
            )
        with self._lock_for(job_id):
            board = self._boards.get(job_id)
            if board and board.alive() and board.logdir == str(logdir):
                board.last_used = time.monotonic()
                return board.url
            if board:
                self._terminate(board)
            board = self._launch(job_id, str(logdir))
            self._boards[job_id] = board
            return board.url

    def stop(self, job_id: str) -> bool:
        """Stop the job's TensorBoard; True if one was running."""
        with self._lock_for(job_id):
            board = self._boards.pop(job_id, None)
            if board is None:
                return False
            self._terminate(board)
            return True

    def stop_idle(self, max_idle: float) -> list[str]:
        """Stop every TensorBoard unused for ``max_idle`` seconds (or already dead).

        A TensorBoard with an open client connection counts as used now.

        Returns:
            The job ids whose TensorBoard was stopped.
        """
        now = time.monotonic()
        stopped = []
        for job_id, board in list(self._boards.items()):
            if board.alive() and board.has_clients():
                board.last_used = now
            if not board.alive() or now - board.last_used >= max_idle:
                if self.stop(job_id):
                    stopped.append(job_id)
        return stopped

    def running(self) -> dict[str, str]:
        """Job id → URL of every TensorBoard alive now."""
        return {job_id: b.url for job_id, b in list(self._boards.items()) if b.alive()}

    def shutdown(self) -> None:
        """Stop the reaper and every TensorBoard (the service is exiting)."""
        self._closed.set()
        for job_id in list(self._boards):
            self.stop(job_id)

    # ------------------------------------------------------------------------- internals

    def _lock_for(self, job_id: str) -> threading.Lock:
        with self._lock:
            return self._job_locks.setdefault(job_id, threading.Lock())

    def _launch(self, job_id: str, logdir: str) -> _Board:
        port = _free_port()
        # A job shares the host's loopback: it could reach this port, but not guess the path
        # (a fresh secret per board, handed out only to callers the service lets open it).
        secret = secrets.token_urlsafe(24)
        bootstrap = BOOTSTRAP.format(stub="" if self.use_tensorflow else STUB)
        argv = [
            self.python,
            "-c",
            bootstrap,
            "--logdir",
            logdir,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--reload_interval",
            "2",
        ]
        log_path = self.log_dir / f"tensorboard-{job_id}.log" if self.log_dir else None
        out = open(log_path, "ab") if log_path else subprocess.DEVNULL
        # TensorBoard checks for updates and phones nowhere else, but keep TF quiet and local.
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", PREFIX_ENV: f"/tb/{job_id}/{secret}"}
        try:
            proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        finally:
            if log_path:
                out.close()
        board = _Board(job_id=job_id, logdir=logdir, port=port, proc=proc, secret=secret, log_path=log_path)
        deadline = time.monotonic() + START_TIMEOUT
        probe = f"http://127.0.0.1:{port}{board.prefix}/data/runs"
        while time.monotonic() < deadline:
            if not board.alive():
                tail = log_path.read_text(errors="replace")[-2000:] if log_path and log_path.exists() else ""
                raise BackendUnavailable(
                    f"TensorBoard for job {job_id} exited with {proc.returncode}; check that tensorboard is "
                    f"installed in the service's environment. {tail}"
                )
            try:
                if requests.get(probe, timeout=2).status_code == 200:
                    log.info("TensorBoard for %s at %s (pid %s)", job_id, board.url, proc.pid)
                    return board
            except requests.RequestException:
                pass
            time.sleep(0.1)
        self._terminate(board)
        raise BackendUnavailable(f"TensorBoard for job {job_id} did not answer within {START_TIMEOUT:.0f} s")

    @staticmethod
    def _terminate(board: _Board) -> None:
        """TERM, then INT, then KILL the TensorBoard's process group, waiting between steps."""
        for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGINT, 3.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(board.proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                board.proc.wait(wait)
            except subprocess.TimeoutExpired:
                continue
            # The leader is gone; make sure no helper of its group stays behind.
            try:
                os.killpg(board.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            return

    def _reap(self) -> None:
        assert self.idle_timeout is not None
        interval = max(1.0, min(60.0, self.idle_timeout / 4))
        while not self._closed.wait(interval):
            try:
                stopped = self.stop_idle(self.idle_timeout)
                if stopped:
                    log.info("stopped idle TensorBoards: %s", ", ".join(stopped))
            except Exception:  # the reaper must outlive any single failure
                log.exception("idle TensorBoard check failed")
