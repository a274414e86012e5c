"""Every recorded change of a job: a transition, a notice, its removal.

Rules:

1. :meth:`Journal.transition` refuses a status change the model forbids (``Conflict``), then,
   in this order: saves the job with its event; lets data preparation go of a job that ended
   (its copy cancelled, its retention started); keeps the queue index in step with the store
   (an attempt put back in the queue keeps its place; a queued job stopped, deleted or failed
   leaves it), asking for an admission pass when the queue changed.
2. :meth:`Journal.notice` adds an event without changing the status; :meth:`Journal.backend_notice`
   is the backend's way to it, from any thread (a deleted job gets none; a full disk loses it
   with a warning in the service's log).
3. What is worth telling goes to the administrator's notification hook (:mod:`..notify`), after
   it was recorded: every terminal state a transition records (``ended``); every notice that
   is an alert, a job rescheduled for its performance (:meth:`Journal.tell_alert`) and a node
   marked faulty (:meth:`Journal.node_alert`) (``alert``).
4. :meth:`Journal.remove` forgets a terminal job: the ``on_job_deleted`` callbacks first (e.g. its
   TensorBoard), then what the backend keeps (it reads the job's folder), then its folder
   (moved aside at once, before its rows go, so a job that reads as gone has no folder under
   its id; deleted on a thread: a big folder takes a while), then its rows and its place in
   the queue.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

from ... import config
from ...backends.base import Backend
from ...errors import Conflict, DiskFull, NotFound
from ...foldersize import remove_tree
from ...models import Event, Job, JobStatus
from ..notify import Notifier
from ..preparation import Preparation
from ..queue import QueueIndex
from ..store import Store
from .ledger import Ledger

log = logging.getLogger("ma_jupyter.supervisor")


class Journal:
    """Writes a job's changes to the store (callers hold the ledger's lock, but for rule 2's
    backend notices)."""

    def __init__(
        self,
        store: Store,
        queue: QueueIndex,
        backend: Backend,
        ledger: Ledger,
        preparation: Preparation,
        notifier: Notifier | None = None,
    ):
        self._store = store
        self._queue = queue
        self._backend = backend
        self._ledger = ledger
        self._preparation = preparation
        #: the administrator's notification hook (rule 3); one without a command tells nothing
        self.notifier = notifier or Notifier(None, str(config.home()))
        self.on_job_deleted: list[Callable[[str], None]] = []  # callbacks(job_id), rule 4

    def transition(
        self,
        job: Job,
        status: JobStatus,
        reason: str,
        *,
        node: str | None = None,
        exit_code: int | None = None,
        by: str | None = None,
        clear: tuple[str, ...] = (),
    ) -> Job:
        """Rule 1; the job as saved (``clear``: the attempt's notes emptied in the same write,
        :meth:`..store.Store.save`)."""
        if job.status is not status and not job.status.can_become(status):
            raise Conflict(f"job {job.id} cannot go from {job.status.value} to {status.value}")
        job = job.model_copy(update={"status": status, "reason": reason.splitlines()[0] if reason else ""})
        self._store.save(
            job,
            Event(job_id=job.id, status=status, reason=reason, node=node, exit_code=exit_code, by=by),
            clear=clear,
        )
        if status.is_terminal():
            # the end is recorded: a failure of what it sets off (a data copy's release on a
            # full disk, the notification hook) is logged, never taken for the end's own
            try:
                self._preparation.ended(job)
                self._tell("ended", job, status, reason, node)
            except Exception:
                log.exception("job %s ended; what its end sets off failed", job.id)
        if status is JobStatus.queued:
            self._queue.put(job)
            self._ledger.queue_changed()
        elif self._queue.discard(job.id) and status is not JobStatus.running:
            self._ledger.queue_changed()  # a queued job stopped, deleted or failed
        return job

    def notice(
        self, job: Job, reason: str, *, node: str | None = None, alert: bool = False, by: str | None = None
    ) -> None:
        """Rule 2: an event of ``job`` in its current status (an alert is told, rule 3)."""
        self._store.add_event(
            Event(job_id=job.id, status=job.status, reason=reason, node=node, alert=alert, by=by)
        )
        if alert:
            self._tell("alert", job, job.status, reason, node)

    def tell_alert(self, job: Job, reason: str, node: str | None = None) -> None:
        """Rule 3 for an alert whose record is a transition of its own (a job rescheduled away
        from a slow node): told, with no event of its own."""
        self._tell("alert", job, job.status, reason, node)

    def node_alert(self, node: str, reason: str) -> None:
        """Rule 3: a node was marked faulty (told with no job: ``job`` and ``name`` empty)."""
        self.notifier.notify("alert", job="", name="", user=None, status="faulty", reason=reason, node=node)

    def _tell(self, kind: str, job: Job, status: JobStatus, reason: str, node: str | None) -> None:
        self.notifier.notify(
            kind,
            job=job.id,
            name=job.spec.name,
            user=job.spec.creator,
            status=status.value,
            reason=reason,
            node=node,
        )

    def backend_notice(self, job_id: str, node: str | None, reason: str) -> None:
        """Rule 2: an event for what the backend learned by itself about a job (from a backend
        thread)."""
        try:
            job = self._store.get(job_id)
        except NotFound:
            return
        try:
            self.notice(job, reason, node=node)
        except DiskFull:
            log.warning("job %s: cannot record %r: the disk is full", job_id, reason)

    def remove(self, job_id: str) -> None:
        """Rule 4."""
        for callback in self.on_job_deleted:
            callback(job_id)
        self._backend.forget(job_id)  # what it keeps elsewhere; reads the job's folder first
        # the folder leaves its name before the row goes: whoever learns the job is gone (a 404)
        # finds no folder under its id either
        folder = config.jobdir(job_id).root
        doomed = config.jobdir(job_id).doomed()
        try:
            os.rename(folder, doomed)
        except OSError:
            doomed = folder
        self._store.delete(job_id)
        self._queue.discard(job_id)
        threading.Thread(target=remove_folder, args=(doomed,), daemon=True).start()


def remove_folder(path: str | os.PathLike) -> None:
    """Remove a deleted job's folder, whatever its job made in it (a chain of folders of any
    depth: :func:`ma_jupyter.foldersize.remove_tree`); what could not go is logged, never
    raised (a removal runs on a thread of its own)."""
    done = remove_tree(path)
    if not done.complete:
        log.warning(
            "removing %s left %d entries: %s",
            path,
            done.failures,
            "; ".join(f"{p}: {why}" for p, why in done.failed),
        )


def call_reason(reason: str | Callable[[], str]) -> str:
    """The text of a reason given as text or as a function (whose failure must not lose the event)."""
    if not callable(reason):
        return reason
    try:
        return reason()
    except Exception as exc:  # reading the job's files failed: still record why the job ended
        log.exception("building a job's reason failed")
        return f"(the reason could not be read: {type(exc).__name__}: {exc})"
