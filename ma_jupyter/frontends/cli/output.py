"""What every ``ma-jupyter`` command prints the same way: exit codes, JSON or text on stdout,
one-line notes on stderr, the CLI's own terminal control, a job's end and the detach message."""

from __future__ import annotations

import argparse
import json
import os
import sys

from ...client import JobHandle
from ...client.plain import as_json
from ...wire import JobStatus
from .. import render

TYPE_CHECKING = False  # typing's, without importing typing (a command line's call: ~5 ms)
if TYPE_CHECKING:  # annotations only: the CLI reads answers without pydantic
    from typing import Any

    from ...models import Job


EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

#: where a NotFound tells the user to look for their jobs
JOBS_HINT = "`ma-jupyter jobs`"


def interrupted(handle: JobHandle, *, stop: bool = False) -> int:
    """Ctrl-C while following or waiting for a job: the CLI detaches and says so on stderr,
    with the commands that follow, stop or attach the job again (its id, never its name: the
    name may mean a newer job by then); with ``stop`` (``--stop-on-interrupt``) it asks the
    service to stop the job instead.  Exits 130 (the shell's code for an interrupt)."""
    job_id = handle.id
    sys.stdout.flush()
    if stop:
        handle.client.stop(job_id)
        err(
            f"interrupted: stop requested for job {job_id} (`ma-jupyter logs {job_id} --follow` shows its end)"
        )
        return EXIT_INTERRUPTED
    err(
        f"detached: job {job_id} keeps running\n"
        f"  follow it again:   ma-jupyter logs {job_id} --follow\n"
        f"  stop it:           ma-jupyter stop {job_id}\n"
        f"  in a notebook:     %ma_attach {job_id}"
    )
    return EXIT_INTERRUPTED


def print_alerts(handle: JobHandle) -> None:
    """The job's alert events (performance, a multi-node job that did not run distributed), one
    line each on stderr, once the job has ended (``submit``/``clone`` with ``--follow`` or
    ``--wait``, ``logs --follow``, ``wait``): the job's success does not show them."""
    Alerts(handle).show_new()


class Alerts:
    """A job's alert events, each printed once on stderr: a follower shows them as they come
    (a job that "looks hung" prints nothing, so its alert is all a follower would see), and
    :meth:`show_new` at the end shows the rest."""

    def __init__(self, handle: JobHandle) -> None:
        self.handle = handle
        self.seen = 0  # the sequence number of the last event looked at

    def show_new(self, *, quiet_if_unavailable: bool = False) -> None:
        """Print the alerts raised since the last call.  ``quiet_if_unavailable`` (a look
        during a follow): a look that fails (a service that does not answer now, a job deleted
        meanwhile) shows nothing and ends nothing; the follow says what ended it, and the next
        call asks again."""
        from ...errors import MaJupyterError

        try:
            events = self.handle.events(after=self.seen)
        except MaJupyterError:
            if quiet_if_unavailable:
                return
            raise
        for event in events:
            if event.alert:
                err(f"ALERT{f' ({event.node})' if event.node else ''}: {render.one_line(event.reason)}")
        if events:
            self.seen = events[-1].seq


def finished(job: Job, args: argparse.Namespace) -> int:
    if getattr(args, "json", False):
        out(as_json(job), args)
    else:
        line = f"{job.id}: {job.status.value}"
        if job.exit_code is not None:
            line += f" (exit code {job.exit_code})"
        if job.reason and job.status is not JobStatus.succeeded:
            line += f": {render.one_line(job.reason)}"
        print(line)
    return EXIT_OK if job.status is JobStatus.succeeded else EXIT_FAILED


def submitted(handle: JobHandle) -> str:
    job = handle.info
    where = f" (queue position {job.queue_position + 1})" if job.queue_position is not None else ""
    return f"submitted {job.id} ({job.spec.name}): {job.status.value}{where}"


def out(value: Any, args: argparse.Namespace) -> None:
    if isinstance(value, str):
        print(value)
    else:
        print(json.dumps(value, indent=2 if sys.stdout.isatty() else None, default=str))


def columns() -> int:
    """The terminal's width (80 when it cannot be told)."""
    try:
        return os.get_terminal_size(sys.stdout.fileno()).columns or 80
    except (OSError, ValueError, AttributeError):
        return 80


def control(sequence: str) -> None:
    """Write the CLI's own terminal control (never job-made text) past the neutralising."""
    stream = sys.stdout
    if isinstance(stream, render.TerminalSafe):
        stream.control(sequence)
    else:
        stream.write(sequence)


def err(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
