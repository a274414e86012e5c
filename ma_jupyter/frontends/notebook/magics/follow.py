"""A job's log and events in the cell: ``%ma_logs``, ``%ma_events``, ``%ma_attach``, and
:func:`follow`, the live follow every magic that watches a job uses (it keeps the notebook's
record of what was shown, so a later ``%ma_attach`` continues there).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError

from ....errors import JobFailed, NotFound
from .parsing import job_parser, parse, resolve_job

if TYPE_CHECKING:
    from IPython.core.magic import Magics


def follow(
    magics: Magics,
    handle: Any,
    *,
    offsets: dict | None = None,
    lines: int,
    stop_on_interrupt: bool,
    note: str = "",
    stream: tuple[str, int | None] | None = None,
    kernel_hint: bool = False,
):
    """Follow the job live in the cell; with ``kernel_hint`` (a job this cell submitted), a
    failure on a NameError of a kernel variable says how to pass values in."""
    from .. import hints, live
    from .. import record as notebook_record
    from ..session import get_client

    job_id = handle.id
    notebook_record.remember(job_id, handle.name, offsets)

    def progress(seen: dict[str, int]) -> None:
        notebook_record.remember(job_id, handle.name, seen)

    try:
        live.follow_job(
            get_client(),
            job_id,
            offsets=offsets,
            max_lines=lines,
            stop_on_interrupt=stop_on_interrupt,
            on_progress=progress,
            note=note,
            stream=stream,
        )
    except JobFailed as exc:
        hint = hints.kernel_variable_hint(exc.log_tail, magics.shell.user_ns) if kernel_hint else None
        if hint is None:
            raise
        raise JobFailed(f"{exc.message}\n{hint}", job=exc.job, log_tail=exc.log_tail) from None
    handle.refresh()
    return handle


def ma_logs(magics: Magics, line: str):
    """A job's log: ``%ma_logs JOB [--follow] [--node worker-0] [--rank R] [--tail N]``.

    ``--follow`` shows the log live from its start until the job ends; only while this
    kernel already follows the job live (another cell's follow) does it continue where that
    one is (nothing shown twice).  ``%ma_attach`` continues where the notebook left off.
    """
    from ....client.logs import stream_label
    from ... import jobactions, render
    from .. import live
    from .. import record as notebook_record
    from ..session import get_client

    parser = job_parser("%ma_logs", "Print or follow a job's log.")
    parser.add_argument("--follow", "-f", action="store_true", help="follow live until the job ends")
    parser.add_argument("--node", help="node, e.g. worker-0 (default: every node)")
    parser.add_argument("--rank", type=int, help="one rank's log of the node")
    parser.add_argument("--tail", type=int, metavar="N", help="only the last N lines")
    parser.add_argument(
        "--from-start",
        action="store_true",
        help="with --follow: start at the beginning also while this kernel follows the job live",
    )
    parser.add_argument(
        "--lines", type=int, default=live.DEFAULT_MAX_LINES, help="lines a followed cell keeps"
    )
    args = parse(parser, line)
    if args is None:
        return None
    if args.rank is not None and not args.node:
        raise UsageError("%ma_logs: --rank needs --node (e.g. --node worker-0 --rank 1)")
    client = get_client()
    handle = resolve_job(client, args.job)
    if args.follow:
        live_now = handle.id in live.following and not args.from_start
        offsets = notebook_record.offsets(handle.id) if live_now else {}
        stream = (args.node, args.rank) if args.node else None
        if stream is not None:
            # an unknown node or rank is a NotFound now, not a follow that never ends
            client.read_log(handle.id, node=args.node, rank=args.rank, offset=0, limit=1)
            offsets = {k: v for k, v in offsets.items() if k == stream_label(stream)}
        note = "continuing where this notebook left off" if offsets else ""
        follow(
            magics,
            handle,
            offsets=offsets,
            lines=args.lines,
            stop_on_interrupt=False,
            note=note,
            stream=stream,
        )
        return None
    nodes = [args.node] if args.node else jobactions.every_node(handle)
    several = len(nodes) > 1
    for log in jobactions.node_logs(handle, nodes, args.rank):
        lines = [render.visible_line(entry) for entry in log]
        if log.lost is not None:  # gone with its node's machine: the other nodes still show
            print(f"[{log.label}] {log.lost}" if several else log.lost)
            continue
        if args.tail is not None:
            lines = lines[-args.tail :] if args.tail > 0 else []
        for entry in lines:
            # shown, never acting on the terminal (SGR colours stay: the output area shows them)
            entry = render.terminal_text(entry, keep_sgr=True)
            print(f"[{log.label}] {entry}" if several else entry)
    return None


def ma_events(magics: Magics, line: str):
    """A job's events (status changes and notices with their reasons): ``%ma_events JOB``."""
    from ....client.logs import stream_label
    from ... import render
    from ..session import get_client

    parser = job_parser("%ma_events", "Show a job's events.")
    args = parse(parser, line)
    if args is None:
        return None
    client = get_client()
    handle = resolve_job(client, args.job)
    rows = []
    for ev in client.events(handle.id):
        where = stream_label((ev.node, ev.rank)) if ev.node else ""
        rows.append(
            [ev.seq, render.clock(ev.time), ev.status.value, where, ev.by or "", render.event_reason(ev)]
        )
    from IPython.display import display

    display(render.table_bundle(["seq", "time", "status", "node", "by", "reason"], rows), raw=True)
    return None


def ma_attach(magics: Magics, line: str):
    """Continue following jobs after a kernel restart: ``%ma_attach [JOB]``.

    Without a job: every job this notebook started that is still going (or whose log was
    not fully shown), each continuing where the notebook left off.
    """
    from ....client.logs import fully_shown
    from ... import render
    from .. import live
    from .. import record as notebook_record
    from ..session import get_client

    parser = job_parser("%ma_attach", "Re-attach to this notebook's jobs.", job="optional")
    parser.add_argument("--lines", type=int, default=live.DEFAULT_MAX_LINES)
    parser.add_argument("--stop-on-interrupt", action="store_true")
    args = parse(parser, line)
    if args is None:
        return None
    client = get_client()
    if args.job:
        handles = [resolve_job(client, args.job)]
    else:
        handles = []
        for job_id in notebook_record.jobs():
            try:
                handles.append(client.job(job_id))
            except NotFound:
                notebook_record.forget(job_id)
        if not handles:
            print("this notebook has no jobs to attach to: `%ma_jobs` lists every job")
            return None
    attached = []
    for handle in handles:
        offsets = notebook_record.offsets(handle.id)
        if handle.info.status.is_terminal() and offsets and not args.job:
            if fully_shown(client, handle.id, offsets):
                print(render.status_line(handle.info))
                continue
        note = "re-attached: continuing where this notebook left off" if offsets else "re-attached"
        follow(
            magics,
            handle,
            offsets=offsets,
            lines=args.lines,
            stop_on_interrupt=args.stop_on_interrupt,
            note=note,
        )
        attached.append(handle)
    if len(attached) == 1:
        return attached[0]
    return attached or None
