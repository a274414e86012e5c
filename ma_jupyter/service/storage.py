"""Object storage as a job's datasets, models and outputs, the service's side of it (the
transfers themselves are ``ma_jupyter/objectstore.py``'s).

Rules:

1. At the submit, every ``s3://`` or ``obs://`` path of the spec is checked with the user's own
   credentials (``JobSpec.storage_credentials``), each within
   :data:`~ma_jupyter.objectstore.CHECK_TIMEOUT`, :data:`CHECKS_AT_ONCE` at a time, all within
   :data:`SUBMIT_CHECK_TIMEOUT`: a dataset's or model's prefix must exist and be
   readable, an outputs prefix's bucket listable; a refusal names the field, the bucket and why.
2. The credentials live in the job's secrets row (``Store.storage_secrets``); only data
   preparation's downloads and the outputs' uploads read them, and the job's own environment
   gets them only with ``storage_env``.
3. The endpoint: the user's ``AWS_ENDPOINT_URL``, else for ``obs://`` the cluster's
   ``[storage] obs_endpoint`` (``config.load_storage``).
4. Outputs in object storage: the nodes write to the job folder's ``outputs/``
   (``config.outputs_folder``).  Before each attempt starts, that folder gets the prefix's
   current content (data preparation: :func:`download_outputs`); while the job runs its changed
   files are uploaded every ``[storage] upload_interval`` seconds (:class:`Uploads`, off every
   lock); once an attempt's nodes have stopped (its end, or a stop whose grace period let the
   job write a checkpoint) what changed is uploaded before the end is recorded (strictly after
   every earlier upload of the job: one runs at a time, and a periodic one in progress starts no
   more puts, those in flight ending within their request timeout): a job succeeds
   only after that upload, and a failed one is the job's error, with the reason.
5. A stop with a grace period (the user's stop, a checkpoint resume's requeue, a reschedule):
   from the stop signal until the nodes have stopped, what the job writes is uploaded in rounds
   :data:`GRACE_ROUND` seconds apart (:meth:`Uploads.stopping`), so a checkpoint written on
   SIGTERM is in the bucket seconds later, before the grace period ends, even if the machine is
   lost before the final upload of rule 4.  A resumed attempt finds it there (rule 4's download).
"""

from __future__ import annotations

import functools
import logging
import os
import stat
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path

from .. import config, foldersize, objectstore
from ..errors import FolderRefused, InvalidSpec
from ..models import Job, JobSpec, is_object_uri

log = logging.getLogger("ma_jupyter.supervisor")

#: seconds between two upload rounds of a stopping job's outputs during its grace period (rule
#: 5): a round that finds nothing changed costs one walk of the outputs folder
GRACE_ROUND = 1.0
#: seconds a submit's object storage checks (rule 1) take at most, all of them together
SUBMIT_CHECK_TIMEOUT = 30.0
#: object storage checks of one submit run at the same time at most
CHECKS_AT_ONCE = 4
#: seconds past the grace period after which the rounds end even without :meth:`Uploads.final`
#: (a stop that failed before it: the rounds never run on without bound)
GRACE_MARGIN = 300.0


def endpoint(uri: objectstore.ObjectURI, credentials: dict[str, str]) -> str | None:
    """Rule 3; the user's endpoint and region are checked (``objectstore.check_endpoint``: no
    loopback, link-local or private address unless ``[storage] allow_endpoints`` names it).

    Raises:
        InvalidSpec: the endpoint or region is refused.
    """
    storage = config.load_storage()
    # the administrator's endpoints connect without the guard (objectstore rule 5); the user's,
    # checked here, are checked again at each connection
    objectstore.trust_endpoints((*storage.allow_endpoints, storage.obs_endpoint or ""), replace=True)
    objectstore.check_endpoint(credentials, storage.allow_endpoints)
    return objectstore.endpoint_of(uri, credentials, storage.obs_endpoint)


def check_paths(spec: JobSpec) -> None:
    """Rule 1 (``spec`` with its credentials' values): at most :data:`CHECKS_AT_ONCE` checks at
    a time, all within :data:`SUBMIT_CHECK_TIMEOUT` (the submit's API thread waits no longer,
    however many prefixes it names and however slowly their endpoint answers).

    Raises:
        InvalidSpec: a path is not a valid URI, or its prefix is missing or unreadable, or the
            checks took longer than :data:`SUBMIT_CHECK_TIMEOUT`.
    """
    checks = Checks(spec)
    try:
        checks.wait()
    finally:
        checks.close()


class Checks:
    """Rule 1's checks of one submit, started at once on threads of their own, so that the
    rest of the submit's validation runs while the endpoint answers (a listing is most of a
    submit's time: about 120 ms on moto for 100 objects).  The submit calls :meth:`wait`
    before it stores the job, and :meth:`close` whatever happened (a check not started never
    starts; one running ends within its own timeout).  The deadline of
    :data:`SUBMIT_CHECK_TIMEOUT` counts from the start.

    Raises (the constructor):
        InvalidSpec: a path is not a valid URI.
    """

    def __init__(self, spec: JobSpec):
        credentials = dict(spec.storage_credentials)
        checks: list[tuple[str, Callable[[], None]]] = []
        for field, mount in spec.object_sources():
            what = f"{field} {mount.name}"
            uri = objectstore.ObjectURI.parse(mount.path, what)
            checks.append((field, functools.partial(_check_source, uri, credentials, what)))
        if is_object_uri(spec.outputs):
            uri = objectstore.ObjectURI.parse(spec.outputs or "", "outputs")
            checks.append(("outputs", functools.partial(_check_outputs, uri, credentials)))
        self._count = len(checks)
        self._deadline = time.monotonic() + SUBMIT_CHECK_TIMEOUT
        self._pool: ThreadPoolExecutor | None = None
        self._futures = []
        if checks:
            self._pool = ThreadPoolExecutor(
                max_workers=min(CHECKS_AT_ONCE, len(checks)), thread_name_prefix="ma-storage-check"
            )
            self._futures = [(field, self._pool.submit(check)) for field, check in checks]

    def wait(self) -> None:
        """Until every check has passed, within the deadline.

        Raises:
            InvalidSpec: a prefix is missing or unreadable (the field, the bucket and why), or
                the checks took longer than :data:`SUBMIT_CHECK_TIMEOUT`.
        """
        for field, future in self._futures:
            try:
                future.result(timeout=max(0.0, self._deadline - time.monotonic()))
            except FutureTimeout:
                raise InvalidSpec(
                    f"{field}: checking the {self._count} object storage path(s) took more than "
                    f"{SUBMIT_CHECK_TIMEOUT:.0f} s: name fewer prefixes, or check that the endpoint answers",
                    field=field,
                ) from None
            except InvalidSpec as exc:
                raise InvalidSpec(str(exc), field=field) from None

    def close(self) -> None:
        """The checks not started never start; those running end within their own timeout."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


def _check_source(uri: objectstore.ObjectURI, credentials: dict[str, str], what: str) -> None:
    objectstore.check_readable(uri, credentials, endpoint(uri, credentials), what)


def _check_outputs(uri: objectstore.ObjectURI, credentials: dict[str, str]) -> None:
    try:  # an empty prefix is fine for outputs: only the bucket must answer
        objectstore.listing(
            uri, credentials, endpoint(uri, credentials), limit=1, timeout=objectstore.CHECK_TIMEOUT
        )
    except objectstore.StorageError as exc:
        if "more than" not in str(exc):
            raise InvalidSpec(f"outputs: {exc}", field="outputs") from None


def download_outputs(job_id: str, spec: JobSpec, credentials: dict[str, str], account) -> int:
    """Rule 4: before an attempt starts, its local outputs folder gets the outputs prefix's
    current content (a resumed or restarted attempt finds its checkpoints), owned by the job's
    account (``account``: a :class:`~ma_jupyter.models.RunAs`, None: the service's); the number
    of objects it holds.

    Raises:
        StorageError: the listing or a download failed.
    """
    uri = objectstore.ObjectURI.parse(spec.outputs or "", "outputs")
    folder = Path(config.outputs_folder(job_id, spec.outputs))
    objects = objectstore.listing(uri, credentials, endpoint(uri, credentials))
    objectstore.download(uri, objects, credentials, endpoint(uri, credentials), folder)
    if account is not None:  # the job writes there: its folders and files are its account's
        try:  # the one bounded walk, no link followed; each entry changed through its folder's fd
            for _path, dir_fd, entries in foldersize.walk([folder], follow_top=False):
                os.fchown(dir_fd, account.uid, account.gid)
                for name, st in entries:
                    if not stat.S_ISLNK(st.st_mode):
                        os.chown(name, account.uid, account.gid, dir_fd=dir_fd, follow_symlinks=False)
        except FolderRefused as exc:
            raise objectstore.StorageError(f"outputs {folder}: {exc}") from None
    return len(objects)


class Uploads:
    """Rule 4's uploads of the running jobs whose outputs go to object storage: at most one
    upload per job at a time, each on a thread of its own (no lock held), the files already put
    remembered per job (``objectstore.upload``'s ``sent``)."""

    def __init__(self, credentials: Callable[[str], dict[str, str]]):
        self._credentials = credentials  # job id -> its storage credentials (the store's)
        self._lock = threading.Lock()
        self._sent: dict[str, dict[str, tuple[int, int]]] = {}
        self._busy: dict[str, threading.Thread] = {}
        self._last: dict[str, float] = {}
        self._stopping: dict[str, threading.Event] = {}  # set: the rounds of rule 5 end
        # one upload of a job at a time, whoever runs it; set: the periodic ones put no more
        self._serial: dict[str, threading.Lock] = {}
        self._interval_read = (-1.0e9, config.StorageConfig().upload_interval)  # (when, seconds)
        self._interval_bad = False
        self._cancel: dict[str, threading.Event] = {}

    def due(self, job: Job) -> None:
        """While ``job`` runs (the watch calls it at each look): an upload of its changed files
        when the last one is ``[storage] upload_interval`` seconds old and none is running."""
        if not is_object_uri(job.spec.outputs):
            return
        now = time.monotonic()
        with self._lock:
            last = self._last.setdefault(job.id, now)
            if job.id in self._busy or now - last < self._interval(now):
                return
            self._last[job.id] = now
            thread = threading.Thread(
                target=self._upload_quietly, args=(job,), name=f"ma-upload-{job.id}", daemon=True
            )
            self._busy[job.id] = thread
        thread.start()

    def _interval(self, now: float) -> float:
        """``[storage] upload_interval``, read at most once a second (not once per job's watch);
        a ``[storage]`` table that is wrong keeps the last good value (at first, the default),
        said once in the log until it is right again, and never raises into a job's watch."""
        if now - self._interval_read[0] >= 1.0:
            try:
                self._interval_read = (now, config.load_storage().upload_interval)
                self._interval_bad = False
            except Exception:  # noqa: BLE001 (the admin's error: logged, each job goes on)
                if not self._interval_bad:  # once until it is right again
                    log.warning(
                        "[storage] of cluster.toml is wrong; uploads keep their interval", exc_info=True
                    )
                self._interval_bad = True
                self._interval_read = (now, self._interval_read[1])
        return self._interval_read[1]

    def _upload_quietly(self, job: Job) -> None:
        try:
            self.upload(job)
        except Exception:  # noqa: BLE001 (the final upload, which must succeed, says why)
            log.warning("job %s: a periodic upload of its outputs failed", job.id, exc_info=True)
        finally:
            self._done(job.id)

    def _done(self, job_id: str) -> None:
        with self._lock:  # only its own entry: the stop's rounds may have taken the place
            if self._busy.get(job_id) is threading.current_thread():
                del self._busy[job_id]

    def stopping(self, job: Job, grace: float) -> None:
        """Rule 5: ``job``'s nodes are being stopped with ``grace`` seconds to wind down (the
        supervisor calls it before the stop signal): upload rounds on a thread of their own,
        after the periodic upload in progress, until :meth:`final`, at most ``grace`` +
        :data:`GRACE_MARGIN` seconds."""
        if not is_object_uri(job.spec.outputs):
            return
        done = threading.Event()
        with self._lock:
            if job.id in self._stopping:
                return
            self._stopping[job.id] = done
            before = self._busy.get(job.id)
            thread = threading.Thread(
                target=self._rounds,
                args=(job, before, done, time.monotonic() + grace + GRACE_MARGIN),
                name=f"ma-upload-stop-{job.id}",
                daemon=True,
            )
            self._busy[job.id] = thread  # no periodic upload meanwhile; final() waits for it
        thread.start()

    def _rounds(self, job: Job, before: threading.Thread | None, done: threading.Event, until: float) -> None:
        try:
            if before is not None:  # one upload at a time: they share the job's notes
                before.join(objectstore.REQUEST_TIMEOUT * 4)
            said = False
            while not done.is_set() and time.monotonic() < until:
                try:
                    self.upload(job)
                except Exception:  # noqa: BLE001 (the final upload, which must succeed, says why)
                    if not said:  # once per stop: a lost bucket would otherwise fill the log
                        log.warning("job %s: an upload during its grace period failed", job.id, exc_info=True)
                        said = True
                done.wait(GRACE_ROUND)
        finally:
            self._done(job.id)
            with self._lock:  # past the bound: a later stop of the job starts rounds again
                if self._stopping.get(job.id) is done:
                    del self._stopping[job.id]

    def upload(self, job: Job, *, final: bool = False) -> int:
        """Put ``job``'s outputs files changed since its last upload; the number put.  One at a
        time per job; a periodic one (not ``final``) puts nothing more once :meth:`final` began.

        Raises:
            StorageError: a put failed (the URI and the reason).
        """
        uri = objectstore.ObjectURI.parse(job.spec.outputs or "", "outputs")
        credentials = self._credentials(job.id)
        with self._lock:
            sent = self._sent.setdefault(job.id, {})
            serial = self._serial.setdefault(job.id, threading.Lock())
            cancel = None if final else self._cancel.setdefault(job.id, threading.Event())
        folder = Path(config.outputs_folder(job.id, job.spec.outputs))
        with serial:
            return objectstore.upload(
                folder, uri, credentials, endpoint(uri, credentials), sent, cancel=cancel
            )

    def final(self, job: Job) -> str | None:
        """The attempt's nodes have stopped: wait for an upload in progress, then upload what
        changed (a checkpoint written on the stop signal too); None, or why it failed (the
        job's error).  The job's notes are forgotten."""
        if not is_object_uri(job.spec.outputs):
            return None
        with self._lock:
            stopping = self._stopping.pop(job.id, None)
            # an upload in progress starts no more puts; this one waits for those in flight
            # (each within its request timeout): it is strictly the last, never overwritten
            self._cancel.setdefault(job.id, threading.Event()).set()
        if stopping is not None:  # rule 5's rounds end after the one in progress
            stopping.set()
        try:
            self.upload(job, final=True)
            return None
        except (objectstore.StorageError, InvalidSpec) as exc:
            return f"its outputs could not be uploaded to {job.spec.outputs}: {exc}"
        finally:
            with self._lock:
                self._sent.pop(job.id, None)
                self._last.pop(job.id, None)
                self._serial.pop(job.id, None)
                self._cancel.pop(job.id, None)
