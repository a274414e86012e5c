"""Object storage on a Ray node's own machine: what an agent downloads for the job nodes it runs
there, when the machines share no disk with the service (contract rule 29,
:meth:`ma_jupyter.backends.base.Backend.fetch_objects`).

Rules, in order, for each :class:`~ma_jupyter.backends.base.ObjectFetch` of one call:

1. The prefix is listed with the job's credentials (the listing bounds of
   :func:`ma_jupyter.objectstore.listing`).
2. A dataset or model goes into this machine's cache, ``<node_root>/.objects/<key>/data``
   (``.objects`` is no job id: ``jobdir.check_job_id`` refuses names starting with a dot).
   The key is the prepared store's (:func:`ma_jupyter.objectstore.state_key`: the URI, the
   endpoint, each object's key, size, ETag and version, and the credentials' access key id), so
   a copy is reused by the same state for the same identity only.  It is downloaded into
   ``downloading/`` (a failed download resumes there, the complete objects kept) and renamed
   ``data`` once whole; one download per key at a time, across the agents sharing this cache
   too (:func:`_key_lock`: ``<key>.lock``, whose lock a fetch holds until it holds the copy, and
   a sweep while it removes it).  The job folder's link
   ``<node_root>/<job>/<into>`` then names it, and the node mounts it read-only.
3. The outputs prefix's current content is downloaded into ``<node_root>/<job>/outputs`` (a
   resumed attempt finds its checkpoints), owned by the job's account.
4. A cached copy is kept while a job holds it, and for the retention after its last use: the
   prepared store's rules (``service/prepared.py`` rules 2 and 3) on this machine's disk.  Each
   fetch holds the copies it links for its job, ``<key>/holds/<job id>`` (refreshed by each
   attempt's fetch), and marks them used (the entry's time).  The next call on this machine
   (its sweep, :func:`_sweep`) then, per entry not being downloaded: drops each hold that is
   no longer live (:func:`_live`: no node of that job runs on this machine, none launched by
   another Ray node sharing this ``node_root`` is without its exit code, and its fetch is
   more than :data:`LAUNCH_GRACE` seconds old), the entry's retention counting from then; keeps
   an entry some hold still holds, whatever its age; removes the others unused for longer than
   the retention the service sent (``ObjectFetch.retention``: ``[data] retention`` of its
   ``cluster.toml`` as read at that call; None: it could not be read, and nothing is removed
   for its age).  A hold lives on disk: an agent that crashed and the next one, or an attempt
   whose nodes crashed, leave nothing held for longer than its nodes run here or the grace.
5. While a prefix downloads, its progress (bytes, objects, rate) is kept as lines for the
   service, at most one every ``objectstore.PROGRESS_EVERY`` seconds per prefix
   (``objectstore.ProgressLines``, as data preparation's), at most :data:`MAX_PROGRESS_LINES`
   per job (the oldest dropped); :func:`progress` hands them over once each (the service polls
   the agent while it waits for the download, and adds them to the job's events).
6. Before a download (rules 2 and 3) writes anything, the bytes it still has to fetch
   (``objectstore.missing_bytes``: what a failed download completed is not counted again), with
   the bytes of the other downloads running on this machine, must leave the disk reserve
   (``ObjectFetch.disk_reserve``, the service's ``[limits] disk_reserve_mb``) free on the disk
   they go to (:func:`_room`): a download the disk could never take beside the reserve is
   refused (``InvalidSpec``: the job fails saying so); one that does not fit now is
   ``DiskFull`` (the job stays queued and is tried again, as a copy on the service's machine).

The credentials are the job's; they come in the call's arguments and are used for this call
only, never written to disk.  So does whether the endpoint is the administrator's
(``ObjectFetch.trusted``, from the service's ``cluster.toml`` as it is at each call): a change
of ``[storage] allow_endpoints`` or ``obs_endpoint`` holds for the agent's next call, without
its restart.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import shutil
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from ... import foldersize, objectstore, untrusted
from ...errors import DiskFull, FolderRefused, InvalidSpec, RefusedFile
from ...foldersize import remove_tree
from ...jobdir import check_job_id
from ...models import NodeRun, RunAs
from ...nodehost.procfs import process_start_time
from ..base import ObjectFetch

#: the cache folder's name below ``node_root``
CACHE = ".objects"
DOWNLOADING = "downloading"
#: the folder of an entry's holds, one empty file per job (the prepared store's layout)
HOLDS = "holds"
#: seconds a fetch's hold stands without a node of its job running here (rule 4): the wait for
#: the launch, which follows once every Ray node of the placement has downloaded (at most
#: ``fetches.FETCH_TIMEOUT``, an hour), with room to spare
LAUNCH_GRACE = 2 * 3600.0
#: node folders of one job looked at for a running node (a job folder holds one per node)
MAX_NODES_LOOKED = 4096
#: bytes of a node's run record read (a few hundred)
RUN_RECORD_LIMIT = 1 << 16

#: progress lines kept per job until the service takes them (rule 5)
MAX_PROGRESS_LINES = 32

_progress_guard = threading.Lock()
_progress: dict[str, list[str]] = {}
_locks_guard = threading.Lock()
_locks: dict[str, threading.Lock] = {}
#: the bytes each download running on this machine still has to fetch (rule 6)
_room_guard = threading.Lock()
_downloading: dict[int, int] = {}
_tokens = itertools.count()


def _lock(key: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(key, threading.Lock())


@contextlib.contextmanager
def _key_lock(cache: Path, key: str, wait: bool) -> Iterator[bool]:
    """A key's lock (rules 2 and 4): this process's own, then ``<key>.lock`` beside its entry
    (``flock``), for the other agents using this cache (Ray nodes of one machine, or a
    ``node_root`` on shared storage), so no sweep of theirs removes an entry a fetch here
    downloads or is about to hold; whether it was taken (``wait`` False: not when busy).  A
    file system without locks leaves this process's own."""
    own = _lock(key)
    if not own.acquire(blocking=wait):
        yield False
        return
    fd = -1
    try:
        path = cache / f"{key}.lock"
        while True:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:  # another agent's fetch or sweep holds it
                os.close(fd)
                fd = -1
                break
            except OSError:
                if fd >= 0:
                    os.close(fd)
                fd = -2  # no lock file, or no locks on this file system: this process's lock
                break
            try:  # a sweep that removed the entry removed its lock file too: the lock is the one there now
                there = os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
            except OSError:
                there = False
            if there:
                break
            os.close(fd)
            fd = -1
        if fd == -1:
            yield False
            return
        yield True
    finally:
        if fd >= 0:
            os.close(fd)
        own.release()


def progress(job_id: str) -> list[str]:
    """Rule 5: the progress lines of ``job_id``'s downloads here since the last call."""
    with _progress_guard:
        return _progress.pop(job_id, [])


def _keep(job_id: str, line: str) -> None:
    with _progress_guard:
        lines = _progress.setdefault(job_id, [])
        lines.append(line)
        del lines[:-MAX_PROGRESS_LINES]


def fetch(
    node_root: str,
    job_id: str,
    fetches: list[ObjectFetch],
    credentials: dict[str, str],
    account: RunAs | None,
    cancel: threading.Event | None = None,
    host: str = "",
) -> list[str]:
    """Rules 1 to 5 on this machine; the progress lines not taken yet (rule 5), then one line per
    fetch saying what was done (for the job's events).  ``host``: the inventory name of the Ray
    node calling (a node's run record names the Ray node that launched it, rule 4).

    Raises:
        StorageError: a listing or a download failed (the URI and the reason).
        InvalidSpec, DiskFull: a download this machine's disk cannot take (rule 6).
    """
    root = Path(node_root)
    job_dir = root / check_job_id(job_id)
    cache = root / CACHE
    cache.mkdir(parents=True, exist_ok=True, mode=0o755)
    said = []
    try:
        for item in fetches:
            said.append(_fetch_one(root, job_dir, cache, job_id, item, credentials, account, cancel))
        said = progress(job_id) + said  # the lines the service did not take yet, the last ones
    finally:
        with _progress_guard:  # none kept past the call
            _progress.pop(job_id, None)
    # rule 4: the service's retention of this call (one reading of its cluster.toml for all)
    keep = [item.retention for item in fetches]
    kept = [k for k in keep if k is not None]
    _sweep(root, None if len(kept) < len(keep) or not keep else max(kept), host)
    return said


def _fetch_one(
    root: Path,
    job_dir: Path,
    cache: Path,
    job_id: str,
    item: ObjectFetch,
    credentials: dict[str, str],
    account: RunAs | None,
    cancel: threading.Event | None,
) -> str:
    """Rules 1 to 3 and 5 for one prefix; the line saying what was done."""
    started = time.monotonic()
    uri = objectstore.ObjectURI.parse(item.uri, item.what)
    # the service's word on the endpoint, from cluster.toml as it is now, for this call only
    # (objectstore rule 5): an endpoint the administrator took out is guarded again at once
    trust = item.trusted
    objects = objectstore.listing(uri, credentials, item.endpoint, trusted=trust)
    size = sum(o.size for o in objects)
    shown = objectstore.ProgressLines(item.what, uri, lambda line: _keep(job_id, line))
    if item.into == "outputs":
        folder = job_dir / "outputs"
        folder.mkdir(parents=True, exist_ok=True, mode=0o755)
        with _room(folder, item, objects):
            objectstore.download(
                uri, objects, credentials, item.endpoint, folder, cancel=cancel, progress=shown, trusted=trust
            )
        _give(folder, account)
        how = f"{len(objects)} object(s) of {uri} downloaded into the outputs folder"
    else:
        key = objectstore.state_key(uri, item.endpoint, objects, credentials.get("AWS_ACCESS_KEY_ID", ""))
        entry = cache / key
        with _key_lock(cache, key, wait=True):
            reused = (entry / "data").is_dir()
            if not reused:
                entry.mkdir(exist_ok=True, mode=0o755)
                into = entry / DOWNLOADING
                with _room(into, item, objects):
                    objectstore.download(
                        uri,
                        objects,
                        credentials,
                        item.endpoint,
                        into,
                        cancel=cancel,
                        progress=shown,
                        trusted=trust,
                    )
                os.replace(into, entry / "data")
            # rule 4: held and used now, under the key's lock (no sweep in between; while it
            # downloads, the lock keeps the sweep away)
            _hold(entry, job_id)
            os.utime(entry)
        link = job_dir / item.into
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(entry / "data")
        how = f"{uri}: {'cached copy reused' if reused else 'downloaded'}"
    return f"{item.what}: {how} ({size / 1e6:.1f} MB, {time.monotonic() - started:.2f} s)"


@contextlib.contextmanager
def _room(into: Path, item: ObjectFetch, objects: list[objectstore.Obj]) -> Iterator[None]:
    """Rule 6 for one download into ``into``: its bytes still to fetch counted as this machine's
    downloads in progress while it runs (:func:`room`)."""
    try:
        needed = objectstore.missing_bytes(objects, into)
    except objectstore.StorageError:  # a folder too large to walk (a job's outputs): all of it
        needed = sum(o.size for o in objects)
    with room(into, item.what, item.uri, needed, item.disk_reserve):
        yield


@contextlib.contextmanager
def room(into: Path, what: str, source: str, needed: int, reserve: int) -> Iterator[None]:
    """Rule 6: ``needed`` bytes to write below ``into`` (from ``source``, for ``what`` the job
    names) leave ``reserve`` bytes free on its disk, with the other downloads and copies running
    on this machine; counted as one of them while it runs (``outputs_seed.py`` too).

    Raises:
        InvalidSpec: the disk, even empty, could not take them beside the reserve.
        DiskFull: not now.
    """
    on = into if into.is_dir() else into.parent
    mb = 1 << 20
    token = next(_tokens)
    with _room_guard:
        try:
            usage = shutil.disk_usage(on)
        except OSError:
            usage = None  # unknown: the download's own ENOSPC still stops it
        others = sum(_downloading.values())
        if usage is not None and needed > usage.total - reserve:
            raise InvalidSpec(
                f"{what}: {source} holds {needed / mb:.1f} MB to download, more than this Ray "
                f"node's disk of {on} ({usage.total / mb:.0f} MB, {reserve / mb:.0f} MB of it kept free: "
                "[limits] disk_reserve_mb) can take: name a smaller prefix, or give node_root a larger disk"
            )
        if usage is not None and usage.free - others - needed < reserve:
            raise DiskFull(
                f"{what}: downloading {source} ({needed / mb:.1f} MB) would leave less than the "
                f"disk reserve ({reserve / mb:.0f} MB, [limits] disk_reserve_mb) free under {on} on this "
                f"Ray node ({usage.free / mb:.1f} MB free, {others / mb:.1f} MB being downloaded for "
                "other jobs)"
            )
        _downloading[token] = needed
    try:
        yield
    finally:
        with _room_guard:
            _downloading.pop(token, None)


def _give(folder: Path, account: RunAs | None) -> None:
    """The outputs folder and what it holds to the job's account (it writes there), through
    the one bounded walk, no link followed, each entry changed through its folder's descriptor."""
    if account is None:
        return
    try:
        for _path, dir_fd, entries in foldersize.walk([folder], follow_top=False):
            os.fchown(dir_fd, account.uid, account.gid)
            for name, st in entries:
                if not stat.S_ISLNK(st.st_mode):
                    os.chown(name, account.uid, account.gid, dir_fd=dir_fd, follow_symlinks=False)
    except FolderRefused as exc:
        raise objectstore.StorageError(f"outputs {folder}: {exc}") from None


def _hold(entry: Path, job_id: str) -> None:
    """Rule 4: ``job_id`` holds ``entry`` from now (a hold made again is refreshed)."""
    holds = entry / HOLDS
    holds.mkdir(exist_ok=True, mode=0o700)
    (holds / job_id).touch()


def _live(root: Path, job_id: str, hold: os.DirEntry, now: float, host: str = "") -> bool:
    """Rule 4: whether the hold ``hold`` of ``job_id`` still stands: its fetch is at most
    :data:`LAUNCH_GRACE` seconds old, or a node of the job runs on this machine, or a node
    launched by another Ray node than ``host`` has no exit code yet.

    A ``node_root`` on shared storage is every Ray node's cache: a run record another Ray node
    wrote names a process this machine cannot look at, so it stands until its runner writes the
    exit code (or the job folder goes), never judged by this machine's processes.

    A node runs when its run record (``nodes/<node>/run.json`` of the job folder here, written
    by the agent at its launch, read by the untrusted-file rules) names a process that still
    runs with the recorded start time (a pid used again is no match, as the node host's own
    check) and whose working folder, as the kernel says it, is that node's folder (the
    runner's: a record naming any other live process holds nothing), and no exit code was
    written.
    """
    try:
        if now - hold.stat(follow_symlinks=False).st_mtime <= LAUNCH_GRACE:
            return True
        check_job_id(job_id)
    except (OSError, InvalidSpec):
        return False
    nodes = root / job_id / "nodes"
    try:
        with os.scandir(nodes) as found:
            names = [e.name for e in itertools.islice(found, MAX_NODES_LOOKED)]
    except OSError:
        return False
    for name in names:
        relative = f"{job_id}/nodes/{name}"
        try:
            record = untrusted.read_small(
                root, f"{relative}/run.json", owner="a job node", limit=RUN_RECORD_LIMIT
            )
            run = NodeRun.model_validate_json(record)
        except (OSError, ValueError, RefusedFile):
            continue
        if run.pid is None or os.path.lexists(root / relative / "exit_code"):
            continue
        if host and run.host and run.host != host:
            return True  # another Ray node's runner, maybe on another machine: not seen from here
        started = process_start_time(run.pid)
        if started is None or (run.start_time is not None and abs(started - run.start_time) >= 0.05):
            continue
        try:
            # the runner is this agent's own process: one it may not look at is none of its runners
            cwd = os.readlink(f"/proc/{run.pid}/cwd")
        except OSError:
            continue
        if os.path.realpath(root / relative) == cwd:
            return True
    return False


def _sweep(root: Path, keep: float | None, host: str = "") -> None:
    """Rule 4 over this machine's cache: stale holds dropped, unheld copies unused for ``keep``
    seconds removed (None: none for its age); an entry being downloaded is left alone."""
    cache = root / CACHE
    try:
        entries = list(os.scandir(cache))
    except OSError:
        return
    for entry in entries:
        if not entry.is_dir(follow_symlinks=False):
            continue
        with _key_lock(cache, entry.name, wait=False) as locked:
            if locked:  # else a fetch holds or downloads it now
                _sweep_one(root, cache, entry, keep, host)


def _sweep_one(root: Path, cache: Path, entry: os.DirEntry, keep: float | None, host: str) -> None:
    """Rule 4 for one entry, under its key's lock."""
    now = time.time()
    holds = Path(entry.path) / HOLDS
    try:
        held = list(os.scandir(holds))
    except OSError:
        held = []
    standing = 0
    for hold in held:
        if _live(root, hold.name, hold, now, host):
            standing += 1
            continue
        with contextlib.suppress(OSError):
            os.unlink(hold.path)
            os.utime(entry.path)  # its retention counts from the hold's end (prepared rule 2)
    if standing or keep is None:
        return
    try:
        if now - os.stat(entry.path, follow_symlinks=False).st_mtime < keep:
            return
    except OSError:
        return
    remove_tree(entry.path)
    with contextlib.suppress(OSError):
        os.unlink(cache / f"{entry.name}.lock")  # under its lock: a fetch waiting on it takes the new one
