"""Live job logs in a notebook cell: follow every node's log and render it in one display.

:class:`~ma_jupyter.client.logs.JobFollower` (the follower the CLI's ``--follow`` uses too)
reads every node's log from byte offsets in background threads (one long-poll per stream) and
picks up nodes that appear later, so a line printed by any node reaches the kernel as soon as
the service sees it, prefixed ``[node]`` when the job has several.  :class:`LiveLog` renders a status line and the newest lines into one display handle
updated in place: the notebook keeps the final text (papermill, nbconvert) and its metadata
``{"ma_jupyter": {"job_id", "offsets"}}`` says which job the output belongs to and how far it
was shown, so a later attach continues there instead of replaying.

:func:`follow_job` ties both together for ``%%ma_train``, ``%ma_logs --follow`` and
``%ma_attach``: it returns when the job ends, raises :class:`JobFailed` when it ended in error,
and on a KeyboardInterrupt detaches (the job keeps running, the cell says how to follow, stop or
attach it again) unless asked to stop it, then raises the KeyboardInterrupt again, so the cell
ends as interrupted and "Run All" stops there.

A line the job is still writing (a progress bar redrawn with ``\r``, no newline yet) is shown
as it stands, one line per stream under the finished lines, replaced in place while it
changes; it becomes a line like any other once its newline comes (the saved output keeps the
last state only).  Printed lines (papermill) are whole lines only.

Where no front end shows a display updated in place (:func:`live_display_shown`: a notebook
run headless by papermill or ``nbconvert --execute``, a terminal IPython), the lines go to
stdout as they arrive instead (``papermill --log-output`` prints them while the job runs), each
once: the display is then made once the job ended, under the printed lines, and holds the final
status, the offsets and a count of the lines printed above it, never the lines a second time
(nor the final status printed as well).
"""

from __future__ import annotations

import collections
import sys
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TextIO

from ...client.logs import JobFollower, StreamKey, stream_label
from ...errors import BackendUnavailable, JobFailed
from ...wire import JobStatus
from .. import render
from ..render import status_line, visible_line

if TYPE_CHECKING:  # annotations only: a cell's first submit loads no pydantic
    from ...client import Client
    from ...models import Job


DEFAULT_MAX_LINES = 200
MAX_LINE_CHARS = 4000
RENDER_INTERVAL = 0.05  # seconds between display updates while lines arrive
SERVICE_PATIENCE = 120.0  # seconds a follower waits for a job service that stopped answering

#: the jobs a cell of this kernel follows live right now (``%ma_logs --follow`` of one of them
#: continues where that follow is, instead of from the start)
following: set[str] = set()


def live_display_shown() -> bool:
    """Whether the front end shows a display updated in place, decided in this order:

    1. Outside IPython: no.
    2. A terminal IPython: no (it prints every update of a display anew).
    3. An IPython shell that is not a kernel (an embedding that captures the displays): yes.
    4. A kernel: yes unless the request running the cell says the front end cannot answer
       ``input()`` (``allow_stdin`` false), which is how headless runners (nbclient: papermill,
       ``nbconvert --execute``) execute notebooks, while JupyterLab, Notebook and VS Code
       send it true.
    """
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None:
        return False
    if any(cls.__name__ == "TerminalInteractiveShell" for cls in type(shell).__mro__):
        return False
    kernel = getattr(shell, "kernel", None)
    if kernel is None:
        return True
    try:
        parent = kernel.get_parent("shell") or {}
    except Exception:  # an older or different kernel: keep the display
        return True
    return bool((parent.get("content") or {}).get("allow_stdin", True))


def shown_line(line: str) -> str:
    """A log line as a cell shows it (:func:`_cut`)."""
    return _cut(line)


def _cut(line: str) -> str:
    """A line as shown: what a terminal shows of it (its control characters shown, SGR colours
    kept: a notebook's output shows them as a terminal does), at most ``MAX_LINE_CHARS``
    characters."""
    line = render.terminal_text(visible_line(line), keep_sgr=True)
    if len(line) > MAX_LINE_CHARS:
        line = line[:MAX_LINE_CHARS] + f" … ({len(line) - MAX_LINE_CHARS} more characters)"
    return line


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
            self.lines.append((key, _cut(line)))
            self.streams.add(key)
            count += 1
        self.total += count
        return count

    @property
    def skipped(self) -> int:
        return self.total - len(self.lines)

    def text_lines(self, several: bool = False) -> list[str]:
        """The kept lines, each prefixed by its stream when the job has ``several`` (or the
        buffer holds lines of more than one)."""
        prefix = several or len(self.streams) > 1
        return [f"[{stream_label(key)}] {line}" if prefix else line for key, line in self.lines]

    def tail(self, count: int, several: bool = False) -> list[str]:
        return self.text_lines(several)[-count:]


class LiveLog:
    """A status line plus the newest log lines, in one display updated in place.

    Args:
        job_id: the job shown (goes into the output's metadata).
        max_lines: how many of the newest lines the output keeps.
        display: IPython's ``display`` (injected for tests and non-notebook use).
        log_hint: how to read the full log, named when lines were skipped.
        stream_to: print each line there as it arrives instead of keeping it in the display,
            which then shows only the status and how many lines were printed (a front end
            without a live display: see :func:`live_display_shown`).
        several: prefix printed lines with their stream from the first one (the job has
            several); the display decides from the streams it has seen.
    """

    def __init__(
        self,
        job_id: str,
        *,
        max_lines: int = DEFAULT_MAX_LINES,
        display: Callable[..., Any] | None = None,
        log_hint: str = "",
        note: str = "",
        stream_to: TextIO | None = None,
        several: bool = False,
    ):
        if display is None:
            from IPython.display import display
        self.job_id = job_id
        self.buffer = LogBuffer(max_lines)
        self.status = f"job {job_id}"
        self.note = note
        self.alerts: list[str] = []  # the job's alert events (performance), shown under the status
        self.footer = ""
        self.log_hint = log_hint
        self.offsets: dict[str, int] = {}
        #: each stream's line still being written, as it stands, and what goes before it
        #: (shown under the lines)
        self.partials: dict[StreamKey, tuple[str, str]] = {}
        self.stream_to = stream_to
        self.several = several
        self._dirty = True
        self._last_render = 0.0
        self._display = display
        # printed lines come first: the display goes under them, once they are all out (finish)
        self._handle = (
            None
            if self.streaming
            else display(self._bundle(), raw=True, metadata=self._metadata(), display_id=True)
        )

    def _metadata(self) -> dict:
        return {"ma_jupyter": {"job_id": self.job_id, "offsets": dict(self.offsets)}}

    @property
    def streaming(self) -> bool:
        """Whether lines are printed as they arrive rather than kept in the display."""
        return self.stream_to is not None

    def text(self) -> str:
        parts = [self.status]
        if self.note:
            parts.append(self.note)
        parts.extend(self.alerts)
        if self.streaming:
            if self.buffer.total:
                parts.append(f"({self.buffer.total} log lines printed above)")
        else:
            if self.buffer.skipped:
                where = f" (the full log: {self.log_hint})" if self.log_hint else ""
                parts.append(f"… {self.buffer.skipped} earlier lines not shown{where}")
            parts.extend(self.buffer.text_lines(self.several))
            parts.extend(prefix + _cut(text) for prefix, text in self.partials.values())
        if self.footer:
            parts.append(self.footer)
        return "\n".join(parts)

    def _bundle(self) -> dict:
        # the status line and alerts carry job-made text too; a terminal IPython prints the text
        return {"text/plain": render.terminal_text(self.text(), keep_sgr=True)}

    def add(self, items: list[tuple[StreamKey, str]]) -> None:
        if not self.buffer.extend(items):
            return
        if self.stream_to is None:
            self._dirty = True
            return
        prefix = self.several or len(self.buffer.streams) > 1
        self._write(
            "".join(
                f"[{stream_label(key)}] {_cut(line)}\n" if prefix else f"{_cut(line)}\n"
                for key, line in items
            )
        )

    def set_partials(self, changed: dict[StreamKey, str], prefix: Callable[[StreamKey], str]) -> None:
        """Update the lines still being written (:meth:`JobFollower.take_partials`: per stream,
        the line as it stands, "" once none; ``prefix``: what goes before it, the follower's
        :meth:`~JobFollower.prefix`); not shown while streaming (whole lines only)."""
        if self.streaming or not changed:
            return
        for key, text in changed.items():
            if text:
                self.partials[key] = (prefix(key), text)
            else:
                self.partials.pop(key, None)
        self._dirty = True

    def _write(self, text: str) -> None:
        """Print job-made ``text`` on the plain stream (papermill's, a terminal IPython's) by
        :func:`~ma_jupyter.frontends.render.terminal_text`: SGR colours only on a terminal."""
        assert self.stream_to is not None
        try:
            tty = bool(self.stream_to.isatty())
        except (AttributeError, ValueError):
            tty = False
        self.stream_to.write(render.terminal_text(text, keep_sgr=tty))
        self.stream_to.flush()

    def say(self, line: str) -> None:
        """Print a line (a status change) where the log lines go, when they are printed."""
        if self.stream_to is not None:
            self._write(line + "\n")

    def alert(self, line: str) -> None:
        """Show an alert under the status line (and print it where the log lines go)."""
        self.alerts.append(line)
        self._dirty = True
        self.say(line)

    def set_status(self, line: str) -> None:
        if line != self.status:
            self.status = line
            self._dirty = True

    def set_footer(self, line: str) -> None:
        self.footer = line
        self._dirty = True

    @property
    def dirty(self) -> bool:
        """Whether something changed since the last render (never while streaming: the display
        is updated only when forced, at the end)."""
        return self._dirty and not self.streaming

    @property
    def next_render(self) -> float:
        """The monotonic time at which a pending change may be rendered."""
        return self._last_render + RENDER_INTERVAL

    def render(self, force: bool = False) -> None:
        """Update the display if something changed (at most every RENDER_INTERVAL unless forced;
        only when forced while streaming, since a terminal prints every update anew)."""
        now = time.monotonic()
        if not force and (not self.dirty or now - self._last_render < RENDER_INTERVAL):
            return
        self._dirty = False
        self._last_render = now
        if self._handle is not None:
            self._handle.update(self._bundle(), raw=True, metadata=self._metadata())

    def finish(self) -> None:
        """Show the final state: the display updated in place, or, while streaming, made now
        under the printed lines (the final status and footer are said there, not printed)."""
        if self.streaming and self._handle is None:
            self._last_render = time.monotonic()
            self._dirty = False
            self._handle = self._display(self._bundle(), raw=True, metadata=self._metadata(), display_id=True)
        else:
            self.render(force=True)


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
    live_display: bool | None = None,
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
        live_display: whether the front end shows a display updated in place (default:
            :func:`live_display_shown`); without one the lines and status changes are printed
            to stdout as they come.

    Returns:
        The job as last seen (terminal).

    Raises:
        JobFailed: the job ended in error or expired (its message shows the last lines).
        KeyboardInterrupt: the follow was interrupted, again once the cell has said that the job
            keeps running and how to come back to it (or that its stop was requested), and the
            offsets shown went to ``on_progress``.
    """
    if live_display is None:
        live_display = live_display_shown()
    job = client.job(job_id).info
    follower = JobFollower(client, job, stream=stream, offsets=offsets)
    live = LiveLog(
        job_id,
        max_lines=max_lines,
        display=display,
        log_hint=f"%ma_logs {job_id}",  # where a log lives is the backend's to say, not a path here
        note=note,
        stream_to=None if live_display else sys.stdout,
        several=follower.several,
    )
    live.offsets = dict(offsets or {})
    live.set_status(status_line(job))
    said = job.status
    if not job.status.is_terminal():  # an ended job's status is said once, at the end
        live.say(live.status)
    events_seen = _show_alerts(client, job_id, live, 0)
    live.render(force=not live.streaming)
    last_progress = time.monotonic()
    unavailable_since = 0.0
    following.add(job_id)
    try:
        while True:
            # wait for lines, but never past the moment a pending render is due
            wait = RENDER_INTERVAL if not live.dirty else live.next_render - time.monotonic()
            items = follower.drain(timeout=max(0.0, min(RENDER_INTERVAL, wait)))
            live.several = follower.several
            live.add(items)
            live.set_partials(follower.take_partials(), follower.prefix)
            live.offsets = dict(follower.offsets)
            now = time.monotonic()
            if follower.refresh_due():
                try:
                    job = follower.refresh()
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
                    events_seen = _show_alerts(client, job_id, live, events_seen)
            live.set_status(status_line(job))
            if job.status is not said and not job.status.is_terminal():
                said = job.status  # queued → running (the end is said once the last lines are out)
                live.say(live.status)
            live.render()
            if on_progress and now - last_progress >= 1.0:
                on_progress(dict(follower.offsets))
                last_progress = now
            if follower.ended:
                live.add(follower.drain())
                break
    except KeyboardInterrupt:
        follower.stop()
        live.add(follower.drain())
        live.partials.clear()  # the record's offsets stop before it: an attach shows it whole
        live.offsets = dict(follower.offsets)
        if stop_on_interrupt:
            client.stop(job_id)
            footer = f"interrupted: stop requested for job {job_id}"
        else:
            footer = detached_message(job_id)
        live.set_footer(footer)
        live.set_status(status_line(job))
        live.finish()
        if on_progress:
            on_progress(dict(follower.offsets))
        raise  # the cell ends as interrupted: "Run All" stops here
    finally:
        follower.stop()
        following.discard(job_id)
    live.offsets = dict(follower.offsets)
    live.partials.clear()  # the job's end made every unfinished line a line
    _show_alerts(client, job_id, live, events_seen)
    for why in follower.unavailable.values():  # one line per stream whose node took its log
        live.alert(why)
    if follower.errors:
        live.set_footer("log read problems: " + "; ".join(follower.errors))
    live.set_status(status_line(job))
    live.finish()
    if on_progress:
        on_progress(dict(follower.offsets))
    if raise_on_error and job.status in (JobStatus.error, JobStatus.expired):
        # the log is in the cell already: the error names its last line, never repeats it
        tail = live.buffer.tail(20, live.several)
        last = next((line for line in reversed(tail) if line.strip()), "")
        raise JobFailed(
            f"job {job.id} ({job.spec.name}) ended {job.status.value}"
            + (f": {render.reason_summary(job)}" if render.reason_summary(job) else "")
            + (f"; last log line: {last.strip()}" if last else "; the job printed nothing"),
            job=job,
            log_tail="\n".join(tail),
        )
    return job


def detached_message(job_id: str) -> str:
    """What an interrupted follow says: the job keeps running, and how to follow it again,
    stop it or attach to it (by id: its name may mean a newer job by then)."""
    return (
        f"detached: job {job_id} keeps running (the interrupt stopped only this cell)\n"
        f"  follow it again:  %ma_attach {job_id}   (continues where this cell stopped)\n"
        f"  its whole log:    %ma_logs {job_id} --follow\n"
        f"  stop it:          %ma_stop {job_id}"
    )


def alert_line(event) -> str:
    """How an alert event reads in a cell and a terminal."""
    return f"ALERT {render.clock(event.time)}: {event.reason}"


def _show_alerts(client: Client, job_id: str, live: LiveLog, after: int) -> int:
    """Show the job's alert events after sequence number ``after``; the last number seen.  An
    unreachable service shows nothing now (the next status refresh asks again)."""
    try:
        events = client.events(job_id, after=after)
    except BackendUnavailable:
        return after
    for event in events:
        if event.alert:
            live.alert(alert_line(event))
    return events[-1].seq if events else after
