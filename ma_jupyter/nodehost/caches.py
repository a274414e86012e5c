"""Each user's persistent cache, shown at ``~/.cache`` in every node of their jobs.

``$MA_JUPYTER_HOME/caches/<user>/`` keeps what frameworks cache between jobs (DeepSpeed's and
torch's compiled extensions, Hugging Face downloads, pip wheels), so a user's next job starts
warm.  Rules:

1. One folder per user (the job's creator; a name that cannot be a folder name becomes
   ``user-<hash>``), mode 0700, owned by the account that user's jobs run as: shared by all
   their jobs, never seen by another user's (a node's view shows its own user's cache only).
2. It is made at a node's launch; when the user's jobs now run as another account, the old
   folder is thrown away and a new one made (a cache holds nothing that cannot be rebuilt).
3. Clearing moves it aside at once and removes it on a thread; a job launched meanwhile gets an
   empty one.  The caller (the supervisor) refuses to clear while a job of the user runs.
4. Everything in it was written by jobs: sizes are read with ``lstat`` through folder
   descriptors (no symlink followed), removal uses :func:`ma_jupyter.foldersize.remove_tree`
   (which follows none, at any depth); a cache the walk refuses to measure (a chain of folders
   too deep, too many entries) says so in its ``refused``, with what was counted before.
5. The folders frameworks keep in ``HOME`` itself instead of ``~/.cache`` (:data:`HOME_CACHES`:
   ``~/.keras``, ``~/.torch``...) are kept in it too, at ``home/<name>``: each node's ``~/<name>``
   is a link there (:func:`home_links`).  They are made at each launch (through the cache's
   descriptor, never following a link the job left); a name the job replaced with something
   else is left as it is, since a link inside the cache resolves in the node's view only.
6. No build lock outlives its holder.  Frameworks that build into the cache take a lock file
   whose mere existence is the lock (torch's ``FileBaton``: ``torch_extensions/<image>/<name>/lock``
   for DeepSpeed's and torch's JIT-built extensions), so a job killed while building leaves it
   behind and every later job of the user would wait in ``FileBaton.wait`` forever.  Every node
   runner of the user's jobs holds the cache's lease (:func:`lease_file`: a shared ``flock`` on
   ``<caches>/.leases/<folder>``, outside the cache where no job reaches it), taken before
   anything of its node starts and dropped by the kernel when the runner ends, however it ends
   (:mod:`.noderun` rule 9).  At a node's launch, before its runner starts,
   :func:`release_stale_locks` takes the lease exclusively, without waiting: it gets it only
   when no node of the user's jobs runs on this machine, so no lock in the cache can have a
   living holder, and it removes every lock file there (:func:`is_lock_name`).  While another
   job of the user runs, only the locks no process holds open are removed: a holder keeps its
   lock's descriptor open until it releases it (``FileBaton`` closes it, then removes the file;
   ``filelock`` holds its ``flock`` on it), so a lock file that no process has open, seen so
   twice :data:`LOCK_SETTLE_SECONDS` apart (never the instant between a release's close and its
   removal), has no living holder.  Each such file is removed only while this service holds an
   exclusive ``flock`` on it and it is still the file first seen (device, inode and change
   time): a ``filelock`` acquirer that opened it after the second look then either holds it
   (kept) or finds its file unlinked once it gets the lock and takes the new one (``filelock``
   checks ``st_nlink``), and a new ``FileBaton`` lock that reused the inode is not taken for
   the old one; never two holders.  This look runs on a thread of the node host after each
   node's launch and once each node of the user ends (:meth:`.host.NodeHost.poll`), never in
   the launch itself (which runs under the supervisor's lock: a cache full of files, or
   processes with many descriptors, would stall every user's jobs), so a job already waiting
   behind a dead job's lock goes on, as does the next one.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path

from .. import config
from ..errors import FolderRefused
from ..foldersize import FolderSize, folder_size, remove_tree, walk
from ..models import CacheInfo

#: where the cache appears in a node: ``$HOME/.cache`` (HOME is /tmp inside a node)
CACHE_VIEW = "/tmp/.cache"
#: folders frameworks keep in HOME rather than in ``~/.cache`` (rule 5): Keras's datasets and
#: models, torch's and torchvision's older ones, CUDA's compiled kernels, Triton's, MXNet's, CuPy's
HOME_CACHES = (".keras", ".torch", ".nv", ".triton", ".mxnet", ".cupy")
#: the folder of the cache holding them: ``~/.keras`` is ``~/.cache/home/.keras``
HOME_FOLDER = "home"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
#: the folder of the caches' leases (rule 6), beside the users' caches
LEASES = ".leases"
#: bounds of the look for stale locks (rule 6): a cache is the job's to fill, its launch waits
LOCK_WALK_ENTRIES = 200_000
LOCK_WALK_SECONDS = 5.0
#: seconds between the two looks at a lock file no process holds open (rule 6)
LOCK_SETTLE_SECONDS = 1.0
#: bound of one look through the machine's open descriptors (rule 6): past it, every lock is
#: taken as held (nothing removed)
LOCK_HOLDERS_SECONDS = 3.0


def is_lock_name(name: str) -> bool:
    """Whether a file of that name in a cache is a build's lock: ``lock`` (torch's ``FileBaton``)
    or ``*.lock`` (``filelock``'s, Hugging Face's, pip's)."""
    return name == "lock" or name.endswith(".lock")


def lease_file(cache: Path) -> Path:
    """The lease of the cache folder ``cache`` (rule 6): outside it, where no job reaches."""
    return Path(cache).parent / LEASES / Path(cache).name


def _open_lease(cache: Path) -> int:
    path = lease_file(cache)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    return os.open(path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


def release_stale_locks(cache: Path, *, unheld: bool = False) -> list[str] | None:
    """Remove the lock files left in ``cache`` when no node of its user's jobs runs here (rule 6).

    Args:
        unheld: while a node of the user's jobs holds the lease, remove the locks no
            process holds open (seconds: two looks through the machine's descriptors a second
            apart: the node host's thread after a launch and at a node's end, never a launch).

    Returns:
        The paths removed, relative to the cache; None when a node of the user's jobs holds the
        lease and ``unheld`` is false (nothing is looked at).  Never raises for what it
        finds: the walk follows no link and is bounded (:data:`LOCK_WALK_ENTRIES`,
        :data:`LOCK_WALK_SECONDS`); past a bound, what was released until then stands.
    """
    if not Path(cache).is_dir():
        return []
    fd = _open_lease(cache)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return _release_unheld_locks(Path(cache)) if unheld else None
        return list(_locks(Path(cache), unlink=lambda _inode: True))
    finally:
        os.close(fd)  # and the exclusive lease with it


def _locks(
    cache: Path,
    unlink: Callable[[tuple[int, int]], bool] | None = None,
    last_look: dict[tuple[int, int], int] | None = None,
    change_times: dict[tuple[int, int], int] | None = None,
) -> dict[str, tuple[int, int]]:
    """The lock files of ``cache`` (path relative to it -> device and inode), by a bounded walk
    following no link (past a bound: those found until then).  With ``unlink``: those whose
    device and inode it accepts are removed, through their folder's descriptor (never a path a
    job could redirect), and only those are returned; with ``last_look`` (inode -> change
    time), each only under its own ``flock`` and while still that file (:func:`_unlink_unlocked`).
    ``change_times``, if given, gets each lock file's change time (ns) by device and inode."""
    found: dict[str, tuple[int, int]] = {}
    try:
        for folder, dir_fd, entries in walk(
            [cache], follow_top=False, max_entries=LOCK_WALK_ENTRIES, max_seconds=LOCK_WALK_SECONDS
        ):
            for name, st in entries:
                if not (is_lock_name(name) and stat.S_ISREG(st.st_mode)):
                    continue
                inode = (st.st_dev, st.st_ino)
                if change_times is not None:
                    change_times[inode] = st.st_ctime_ns
                if unlink is not None:
                    if not unlink(inode):
                        continue
                    if last_look is not None:
                        if not _unlink_unlocked(dir_fd, name, inode, last_look.get(inode)):
                            continue
                    else:
                        try:
                            os.unlink(name, dir_fd=dir_fd)
                        except OSError:
                            continue
                found[os.path.normpath(os.path.join(folder, name))] = inode
    except FolderRefused:
        pass
    return found


def _open_anywhere(wanted: set[tuple[int, int]], uid: int) -> set[tuple[int, int]] | None:
    """Which of the files ``wanted`` (device, inode) a process of account ``uid`` holds open
    (the nodes of a user's jobs run as the cache's owner); None past
    :data:`LOCK_HOLDERS_SECONDS` (the caller then takes every one as held)."""
    deadline = time.monotonic() + LOCK_HOLDERS_SECONDS
    held: set[tuple[int, int]] = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        if time.monotonic() > deadline:
            return None
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
            descriptors = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue  # ended meanwhile
        for fd in descriptors:  # one process of the job's may hold as many as its limit allows
            if time.monotonic() > deadline:
                return None
            try:
                st = os.stat(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if (st.st_dev, st.st_ino) in wanted:
                held.add((st.st_dev, st.st_ino))
    return held


def _release_unheld_locks(cache: Path) -> list[str]:
    """Rule 6 while a node of the user's jobs runs here: remove the lock files no process
    holds open, looked at twice :data:`LOCK_SETTLE_SECONDS` apart (the same file both times)."""
    try:
        uid = os.stat(cache).st_uid
    except OSError:
        return []
    changed: dict[tuple[int, int], int] = {}  # at the first look (a reused inode: another time)
    first = _locks(cache, change_times=changed)
    if not first:
        return []
    held = _open_anywhere({found[:2] for found in first.values()}, uid)
    if held is None:
        return []
    candidates = {found for found in first.values() if found[:2] not in held}
    if not candidates:
        return []
    time.sleep(LOCK_SETTLE_SECONDS)
    held = _open_anywhere({found[:2] for found in candidates}, uid)
    if held is None:
        return []
    return list(
        _locks(cache, unlink=lambda inode: inode in candidates and inode not in held, last_look=changed)
    )


def _unlink_unlocked(dir_fd: int, name: str, inode: tuple[int, int], changed: int | None) -> bool:
    """Rule 6: remove ``name`` only while holding an exclusive ``flock`` on it (none may be
    held: a holder that came after the looks keeps its lock) and only when it is still the file
    of ``inode`` with the change time ``changed``.  Opened without following a link or waiting
    on a FIFO; whether it was removed."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != inode or st.st_ctime_ns != changed:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # held now
        os.unlink(name, dir_fd=dir_fd)  # under our flock: an acquirer waiting on it sees nlink 0
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def root() -> Path:
    """The folder holding every user's cache."""
    return config.home() / "caches"


def folder_name(user: str | None) -> str:
    """The name of ``user``'s cache folder (None: the service's own user)."""
    if user is None:
        from .host_policy import service_user

        user = service_user()
    if _NAME.match(user) and user not in (".", ".."):
        return user
    return "user-" + hashlib.sha256(user.encode()).hexdigest()[:16]


def cache_dir(user: str | None) -> Path:
    """The host folder of ``user``'s cache (not created)."""
    return root() / folder_name(user)


def home_links(home: str, cache: str) -> list[tuple[str, str]]:
    """``(link, target)`` for each of :data:`HOME_CACHES`: the link in the node's ``home`` and
    the folder of the cache ``cache`` it leads to (rule 5)."""
    return [(f"{home}/{name}", f"{cache}/{HOME_FOLDER}/{name}") for name in HOME_CACHES]


def ensure(path: Path, owner: tuple[int, int] | None) -> None:
    """Make the cache folder ``path`` (rules 1 and 2) and its :data:`HOME_CACHES` folders (rule
    5), owned by ``owner`` (None: the service's own user); changed through descriptors, never
    by name."""
    base = Path(path).parent
    base.mkdir(mode=0o700, parents=True, exist_ok=True)
    for _ in range(2):
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            wanted = owner or (os.geteuid(), os.getegid())
            if (st.st_uid, st.st_gid) == wanted or not _has_entries(fd):
                if (st.st_uid, st.st_gid) != wanted:
                    os.fchown(fd, *wanted)
                os.fchmod(fd, 0o700)
                _ensure_home_folders(fd, wanted)
                return
        finally:
            os.close(fd)
        _discard(Path(path))  # made for another account: start again (rule 2)


def _ensure_home_folders(cache_fd: int, owner: tuple[int, int]) -> None:
    """``home/<name>`` for each of :data:`HOME_CACHES` below the cache open at ``cache_fd``,
    owned by ``owner``; a name that is already something other than a folder is left alone."""
    folder = _own_folder(cache_fd, HOME_FOLDER, owner)
    if folder is None:
        return
    try:
        for name in HOME_CACHES:
            made = _own_folder(folder, name, owner)
            if made is not None:
                os.close(made)
    finally:
        os.close(folder)


def _own_folder(parent_fd: int, name: str, owner: tuple[int, int]) -> int | None:
    """The folder ``name`` below ``parent_fd`` (made if missing, given to ``owner`` when this
    made it), opened without following a link; None where the job left something else."""
    try:
        os.mkdir(name, 0o755, dir_fd=parent_fd)
        made = True
    except FileExistsError:
        made = False
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
    except OSError:
        return None
    if made and (os.fstat(fd).st_uid, os.fstat(fd).st_gid) != owner:
        os.fchown(fd, *owner)
    return fd


def _has_entries(fd: int) -> bool:
    with os.scandir(fd) as listing:
        return any(True for _ in listing)


def _discard(path: Path) -> None:
    """Move ``path`` aside (atomic) and remove it on a thread."""
    doomed = path.with_name(f".deleted-{path.name}-{os.urandom(3).hex()}")
    try:
        os.rename(path, doomed)
    except FileNotFoundError:
        return
    threading.Thread(target=remove_tree, args=(doomed,), daemon=True).start()


def _measure(path: Path) -> tuple[int, int, str | None]:
    """(bytes, files) of the regular files below ``path``; (0, 0) when it does not exist (or is
    a link: a cache folder is never measured through one); and why the walk refused it (rule
    4: what was counted before is the size then)."""
    try:
        found = folder_size([path], follow_top=False)
    except FolderRefused as exc:
        counted = exc.counted if isinstance(exc.counted, FolderSize) else FolderSize(0, 0)
        return counted.bytes, counted.files, exc.message
    return found.bytes, found.files, None


def usage(user: str | None, *, every_user: bool = False, base: Path | None = None) -> list[CacheInfo]:
    """The size of ``user``'s cache, or (``every_user``) of every cache, by user name;
    ``base``: the folder of caches (default :func:`root`; a Ray node's is its service's)."""
    base = base or root()
    if not every_user:
        names = [folder_name(user)]
    else:
        try:
            names = sorted(e.name for e in os.scandir(base) if not e.name.startswith(".") and e.is_dir())
        except FileNotFoundError:
            names = []
    found = []
    for name in names:
        path = base / name
        total, files, refused = _measure(path)
        found.append(CacheInfo(user=name, path=str(path), bytes=total, files=files, refused=refused))
    return found


def clear(user: str | None, *, base: Path | None = None) -> None:
    """Empty ``user``'s cache (rule 3), and remove what a service that stopped while removing an
    earlier one left; ``base`` as for :func:`usage`."""
    base = base or root()
    if base.is_dir():
        for leftover in base.glob(".deleted-*"):
            threading.Thread(target=remove_tree, args=(leftover,), daemon=True).start()
    _discard(base / folder_name(user))
