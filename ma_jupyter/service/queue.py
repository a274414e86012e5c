"""The queue index: every queued job, in the order the scheduler considers them, in memory.

The supervisor keeps one (rebuilt from the store when it starts, so a restart loses no queued
job) and updates it with every change of the queue: a submit, an attempt put back in the queue,
a priority change, a job leaving the queue (started, stopped, deleted, failed).  It answers
without reading the store or walking the queue:

* the exact position of a queued job, and how many queued jobs a new job of a given priority
  would have ahead of it (a binary search each);
* the first job of each *shape* (jobs the scheduler places alike: the same
  :meth:`.scheduler.Scheduler.shape` of their spec and the same
  :attr:`~ma_jupyter.models.Job.excluded_nodes`) and the next job of a shape after a given one:
  an admission pass walks these instead of every queued job.

The queue order, a total order that is the same after a restart:

1. higher priority first (very-urgent, urgent, normal);
2. within a priority, older first (the submit time; an attempt put back in the queue keeps the
   place its job had);
3. then by job id.

Every method is thread-safe (the REST app reads positions while the supervisor changes the queue).
"""

from __future__ import annotations

import threading
from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable, Hashable, Iterable

from ..models import Job, JobSpec, Priority

#: a job's place in the queue: (-priority rank, submit time, id); smaller comes first
Key = tuple[int, float, str]


def queue_key(job: Job) -> Key:
    """The job's place in the queue order (rules 1-3 of the module docstring)."""
    return (-job.spec.priority.rank, job.created_at.timestamp(), job.id)


class QueueIndex:
    """The queued jobs in queue order, grouped by shape; ``shape`` maps a spec to its shape."""

    def __init__(self, shape: Callable[[JobSpec], Hashable]):
        self._shape_of = shape
        self._lock = threading.Lock()
        self._order: list[Key] = []  # every queued job, sorted
        self._shapes: dict[Hashable, list[Key]] = {}  # shape -> its jobs, sorted
        self._where: dict[str, tuple[Key, Hashable]] = {}  # job id -> (key, shape)

    def _shape(self, job: Job) -> Hashable:
        """The job's shape: its spec's, and the nodes it avoids (a job avoiding a node may wait
        while others of its spec shape fit there); a job avoiding none has its spec's shape."""
        shape = self._shape_of(job.spec)
        return (shape, "excluding", tuple(job.excluded_nodes)) if job.excluded_nodes else shape

    def load(self, jobs: Iterable[Job]) -> None:
        """Replace the contents with ``jobs`` (the queued jobs of the store)."""
        entries = {job.id: (queue_key(job), self._shape(job)) for job in jobs}
        with self._lock:
            self._where = entries
            self._order = sorted(key for key, _ in entries.values())
            self._shapes = {}
            for key in self._order:
                self._shapes.setdefault(entries[key[2]][1], []).append(key)

    def put(self, job: Job) -> None:
        """Add a queued job, or move it to the place its priority now gives it."""
        key, shape = queue_key(job), self._shape(job)
        with self._lock:
            self._remove(job.id)
            self._where[job.id] = (key, shape)
            insort(self._order, key)
            insort(self._shapes.setdefault(shape, []), key)

    def discard(self, job_id: str) -> bool:
        """Take a job out of the queue; False if it was not in it."""
        with self._lock:
            return self._remove(job_id)

    def _remove(self, job_id: str) -> bool:
        found = self._where.pop(job_id, None)
        if found is None:
            return False
        key, shape = found
        _delete(self._order, key)
        group = self._shapes[shape]
        _delete(group, key)
        if not group:
            del self._shapes[shape]
        return True

    def position(self, job_id: str) -> int | None:
        """How many queued jobs come before this one (0: it is considered first); None if it is
        not queued."""
        with self._lock:
            found = self._where.get(job_id)
            return bisect_left(self._order, found[0]) if found else None

    def ahead(self, priority: Priority) -> int:
        """How many queued jobs come before a job of ``priority`` submitted now: those of the
        same or a higher priority."""
        with self._lock:
            # keys whose first item is at most -rank, i.e. whose priority is at least ``priority``
            return bisect_left(self._order, (-priority.rank + 1,))

    def heads(self) -> list[tuple[Key, Hashable]]:
        """The first job of each shape, as (key, shape), in queue order."""
        with self._lock:
            return sorted((group[0], shape) for shape, group in self._shapes.items())

    def next_of(self, shape: Hashable, key: Key) -> Key | None:
        """The job of ``shape`` that comes after ``key`` (which may have left the queue since)."""
        with self._lock:
            group = self._shapes.get(shape)
            if not group:
                return None
            at = bisect_right(group, key)
            return group[at] if at < len(group) else None

    def first(self) -> str | None:
        """The id of the job considered first (None: the queue is empty)."""
        with self._lock:
            return self._order[0][2] if self._order else None

    def ids(self) -> list[str]:
        """Every queued job's id, in queue order."""
        with self._lock:
            return [key[2] for key in self._order]

    def __len__(self) -> int:
        with self._lock:
            return len(self._order)

    def __contains__(self, job_id: object) -> bool:
        with self._lock:
            return job_id in self._where


def _delete(keys: list[Key], key: Key) -> None:
    at = bisect_left(keys, key)
    if at < len(keys) and keys[at] == key:
        del keys[at]
