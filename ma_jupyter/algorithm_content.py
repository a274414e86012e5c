"""What of an algorithm folder a job runs, and that content's identity (its digest).

An algorithm is known by the folder it came from (``JobSpec.algorithm_origin``, else the folder
itself) and by its content: the same code copied elsewhere, or shipped again unchanged, is the
same algorithm; one edit makes a new version of it.  This module owns both halves of "content":

1. **What is shipped.** Every entry below the folder but the :data:`IGNORED` names (version
   control, caches, environments, notebooks' checkpoints) and the service's home when it lies
   directly inside: :func:`ignore`, in ``shutil.copytree``'s shape.  The snapshot's copy and size
   (:mod:`ma_jupyter.client.snapshot`) and the digest use it alike, so a folder and a snapshot of
   it have one digest.
2. **The digest** (:func:`digest`): ``sha256:`` and the hex SHA-256 over one record per entry
   that is not a folder, sorted by its path below the folder:

   * a regular file: its contents and whether its owner may execute it (the one mode bit a
     snapshot keeps: its other bits, owners and times never count);
   * a symbolic link: its target as written; never followed (a link towards anything outside
     is a link, not that thing's content);
   * anything else (FIFO, socket, device): its kind; never opened.

   A folder counts by what it holds (an empty one adds nothing).
3. **The walk** is :func:`ma_jupyter.foldersize.walk`: no link followed below the folder, each
   folder opened through its parent's descriptor, each file opened through its folder's
   descriptor without following a link, so nothing swapped in during the walk is read.
4. **No guess.** :func:`digest` is None when the content cannot be told whole: the folder is
   missing or not a folder, something below cannot be read, a file changed while it was read,
   an entry is not readable by the job's account (``account``: a folder it cannot list and
   enter, a file it cannot read, judged by the mode bits, the owner and the group alone: ACLs
   are not considered, and the job's processes hold no supplementary groups; the service may
   read what that account cannot, and a digest changing with such a file would tell of its
   changes), or the folder holds more than :data:`MAX_FILES` files or :data:`MAX_BYTES` bytes (what the
   snapshot's default ship limit allows, four times over: a bigger folder is data, and reading
   it would make a submit slow); those bounds are checked on the sizes first, reading nothing.
   A chain of folders deeper than the walk goes (:data:`ma_jupyter.foldersize.MAX_DEPTH`) is no
   guess either: :func:`digest` raises :class:`~ma_jupyter.errors.FolderRefused` for it, which
   refuses the submit with what to remove.
5. **Files read once.** A file's hash is remembered by what changes whenever its contents do
   (device, inode, size, modification and change times: the change time no user can set back),
   so a folder used as is, submitted again unchanged, costs a walk and no read.  A file changed
   within :data:`RACY_SECONDS` is never remembered (two writes within one tick of the file
   system's clock could leave those times equal); at most :data:`REMEMBERED` files are.
6. **Bounded reading** (:func:`digest_bounded`): at most a :class:`ReadBudget`'s bytes of files
   not remembered are read; past that the digest is None and said to be cut short, so a caller
   holding a lock never reads a big edited folder whole.
"""

from __future__ import annotations

import os
import shutil
import stat
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import NamedTuple

from . import statehome
from .errors import ContentUnknown, FolderRefused, ReadBudgetSpent
from .foldersize import folder_size, walk

#: never shipped: version control, caches, environments, notebooks' checkpoints
IGNORED = (
    ".git",
    ".hg",
    ".svn",
    "__pycache__",
    ".ipynb_checkpoints",
    "*.pyc",
    ".venv",
    "venv",
    "node_modules",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
    ".tox",
)

#: the most bytes of regular files a digested folder may hold (rule 4)
MAX_BYTES = 400 << 20
#: the most files (entries that are not folders) a digested folder may hold (rule 4)
MAX_FILES = 20_000

#: every digest starts so (the wire model's ``Digest``)
PREFIX = "sha256:"
#: the first bytes hashed: a change of the record format makes every digest a new one
_FORMAT = b"ma-jupyter algorithm content 1\0"
_CHUNK = 1 << 20

#: how many file hashes are remembered (rule 5), the least recently used forgotten first
REMEMBERED = 50_000
#: a file changed this recently is hashed every time (rule 5)
RACY_SECONDS = 2.0
_remembered: OrderedDict[tuple[int, ...], bytes] = OrderedDict()
_remembered_lock = threading.Lock()


class Account(NamedTuple):
    """The account a job's processes run as: its uid and its one group (no supplementary ones)."""

    uid: int
    gid: int


def _allows(st: os.stat_result, account: Account, wanted: int) -> bool:
    """Whether ``account`` has the ``wanted`` permission bits (4 read, 1 search) on ``st`` by its
    mode, owner and group (rule 4: ACLs are not considered; the owner's bits decide for the
    owner even where the others' would allow more, as the kernel does)."""
    if account.uid == 0:
        return True
    if st.st_uid == account.uid:
        bits = st.st_mode >> 6
    elif st.st_gid == account.gid:
        bits = st.st_mode >> 3
    else:
        bits = st.st_mode
    return bits & wanted == wanted


def _identity(st: os.stat_result) -> tuple[int, ...]:
    """What changes whenever a file's contents do (rule 5)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def ignore(folder: str, names: list[str]) -> set[str]:
    """The names left out of ``folder``'s entries ``names`` (rule 1): :data:`IGNORED`, and the
    service home when it lies directly inside (its tokens, database and jobs are never code,
    and snapshots are written there)."""
    skipped = set(shutil.ignore_patterns(*IGNORED)(folder, names))
    home = statehome.home()
    if home.name in names and home.parent == Path(folder).resolve():
        skipped.add(home.name)
    return skipped


class ReadBudget:
    """Bytes of files not remembered that may still be read (rule 6), shared by the digests
    given it; None: no bound."""

    def __init__(self, limit: int | None = None):
        self.left = limit

    def spend(self, size: int) -> None:
        if self.left is None:
            return
        if size > self.left:
            raise ReadBudgetSpent
        self.left -= size


def _refuse(exc: OSError) -> None:
    raise ContentUnknown(str(exc)) from exc


def _file_hash(name: str, dir_fd: int, listed: os.stat_result, budget: ReadBudget) -> bytes:
    """The SHA-256 of the regular file ``name`` in the folder ``dir_fd`` (remembered: rule 5),
    opened without following a link and without blocking (a FIFO swapped in is refused, never
    waited on)."""
    key = _identity(listed)
    with _remembered_lock:
        known = _remembered.get(key)
        if known is not None:
            _remembered.move_to_end(key)
            return known
    budget.spend(listed.st_size)
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError as exc:
        raise ContentUnknown(f"{name}: {exc.strerror}") from exc
    try:
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode) or _identity(opened) != key:
            raise ContentUnknown(f"{name} was replaced or changed since it was listed")
        import hashlib  # here: a submit that only walks a folder (what to ship) never digests

        found = hashlib.sha256()
        while chunk := os.read(fd, _CHUNK):
            found.update(chunk)
        if _identity(os.fstat(fd)) != key:
            raise ContentUnknown(f"{name} changed while it was read")
    except OSError as exc:
        raise ContentUnknown(f"{name}: {exc.strerror}") from exc
    finally:
        os.close(fd)
    value = found.digest()
    if time.time_ns() - listed.st_ctime_ns > RACY_SECONDS * 1e9:
        with _remembered_lock:
            _remembered[key] = value
            while len(_remembered) > REMEMBERED:
                _remembered.popitem(last=False)
    return value


def digest(folder: str | os.PathLike[str], account: Account | None = None) -> str | None:
    """The content identity of ``folder`` (the module's rules): ``sha256:<64 hex digits>``, or
    None when it cannot be told whole (rule 4), also when an entry is not readable by
    ``account`` (None: the job runs as this process's own account, nothing is checked).

    Raises:
        FolderRefused: a chain of folders below deeper than the walk goes (rule 4), which no
            copy, snapshot or shipping of the folder could take either; nothing else it finds
            on disk raises."""
    return digest_bounded(folder, account, ReadBudget())[0]


def digest_bounded(
    folder: str | os.PathLike[str], account: Account | None, budget: ReadBudget
) -> tuple[str | None, bool]:
    """:func:`digest`, reading no more bytes of files not remembered than ``budget`` has left
    (rule 6, and spending them); also whether it stopped for that bound (the digest is then
    None)."""
    try:
        return _digest(folder, account, budget), False
    except ReadBudgetSpent:
        return None, True


def _digest(folder: str | os.PathLike[str], account: Account | None, budget: ReadBudget) -> str | None:
    try:
        if not stat.S_ISDIR(os.stat(folder).st_mode):
            return None
    except OSError:
        return None
    # a folder past the bounds is told by its sizes alone, before a byte of it is read
    try:
        sizes = folder_size([folder], limit=MAX_BYTES, max_entries=4 * MAX_FILES, ignore=ignore)
    except FolderRefused as exc:
        if exc.bound == "depth":
            raise  # no job can be given that folder (rule 4): the submit is refused, saying why
        return None  # too many entries (checked as each is listed), too slow: data, not code
    if sizes.bytes > MAX_BYTES or sizes.files > MAX_FILES:
        return None
    records: list[tuple[bytes, bytes, bytes]] = []
    size = 0
    folders = walk([folder], ignore=ignore, onerror=_refuse, max_entries=4 * MAX_FILES)
    try:
        for path, dir_fd, entries in folders:
            if account is not None and not _allows(os.fstat(dir_fd), account, 5):
                return None  # a folder the job's account cannot list or enter
            for name, entry in entries:
                if len(records) >= MAX_FILES:
                    return None
                below = os.fsencode(os.path.normpath(os.path.join(path, name)))
                if stat.S_ISREG(entry.st_mode):
                    size += entry.st_size
                    if size > MAX_BYTES:
                        return None
                    if account is not None and not _allows(entry, account, 4):
                        return None  # a file the job's account cannot read
                    executable = b"x" if entry.st_mode & stat.S_IXUSR else b"-"
                    records.append((below, b"f", executable + _file_hash(name, dir_fd, entry, budget)))
                elif stat.S_ISLNK(entry.st_mode):
                    records.append((below, b"l", os.fsencode(os.readlink(name, dir_fd=dir_fd))))
                else:
                    records.append((below, b"o", b"%o" % stat.S_IFMT(entry.st_mode)))
    except (ContentUnknown, FolderRefused, OSError):
        return None
    finally:
        folders.close()
    # a path and a link's target hold no NUL byte, a file's record has a fixed length: the
    # records join unambiguously
    import hashlib

    found = hashlib.sha256(_FORMAT)
    for below, kind, payload in sorted(records):
        found.update(kind + b"\0" + below + b"\0" + payload + b"\0")
    return PREFIX + found.hexdigest()
