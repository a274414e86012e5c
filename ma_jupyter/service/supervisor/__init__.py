"""The supervisor: every job's life after submission.

One loop thread (woken at once by a submission, a stop request, a change of the queue or a
node's end pushed by the backend, otherwise every ``POLL_INTERVAL``, or every ``poll_every`` of
a backend that polls less often, at most ``TICK_MAX``) does two things:

* **watch running jobs**, on every tick: poll their nodes through the backend; any node failing
  (non-zero exit, or lost) fails the job, every primary node succeeding finishes it (non-primary
  nodes such as parameter servers are then stopped); a pending stop request, or running past the
  duration, ends it as ``stopped`` / ``expired``.  Fault restart and checkpoint resume put a
  failed job back in the queue for another attempt.
* **admit queued jobs**, only after an event that can change what starts: a job entering the
  queue (submitted, or put back for another attempt), resources freed (an attempt wound down,
  a launch that failed), a priority change, a queued job stopped or deleted, the service
  starting.  A tick without such an event costs nothing per queued job.

Admission works on the queue index (:mod:`.queue`), the queued jobs in memory in queue order,
rebuilt from the store when the supervisor is made.  A pass (:meth:`Supervisor.admit`):

1. walks the jobs in queue order, one shape at a time (:meth:`.scheduler.Scheduler.shape`):
   it starts from the first job of every shape and always takes the earliest job still to try;
2. reads that job fresh from the store (skipping it if it left the queue meanwhile, or waits to
   retry after a full disk) and asks the scheduler to place it;
3. launches it if it fits, and goes on with the next job of its shape;
4. if it does not fit, notes once on the job that it waits, and tries no other job of its shape
   in this pass: the pass only adds to what is in use, so none of them would fit either (what
   an attempt winding down frees meanwhile asks for another pass), while jobs of other shapes
   behind it may still start (backfill);
5. the first job that does not fit is the *head*: it reserves the nodes it will take once
   enough running jobs end (:meth:`.scheduler.Scheduler.reserve`, from their durations), and
   every later job starts only if it cannot delay it (:meth:`.scheduler.Scheduler.backfill`:
   it fits beside the reservation, or its duration ends it before the head's estimated start).
   A job that fits but is held for the head does not stop its shape's walk (durations differ).

Every ``HEALTH_EVERY`` seconds the loop also inspects nodes (:mod:`.health`): a running node
whose runner stopped beating, or a real card of a running node that failed (its device node
gone, NVML reporting it lost: :meth:`Backend.card_fault`, said in the events of the jobs holding
cards there), marks its inventory node faulty, and an elastic job running on
fewer nodes than asked is scaled up when they are free (:func:`.policies.on_scale_up`).  A job
on a drained or faulty node is moved away by the watch (:func:`.policies.on_unhealthy`), and a
checkpoint-resume attempt after the first passes a pre-check before it is launched
(:meth:`Supervisor._precheck`).

A thread of its own keeps the jobs folder's disk reserve (:mod:`.policies`, "across running
jobs"): once a second it looks at the disk's free space and, when it is nearly full, ends the
job writing the most there (:meth:`Supervisor._watch_reserve`).

The outcome is that of trying every queued job in queue order (each one that fits and may pass
the head starts, the others wait), at the cost of one placement per shape plus one per job started.

Every decision is derived from durable state (the store, the node exit-code files, pids with
their start times), so a service killed with ``kill -9`` and started again re-attaches to the
jobs that kept running and finishes their bookkeeping.  Stopping nodes takes up to the grace
period, so it runs on its own thread per job and never stalls the loop.

The decisions themselves (and the order of the checks) are the pure functions of
:mod:`.policies`; this module gathers the facts they take, under its lock, and carries out what
they return: store writes, backend calls, threads.
"""

from __future__ import annotations

import heapq
import logging
import os
import secrets
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from .. import config
from ..backends.base import Attempt, Backend
from ..commands import parse_command
from ..errors import BackendUnavailable, Conflict, DiskFull, InvalidSpec, NodeLost, NotFound, RefusedFile
from ..jobdir import PLACEHOLDER
from ..models import (
    SECRET_MASK,
    CacheInfo,
    Event,
    Job,
    JobSpec,
    JobStatus,
    Mode,
    NodeLaunch,
    NodeRun,
    Plan,
    PreparedData,
    Priority,
    utcnow,
)
from ..modes import plan_job, single_copy
from ..modes.base import Placement, TaskSlot
from . import distributed_check, policies
from .disk import FULL_BELOW, SUBMIT_BELOW, disk_use, free_bytes, full_folder
from .guard import disk_full_message
from .health import NodeHealth
from .logs import tail
from .policies import End
from .prepared import Acquired, PreparedStore
from .queue import QueueIndex
from .resources import ResourceSampler
from .scheduler import NodeUse, Reservation, Running, Scheduler
from .store import Store

log = logging.getLogger("ma_jupyter.supervisor")

# How often running jobs are polled when nothing woke the loop: on the local backend a node that
# ended by itself is noticed within it.  Everything else (a submit, a stop, a change of the queue) wakes the loop.
# A backend that pushes its nodes' ends and polls less often (Ray) slows the pace, to at most
# TICK_MAX: ticking faster would re-read every running job for nothing, CPU taken from the
# jobs, while expiry, grace periods and retries are still checked at every tick.
POLL_INTERVAL = 0.1
TICK_MAX = 1.0
TAIL_LINES = 15
DISK_CHECK_EVERY = 1.0  # seconds between looks at the free space of a running job's folders
#: seconds before a job whose data could not be copied for lack of space is prepared again
PREPARE_SPACE_RETRY = 10.0
RECORD_RETRY = 2.0  # seconds before retrying to record the end of a job after the disk was full
# seconds before another admission pass when the backend could not hold the nodes the scheduler
# chose (resources taken outside this service, e.g. by other users of a Ray cluster)
BIND_RETRY = 1.0
PREPARED_SWEEP_EVERY = 30.0  # seconds between sweeps of prepared data past its retention
HEALTH_EVERY = 1.0  # seconds between two node inspections (heartbeats, elastic scale-up)


@dataclass(frozen=True)
class _Preparing:
    """A queued job whose data is being copied: its reserved nodes, and what cancels the copy."""

    placement: Placement
    spec: JobSpec
    cancel: threading.Event


def new_job_id(name: str) -> str:
    """A short readable id: the name's start plus random hex."""
    stem = "".join(c if c.isalnum() or c in "-_" else "-" for c in name.lower())[:24].strip("-_") or "job"
    return f"{stem}-{secrets.token_hex(3)}"


def _refuse_masked_secrets(spec: JobSpec) -> None:
    """A secret whose value is the mask came from a copied job, which never carries its secrets.

    Raises:
        InvalidSpec: naming ``secret_env`` and what to do.
    """
    if any(value == SECRET_MASK for value in spec.secret_env.values()):
        raise InvalidSpec(
            f"secret_env: a value is {SECRET_MASK}, the mask a job shows for its secrets: give the "
            "secret's value again (a copied job does not carry its secrets)",
            field="secret_env",
        )


class Supervisor:
    """Owns job state transitions; the REST app calls it, and it calls the backend."""

    def __init__(self, store: Store, scheduler: Scheduler, backend: Backend):
        self.store = store
        self.scheduler = scheduler
        self.backend = backend
        self._placements: dict[str, Placement] = {}
        self._finishing: set[str] = set()
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None
        self._waiting_noted: dict[str, str] = {}  # job id -> why it waits, as last said
        self._pass_head: Reservation | None = None
        self.on_job_deleted = []  # callbacks(job_id), e.g. stop the job's TensorBoard
        self._perf_offsets: dict[tuple[str, int, str], int] = {}
        self._perf_alerted: set[tuple[str, int, str]] = set()
        self._disk_checked: dict[str, float] = {}  # job id -> monotonic time of the last look
        # job id -> why it must end, kept while the store cannot record it (its disk is full)
        self._pending_end: dict[str, str] = {}
        self._retry_at: dict[str, float] = {}
        self._reserve_checked = 0.0
        # the disk reserve (policies, "across running jobs"): when it was last looked at, and what
        # each running job held on the jobs folder's disk then (only while it is nearly full)
        self._reserve_watched = 0.0
        self._held: dict[str, int] = {}
        # polls of running nodes: when each job was last polled, and whether a backend's push of
        # a node's end asks this tick to poll every job (Backend rule 6, poll_every)
        self._polled_at: dict[str, float] = {}
        self._end_hinted = threading.Event()
        self._poll_all = True
        # The queued jobs in queue order (the store's, read once here: a restart loses none).
        self.queue = QueueIndex(scheduler.shape)
        self.queue.load(store.by_status(JobStatus.queued))
        self._admit_needed = threading.Event()  # set by what may let a queued job start
        self._admit_needed.set()
        self._admit_retry: float | None = None  # monotonic time to retry a job a full disk held
        self._inventory = backend.inventory()  # a change (a node joined or left) asks for a pass
        self.prepared = PreparedStore()  # data preparation's copies, shared between jobs
        # queued jobs whose data is being prepared on a thread, their nodes reserved meanwhile
        self._preparing: dict[str, _Preparing] = {}
        self._swept = 0.0  # monotonic time of the last sweep of expired prepared data
        # drained and faulty nodes; the scheduler places nothing new on them
        self.health = NodeHealth(config.home() / "node_health.json")
        scheduler.unusable = self.health.statuses
        self._health_noted: set[tuple[str, int, str]] = set()  # (job, attempt, node) said to stay
        self._inspected = 0.0
        self._inspected_wall = 0.0  # time.time() of the last inspection (counts a suspend)
        self._shrunk_since: dict[str, float] = {}  # elastic job id -> monotonic start shrunk
        self.resources = ResourceSampler(store, backend)  # its own thread: never slows a tick

    # -------------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Re-attach to jobs left running by a previous service, then run the loop."""
        self.backend.on_node_end(self._node_ended)  # a node's end is handled at once, not next tick
        self.backend.on_notice(self._backend_notice)
        self.recover()
        # folders of deleted jobs a previous service had not finished removing
        for doomed in config.jobs_root().glob(".deleted-*"):
            threading.Thread(
                target=shutil.rmtree, args=(doomed,), kwargs={"ignore_errors": True}, daemon=True
            ).start()
        self._thread = threading.Thread(target=self._loop, name="ma-supervisor", daemon=True)
        self._thread.start()
        self.resources.start()
        # its own thread: measuring what jobs hold on a nearly full disk may take a while, and
        # must never slow a tick
        threading.Thread(target=self._reserve_loop, name="ma-disk-reserve", daemon=True).start()

    def shutdown(self) -> None:
        """Stop the loop; running jobs keep running (they do not depend on the service)."""
        self._halt.set()
        self._wake.set()
        for prep in list(self._preparing.values()):
            prep.cancel.set()  # no copy goes on without its service (the sweep removes it)
        self.resources.stop()
        if self._thread:
            self._thread.join(timeout=5)
        self.backend.close()

    def _node_ended(self) -> None:
        """The backend's hint that a node may have ended: poll every running node now."""
        self._end_hinted.set()
        self._wake.set()

    def _loop(self) -> None:
        while not self._halt.is_set():
            self._wake.wait(min(max(POLL_INTERVAL, self.backend.poll_every), TICK_MAX))
            self._wake.clear()
            try:
                self.tick()
            except Exception:  # a bug in one tick must not end supervision of every job
                log.exception("supervisor tick failed")
            if time.monotonic() - self._swept >= PREPARED_SWEEP_EVERY:
                self.sweep_prepared()

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Wait until no attempt is being wound down (every finishing thread has recorded its
        job's end); True if so within ``timeout`` seconds.  For tests and orderly shutdowns."""
        deadline = time.monotonic() + timeout
        while self._finishing:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True

    def recover(self) -> None:
        """Take over from a previous service: re-attach to running jobs, and clean up a launch it
        was in the middle of (placement stored, job not yet recorded as running).

        :meth:`start` calls it; a test may call it on a supervisor whose loop it drives itself.
        """
        for job in self.store.placed(JobStatus.queued):  # only these can need a clean-up
            data = self.store.placement(job.id)
            if policies.recovery(job, data is not None) != "stop_partial_launch":
                continue
            placement = Placement.from_json(data)
            attempt = self._attempt(job, placement)
            # Those nodes may have started without the job being marked running: stop them (by
            # their markers) so the job starts once, cleanly, when it is admitted again.
            self.backend.stop(attempt, [NodeRun(name=p.name) for p in attempt.plans], 1.0)
            self.backend.release(placement)  # what bind reserved (the Ray backend: a placement group)
            self.store.set_placement(job.id, None)
            self._notice(
                job,
                "the service stopped while launching this job; its partly started nodes were "
                "stopped and it waits in the queue to start again",
            )
        for job in self.store.by_status(JobStatus.running):
            data = self.store.placement(job.id)
            if policies.recovery(job, data is not None) != "reattach":
                continue
            placement = Placement.from_json(data)
            self._placements[job.id] = placement
            self.backend.hold(placement)
            resume = job.spec.checkpoint_resume
            if resume and resume.elastic_min_nodes and policies.workers(placement.tasks) < job.spec.nodes:
                self._shrunk_since[job.id] = time.monotonic()  # the interval counts from now
            attempt = self._attempt(job, placement)
            alive = [r.name for r in job.nodes if self.backend.poll(attempt, r).state == "running"]
            self._notice(
                job,
                f"service restarted: re-attached to {len(alive)} running node(s) {', '.join(alive)}".rstrip(),
            )
        self._queue_changed()

    # ------------------------------------------------------------------- requests

    def submit(
        self,
        spec: JobSpec,
        creator: str | None,
        idempotency_key: str | None = None,
        admit: Callable[[], None] | None = None,
    ) -> Job:
        """Validate against the cluster and queue the job; nothing is created if it is refused.

        Args:
            spec: the job.
            creator: the submitting user.
            idempotency_key: the client's key for this submission; a submit repeating a key this
                user already used returns the job the first one created (a retry never
                duplicates a job).
            admit: the caller's own check of a new job (e.g. a quota), called after the
                idempotency lookup (a retry is never refused by it) and before validation;
                it raises to refuse.

        Raises:
            InvalidSpec: the spec does not fit the cluster or its paths are wrong.
            DiskFull: the folder the job's files go to has no space left (HTTP 507).
        """
        spec = spec.model_copy(update={"creator": creator or spec.creator})
        # the secret values go to their own table; the job (and all that shows it) has ***
        secrets = dict(spec.secret_env)
        _refuse_masked_secrets(spec)
        spec = spec.masked()
        key = f"{creator or ''}\0{idempotency_key}" if idempotency_key else None
        if key is not None:
            earlier = self.store.job_for_key(key)
            if earlier is not None:
                return self.store.get(earlier)
        if admit is not None:
            admit()
        self._validate(spec)
        full = full_folder([config.jobs_root()], below=SUBMIT_BELOW)
        if full is not None:
            log.warning("refused a submit: %s", disk_full_message(full))
            raise DiskFull(disk_full_message(full, "free space there before submitting jobs"))
        warning = self._single_copy_warning(spec)  # reads the job's code: before the lock
        # Under the lock, as every change of the queue: a stop of this job cannot come between
        # its row and its place in the queue index.
        with self._lock:
            ahead = self.queue.ahead(spec.priority)
            stored = None
            while stored is None:  # a random id already taken (likely among thousands of one name)
                job_id = new_job_id(spec.name)
                job = Job(
                    id=job_id,
                    spec=spec,
                    status=JobStatus.queued,
                    backend=self.backend.name,
                    outputs_folder=spec.outputs or str(config.jobdir(job_id).outputs),
                )
                stored = self.store.insert(
                    job,
                    Event(
                        job_id=job.id,
                        status=JobStatus.queued,
                        reason=f"submitted; {ahead} job(s) ahead in the queue",
                    ),
                    idempotency_key=key,
                    secrets=secrets,
                    notices=[Event(job_id=job.id, status=JobStatus.queued, reason=warning)]
                    if warning
                    else [],
                )
            if stored != job.id:
                return self.store.get(stored)  # a concurrent retry with the same key won
            self.queue.put(job)
        self._queue_changed()
        return job

    def _validate(self, spec: JobSpec) -> None:
        self._preflight(spec)

    def _preflight(self, spec: JobSpec) -> tuple[Placement | None, Placement, list[NodeLaunch]]:
        """Check a spec as its launch would: place it (now, or on an empty cluster), plan it and
        dry-run it on the backend with the placeholder job folder.

        Returns:
            The placement now (None: it must wait), the placement planned, and the launches.

        Raises:
            InvalidSpec: the first problem found.
        """
        self.scheduler.check(spec)
        if spec.type.value != "batch":
            parse_command(spec.command or "")
        now = self._place("dry-run", spec, self.usage())
        placement = now or self._any_placement(spec)
        # a mode or a backend that cannot run this job refuses it now, not at launch
        attempt = self._attempt(Job(id="<job-id>", spec=spec), placement, dry=True)
        return now, placement, self.backend.dryrun(attempt)

    def _place(self, job_id: str, spec: JobSpec, use: dict[str, NodeUse]) -> Placement | None:
        """Where the job's tasks would go (the scheduler), bound by the backend without reserving
        anything (a dry run); None if it does not fit."""
        placement = self.scheduler.place(job_id, spec, use)
        return None if placement is None else self.backend.bind(placement, reserve=False)

    def _any_placement(self, spec: JobSpec) -> Placement:
        """A placement on an empty cluster (for planning a job that must wait)."""
        # drained and faulty nodes count: they are only out for now
        placement = self.scheduler.place_anywhere("dry-run", spec)
        placement = placement and self.backend.bind(placement, reserve=False)
        if placement is None:
            raise InvalidSpec("this job cannot be placed on this cluster", field="specs")
        return placement

    def plan(self, spec: JobSpec) -> Plan:
        """What each node of the job would run (``--dry-run``): the launches the backend would
        start, on the placeholder job folder; creates nothing.  Secret values show as ``***``."""
        _refuse_masked_secrets(spec)  # as the submit would: a form shows it as you type
        _, placement, launches = self._preflight(spec.masked())
        ahead = self.queue.ahead(spec.priority)
        can_start, start = self._predict(spec)
        notes = ["ports are allocated at launch (0 in this plan)"]
        warning = self._single_copy_warning(spec)
        if warning:
            notes.append(warning)
        return Plan(
            spec=placement.spec.name,
            nodes=launches,
            can_start_now=can_start,
            queue_ahead=ahead,
            estimated_start=None if start is None else datetime.fromtimestamp(start, UTC),
            notes=notes,
        )

    def _predict(self, spec: JobSpec) -> tuple[bool, float | None]:
        """Whether a job submitted now would start at once, and its estimated start (epoch
        seconds; None: unknown), by the admission pass's own rules (step 5): it passes the
        queue's first job only if it cannot delay it."""
        with self._lock:
            use, running, now = self.usage(), self._running(), time.time()
            head = None
            if self.queue.ahead(spec.priority):
                first = self.queue.first()
                try:
                    head_job = self.store.get(first) if first else None
                except NotFound:
                    head_job = None
                if head_job is not None:
                    head = self.scheduler.reserve(head_job.id, head_job.spec, running, now)
            if head is None:  # it would be first in the queue (or the first can never start)
                if self.scheduler.place("dry-run", spec, use) is not None:
                    return True, now
                own = self.scheduler.reserve("dry-run", spec, running, now)
                return False, None if own is None or own.start == float("inf") else own.start
            if self.scheduler.backfill("dry-run", spec, use, head, now) is not None:
                return True, now
            if head.start == float("inf"):
                return False, None
            # it waits for the head: it starts beside it, or once enough jobs (the head too) end
            head_end = head.start + head_job.spec.duration if head_job.spec.duration else None
            own = self.scheduler.reserve(
                "dry-run", spec, [*running, Running(head.placement, head_end)], head.start
            )
            return False, None if own is None or own.start == float("inf") else own.start

    def _single_copy_warning(self, spec: JobSpec) -> str | None:
        """The warning that each node would run its own copy of a single-process script
        (:mod:`ma_jupyter.modes.single_copy`); advice only, so a failure to judge says nothing."""
        if not single_copy.applies(spec):
            return None
        try:
            return single_copy.warning(spec, self.backend.code_sources(spec))
        except Exception:  # never refuse or fail a job over advice
            log.exception("judging whether job %r is distributed failed", spec.name)
            return None

    def request_stop(self, job_id: str, by: str | None = None) -> Job:
        """Stop a job: a queued one at once, a running one after its grace period.  ``by``: the
        user asking, named in the job's events."""
        with self._lock:
            job = self.store.get(job_id)
            action = policies.stop_action(job, self.store.desired(job_id))
            if action == "now":
                return self._transition(
                    job, JobStatus.stopped, f"stopped by {by or 'user'} while queued", by=by
                )
            if action == "request":
                self.store.set_desired(job_id, "stop")
                self._notice(job, f"stop requested by {by or 'a user'}", by=by)
                self._wake.set()
            return job

    def delete(self, job_id: str, force: bool = False, by: str | None = None) -> bool:
        """Delete a finished job and its files; ``force`` stops a live one first.

        Never waits for a job to stop: a running job is marked to be deleted, and the supervisor
        deletes it once its nodes have stopped (after at most its grace period).

        Returns:
            True when the job is deleted now; False when it will be once it has stopped.

        Raises:
            Conflict: the job is live and ``force`` is false.
        """
        with self._lock:
            job = self.store.get(job_id)
            action = policies.delete_action(job, force)
            if action == "refuse":
                raise Conflict(f"job {job_id} is {job.status.value}: stop it first, or delete with force")
            if action == "mark":
                self.store.set_desired(job_id, "delete")
                self._notice(job, f"delete requested by {by or 'a user'}", by=by)
                self._wake.set()
                return False
            if action == "stop_then_remove":
                self._transition(
                    job, JobStatus.stopped, f"stopped by {by or 'user'} while queued, to delete it", by=by
                )
        self._remove(job_id)
        return True

    def _remove(self, job_id: str) -> None:
        """Forget a terminal job: its callbacks, its rows, its folder (moved aside at once, removed
        on a thread: a big folder takes a while)."""
        for callback in self.on_job_deleted:
            callback(job_id)
        self.store.delete(job_id)
        self.queue.discard(job_id)
        self.backend.forget(job_id)  # what it keeps elsewhere (a Ray node's job folder)
        folder = config.jobdir(job_id).root
        doomed = config.jobdir(job_id).doomed()
        try:
            os.rename(folder, doomed)
        except OSError:
            doomed = folder
        threading.Thread(
            target=shutil.rmtree, args=(doomed,), kwargs={"ignore_errors": True}, daemon=True
        ).start()

    def fail_job(self, job_id: str, reason: str) -> None:
        """End a live job in error because of what it did (e.g. a file the service refuses to read);
        nothing happens to a job that is already ending or ended."""
        with self._lock:
            job = self.store.get(job_id)
            placement = self._placements.get(job.id)
            action = policies.on_refused_file(job, job.id in self._finishing, placement is not None)
            if action == "none":
                return
            log.warning("job %s: %s", job_id, reason)
            if action == "finish":
                attempt = self._attempt(job, placement)
                self._finish(job, attempt, End(JobStatus.error, reason, policies.WIND_DOWN_GRACE))
            elif action == "error":
                self._transition(job, JobStatus.error, reason)

    def clear_cache(self, user: str) -> CacheInfo:
        """Empty ``user``'s persistent cache (the backend's), refused while a job of theirs runs;
        what it held (measured before, outside the lock: a cache may hold many files).

        Checked and done under the lock, so no job of the user is launched in between (one
        launched after gets an empty cache).

        Raises:
            Conflict: a job of ``user`` is running (it may be writing to the cache).
            InvalidSpec: the backend keeps no caches.
        """
        held = self.backend.caches(user)
        with self._lock:
            running = [j for j in self.store.by_status(JobStatus.running) if j.spec.creator == user]
            if running:
                names = ", ".join(j.id for j in running[:3]) + (" ..." if len(running) > 3 else "")
                raise Conflict(
                    f"{len(running)} job(s) of {user} are running and may be using the cache ({names}): "
                    "clear it once they have ended (or stop them first: ma-jupyter stop JOB)"
                )
            self.backend.clear_cache(user)
        return held[0] if held else CacheInfo(user=user, path="", bytes=0, files=0)

    def update(
        self,
        job_id: str,
        priority: Priority | None = None,
        duration: float | None = None,
        by: str | None = None,
    ) -> Job:
        """Change a queued job's priority or a running job's duration (without restarting it);
        ``by``: the user asking, named in the event."""
        with self._lock:
            job = self.store.get(job_id)
            spec, changes = policies.updated_spec(job, priority, duration)
            job = job.model_copy(update={"spec": spec})
            reason = "; ".join(changes) + (f" by {by}" if by else "")
            self.store.save(job, Event(job_id=job_id, status=job.status, reason=reason, by=by))
            if priority is not None:  # only a queued job's priority changes: it moves in the queue
                self.queue.put(job)
                self._queue_changed()
            self._wake.set()
            return job

    def queue_position(self, job_id: str) -> int | None:
        """How many queued jobs the scheduler considers before this one; None if it is not queued."""
        return self.queue.position(job_id)

    #: a queued job further back than this gets no estimate (each job ahead costs a reservation)
    ESTIMATE_DEPTH = 50

    def estimated_start(self, job_id: str) -> datetime | None:
        """When a queued job should start if the jobs ahead of it start in queue order and every
        job ends at its duration; None: not queued, too far back (:attr:`ESTIMATE_DEPTH`), or a
        job it waits for has no duration (or can never be placed).

        Each job ahead, in queue order, is given its own reservation (``Scheduler.reserve``) and
        then counts as running from that start to its start plus its duration; the job's own
        reservation on top of them is the estimate.  Backfill can only make a job start sooner.
        """
        # what the estimate reads is taken under the lock; the reservations (inventory reads,
        # a Ray call on the Ray backend) run outside it, so admission passes never wait on them
        with self._lock:
            ids = self.queue.ids()
            if job_id not in ids or ids.index(job_id) >= self.ESTIMATE_DEPTH:
                return None
            running, now = self._running(), time.time()
        for ahead_id in ids[: ids.index(job_id) + 1]:
            try:
                job = self.store.get(ahead_id)
            except NotFound:
                continue  # it left the queue meanwhile
            reservation = self.scheduler.reserve(job.id, job.spec, running, now)
            if reservation is None or reservation.start == float("inf"):
                return None
            if job.id == job_id:
                return datetime.fromtimestamp(reservation.start, UTC)
            end = reservation.start + job.spec.duration if job.spec.duration else None
            running.append(Running(reservation.placement, end))
        return None

    def _queue_changed(self) -> None:
        """Something happened that may let a queued job start: run an admission pass soon."""
        self._admit_needed.set()
        self._wake.set()

    # ---------------------------------------------------------------------- the loop

    def tick(self) -> None:
        """One pass: watch running jobs, then admit queued ones if an event asked for it (or a
        job a full disk held is due for another try).

        Each job is handled on a fresh read under the lock (a stop, an update or a finishing
        thread may have changed it since the listing), and a failure while handling one job is
        recorded on that job instead of stalling every other one.
        """
        if time.monotonic() >= self._reserve_checked + 10.0:
            self._reserve_checked = time.monotonic()
            self.store.keep_reserve()  # given up when the disk filled; back once there is room
        if time.monotonic() >= self._inspected + HEALTH_EVERY:
            # A service that was itself frozen or suspended for a while (its last inspection
            # long ago by the wall clock) sees every heartbeat as old: it judges none this time.
            wall = time.time()
            timeout = self.scheduler.cluster.limits.heartbeat_timeout
            judge = wall - self._inspected_wall < timeout / 2
            self._inspected, self._inspected_wall = time.monotonic(), wall
            self._inspect(judge)
        inventory = self.backend.inventory()
        if inventory is not self._inventory:  # a node joined or left: queued jobs may fit now
            self._inventory = inventory
            self._admit_needed.set()
        # a node's end was pushed (poll every running node now), or only those whose last poll
        # is older than the backend's poll_every
        self._poll_all = self._end_hinted.is_set()
        self._end_hinted.clear()
        for listed in self.store.by_status(JobStatus.running):
            with self._lock:
                if listed.id in self._finishing:
                    continue
                if self._retry_at.get(listed.id, 0.0) > time.monotonic():
                    continue  # its end could not be recorded (full disk): do not retry in a busy loop
                self._guarded(listed, self._watch)  # which reads the job fresh, under the lock
        retry = self._admit_retry
        if self._admit_needed.is_set() or (retry is not None and time.monotonic() >= retry):
            self.admit()

    def _guarded(self, job: Job, step):
        """Run one supervision step for a job and return what it returns; an unexpected error
        fails that job, with the reason (and gives None)."""
        try:
            return step(job)
        except DiskFull as exc:
            # Nothing can be recorded now: try again a little later, when the disk check of the
            # job's folders names what is full (the store's own folder is not the job's story).
            log.warning("job %s: %s", job.id, exc.message)
            self._retry_at[job.id] = time.monotonic() + RECORD_RETRY
            if job.status is JobStatus.queued:  # no event will come: admission tries it again then
                self._admit_retry = min(self._admit_retry or float("inf"), self._retry_at[job.id])
        except Exception as exc:
            log.exception("supervising job %s failed", job.id)
            message = exc.message if hasattr(exc, "message") else f"{type(exc).__name__}: {exc}"
            current = self.store.get(job.id)
            placement = self._placements.get(job.id)
            action = policies.on_supervise_error(current, job.id in self._finishing, placement is not None)
            reason = f"the service could not supervise this job: {message}"
            if action == "finish":
                attempt = self._attempt(current, placement)
                self._finish(current, attempt, End(JobStatus.error, reason, current.spec.grace_period))
            elif action == "error":
                self._transition(current, JobStatus.error, reason)
        return None

    def usage(self):
        """What the jobs this service runs take of the cluster now (the scheduler's usage)."""
        with self._lock:
            preparing = [p.placement for p in self._preparing.values()]
            return self.scheduler.usage(list(self._placements.values()) + preparing)

    def admit(self) -> int:
        """One admission pass, in the numbered steps of the module docstring; the number of jobs
        it started.  The loop runs it after an event; a test may call it (or :meth:`tick`)."""
        self._admit_needed.clear()  # an event during the pass asks for another one
        self._admit_retry = None  # a job still held by a full disk sets it again
        started = 0
        self._pass_head = None  # step 5: the first job that does not fit, and what it reserves
        todo = self.queue.heads()  # already in queue order: a valid heap
        while todo:
            key, shape = heapq.heappop(todo)
            outcome = self._admit_job(key[2])
            if outcome == "blocked":
                continue  # step 4: the rest of this shape waits
            started += outcome == "started"
            after = self.queue.next_of(shape, key)
            if after is not None:
                heapq.heappush(todo, (after, shape))
        return started

    def _admit_job(self, job_id: str) -> str:
        """Steps 2-4 for one job: ``started`` (or failed to launch, releasing what it took),
        ``blocked`` (it does not fit now) or ``skipped``."""
        with self._lock:
            if job_id in self._preparing:
                return "skipped"  # its nodes are reserved; it starts once its data is copied
            try:
                job = self.store.get(job_id)  # fresh: a PATCH may have changed it since the listing
            except NotFound:
                self.queue.discard(job_id)
                return "skipped"
            if job.status is not JobStatus.queued:
                self.queue.discard(job_id)  # left the queue through another service on this store
                return "skipped"
            retry = self._retry_at.get(job.id, 0.0)
            if retry > time.monotonic():
                self._admit_retry = min(self._admit_retry or float("inf"), retry)
                return "skipped"
            return self._guarded(job, self._admit_one) or "skipped"

    def _admit_one(self, job: Job) -> str:
        """Launch one queued job if it may start now: ``started``, ``blocked`` (it does not fit)
        or ``held`` (it fits, but would delay the head of the queue: step 5)."""
        use, now = self.usage(), time.time()
        head = self._pass_head
        placement = self.scheduler.place(job.id, job.spec, use)
        if placement is None:
            if head is None:  # the first job that does not fit: it reserves what it will take
                head = self._pass_head = self.scheduler.reserve(job.id, job.spec, self._running(), now)
                self._note_waiting(job, "head", head)
            else:
                self._note_waiting(job, "blocked", head)
            return "blocked"
        if head is not None:
            placement = self.scheduler.backfill(job.id, job.spec, use, head, now)
            if placement is None:
                self._note_waiting(job, "held", head)
                return "held"
        bound = self.backend.bind(placement, reserve=True)
        if (
            bound is None
        ):  # the backend cannot hold those nodes now (rule 8 of backends/base.py): try again soon
            self._admit_retry = min(self._admit_retry or float("inf"), time.monotonic() + BIND_RETRY)
            self._note_waiting(job, "declined", head)
            return "blocked"
        self._waiting_noted.pop(job.id, None)
        if job.spec.checkpoint_resume and job.attempt:
            failed = self._precheck(job, bound)
            if failed is not None:
                self.backend.release(bound)
                self._transition(job, JobStatus.error, failed)
                return "skipped"  # it left the queue: the pass goes on with its shape
        self._launch(job, bound)
        return "started"

    def _running(self) -> list[Running]:
        """Every running placement with its estimated end (its start plus its duration)."""
        out = []
        for job_id, placement in self._placements.items():
            try:
                job = self.store.get(job_id)
            except NotFound:
                continue
            out.append(Running(placement, policies.estimated_end(job)))
        for prep in self._preparing.values():  # they start once their data is copied
            out.append(
                Running(prep.placement, time.time() + prep.spec.duration if prep.spec.duration else None)
            )
        return out

    def _note_waiting(self, job: Job, kind: str, head: Reservation | None) -> None:
        """Say once (per kind) why a queued job waits."""
        if self._waiting_noted.get(job.id) == kind:
            return
        self._waiting_noted[job.id] = kind
        self._notice(job, policies.waiting_reason(kind, head))

    def _attempt(self, job: Job, placement: Placement, *, dry: bool = False) -> Attempt:
        """The attempt to launch (``dry``: to dry-run, in the placeholder job folder, with the
        datasets as given rather than their prepared copies)."""
        spec = job.spec if dry else self._effective_spec(job)
        plans = plan_job(spec, placement)
        if spec.type.value == "batch" and job.attempt:
            # a restarted batch job runs again only the tasks that did not succeed
            done = {r.name for r in job.nodes if r.state == "exited" and r.exit_code == 0}
            plans = [p for p in plans if p.name not in done]
        for node in plans:
            # A resumed or restarted attempt tells the training code so it can load its checkpoint.
            node.env.update(policies.attempt_env(job))
        return Attempt(
            job_id=job.id,
            spec=spec,
            number=job.attempt,
            job_dir=(PLACEHOLDER if dry else config.jobdir(job.id)).root,
            plans=tuple(plans),
        )

    @staticmethod
    def _prepared_path(job_id: str, dataset) -> Path:
        """Where data preparation keeps its copy of one dataset of a job."""
        version = dataset.version or ""
        return config.jobdir(job_id).prepared_dataset(dataset.source.value, dataset.name, version)

    def _effective_spec(self, job: Job) -> JobSpec:
        """The spec the nodes run with: the secret values in, prepared datasets for the originals.

        The model only allows data preparation when every dataset is read-only.
        """
        spec = job.spec
        if spec.secret_env:  # the values, read at launch only (the stored spec has ***)
            spec = spec.model_copy(update={"secret_env": self.store.secrets(job.id)})
        if not spec.data_preparation:
            return spec
        datasets = [d.model_copy(update={"path": str(self._prepared_path(job.id, d))}) for d in spec.datasets]
        return spec.model_copy(update={"datasets": datasets})

    def _start_preparing(self, job: Job, placement: Placement) -> None:
        """Step one of a data-preparation job's launch, under the lock: check the job's own
        mount rules on its sources (the dry run of its spec as given: a copy shared with other
        jobs is handed only to a job that may mount its source), then reserve its nodes and
        copy on a thread of its own (:meth:`_prepare_then_launch`).

        The job stays queued meanwhile (admission passes it by, its nodes count as used), so
        no submit, stop or request waits for a copy; a stop or delete cancels the copy.
        Raises what the dry run raises (the caller fails the launch).
        """
        self.backend.dryrun(self._attempt(job, placement, dry=True))
        names = ", ".join(d.name for d in job.spec.datasets)
        self._notice(job, f"preparing data ({names}): it starts once the data is copied")
        prep = _Preparing(placement, job.spec, threading.Event())
        self._preparing[job.id] = prep
        threading.Thread(
            target=self._prepare_then_launch, args=(job.id, prep), name=f"ma-prepare-{job.id}", daemon=True
        ).start()

    def _prepare_then_launch(self, job_id: str, prep: _Preparing) -> None:
        """Step two, on its own thread: give each dataset its copy from the store
        (:mod:`.prepared`, reused when the source has not changed since a job last copied it),
        outside the lock; then, under it, launch the job if it is still queued, or free what it
        reserved (it was stopped or deleted meanwhile), or fail it with what the copy refused.

        A copy that met a full disk holds the job in the queue like any launch on a full disk
        (admission tries it again later); whatever else goes wrong here frees the reserved
        nodes, since this thread is the only one that still knows of them."""
        got: list[tuple[str, Path, Acquired]] = []
        error: Exception | None = None
        try:
            for d in prep.spec.datasets:
                acquired = self.prepared.acquire(
                    job_id, d.path, prep.spec.creator, self.backend, prep.cancel, self._room_for_copy
                )
                got.append((d.name, self._prepared_path(job_id, d), acquired))
        except Exception as exc:
            error = exc
        with self._lock:
            self._preparing.pop(job_id, None)
            handed = False  # whether the placement went to a step that releases it itself
            try:
                try:
                    job = self.store.get(job_id)
                except NotFound:
                    job = None
                if job is None or job.status is not JobStatus.queued or prep.cancel.is_set():
                    self.prepared.release(job_id)
                    return
                handed = True
                if error is not None:
                    prefix = f"dataset {prep.spec.datasets[len(got)].name}: "
                    # which releases the placement first; DiskFull (a full disk) goes to _guarded
                    self._guarded(
                        job, lambda current: self._launch_failed(current, prep.placement, error, prefix)
                    )
                    if policies.is_disk_full(error) and job_id in self._retry_at:
                        # a look at the whole dataset each time: not every few seconds
                        self._retry_at[job_id] = time.monotonic() + PREPARE_SPACE_RETRY
                        self._admit_retry = min(self._admit_retry or float("inf"), self._retry_at[job_id])
                    return
                self._guarded(job, lambda current: self._launch(current, prep.placement, prepared=got))
            except Exception:  # the store could not be read: admission tries the job again later
                log.exception("job %s: ending its data preparation failed", job_id)
                self._retry_at[job_id] = time.monotonic() + RECORD_RETRY
                self._admit_retry = min(self._admit_retry or float("inf"), self._retry_at[job_id])
            finally:
                if not handed:
                    self.backend.release(prep.placement)
                    self._queue_changed()

    def _room_for_copy(self, size: int, copying: int) -> None:
        """Whether the prepared store's disk can take a copy of ``size`` bytes now, besides the
        ``copying`` bytes of the copies in progress: on the jobs folder's disk, the copy must
        leave the disk reserve free (the reserve's watch ends only running jobs, never a copy).

        Raises:
            DiskFull: not now (the job waits in the queue, :meth:`_hold_for_space`).
            InvalidSpec: never: the disk, even empty, could not take it above the reserve.
        """
        store = self.prepared.root if self.prepared.root.is_dir() else self.prepared.root.parent
        jobs = config.jobs_root()
        try:
            usage = shutil.disk_usage(store)
            same = os.stat(store).st_dev == os.stat(jobs).st_dev if jobs.is_dir() else True
        except OSError:
            return  # unknown: the copy's own ENOSPC still holds the job
        reserve = int(self.scheduler.cluster.limits.disk_reserve_mb * (1 << 20)) if same else 0
        mb = 1 << 20
        if size > usage.total - reserve:
            raise InvalidSpec(
                f"it holds {size / mb:.1f} MB, more than the disk of the prepared data ({store}, "
                f"{usage.total / mb:.0f} MB, {reserve / mb:.0f} MB of it kept free) can take: "
                "run the job without data_preparation",
                field="data_preparation",
            )
        free = free_bytes(store)
        if free is not None and free - copying - size < reserve:
            raise DiskFull(
                f"its copy ({size / mb:.1f} MB) would leave less than the disk reserve "
                f"({reserve / mb:.0f} MB, [limits] disk_reserve_mb) free under {store} "
                f"({free / mb:.1f} MB free, {copying / mb:.1f} MB being copied for other jobs)"
            )

    def _link_prepared(self, job: Job, got: list[tuple[str, Path, Acquired]]) -> None:
        """The job's folder gets a symlink per dataset to its copy, which its nodes mount read-only."""
        for name, link, acquired in got:
            link.parent.mkdir(parents=True, exist_ok=True)
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(acquired.path)
            size = f"{acquired.bytes / 1e6:.1f} MB"
            self._notice(
                job,
                f"dataset {name}: prepared data reused ({size})"
                if acquired.reused
                else f"dataset {name}: prepared {size} in {acquired.seconds:.2f} s",
            )

    def _prepared_live(self, job_id: str) -> bool:
        """Whether a job still holds its prepared data (it is queued or running)."""
        try:
            return self.store.get(job_id).status in (JobStatus.queued, JobStatus.running)
        except NotFound:
            return False

    def sweep_prepared(self) -> list[str]:
        """Remove the prepared data unused for longer than the retention; the keys removed."""
        self._swept = time.monotonic()
        try:
            return self.prepared.sweep(self._prepared_live)
        except Exception:  # a bad [data] table or an unreadable entry must not stop supervision
            log.exception("sweeping prepared data failed")
            return []

    def prepared_data(self, user: str | None) -> list[PreparedData]:
        """The prepared copies (``user``: only those a job of theirs took), after a sweep.

        Raises:
            InvalidSpec: ``[data] retention`` of ``cluster.toml`` is not a duration.
        """
        self._swept = time.monotonic()
        self.prepared.sweep(self._prepared_live)
        return self.prepared.entries(self._prepared_live, user)

    def remove_prepared(self, key: str, user: str | None) -> PreparedData:
        """Remove one prepared copy now (``user``: only one a job of theirs took).

        Raises:
            NotFound: no such copy (for this user).
            Conflict: a queued or running job uses it.
        """
        return self.prepared.remove(key, self._prepared_live, user)

    def _launch(
        self, job: Job, placement: Placement, *, prepared: list[tuple[str, Path, Acquired]] | None = None
    ) -> None:
        """Start the job's nodes on ``placement`` (a data-preparation job: first its data, see
        :meth:`_start_preparing`; ``prepared``: what that gave, the data is ready)."""
        # as a submit is refused: a job started on a full disk could not keep its log
        full = full_folder([config.jobs_root(), config.home()], below=SUBMIT_BELOW)
        if full is not None:
            self.backend.release(placement)
            self._hold_for_space(job, disk_full_message(full))
        try:
            config.jobdir(job.id).logs.mkdir(parents=True, exist_ok=True)
            if job.spec.data_preparation and prepared is None:
                self._start_preparing(job, placement)
                return
            if prepared is not None:
                self._link_prepared(job, prepared)
            attempt = self._attempt(job, placement)
            launches = self.backend.dryrun(attempt)
            # Durable before the processes exist: a crash right after launch can still find them.
            self.store.set_placement(job.id, placement.to_json())
            # a node's log spans attempts: what this attempt writes starts at its size now
            starts = {plan.name: self._log_size(job.id, plan.name) for plan in attempt.plans}
            runs = self.backend.launch(attempt, launches)
            runs = [r.model_copy(update={"log_start": starts.get(r.name, 0)}) for r in runs]
        except Exception as exc:  # the job cannot start: it fails, the queue goes on
            self._launch_failed(job, placement, exc)
            return
        self._placements[job.id] = placement
        where = ", ".join(f"{r.name}@{r.host}" for r in runs)
        # the batch tasks that succeeded earlier keep their record beside this attempt's
        launched = {r.name for r in runs}
        kept = [r for r in job.nodes if r.name not in launched] if job.spec.type.value == "batch" else []
        updates = {
            "nodes": sorted(kept + runs, key=lambda r: r.index) if kept else runs,
            "chosen_spec": placement.spec.name,
            "workspace_isolation": self.backend.isolation(),
        }
        if job.started_at is None:
            updates["started_at"] = utcnow()
        job = job.model_copy(update=updates)
        resumed = f" (attempt {job.attempt + 1})" if job.attempt else ""
        self._transition(job, JobStatus.running, f"running on spec {placement.spec.name}{resumed}: {where}")
        running, elastic = policies.workers(placement.tasks), job.spec.checkpoint_resume
        if elastic and elastic.elastic_min_nodes and running < job.spec.nodes:
            self._shrunk_since[job.id] = time.monotonic()
            self._notice(
                job,
                f"started with {running} of {job.spec.nodes} nodes (elastic, at least "
                f"{elastic.elastic_min_nodes}): it scales up when nodes free",
            )
        if self.backend.isolation() == "symlink":
            self._notice(
                job,
                "bubblewrap is missing: /workspace is a symlink tree at $MA_WORKSPACE; "
                "read-only mounts are not enforced (install bubblewrap for real isolation)",
            )

    def _launch_failed(self, job: Job, placement: Placement, exc: Exception, prefix: str = "") -> None:
        """A launch that raised: free what it reserved; the job fails with the reason (or, on a
        full disk, keeps its place in the queue: :meth:`_hold_for_space` raises DiskFull)."""
        self.backend.release(placement)
        message = prefix + policies.launch_failure(exc, config.jobdir(job.id).root)
        if policies.is_disk_full(exc):
            self._hold_for_space(job, message)  # raises DiskFull: it stays queued
        self.store.set_placement(job.id, None)
        self._queue_changed()
        log.warning("job %s failed to launch: %s", job.id, message)
        self._transition(job, JobStatus.error, f"could not start: {message}")

    def _hold_for_space(self, job: Job, message: str) -> None:
        """A launch that met a full disk: the job keeps its place in the queue, says why once
        (when the store can still record it), and admission tries it again later (DiskFull goes
        to :meth:`_guarded`)."""
        try:
            self.store.set_placement(job.id, None)
            if self._waiting_noted.get(job.id) != "disk_full":
                self._notice(job, f"waiting: {message}; it starts once there is space again")
                self._waiting_noted[job.id] = "disk_full"
        except DiskFull:
            pass  # the store's own disk is full: nothing can be said now
        self._queue_changed()
        raise DiskFull(message)

    def _watch(self, job: Job) -> None:
        job = self.store.get(job.id)  # never act on a stale copy: it may have finished meanwhile
        if job.status is not JobStatus.running or job.id in self._finishing:
            return
        placement = self._placements.get(job.id)
        if placement is None:
            data = self.store.placement(job.id)
            if data is None:
                self._transition(
                    job, JobStatus.error, "lost: the service has no record of where this job ran"
                )
                return
            placement = self._placements[job.id] = Placement.from_json(data)
        attempt = self._attempt(job, placement)
        end = policies.before_poll(
            job,
            desired=self.store.desired(job.id),
            pending_end=self._pending_end.get(job.id),
            disk_full=self._full_disk(job, attempt),
            now=utcnow(),
        )
        if end is not None:
            if end.pending and job.id not in self._pending_end:
                log.warning("job %s: %s", job.id, end.reason)
            self._finish(job, attempt, end)
            return
        now = time.monotonic()
        if not self._poll_all and now - self._polled_at.get(job.id, 0.0) < self.backend.poll_every:
            return  # polled recently, and no end was pushed since
        self._polled_at[job.id] = now
        # a batch task that succeeded in an earlier attempt is not run again: its result stands
        current = {plan.name for plan in attempt.plans}
        runs = [self.backend.poll(attempt, r) if r.name in current else r for r in job.nodes]
        if runs != job.nodes:
            job = job.model_copy(update={"nodes": runs})
            self.store.save(job)
        if self.health.marks and self._on_unhealthy(job, attempt, runs):
            return
        if job.spec.type.value == "batch":
            end = policies.on_batch(job, runs, lambda run: self._failure_reason(attempt, run))
            if end is not None:
                if end.failed is not None:
                    full = self._full_disk(job, attempt, now=True)
                    if full is not None:
                        end = policies.on_failure(job, end.failed, end.reason, full)
                self._finish(job, attempt, end)
            return
        failed = policies.first_failure(runs)
        if failed is not None:

            def reason() -> str:
                return self._failure_reason(attempt, failed)

            full = self._full_disk(job, attempt, now=True)
            self._finish(job, attempt, policies.on_failure(job, failed, reason, full))
            return
        if job.spec.checkpoint_resume and job.spec.checkpoint_resume.perf_threshold:
            end = self._perf(job, attempt)
            if end is not None:
                self._finish(job, attempt, end)
                return
        end = policies.on_success(runs)
        if end is not None:
            self._finish(job, attempt, end)

    def _on_unhealthy(self, job: Job, attempt: Attempt, runs: list[NodeRun]) -> bool:
        """Rule 5a (:func:`.policies.on_unhealthy`): True when the attempt is being ended."""
        marks = {name: (m.status, m.reason) for name, m in self.health.snapshot().items()}
        notice, end = policies.on_unhealthy(job, runs, marks)
        if notice is None and end is None:
            return False
        if end is None:
            bad = next(r.host for r in runs if r.host in marks)
            key = (job.id, job.attempt, bad)
            if notice and key not in self._health_noted:
                self._health_noted.add(key)
                self._notice(job, notice)
            return False
        if notice:
            self._notice(job, notice)
        self._finish(job, attempt, end)
        return True

    # ------------------------------------------------------------------ node health

    def drain(self, node: str, reason: str | None = None, by: str | None = None) -> None:
        """Take ``node`` out of placement (an admin's drain); a job with checkpoint resume running
        there is moved away by the next watch.

        Raises:
            NotFound: no node of the inventory has that name.
        """
        self._known_node(node)
        why = f"drained by {by or 'an admin'}" + (f": {reason}" if reason else "")
        if self.health.mark(node, "drained", why):
            log.warning("node %s %s", node, why)
        self._wake.set()

    def undrain(self, node: str) -> None:
        """Put a drained or faulty ``node`` back into placement (queued jobs may fit now).

        Raises:
            NotFound: no node of the inventory has that name.
        """
        self._known_node(node)
        if self.health.clear(node) is not None:
            self._queue_changed()

    def _known_node(self, node: str) -> None:
        names = [n.name for n in self.scheduler.nodes()]
        if node not in names:
            raise NotFound(f"no node {node!r}: the nodes are {', '.join(names)} (see `ma-jupyter nodes`)")

    def _inspect(self, judge: bool) -> None:
        """The periodic node inspection: heartbeats (only when ``judge``), then elastic
        scale-up (module docstring)."""
        timeout = self.scheduler.cluster.limits.heartbeat_timeout
        interval = self.scheduler.cluster.limits.elastic_scale_up_interval
        now = time.time()
        # the age of each running runner's last beat, by inventory node: a node is faulty only
        # when every runner on it is silent (one job stopping its own runner, or loading it,
        # must not end the other users' jobs there)
        ages: dict[str, list[float]] = {}
        # inventory node -> the running jobs' tasks holding real cards there (asked outside the lock)
        card_tasks: dict[str, list[tuple[Job, TaskSlot]]] = {}
        for job in self.store.by_status(JobStatus.running):
            with self._lock:
                placement = self._placements.get(job.id)
                if placement is None or job.id in self._finishing:
                    continue
                attempt = self._attempt(job, placement)
                if judge:
                    for task in placement.tasks:
                        if task.card_type and task.host not in self.health.marks:
                            card_tasks.setdefault(task.host, []).append((job, task))
                for run in job.nodes:
                    if run.state != "running" or run.host in self.health.marks:
                        continue
                    beat = self.backend.heartbeat(attempt, run)
                    if beat is not None:
                        ages.setdefault(run.host, []).append(now - beat)
                since = self._shrunk_since.get(job.id)
                if since is None:
                    continue
                use = self.scheduler.usage(p for j, p in self._placements.items() if j != job.id)
                possible = self.scheduler.place(job.id, job.spec, use)
                end = policies.on_scale_up(
                    job,
                    policies.workers(placement.tasks),
                    policies.workers(possible.tasks) if possible else 0,
                    time.monotonic() - since,
                    interval,
                    len(self.queue),
                )
                if end is not None:
                    self._notice(job, end.reason.split(";")[0] + ": checkpointing to scale up")
                    self._finish(job, attempt, end)
        if not judge:
            return
        for host, held in card_tasks.items():
            # the driver may take a while to answer (NVML): the supervisor's lock is not held
            why = next((w for w in (self.backend.card_fault(task) for _, task in held) if w), None)
            if why is None:
                continue
            with self._lock:
                if self.health.mark(host, "faulty", why):
                    log.warning("node %s is faulty: %s", host, why)
                    for job in {j.id: j for j, _ in held}.values():
                        self._notice(job, f"node {host} is faulty: {why}", alert=True)
        for host, silent in ages.items():
            if min(silent) > timeout:
                why = (
                    f"no node runner there has beaten for {min(silent):.0f} s (more than {timeout:g} s; "
                    f"{len(silent)} running)"
                )
                with self._lock:
                    if self.health.mark(host, "faulty", why):
                        log.warning("node %s is faulty: %s", host, why)

    def _precheck(self, job: Job, placement: Placement) -> str | None:
        """The pre-check before a checkpoint-resume attempt (seed 002), said as an event: the
        checkpoint's folder (the job's outputs) is there and readable, and the attempt is placed
        on usable nodes.  The reason it fails, or None.  Looks at the folder's metadata only."""
        folder = job.outputs_folder
        if not folder or not os.path.isdir(folder) or not os.access(folder, os.R_OK | os.X_OK):
            return (
                f"pre-check before resume failed: the checkpoint folder {folder} (the job's outputs) "
                "is missing or unreadable"
            )
        hosts = ", ".join(dict.fromkeys(t.host for t in placement.tasks))
        avoided = ", ".join(f"{n} ({m.status})" for n, m in self.health.snapshot().items())
        self._notice(
            job,
            f"pre-check before resume passed: checkpoint folder {folder} readable; placed on {hosts}"
            + (f", avoiding {avoided}" if avoided else ""),
        )
        return None

    def _reserve_loop(self) -> None:
        while not self._halt.wait(DISK_CHECK_EVERY):
            try:
                self._watch_reserve()
            except Exception:  # the next look tries again; the jobs' own disk checks still run
                log.exception("keeping the disk reserve failed")

    def _watch_reserve(self) -> None:
        """Keep the jobs folder's disk reserve (:mod:`.policies`, "across running jobs"): under
        twice the reserve, measure what each running job holds there; under the reserve, end
        the one writing the most (:func:`.policies.on_reserve`)."""
        now = time.monotonic()
        seconds, self._reserve_watched = now - self._reserve_watched, now
        reserve = int(self.scheduler.cluster.limits.disk_reserve_mb * (1 << 20))
        root = config.jobs_root()
        free = free_bytes(root)
        if free is None or free >= 2 * reserve:
            self._held = {}
            return
        device = os.stat(root).st_dev
        held: dict[str, int] = {}
        attempts: dict[str, Attempt] = {}
        for job in self.store.by_status(JobStatus.running):
            with self._lock:
                placement = self._placements.get(job.id)
                if placement is None or job.id in self._finishing:
                    continue
                attempts[job.id] = attempt = self._attempt(job, placement)
            folders = policies.disk_folders(attempt.spec, attempt.jobdir.root, attempt.jobdir.outputs)
            held[job.id] = disk_use(folders, device)
        before, self._held = self._held, held
        if free >= reserve or free < FULL_BELOW:
            return  # outside the reserve; or full, where each job writing there ends ("disk full")
        grown = {j: held[j] - before[j] for j in held if j in before}
        victim = policies.reserve_offender(grown, seconds, free, reserve, config.DISK_FLOOD_RATE)
        if victim is None:
            return
        end = policies.on_reserve(root, free, reserve, grown[victim], seconds)
        with self._lock:
            job = self.store.get(victim)
            if job.status is JobStatus.running and victim not in self._finishing:
                log.warning("job %s: %s", victim, end.reason)
                self._held.pop(victim, None)
                self._finish(job, attempts[victim], end)

    def _full_disk(self, job: Job, attempt: Attempt, *, now: bool = False) -> Path | None:
        """The first full folder among those the job writes to (its job folder, outputs and
        volumes); looked at every ``DISK_CHECK_EVERY`` seconds unless ``now``."""
        clock = time.monotonic()
        if not now and clock - self._disk_checked.get(job.id, 0.0) < DISK_CHECK_EVERY:
            return None
        self._disk_checked[job.id] = clock
        folders = policies.disk_folders(attempt.spec, attempt.jobdir.root, attempt.jobdir.outputs)
        return full_folder(f for f in folders if f.is_dir())

    def _forget(self, job_id: str) -> None:
        """Drop the in-memory notes kept about a job's current attempt."""
        self._waiting_noted.pop(job_id, None)
        self._disk_checked.pop(job_id, None)
        self._pending_end.pop(job_id, None)
        self._retry_at.pop(job_id, None)
        self._polled_at.pop(job_id, None)
        self._shrunk_since.pop(job_id, None)
        self._health_noted = {k for k in self._health_noted if k[0] != job_id}
        for key in [k for k in self._perf_offsets if k[0] == job_id]:
            del self._perf_offsets[key]
        self._perf_alerted = {k for k in self._perf_alerted if k[0] != job_id}

    def _perf(self, job: Job, attempt: Attempt) -> End | None:
        """Performance detection: read the primary nodes' new complete log lines and apply
        :func:`.policies.on_perf` to their samples; the end that reschedules the job, if any."""
        for run in job.nodes:
            if not run.primary:
                continue
            key = (job.id, job.attempt, run.name)
            # only this attempt's lines: earlier attempts' slow samples were acted on already
            offset = self._perf_offsets.get(key, run.log_start)
            # bounded, and no backend call blocks on a file the job controls: it may run in the loop
            data = self._read_log(job.id, run.name, offset, 1 << 20)
            complete = data[: data.rfind(b"\n") + 1]
            self._perf_offsets[key] = offset + len(complete)
            samples = policies.perf_samples(complete.decode("utf-8", "replace"))
            alert, end = policies.on_perf(job, run.name, samples, key in self._perf_alerted)
            if end is not None:
                return end
            if alert is not None:
                self._perf_alerted.add(key)
                self._notice(job, alert, node=run.name, alert=True)
        return None

    def _read_log(self, job_id: str, node: str, offset: int, limit: int) -> bytes:
        """At most ``limit`` bytes of a node's log from ``offset`` (none while it does not exist).

        Raises:
            RefusedFile: the job replaced its log with something unreadable.
        """
        try:
            source = self.backend.open_log(job_id, node, None)
        except NodeLost:  # gone with its Ray node: the poll finds the node lost
            return b""
        if source is None:
            return b""
        try:
            return source.read(offset, limit)[0]
        finally:
            source.close()

    def _log_size(self, job_id: str, node: str) -> int:
        """The size of a node's log now (0 while it does not exist or cannot be read)."""
        try:
            source = self.backend.open_log(job_id, node, None)
        except (RefusedFile, NodeLost, OSError):
            return 0
        if source is None:
            return 0
        try:
            return source.size()
        finally:
            source.close()

    def _tail(self, job_id: str, node: str) -> list[str]:
        """The last lines of a node's log (empty if it does not exist or cannot be read); a log
        the job replaced with something unreadable gives one line saying what it left."""
        try:
            source = self.backend.open_log(job_id, node, None)
            if source is None:
                return []
            try:
                return tail(source, TAIL_LINES)
            finally:
                source.close()
        except (RefusedFile, BackendUnavailable, NodeLost) as exc:  # planted by the job / gone with its node
            return [exc.message]
        except OSError:
            return []

    def _failure_reason(self, attempt: Attempt, run: NodeRun) -> str:
        """Why a node failed, with its last log lines; reads what the job could have written (through
        the backend), so it runs on the finishing thread, outside the supervisor lock."""
        lines = self._tail(attempt.job_id, run.name)
        hint = self.backend.explain(attempt, run, lines)
        return policies.failure_reason(run, lines, self.backend.failure(attempt, run), hint)

    def _finish(self, job: Job, attempt: Attempt, end: End) -> None:
        """End the attempt: stop what still runs (on a thread: it may take the grace period), then
        record what :func:`.policies.settle` makes of ``end``.

        ``end.reason`` may be a function: it is called on that thread, outside the lock, because
        it may read files the job wrote (its log, its failure report).
        """
        if end.pending:  # the disk is full: keep the reason until the store takes it
            self._pending_end[job.id] = _call_reason(end.reason)
        self._finishing.add(job.id)

        def run() -> None:
            try:
                live = policies.live_nodes(job.nodes)
                if live:
                    self.backend.stop(attempt, live, end.grace)
                # the nodes just stopped, and any lost one (its exit code may have come since):
                # a node already seen exited keeps that state and code (a call per node on Ray)
                again = {plan.name for plan in attempt.plans} - {
                    r.name for r in job.nodes if r.state == "exited"
                }
                polled = [self.backend.poll(attempt, r) if r.name in again else r for r in job.nodes]
                final = policies.final_node_states(polled, end.failed)
                text = _call_reason(end.reason)
                # said of a success only: a failure or a stop is its own news, and an early stop
                # leaves no trace of a strategy that had no time to form
                solo = self._not_distributed(job, attempt) if end.status is JobStatus.succeeded else None
                with self._lock:
                    placement = self._placements.pop(job.id, None)
                    if placement:
                        self.backend.release(placement)
                        self._queue_changed()  # resources freed: the queue's head may start
                    self.store.set_placement(job.id, None)
                    self._forget(job.id)
                    desired = self.store.desired(job.id)
                    settled = policies.settle(end, text, desired)
                    if not settled.remove:  # kept until the job is gone: a crash before that leaves it marked
                        self.store.set_desired(job.id, None)
                    current = self.store.get(job.id)
                    if solo is not None:  # before the end: a follower that sees the end finds it
                        self._notice(current, solo[1], node=solo[0], alert=True)
                    updates = policies.record_updates(
                        current, settled, final, end.exit_code, utcnow(), counted=end.counted
                    )
                    self._transition(
                        current.model_copy(update=updates),
                        settled.status,
                        settled.reason,
                        node=end.failed.name if end.failed else None,
                        exit_code=end.failed.exit_code if end.failed else end.exit_code,
                    )
                    if settled.status is JobStatus.error and job.spec.debug_terminal:
                        self._tell_kept(job, attempt, polled)
                if settled.remove:
                    self._remove(job.id)
            except DiskFull as exc:
                # nothing can be recorded now: the loop retries later, with the reason kept
                log.warning("job %s: cannot record its end: %s", job.id, exc.message)
                self._retry_at[job.id] = time.monotonic() + RECORD_RETRY
            except Exception:
                log.exception("finishing job %s failed", job.id)
            finally:
                self._finishing.discard(job.id)
                self._wake.set()

        threading.Thread(target=run, name=f"finish-{job.id}", daemon=True).start()

    def _not_distributed(self, job: Job, attempt: Attempt) -> tuple[str | None, str] | None:
        """(node, alert) when this multi-node attempt did not run distributed (see
        :mod:`.distributed_check`); reads what the job could have written, so outside the lock."""
        if len(attempt.plans) < 2:
            return None
        if job.spec.mode is Mode.tensorflow:
            heads = []
            for run in job.nodes:
                try:
                    heads.append(
                        self._read_log(job.id, run.name, run.log_start, distributed_check.HEAD_BYTES)
                    )
                except Exception:  # replaced by the job, gone with its node: not judged
                    heads.append(None)
            if distributed_check.tensorflow_alone(heads):
                return None, distributed_check.tensorflow_alert(len(heads))
            return None
        for run in job.nodes:
            try:
                nodes = self.backend.not_distributed(attempt, run)
            except Exception:  # a node gone, a backend away: say nothing rather than guess
                log.debug("job %s: no not-distributed report from %s", job.id, run.name, exc_info=True)
                continue
            if nodes is not None:
                return run.name, distributed_check.torch_alert(nodes, job.spec.mode.value)
        return None

    def _tell_kept(self, job: Job, attempt: Attempt, runs: list[NodeRun]) -> None:
        """An event per failed node that keeps its sandbox for the debug terminal, with until
        when and how to reach it (called under the lock, after the job's end was recorded)."""
        for run in runs:
            until = self.backend.kept_until(attempt, run)
            if until is None:
                continue
            stamp = datetime.fromtimestamp(until, UTC).strftime("%Y-%m-%d %H:%M UTC")
            self.store.add_event(
                Event(
                    job_id=job.id,
                    status=JobStatus.error,
                    node=run.name,
                    reason=f"the sandbox of {run.name} is kept for the debug terminal until {stamp}: "
                    f"ma-jupyter shell {job.id} --node {run.name}; deleting the job ends it sooner",
                )
            )

    # ----------------------------------------------------------------------- events

    def _transition(
        self,
        job: Job,
        status: JobStatus,
        reason: str,
        *,
        node: str | None = None,
        exit_code: int | None = None,
        by: str | None = None,
    ) -> Job:
        if job.status is not status and not job.status.can_become(status):
            raise Conflict(f"job {job.id} cannot go from {job.status.value} to {status.value}")
        job = job.model_copy(update={"status": status, "reason": reason.splitlines()[0] if reason else ""})
        self.store.save(
            job, Event(job_id=job.id, status=status, reason=reason, node=node, exit_code=exit_code, by=by)
        )
        if status.is_terminal() and job.spec.data_preparation:
            preparing = self._preparing.get(job.id)
            if preparing is not None:
                preparing.cancel.set()  # its copy ends; the thread then frees its nodes
            self.prepared.release(job.id)  # its retention starts now
        # the queue index follows the store: an attempt put back in the queue keeps its place
        if status is JobStatus.queued:
            self.queue.put(job)
            self._queue_changed()
        elif self.queue.discard(job.id) and status is not JobStatus.running:
            self._queue_changed()  # a queued job stopped, deleted or failed
        return job

    def _backend_notice(self, job_id: str, node: str | None, reason: str) -> None:
        """An event for what the backend learned by itself about a job (from a backend thread);
        a job that is gone (deleted) gets none."""
        try:
            job = self.store.get(job_id)
        except NotFound:
            return
        try:
            self._notice(job, reason, node=node)
        except DiskFull:
            log.warning("job %s: cannot record %r: the disk is full", job_id, reason)

    def _notice(
        self, job: Job, reason: str, *, node: str | None = None, alert: bool = False, by: str | None = None
    ) -> None:
        self.store.add_event(
            Event(job_id=job.id, status=job.status, reason=reason, node=node, alert=alert, by=by)
        )


def _call_reason(reason: str | Callable[[], str]) -> str:
    """The text of a reason given as text or as a function (whose failure must not lose the event)."""
    if not callable(reason):
        return reason
    try:
        return reason()
    except Exception as exc:  # reading the job's files failed: still record why the job ended
        log.exception("building a job's reason failed")
        return f"(the reason could not be read: {type(exc).__name__}: {exc})"
