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
2. within a priority, the smaller *share* first: a job's share is how many jobs its user (its
   creator; jobs without one are the service's) has running, plus how many of the user's queued
   jobs of that priority come before it.  Every user's next job thus comes before another
   user's twentieth: alice's forty queued jobs put bob's one behind at most one of hers, and a
   job of alice's that starts leaves her others' shares as they were (one more running, one
   fewer ahead);
3. at the same share, the user served longest ago first (the user whose last job admission
   started earliest; a user never served first): round robin, so that a user whose job just
   ended, back to the share of another who waits, does not go first again for being older;
4. then older first (the submit time; an attempt put back in the queue keeps the place its job
   had among its user's jobs);
5. then by job id.

The running jobs a share counts are those admission told the index of: each job it starts
(:meth:`QueueIndex.starting`) and, at the start of each pass, the jobs that still run
(:meth:`QueueIndex.set_running`), so a job that ended moves its user's queued jobs up by the next
pass (an end frees resources, which asks for one).  After a restart they count from the first pass,
and the users of the jobs running then count as served then (rule 3 starts afresh: it is kept in
memory only, so an order that rests on it alone may change across a restart).

Every method is thread-safe (the REST app reads positions while the supervisor changes the queue).
A change of a user's share or turn moves only that user's queued jobs (a binary search each).
"""

from __future__ import annotations

import math
import threading
from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable, Hashable, Iterable

from ..models import Job, JobSpec, Priority

#: a job's place in the queue: (-priority rank, share, served, submit time, id); smaller first
Key = tuple[int, int, int, float, str]
#: the queued jobs of one user at one priority: (user, priority rank)
Group = tuple[str | None, int]
_RANKS = sorted({priority.rank for priority in Priority})
#: more moved jobs than this and the whole order is sorted again rather than moved job by job
_FEW = 32


def queue_key(job: Job, share: int = 0, served: int = 0) -> Key:
    """The job's place in the queue order given its ``share`` and when its user was ``served``
    (rules 1-5 of the module docstring)."""
    return (-job.spec.priority.rank, share, served, job.created_at.timestamp(), job.id)


def _group(job: Job) -> Group:
    return (job.spec.creator, job.spec.priority.rank)


class QueueIndex:
    """The queued jobs in queue order, grouped by shape; ``shape`` maps a spec to its shape."""

    def __init__(self, shape: Callable[[JobSpec], Hashable]):
        self._shape_of = shape
        self._lock = threading.Lock()
        self._order: list[Key] = []  # every queued job, sorted
        self._shapes: dict[Hashable, list[Key]] = {}  # shape -> its jobs, sorted
        self._where: dict[str, tuple[Key, Hashable, Group]] = {}  # job id -> (key, shape, group)
        # (user, priority rank) -> its queued jobs' (submit time, id), sorted (rule 2)
        self._users: dict[Group, list[tuple[float, str]]] = {}
        self._running: dict[str, str | None] = {}  # running job id -> its user (rule 2)
        self._served: dict[str | None, int] = {}  # user -> the turn its last job started (rule 3)
        self._turn = 0

    def _shape(self, job: Job) -> Hashable:
        """The job's shape: its spec's, and the nodes it avoids (a job avoiding a node may wait
        while others of its spec shape fit there); a job avoiding none has its spec's shape."""
        shape = self._shape_of(job.spec)
        return (shape, "excluding", tuple(job.excluded_nodes)) if job.excluded_nodes else shape

    def load(self, jobs: Iterable[Job]) -> None:
        """Replace the contents with ``jobs`` (the queued jobs of the store); no job counts as
        running until admission says so."""
        jobs = list(jobs)
        users: dict[Group, list[tuple[float, str]]] = {}
        for job in jobs:
            users.setdefault(_group(job), []).append((job.created_at.timestamp(), job.id))
        share: dict[str, int] = {}
        for members in users.values():
            members.sort()
            share.update((job_id, at) for at, (_, job_id) in enumerate(members))
        entries = {job.id: (queue_key(job, share[job.id]), self._shape(job), _group(job)) for job in jobs}
        with self._lock:
            self._where = entries
            self._users = users
            self._running, self._served, self._turn = {}, {}, 0
            self._order = sorted(key for key, _, _ in entries.values())
            self._shapes = {}
            for key in self._order:
                self._shapes.setdefault(entries[key[-1]][1], []).append(key)

    def put(self, job: Job) -> None:
        """Add a queued job, or move it to the place its priority now gives it."""
        shape, group = self._shape(job), _group(job)
        member = (job.created_at.timestamp(), job.id)
        with self._lock:
            self._remove(job.id)
            members = self._users.setdefault(group, [])
            at = bisect_left(members, member)
            members.insert(at, member)
            key = queue_key(job, self._running_of(group[0]) + at, self._served.get(group[0], 0))
            self._where[job.id] = (key, shape, group)
            insort(self._order, key)
            insort(self._shapes.setdefault(shape, []), key)
            self._reshare(group[0])

    def discard(self, job_id: str) -> bool:
        """Take a job out of the queue; False if it was not in it."""
        with self._lock:
            return self._remove(job_id)

    def starting(self, job: Job) -> None:
        """Admission starts ``job``: from now on it counts as running for its user (rule 2), so
        leaving the queue moves none of the user's other jobs."""
        with self._lock:
            self._running[job.id] = job.spec.creator
            self._turn += 1
            self._served[job.spec.creator] = self._turn  # rule 3: its turn was now
            self._reshare(job.spec.creator)

    def running(self) -> dict[str, str | None]:
        """The running jobs the shares count: job id -> user."""
        with self._lock:
            return dict(self._running)

    def set_running(self, running: dict[str, str | None]) -> None:
        """The running jobs (job id -> user) are now these: the users whose count changed have
        their queued jobs' shares updated (rule 2)."""
        with self._lock:
            changed = {*self._running.values(), *running.values()}
            for user in {*running.values()} - {*self._served}:
                self._turn += 1
                self._served[user] = self._turn  # running since before a restart (module docstring)
            self._running = dict(running)
            for user in changed:
                self._reshare(user)

    def _running_of(self, user: str | None) -> int:
        """How many running jobs of ``user`` the shares count (those no longer queued; lock held)."""
        return sum(1 for job_id, of in self._running.items() if of == user and job_id not in self._where)

    def _remove(self, job_id: str) -> bool:
        found = self._where.pop(job_id, None)
        if found is None:
            return False
        key, shape, group = found
        _delete(self._order, key)
        keys = self._shapes[shape]
        _delete(keys, key)
        if not keys:
            del self._shapes[shape]
        members = self._users[group]
        del members[bisect_left(members, (key[3], job_id))]
        if not members:
            del self._users[group]
        self._reshare(group[0])
        return True

    def _reshare(self, user: str | None) -> None:
        """Give each queued job of ``user`` the share and turn rules 2 and 3 now say (lock held);
        only the jobs whose key changed move: one by one when they are few, else the order is
        sorted again at once (a user's turn moves all of that user's jobs)."""
        base, served = self._running_of(user), self._served.get(user, 0)
        moved: list[tuple[Key, Key, Hashable]] = []
        for rank in _RANKS:
            for at, (_, job_id) in enumerate(self._users.get((user, rank), ())):
                key, shape, group = self._where[job_id]
                if key[1:3] != (base + at, served):
                    new = (key[0], base + at, served, key[3], key[4])
                    self._where[job_id] = (new, shape, group)
                    moved.append((key, new, shape))
        if len(moved) > _FEW:
            self._order = sorted(key for key, _, _ in self._where.values())
            self._shapes = {}
            for key in self._order:
                self._shapes.setdefault(self._where[key[-1]][1], []).append(key)
            return
        for key, new, shape in moved:
            _delete(self._order, key)
            insort(self._order, new)
            keys = self._shapes[shape]
            _delete(keys, key)
            insort(keys, new)

    def position(self, job_id: str) -> int | None:
        """How many queued jobs come before this one (0: it is considered first); None if it is
        not queued."""
        with self._lock:
            found = self._where.get(job_id)
            return bisect_left(self._order, found[0]) if found else None

    def ahead(self, priority: Priority, creator: str | None = None) -> int:
        """How many queued jobs come before a job of ``priority`` that ``creator`` submits now:
        those of a higher priority, and those of the same priority whose share is at most the
        new job's (the creator's running jobs and queued jobs of that priority, rule 2)."""
        with self._lock:
            share = self._running_of(creator) + len(self._users.get((creator, priority.rank), ()))
            return bisect_left(self._order, (-priority.rank, share, self._served.get(creator, 0), math.inf))

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
            return self._order[0][-1] if self._order else None

    def ids(self) -> list[str]:
        """Every queued job's id, in queue order."""
        with self._lock:
            return [key[-1] for key in self._order]

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
