"""What a job would do and when, without starting anything: the preflight, the plan, its start.

Rules:

1. **Preflight** (:meth:`Forecast.preflight`, a submit's validation and ``--dry-run``): the
   cluster can ever hold the job (:meth:`..scheduler.Scheduler.check`), its command parses, it
   is placed now (or, when it must wait, on an empty cluster: drained and faulty nodes count,
   they are only out for now), bound with nothing reserved (port 0), planned and dry-run by the
   backend on the placeholder job folder (which applies the mount rules), and its others' access
   is within what its resources allow (:func:`..access.check_resource_access`, after the mount
   rules: a folder no job may mount is refused for that).  The first problem found is raised
   (``InvalidSpec``).
2. **The plan** (``--dry-run``) is the preflight's launches with the queue ahead, whether it
   would start now and its estimated start (rule 3), and notes; secret values show as ``***``.
3. **Whether a job submitted now would start at once** follows the admission pass's own rules
   (:mod:`.admission`, step 5): it passes the queue's first job only if it cannot delay it.
   A running job without a duration is taken to end when similar jobs did
   (:mod:`..history`): the plan says so, with the estimate's confidence (the weakest of the
   guessed ends that come before it).  Admission itself never uses these guesses.
4. **A queued job's estimated start** (:meth:`Forecast.estimated_start`): each job ahead, in
   queue order, is given its own reservation and then counts as running from that start to its
   start plus its duration; the job's own reservation on top of them is the estimate (none
   past ``ESTIMATE_DEPTH`` jobs ahead, nor behind a queued job without a duration; a running
   one is taken to end as in rule 3).  What it reads is
   taken under the lock; the reservations (inventory reads, a Ray call) run outside it, so
   admission passes never wait on them.
5. **Advice** (:meth:`Forecast.advice`): a job whose every node would run its own copy of a
   single-process script gets a warning (:mod:`...modes.single_copy`), and so does a job asking
   for checkpoint resume whose code would not save on SIGTERM or load its checkpoint
   (:mod:`...modes.resume_readiness`); the dry run shows them as notes, the submit records them
   as events.  A failure to judge says nothing.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime

from ...backends.base import Backend
from ...commands import parse_command
from ...errors import InvalidSpec, NotFound
from ...models import SECRET_MASK, Job, JobSpec, NodeLaunch, Plan
from ...modes import resume_readiness, single_copy
from ...modes.base import Placement
from .. import history
from ..access import check_resource_access
from ..queue import QueueIndex
from ..scheduler import NodeUse, Running, Scheduler
from ..store import Store
from .admission import Admission
from .attempts import attempt_for
from .ledger import Ledger

log = logging.getLogger("ma_jupyter.supervisor")


def refuse_masked_secrets(spec: JobSpec) -> None:
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
    if any(value == SECRET_MASK for value in spec.storage_credentials.values()):
        raise InvalidSpec(
            f"storage_credentials: a value is {SECRET_MASK}, the mask a job shows for its credentials: "
            "submit from a process with your AWS_* variables (or AWS_PROFILE) set, or give them again",
            field="storage_credentials",
        )


class Forecast:
    """Preflights, plans and start estimates (the module's rules); creates nothing."""

    #: a queued job further back than this gets no estimate (each job ahead costs a reservation)
    ESTIMATE_DEPTH = 50

    def __init__(
        self,
        store: Store,
        scheduler: Scheduler,
        backend: Backend,
        queue: QueueIndex,
        ledger: Ledger,
        admission: Admission,
    ):
        self._store = store
        self._scheduler = scheduler
        self._backend = backend
        self._queue = queue
        self._ledger = ledger
        self._admission = admission

    def preflight(self, spec: JobSpec) -> tuple[Placement | None, Placement, list[NodeLaunch]]:
        """Rule 1: the placement now (None: it must wait), the placement planned, and the launches.

        Raises:
            InvalidSpec: the first problem found.
        """
        self._scheduler.check(spec)
        if spec.type.value != "batch":
            parse_command(spec.command or "")
        now = self._place("dry-run", spec, self._admission.usage(settled=False))
        placement = now or self._any_placement(spec)
        # a mode or a backend that cannot run this job refuses it now, not at launch
        attempt = attempt_for(self._store, Job(id="<job-id>", spec=spec), placement, dry=True)
        launches = self._backend.dryrun(attempt)
        check_resource_access(spec)
        return now, placement, launches

    def _place(self, job_id: str, spec: JobSpec, use: dict[str, NodeUse]) -> Placement | None:
        """Where the job's tasks would go (the scheduler), bound by the backend without reserving
        anything (a dry run); None if it does not fit."""
        placement = self._scheduler.place(job_id, spec, use)
        return None if placement is None else self._backend.bind(placement, reserve=False)

    def _any_placement(self, spec: JobSpec) -> Placement:
        """A placement on an empty cluster (for planning a job that must wait)."""
        # drained and faulty nodes count: they are only out for now
        placement = self._scheduler.place_anywhere("dry-run", spec)
        placement = placement and self._backend.bind(placement, reserve=False)
        if placement is None:
            raise InvalidSpec("this job cannot be placed on this cluster", field="specs")
        return placement

    def plan(self, spec: JobSpec) -> Plan:
        """Rule 2; creates nothing.

        Raises:
            InvalidSpec: as a submit would (a form shows it as you type).
        """
        refuse_masked_secrets(spec)
        _, placement, launches = self.preflight(spec.masked())
        ahead = self._queue.ahead(spec.priority, spec.creator)
        can_start, start, guessed = self._predict(spec)
        notes = ["ports are allocated at launch (0 in this plan)", *self.advice(spec)]
        confidence = None
        if not can_start and start is not None:
            # the guessed ends the estimate rests on: those at or before it
            used = [(job, runtime) for job, end, runtime in guessed if end <= start]
            confidence = history.weakest([runtime.confidence for _, runtime in used])
            if used:
                basis = ", ".join(f"{job.spec.name} typically runs {runtime.text()}" for job, runtime in used)
                notes.append(
                    f"the estimated start takes running jobs without a duration to end as similar "
                    f"jobs did ({basis}); confidence {confidence}"
                )
        return Plan(
            spec=placement.spec.name,
            nodes=launches,
            can_start_now=can_start,
            queue_ahead=ahead,
            estimated_start=None if start is None else datetime.fromtimestamp(start, UTC),
            estimate_confidence=confidence,
            notes=notes,
        )

    def _running(self, now: float) -> tuple[list[Running], list[tuple[Job, float, history.Runtime]]]:
        """The running placements with their ends, those without a duration taken to end as
        similar jobs did (rule 3), and which ends were guessed so (job, end, runtime)."""
        out: list[Running] = []
        guessed: list[tuple[Job, float, history.Runtime]] = []
        for job, running in self._admission.running_jobs():
            if running.end is None and job is not None:
                found = history.estimated_end(self._store, job, now)
                if found is not None:
                    running = Running(running.placement, found[0])
                    guessed.append((job, found[0], found[1]))
            out.append(running)
        return out, guessed

    def _predict(self, spec: JobSpec) -> tuple[bool, float | None, list[tuple[Job, float, history.Runtime]]]:
        """Rule 3: whether a job submitted now would start at once (by durations alone, as
        admission decides), its estimated start (epoch seconds; None: unknown), and the running
        jobs' ends guessed from history where durations alone leave the start unknown."""
        with self._ledger.lock:
            now = time.time()
            use = self._admission.usage()
            can_start, start = self._start(spec, use, self._admission.running(), now)
            if can_start or start is not None:
                return can_start, start, []
            running, guessed = self._running(now)
            if not guessed:
                return False, None, []
            _, start = self._start(spec, use, running, now)
            return False, start, guessed

    def _start(
        self, spec: JobSpec, use: dict[str, NodeUse], running: list[Running], now: float
    ) -> tuple[bool, float | None]:
        """Rule 3 on the given running jobs and their ends (called under the lock)."""
        scheduler = self._scheduler
        head = None
        if self._queue.ahead(spec.priority, spec.creator):
            first = self._queue.first()
            try:
                head_job = self._store.get(first) if first else None
            except NotFound:
                head_job = None
            if head_job is not None:
                head = scheduler.reserve(head_job.id, head_job.spec, running, now)
        if head is None:  # it would be first in the queue (or the first can never start)
            if scheduler.place("dry-run", spec, use) is not None:
                return True, now
            own = scheduler.reserve("dry-run", spec, running, now)
            return False, None if own is None or own.start == float("inf") else own.start
        if scheduler.backfill("dry-run", spec, use, head, now) is not None:
            return True, now
        if head.start == float("inf"):
            return False, None
        # it waits for the head: it starts beside it, or once enough jobs (the head too) end
        head_end = head.start + head_job.spec.duration if head_job.spec.duration else None
        own = scheduler.reserve("dry-run", spec, [*running, Running(head.placement, head_end)], head.start)
        return False, None if own is None or own.start == float("inf") else own.start

    def advice(self, spec: JobSpec) -> list[str]:
        """Rule 5: the warnings about the job's code (it reads the algorithm folder: call it
        outside the lock); advice only, so a failure to judge says nothing."""
        judges = [judge for judge in (single_copy, resume_readiness) if judge.applies(spec)]
        if not judges:
            return []
        try:
            sources = self._backend.code_sources(spec)
            found = [judge.warning(spec, sources) for judge in judges]
        except Exception:  # never refuse or fail a job over advice
            log.exception("judging the code of job %r failed", spec.name)
            return []
        return [warning for warning in found if warning]

    def queue_position(self, job_id: str) -> int | None:
        """How many queued jobs the scheduler considers before this one; None if it is not queued."""
        return self._queue.position(job_id)

    def estimated_start(self, job_id: str) -> datetime | None:
        """Rule 4: when a queued job should start if the jobs ahead of it start in queue order
        and every job ends at its duration; None: not queued, too far back, or a job it waits
        for has no duration (or can never be placed).  Backfill can only make it start sooner.
        """
        with self._ledger.lock:
            ids = self._queue.ids()
            if job_id not in ids or ids.index(job_id) >= self.ESTIMATE_DEPTH:
                return None
            now = time.time()
            running = self._running(now)[0]
        for ahead_id in ids[: ids.index(job_id) + 1]:
            try:
                job = self._store.get(ahead_id)
            except NotFound:
                continue  # it left the queue meanwhile
            exclude = self._scheduler.exclusions(job.id, job.spec, job.excluded_nodes)
            reservation = self._scheduler.reserve(job.id, job.spec, running, now, exclude)
            if reservation is None or reservation.start == float("inf"):
                return None
            if job.id == job_id:
                return datetime.fromtimestamp(reservation.start, UTC)
            end = reservation.start + job.spec.duration if job.spec.duration else None
            running.append(Running(reservation.placement, end))
        return None
