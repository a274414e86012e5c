"""The local backend's logs and failure reports: files in the job folder, read as untrusted.

A node writes its own log files (``logs/<node>.log``, ``logs/<node>/rank-<r>.log``) and its
launcher may leave a failure report; the job can put anything at those paths (a FIFO, a symlink
to the service's token...).  Everything here goes through :mod:`ma_jupyter.untrusted`: a stream
is listed with ``lstat`` only, opened with ``O_NOFOLLOW | O_NONBLOCK`` below the trusted job
folder, and kept only when it is a regular file with one name; whatever else the job left is a
:class:`~ma_jupyter.errors.RefusedFile` naming it.  No call blocks on a file the job controls.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

from ..errors import RefusedFile
from ..jobdir import RANK_LOG_VIEW, JobDir, rank_log_name
from ..models import LogFile, LogStream
from ..untrusted import open_file, pread_range, read_small


def _regular_size(path: Path) -> int:
    """The size of a regular file, without following a symlink; 0 for anything else or nothing."""
    try:
        st = path.lstat()
    except OSError:
        return 0
    return st.st_size if stat.S_ISREG(st.st_mode) else 0


def log_file(jd: JobDir, node: str, rank: int | None) -> LogFile:
    """Where a reader on this machine opens one stream of the job folder ``jd`` itself (as
    :func:`open_log` does: below the job folder, following no link)."""
    return LogFile(root=str(jd.root), path=jd.log_relative(node, rank))


def log_streams(jd: JobDir, nodes: list[str]) -> list[LogStream]:
    """Every log stream of a job: each node's combined log, then its per-rank logs, each with
    its :func:`log_file` on this machine.

    ``nodes`` are the job's node names (in launch order); a log found for another name (an earlier
    attempt's node) follows them.  Only looks (``lstat``), never opens or follows: a stream that
    is not a regular file shows size 0 and is refused when read.
    """
    names = list(nodes)
    for extra in jd.node_logs():
        if extra not in names:
            names.append(extra)
    found: list[LogStream] = []
    for name in names:
        size = _regular_size(jd.node_log(name))
        found.append(LogStream(node=name, rank=None, size=size, file=log_file(jd, name, None)))
        for rank, rank_file in jd.rank_logs(name):
            file = log_file(jd, name, rank)
            found.append(LogStream(node=name, rank=rank, size=_regular_size(rank_file), file=file))
    return found


class LocalLogSource:
    """One log file of a job, open as untrusted: an fd on the regular file it was when opened.

    Implements :class:`~ma_jupyter.backends.base.LogSource`: :meth:`read` is ``pread`` from the
    offset, :meth:`size` is ``fstat`` (neither can block on a regular file of a local disk).
    """

    def __init__(self, fd: int):
        self._fd: int | None = fd

    def _open_fd(self) -> int:
        fd = self._fd
        if fd is None:
            raise OSError(errno.EBADF, "the log was closed")
        return fd

    def read(self, offset: int, limit: int) -> tuple[bytes, int]:
        if offset < 0 or limit < 0:
            raise ValueError("offset and limit must be >= 0")
        return pread_range(self._open_fd(), offset, limit)

    def size(self) -> int:
        return os.fstat(self._open_fd()).st_size

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def open_log(jd: JobDir, node: str, rank: int | None) -> LocalLogSource | None:
    """One stream's file opened as untrusted; None while it does not exist.

    Raises:
        InvalidSpec: ``node`` or ``rank`` cannot name a log (``../x``, a negative rank).
        RefusedFile: the job put something else than a regular file there (FIFO, symlink...).
    """
    relative = jd.log_relative(node, rank)
    shown = f"{RANK_LOG_VIEW}/{rank_log_name(rank)}" if rank is not None else str(jd.root / relative)
    try:
        fd = open_file(jd.root, relative, owner=node, shown=shown)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return LocalLogSource(fd)


def not_distributed(jd: JobDir, node: str) -> int | None:
    """The number of nodes when the node's launcher reported that no rank joined a process group
    (``nodes/<node>/not-distributed.json``); None without a readable report."""
    try:
        raw = read_small(
            jd.root, jd.not_distributed_relative(node), owner=node, shown=str(jd.node(node).not_distributed)
        )
        nodes = json.loads(raw)["nodes"]
    except (OSError, RefusedFile, ValueError, KeyError, TypeError):
        return None
    return nodes if type(nodes) is int and nodes > 1 else None


def failure(jd: JobDir, node: str) -> tuple[int, int] | str | None:
    """(rank, exit code) when the node's launcher recorded which rank failed first; a sentence
    when the job left something that is not a readable report there; else None."""
    try:
        raw = read_small(jd.root, jd.failure_relative(node), owner=node, shown=str(jd.node(node).failure))
    except RefusedFile as exc:
        return exc.message
    except OSError:
        return None
    try:
        data = json.loads(raw)
        if isinstance(data, dict) and isinstance(data.get("refused"), str):
            return data["refused"][:500]
        if isinstance(data, dict) and isinstance(data.get("reason"), str):  # the runner's own (memory)
            return data["reason"][:500]
        return int(data["rank"]), int(data["exit_code"])
    except (ValueError, KeyError, TypeError):
        return None
