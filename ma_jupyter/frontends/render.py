"""How the front ends show things: tables, times, a job's status line and dry-run plans."""

from __future__ import annotations

import io
import re
import shlex
from datetime import UTC, datetime

from ..client.logs import stream_label
from ..client.plain import model_name
from ..wire import JobStatus

TYPE_CHECKING = False  # typing's, without importing typing (a command line's call: ~5 ms)
if TYPE_CHECKING:  # annotations only: the CLI reads answers without pydantic
    from typing import Any

    from ..models import Event, Job, JobSummary, Mount, Plan


def table_bundle(headers: list[str], rows: list[list[Any]]) -> dict:
    """A text + HTML table bundle for ``display(..., raw=True)``."""
    cells = [[("" if v is None else str(v)) for v in row] for row in rows]
    # a terminal IPython prints the text: a job's reason or command never acts on it
    text = terminal_text(text_table([headers, *cells]).rstrip("\n"), keep_sgr=True)
    from html import escape

    html = (
        "<table class='ma-jupyter-table'><thead><tr>"
        + "".join(f"<th>{escape(h)}</th>" for h in headers)
        + "</tr></thead><tbody>"
        + "".join("<tr>" + "".join(f"<td>{escape(v)}</td>" for v in row) + "</tr>" for row in cells)
        + "</tbody></table>"
    )
    return {"text/plain": text, "text/html": html}


def event_reason(event) -> str:
    """An event's reason as lists show it: an alert (performance) is marked ``ALERT:``."""
    return f"ALERT: {event.reason}" if event.alert else event.reason


def _eta(plan: Plan) -> str:
    """The estimated start of a job that would queue, as the dry run says it."""
    if plan.estimated_start is None:
        return ", start time unknown"
    return f", estimated start {plan.estimated_start:%Y-%m-%d %H:%M:%S} UTC"


def plan_summary(plan: Plan) -> str:
    """The notebook's dry-run text (also the form's): per node its argv, environment, files and workspace mounts."""
    out = io.StringIO()
    start = (
        "can start now" if plan.can_start_now else f"would queue behind {plan.queue_ahead} job(s){_eta(plan)}"
    )
    print(
        f"plan on spec {plan.spec}: {len(plan.nodes)} node(s), {start} (dry run: nothing submitted)", file=out
    )
    for note in plan.notes:
        print(f"note: {note}", file=out)
    for node in plan.nodes:
        primary = "" if node.primary else " (auxiliary)"
        print(
            f"\n[{node.name}] role={node.role} index={node.index} hostname={node.hostname}{primary}", file=out
        )
        print(f"  argv:    {shlex.join(node.argv)}", file=out)
        for note in node.notes:  # e.g. why the command is wrapped
            print(f"  note:    {note}", file=out)
        print(f"  workdir: {node.workdir}", file=out)
        if node.env:
            print("  env:", file=out)
            for key in sorted(node.env):
                print(f"    {key}={node.env[key]}", file=out)
        if node.files:
            print("  files:", file=out)
            for path, content in sorted(node.files.items()):
                first = content.splitlines()[0] if content else ""
                more = " …" if content.count("\n") > 1 else ""
                print(f"    {path}: {first}{more}", file=out)
        if node.mounts:
            print("  mounts:", file=out)
            for mount in node.mounts:
                mode = "ro" if mount.read_only else "rw"
                copy = f", a copy of {mount.copy_of}" if mount.copy_of else ""
                print(f"    {mount.target} <- {mount.source} ({mode}{copy})", file=out)
    return out.getvalue().rstrip("\n")


def plan_text(plan: Plan) -> str:
    """The CLI's dry-run text (``--dry-run``): per node its argv, env, files and mounts."""
    out = [
        f"spec {plan.spec}: "
        + (
            "can start now"
            if plan.can_start_now
            else f"would queue ({plan.queue_ahead} job(s) ahead){_eta(plan)}"
        )
    ]
    out += [f"note: {note}" for note in plan.notes]
    for node in plan.nodes:
        role = f"{node.role} {node.index}" + ("" if node.primary else ", not primary")
        out.append("")
        out.append(f"node {node.name} ({role}, hostname {node.hostname})")
        out.append(f"  argv:    {shlex.join(node.argv)}")
        out += [f"  note:    {note}" for note in node.notes]  # e.g. why the command is wrapped
        out.append(f"  workdir: {node.workdir}")
        out.append("  env:")
        out += [f"    {k}={v}" for k, v in sorted(node.env.items())]
        if node.files:
            out.append("  files:")
            for path, content in sorted(node.files.items()):
                text = content.splitlines() or [""]
                out.append(f"    {path}:")
                out += [f"      | {line}" for line in text]
        if node.mounts:
            out.append("  mounts:")
            out += [f"    {_mount(m)}" for m in node.mounts]
    return "\n".join(out) + "\n"


def _mount(mount: Mount) -> str:
    mode = "ro" if mount.read_only else "rw"
    extra = f"kind={mount.kind}" + (", created at launch" if mount.create else "")
    if mount.copy_of:
        extra += f", a copy of {mount.copy_of} made at the node's first launch"
    return f"{mount.target} <- {mount.source} ({mode}) [{extra}]"


def visible_line(line: str) -> str:
    """What a terminal shows of one log line: progress bars (tqdm, Keras) redraw themselves with
    carriage returns and backspaces, and only their last state should be shown.

    Rules, applied left to right as a terminal does:

    1. ``\\r`` moves back to the start of the line; what follows overwrites the characters
       there (a shorter redraw leaves the tail of a longer one, as on a terminal).
    2. ``\\b`` moves one character back (never before the start); what follows overwrites.
    3. Every other character is written at the current position, which then moves on.

    The log files keep the raw bytes; readers apply this per line before cutting a long one.
    The job page's ``visibleLine`` (``labextension/src/logfollower.ts``) is the same rule.
    """
    if "\r" not in line and "\b" not in line:
        return line
    if "\b" not in line:
        # Only rule 1: the last redraw, completed by whatever longer earlier one stands out.
        parts = line.split("\r")
        shown = parts[-1]
        for part in reversed(parts[:-1]):
            if len(part) > len(shown):
                shown += part[len(shown) :]
        return shown
    chars: list[str] = []
    column = 0
    for char in line:
        if char == "\r":
            column = 0
        elif char == "\b":
            column = max(0, column - 1)
        else:
            if column < len(chars):
                chars[column] = char
            else:
                chars.append(char)
            column += 1
    return "".join(chars)


# An SGR sequence (ESC [ params m): colours and bold, the only escape sequence kept, and only
# where a terminal shows it; any other ESC, C0 or C1 character is shown (terminal_text).
_SGR_OR_CONTROL = re.compile(r"(\x1b\[[0-9;:]{0,64}m)|([\x00-\x08\x0b-\x1f\x7f-\x9f])")
_ANY_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def shown_control(char: str) -> str:
    """How :func:`terminal_text` shows one control character: a C0 one and DEL in caret
    notation (``^[`` for ESC, ``^G`` for BEL, ``^M`` for a carriage return, ``^?`` for DEL), a
    C1 one as a hex escape (``\\x9b`` for the one-byte CSI)."""
    code = ord(char)
    return f"^{chr(code ^ 0x40)}" if code < 0x20 or code == 0x7F else f"\\x{code:02x}"


def terminal_text(text: str, *, keep_sgr: bool = False) -> str:
    """Text a job or a user made (a log line, a name, a reason, a command), safe to print where
    a terminal reads it: no control character reaches the reader's terminal to act there (OSC 52
    writing the clipboard, OSC 0 the window title, clearing the screen, moving the cursor to
    forge other lines).

    Rules:

    1. Tab and newline stay.
    2. With ``keep_sgr`` (the output is a terminal, or a notebook's output area, which shows
       colours the same way), an SGR sequence ``ESC [ params m`` (colours, bold) stays whole;
       otherwise it is dropped.
    3. Every other C0 control character and DEL is shown in caret notation (``^[`` for ESC,
       ``^G``, ``^M``...), every C1 control character (U+0080 to U+009F, e.g. the one-byte CSI)
       as ``\\x9b``: what follows an ESC stays as plain text (``^[]52;c;...^G``).

    A log line goes through :func:`visible_line` first (carriage returns and backspaces then
    already did what a terminal does with them).  Idempotent, apart from rule 2's dropping.
    """
    if not _ANY_CONTROL.search(text):
        return text

    def replace(match: re.Match) -> str:
        if match.group(1) is not None:
            return match.group(1) if keep_sgr else ""
        return shown_control(match.group(2))

    return _SGR_OR_CONTROL.sub(replace, text)


class TerminalSafe(io.TextIOBase):
    """A text stream that writes everything through :func:`terminal_text` to ``stream`` (the
    CLI's stdout and stderr): SGR colours kept when ``stream`` is a terminal.

    A sequence cut across two writes is shown, never passed (each write is handled alone).
    The CLI's own terminal control (a screen redrawn in place) goes through :meth:`control`.
    """

    def __init__(self, stream):
        self.stream = stream
        try:
            self.keep_sgr = bool(stream.isatty())
        except (AttributeError, ValueError):
            self.keep_sgr = False

    def write(self, text: str) -> int:
        self.stream.write(terminal_text(text, keep_sgr=self.keep_sgr))
        return len(text)

    def control(self, sequence: str) -> None:
        """Write the CLI's own control ``sequence`` as it is (never job-made text)."""
        self.stream.write(sequence)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return self.keep_sgr

    def fileno(self) -> int:
        return self.stream.fileno()

    def writable(self) -> bool:
        return True

    @property
    def encoding(self):  # type: ignore[override]
        return getattr(self.stream, "encoding", "utf-8")


def log_lines(text: str) -> list[str]:
    """A log's text as visible lines (:func:`visible_line`): split at newlines only, since a
    carriage return alone redraws its line rather than ending it."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [visible_line(line) for line in lines]


def size(count: int) -> str:
    """A size in bytes as people read it: ``0 bytes``, ``12.3 kB``, ``4.0 MB``, ``1.2 GB``."""
    value = float(count)
    for unit in ("bytes", "kB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{int(value)} bytes" if unit == "bytes" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{count} bytes"


def format_seconds(seconds: float) -> str:
    """``h:mm:ss`` for a duration in seconds (negative counts as 0)."""
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def status_line(job: Job, now: datetime | None = None) -> str:
    """One line saying where the job stands: queue position, elapsed and remaining time, or the end."""
    now = now or datetime.now(UTC)
    head = f"job {job.id} ({job.spec.name}): {job.status.value}"
    status = job.status
    if status is JobStatus.queued:
        if job.queue_position is not None:
            head += f", position {job.queue_position + 1} in the queue"
    elif status is JobStatus.running:
        if job.started_at:
            elapsed = (now - _aware(job.started_at)).total_seconds()
            head += f", {format_seconds(elapsed)} elapsed"
            if job.spec.duration:
                head += f", {format_seconds(job.spec.duration - elapsed)} left"
        if job.chosen_spec:
            head += f" on {job.chosen_spec}"
    else:
        if job.started_at and job.finished_at:
            head += (
                f" after {format_seconds((_aware(job.finished_at) - _aware(job.started_at)).total_seconds())}"
            )
        if job.exit_code is not None:
            head += f", exit code {job.exit_code}"
    if job.tasks:
        head += f"; tasks: {task_summary(job)}"
    reason = reason_summary(job)
    if reason and status is not JobStatus.running:
        head += f" — {reason}"
    return head


# The plain success every job without a story ends with: lists leave it out (it says nothing
# the status does not), and a job's own page keeps it.
PLAIN_SUCCESS = "every node exited with code 0"
LOG_TAIL_MARK = "\nlast log lines:\n"


def reason_summary(job: Job | JobSummary) -> str:
    """A job's reason as one line for where its log is shown too (a cell's status line) or many
    jobs are listed (``%ma_jobs``), decided in this order:

    1. No reason: empty.
    2. A success whose reason is only the plain "every node exited with code 0": empty (the
       status says it).
    3. Otherwise the reason up to the failure's "last log lines" (the follower showed those
       lines already), as one line.
    """
    reason = job.reason or ""
    if not reason:
        return ""
    if job.status is JobStatus.succeeded and reason == PLAIN_SUCCESS:
        return ""
    return one_line(reason.split(LOG_TAIL_MARK, 1)[0])


#: the most characters of a reason a job list shows (the rest: ``ma-jupyter get``)
LIST_REASON_CHARS = 80


def list_reason(job: Job | JobSummary) -> str:
    """A job's reason as a list's last column shows it: :func:`reason_summary` cut to
    :data:`LIST_REASON_CHARS` characters, ``…`` where it was cut."""
    reason = reason_summary(job)
    return reason if len(reason) <= LIST_REASON_CHARS else reason[: LIST_REASON_CHARS - 1] + "…"


def task_summary(job: Job | JobSummary) -> str:
    """A batch job's tasks counted by status, e.g. ``1 succeeded, 1 failed (task-1)``; the
    failed ones are named (a listed job's summary names its first ones)."""
    if model_name(job) == "JobSummary":
        counts, failed = job.task_counts, job.failed_tasks
    else:
        counts = {}
        for task in job.tasks:
            counts[task.status] = counts.get(task.status, 0) + 1
        failed = [t.name for t in job.tasks if t.status == "failed"]
    parts = []
    for status in ("running", "queued", "succeeded", "failed", "stopped"):
        if counts.get(status):
            part = f"{counts[status]} {status}"
            if status == "failed":
                more = ", …" if counts[status] > len(failed) else ""
                part += f" ({', '.join(failed)}{more})"
            parts.append(part)
    return ", ".join(parts)


# ------------------------------------------------------------------ the CLI's texts


def format_job(job: Job) -> str:
    """A job as readable ``key: value`` lines."""
    spec = job.spec
    lines = [
        f"id:        {job.id}",
        f"name:      {spec.name}",
        f"status:    {job.status.value}" + (f" ({one_line(job.reason)})" if job.reason else ""),
        f"mode:      {spec.mode.value}, {spec.nodes} node(s)"
        + (f", {spec.ps} ps" if spec.ps else "")
        + (", chief" if spec.chief else ""),
        f"spec:      {job.chosen_spec or ', '.join(spec.specs)}",
        f"command:   {spec.command or '; '.join(t.command for t in spec.tasks)}",
        f"created:   {clock(job.created_at)}" + (f" by {spec.creator}" if spec.creator else ""),
    ]
    if spec.devenv_of is not None:
        lines.insert(
            2, f"devenv of: job {spec.devenv_of.job_id}, node {spec.devenv_of.node} (a Jupyter kernel)"
        )
    if job.queue_position is not None:
        lines.append(
            f"queue:     position {job.queue_position + 1}"
            + (
                f", estimated start {job.estimated_start:%Y-%m-%d %H:%M:%S} UTC"
                if job.estimated_start
                else ", start time unknown (a job it waits for has no duration)"
            )
        )
    if job.started_at:
        lines.append(f"started:   {clock(job.started_at)}")
    if job.finished_at:
        lines.append(f"finished:  {clock(job.finished_at)}")
    lines.append(f"elapsed:   {elapsed(job)}" + (f" of {spec.duration:g} s" if spec.duration else ""))
    if job.exit_code is not None:
        lines.append(f"exit code: {job.exit_code}")
    if job.attempt or job.restarts:
        lines.append(f"attempt:   {job.attempt} (restarts {job.restarts})")
    if spec.outputs:
        lines.append(f"outputs:   {spec.outputs}")
    for task in job.tasks:
        code = f", exit {task.exit_code}" if task.exit_code is not None else ""
        lines.append(f"task:      {task.name} ({task.status}{code}; outputs {task.outputs}/)")
    for run in job.nodes:
        detail = (
            f"{run.state}"
            + (f", pid {run.pid}" if run.pid else "")
            + (f", on {run.host}" if run.host else "")
        )
        if run.exit_code is not None:
            detail += f", exit {run.exit_code}"
            if stopped_after_success(job, run):
                detail += ", stopped when the primary nodes had succeeded"
        lines.append(f"node:      {run.name} ({detail})")
    return "\n".join(lines)


def stopped_after_success(job: Job, run) -> bool:
    """Whether ``run`` is an auxiliary node (a parameter server, which never ends by itself) that
    the platform stopped once the job's primary nodes had succeeded: its exit code (143 for
    SIGTERM) is the stop's, not a failure."""
    return job.status is JobStatus.succeeded and not run.primary and run.exit_code not in (None, 0)


def fit_width(line: str, columns: int) -> str:
    """A shown log line (after :func:`visible_line`) cut to fit one terminal row of ``columns``
    without wrapping (one column left for the cursor): the CLI redraws a line still being
    written in place, which only works while it takes one row.  Its control characters are
    shown (:func:`terminal_text`, colours dropped: they take no column but a cut could split
    one); a wide character (East Asian) takes two columns."""
    import unicodedata

    text = terminal_text(line)
    room = max(1, columns - 1)
    if len(text) * 2 <= room:
        return text
    used = 0
    for index, char in enumerate(text):
        used += 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1
        if used > room:
            return text[:index]
    return text


def one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines too) as one space."""
    return " ".join(str(text).split())


def clock(value: datetime | None) -> str:
    """A time in local time, ``-`` when there is none."""
    if value is None:
        return "-"
    return value.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def elapsed(job: Job | JobSummary) -> str:
    """How long a job ran (so far), ``H:MM:SS``; ``-`` before it started."""
    if not job.started_at:
        return "-"
    end = job.finished_at or datetime.now(UTC)
    return format_seconds((end - job.started_at).total_seconds())


def text_table(rows: list[list[str]]) -> str:
    """Rows (the first one the header) as aligned text lines."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() + "\n" for row in rows
    )


# ------------------------------------------------------------------ HTML of the widgets

STATUS_COLORS = {
    JobStatus.queued: "#757575",
    JobStatus.running: "#1565c0",
    JobStatus.succeeded: "#2e7d32",
    JobStatus.error: "#b00020",
    JobStatus.stopped: "#ef6c00",
    JobStatus.expired: "#6a1b9a",
}


def status_badge(status: JobStatus) -> str:
    """HTML for a status badge (class ``ma-status ma-status-<status>``)."""
    color = STATUS_COLORS.get(status, "#424242")
    return (
        f"<span class='ma-status ma-status-{status.value}' style='background:{color};color:white;"
        f"padding:2px 8px;border-radius:10px;font-weight:600'>{status.value}</span>"
    )


def events_html(events: list[Event]) -> str:
    """A job's events as an HTML table (the job monitor's events tab)."""
    from html import escape  # HTML is the notebook's: a command line never loads it

    rows = "".join(
        f"<tr><td>{e.seq}</td><td>{clock(e.time)}</td><td>{e.status.value}</td>"
        f"<td>{escape(stream_label((e.node, e.rank)) if e.node else '')}</td><td>{escape(e.reason)}</td></tr>"
        for e in events
    )
    return (
        "<table><thead><tr><th>#</th><th>time</th><th>status</th><th>node</th><th>reason</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
    )
