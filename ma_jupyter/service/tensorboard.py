"""One TensorBoard per job, over the job's outputs folder, served under ``/tb/<job_id>/<secret>``.

The service calls :class:`TensorBoardManager`: ``begin`` launches (or reuses) the job's
TensorBoard on a free loopback port and gives a future of its URL, done once it answers (the
REST route awaits it without holding a request thread); ``stop`` ends it (a user's request, or
the job's deletion); a reaper thread ends the ones nobody has used for ``idle_timeout`` seconds;
``shutdown`` ends them all when the service exits.

What one user makes the service spend on boards is bounded, in order:

1. a user may have started at most ``max_per_user`` boards that start or run
   (``[limits] max_tensorboards_per_user``); one more is refused with
   :class:`~ma_jupyter.errors.LimitReached`, naming the setting; a board reused by another
   user still counts once, for the user who started it;
2. a start waits on a thread of the manager's own, never on a request thread, and boards start
   side by side (only the process's launch goes through the one starter thread, below), so
   boards that are slow to answer delay no other request;
3. each board holds at most ``memory_limit_mb`` (``[limits] tensorboard_memory_mb``): its
   processes (TensorBoard and its data server) each get that much, twice over plus 256 MB, as
   their hard ``RLIMIT_DATA`` (set in TensorBoard's own bootstrap, before it reads anything),
   and the watch thread sums their resident memory every :data:`MEMORY_INTERVAL` seconds and
   ends a board past the limit; :meth:`TensorBoardManager.state` then says why
   (``ended``, with the reason), and the next start begins afresh.

TensorBoard reads what the job wrote, symlinks and swapped folders included, so it never runs
with the service's account over the host's view: the backend starts it
(:meth:`~ma_jupyter.backends.base.Backend.start_outputs_reader`) as the job's account, in a
sandbox that shows the job's outputs folder alone, read-only, at
:data:`~ma_jupyter.workspace_paths.OUTPUTS_VIEW`.  This module decides what runs (TensorBoard,
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

from ..errors import BackendUnavailable, Conflict, LimitReached
from ..models import Job
from ..workspace_paths import OUTPUTS_VIEW

log = logging.getLogger(__name__)

START_TIMEOUT = 90.0
#: seconds between two looks at the boards' memory (rule 3)
MEMORY_INTERVAL = 0.5
DEFAULT_MEMORY_MB = 1024.0
DEFAULT_PER_USER = 4

# TensorBoard imports TensorFlow when it is installed, which costs seconds (up to ~20 s on a
# busy 2-core machine) before the first page; its TensorFlow stub reads local event files just
# as well, and TensorBoard picks it when a module ``tensorboard.compat.notf`` exists.
STUB = "sys.modules['tensorboard.compat.notf'] = types.ModuleType('tensorboard.compat.notf'); "
#: the TensorBoard's path prefix, which holds its secret, comes in this variable: a command line
#: is readable by every user of the host (jobs included), a process's environment by its own
#: account only
PREFIX_ENV = "MA_TENSORBOARD_PREFIX"
#: the hard data limit of each of a board's processes, in bytes, comes in this variable
DATA_LIMIT_ENV = "MA_TENSORBOARD_DATA_LIMIT"
BOOTSTRAP = (
    "import os, sys, types, resource; {stub}"
    f"_limit = int(os.environ.pop('{DATA_LIMIT_ENV}')); "
    "resource.setrlimit(resource.RLIMIT_DATA, (_limit, _limit)); "
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
    #: the user who started it, whose count it is (rule 1); None: not counted
    started_by: str | None = None

    def resident_bytes(self) -> int:
        """The resident memory of all its processes together (rule 3)."""
        total = 0
        for process in self.processes():
            try:
                total += process.memory_info().rss
            except psutil.Error:
                continue
        return total

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
        memory_limit_mb: what one board may hold (rule 3; ``[limits] tensorboard_memory_mb``).
        max_per_user: boards one user may have starting or running (rule 1;
            ``[limits] max_tensorboards_per_user``).
        start_timeout: seconds a board has to answer before its start fails.
    """

    def __init__(
        self,
        start_reader: ReaderStart,
        idle_timeout: float | None = DEFAULT_IDLE_TIMEOUT,
        log_dir: Path | None = None,
        python: str | None = None,
        use_tensorflow: bool = False,
        memory_limit_mb: float = DEFAULT_MEMORY_MB,
        max_per_user: int = DEFAULT_PER_USER,
        start_timeout: float = START_TIMEOUT,
    ):
        self.start_reader = start_reader
        self.idle_timeout = idle_timeout
        self.use_tensorflow = use_tensorflow
        self.log_dir = log_dir
        self.python = python or sys.executable
        self.memory_limit = int(memory_limit_mb * (1 << 20))
        self.max_per_user = max_per_user
        self.start_timeout = start_timeout
        self._boards: dict[str, _Board] = {}
        # job id -> (the future of its URL, who started it) while it starts: a second start of
        # the same job gets the same future, so one board starts per job
        self._starting: dict[str, tuple[concurrent.futures.Future, str | None]] = {}
        # job id -> why its last board was ended by the manager (memory), until it starts again
        self._ended: dict[str, str] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        # Boards end with the thread that started them (a parent-death signal follows the
        # thread): request threads come and go, so one thread of the manager's own launches
        # them all and lives as long as the service; a service that dies takes its boards
        # along.  It only launches (fast): the wait for an answer is each start's own thread.
        self._starter = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="tensorboard-start"
        )
        self._reaper: threading.Thread | None = None
        if idle_timeout is not None:
            self._reaper = threading.Thread(target=self._reap, name="tensorboard-reaper", daemon=True)
            self._reaper.start()
        self._watch = threading.Thread(target=self._watch_memory, name="tensorboard-memory", daemon=True)
        self._watch.start()

    # ------------------------------------------------------------------------- public API

    def begin(self, job: Job, user: str | None = None) -> concurrent.futures.Future:
        """A future of the URL of the job's TensorBoard over its outputs folder, started now if
        it is not running (done at once when it runs); returns without waiting (rule 2).

        The future is done once TensorBoard answers (``/data/runs`` returns 200), so the URL
        works at once; it raises what :meth:`start` raises.

        Raises:
            LimitReached: ``user`` already has ``max_per_user`` boards starting or running
                (rule 1; None: not counted).
        """
        with self._lock:
            board = self._boards.get(job.id)
            if board and board.alive():
                board.last_used = time.monotonic()
                done: concurrent.futures.Future = concurrent.futures.Future()
                done.set_result(board.url)
                return done
            pending = self._starting.get(job.id)
            if pending is not None:
                return pending[0]
            if user is not None:
                held = self._held_by(user)
                if len(held) >= self.max_per_user:
                    raise LimitReached(
                        f"{user} already has {len(held)} TensorBoards starting or running "
                        f"(jobs {', '.join(sorted(held))}), and [limits] max_tensorboards_per_user is "
                        f"{self.max_per_user}: stop one of them (`ma-jupyter tensorboard JOB --stop`; its job's "
                        "owner, a rw user or an admin may), or wait until one goes unused long enough to end",
                        field="max_tensorboards_per_user",
                    )
            future: concurrent.futures.Future = concurrent.futures.Future()
            self._starting[job.id] = (future, user)
            self._ended.pop(job.id, None)
            dead = self._boards.pop(job.id, None)
        threading.Thread(
            target=self._start_board,
            args=(job, user, future, dead),
            name=f"tensorboard-{job.id}",
            daemon=True,
        ).start()
        return future

    def start(self, job: Job, user: str | None = None) -> str:
        """The URL of the job's TensorBoard, waiting until it answers (see :meth:`begin`).

        Raises:
            LimitReached: see :meth:`begin`.
            InvalidSpec: the outputs folder does not exist yet, or cannot be read safely (from
                the backend, whose message says why).
            BackendUnavailable: TensorBoard exited or did not answer in time (its output is
                in the message).
        """
        return self.begin(job, user).result()

    def stop(self, job_id: str) -> bool:
        """Stop the job's TensorBoard (one that starts is ended once launched); True if one
        was starting or running."""
        with self._lock:
            board = self._boards.pop(job_id, None)
            pending = self._starting.pop(job_id, None)
        if board is not None:
            self._terminate(board)
        return board is not None or pending is not None

    def state(self, job_id: str) -> dict:
        """``{"state", "url", "reason", "started_by"}`` of the job's TensorBoard: ``running``
        (with its URL), ``starting``, ``ended`` (the manager ended it, or it exited: ``reason``
        says why) or ``none``."""
        with self._lock:
            board = self._boards.get(job_id)
            pending = self._starting.get(job_id)
            reason = self._ended.get(job_id, "")
        if board is not None and board.alive():
            return {"state": "running", "url": board.url, "reason": "", "started_by": board.started_by}
        if pending is not None:
            return {"state": "starting", "url": None, "reason": "", "started_by": pending[1]}
        if reason:
            return {"state": "ended", "url": None, "reason": reason, "started_by": None}
        if board is not None:  # it exited by itself; the reaper removes it
            why = f"TensorBoard of job {job_id} exited with {board.proc.returncode}: start it again"
            return {"state": "ended", "url": None, "reason": why, "started_by": None}
        return {"state": "none", "url": None, "reason": "", "started_by": None}

    def started_by(self, job_id: str) -> str | None:
        """Who started the job's TensorBoard that starts or runs (None: none, or not counted)."""
        with self._lock:
            board = self._boards.get(job_id)
            pending = self._starting.get(job_id)
        if pending is not None:
            return pending[1]
        return board.started_by if board is not None else None

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
                if self._stop_board(job_id, board):
                    stopped.append(job_id)
        return stopped

    def check_memory(self) -> list[str]:
        """End every board whose processes hold more than the memory limit together, noting why
        (rule 3); the job ids whose board was ended."""
        ended = []
        for job_id, board in list(self._boards.items()):
            used = board.resident_bytes()
            if used <= self.memory_limit:
                continue
            reason = self._memory_reason(job_id, used)
            if self._stop_board(job_id, board, reason):
                log.warning("%s", reason)
                ended.append(job_id)
        return ended

    def running(self) -> dict[str, str]:
        """Job id → URL of every TensorBoard alive now."""
        return {job_id: b.url for job_id, b in list(self._boards.items()) if b.alive()}

    def shutdown(self) -> None:
        """Stop the reaper, the watch and every TensorBoard (the service is exiting)."""
        self._closed.set()
        for job_id in list(self._boards) + list(self._starting):
            self.stop(job_id)
        self._starter.shutdown(wait=False)

    # ------------------------------------------------------------------------- internals

    def _memory_reason(self, job_id: str, used: int) -> str:
        return (
            f"TensorBoard of job {job_id} was ended: it held {used / (1 << 20):.0f} MB, over "
            f"[limits] tensorboard_memory_mb of {self.memory_limit / (1 << 20):g} MB (the job's "
            "event files are too large to show at once: keep fewer or smaller summaries in its "
            "outputs, or ask the admin for a higher limit)"
        )

    def _held_by(self, user: str) -> set[str]:
        """The jobs whose board ``user`` started and that start or run; under ``_lock``."""
        held = {job_id for job_id, (_, who) in self._starting.items() if who == user}
        held |= {job_id for job_id, b in self._boards.items() if b.started_by == user and b.alive()}
        return held

    def _stop_board(self, job_id: str, board: _Board, reason: str = "") -> bool:
        """Stop ``board`` if it is still the job's board (a new start may have replaced it)."""
        with self._lock:
            if self._boards.get(job_id) is not board:
                return False
            del self._boards[job_id]
            if reason:
                self._ended[job_id] = reason
        self._terminate(board)
        return True

    def _start_board(
        self, job: Job, user: str | None, future: concurrent.futures.Future, dead: _Board | None
    ) -> None:
        """One start, on its own thread: launch, wait for the answer, hand the URL over."""
        board = None
        try:
            if dead is not None:
                self._terminate(dead)
            board = self._launch(job, user, future)
            with self._lock:
                ours = self._starting.get(job.id, (None, None))[0] is future
                if ours:
                    del self._starting[job.id]
                    self._boards[job.id] = board
            if not ours:
                raise Conflict(f"the TensorBoard of job {job.id} was stopped while it started")
            if not future.done():  # a future cancelled meanwhile takes no result
                future.set_result(board.url)
        except BaseException as exc:
            with self._lock:
                if self._starting.get(job.id, (None, None))[0] is future:
                    del self._starting[job.id]
            if board is not None and self._boards.get(job.id) is not board:
                self._terminate(board)
            if not future.done():
                future.set_exception(exc)

    def _is_starting(self, job_id: str, future: concurrent.futures.Future | None) -> bool:
        """Whether the start of ``future`` is still wanted (no stop came since)."""
        if future is None:
            return True
        with self._lock:
            return self._starting.get(job_id, (None, None))[0] is future

    def _launch(
        self, job: Job, user: str | None = None, future: concurrent.futures.Future | None = None
    ) -> _Board:
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
        # its only variables (the service's own are not its business): keep TF quiet, the
        # secret in the environment, which only its own account reads, and each process's
        # hard data limit (rule 3: twice the board's, so the watch, which sums them, ends it)
        data_limit = 2 * self.memory_limit + (256 << 20)
        env = {
            "TF_CPP_MIN_LOG_LEVEL": "3",
            PREFIX_ENV: f"/tb/{job_id}/{secret}",
            DATA_LIMIT_ENV: str(data_limit),
        }
        try:
            proc = self._starter.submit(
                self.start_reader, job, argv, env, out.fileno() if out else None
            ).result()
        finally:
            if out:
                out.close()
        board = _Board(job_id=job_id, port=port, proc=proc, secret=secret, log_path=log_path, started_by=user)
        deadline = time.monotonic() + self.start_timeout
        probe = f"http://127.0.0.1:{port}{board.prefix}/data/runs"
        import requests  # here, not at the top: the service's start does not need it

        while time.monotonic() < deadline and not self._closed.is_set():
            if not self._is_starting(job_id, future):
                self._terminate(board)
                raise Conflict(f"the TensorBoard of job {job_id} was stopped while it started")
            if not board.alive():
                tail = log_path.read_text(errors="replace")[-2000:] if log_path and log_path.exists() else ""
                raise BackendUnavailable(
                    f"TensorBoard for job {job_id} exited with {proc.returncode}; check that tensorboard is "
                    f"installed in the service's environment. {tail}"
                )
            used = board.resident_bytes()
            if used > self.memory_limit:
                self._terminate(board)
                reason = self._memory_reason(job_id, used)
                with self._lock:
                    self._ended[job_id] = reason
                raise BackendUnavailable(reason)
            try:
                if requests.get(probe, timeout=2).status_code == 200:
                    log.info("TensorBoard for %s at %s (pid %s)", job_id, board.url, proc.pid)
                    return board
            except requests.RequestException:
                pass
            time.sleep(0.1)
        self._terminate(board)
        raise BackendUnavailable(
            f"TensorBoard for job {job_id} did not answer within {self.start_timeout:.0f} s"
        )

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

    def _watch_memory(self) -> None:
        while not self._closed.wait(MEMORY_INTERVAL):
            try:
                self.check_memory()
            except Exception:  # the watch must outlive any single failure
                log.exception("TensorBoard memory check failed")
