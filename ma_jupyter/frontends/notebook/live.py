"""Live job logs in a notebook cell: follow every node's log and render it in one display.

:class:`LogFollower` reads a job's log streams from byte offsets in background threads (one
long-poll per stream), so a line printed by a node reaches the kernel as soon as the service
sees it.  :class:`LiveLog` renders a status line and the newest lines into one display handle
updated in place: the notebook keeps the final text (papermill, nbconvert) and its metadata
``{"ma_jupyter": {"job_id", "offsets"}}`` says which job the output belongs to and how far it
was shown, so a later attach continues there instead of replaying.

:func:`follow_job` ties both together for ``%%ma_train``, ``%ma_logs --follow`` and
``%ma_attach``: it returns when the job ends, raises :class:`JobFailed` when it ended in error,
and turns a KeyboardInterrupt into a detach (the job keeps running) unless asked to stop it.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from ...client.logs import StreamKey, stream_label
from ...errors import BackendUnavailable, JobFailed, MaJupyterError, NotFound
from ...models import Job, JobStatus
from ..render import status_line

DEFAULT_MAX_LINES = 200
MAX_LINE_CHARS = 4000
RENDER_INTERVAL = 0.05  # seconds between display updates while lines arrive
STATUS_INTERVAL = 0.5  # seconds between job refreshes for the status line
LONG_POLL = 2.0  # seconds each stream read may wait on the service
SERVICE_PATIENCE = 120.0  # seconds a follower waits for a job service that stopped answering


class LogFollower:
    """Follows log streams of one job from given byte offsets, one background thread per stream.

    Lines come out of :meth:`drain` as ``(stream, line)`` pairs, complete lines only (a partial
    last line waits for its newline, or for the end of the job).  :attr:`offsets` holds, per
    stream, the byte offset just after the last line handed out, so a later follower started
    from these offsets continues without replaying or skipping anything.

    Args:
        client: a :class:`ma_jupyter.client.Client` (``read_log``, ``job``, ``log_streams``).
        job_id: the job to follow.
        offsets: per-stream start offsets (``{"worker-0": 1234}``, or ``"worker-0/rank-1"``).
        ranks: follow per-rank streams instead of each node's combined log.
    """

    def __init__(
        self, client: Any, job_id: str, offsets: dict[str, int] | None = None, *, ranks: bool = False
    ):
        self.client = client
        self.job_id = job_id
        self.ranks = ranks
        self.offsets: dict[str, int] = dict(offsets or {})
        self._queue: queue.Queue = queue.Queue()
        self._threads: dict[StreamKey, threading.Thread] = {}
        self._finished: set[StreamKey] = set()
        self._stop = threading.Event()
        self.errors: list[str] = []

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

    def follow(self, key: StreamKey) -> bool:
        """Follow one stream ``(node, rank)`` (rank None: the node's combined log); False if already."""
        if key in self._threads:
            return False
        self._start(key)
        return True

    def _start(self, key: StreamKey) -> None:
        thread = threading.Thread(
            target=self._follow, args=(key,), name=f"ma-log-{stream_label(key)}", daemon=True
        )
        self._threads[key] = thread
        thread.start()

    @property
    def streams(self) -> list[StreamKey]:
        return list(self._threads)

    def finished(self) -> bool:
        """True once every followed stream reached its end (the job is terminal and all was read)."""
        return bool(self._threads) and len(self._finished) == len(self._threads)

    def stop(self) -> None:
        """Stop following; threads end after their current read."""
        self._stop.set()

    def _follow(self, key: StreamKey) -> None:
        node, rank = key
        label = stream_label(key)
        offset = self.offsets.get(label, 0)
        partial = b""
        failures = 0
        while not self._stop.is_set():
            try:
                chunk = self.client.read_log(self.job_id, node=node, rank=rank, offset=offset, wait=LONG_POLL)
                failures = 0
            except NotFound:
                # The node is known before its log file exists (just launched): try again.
                if self._stop.wait(0.1):
                    return
                continue
            except Exception as exc:  # the service may restart: keep trying, but say so
                failures += 1
                if failures in (3, 30):
                    self.errors.append(f"{label}: {exc}")
                if self._stop.wait(min(2.0, 0.1 * failures)):
                    return
                continue
            offset = chunk.next_offset
            data = partial + chunk.data.encode("utf-8")
            *lines, last = data.split(b"\n")
            partial = last
            if chunk.eof and partial:
                lines.append(partial)
                partial = b""
            if lines:
                decoded = [line.decode("utf-8", "replace").rstrip("\r") for line in lines]
                self._queue.put((key, decoded, offset - len(partial)))
            if chunk.eof:
                self._queue.put((key, None, offset))
                return

    def drain(self, timeout: float = 0.0) -> list[tuple[StreamKey, str]]:
        """Lines that arrived since the last call; waits up to ``timeout`` for the first one."""
        out: list[tuple[StreamKey, str]] = []
        try:
            item = self._queue.get(timeout=timeout) if timeout > 0 else self._queue.get_nowait()
        except queue.Empty:
            return out
        while True:
            key, lines, offset = item
            self.offsets[stream_label(key)] = offset
            if lines is None:
                self._finished.add(key)
            else:
                out.extend((key, line) for line in lines)
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return out


class LogBuffer:
    """The newest ``max_lines`` lines of a job and how many older ones were dropped."""

    def __init__(self, max_lines: int = DEFAULT_MAX_LINES):
        self.max_lines = max(1, max_lines)
        self.lines: collections.deque[tuple[StreamKey, str]] = collections.deque(maxlen=self.max_lines)
        self.total = 0
        self.streams: set[StreamKey] = set()

    def extend(self, items: Iterable[tuple[StreamKey, str]]) -> int:
        count = 0
        for key, line in items:
            if len(line) > MAX_LINE_CHARS:
                line = line[:MAX_LINE_CHARS] + f" … ({len(line) - MAX_LINE_CHARS} more characters)"
            self.lines.append((key, line))
            self.streams.add(key)
            count += 1
        self.total += count
        return count

    @property
    def skipped(self) -> int:
        return self.total - len(self.lines)

    def text_lines(self) -> list[str]:
        """The kept lines, each prefixed by its stream when the job has several."""
        prefix = len(self.streams) > 1
        return [f"[{stream_label(key)}] {line}" if prefix else line for key, line in self.lines]

    def tail(self, count: int) -> list[str]:
        return self.text_lines()[-count:]


class LiveLog:
    """A status line plus the newest log lines, in one display updated in place.

    Args:
        job_id: the job shown (goes into the output's metadata).
        max_lines: how many of the newest lines the output keeps.
        display: IPython's ``display`` (injected for tests and non-notebook use).
        log_hint: where the full log lives, named when lines were skipped.
    """

    def __init__(
        self,
        job_id: str,
        *,
        max_lines: int = DEFAULT_MAX_LINES,
        display: Callable[..., Any] | None = None,
        log_hint: str = "",
        note: str = "",
    ):
        if display is None:
            from IPython.display import display
        self.job_id = job_id
        self.buffer = LogBuffer(max_lines)
        self.status = f"job {job_id}"
        self.note = note
        self.footer = ""
        self.log_hint = log_hint
        self.offsets: dict[str, int] = {}
        self._dirty = True
        self._last_render = 0.0
        self._handle = display(self._bundle(), raw=True, metadata=self._metadata(), display_id=True)

    def _metadata(self) -> dict:
        return {"ma_jupyter": {"job_id": self.job_id, "offsets": dict(self.offsets)}}

    def text(self) -> str:
        parts = [self.status]
        if self.note:
            parts.append(self.note)
        if self.buffer.skipped:
            where = f" (full log: {self.log_hint})" if self.log_hint else ""
            parts.append(f"… {self.buffer.skipped} earlier lines not shown{where}")
        parts.extend(self.buffer.text_lines())
        if self.footer:
            parts.append(self.footer)
        return "\n".join(parts)

    def _bundle(self) -> dict:
        return {"text/plain": self.text()}

    def add(self, items: list[tuple[StreamKey, str]]) -> None:
        if self.buffer.extend(items):
            self._dirty = True

    def set_status(self, line: str) -> None:
        if line != self.status:
            self.status = line
            self._dirty = True

    def set_footer(self, line: str) -> None:
        self.footer = line
        self._dirty = True

    @property
    def dirty(self) -> bool:
        """Whether something changed since the last render."""
        return self._dirty

    @property
    def next_render(self) -> float:
        """The monotonic time at which a pending change may be rendered."""
        return self._last_render + RENDER_INTERVAL

    def render(self, force: bool = False) -> None:
        """Update the display if something changed (at most every RENDER_INTERVAL unless forced)."""
        now = time.monotonic()
        if not (self._dirty or force) or (not force and now - self._last_render < RENDER_INTERVAL):
            return
        self._dirty = False
        self._last_render = now
        if self._handle is not None:
            self._handle.update(self._bundle(), raw=True, metadata=self._metadata())


def follow_job(
    client: Any,
    job_id: str,
    *,
    offsets: dict[str, int] | None = None,
    max_lines: int = DEFAULT_MAX_LINES,
    stop_on_interrupt: bool = False,
    raise_on_error: bool = True,
    on_progress: Callable[[dict[str, int]], None] | None = None,
    display: Callable[..., Any] | None = None,
    note: str = "",
    stream: StreamKey | None = None,
) -> Job:
    """Show a job's status and logs live in the current cell until it ends.

    Args:
        client: the Client to read through.
        job_id: the job to follow.
        offsets: per-stream byte offsets to continue from (a re-attach); default the start.
        max_lines: how many of the newest lines the cell keeps.
        stop_on_interrupt: on KeyboardInterrupt stop the job too (default: only detach).
        raise_on_error: raise :class:`JobFailed` when the job ends in error or expires.
        on_progress: called now and then (and at the end) with the per-stream offsets shown,
            to remember them for a later re-attach.
        display: IPython's ``display`` replacement (tests).
        note: an extra line under the status line.
        stream: follow only this ``(node, rank)`` stream (default: every node's log).

    Returns:
        The job as last seen (terminal unless the follow was interrupted).

    Raises:
        JobFailed: the job ended in error or expired (its message shows the last lines).
    """
    from ... import config

    live = LiveLog(
        job_id, max_lines=max_lines, display=display, log_hint=str(config.jobdir(job_id).logs), note=note
    )
    live.offsets = dict(offsets or {})
    follower = LogFollower(client, job_id, offsets)
    job = client.job(job_id).info
    live.set_status(status_line(job))
    if stream is not None:
        follower.follow(stream)
    else:
        follower.discover(job, with_files=job.status.is_terminal())
    live.render(force=True)
    last_refresh = time.monotonic()
    last_progress = last_refresh
    unavailable_since = 0.0
    try:
        while True:
            # wait for lines, but never past the moment a pending render is due
            wait = RENDER_INTERVAL if not live.dirty else live.next_render - time.monotonic()
            items = follower.drain(timeout=max(0.0, min(RENDER_INTERVAL, wait)))
            live.add(items)
            live.offsets = dict(follower.offsets)
            now = time.monotonic()
            # until the nodes are known, look often: their first lines should not wait
            interval = STATUS_INTERVAL if follower.streams else RENDER_INTERVAL
            if now - last_refresh >= interval or (follower.finished() and not job.status.is_terminal()):
                last_refresh = now
                try:
                    job = client.job(job_id).info
                except BackendUnavailable as exc:
                    # the service is restarting (jobs run on without it): keep waiting, say so,
                    # and give up only when it stays away
                    unavailable_since = unavailable_since or now
                    if now - unavailable_since > SERVICE_PATIENCE:
                        raise
                    live.set_footer(f"the job service does not answer, retrying: {exc.message}")
                else:
                    if unavailable_since:
                        unavailable_since = 0.0
                        live.set_footer("")
                    if stream is None:
                        follower.discover(job, with_files=job.status.is_terminal())
            live.set_status(status_line(job))
            live.render()
            if on_progress and now - last_progress >= 1.0:
                on_progress(dict(follower.offsets))
                last_progress = now
            if job.status.is_terminal() and (follower.finished() or not follower.streams):
                live.add(follower.drain())
                break
    except KeyboardInterrupt:
        follower.stop()
        live.add(follower.drain())
        live.offsets = dict(follower.offsets)
        if stop_on_interrupt:
            client.stop(job_id)
            live.set_footer(f"interrupted: stop requested for job {job_id}")
        else:
            live.set_footer(
                f"detached: job {job_id} keeps running; `%ma_logs {job_id} --follow` or `%ma_attach` continues here"
            )
        live.set_status(status_line(job))
        live.render(force=True)
        if on_progress:
            on_progress(dict(follower.offsets))
        return job
    finally:
        follower.stop()
    live.offsets = dict(follower.offsets)
    if follower.errors:
        live.set_footer("log read problems: " + "; ".join(follower.errors))
    live.set_status(status_line(job))
    live.render(force=True)
    if on_progress:
        on_progress(dict(follower.offsets))
    if raise_on_error and job.status in (JobStatus.error, JobStatus.expired):
        tail = "\n".join(live.buffer.tail(20)) or "(the job printed nothing)"
        raise JobFailed(
            f"job {job.id} ({job.spec.name}) ended {job.status.value}"
            + (f": {job.reason}" if job.reason else "")
            + f"\nlast log lines:\n{tail}",
            job=job,
        )
    return job
