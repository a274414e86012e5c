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
   or the folder holds more than :data:`MAX_FILES` files or :data:`MAX_BYTES` bytes (what the
   snapshot's default ship limit allows, four times over: a bigger folder is data, and reading
   it would make a submit slow).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from pathlib import Path

from . import config
from .foldersize import TooManyEntries, walk

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


def ignore(folder: str, names: list[str]) -> set[str]:
    """The names left out of ``folder``'s entries ``names`` (rule 1): :data:`IGNORED`, and the
    service home when it lies directly inside (its tokens, database and jobs are never code,
    and snapshots are written there)."""
    skipped = set(shutil.ignore_patterns(*IGNORED)(folder, names))
    home = config.home()
    if home.name in names and home.parent == Path(folder).resolve():
        skipped.add(home.name)
    return skipped


class _Unknown(Exception):
    """The content cannot be told whole (rule 4)."""


def _refuse(exc: OSError) -> None:
    raise _Unknown(str(exc)) from exc


def _file_hash(name: str, dir_fd: int, listed: os.stat_result) -> bytes:
    """The SHA-256 of the regular file ``name`` in the folder ``dir_fd``, opened without following
    a link and without blocking (a FIFO swapped in is refused, never waited on)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError as exc:
        raise _Unknown(f"{name}: {exc.strerror}") from exc
    try:
        opened = os.fstat(fd)
        same = (opened.st_dev, opened.st_ino) == (listed.st_dev, listed.st_ino)
        if not stat.S_ISREG(opened.st_mode) or not same:
            raise _Unknown(f"{name} was replaced while it was read")
        found = hashlib.sha256()
        while chunk := os.read(fd, _CHUNK):
            found.update(chunk)
        if os.fstat(fd).st_size != opened.st_size:
            raise _Unknown(f"{name} changed while it was read")
        return found.digest()
    except OSError as exc:
        raise _Unknown(f"{name}: {exc.strerror}") from exc
    finally:
        os.close(fd)


def digest(folder: str | os.PathLike[str]) -> str | None:
    """The content identity of ``folder`` (the module's rules): ``sha256:<64 hex digits>``, or
    None when it cannot be told whole (rule 4).  Never raises for what it finds on disk."""
    try:
        if not stat.S_ISDIR(os.stat(folder).st_mode):
            return None
    except OSError:
        return None
    records: list[tuple[bytes, bytes, bytes]] = []
    size = 0
    folders = walk([folder], ignore=ignore, onerror=_refuse, max_entries=4 * MAX_FILES)
    try:
        for path, dir_fd, entries in folders:
            for name, entry in entries:
                if len(records) >= MAX_FILES:
                    return None
                below = os.fsencode(os.path.normpath(os.path.join(path, name)))
                if stat.S_ISREG(entry.st_mode):
                    size += entry.st_size
                    if size > MAX_BYTES:
                        return None
                    executable = b"x" if entry.st_mode & stat.S_IXUSR else b"-"
                    records.append((below, b"f", executable + _file_hash(name, dir_fd, entry)))
                elif stat.S_ISLNK(entry.st_mode):
                    records.append((below, b"l", os.fsencode(os.readlink(name, dir_fd=dir_fd))))
                else:
                    records.append((below, b"o", b"%o" % stat.S_IFMT(entry.st_mode)))
    except (_Unknown, TooManyEntries, OSError):
        return None
    finally:
        folders.close()
    # a path and a link's target hold no NUL byte, a file's record has a fixed length: the
    # records join unambiguously
    found = hashlib.sha256(_FORMAT)
    for below, kind, payload in sorted(records):
        found.update(kind + b"\0" + below + b"\0" + payload + b"\0")
    return PREFIX + found.hexdigest()
