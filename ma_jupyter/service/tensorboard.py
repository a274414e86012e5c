"""One TensorBoard per job, over the job's outputs folder, served under ``/tb/<job_id>/<secret>``.

The service calls :class:`TensorBoardManager`: ``start`` launches (or reuses) the job's
TensorBoard on a free loopback port and returns its URL once it answers; ``stop`` ends it when
the job is deleted; a reaper thread ends the ones nobody has used for ``idle_timeout`` seconds;
``shutdown`` ends them all when the service exits.

TensorBoard reads what the job wrote, symlinks and swapped folders included, so it never runs
with the service's account over the host's view: the backend starts it
(:meth:`~ma_jupyter.backends.base.Backend.start_outputs_reader`) as the job's account, in a
sandbox that shows the job's outputs folder alone, read-only, at
:data:`~ma_jupyter.backends.base.OUTPUTS_VIEW`.  This module decides what runs (TensorBoard,
its port, its secret) and when; the backend decides how it is confined.

A board listens on the service's loopback, which jobs may share: the path's secret, fresh per
board and never on a command line, answers that.  Without it a board answers 404; the URL is a
capability the service hands out only after its access check (``Op.tensorboard``).

Each TensorBoard runs in its own process group and is stopped with TERM, then INT, then KILL:
TensorBoard has been seen ignoring SIGTERM for several seconds, and its helper processes must
go with it.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import requests

from ..backends.base import OUTPUTS_VIEW
from ..errors import BackendUnavailable
from ..models import Job

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
#: seconds a stopped board's processes get to be gone after the last KILL
GONE_WAIT = 5.0

#: starts a program over a job's outputs: ``(job, argv, env, output fd or None) -> process``,
#: with the contract of :meth:`~ma_jupyter.backends.base.Backend.start_outputs_reader`
ReaderStart = Callable[[Job, list[str], dict[str, str], int | None], subprocess.Popen]


def _alive(process: psutil.Process) -> bool:
    """Whether ``process`` still runs (a zombie waiting for its reaper does not)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class _Board:
    """One running TensorBoard and when it was last used."""

    job_id: str
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

    def processes(self) -> list[psutil.Process]:
        """The board's processes: its sandbox's leader and everything below it."""
        try:
            leader = psutil.Process(self.proc.pid)
            return [leader, *leader.children(recursive=True)]
        except psutil.Error:
            return []

    def has_clients(self) -> bool:
        """Whether a browser (or anything) holds a connection to it right now (TensorBoard
        itself runs below the sandbox's leader, which holds no socket)."""
        for process in self.processes():
            try:
                conns = process.net_connections(kind="tcp")
            except (psutil.Error, OSError):
                continue
            if any(
                c.status == psutil.CONN_ESTABLISHED and c.laddr and c.laddr.port == self.port for c in conns
            ):
                return True
        return False


class TensorBoardManager:
    """Starts, reuses and stops the per-job TensorBoards of one service.

    Args:
        start_reader: starts TensorBoard confined to the job's outputs, as the job's account
            (the service passes its backend's ``start_outputs_reader``).
        idle_timeout: seconds without use (no ``start`` call and no open connection) after
            which the reaper stops a TensorBoard; ``None`` disables the reaper thread.
        log_dir: folder for each TensorBoard's own output (``tensorboard-<job>.log``); none
            discards it.
        python: interpreter that runs TensorBoard (default: this one); the sandbox shows its
            installation, read-only.
        use_tensorflow: let TensorBoard import TensorFlow (slow start); by default it reads the
            job's local event files with its own TensorFlow stub.
    """

    def __init__(
        self,
        start_reader: ReaderStart,
        idle_timeout: float | None = DEFAULT_IDLE_TIMEOUT,
        log_dir: Path | None = None,
        python: str | None = None,
        use_tensorflow: bool = False,
    ):
        self.start_reader = start_reader
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
        # Boards end with the thread that started them (a parent-death signal follows the
        # thread): request threads come and go, so one thread of the manager's own starts them
        # all and lives as long as the service; a service that dies takes its boards along.
        self._starter = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="tensorboard-start"
        )
        self._reaper: threading.Thread | None = None
        if idle_timeout is not None:
            self._reaper = threading.Thread(target=self._reap, name="tensorboard-reaper", daemon=True)
            self._reaper.start()

    # ------------------------------------------------------------------------- public API

    def start(self, job: Job) -> str:
        """The URL of the job's TensorBoard over its outputs folder, started now if it is not
        running.

        Blocks until TensorBoard answers (``/data/runs`` returns 200), so the URL works at once.

        Raises:
            InvalidSpec: the outputs folder does not exist yet, or cannot be read safely (from
                the backend, whose message says why).
            BackendUnavailable: TensorBoard exited or did not answer in time (its output is
                in the message).
        """
        with self._lock_for(job.id):
            board = self._boards.get(job.id)
            if board and board.alive():
                board.last_used = time.monotonic()
                return board.url
            if board:
                self._terminate(board)
            board = self._launch(job)
            self._boards[job.id] = board
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
        self._starter.shutdown(wait=False)

    # ------------------------------------------------------------------------- internals

    def _lock_for(self, job_id: str) -> threading.Lock:
        with self._lock:
            return self._job_locks.setdefault(job_id, threading.Lock())

    def _launch(self, job: Job) -> _Board:
        job_id = job.id
        port = _free_port()
        # A job may share the service's loopback: it could reach this port, but not guess the
        # path (a fresh secret per board, handed out only to callers the service lets open it).
        secret = secrets.token_urlsafe(24)
        bootstrap = BOOTSTRAP.format(stub="" if self.use_tensorflow else STUB)
        argv = [
            self.python,
            "-c",
            bootstrap,
            "--logdir",
            OUTPUTS_VIEW,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--reload_interval",
            "2",
        ]
        log_path = self.log_dir / f"tensorboard-{job_id}.log" if self.log_dir else None
        out = open(log_path, "ab") if log_path else None
        # its only variables (the service's own are not its business): keep TF quiet, and the
        # secret in the environment, which only its own account reads
        env = {"TF_CPP_MIN_LOG_LEVEL": "3", PREFIX_ENV: f"/tb/{job_id}/{secret}"}
        try:
            proc = self._starter.submit(
                self.start_reader, job, argv, env, out.fileno() if out else None
            ).result()
        finally:
            if out:
                out.close()
        board = _Board(job_id=job_id, port=port, proc=proc, secret=secret, log_path=log_path)
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
        """TERM, then INT, then KILL the TensorBoard's process group, waiting between steps;
        returns once none of its processes is left (or :data:`GONE_WAIT` seconds after the
        last KILL)."""
        # taken now: once the sandbox's leader is gone, its processes are no longer below it
        members = board.processes()
        for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGINT, 3.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(board.proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                board.proc.wait(wait)
            except subprocess.TimeoutExpired:
                continue
            break
        # The leader is gone; make sure nothing of its group stays behind (TensorBoard, below
        # the sandbox's leader, may outlive it for a moment), and wait until it is all gone.
        try:
            os.killpg(board.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        deadline = time.monotonic() + GONE_WAIT
        while any(_alive(p) for p in members) and time.monotonic() < deadline:
            time.sleep(0.05)

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
