"""Admission: which queued jobs start, in queue order, with backfill behind the head.

Admission works on the queue index (:mod:`..queue`), the queued jobs in memory in queue order,
rebuilt from the store when the supervisor is made.  The loop runs a pass only after an event
that can change what starts (:meth:`.ledger.Ledger.queue_changed`), or when a job a full disk
held is due.  A pass (:meth:`Admission.admit`), having told the queue index which jobs run (the
users' fair share in the queue order, :mod:`..queue` rule 2):

1. walks the jobs in queue order, one shape at a time (:meth:`..scheduler.Scheduler.shape`):
   it starts from the first job of every shape and always takes the earliest job still to try;
2. reads that job fresh from the store (skipping it if it left the queue meanwhile, its data
   is being prepared, or it waits to retry after a full disk) and asks the scheduler to place it;
3. launches it if it fits (it counts as its user's running job from then on), and goes on with
   the next job of its shape;
4. if it does not fit, notes once on the job that it waits, and tries no other job of its shape
   in this pass: the pass only adds to what is in use, so none of them would fit either (what
   an attempt winding down frees meanwhile asks for another pass), while jobs of other shapes
   behind it may still start (backfill);
5. the first job that does not fit is the *head*: it reserves the nodes it will take once
   enough running jobs end (:meth:`..scheduler.Scheduler.reserve`, from their durations), and
   every later job starts only if it cannot delay it (:meth:`..scheduler.Scheduler.backfill`:
   it fits beside the reservation, or its duration ends it before the head's estimated start).
   A job that fits but is held for the head does not stop its shape's walk (durations differ).

Every placement avoids the nodes the job was rescheduled away from (its ``excluded_nodes``,
unless no other node could ever hold it: :meth:`..scheduler.Scheduler.exclusions`).  A job that
fits is bound by the backend (which may decline: the pass tries again within ``BIND_RETRY``);
every attempt of a checkpoint-resume job, its first one too, passes the pre-check
(:meth:`.inspection.Inspection.precheck`) before it is launched (:mod:`.launch`): a node failing
it is marked faulty and the job waits for the next pass; a checkpoint folder it cannot read
ends it in error.

The outcome is that of trying every queued job in queue order (each one that fits and may pass
the head starts, the others wait), at the cost of one placement per shape plus one per job started.
"""

from __future__ import annotations

import heapq
import time

from ...backends.base import Backend
from ...errors import NotFound
from ...models import Job, JobStatus
from ...modes.base import Placement
from .. import policies, policy_texts
from ..preparation import Preparation
from ..queue import QueueIndex
from ..scheduler import NodeUse, Reservation, Running, Scheduler
from ..store import Store
from .inspection import Inspection
from .journal import Journal
from .launch import Launcher
from .ledger import Ledger
from .watching import Watching

# seconds before another admission pass when the backend could not hold the nodes the scheduler
# chose (resources taken outside this service, e.g. by other users of a Ray cluster)
BIND_RETRY = 1.0


class Admission:
    """Admission passes (the module's steps) and what the jobs this service runs take."""

    def __init__(
        self,
        store: Store,
        scheduler: Scheduler,
        backend: Backend,
        queue: QueueIndex,
        ledger: Ledger,
        journal: Journal,
        preparation: Preparation,
        watching: Watching,
        inspection: Inspection,
        launcher: Launcher,
    ):
        self._store = store
        self._scheduler = scheduler
        self._backend = backend
        self._queue = queue
        self._ledger = ledger
        self._journal = journal
        self._preparation = preparation
        self._watching = watching
        self._inspection = inspection
        self._launcher = launcher
        self._pass_head: Reservation | None = None

    def usage(self, settled: bool = True) -> dict[str, NodeUse]:
        """What the jobs this service runs take of the cluster now (the scheduler's usage): the
        running jobs' placements and the nodes reserved for jobs being prepared.

        ``settled`` false: a snapshot read off the lock, which the loop holds while it launches
        a job (a submit's checks must not wait for that); a job starting meanwhile may be
        missing from it, so it serves a dry run's answer, never an admission."""
        if not settled:
            return self._scheduler.usage(self._placements())
        with self._ledger.lock:
            return self._scheduler.usage(self._placements())

    def _placements(self) -> list[Placement]:
        # each table copied in one step (list() of a dict's values), safe beside a writer
        placements = list(self._ledger.placements.values()) + self._preparation.placements()
        return placements + list(self._ledger.reading.values())  # bound while folders are read

    def running(self) -> list[Running]:
        """Every running placement with its estimated end (its start plus its duration), and the
        jobs being prepared (they start once their data is copied)."""
        return [running for _, running in self.running_jobs()]

    def running_jobs(self) -> list[tuple[Job | None, Running]]:
        """:meth:`running` with the job of each (None for a job being prepared)."""
        out: list[tuple[Job | None, Running]] = []
        for job_id, placement in self._ledger.placements.items():
            try:
                job = self._store.get(job_id)
            except NotFound:
                continue
            out.append((job, Running(placement, policies.estimated_end(job))))
        out.extend((None, running) for running in self._preparation.reserved())
        return out

    def due(self) -> bool:
        """Whether an event asked for a pass, or a job a full disk held is due for another try."""
        retry = self._ledger.admit_retry
        return self._ledger.admit_needed.is_set() or (retry is not None and time.monotonic() >= retry)

    def admit(self) -> int:
        """One admission pass, in the numbered steps of the module docstring; the number of jobs
        it started."""
        self._ledger.admit_needed.clear()  # an event during the pass asks for another one
        self._ledger.admit_retry = None  # a job still held by a full disk sets it again
        started = 0
        self._pass_head = None  # step 5: the first job that does not fit, and what it reserves
        self._count_running()
        todo = self._queue.heads()  # already in queue order: a valid heap
        while todo:
            key, shape = heapq.heappop(todo)
            outcome = self._admit_job(key[-1])
            if outcome == "blocked":
                continue  # step 4: the rest of this shape waits
            started += outcome == "started"
            after = self._queue.next_of(shape, key)
            if after is not None:
                heapq.heappush(todo, (after, shape))
        return started

    def _count_running(self) -> None:
        """Tell the queue index which jobs run now, for its users' shares (a job that
        ended since the last pass moves its user's queued jobs up); a job it does not know yet
        (running since before a restart) is read once for its creator."""
        with self._ledger.lock:
            ids = set(self._ledger.placements)
        known = self._queue.running()
        running = {job_id: known[job_id] for job_id in ids if job_id in known}
        for job_id in ids - known.keys():
            try:
                running[job_id] = self._store.get(job_id).spec.creator
            except NotFound:
                continue
        self._queue.set_running(running)

    def _admit_job(self, job_id: str) -> str:
        """Steps 2-4 for one job: ``started`` (or failed to launch, releasing what it took),
        ``blocked`` (it does not fit now) or ``skipped``."""
        with self._ledger.lock:
            if self._preparation.is_preparing(job_id) or job_id in self._ledger.reading:
                return "skipped"  # its nodes are reserved; it starts once its data is copied (read)
            try:
                job = self._store.get(job_id)  # fresh: a PATCH may have changed it since the listing
            except NotFound:
                self._queue.discard(job_id)
                return "skipped"
            if job.status is not JobStatus.queued:
                self._queue.discard(job_id)  # left the queue through another service on this store
                return "skipped"
            retry = self._ledger.retry_at.get(job.id, 0.0)
            if retry > time.monotonic():
                self._ledger.retry_admission(retry)
                return "skipped"
            return self._watching.guarded(job, self._admit_one) or "skipped"

    def _admit_one(self, job: Job) -> str:
        """Launch one queued job if it may start now: ``started``, ``blocked`` (it does not fit)
        or ``held`` (it fits, but would delay the head of the queue: step 5)."""
        use, now = self.usage(), time.time()
        head = self._pass_head
        exclude = self._scheduler.exclusions(job.id, job.spec, job.excluded_nodes)
        placement = self._scheduler.place(job.id, job.spec, use, exclude)
        if placement is None:
            if head is None:  # the first job that does not fit: it reserves what it will take
                head = self._pass_head = self._scheduler.reserve(
                    job.id, job.spec, self.running(), now, exclude
                )
                self._note_waiting(job, "head", head)
            else:
                self._note_waiting(job, "blocked", head)
            return "blocked"
        if head is not None:
            placement = self._scheduler.backfill(job.id, job.spec, use, head, now, exclude)
            if placement is None:
                self._note_waiting(job, "held", head)
                return "held"
        bound = self._backend.bind(placement, reserve=True)
        if bound is None:  # the backend cannot hold those nodes now (contract rule 15): try again soon
            self._ledger.retry_admission(time.monotonic() + BIND_RETRY)
            self._note_waiting(job, "declined", head)
            return "blocked"
        self._ledger.waiting_noted.pop(job.id, None)
        if job.spec.checkpoint_resume:
            check = self._inspection.precheck(job, bound, exclude)
            if not check.passed:
                self._backend.release(bound)
                if check.fatal:
                    self._journal.transition(job, JobStatus.error, check.reason)
                else:  # a node failed its checks and is marked now: the next pass avoids it
                    self._journal.notice(job, check.reason)
                    self._ledger.queue_changed()
                return "skipped"  # the pass goes on with its shape
        self._queue.starting(job)  # it counts for its user's share from now on (:mod:`..queue`)
        self._launcher.launch(job, bound)
        return "started"

    def _note_waiting(self, job: Job, kind: str, head: Reservation | None) -> None:
        """Say once (per kind) why a queued job waits."""
        if self._ledger.waiting_noted.get(job.id) == kind:
            return
        self._ledger.waiting_noted[job.id] = kind
        self._journal.notice(job, policy_texts.waiting_reason(kind, head))
