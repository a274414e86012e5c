"""The supervisor: every job's life after submission.

:class:`Supervisor` is what the REST app and the service's main use; it builds the rooms below,
each given explicitly the shared parts it needs, and forwards its public methods to them.
The decisions themselves (and the order of the checks) are the pure functions of
:mod:`..policies`; the rooms gather the facts they take, under one lock, and carry out what
they return: store writes, backend calls, threads.

==================  =======================================================================
room                concern
==================  =======================================================================
:mod:`.ledger`      the shared state (placements, jobs being wound down, retries, waiting
                    notes, elastic scale-up clocks), the lock, the loop's signals
:mod:`.journal`     every recorded change of a job: transitions, notices, removal
:mod:`.attempts`    the attempt a placement becomes (secrets, prepared datasets, restarts)
:mod:`.loop`        the loop thread and its tick; start, shutdown, recovery after a restart
:mod:`.actions`     users' requests: submit, update, stop, delete; fail a job, clear a cache
:mod:`.forecast`    preflight, ``--dry-run`` plan, start predictions, queue position
:mod:`.admission`   admission passes (queue order, the head's reservation, backfill), usage
:mod:`.launch`      launching an admitted job; launch failures; waiting for disk space
:mod:`.watching`    watching running jobs (ends, failures, performance, full disks), and
                    winding an attempt down (:meth:`.watching.Watching.finish`)
:mod:`.inspection`  drains, node inspections (heartbeats, cards, elastic scale-up), the
                    resume pre-check, the jobs folder's disk reserve
==================  =======================================================================

Data preparation (a job's datasets copied before its launch, on a thread of its own) is
:mod:`..preparation`; the supervisor's reads of a node's log are :mod:`..logs`' byte-reading
functions.

Every decision is derived from durable state (the store, the node exit-code files, pids with
their start times), so a service killed with ``kill -9`` and started again re-attaches to the
jobs that kept running and finishes their bookkeeping (:meth:`.loop.Loop.recover`).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from ... import config
from ...backends.base import Backend
from ...models import CacheInfo, Job, JobSpec, JobStatus, Plan, PreparedData, Priority
from ..health import NodeHealth
from ..notify import Notifier
from ..preparation import Preparation
from ..queue import QueueIndex
from ..resources import ResourceSampler
from ..scheduler import NodeUse, Scheduler
from ..storage import Uploads
from ..store import Store
from ..webhooks import UserWebhooks
from .actions import Actions
from .admission import Admission
from .forecast import Forecast
from .inspection import Inspection
from .journal import Journal
from .launch import Launcher
from .ledger import Ledger
from .loop import Loop
from .watching import Watching

__all__ = ["Supervisor"]


class Supervisor:
    """Owns job state transitions; the REST app calls it, and it calls the backend.

    Public attributes: ``store``, ``scheduler``, ``backend``, ``queue`` (the queued jobs in
    queue order, :mod:`..queue`), ``health`` (drained and faulty nodes), ``resources`` (the
    resource sampler), ``on_job_deleted`` (callbacks(job_id), e.g. stop the job's TensorBoard),
    and the rooms themselves (``ledger``, ``preparation``, ...) for tests that look inside.
    """

    def __init__(self, store: Store, scheduler: Scheduler, backend: Backend):
        self.store = store
        self.scheduler = scheduler
        self.backend = backend
        self.ledger = Ledger()
        # The queued jobs in queue order (the store's, read once here: a restart loses none).
        self.queue = QueueIndex(scheduler.shape)
        self.queue.load(store.by_status(JobStatus.queued))
        self.preparation = Preparation(store, backend, scheduler, self.ledger.lock)
        # drained and faulty nodes; the scheduler places nothing new on them
        self.health = NodeHealth(config.home() / "node_health.json")
        scheduler.unusable = self.health.statuses
        self.resources = ResourceSampler(store, backend)  # its own thread: never slows a tick
        # the administrator's notification hook ([notify] command of cluster.toml), told by
        # the journal of alerts and terminal states; closed at shutdown
        # and each user's own webhook (webhooks.py), read from the store when an event is sent
        self.notifier = Notifier(
            config.load_notify(),
            str(config.home()),
            webhooks=UserWebhooks(store.notify_webhook, allow=config.load_webhook_allow),
            address_of=store.notify_address,
        )
        self.journal = Journal(store, self.queue, backend, self.ledger, self.preparation, self.notifier)
        self.on_job_deleted: list[Callable[[str], None]] = self.journal.on_job_deleted
        self.watching = Watching(
            store, backend, self.health, self.ledger, self.journal, limits=lambda: scheduler.cluster.limits
        )
        self.watching.uploads = Uploads(store.storage_secrets)  # outputs in object storage
        self.inspection = Inspection(
            store, scheduler, backend, self.health, self.queue, self.ledger, self.journal, self.watching
        )
        self.launcher = Launcher(store, backend, self.ledger, self.journal, self.watching, self.preparation)
        self.admission = Admission(
            store,
            scheduler,
            backend,
            self.queue,
            self.ledger,
            self.journal,
            self.preparation,
            self.watching,
            self.inspection,
            self.launcher,
        )
        self.forecast = Forecast(store, scheduler, backend, self.queue, self.ledger, self.admission)
        self.actions = Actions(
            store, backend, self.queue, self.ledger, self.journal, self.watching, self.forecast
        )
        self.loop = Loop(
            store,
            backend,
            self.ledger,
            self.journal,
            self.preparation,
            self.watching,
            self.inspection,
            self.admission,
            self.resources,
        )

    # -------------------------------------------------------------------- lifecycle (.loop)

    def start(self) -> None:
        """Re-attach to jobs left running by a previous service, then run the loop."""
        self.loop.start()

    def shutdown(self) -> None:
        """Stop the loop, then deliver the notifications still waiting (a few seconds at most);
        running jobs keep running (they do not depend on the service)."""
        self.loop.shutdown()
        self.notifier.close()

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """True once no attempt is being wound down, within ``timeout`` seconds."""
        return self.loop.wait_idle(timeout)

    def recover(self) -> None:
        """Take over from a previous service (:meth:`.loop.Loop.recover`)."""
        self.loop.recover()

    def tick(self) -> None:
        """One pass of the loop: watch running jobs, then admit queued ones if asked."""
        self.loop.tick()

    def admit(self) -> int:
        """One admission pass (:meth:`.admission.Admission.admit`); the number of jobs started."""
        return self.admission.admit()

    def usage(self) -> dict[str, NodeUse]:
        """What the jobs this service runs take of the cluster now (the scheduler's usage)."""
        return self.admission.usage()

    # ----------------------------------------------------------------- requests (.actions)

    def submit(
        self,
        spec: JobSpec,
        creator: str | None,
        idempotency_key: str | None = None,
        admit: Callable[[], None] | None = None,
    ) -> Job:
        """Validate and queue a job (:meth:`.actions.Actions.submit`)."""
        return self.actions.submit(spec, creator, idempotency_key, admit)

    def update(
        self,
        job_id: str,
        priority: Priority | None = None,
        duration: float | None = None,
        by: str | None = None,
    ) -> Job:
        """Change a queued job's priority or a running job's duration (:meth:`.actions.Actions.update`)."""
        return self.actions.update(job_id, priority, duration, by)

    def request_stop(self, job_id: str, by: str | None = None) -> Job:
        """Stop a job (:meth:`.actions.Actions.request_stop`)."""
        return self.actions.request_stop(job_id, by)

    def delete(self, job_id: str, force: bool = False, by: str | None = None) -> bool:
        """Delete a job; False when it will be once stopped (:meth:`.actions.Actions.delete`)."""
        return self.actions.delete(job_id, force, by)

    def fail_job(self, job_id: str, reason: str) -> None:
        """End a live job in error for what it did (:meth:`.actions.Actions.fail_job`)."""
        self.actions.fail_job(job_id, reason)

    def clear_cache(self, user: str) -> CacheInfo:
        """Empty a user's persistent cache (:meth:`.actions.Actions.clear_cache`)."""
        return self.actions.clear_cache(user)

    # ------------------------------------------------------------------ forecasts (.forecast)

    def plan(self, spec: JobSpec) -> Plan:
        """What each node would run, creating nothing (:meth:`.forecast.Forecast.plan`)."""
        return self.forecast.plan(spec)

    def queue_position(self, job_id: str) -> int | None:
        """How many queued jobs come before this one; None if it is not queued."""
        return self.forecast.queue_position(job_id)

    def estimated_start(self, job_id: str) -> datetime | None:
        """When a queued job should start (:meth:`.forecast.Forecast.estimated_start`)."""
        return self.forecast.estimated_start(job_id)

    # --------------------------------------------------------------- nodes (.inspection)

    def drain(self, node: str, reason: str | None = None, by: str | None = None) -> None:
        """Take ``node`` out of placement (:meth:`.inspection.Inspection.drain`)."""
        self.inspection.drain(node, reason, by)

    def undrain(self, node: str) -> None:
        """Put ``node`` back into placement (:meth:`.inspection.Inspection.undrain`)."""
        self.inspection.undrain(node)

    # ---------------------------------------------------------- prepared data (..preparation)

    def prepared_data(self, user: str | None) -> list[PreparedData]:
        """The prepared copies, after a sweep (:meth:`..preparation.Preparation.entries`)."""
        return self.preparation.entries(user)

    def remove_prepared(self, key: str, user: str | None) -> PreparedData:
        """Remove one prepared copy now (:meth:`..preparation.Preparation.remove`)."""
        return self.preparation.remove(key, user)

    def sweep_prepared(self) -> list[str]:
        """Remove the prepared data past its retention; the keys removed."""
        return self.preparation.sweep()
