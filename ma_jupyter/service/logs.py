"""Reading job logs by byte offset, with a long-poll for followers.

Nodes write their logs themselves and the backend reads them (:meth:`Backend.open_log
<ma_jupyter.backends.base.Backend.open_log>` gives a :class:`~ma_jupyter.backends.base.LogSource`);
this module only decides what a reader gets.  A reader asks for bytes from an offset and gets
them with the next offset, so a follower that reconnects (a restarted kernel, a new browser tab)
continues exactly where it stopped: nothing is replayed, nothing is skipped.  A chunk never ends
inside a UTF-8 character.

The supervisor's own reads of a node's log (a failure's last lines, performance samples, the
size a new attempt's part starts at) are the byte-reading functions at the end of this module
(:func:`read_log`, :func:`log_size`, :func:`last_lines`): each opens the stream through the
backend, reads, and closes it, and says what it gives when the log is missing or gone.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from typing import TypeVar

from ..backends.base import Backend, LogSource
from ..errors import BackendUnavailable, InvalidSpec, NodeLost, NotFound, RefusedFile
from ..jobdir import check_node_name
from ..models import Job, LogChunk
from .store import ChangeSignal

T = TypeVar("T")

FOLLOW_POLL = 0.005  # seconds between size checks (LogSource.size) while a follower waits
STATUS_EVERY = 0.1  # seconds between full looks (job status + read, on a thread) while waiting
READ_TIMEOUT = 10.0  # seconds one look at a log may take before the request gives up
MAX_WAIT = 60.0


def default_node(job: Job) -> str:
    """The stream a reader gets without naming a node (:attr:`Job.log_node`: the first primary
    node, the chief when there is one, even while the job is queued)."""
    return job.log_node


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


def tail(source: LogSource, lines: int, max_bytes: int = 16384) -> list[str]:
    """The last ``lines`` lines of a stream, from at most its last ``max_bytes`` bytes."""
    size = source.size()
    data, _size = source.read(max(0, size - max_bytes), max_bytes)
    return data.decode("utf-8", "replace").splitlines()[-lines:]


async def _off_loop(fn: Callable[[], T], what: str) -> T:
    """Run ``fn`` on a thread, giving up after ``READ_TIMEOUT`` (the thread is left to finish)."""
    try:
        return await asyncio.wait_for(asyncio.to_thread(fn), READ_TIMEOUT)
    except TimeoutError:
        raise BackendUnavailable(f"reading {what} took more than {READ_TIMEOUT:g} s; try again") from None


async def read_chunk(
    backend: Backend,
    job_id: str,
    node: str | Callable[[], str],
    rank: int | None,
    offset: int,
    limit: int,
    wait: float,
    is_terminal: Callable[[], bool],
    changes: ChangeSignal | None = None,
) -> LogChunk:
    """Read one chunk; with ``wait`` > 0, wait until there are new bytes, the job ends, or time is up.

    ``node`` is the stream's node, or a function naming it that runs on the reading thread just
    before the first look (the route's access check and job lookup): a reader whose bytes are
    there costs one thread hop, not two.  ``changes``, the store's signal of job updates, makes
    a waiting reader look at the status as soon as a job changes (the end of a job reaches its
    followers at once) rather than at the next ``STATUS_EVERY``.

    ``eof`` is set only when the job is terminal and the reader has everything: the status is
    read *before* the stream, so bytes written just before the job ended are never missed.

    Never blocks the event loop: opening and reading the stream (through the backend) and asking
    the store for the status run on a thread (bounded by ``READ_TIMEOUT``); in between, the wait
    watches the open stream's :meth:`~ma_jupyter.backends.base.LogSource.size`, which never blocks.

    Raises:
        InvalidSpec: a bad offset, limit, node name or rank.
        RefusedFile: the job replaced the stream with something unreadable (a FIFO, a symlink...).
        BackendUnavailable: reading took longer than ``READ_TIMEOUT``.
    """
    if offset < 0 or limit <= 0:
        raise InvalidSpec("offset must be >= 0 and limit > 0")
    if rank is not None and rank < 0:
        raise InvalidSpec("rank must be 0 or more", field="rank")
    named: list[str] = []
    if isinstance(node, str):
        named.append(check_node_name(node))  # refuse bad names before anything else
    resolve = node
    what = (
        "the log"
        + (f" {node}" if isinstance(node, str) else "")
        + (f" rank {rank}" if rank is not None else "")
    )
    deadline = time.monotonic() + min(max(wait, 0.0), MAX_WAIT)
    holder: list[LogSource | None] = [None]

    def step(look_at_status: bool = True) -> tuple[bool, bytes, int]:
        if not named:
            named.append(check_node_name(resolve()))
        terminal = is_terminal() if look_at_status else False
        if holder[0] is None:
            holder[0] = backend.open_log(job_id, named[0], rank)
        source = holder[0]
        if source is None:  # not written yet
            return terminal, b"", 0
        data, size = source.read(offset, limit)
        return terminal, _whole_characters(data), size

    changed: asyncio.Future[None] | None = None
    try:
        look_at_status = True
        while True:
            if changes is not None and look_at_status:
                if changed is not None:
                    changes.unsubscribe(changed)
                changed = changes.subscribe()  # before the look: a change during it still counts
            terminal, data, size = await _off_loop(functools.partial(step, look_at_status), what)
            if data or terminal or time.monotonic() >= deadline:
                break
            # Until the next full look (status + read), watch the size of the open stream only.
            # When it grows, the next look reads without the status: the answer then has bytes
            # and no eof, which the reader's next request settles (one store query less for
            # each wake-up of a live follower).
            look_at_status = True
            next_look = min(deadline, time.monotonic() + STATUS_EVERY)
            while time.monotonic() < next_look:
                await asyncio.sleep(FOLLOW_POLL)
                source = holder[0]
                if source is not None and source.size() > offset:
                    look_at_status = False
                    break
                if changed is not None and changed.done():
                    break  # a job changed: look at the status now
    finally:
        if changed is not None:
            changes.unsubscribe(changed)
        if holder[0] is not None:
            # a thread that timed out may still use it; closing then makes its read fail, harmlessly
            holder[0].close()
    next_offset = offset + len(data)
    return LogChunk(
        job_id=job_id,
        node=named[0],
        rank=rank,
        offset=offset,
        next_offset=next_offset,
        data=data.decode("utf-8", "replace"),
        eof=terminal and next_offset >= size,
    )


def ensure_stream(job: Job, backend: Backend, node: str, rank: int | None) -> None:
    """NotFound for a node the job does not have (a queued job's worker-0 is allowed: it will come),
    or for a rank that runs on another node (saying which)."""
    if rank is not None:
        elsewhere = job.rank_elsewhere(node, rank)
        if elsewhere is not None:
            raise NotFound(elsewhere)
    if not job.nodes or any(n.name == node for n in job.nodes):
        return  # the common case, without listing the job's log folder
    known = {n.name for n in job.nodes} | {s.node for s in backend.log_streams(job)}
    if node not in known:
        raise NotFound(f"job {job.id} has no node {node!r}: its nodes are {', '.join(sorted(known))}")


# ------------------------------------------------------------------ the supervisor's reads


def read_log(backend: Backend, job_id: str, node: str, offset: int, limit: int) -> bytes:
    """At most ``limit`` bytes of a node's log from ``offset`` (none while it does not exist, or
    once it is gone with its Ray node: the supervisor's poll then finds the node lost).

    Raises:
        RefusedFile: the job replaced its log with something unreadable.
    """
    try:
        source = backend.open_log(job_id, node, None)
    except NodeLost:
        return b""
    if source is None:
        return b""
    try:
        return source.read(offset, limit)[0]
    finally:
        source.close()


def log_size(backend: Backend, job_id: str, node: str) -> int:
    """The size of a node's log now (0 while it does not exist or cannot be read)."""
    try:
        source = backend.open_log(job_id, node, None)
    except (RefusedFile, NodeLost, OSError):
        return 0
    if source is None:
        return 0
    try:
        return source.size()
    finally:
        source.close()


def last_lines(backend: Backend, job_id: str, node: str, lines: int) -> list[str]:
    """The last ``lines`` lines of a node's log (empty if it does not exist or cannot be read); a
    log the job replaced with something unreadable, or one gone with its node, gives one line
    saying so."""
    try:
        source = backend.open_log(job_id, node, None)
        if source is None:
            return []
        try:
            return tail(source, lines)
        finally:
            source.close()
    except (RefusedFile, BackendUnavailable, NodeLost) as exc:  # planted by the job / gone with its node
        return [exc.message]
    except OSError:
        return []
