"""Launching an admitted job on its bound placement (under the supervisor's lock).

:meth:`Launcher.launch`, in this order:

1. with the jobs folder or the home nearly full (as a submit is refused), the placement is
   released and the job keeps its place in the queue (:meth:`Launcher.hold_for_space`);
2. the job's log folder is made; a data-preparation job whose data is not ready is handed to
   :mod:`..preparation` instead (its spec as given dry-run first: its mount rules on the
   sources), which gives it back through :meth:`Launcher.launch_prepared` once the data is copied;
   a job whose data is ready first gets its dataset links; a job whose outputs folder the
   backend carries to its nodes' machines first (``Backend.seeds_outputs``, a resumed attempt
   on Ray) goes through that step too;
3. the attempt is dry-run, the placement stored (durable before the processes exist: a crash
   right after launch can still find them), and exactly the dry run's launches are started;
   each node's log keeps its earlier attempts, so a run records the size its part starts at;
4. the job becomes ``running``, with its nodes, its spec and its workspace isolation (at its
   first start, the content of each algorithm folder it uses as is read again, at most
   64 MB of changed files: an edit made while it was queued is what it runs, and an event says
   so, or that the content was not read again and is unknown); an elastic job started on fewer
   nodes than it asked says so, and is watched for scale-up from now.

That first-start read (a walk of a folder a user may fill with a million files) never runs under
the supervisor's lock: before step 3, a job with folders used as is keeps its bound placement
(``ledger.reading``: counted as used, the job skipped by admission) while a thread of its own
reads them (:meth:`Launcher.read_then_launch`), then takes the lock and launches it with what it
read, unless it was stopped meanwhile (its placement is then released).

A launch that raises frees its placement and fails the job with the reason
(:meth:`Launcher.failed`), except on a full disk, where the job keeps its place in the queue,
says so once, and admission tries it again later (:meth:`Launcher.hold_for_space` raises
``DiskFull`` for :meth:`.watching.Watching.guarded`).
"""

from __future__ import annotations

import logging
import threading
import time

from ... import config
from ...backends.base import Backend
from ...errors import DiskFull, NotFound
from ...models import Job, JobStatus, utcnow
from ...modes.base import Placement
from .. import algorithms, policies
from ..disk import SUBMIT_BELOW, full_folder
from ..guard import disk_full_message
from ..logs import log_size
from ..preparation import Preparation, Prepared
from ..store import Store
from .attempts import attempt_for
from .journal import Journal
from .ledger import Ledger
from .watching import RECORD_RETRY, Watching

log = logging.getLogger("ma_jupyter.supervisor")

#: seconds before a job whose data could not be copied for lack of space is prepared again
PREPARE_SPACE_RETRY = 10.0


class Launcher:
    """Starts admitted jobs' nodes; data preparation's :class:`..preparation.Handback`."""

    def __init__(
        self,
        store: Store,
        backend: Backend,
        ledger: Ledger,
        journal: Journal,
        watching: Watching,
        preparation: Preparation,
    ):
        self._store = store
        self._backend = backend
        self._ledger = ledger
        self._journal = journal
        self._watching = watching
        self._preparation = preparation

    def launch(
        self,
        job: Job,
        placement: Placement,
        *,
        prepared: Prepared | None = None,
        read: algorithms.Started | None = None,
    ) -> None:
        """Start the job's nodes on ``placement`` (the module's steps; ``prepared``: what data
        preparation gave, the data is ready; ``read``: its folders used as is, read again off
        the lock at its first start)."""
        # as a submit is refused: a job started on a full disk could not keep its log
        full = full_folder([config.jobs_root(), config.home()], below=SUBMIT_BELOW)
        if full is not None:
            self._backend.release(placement)
            self.hold_for_space(job, disk_full_message(full))
        changed: list[str] = []
        unread: list[str] = []
        try:
            config.jobdir(job.id).logs.mkdir(parents=True, exist_ok=True)
            # data to prepare, or outputs to carry to the nodes' machines (contract rule 30)
            if prepared is None and (job.spec.prepares_data() or self._backend.seeds_outputs(job)):
                if job.spec.data_preparation:
                    # the job's own mount rules on its sources, which its prepared copies then skip
                    # (object storage has none: its prefixes were checked with the user's credentials)
                    self._backend.dryrun(attempt_for(self._store, job, placement, dry=True))
                self._preparation.start(job, placement, self)
                return
            if job.started_at is None and read is None and algorithms.reads_at_start(job.spec):
                # before its processes exist, which may write to it; off the lock (a folder of a
                # million files takes seconds to walk): the job starts once it is read
                self._ledger.reading[job.id] = placement
                threading.Thread(
                    target=self.read_then_launch,
                    args=(job, placement, prepared),
                    name=f"ma-read-{job.id}",
                    daemon=True,
                ).start()
                return
            if prepared is not None:
                self._preparation.link(job, prepared)
            if job.started_at is None and read is not None:
                changed, unread = read.changed, read.unread
                job = job.model_copy(update={"spec": algorithms.with_digests(job.spec, read.spec)})
            attempt = attempt_for(self._store, job, placement)
            launches = self._backend.dryrun(attempt)
            # Durable before the processes exist: a crash right after launch can still find them.
            self._store.set_placement(job.id, placement.to_json())
            # a node's log spans attempts: what this attempt writes starts at its size now
            starts = {plan.name: log_size(self._backend, job.id, plan.name) for plan in attempt.plans}
            runs = self._backend.launch(attempt, launches)
            runs = [r.model_copy(update={"log_start": starts.get(r.name, 0)}) for r in runs]
        except Exception as exc:  # the job cannot start: it fails, the queue goes on
            self.failed(job, placement, exc)
            return
        self._ledger.placements[job.id] = placement
        where = ", ".join(f"{r.name}@{r.host}" for r in runs)
        # the batch tasks that succeeded earlier keep their record beside this attempt's
        launched = {r.name for r in runs}
        kept = [r for r in job.nodes if r.name not in launched] if job.spec.type.value == "batch" else []
        updates = {
            "nodes": sorted(kept + runs, key=lambda r: r.index) if kept else runs,
            "chosen_spec": placement.spec.name,
            "workspace_isolation": self._backend.isolation(),
        }
        if job.started_at is None:
            updates["started_at"] = utcnow()
        job = job.model_copy(update=updates)
        resumed = f" (attempt {job.attempt + 1})" if job.attempt else ""
        self._journal.transition(
            job, JobStatus.running, f"running on spec {placement.spec.name}{resumed}: {where}"
        )
        for folder in changed:
            self._journal.notice(
                job,
                f"the algorithm folder {folder} changed since the submit: the job runs what it holds "
                "now (search by algorithm finds it under that content)",
            )
        for folder in unread:
            self._journal.notice(
                job,
                f"the algorithm folder {folder} changed since the submit by more than "
                f"{algorithms.AT_START_READ_LIMIT >> 20} MB of files: its content was not read again "
                "at the start, so the job's algorithm_digest is unknown",
            )
        running, elastic = policies.workers(placement.tasks), job.spec.checkpoint_resume
        if elastic and elastic.elastic_min_nodes and running < job.spec.nodes:
            self._ledger.shrunk_since[job.id] = time.monotonic()
            then = (
                "it scales up when nodes free"
                if elastic.allow_scale_up
                else "it keeps them until it ends (allow_scale_up is off)"
            )
            self._journal.notice(
                job,
                f"started with {running} of {job.spec.nodes} nodes (elastic, at least "
                f"{elastic.elastic_min_nodes}): {then}",
            )
        if self._backend.isolation() == "symlink":
            self._journal.notice(
                job,
                "bubblewrap is missing: /workspace is a symlink tree at $MA_WORKSPACE; "
                "read-only mounts are not enforced (install bubblewrap for real isolation)",
            )

    def read_then_launch(self, job: Job, placement: Placement, prepared: Prepared | None) -> None:
        """The first-start read of ``job``'s folders used as is, on a thread of its own (no
        lock held: a submit or a stop of another job never waits for it), then its launch under
        the lock with what was read; a job stopped or gone meanwhile frees its placement."""
        try:
            account = algorithms.account_of(self._backend.job_account(job.spec.creator))
            read: algorithms.Started | Exception = algorithms.at_start(job.spec, account)
        except Exception as exc:  # noqa: BLE001 (the job fails with it, under the lock)
            read = exc
        with self._ledger.lock:
            self._ledger.reading.pop(job.id, None)
            try:
                try:
                    current = self._store.get(job.id)
                except NotFound:
                    current = None
                if current is None or current.status is not JobStatus.queued or self._ledger.halt.is_set():
                    self.free(placement)  # stopped or deleted while it was read, or the service stops
                    return
                if isinstance(read, Exception):
                    self._watching.guarded(current, lambda now: self.failed(now, placement, read))
                else:
                    self._watching.guarded(
                        current, lambda now: self.launch(now, placement, prepared=prepared, read=read)
                    )
            except Exception:  # noqa: BLE001 (this thread is the placement's only holder)
                # never leave the nodes held by a thread that ended: free them, say why, and
                # let the next admission pass take the job again
                log.exception("the launch of job %s after its first-start read failed", job.id)
                self.free(placement)
            finally:
                self._ledger.queue_changed()

    def failed(self, job: Job, placement: Placement, exc: Exception, prefix: str = "") -> None:
        """A launch that raised: free what it reserved; the job fails with the reason (or, on a
        full disk, keeps its place in the queue: :meth:`hold_for_space` raises DiskFull)."""
        self._backend.release(placement)
        message = prefix + policies.launch_failure(exc, config.jobdir(job.id).root)
        if policies.is_disk_full(exc):
            self.hold_for_space(job, message)  # raises DiskFull: it stays queued
        self._store.set_placement(job.id, None)
        self._ledger.queue_changed()
        log.warning("job %s failed to launch: %s", job.id, message)
        self._journal.transition(job, JobStatus.error, f"could not start: {message}")

    def hold_for_space(self, job: Job, message: str) -> None:
        """A launch that met a full disk: the job keeps its place in the queue, says why once
        (when the store can still record it), and admission tries it again later (DiskFull goes
        to :meth:`.watching.Watching.guarded`)."""
        try:
            self._store.set_placement(job.id, None)
            if self._ledger.waiting_noted.get(job.id) != "disk_full":
                self._journal.notice(job, f"waiting: {message}; it starts once there is space again")
                self._ledger.waiting_noted[job.id] = "disk_full"
        except DiskFull:
            pass  # the store's own disk is full: nothing can be said now
        self._ledger.queue_changed()
        raise DiskFull(message)

    # ------------------------------------------------- data preparation gives the job back

    def launch_prepared(self, job: Job, placement: Placement, prepared: Prepared) -> None:
        self._watching.guarded(job, lambda current: self.launch(current, placement, prepared=prepared))

    def prepared_failed(self, job: Job, placement: Placement, error: Exception, prefix: str) -> None:
        # which releases the placement first; DiskFull (a full disk) goes to guarded
        self._watching.guarded(job, lambda current: self.failed(current, placement, error, prefix))
        if policies.is_disk_full(error) and job.id in self._ledger.retry_at:
            # a look at the whole dataset each time: not every few seconds
            self._ledger.retry_admission(self._ledger.hold_off(job.id, PREPARE_SPACE_RETRY))

    def retry_later(self, job_id: str) -> None:
        self._ledger.retry_admission(self._ledger.hold_off(job_id, RECORD_RETRY))

    def free(self, placement: Placement) -> None:
        self._backend.release(placement)
        self._ledger.queue_changed()
