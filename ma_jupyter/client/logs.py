"""Reading job logs: :class:`LogLines` (one stream, line by line), :class:`LogStreams` (every
stream of a job at once, one thread each) and the helpers the front ends build on them.

A stream is one node's log, or one rank's log of a node: ``(node, rank)``, rank None for the
node's own log. Every reader continues from a byte offset, so a reader that starts again (a
restarted kernel, a new cell) shows nothing twice and misses nothing.

Why one module (over 600 lines): its readers (one stream, every stream of a job, the follower)
share one reading rule set, byte offsets, partial lines held back, the local file or the
service, the retries while the service is away, and the follower is built on the other two; the
client's calls are elsewhere (it needs of a client only :class:`LogClient`).
"""

from __future__ import annotations

import itertools
import operator
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from ..errors import BackendUnavailable, MaJupyterError, NodeLost, NotFound, RefusedFile
from ..wire import JobStatus

TYPE_CHECKING = False  # typing's, without importing typing (a command line's call: ~5 ms)
if TYPE_CHECKING:  # annotations only: the client imports pydantic when it validates an answer
    from typing import Any, Protocol

    from ..models import Job, LogChunk, LogFile, LogStream

FOLLOW_WAIT = 10.0  # long-poll seconds per log read while following
READ_LIMIT = 1 << 20
FIRST_READ = 64 << 10

if TYPE_CHECKING:  # an annotation's: no class at run time

    class LogClient(Protocol):
        """What the readers of this module need of a client: :class:`ma_jupyter.client.Client` is
        one (this module does not import it: the HTTP client builds on the readers, not both ways)."""

        #: whether a reader may read a stream's file itself where the service says it may
        local_logs: bool

        def read_log(
            self,
            job_id: str,
            node: str | None = None,
            rank: int | None = None,
            offset: int = 0,
            wait: float = 0,
            limit: int = READ_LIMIT,
        ) -> LogChunk: ...

        def log_streams(self, job_id: str) -> list[LogStream]: ...

        def local_log_file(self, job_id: str, node: str, rank: int | None = None) -> LogFile | None: ...

        def reads_local_files(self) -> bool: ...

        def get(self, job_id: str) -> Job: ...


LOCAL_READ = (
    256 << 10
)  # bytes per direct read of a local log file: small chunks keep splitting cache-friendly
FOLLOW_PATIENCE = 120.0  # seconds a log follower keeps retrying while the service is away
LONG_POLL = 2.0  # seconds each read of LogStreams may wait on the service
RANK_POLL = 0.5  # seconds between two reads of a rank's log for its unfinished line (no wait)
#: bytes of an unfinished line kept for showing its state now (:attr:`LogLines.partial`): its
#: end is what a terminal shows of a redrawn progress bar, and a front end cuts it shorter still
PARTIAL_LIMIT = 16 << 10

#: one log stream: (node, rank); rank None is the node's own log
StreamKey = tuple[str, int | None]


def stream_label(key: StreamKey) -> str:
    """``worker-0`` or ``worker-0/rank-1``: notebook records and cell metadata keep offsets under it."""
    node, rank = key
    return node if rank is None else f"{node}/rank-{rank}"


class LogLines(Iterator[str]):
    """Lines of one log stream read by byte offset, optionally following it to the job's end.

    Rules:

    1. The first read goes through the service: it checks access and names the stream's node.
    2. Where the stream's file is comes from the service (only the backend knows): with the
       answer to a read from offset 0 (its ``file``), else, once a read brought bytes and the
       stream goes on, by asking (:meth:`LogClient.local_log_file`).  When it is on this machine and readable,
       bytes come straight from the file while there are any, and the service is asked only at
       the end of what is written: its long-poll says when more bytes arrive and when the job
       has ended (``eof``).
    3. Every read starts at the byte offset where the previous one stopped, whichever path
       served it, so no line is lost or repeated.
    4. A file that is not what the job should have left there (a symlink, a FIFO) is never
       followed nor waited on: the reader goes on through the service, which says what the job did.
    5. Lines come out whole: an unfinished last line (a progress bar redrawn with ``\r``) waits
       for its newline, or for the job's end.  With ``partials``, each read that changes it
       also yields an empty chunk (:meth:`batches`: an empty batch) after which
       :attr:`partial` holds it as it stands now, so a follower can show it before the newline
       comes; :attr:`offset` never moves past it (a later reader reads it again, whole).

    Attributes:
        node: the stream's node (resolved from the service's first answer when not given).
        offset: byte offset just after the last line yielded.
        partial: the unfinished line after :attr:`offset` as read so far (its last
            :data:`PARTIAL_LIMIT` bytes, decoded), "" when none (kept with ``partials`` only).
    """

    def __init__(
        self,
        client: LogClient,
        job_id: str,
        *,
        follow: bool,
        node: str | None,
        rank: int | None,
        offset: int,
        wait: float = FOLLOW_WAIT,
        partials: bool = False,
    ):
        self.client = client
        self.partials = partials
        self.partial = ""
        self.job_id = job_id
        self.follow = follow
        self.node = node
        self.rank = rank
        self._read_offset = offset
        self._wait = wait
        self._local: LogFile | None = None
        self._unlocated = client.local_logs  # rule 2's question is still to ask
        self._file: Any = None
        # The lines of the chunk being consumed, and where its bytes start and end: the
        # consumer pulls lines through itertools.chain at C speed, and :attr:`offset` is worked
        # out from the list iterator's position only when someone asks for it.
        self._lines: list[str] = []
        self._ends: list[int] | None = None
        self._current: Iterator[str] | None = None
        self._base = offset
        self._end = offset
        self._chunk_source = self._chunks()
        self._iter = itertools.chain.from_iterable(self._chunk_source)

    @property
    def offset(self) -> int:
        """Byte offset just after the last line yielded (where a later reader continues)."""
        if self._current is None:
            return self._base
        consumed = len(self._lines) - operator.length_hint(self._current)
        if consumed <= 0:
            return self._base
        if self._ends is None:  # ASCII without carriage returns: a character is a byte
            return self._base + sum(map(len, self._lines[:consumed])) + consumed
        return self._base + self._ends[consumed - 1]

    def __iter__(self) -> Iterator[str]:
        return self._iter

    def __next__(self) -> str:
        return next(self._iter)

    def close(self) -> None:
        """Stop reading early (closes the log file if one is open); :attr:`offset` stays valid."""
        self._chunk_source.close()

    def batches(self) -> Iterator[list[str]]:
        """The lines chunk by chunk, as each read delivers them (instead of one by one);
        :attr:`offset` is just after the batch's last line when the batch comes out."""
        for chunk in self._chunk_source:
            yield list(chunk)

    def _chunks(self) -> Iterator[Iterator[str]]:
        pending = b""
        first = True
        try:
            while True:
                data, done, eof = self._read(first)
                first = False
                if data:
                    data = pending + data if pending else data
                    cut = data.rfind(b"\n") + 1
                    pending = data[cut:]
                    if self.partials:
                        partial = pending[-PARTIAL_LIMIT:].decode("utf-8", "replace")
                        changed, self.partial = partial != self.partial, partial
                    if cut:
                        yield self._start_chunk(data[:cut])
                    elif self.partials and changed:
                        yield iter(())  # rule 5: only the unfinished line changed
                if done:
                    self.partial = ""
                    if pending and eof:
                        # the job ended without a final newline: the partial line is the last line
                        yield self._start_chunk(pending)
                    return
        finally:
            if self._file is not None:
                self._file.close()

    def _start_chunk(self, data: bytes) -> Iterator[str]:
        """Split ``data`` (whole lines, or the log's unterminated last line) into the current chunk."""
        self._base, self._end = self._end, self._end + len(data)
        if data.isascii() and b"\r" not in data:
            lines = data.decode("ascii").split("\n")
            if data.endswith(b"\n"):
                lines.pop()
            self._ends = None
        else:
            parts = data.split(b"\n")
            if data.endswith(b"\n"):
                parts.pop()
            lines = [p.removesuffix(b"\r").decode("utf-8", "replace") for p in parts]
            self._ends = list(itertools.accumulate(len(p) + 1 for p in parts))
            self._ends[-1] = min(self._ends[-1], len(data))
        self._lines = lines
        self._current = iter(lines)
        return self._current

    def _read(self, first: bool) -> tuple[bytes, bool, bool]:
        """The next bytes: (data, done, eof)."""
        if self._local is not None:
            data = self._read_local()
            if data:
                return data, False, False
        away_since = None
        while True:
            try:
                chunk = self.client.read_log(
                    self.job_id,
                    node=self.node,
                    rank=self.rank,
                    offset=self._read_offset,
                    wait=self._wait if self.follow else 0,
                    # a small first answer: it names the node, and the rest may come from the file
                    limit=FIRST_READ if first and self.client.local_logs else READ_LIMIT,
                )
                break
            except BackendUnavailable:
                # A follower outlives a service restart: it asks again from the same byte offset.
                now = time.monotonic()
                away_since = away_since or now
                if not self.follow or now - away_since > FOLLOW_PATIENCE:
                    raise
                time.sleep(0.5)
        self.node = chunk.node  # pin the stream so every offset refers to the same file
        self._read_offset = chunk.next_offset
        done = chunk.eof or (not self.follow and chunk.next_offset == chunk.offset)
        if self._unlocated and chunk.file is not None:
            # the first answer said where the file is: taken as asked for, without asking apart
            self._local = chunk.file if self.client.reads_local_files() else None
            self._unlocated = False
        elif self._unlocated and chunk.data and not done:
            # rule 2: the stream exists and goes on (a log read whole in one answer never asks)
            try:
                self._local = self.client.local_log_file(self.job_id, chunk.node, self.rank)
                self._unlocated = False
            except MaJupyterError:
                pass  # the service went away meanwhile: asked again after its next bytes
        return chunk.data.encode("utf-8"), done, chunk.eof

    def _read_local(self) -> bytes:
        try:
            if self._file is None:
                # here, not at the module's top: only a reader of a local log file needs it (with
                # the job folder's layout), not every command line
                from ..untrusted import open_file

                # The job wrote this file: never follow a symlink or block on a FIFO it left there.
                fd = open_file(Path(self._local.root), self._local.path)
                self._file = os.fdopen(fd, "rb")  # kept open while following
            self._file.seek(self._read_offset)
            data = self._file.read(LOCAL_READ)
        except RefusedFile:
            self._local = None  # rule 4: through the service from now on
            return b""
        except (OSError, ValueError):
            return b""  # not there (yet, or any more): the service will say which
        self._read_offset += len(data)
        return data


def read_all(client: LogClient, job_id: str, node: str, rank: int | None) -> str:
    """A whole stream as it stands now."""
    parts, offset = [], 0
    while True:
        chunk = client.read_log(job_id, node=node, rank=rank, offset=offset)
        parts.append(chunk.data)
        offset = chunk.next_offset
        if chunk.eof or not chunk.data:
            return "".join(parts)


def node_streams(client: LogClient, job: Job) -> list[StreamKey]:
    """The node logs of a job (not the per-rank ones); its first node (:attr:`Job.log_node`)
    before any exists."""
    streams = [(s.node, s.rank) for s in client.log_streams(job.id) if s.rank is None]
    return streams or [(n.name, None) for n in job.nodes] or [(job.log_node, None)]


def fully_shown(client: LogClient, job_id: str, offsets: dict[str, int]) -> bool:
    """Whether ``offsets`` (by :func:`stream_label`) reach the end of every node log of the job."""
    try:
        streams = client.log_streams(job_id)
    except MaJupyterError:
        return False
    return all(offsets.get(s.node, 0) >= s.size for s in streams if s.rank is None)


class LogStreams:
    """Follows log streams of one job from given byte offsets, one background thread per stream,
    each a following :class:`LogLines` (so finished bytes come from the local file when there is one).

    Lines come out of :meth:`drain` as ``(stream, line)`` pairs, complete lines only (a partial
    last line waits for its newline, or for the end of the job).  :attr:`offsets` holds, per
    stream, the byte offset just after the last line handed out, so a later follower started
    from these offsets continues without replaying or skipping anything.  The unfinished last
    line of each stream, as it stands after the lines drained so far (a progress bar being
    redrawn), is in :attr:`partials` and, changed since the last look, in :meth:`take_partials`;
    it never moves an offset.

    A stream whose node's machine is gone with its log (the service answers ``node_lost``) ends
    at once, as finished, with the service's sentence in :attr:`unavailable`; any other error is
    retried (the service may be restarting) and noted in :attr:`errors`.

    Args:
        client: a :class:`LogClient` (a :class:`ma_jupyter.client.Client`).
        job_id: the job to follow.
        offsets: per-stream start offsets (``{"worker-0": 1234}``, or ``"worker-0/rank-1"``).
        ranks: follow per-rank streams instead of each node's combined log.
    """

    def __init__(
        self, client: LogClient, job_id: str, offsets: dict[str, int] | None = None, *, ranks: bool = False
    ):
        self.client = client
        self.job_id = job_id
        self.ranks = ranks
        self.offsets: dict[str, int] = dict(offsets or {})
        import queue  # here: only a follower needs it, not every command line's import

        self._queue_empty = queue.Empty
        self._queue: queue.Queue = queue.Queue()
        self._threads: dict[StreamKey, threading.Thread] = {}
        self._finished: set[StreamKey] = set()
        self._stop = threading.Event()
        self.errors: list[str] = []
        #: per stream label, why its log cannot be read (its node's machine is gone)
        self.unavailable: dict[str, str] = {}
        #: per stream, its unfinished last line after the lines drained so far ("" or absent: none)
        self.partials: dict[StreamKey, str] = {}
        self._changed: set[StreamKey] = set()

    # -- streams

    def discover(self, job: Job, *, with_files: bool = False) -> None:
        """Start following every stream of ``job`` not followed yet.

        Args:
            job: the job as last seen (its launched nodes).
            with_files: also ask the service for the streams on disk (nodes of earlier
                attempts, per-rank files); costs one request.
        """
        keys: list[StreamKey] = [(n.name, None) for n in job.nodes]
        if with_files or self.ranks:
            try:
                for stream in self.client.log_streams(job.id):
                    keys.append((stream.node, stream.rank))
            except MaJupyterError:
                pass
        if self.ranks:
            # a node with per-rank files shows those; one without shows its combined log
            ranked = {node for node, rank in keys if rank is not None}
            keys = [k for k in keys if k[1] is not None or k[0] not in ranked]
        else:
            keys = [k for k in keys if k[1] is None]
        for key in dict.fromkeys(keys):
            if key not in self._threads:
                self._start(key)

    def follow(self, key: StreamKey, *, partials_only: bool = False) -> bool:
        """Follow one stream ``(node, rank)`` (rank None: the node's combined log); False if
        already.  With ``partials_only`` its lines are read past, never handed out: only its
        unfinished line is (:meth:`take_partials`; a rank's progress bar, which the node log
        gets whole once its newline comes)."""
        if key in self._threads:
            return False
        self._start(key, partials_only)
        return True

    def _start(self, key: StreamKey, partials_only: bool = False) -> None:
        thread = threading.Thread(
            target=self._follow,
            args=(key, partials_only),
            name=f"ma-log-{stream_label(key)}",
            daemon=True,
        )
        self._threads[key] = thread
        thread.start()

    @property
    def streams(self) -> list[StreamKey]:
        return list(self._threads)

    def finished(self, ignore: set[StreamKey] | frozenset[StreamKey] = frozenset()) -> bool:
        """True once every followed stream (but those in ``ignore``) reached its end (the job is
        terminal and all was read)."""
        keys = set(self._threads) - ignore
        return bool(keys) and keys <= self._finished

    def stop(self) -> None:
        """Stop following; threads end after their current read."""
        self._stop.set()

    def _follow(self, key: StreamKey, partials_only: bool = False) -> None:
        node, rank = key
        label = stream_label(key)
        offset = self.offsets.get(label, 0)
        failures = 0
        while not self._stop.is_set():
            reader = LogLines(
                self.client,
                self.job_id,
                follow=True,
                node=node,
                rank=rank,
                offset=offset,
                # a rank's unfinished line is polled, not waited on: a waiting read is a log
                # follower the service counts against its caps, one per node is enough
                wait=0 if partials_only else LONG_POLL,
                partials=True,
            )
            shown = ""  # the unfinished line as last handed out
            try:
                for lines in reader.batches():
                    failures = 0
                    offset = reader.offset
                    if partials_only:
                        lines = []
                    if lines or reader.partial != shown:
                        shown = reader.partial
                        self._queue.put((key, [line.rstrip("\r") for line in lines], offset, shown))
                    if self._stop.wait(RANK_POLL) if partials_only else self._stop.is_set():
                        return
                # the reader ends at the end of the job's log
                self._queue.put((key, None, reader.offset, ""))
                return
            except NodeLost as exc:
                # nothing more will come: what was read stays shown, and the stream says why
                self.unavailable[label] = exc.message
                self._queue.put((key, None, reader.offset, ""))
                return
            except NotFound:
                # The node is known before its log file exists (just launched): try again.
                offset = reader.offset
                if self._stop.wait(0.1):
                    return
            except Exception as exc:  # the service may restart: keep trying, but say so
                offset = reader.offset
                failures += 1
                if failures in (3, 30):
                    self.errors.append(f"{label}: {exc}")
                if self._stop.wait(min(2.0, 0.1 * failures)):
                    return
            finally:
                reader.close()

    def drain(self, timeout: float = 0.0) -> list[tuple[StreamKey, str]]:
        """Lines that arrived since the last call; waits up to ``timeout`` for the first one."""
        out: list[tuple[StreamKey, str]] = []
        try:
            item = self._queue.get(timeout=timeout) if timeout > 0 else self._queue.get_nowait()
        except self._queue_empty:
            return out
        while True:
            key, lines, offset, partial = item
            self.offsets[stream_label(key)] = offset
            if lines is None:
                self._finished.add(key)
            else:
                out.extend((key, line) for line in lines)
            if partial != self.partials.get(key, ""):
                self.partials[key] = partial
                self._changed.add(key)
            try:
                item = self._queue.get_nowait()
            except self._queue_empty:
                return out

    def take_partials(self) -> dict[StreamKey, str]:
        """The streams whose unfinished line changed since the last call (by the lines drained
        so far), each with the line as it stands ("": the stream has none now)."""
        changed = {key: self.partials.get(key, "") for key in self._changed}
        self._changed.clear()
        return changed


STATUS_INTERVAL = 0.5  # seconds between looks at a followed job (its nodes, its end)


def several_nodes(job: Job) -> bool:
    """Whether ``job`` has (or will have) more than one node: its followers prefix each line
    with the node that printed it."""
    spec = job.spec
    return len(job.nodes) > 1 or spec.nodes > 1 or bool(spec.ps) or bool(spec.chief)


class JobFollower:
    """The one follower of a job's log that every front end uses (``submit``/``clone``/``logs
    --follow``, ``%%ma_train``, ``%ma_logs --follow``, ``%ma_attach``): every node's log by
    default, or one stream.

    Rules:

    1. Without ``stream`` it follows every node of the job: the launched ones, and the ones
       that appear later (a restart's new attempt, an elastic scale-up) at the next look at
       the job; once the job has ended, also the nodes with a log on disk (earlier attempts).
    2. Lines come out in arrival order across nodes (:meth:`drain`, :meth:`lines`);
       :meth:`prefix` is ``"[worker-1] "`` when the job has several nodes (the rank splitter
       already put ``[rank r]`` in the node's log: ``[worker-1] [rank 1] ...``), empty for a
       single-node job or a narrowed follow.
    3. ``stream=(node, rank)`` narrows to that one stream (rank None: the node's own log);
       ``rank`` alone follows that rank's log on every node (prefixed ``[node/rank-r]``).
    4. :attr:`offsets` (per :func:`stream_label`) say how far each stream was handed out: a
       follower started from them continues without repeating or skipping a line.
    5. It has ended (:attr:`ended`) once the job is terminal and every followed stream was
       read to its end (or none exists); a stream gone with its node's machine ends with its
       reason in :attr:`unavailable`.
    6. A line still being written (a progress bar redrawn with ``\r``, no newline yet) is
       shown before its newline: :meth:`take_partials` gives each stream's unfinished line as
       it stands after the lines drained so far, whenever it changed; it comes out of
       :meth:`drain` as a line once its newline (or the job's end) comes, and no offset moves
       past it (a saved view keeps the last state only).  The rank splitter keeps a rank's
       redrawn line out of the node log until its newline, so while the job runs the follower
       of every node also reads each rank's own log for its unfinished line only, given under
       the key ``(node, rank)`` with the ``[rank r] `` label the node log will have.

    Args:
        client: the :class:`~ma_jupyter.client.Client`.
        job: the job as last seen.
        stream: follow only this stream (rule 3).
        rank: follow this rank's log on every node (rule 3).
        offsets: per-stream byte offsets to continue from (rule 4).
        prefixed: prefix every line with its stream, also for a single node.
    """

    def __init__(
        self,
        client: LogClient,
        job: Job,
        *,
        stream: StreamKey | None = None,
        rank: int | None = None,
        offsets: dict[str, int] | None = None,
        prefixed: bool = False,
    ):
        self.client = client
        self.job = job
        self.stream = stream
        self.rank = rank
        self.several = prefixed or rank is not None or (stream is None and several_nodes(job))
        self.logs = LogStreams(client, job.id, offsets)
        #: the rank streams read for their unfinished line only (rule 6)
        self._rank_partials: set[StreamKey] = set()
        self._stopped = False
        self._looked = time.monotonic()
        self._discover()

    @property
    def offsets(self) -> dict[str, int]:
        return self.logs.offsets

    @property
    def unavailable(self) -> dict[str, str]:
        return self.logs.unavailable

    @property
    def errors(self) -> list[str]:
        return self.logs.errors

    @property
    def streams(self) -> list[StreamKey]:
        return self.logs.streams

    def prefix(self, key: StreamKey) -> str:
        """What goes before a line of ``key`` (rule 2), or before a rank's unfinished line
        (rule 6: its node's, as for the lines of the node log)."""
        if not self.several:
            return ""
        return f"[{key[0]}] " if key in self._rank_partials else f"[{stream_label(key)}] "

    def _discover(self) -> None:
        if self.stream is not None:
            self.logs.follow(self.stream)
            return
        if self.rank is not None:
            names = [run.name for run in self.job.nodes]
            if not names and self.job.status.is_terminal():
                names = sorted({s.node for s in self.client.log_streams(self.job.id) if s.rank is None})
            for name in names:
                self.logs.follow((name, self.rank))
            return
        terminal = self.job.status.is_terminal()
        self.logs.discover(self.job, with_files=terminal)
        if len(set(self.logs.streams) - self._rank_partials) > 1:
            self.several = True  # more attempts' or nodes' logs than the spec said
        if not terminal and self.job.nodes:
            self._follow_rank_partials()

    def _follow_rank_partials(self) -> None:
        """Rule 6: each rank log of a followed node, for its unfinished line only."""
        nodes = {run.name for run in self.job.nodes}
        try:
            streams = self.client.log_streams(self.job.id)
        except MaJupyterError:
            return  # asked again at the next look at the job
        for stream in streams:
            key = (stream.node, stream.rank)
            if stream.rank is not None and stream.node in nodes and key not in self._rank_partials:
                self._rank_partials.add(key)
                self.logs.follow(key, partials_only=True)

    def refresh_due(self) -> bool:
        """Whether it is time to look at the job again: every ``STATUS_INTERVAL``, ten times as
        often while it runs with no stream known yet (its first lines should not wait), at
        once when every stream ended before the job did."""
        starting = not self.logs.streams and self.job.status is not JobStatus.queued
        interval = STATUS_INTERVAL / 10 if starting else STATUS_INTERVAL
        if self.logs.finished(ignore=self._rank_partials) and not self.job.status.is_terminal():
            return True
        return time.monotonic() - self._looked >= interval

    def refresh(self) -> Job:
        """Look at the job (its status, new nodes) and follow what appeared; the job.
        Raises what the client raises (:class:`BackendUnavailable` while the service restarts)."""
        self._looked = time.monotonic()
        self.job = self.client.get(self.job.id)
        self._discover()
        return self.job

    def drain(self, timeout: float = 0.0) -> list[tuple[StreamKey, str]]:
        """The lines that arrived since the last call; waits up to ``timeout`` for the first."""
        return self.logs.drain(timeout)

    def take_partials(self) -> dict[StreamKey, str]:
        """Rule 6: the streams whose unfinished line changed since the last call, each with
        the line as it stands now ("": none any more)."""
        return {key: self._labelled(key, text) for key, text in self.logs.take_partials().items()}

    @property
    def partials(self) -> dict[StreamKey, str]:
        """Rule 6: every stream's unfinished line as it stands now (after the lines drained)."""
        return {key: self._labelled(key, text) for key, text in self.logs.partials.items() if text}

    def _labelled(self, key: StreamKey, text: str) -> str:
        """A rank's unfinished line with the label the splitter gives it in the node log, also
        after each ``\r`` (a reader applying the redraw keeps it)."""
        if not text or key not in self._rank_partials:
            return text
        label = f"[rank {key[1]}] "
        return label + text.replace("\r", "\r" + label)

    @property
    def ended(self) -> bool:
        """Rule 5 (call :meth:`drain` once more after it turns true: the last lines)."""
        # a rank read for its unfinished line only never holds the end back: its lines are
        # the node log's, read to the end there
        return self.job.status.is_terminal() and (
            self.logs.finished(ignore=self._rank_partials) or not self.logs.streams
        )

    def stop(self) -> None:
        """Stop following (:meth:`lines` returns after its current wait)."""
        self._stopped = True
        self.logs.stop()

    def lines(self, *, patience: float = FOLLOW_PATIENCE) -> Iterator[tuple[StreamKey, str]]:
        """Every line until the job has ended and all was read; a service that stays away
        longer than ``patience`` seconds raises :class:`BackendUnavailable`."""
        for items, _ in self.updates(patience=patience):
            yield from items

    def updates(
        self, *, patience: float = FOLLOW_PATIENCE, idle: bool = False
    ) -> Iterator[tuple[list[tuple[StreamKey, str]], dict[StreamKey, str]]]:
        """Like :meth:`lines` (the CLI's loop), batch by batch: each the lines that came and the
        unfinished lines that changed with them (rule 6).  With ``idle`` an empty batch comes
        too, at least every 0.2 s, so the caller may look at something else (the job's alerts)
        while the job prints nothing."""
        for items in self._batches(patience):
            partials = self.take_partials()
            if items or partials or idle:
                yield items, partials

    def _batches(self, patience: float) -> Iterator[list[tuple[StreamKey, str]]]:
        away_since = 0.0
        try:
            while not self._stopped:
                yield self.drain(timeout=0.2)
                if self.refresh_due():
                    try:
                        self.refresh()
                        away_since = 0.0
                    except BackendUnavailable:
                        away_since = away_since or time.monotonic()
                        if time.monotonic() - away_since > patience:
                            raise
                if self.ended:
                    yield self.drain()
                    return
        finally:
            self.stop()
