"""Data preparation of a job's launch: its datasets copied into the prepared store first.

A job with ``data_preparation`` reads its (read-only) datasets from copies kept by
:class:`~.prepared.PreparedStore` (``service/prepared.py``: keys, reuse, retention, removal).
This module is the supervisor's side of it: when such a job is admitted, its launch has two
steps, and :class:`Preparation` owns the jobs between them.

Rules, in order:

1. **Under the supervisor's lock** (the caller holds it), the launch dry-runs the job's spec as
   given (its own mount rules on the sources: a copy shared with other jobs is handed only to
   a job that may mount its source) and calls :meth:`Preparation.start`, which keeps the job's
   reserved placement and starts a thread; that the data is being prepared is said once it has
   taken :data:`SAY_PREPARING_AFTER` seconds (a copy reused at once writes no event before the
   launch: a cached dataset's start waits for no extra write of the store).
2. **Off every lock**, on that thread (``ma-prepare-<job id>``), each dataset gets its copy
   from the store (reused when the source has not changed since a job last copied it).  The
   job stays queued meanwhile: admission passes it by (:meth:`Preparation.is_preparing`), its
   nodes count as used (:meth:`Preparation.placements`, :meth:`Preparation.reserved`), so no
   submit, stop or request waits for a copy.  A copy that would eat into the jobs folder's
   disk reserve waits (:meth:`Preparation.room_for_copy`).
3. **Under the supervisor's lock again**, the thread forgets the job and, in this order:
   a job gone, no longer queued, or whose copy was cancelled lets go of its copies and frees its
   nodes; a copy that failed is handed to :meth:`Handback.prepared_failed` (a full disk holds the
   job in the queue, anything else fails it); otherwise the job is handed to
   :meth:`Handback.launch_prepared`.  If that step itself fails (the store cannot be read),
   the nodes are freed unless the launch already took them, and admission tries the job
   again later (:meth:`Handback.retry_later`).
4. A terminal transition of the job (:meth:`Preparation.ended`: stopped or deleted while copying)
   cancels its copy, and its copies' retention starts; a service shutting down cancels every
   copy (:meth:`Preparation.cancel_all`; the sweep removes what is left).
5. The launch links each dataset of the job's folder to its copy (:meth:`Preparation.link`),
   which the nodes mount read-only (the local backend's mount rules let only such a link skip
   the checks that rule 1 ran on the source).
6. A backend whose machines share no disk with the service (the Ray backend,
   ``Backend.fetch_objects``) downloads the datasets and models in object storage itself, on
   each machine of the placement into that machine's cache, and links them in the job folder
   there; the outputs prefix's content too, into each machine's outputs folder.  This service
   then downloads only the outputs prefix into its own outputs folder (rule 2's download, for
   TensorBoard and the uploads, ``service/storage.py``).
7. A job whose next attempt starts with this service's copy of its outputs folder on its nodes'
   machines (``Backend.seeds_outputs``, contract rule 30: the Ray backend's resumed or
   restarted attempt, whose Ray nodes do not share that folder) goes through the same steps:
   after rule 6, the backend writes the copy there (``Backend.seed_outputs``), keeping the disk
   reserve free on each machine; a copy that fails is handed back as a failed one (rule 3).
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from .. import config, objectstore
from ..backends.base import Backend, ObjectFetch
from ..errors import DiskFull, InvalidSpec, NotFound
from ..models import Event, Job, JobSpec, JobStatus, PreparedData, is_object_uri
from ..modes.base import Placement
from . import storage
from .disk import free_bytes
from .prepared import Acquired, PreparedStore, retention
from .scheduler import Running, Scheduler
from .store import Store

log = logging.getLogger("ma_jupyter.supervisor")

PREPARED_SWEEP_EVERY = 30.0  # seconds between sweeps of prepared data past its retention
PROGRESS_EVERY = 2.0  # seconds between two events of a download's progress
#: seconds a job's data preparation takes before its "preparing data" event is written
SAY_PREPARING_AFTER = 0.5

#: what a job's copies are: (dataset name, the link in its job folder, what the store gave)
Prepared = list[tuple[str, Path, Acquired]]


def prepared_path(job_id: str, dataset, kind: str = "") -> Path:
    """Where a job's folder links one of its datasets (or, ``kind`` "model-", models) to its
    prepared copy."""
    version = dataset.version or ""
    return config.jobdir(job_id).prepared_dataset(kind + dataset.source.value, dataset.name, version)


class Handback(Protocol):
    """What a preparation hands its job back to (rule 3), always under the supervisor's lock."""

    def launch_prepared(self, job: Job, placement: Placement, prepared: Prepared) -> None:
        """Launch the job, its data ready; the launch now owns ``placement``."""

    def prepared_failed(self, job: Job, placement: Placement, error: Exception, prefix: str) -> None:
        """A copy failed: free ``placement``; the job fails, or waits for space (a full disk)."""

    def retry_later(self, job_id: str) -> None:
        """Ending the preparation failed: admission tries the job again later."""

    def free(self, placement: Placement) -> None:
        """Release the nodes reserved for the job (the queue may move)."""


@dataclass(frozen=True)
class _Preparing:
    """A queued job whose data is being copied: its reserved nodes, and what cancels the copy."""

    placement: Placement
    spec: JobSpec
    cancel: threading.Event
    said: _Saying
    saying: threading.Lock  # the "preparing data" event: written whole or not at all
    seed: bool = False  # rule 7: the outputs folder carried to the nodes' machines


@dataclass
class _Saying:
    """Whether the "preparing data" event was written, or is no longer to be (rule 3 began)."""

    done: bool = False
    timer: threading.Timer | None = None


class Preparation:
    """The jobs whose data is being copied, and the prepared store they copy into.

    ``lock`` is the supervisor's: the calls that change what is being prepared (:meth:`start`,
    :meth:`ended`) come under it, and rule 3 takes it; the copies never run under it.
    """

    def __init__(self, store: Store, backend: Backend, scheduler: Scheduler, lock: threading.RLock):
        self._store = store
        self._backend = backend
        self._scheduler = scheduler  # its cluster's [limits] disk_reserve_mb, read at each copy
        self._lock = lock
        self.copies = PreparedStore()  # data preparation's copies, shared between jobs
        self._preparing: dict[str, _Preparing] = {}
        self._swept = 0.0  # monotonic time of the last sweep of expired prepared data

    # ------------------------------------------------------------ the jobs being prepared

    def start(self, job: Job, placement: Placement, handback: Handback) -> None:
        """Rule 1, after the caller's dry run: keep the placement, copy on a thread; say so once
        the copy has taken :data:`SAY_PREPARING_AFTER` seconds (a copy reused at once, as a
        cached dataset's, costs the start no event written)."""
        seed = self._backend.seeds_outputs(job)  # rule 7
        names = ", ".join(
            [d.name for d in job.spec.datasets + job.spec.models] + (["outputs"] if seed else [])
        )
        prep = _Preparing(placement, job.spec, threading.Event(), _Saying(), threading.Lock(), seed)
        self._preparing[job.id] = prep

        def say() -> None:
            with prep.saying:  # not once the thread has handed the job on (rule 3)
                if not prep.said.done:
                    prep.said.done = True
                    try:
                        self._store.add_event(
                            Event(
                                job_id=job.id,
                                status=job.status,
                                reason=f"preparing data ({names}): it starts once the data is copied",
                            )
                        )
                    except Exception:  # noqa: BLE001 (a note only: the preparation goes on)
                        log.warning("job %s: its preparing data event was not written", job.id, exc_info=True)

        prep.said.timer = threading.Timer(SAY_PREPARING_AFTER, say)
        prep.said.timer.daemon = True
        prep.said.timer.start()
        threading.Thread(
            target=self._copy_then_launch,
            args=(job.id, prep, handback),
            name=f"ma-prepare-{job.id}",
            daemon=True,
        ).start()

    def is_preparing(self, job_id: str) -> bool:
        """Whether the job's data is being copied (its nodes reserved, admission passes it by)."""
        return job_id in self._preparing

    def placements(self) -> list[Placement]:
        """The nodes reserved for the jobs being prepared: they count as used."""
        return [p.placement for p in list(self._preparing.values())]  # one step: safe off the lock

    def reserved(self) -> list[Running]:
        """The jobs being prepared as running ones, each ending at now plus its duration (they
        start once their data is copied)."""
        return [
            Running(prep.placement, time.time() + prep.spec.duration if prep.spec.duration else None)
            for prep in self._preparing.values()
        ]

    def ended(self, job: Job) -> None:
        """Rule 4: a data-preparation job's terminal transition was recorded (under the lock)."""
        preparing = self._preparing.get(job.id)
        if preparing is not None:
            preparing.cancel.set()  # its copy ends (rule 7's too); the thread then frees its nodes
        if job.spec.prepares_data():
            self.copies.release(job.id)  # its retention starts now

    def cancel_all(self) -> None:
        """Rule 4: no copy goes on without its service (the sweep removes what it left)."""
        for prep in list(self._preparing.values()):
            prep.cancel.set()

    def _copy_then_launch(self, job_id: str, prep: _Preparing, handback: Handback) -> None:
        """Rules 2 and 3, on the job's own thread."""
        got: Prepared = []
        error: Exception | None = None
        failed = ""
        try:
            failed = "object storage: "
            on_nodes = self._fetch_on_nodes(job_id, prep)  # rule 6
            for field, d in [("dataset", d) for d in prep.spec.datasets] + [
                ("model", m) for m in prep.spec.models
            ]:
                failed = f"{field} {d.name}: "
                if is_object_uri(d.path) and on_nodes:
                    continue  # on the nodes' own machines, linked in their job folders there
                if is_object_uri(d.path):
                    acquired = self._download(job_id, prep, field, d)
                elif field == "dataset" and prep.spec.data_preparation:
                    acquired = self.copies.acquire(
                        job_id, d.path, prep.spec.creator, self._backend, prep.cancel, self.room_for_copy
                    )
                else:
                    continue
                got.append(
                    (
                        f"{field} {d.name}",
                        prepared_path(job_id, d, "model-" if field == "model" else ""),
                        acquired,
                    )
                )
            if is_object_uri(prep.spec.outputs):  # a resumed attempt starts with its checkpoints
                failed = "outputs: "
                account = self._backend.job_account(prep.spec.creator)
                found = storage.download_outputs(
                    job_id, prep.spec, self._store.storage_secrets(job_id), account
                )
                if found:
                    self._store.add_event(
                        Event(
                            job_id=job_id,
                            status=JobStatus.queued,
                            reason=f"outputs: {found} object(s) of {prep.spec.outputs} downloaded into the outputs folder",
                        )
                    )
            if prep.seed:  # rule 7
                failed = "outputs: "
                self._backend.seed_outputs(
                    job_id,
                    list(dict.fromkeys(task.host for task in prep.placement.tasks)),
                    self._backend.job_account(prep.spec.creator),
                    int(self._scheduler.cluster.limits.disk_reserve_mb * (1 << 20)),
                    prep.cancel,
                    lambda line: self._store.add_event(
                        Event(job_id=job_id, status=JobStatus.queued, reason=line)
                    ),
                )
        except Exception as exc:
            error = exc
        with prep.saying:  # a copy that took less than SAY_PREPARING_AFTER needs no saying
            prep.said.done = True
            if prep.said.timer is not None:
                prep.said.timer.cancel()
        with self._lock:
            self._preparing.pop(job_id, None)
            handed = False  # whether the placement went to a step that releases it itself
            try:
                try:
                    job = self._store.get(job_id)
                except NotFound:
                    job = None
                if job is None or job.status is not JobStatus.queued or prep.cancel.is_set():
                    self.copies.release(job_id)
                    return
                handed = True
                if error is not None:
                    handback.prepared_failed(job, prep.placement, error, failed)
                    return
                handback.launch_prepared(job, prep.placement, got)
            except Exception:  # the store could not be read: admission tries the job again later
                log.exception("job %s: ending its data preparation failed", job_id)
                handback.retry_later(job_id)
            finally:
                if not handed:
                    handback.free(prep.placement)

    def _fetch_on_nodes(self, job_id: str, prep: _Preparing) -> bool:
        """Rule 6: the job's datasets, models and outputs prefix in object storage downloaded
        by the backend on its nodes' machines (contract rule 29); whether it did (False: this
        service downloads them here)."""
        fetches = []
        for field, d in [("datasets", d) for d in prep.spec.datasets] + [
            ("models", m) for m in prep.spec.models
        ]:
            if is_object_uri(d.path):
                link = prepared_path(job_id, d, "model-" if field == "models" else "")
                fetches.append(
                    (f"{field} {d.name}", d.path, str(link.relative_to(config.jobdir(job_id).root)))
                )
        if is_object_uri(prep.spec.outputs):
            fetches.append(("outputs", prep.spec.outputs or "", "outputs"))
        if not fetches:
            return False
        credentials = self._store.storage_secrets(job_id)
        # each Ray node keeps the reserve free on its own disk, as this machine's copies do
        reserve = int(self._scheduler.cluster.limits.disk_reserve_mb * (1 << 20))
        # and their caches' retention is this store's (backends/ray/objects.py rule 4)
        try:
            keep: float | None = retention()
        except InvalidSpec as exc:  # as this store's own sweep: nothing removed for its age
            log.warning("the Ray nodes' object storage caches keep their copies: %s", exc)
            keep = None
        made = []
        for what, path, into in fetches:
            uri = objectstore.ObjectURI.parse(path, what)
            at = storage.endpoint(uri, credentials)
            made.append(ObjectFetch(what, path, at, into, not objectstore.guarded(at), reserve, keep))

        def say(line: str) -> None:
            self._store.add_event(Event(job_id=job_id, status=JobStatus.queued, reason=line))

        return self._backend.fetch_objects(
            job_id,
            list(dict.fromkeys(task.host for task in prep.placement.tasks)),
            made,
            credentials,
            self._backend.job_account(prep.spec.creator),
            prep.cancel,
            say,
        )

    def _download(self, job_id: str, prep: _Preparing, field: str, mount) -> Acquired:
        """One dataset or model in object storage into the prepared store, with the job's
        storage credentials; its progress (bytes, objects, rate) as events, at most one every
        :data:`PROGRESS_EVERY` seconds."""
        credentials = self._store.storage_secrets(job_id)
        uri = objectstore.ObjectURI.parse(mount.path, f"{field} {mount.name}")

        def say(line: str) -> None:
            self._store.add_event(Event(job_id=job_id, status=JobStatus.queued, reason=line))

        progress = objectstore.ProgressLines(f"{field} {mount.name}", uri, say, PROGRESS_EVERY)
        return self.copies.acquire_objects(
            job_id,
            uri,
            credentials,
            storage.endpoint(uri, credentials),
            prep.spec.creator,
            prep.cancel,
            self.room_for_copy,
            progress,
        )

    def room_for_copy(self, size: int, copying: int) -> None:
        """Whether the prepared store's disk can take a copy of ``size`` bytes now, besides the
        ``copying`` bytes of the copies in progress: on the jobs folder's disk, the copy must
        leave the disk reserve free (the reserve's watch ends only running jobs, never a copy).

        Raises:
            DiskFull: not now (the job waits in the queue, as a launch on a full disk).
            InvalidSpec: never: the disk, even empty, could not take it above the reserve.
        """
        store = self.copies.root if self.copies.root.is_dir() else self.copies.root.parent
        jobs = config.jobs_root()
        try:
            usage = shutil.disk_usage(store)
            same = os.stat(store).st_dev == os.stat(jobs).st_dev if jobs.is_dir() else True
        except OSError:
            return  # unknown: the copy's own ENOSPC still holds the job
        reserve = int(self._scheduler.cluster.limits.disk_reserve_mb * (1 << 20)) if same else 0
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

    def link(self, job: Job, prepared: Prepared) -> None:
        """Rule 5: the job's folder gets a symlink per dataset to its copy, each said as an event."""
        for name, link, acquired in prepared:
            link.parent.mkdir(parents=True, exist_ok=True)
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(acquired.path)
            size = f"{acquired.bytes / 1e6:.1f} MB"
            reason = (
                f"{name}: prepared data reused ({size})"
                if acquired.reused
                else f"{name}: prepared {size} in {acquired.seconds:.2f} s"
            )
            self._store.add_event(Event(job_id=job.id, status=job.status, reason=reason))

    # --------------------------------------------------------------- the prepared copies

    def _live(self, job_id: str) -> bool:
        """Whether a job still holds its prepared data (it is queued or running)."""
        try:
            return self._store.get(job_id).status in (JobStatus.queued, JobStatus.running)
        except NotFound:
            return False

    def sweep_if_due(self) -> None:
        """A sweep (:meth:`sweep`) when the last one is ``PREPARED_SWEEP_EVERY`` seconds old."""
        if time.monotonic() - self._swept >= PREPARED_SWEEP_EVERY:
            self.sweep()

    def sweep(self) -> list[str]:
        """Remove the prepared data unused for longer than the retention; the keys removed."""
        self._swept = time.monotonic()
        try:
            return self.copies.sweep(self._live)
        except Exception:  # a bad [data] table or an unreadable entry must not stop supervision
            log.exception("sweeping prepared data failed")
            return []

    def entries(self, user: str | None) -> list[PreparedData]:
        """The prepared copies (``user``: only those a job of theirs took), after a sweep.

        Raises:
            InvalidSpec: ``[data] retention`` of ``cluster.toml`` is not a duration.
        """
        self._swept = time.monotonic()
        self.copies.sweep(self._live)
        return self.copies.entries(self._live, user)

    def remove(self, key: str, user: str | None) -> PreparedData:
        """Remove one prepared copy now (``user``: only one a job of theirs took).

        Raises:
            NotFound: no such copy (for this user).
            Conflict: a queued or running job uses it.
        """
        return self.copies.remove(key, self._live, user)
