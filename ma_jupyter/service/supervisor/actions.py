"""What users ask of jobs: submit, change, stop, delete; and the service's own fail and cache clear.

Each request reads the job fresh and changes it under the supervisor's lock, so it never acts on
a stale copy, and what it changes of the queue wakes the loop (:meth:`.ledger.Ledger.queue_changed`).
What a request decides for a given job is :mod:`..policies`' (``stop_action``, ``delete_action``,
``updated_spec``, ``on_refused_file``).

Rules of a submit (:meth:`Actions.submit`), in this order:

1. the secret values are taken apart (the job and all that shows it carry ``***``); a value
   that is the mask itself is refused (a copied job does not carry its secrets);
2. a repeated idempotency key of the same user returns the job the first submit made;
3. the caller's own check (a quota) runs, then the preflight (:mod:`.forecast`), then the
   jobs folder's free space is checked (``DiskFull``, HTTP 507);
4. the single-copy advice is judged and the content of the job's algorithm folders is read
   (``algorithm_digest``, :func:`..algorithms.identified`, as the job's account may read it:
   whatever the caller sent is replaced);
   both read the job's code: before the lock;
5. under the lock, the job is stored queued with its event (a random id already taken gets
   another) and put in the queue index, so a stop cannot come between its row and its place.

Nothing is created when a submit is refused.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable

from ... import config
from ...backends.base import Backend
from ...errors import Conflict, DiskFull
from ...models import CacheInfo, Event, Job, JobSpec, JobStatus, Priority
from .. import algorithms, policies, storage
from ..disk import SUBMIT_BELOW, full_folder
from ..guard import disk_full_message
from ..policies import End
from ..queue import QueueIndex
from ..store import STORAGE_SECRET, Store
from .attempts import attempt_for
from .forecast import Forecast, refuse_masked_secrets
from .journal import Journal
from .ledger import Ledger
from .watching import Watching

log = logging.getLogger("ma_jupyter.supervisor")


def new_job_id(name: str) -> str:
    """A short readable id: the name's start plus random hex."""
    stem = "".join(c if c.isalnum() or c in "-_" else "-" for c in name.lower())[:24].strip("-_") or "job"
    return f"{stem}-{secrets.token_hex(3)}"


class Actions:
    """The requests on jobs (the module's rules for a submit)."""

    def __init__(
        self,
        store: Store,
        backend: Backend,
        queue: QueueIndex,
        ledger: Ledger,
        journal: Journal,
        watching: Watching,
        forecast: Forecast,
    ):
        self._store = store
        self._backend = backend
        self._queue = queue
        self._ledger = ledger
        self._journal = journal
        self._watching = watching
        self._forecast = forecast

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
        secret_values = dict(spec.secret_env)
        secret_values.update({STORAGE_SECRET + k: v for k, v in spec.storage_credentials.items()})
        refuse_masked_secrets(spec)
        unmasked = spec
        spec = spec.masked()
        key = f"{creator or ''}\0{idempotency_key}" if idempotency_key else None
        if key is not None:
            earlier = self._store.job_for_key(key)
            if earlier is not None:
                return self._store.get(earlier)
        if admit is not None:
            admit()
        # with the user's credentials, bounded by a timeout; the rest of the validation runs
        # while the endpoint answers, and the job is stored only once every check passed
        checks = storage.Checks(unmasked)
        try:
            self._forecast.preflight(spec)
            full = full_folder([config.jobs_root()], below=SUBMIT_BELOW)
            if full is not None:
                log.warning("refused a submit: %s", disk_full_message(full))
                raise DiskFull(disk_full_message(full, "free space there before submitting jobs"))
            advice = self._forecast.advice(spec)  # reads the job's code: before the lock
            # the content the job runs, read once its folders are accepted (algorithms.py rule 5)
            # as the job's account may read them: where that is another account than the service's,
            # a folder it cannot read whole has no digest (algorithms.py rule 8)
            account = algorithms.account_of(self._backend.job_account(spec.creator))
            spec = algorithms.identified(spec, account)
            checks.wait()
        finally:
            checks.close()
        # Off the ledger's lock (its rule 1's exception for a new job), which the loop holds
        # while it launches a job: a submit never waits for another job's start.  No one else
        # knows this job before its id is answered; a stop or delete that still came between
        # its row and its place in the queue index (an admin's bulk stop) leaves a stale entry,
        # which the next admission pass drops when it reads the row (admission.py step 2).
        ahead = self._queue.ahead(spec.priority, spec.creator)
        stored = None
        while stored is None:  # a random id already taken (likely among thousands of one name)
            job_id = new_job_id(spec.name)
            job = Job(
                id=job_id,
                spec=spec,
                status=JobStatus.queued,
                backend=self._backend.name,
                outputs_folder=config.outputs_folder(job_id, spec.outputs),
            )
            stored = self._store.insert(
                job,
                Event(
                    job_id=job.id,
                    status=JobStatus.queued,
                    reason=f"submitted; {ahead} job(s) ahead in the queue",
                ),
                idempotency_key=key,
                secrets=secret_values,
                notices=[Event(job_id=job.id, status=JobStatus.queued, reason=text) for text in advice],
            )
        if stored != job.id:
            return self._store.get(stored)  # a concurrent retry with the same key won
        self._queue.put(job)
        self._ledger.queue_changed()
        return job

    def request_stop(self, job_id: str, by: str | None = None) -> Job:
        """Stop a job: a queued one at once, a running one after its grace period.  ``by``: the
        user asking, named in the job's events."""
        with self._ledger.lock:
            job = self._store.get(job_id)
            action = policies.stop_action(job, self._store.desired(job_id))
            if action == "now":
                return self._journal.transition(
                    job, JobStatus.stopped, f"stopped by {by or 'user'} while queued", by=by
                )
            if action == "request":
                self._store.set_desired(job_id, "stop")
                self._journal.notice(job, f"stop requested by {by or 'a user'}", by=by)
                self._ledger.wake.set()
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
        with self._ledger.lock:
            job = self._store.get(job_id)
            action = policies.delete_action(job, force)
            if action == "refuse":
                raise Conflict(f"job {job_id} is {job.status.value}: stop it first, or delete with force")
            if action == "mark":
                self._store.set_desired(job_id, "delete")
                self._journal.notice(job, f"delete requested by {by or 'a user'}", by=by)
                self._ledger.wake.set()
                return False
            if action == "stop_then_remove":
                self._journal.transition(
                    job, JobStatus.stopped, f"stopped by {by or 'user'} while queued, to delete it", by=by
                )
        self._journal.remove(job_id)
        return True

    def fail_job(self, job_id: str, reason: str) -> None:
        """End a live job in error because of what it did (e.g. a file the service refuses to read);
        nothing happens to a job that is already ending or ended."""
        with self._ledger.lock:
            job = self._store.get(job_id)
            placement = self._ledger.placements.get(job.id)
            action = policies.on_refused_file(job, job.id in self._ledger.finishing, placement is not None)
            if action == "none":
                return
            log.warning("job %s: %s", job_id, reason)
            if action == "finish":
                attempt = attempt_for(self._store, job, placement)
                self._watching.finish(job, attempt, End(JobStatus.error, reason, policies.WIND_DOWN_GRACE))
            elif action == "error":
                self._journal.transition(job, JobStatus.error, reason)

    def clear_cache(self, user: str) -> CacheInfo:
        """Empty ``user``'s persistent cache (the backend's), refused while a job of theirs runs;
        what it held (measured before, outside the lock: a cache may hold many files).

        Checked and done under the lock, so no job of the user is launched in between (one
        launched after gets an empty cache).

        Raises:
            Conflict: a job of ``user`` is running (it may be writing to the cache).
            InvalidSpec: the backend keeps no caches.
        """
        held = self._backend.caches(user)
        with self._ledger.lock:
            running = [j for j in self._store.by_status(JobStatus.running) if j.spec.creator == user]
            if running:
                names = ", ".join(j.id for j in running[:3]) + (" ..." if len(running) > 3 else "")
                raise Conflict(
                    f"{len(running)} job(s) of {user} are running and may be using the cache ({names}): "
                    "clear it once they have ended (or stop them first: ma-jupyter stop JOB)"
                )
            self._backend.clear_cache(user)
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
        with self._ledger.lock:
            job = self._store.get(job_id)
            spec, changes = policies.updated_spec(job, priority, duration)
            job = job.model_copy(update={"spec": spec})
            reason = "; ".join(changes) + (f" by {by}" if by else "")
            self._store.save(job, Event(job_id=job_id, status=job.status, reason=reason, by=by))
            if priority is not None:  # only a queued job's priority changes: it moves in the queue
                self._queue.put(job)
                self._ledger.queue_changed()
            self._ledger.wake.set()
            return job
