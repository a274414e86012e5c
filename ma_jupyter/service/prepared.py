"""Prepared data: the copies data preparation makes of datasets, kept and shared between jobs.

A job with ``data_preparation`` reads its (read-only) datasets from copies on the service's
machine instead of their sources.  The copies live in one store, ``<home>/prepared/``, an entry
per source state::

    <home>/prepared/<key>/data        the copy (a folder or a single file), read-only to jobs
    <home>/prepared/<key>/entry.json  its source, size, file count, creation and last use
    <home>/prepared/<key>/holds/<id>  one empty file per queued or running job that uses it

**The key** (the backend's, :meth:`~ma_jupyter.backends.base.Backend.look_at_dataset`) is a
SHA-256 over the source's resolved path, the job's account and the source's manifest: every
entry's relative path, kind, size, modification time (ns) and permission bits (a link: its
target's text).  For trees of at most 64 MB the files' contents go in too, since a small file
rewritten within one mtime tick at the same size would otherwise keep its old key; larger
trees are keyed by metadata only, because reading gigabytes to learn that nothing changed
would cost what the copy saves.  A change to the source (a file added, removed, resized or
touched) so gives a new key and a fresh copy.

**Untrusted files.**  A dataset may hold what a job wrote, so the backend looks at it and copies
it by the untrusted-file rules (:mod:`ma_jupyter.untrusted`, done in
``nodehost/datacopy.py``): with the job's account, never the service's rights; regular
files, folders and symbolic links only (a FIFO, socket or device is refused with a message
naming it, never opened to block); links copied as links, never followed; no setuid, setgid
or sticky bit in the copy, whose files belong to the job's account.

**Access.**  The source path and the account are part of the key: two jobs share a copy only
when they name the same source and run as the same account, and every job's own mount rules
are checked on that source before it gets the copy (the supervisor dry-runs the job's spec as
given, so ``host_policy`` decides for each user as if the source itself were mounted), and
checked again by the backend on the root its look and its copy opened, since a folder on the
path may have been swapped for a symlink since (``nodehost/datacopy.py`` rule 1).  What
the copy holds is what that account could read of the source.

**Disk reserve.**  The store lies in the service's home, usually on the jobs folder's disk,
whose reserve (``[limits] disk_reserve_mb``) the supervisor keeps by ending the running job
that writes the most.  A copy is no running job's doing, so it must not eat into the reserve:
before copying, :meth:`acquire` asks data preparation (``room``) with the size the look found
and the copies already in progress; a copy that would leave less than the reserve free waits
(the job stays queued and says so), one larger than the disk could ever take is refused.

**Off every lock.**  Looking and copying take as long as the dataset does: :meth:`acquire` holds
the store's lock only for its bookkeeping, and data preparation (``preparation.py``) calls it
on a thread of its own while the job's nodes are reserved, so no submit, stop or request
waits for a copy.

Rules, in order:

1. :meth:`PreparedStore.acquire` computes the key, holds the entry for the job, and copies only
   when no complete entry exists (the copy is made in ``<key>/copying-<random>/`` and renamed
   to ``<key>/data`` when complete, so a crash never leaves a half copy that would be taken
   for a prepared one; the sweep removes what a crash left); what is removed is first set
   aside (``.removed-*``) under the lock and deleted outside it;
2. :meth:`PreparedStore.release` drops a job's holds when it ends; the retention counts from
   then (``last_used``);
3. :meth:`PreparedStore.sweep` removes the entries that nobody holds and that were last used
   more than the retention ago (``[data] retention`` in ``cluster.toml``, seconds or a text like
   ``7d``; default 7 days); a hold whose job is no longer queued or running (the service
   stopped before releasing it) is dropped first;
4. :meth:`PreparedStore.remove` removes an entry early, refused while a job holds it;
5. a dataset or model in object storage (``s3://``, ``obs://``) is keyed by its URI, endpoint
   and listing (every object's key, size, ETag and version: ``objectstore.state_key``) and
   downloaded by :meth:`PreparedStore.acquire_objects` into ``<key>/downloading/``, renamed to
   ``<key>/data`` when complete; a download that failed is resumed by the next job wanting the
   same state (complete objects kept, partial ones fetched again).  Jobs share it by URI and
   by their credentials' access key id (the key includes it): a listing with other credentials
   does not prove they may read each object.

The copy is made on the service's machine, which is where the local backend's nodes run; the
Ray backend mounts the same path, so it reuses copies only while its nodes share that file
system (it never copies to a remote node).
"""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .. import config, objectstore
from ..backends.base import Backend
from ..errors import Conflict, InvalidSpec, NotFound
from ..foldersize import remove_tree
from ..models import PreparedData, parse_duration

#: the folder a copy is made in, inside its entry, until it is complete
COPYING_PREFIX = "copying-"
#: the folder an object storage download is made in, inside its entry, until it is complete;
#: always the same name, so that a download that failed resumes where it stopped
DOWNLOADING = "downloading"
DEFAULT_RETENTION = 7 * 86400.0


def retention(path: Path | None = None) -> float:
    """Seconds an unused copy is kept: ``[data] retention`` of ``cluster.toml`` (re-read on each
    call, so an admin's edit applies without a restart).

    Raises:
        InvalidSpec: the value is not a duration (the message names the file and the key).
    """
    path = path or config.cluster_file()
    table = config.read_cluster_file(path).get("data", {})  # its keys: the schema's
    if "retention" not in table:
        return DEFAULT_RETENTION
    try:
        return parse_duration(table["retention"]) or DEFAULT_RETENTION
    except ValueError as exc:
        raise InvalidSpec(f"{path}: [data] retention: {exc}") from None


@dataclass(frozen=True)
class Acquired:
    """What :meth:`PreparedStore.acquire` gave a job: the copy's path and how it came about."""

    path: Path
    bytes: int
    reused: bool
    seconds: float


class PreparedStore:
    """The store of prepared copies (see the module docstring for its rules)."""

    def __init__(self, root: Path | None = None):
        self.root = root or config.prepared_root()
        self._lock = threading.Lock()
        self._copying: dict[str, threading.Event] = {}  # key -> set when its copy has ended
        self._copy_bytes: dict[str, int] = {}  # key -> the size of its copy in progress

    # ------------------------------------------------------------------------ jobs

    def acquire(
        self,
        job_id: str,
        source: str,
        user: str | None,
        backend: Backend,
        cancel: threading.Event | None = None,
        room: Callable[[int, int], None] | None = None,
    ) -> Acquired:
        """Hold the copy of ``source``'s current state for ``job_id`` (submitted by ``user``),
        copying it first when no complete copy exists (rule 1).

        ``room(bytes, copying)``, called before this job copies (``bytes``: the size the look
        found; ``copying``: the bytes of the other copies in progress), raises when the disk
        cannot take the copy now (the supervisor's disk reserve); nothing is held then.

        Blocks while the backend looks at and copies the dataset (the store's lock is held only
        for the bookkeeping around them): call it off every lock the service's requests need.
        A second job wanting the same state while it is copied waits for that copy.

        Raises:
            RefusedFile: the dataset holds what data preparation refuses (a FIFO, a device...).
            Conflict: ``cancel`` was set while another job's copy was awaited (the backend's
                own error when it was set during this job's copy).
            DiskFull, InvalidSpec: what ``room`` raised.
        """
        started = time.monotonic()
        root = str(Path(source).resolve(strict=True))  # resolved once: the look and the copy read it
        state = backend.look_at_dataset(user, root)
        entry = self.root / state.key
        while True:
            with self._lock:  # no sweep between the hold and the check
                if not (entry / "data").exists() and state.key not in self._copying and room is not None:
                    room(state.bytes, sum(self._copy_bytes.values()))  # this job would copy it
                self._hold(entry, job_id)
                if (entry / "data").exists():
                    self._used(entry, user)
                    return Acquired(entry / "data", state.bytes, True, time.monotonic() - started)
                copying = self._copying.get(state.key)
                if copying is None:  # this job copies it
                    copying = self._copying[state.key] = threading.Event()
                    self._copy_bytes[state.key] = state.bytes
                    break
            while not copying.wait(0.1):  # another job copies this state: its copy will do
                if cancel is not None and cancel.is_set():
                    raise Conflict(f"job {job_id} ended while its data was being prepared")
        try:
            into = entry / f"{COPYING_PREFIX}{secrets.token_hex(4)}"
            copied = backend.copy_dataset(user, root, into, cancel)
            with self._lock:
                # the dataset may have changed since the look: the copy is filed under its own state
                final = self.root / copied.key
                if final != entry:
                    (entry / "holds" / job_id).unlink(missing_ok=True)
                    self._hold(final, job_id)
                if (final / "data").exists():  # the same state, copied meanwhile by another job
                    remove_tree(into)
                else:
                    os.replace(into / "data", final / "data")  # complete: only now is it "data"
                    os.rmdir(into)
                    meta = {
                        "source": root,
                        "bytes": copied.bytes,
                        "files": copied.files,
                        "created": time.time(),
                    }
                    self._write_meta(final, meta)
                self._used(final, user)
        finally:
            with self._lock:
                self._copy_bytes.pop(state.key, None)
                self._copying.pop(state.key).set()
        return Acquired(final / "data", copied.bytes, False, time.monotonic() - started)

    def acquire_objects(
        self,
        job_id: str,
        uri: objectstore.ObjectURI,
        credentials: dict[str, str],
        endpoint: str | None,
        user: str | None,
        cancel: threading.Event | None = None,
        room: Callable[[int, int], None] | None = None,
        progress: Callable[[objectstore.Progress], None] | None = None,
    ) -> Acquired:
        """:meth:`acquire` for a prefix in object storage (rule 5): the copy of its current
        state (its listing's keys, sizes, ETags and versions), downloaded first when no complete
        copy exists.

        Raises:
            StorageError: the listing or a download failed (the URI and the reason).
            Conflict, DiskFull, InvalidSpec: as :meth:`acquire`.
        """
        started = time.monotonic()
        # the submit's listing when the job starts right after it (objectstore rule 1a)
        objects = objectstore.listing(uri, credentials, endpoint, reuse=True)
        # per access key id: a copy is shared only by credentials of the same identity, since
        # another's listing of the prefix does not prove it may read each object (per-object ACLs)
        key = objectstore.state_key(uri, endpoint, objects, credentials.get("AWS_ACCESS_KEY_ID", ""))
        size = sum(o.size for o in objects)
        entry = self.root / key
        while True:
            with self._lock:
                if not (entry / "data").exists() and key not in self._copying and room is not None:
                    room(size, sum(self._copy_bytes.values()))
                self._hold(entry, job_id)
                if (entry / "data").exists():
                    self._used(entry, user)
                    return Acquired(entry / "data", size, True, time.monotonic() - started)
                copying = self._copying.get(key)
                if copying is None:
                    copying = self._copying[key] = threading.Event()
                    self._copy_bytes[key] = size
                    break
            while not copying.wait(0.1):
                if cancel is not None and cancel.is_set():
                    raise Conflict(f"job {job_id} ended while its data was being prepared")
        try:
            into = entry / DOWNLOADING  # the same folder each try: a failed download resumes
            with self._lock:  # its retention counts from now: a later try within it resumes
                if not self._meta(entry):
                    now = time.time()
                    meta = {
                        "source": str(uri),
                        "bytes": size,
                        "files": len(objects),
                        "created": now,
                        "last_used": now,
                    }
                    self._write_meta(entry, meta)
            objectstore.download(uri, objects, credentials, endpoint, into, progress=progress, cancel=cancel)
            with self._lock:
                os.replace(into, entry / "data")  # complete: only now is it "data"
                meta = {"source": str(uri), "bytes": size, "files": len(objects), "created": time.time()}
                self._write_meta(entry, meta)
                self._used(entry, user)
        finally:
            with self._lock:
                self._copy_bytes.pop(key, None)
                self._copying.pop(key).set()
        return Acquired(entry / "data", size, False, time.monotonic() - started)

    def _hold(self, entry: Path, job_id: str) -> None:
        (entry / "holds").mkdir(parents=True, exist_ok=True)
        (entry / "holds" / job_id).touch()

    def _used(self, entry: Path, user: str | None) -> None:
        meta = self._meta(entry)
        meta["last_used"] = time.time()
        meta["users"] = sorted(set(meta.get("users", [])) | {user or ""})
        self._write_meta(entry, meta)

    def release(self, job_id: str) -> None:
        """Drop ``job_id``'s holds; the retention of what it held counts from now (rule 2)."""
        if not self.root.is_dir():
            return
        with self._lock:
            for hold in self.root.glob(f"*/holds/{job_id}"):
                entry = hold.parent.parent
                hold.unlink(missing_ok=True)
                meta = self._meta(entry)
                if meta:
                    meta["last_used"] = time.time()
                    self._write_meta(entry, meta)

    # ------------------------------------------------------------------------ admin

    def entries(self, live: Callable[[str], bool], user: str | None = None) -> list[PreparedData]:
        """The complete entries, oldest use first (stale holds, see rule 3, are not counted):
        every one, or with ``user`` those a job of that user took (the others' sources stay
        unnamed to them)."""
        out = []
        if not self.root.is_dir():
            return out
        for entry in sorted(self.root.iterdir()):
            if entry.name.startswith("."):
                continue  # being removed
            meta = self._meta(entry)
            if not meta or not (entry / "data").exists():
                continue
            if user is not None and user not in meta.get("users", []):
                continue
            holders = sorted(h.name for h in (entry / "holds").glob("*") if live(h.name))
            out.append(
                PreparedData(
                    key=entry.name,
                    source=meta.get("source", ""),
                    path=str(entry / "data"),
                    bytes=int(meta.get("bytes", 0)),
                    files=int(meta.get("files", 0)),
                    created=meta.get("created", 0.0),
                    last_used=meta.get("last_used", 0.0),
                    jobs=holders,
                )
            )
        return sorted(out, key=lambda e: e.last_used)

    def sweep(
        self, live: Callable[[str], bool], keep: float | None = None, now: float | None = None
    ) -> list[str]:
        """Remove the unheld entries last used more than ``keep`` seconds (default: the
        retention) ago (rule 3); the keys removed."""
        keep = retention() if keep is None else keep
        now = time.time() if now is None else now
        removed: list[str] = []
        doomed: list[Path] = []
        if not self.root.is_dir():
            return removed
        with self._lock:
            for entry in self.root.iterdir():
                if entry.name.startswith(".removed-"):
                    doomed.append(entry)  # set aside by a service that stopped before removing it
                    continue
                if entry.name in self._copying:
                    continue  # its copy is being made (held by a job that may just have ended)
                holds = entry / "holds"
                for hold in list(holds.glob("*")) if holds.is_dir() else []:
                    if not live(hold.name):  # the job ended while no one could release it
                        hold.unlink(missing_ok=True)
                for left in entry.glob(f"{COPYING_PREFIX}*"):  # a copy a stopped service left
                    doomed.append(self._set_aside(left))
                meta = self._meta(entry)
                if holds.is_dir() and any(holds.iterdir()):
                    continue
                if meta and now - meta.get("last_used", 0.0) <= keep:
                    continue
                doomed.append(self._set_aside(entry))
                removed.append(entry.name)
        for path in doomed:  # outside the lock: a big copy takes a while to remove
            remove_tree(path)  # any depth: a dataset is the user's
        return removed

    def remove(self, key: str, live: Callable[[str], bool], user: str | None = None) -> PreparedData:
        """Remove one entry now (rule 4); what it was.  ``user``: only one a job of theirs took
        (None: an admin, any entry).

        Raises:
            NotFound: no entry has that key.
            Conflict: a queued or running job holds it (the message names them).
        """
        with self._lock:  # no job takes a hold between the check and the removal
            found = next((e for e in self.entries(live, user) if e.key == key), None)
            if found is None:
                raise NotFound(f"no prepared data {key!r}; `ma-jupyter data list` shows the keys")
            if found.jobs:
                raise Conflict(
                    f"prepared data {key} is in use by job(s) {', '.join(found.jobs)}; "
                    "remove it once they have ended"
                )
            doomed = self._set_aside(self.root / key)
        remove_tree(doomed)
        return found

    # ------------------------------------------------------------------------ files

    def _set_aside(self, path: Path) -> Path:
        """Move ``path`` (an entry, or a copy left in one) out of every listing, under the lock;
        the caller removes what it returns once the lock is released."""
        aside = self.root / f".removed-{path.name}-{secrets.token_hex(4)}"
        try:
            os.rename(path, aside)
        except OSError:
            return path
        return aside

    @staticmethod
    def _meta(entry: Path) -> dict:
        try:
            return json.loads((entry / "entry.json").read_text())
        except (OSError, ValueError):
            return {}

    @staticmethod
    def _write_meta(entry: Path, meta: dict) -> None:
        tmp = entry / "entry.json.tmp"
        tmp.write_text(json.dumps(meta))
        os.replace(tmp, entry / "entry.json")
