"""Live job logs in a notebook cell: follow every node's log and render it in one display.

:class:`~ma_jupyter.client.logs.LogStreams` reads a job's log streams from byte offsets in background threads (one
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
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ...client.logs import LogStreams, StreamKey, stream_label
from ...errors import BackendUnavailable, JobFailed
from ...models import Job, JobStatus
from ..render import status_line, visible_line

if TYPE_CHECKING:
    from ...client import Client


DEFAULT_MAX_LINES = 200
MAX_LINE_CHARS = 4000
RENDER_INTERVAL = 0.05  # seconds between display updates while lines arrive
STATUS_INTERVAL = 0.5  # seconds between job refreshes for the status line
SERVICE_PATIENCE = 120.0  # seconds a follower waits for a job service that stopped answering


class LogBuffer:
    """The newest ``max_lines`` lines of a job and how many older ones were dropped.

    Each line is kept as a terminal shows it (:func:`~ma_jupyter.frontends.render.visible_line`:
    a progress bar's last state), then cut at ``MAX_LINE_CHARS``.
    """

    def __init__(self, max_lines: int = DEFAULT_MAX_LINES):
        self.max_lines = max(1, max_lines)
        self.lines: collections.deque[tuple[StreamKey, str]] = collections.deque(maxlen=self.max_lines)
        self.total = 0
        self.streams: set[StreamKey] = set()

    def extend(self, items: Iterable[tuple[StreamKey, str]]) -> int:
        count = 0
        for key, line in items:
            line = visible_line(line)
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
    client: Client,
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
    follower = LogStreams(client, job_id, offsets)
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
