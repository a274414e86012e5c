"""The node's end records (``nodes/<node>/failure.json``, ``exit_code``, ``kept.json``), written
atomically by the node runner (:mod:`.noderun` rule 6) so that a disk the job fills never keeps
its node's end from being recorded.

1. :func:`reserve_room` holds a record's disk from the node's start: a file beside it
   (``<name>.room``) with its blocks allocated.
2. :func:`write_record` writes a record into its room in place (no new block), cuts it to its
   length and renames it over the record; without a room it makes the file then.
3. :func:`write_end` tries a write again while the disk is full, until a deadline shared by all
   of the node's end; any other error ends it at once.
4. A room is opened without following a link and without blocking: where the node's folder is
   the job's account's (no sandbox), a job may leave a FIFO or a link there, and the runner
   would hang on it, its node never ended.  Anything there that is not a regular file of one
   link (a hard link would have the write land in another file) is removed and a file made in
   its place.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: seconds the end's writes (the failure report, the exit code) keep trying, all together, on a
#: full disk (a record bigger than its reserved room, or one made without it): a watchdog's cut,
#: the service's reserve or another job's end may give room back meanwhile
END_WRITE_WAIT = 10.0
#: bytes of disk each of the node's end records holds from the node's start (:func:`reserve_room`)
END_RECORD_ROOM = 16 << 10
#: the errors a full disk (or a full quota) gives, which the end's writes wait out
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def _room(path: Path) -> Path:
    return path.with_name(path.name + ".room")


#: a room opens without following a link, and without waiting on a FIFO for its reader (rule 4)
_ROOM_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _open_room(room: Path) -> int:
    """Rule 4: a descriptor of the regular file ``room`` (made where missing); a link, hard link,
    FIFO or socket left in its place is removed first.

    Raises:
        OSError: it cannot be opened or made (a full disk, a folder in its place).
    """
    try:
        fd = os.open(room, _ROOM_FLAGS, 0o666)
    except OSError as exc:
        # ELOOP: a link; ENXIO: a FIFO nobody reads; other errors are the caller's
        if exc.errno not in (errno.ELOOP, errno.ENXIO):
            raise
    else:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
            return fd
        os.close(fd)  # a FIFO someone holds open for reading, or another file's name
    os.unlink(room)
    return os.open(room, _ROOM_FLAGS | os.O_EXCL, 0o666)


def reserve_room(path: Path, size: int = END_RECORD_ROOM) -> None:
    """Hold ``size`` bytes of disk now for the last write of the record ``path``: a file beside
    it (``<name>.room``) with its blocks allocated, which :func:`write_record` fills in place and
    renames over ``path``, so a disk the job fills later cannot keep the node's end from being
    recorded.  Where it cannot be made (no room even now, no ``fallocate`` on that file system),
    the write makes its file when it comes."""
    try:
        fd = _open_room(_room(path))
    except OSError:
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_record(path: Path, data: bytes, *, sync: bool = False) -> None:
    """Atomically replace ``path`` with ``data``: written at the start of its room (reserved by
    :func:`reserve_room`: no new block is needed; else a new file), cut to its length, synced
    with ``sync``, then renamed over ``path``.  A record's room serves its first write only."""
    room = _room(path)
    fd = _open_room(room)
    try:
        view = memoryview(data)
        done = 0
        while done < len(view):
            done += os.pwrite(fd, view[done:], done)
        os.ftruncate(fd, len(data))
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(room, path)


def write_exit_code(path: Path, code: int) -> None:
    """Atomically write ``code`` to ``path``, synced (:func:`write_record`)."""
    write_record(path, f"{code}\n".encode(), sync=True)


def write_report(path: Path, data: dict) -> None:
    """Atomically write a small JSON report the runner itself makes (:func:`write_record`)."""
    write_record(path, json.dumps(data).encode())


def write_end(
    write: Callable[[Path, Any], None], path: Path, value: Any, deadline: float, say: Callable[[str], None]
) -> bool:
    """``write(path, value)`` (:func:`write_report`, :func:`write_exit_code`), tried again every
    quarter second while it fails for a full disk, until the monotonic ``deadline`` (one for all
    of a node's end: :data:`END_WRITE_WAIT`); False when it did not succeed (told to ``say``: the
    node's log, where that can be written).  Any other error (the node's folder deleted) ends it
    at once."""
    while True:
        try:
            write(path, value)
            return True
        except OSError as exc:
            if exc.errno not in DISK_FULL or time.monotonic() >= deadline:
                say(f"could not write {path.name}: {exc}")
                return False
            time.sleep(0.25)
