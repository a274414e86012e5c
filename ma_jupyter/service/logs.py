"""Reading job logs by byte offset, with a long-poll for followers.

Nodes write their log files themselves; the service only reads them.  A reader asks for bytes
from an offset and gets them with the next offset, so a follower that reconnects (a restarted
kernel, a new browser tab) continues exactly where it stopped: nothing is replayed, nothing is
skipped.  A chunk never ends inside a UTF-8 character.
"""

from __future__ import annotations

import asyncio
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from ..errors import BackendUnavailable, InvalidSpec, NotFound
from ..jobdir import RANK_LOG_VIEW, JobDir, rank_log_name
from ..models import Job, LogChunk, LogStream
from ..untrusted import open_file, pread_range

T = TypeVar("T")

FOLLOW_POLL = 0.005  # seconds between size checks (fstat of the open file) while a follower waits
STATUS_EVERY = 0.1  # seconds between full looks (job status + read, on a thread) while waiting
READ_TIMEOUT = 10.0  # seconds one look at a log may take before the request gives up
MAX_WAIT = 60.0


def _regular_size(path: Path) -> int:
    """The size of a regular file, without following a symlink; 0 for anything else or nothing."""
    try:
        st = path.lstat()
    except OSError:
        return 0
    return st.st_size if stat.S_ISREG(st.st_mode) else 0


def streams(job: Job, job_dir: Path) -> list[LogStream]:
    """Every log stream of a job: each node's combined log, then its per-rank logs.

    Only looks (``lstat``), never opens or follows: a stream that is not a regular file shows
    size 0 and is refused when read.
    """
    found: list[LogStream] = []
    names = [n.name for n in job.nodes]
    jd = JobDir(job_dir)
    for extra in jd.node_logs():
        if extra not in names:
            names.append(extra)
    for name in names:
        found.append(LogStream(node=name, rank=None, size=_regular_size(jd.node_log(name))))
        for rank, rank_file in jd.rank_logs(name):
            found.append(LogStream(node=name, rank=rank, size=_regular_size(rank_file)))
    return found


def default_node(job: Job) -> str:
    """The stream a reader gets without naming a node: the first primary node (worker-0)."""
    for run in job.nodes:
        if run.primary:
            return run.name
    return "worker-0"


def open_stream(job_dir: Path, node: str, rank: int | None) -> int | None:
    """An fd of one stream's file opened as untrusted (see :mod:`ma_jupyter.untrusted`); None
    while it does not exist.

    Raises:
        RefusedFile: the job put something else than a regular file there (FIFO, symlink...).
    """
    relative = JobDir(job_dir).log_relative(node, rank)
    shown = f"{RANK_LOG_VIEW}/{rank_log_name(rank)}" if rank is not None else str(job_dir / relative)
    try:
        return open_file(job_dir, relative, owner=node, shown=shown)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _whole_characters(data: bytes) -> bytes:
    """``data`` without a multi-byte UTF-8 character cut at its end (kept for the next read)."""
    cut = len(data)
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:  # continuation byte: keep looking for the lead byte
            continue
        if byte & 0x80:  # lead byte of a multi-byte character
            need = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4
            if back < need:
                cut = len(data) - back
        break
    return data[:cut]


def read_fd(fd: int | None, offset: int, limit: int) -> tuple[bytes, int]:
    """Bytes of an open stream from ``offset`` (at most ``limit``), trimmed to whole UTF-8
    characters; (data, size now).  ``fd`` None (no file yet) reads as empty."""
    if fd is None:
        return b"", 0
    data, size = pread_range(fd, offset, limit)
    return _whole_characters(data), size


def read_stream(job_dir: Path, node: str, rank: int | None, offset: int, limit: int) -> tuple[bytes, int]:
    """Open, read and close one stream (see :func:`open_stream` and :func:`read_fd`); blocking-safe
    but still file I/O: the event loop calls it on a thread."""
    fd = open_stream(job_dir, node, rank)
    try:
        return read_fd(fd, offset, limit)
    finally:
        if fd is not None:
            os.close(fd)


async def _off_loop(fn: Callable[[], T], what: str) -> T:
    """Run ``fn`` on a thread, giving up after ``READ_TIMEOUT`` (the thread is left to finish)."""
    try:
        return await asyncio.wait_for(asyncio.to_thread(fn), READ_TIMEOUT)
    except TimeoutError:
        raise BackendUnavailable(f"reading {what} took more than {READ_TIMEOUT:g} s; try again") from None


async def read_chunk(
    job_id: str,
    job_dir: Path,
    node: str,
    rank: int | None,
    offset: int,
    limit: int,
    wait: float,
    is_terminal: Callable[[], bool],
) -> LogChunk:
    """Read one chunk; with ``wait`` > 0, wait until there are new bytes, the job ends, or time is up.

    ``eof`` is set only when the job is terminal and the reader has everything: the status is
    read *before* the file, so bytes written just before the job ended are never missed.

    Never blocks the event loop: opening and reading the file and asking the store for the
    status run on a thread (bounded by ``READ_TIMEOUT``); in between, the wait watches the open
    file's size with ``fstat``, which cannot block.  The file is opened as untrusted.

    Raises:
        RefusedFile: the stream is not a regular file (a FIFO, a symlink...).
        BackendUnavailable: reading took longer than ``READ_TIMEOUT``.
    """
    if offset < 0 or limit <= 0:
        raise InvalidSpec("offset must be >= 0 and limit > 0")
    JobDir(job_dir).log_relative(node, rank)  # refuse bad names before anything else
    what = f"the log {node}" + (f" rank {rank}" if rank is not None else "")
    deadline = time.monotonic() + min(max(wait, 0.0), MAX_WAIT)
    holder: list[int | None] = [None]

    def step() -> tuple[bool, bytes, int]:
        terminal = is_terminal()
        if holder[0] is None:
            holder[0] = open_stream(job_dir, node, rank)
        data, size = read_fd(holder[0], offset, limit)
        return terminal, data, size

    try:
        while True:
            terminal, data, size = await _off_loop(step, what)
            if data or terminal or time.monotonic() >= deadline:
                break
            # Until the next full look (status + read), watch the size of the open file only.
            next_look = min(deadline, time.monotonic() + STATUS_EVERY)
            while time.monotonic() < next_look:
                await asyncio.sleep(FOLLOW_POLL)
                fd = holder[0]
                if fd is not None and os.fstat(fd).st_size > offset:
                    break
    finally:
        if holder[0] is not None:
            # a thread that timed out may still use it; closing then makes its read fail, harmlessly
            os.close(holder[0])
    next_offset = offset + len(data)
    return LogChunk(
        job_id=job_id,
        node=node,
        rank=rank,
        offset=offset,
        next_offset=next_offset,
        data=data.decode("utf-8", "replace"),
        eof=terminal and next_offset >= size,
    )


def ensure_stream(job: Job, job_dir: Path, node: str, rank: int | None) -> None:
    """NotFound for a node the job does not have (a queued job's worker-0 is allowed: it will come)."""
    known = {n.name for n in job.nodes} | {s.node for s in streams(job, job_dir)}
    if job.nodes and node not in known:
        raise NotFound(f"job {job.id} has no node {node!r}: its nodes are {', '.join(sorted(known))}")
