"""What a user holds open into jobs (debug terminals, dev environments, log
followers; TensorBoards are capped by the board manager), capped per job and per user, and the thread pool that reaches into nodes.

Rules (in order):

1. A session is counted from the moment it is admitted (:meth:`SessionCaps.hold`) until it is
   released, whatever ends it; each kind has a cap per job and a cap per user, both read from
   ``[limits]`` in ``cluster.toml`` at each admission (:data:`CAPS`).  One over a cap is refused
   with :class:`~ma_jupyter.errors.LimitReached` (429), whose message names the cap, its value, and
   what to do.
2. Everything the service does that connects to, reads from or writes to something inside a
   node from a thread (a debug terminal's agent) runs on :meth:`SessionCaps.in_node_pool`: a pool of its own,
   :data:`NODE_THREADS` threads at most, never the shared pool that serves every other request,
   so a node that never answers holds at most those threads, and every such call has a timeout
   of its own (:data:`ma_jupyter.nodehost.agent_wire.IO_TIMEOUT`), so it holds them for a
   bounded time.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import anyio
import anyio.to_thread

from ..config import Limits
from ..errors import LimitReached

T = TypeVar("T")

#: kind -> (its per-job ``[limits]`` key or None, its per-user key, what it is, what to do)
CAPS: dict[str, tuple[str | None, str, str, str]] = {
    "shell": ("max_shells_per_job", "max_shells_per_user", "debug terminals", "close one of them"),
    "devenv": (
        "max_devenvs_per_job",
        "max_devenvs_per_user",
        "dev environments",
        "stop one of them (ma-jupyter stop ID)",
    ),
    "log_follower": (
        "max_log_followers_per_job",
        "max_log_followers_per_user",
        "log followers (reads that wait)",
        "end one of them, or read without waiting",
    ),
}
#: the most threads reaching into nodes at once (rule 2): more than one user's terminals
#: (``max_shells_per_user``), so one user whose job never answers leaves room for the others
NODE_THREADS = 64


def refusal(kind: str, scope: str, held: int, limit: int, whose: str) -> LimitReached:
    """Rule 1's refusal: ``whose`` (``job X``, ``user Y``) holds ``held`` of ``kind``."""
    per_job, per_user, what, advice = CAPS[kind]
    key = per_job if scope == "job" else per_user
    return LimitReached(
        f"{whose} has {held} {what} open, the most allowed ([limits] {key} = {limit}): {advice}, "
        "or ask the admin to raise the cap"
    )


def check_count(kind: str, scope: str, held: int, limits: Limits, whose: str) -> None:
    """Rule 1 for a kind the store counts (dev environments): ``held`` already."""
    per_job, per_user, _what, _advice = CAPS[kind]
    key = per_job if scope == "job" else per_user
    assert key is not None
    limit = int(getattr(limits, key))
    if held >= limit:
        raise refusal(kind, scope, held, limit, whose)


class SessionCaps:
    """Counts the sessions the service holds itself (debug terminals, log followers), rule 1.

    Args:
        limits: the current ``[limits]`` (read at each admission).
    """

    def __init__(self, limits: Callable[[], Limits]):
        self._limits = limits
        self._lock = threading.Lock()
        self._per_job: Counter[tuple[str, str]] = Counter()
        self._per_user: Counter[tuple[str, str]] = Counter()
        self._node_limiter: anyio.CapacityLimiter | None = None
        self._serial: dict[tuple[str, str], threading.Lock] = {}

    @contextmanager
    def serial(self, kind: str, user: str) -> Iterator[None]:
        """Held while a kind the store counts (rule 1) is counted for ``user`` and then started,
        so two starts at once cannot both pass the cap; other users do not wait."""
        with self._lock:
            lock = self._serial.setdefault((kind, user), threading.Lock())
        with lock:
            yield

    def held(self, kind: str, *, job_id: str | None = None, user: str | None = None) -> int:
        """How many sessions of ``kind`` the job (or the user) holds now."""
        with self._lock:
            if job_id is not None:
                return self._per_job[kind, job_id]
            return self._per_user[kind, user or ""]

    def admit(self, kind: str, job_id: str, user: str) -> Callable[[], None]:
        """Count one session of ``kind`` on ``job_id`` by ``user``; its release (call it once).

        Raises:
            LimitReached: the job or the user holds its cap already.
        """
        per_job, per_user, _what, _advice = CAPS[kind]
        limits = self._limits()
        with self._lock:
            if per_job is not None:
                limit = int(getattr(limits, per_job))
                if self._per_job[kind, job_id] >= limit:
                    raise refusal(kind, "job", self._per_job[kind, job_id], limit, f"job {job_id}")
            limit = int(getattr(limits, per_user))
            if self._per_user[kind, user] >= limit:
                raise refusal(kind, "user", self._per_user[kind, user], limit, f"user {user}")
            self._per_job[kind, job_id] += 1
            self._per_user[kind, user] += 1
        released = threading.Event()

        def release() -> None:
            if released.is_set():
                return
            released.set()
            with self._lock:
                for counter, key in ((self._per_job, (kind, job_id)), (self._per_user, (kind, user))):
                    counter[key] -= 1
                    if counter[key] <= 0:
                        del counter[key]

        return release

    @contextmanager
    def hold(self, kind: str, job_id: str, user: str) -> Iterator[None]:
        """:meth:`admit`, released when the block ends."""
        release = self.admit(kind, job_id, user)
        try:
            yield
        finally:
            release()

    async def in_node_pool(self, fn: Callable[[], T]) -> T:
        """``fn()`` on the pool reaching into nodes (rule 2), never on the shared one."""
        if self._node_limiter is None:  # made in the event loop that uses it (the app's)
            self._node_limiter = anyio.CapacityLimiter(NODE_THREADS)
        return await anyio.to_thread.run_sync(fn, limiter=self._node_limiter)
