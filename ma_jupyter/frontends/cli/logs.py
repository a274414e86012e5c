"""``ma-jupyter logs``: a job's log, every node's or one stream's, printed or followed live (also
what ``submit --follow`` prints)."""

from __future__ import annotations

import argparse
import sys
import time

from ...client import Client, JobHandle
from ...client.logs import JobFollower, several_nodes, stream_label
from ...client.resolve import resolve_job
from ...errors import InvalidSpec, NodeLost, NotFound
from .. import jobactions, render
from .output import (
    EXIT_FAILED,
    EXIT_OK,
    Alerts,
    columns,
    control,
    err,
    interrupted,
    print_alerts,
)

TYPE_CHECKING = False  # typing's, without importing typing (a command line's call: ~5 ms)
if TYPE_CHECKING:
    from typing import Any


def _logs(args: argparse.Namespace) -> int:
    handle = resolve_job(Client(plain=True), args.job)
    if not args.follow:
        return _print_logs(handle, args)
    try:
        return _print_logs(handle, args)
    except KeyboardInterrupt:
        return interrupted(handle)


def _print_logs(handle: JobHandle, args: argparse.Namespace) -> int:
    if args.rank is not None and args.node:  # the log is read from the file when it is here
        elsewhere = handle.info.rank_elsewhere(args.node, args.rank)
        if elsewhere is not None:
            raise NotFound(elsewhere)
    if args.all and (args.node or args.offset):
        raise InvalidSpec("--all reads every node from its start: drop --node and --offset")
    # one stream when one is named (a node, a rank, an offset within a stream); otherwise
    # every node's log, each line prefixed with its node when the job has several
    one_stream = bool(args.node or args.offset or (args.rank is not None and not args.all))
    if one_stream and args.follow and args.node:
        # one stream followed live (a line still being written shows as it stands)
        key = (args.node, args.rank)
        # an unknown node or rank is a NotFound now, not a follow that never ends
        handle.client.read_log(handle.id, node=args.node, rank=args.rank, offset=0, limit=1)
        alerts = Alerts(handle)
        lost = follow_nodes(handle, stream=key, offsets={stream_label(key): args.offset}, alerts=alerts)
        alerts.show_new()
        return EXIT_FAILED if lost else EXIT_OK
    if one_stream:
        try:
            _print_lines(handle.logs(follow=args.follow, node=args.node, rank=args.rank, offset=args.offset))
        except NodeLost as exc:  # what could be read is printed; then why the rest cannot be
            sys.stdout.flush()
            err(render.one_line(exc.message))
            return EXIT_FAILED
        if args.follow:  # the job has ended: what its success does not show
            print_alerts(handle)
        return EXIT_OK
    if args.follow:
        alerts = Alerts(handle)
        lost = follow_nodes(handle, rank=args.rank, prefixed=args.all, alerts=alerts)
        alerts.show_new()
    else:
        lost = _print_all_nodes(handle, rank=args.rank, prefixed=args.all)
    return EXIT_FAILED if lost else EXIT_OK


def _print_all_nodes(handle: JobHandle, *, rank: int | None, prefixed: bool) -> list[str]:
    """What every node's log holds now, node after node, lines prefixed with ``[node]``
    (``[node/rank-r]`` with ``--rank``) when the job has several nodes (or ``--rank``); the
    streams whose log is gone with their node's machine, each named on stderr with why."""
    lost: list[str] = []
    nodes = jobactions.every_node(handle)
    prefixed = prefixed or rank is not None or len(nodes) > 1 or several_nodes(handle.info)
    for log in jobactions.node_logs(handle, nodes, rank):
        for line in log:
            print(f"[{log.label}] {render.visible_line(line)}" if prefixed else render.visible_line(line))
        if log.lost is not None:  # the other nodes are still read
            sys.stdout.flush()
            err(f"[{log.label}] {render.one_line(log.lost)}" if prefixed else render.one_line(log.lost))
            lost.append(log.label)
    return lost


#: seconds between a follower's looks at the job's alerts (``follow_nodes``)
ALERT_LOOK_EVERY = 2.0


def follow_nodes(
    handle: JobHandle,
    *,
    stream: tuple[str, int | None] | None = None,
    rank: int | None = None,
    prefixed: bool = False,
    offsets: dict[str, int] | None = None,
    alerts: Alerts | None = None,
) -> list[str]:
    """Print a job's log as it is written until the job has ended, through the front ends'
    one :class:`~ma_jupyter.client.logs.JobFollower`: every node's lines in arrival order,
    each prefixed with ``[node]`` when the job has several or ``prefixed`` (or only ``stream``;
    with ``rank`` that rank's log on every node, ``[node/rank-r]``).  Then each stream whose log is gone
    with its node's machine is named on stderr with why; returns those streams.

    On a terminal, a line the job is still writing (a progress bar redrawn with ``\r``) is
    shown as it stands on the last row, redrawn in place until its newline comes (the newest
    such line of all streams); a pipe or a file gets whole lines only, each once.

    With ``alerts``, the job's alert events raised while it is followed are printed on stderr
    as they come, looked for every :data:`ALERT_LOOK_EVERY` seconds (the alert of a job that
    "looks hung" would otherwise show only once the job ended, and such a job does not end)."""
    follower = JobFollower(
        handle.client, handle.info, stream=stream, rank=rank, prefixed=prefixed, offsets=offsets
    )
    write, visible = sys.stdout.write, render.visible_line
    live = sys.stdout.isatty()
    showing = False  # whether the last row holds an unfinished line
    current: dict[tuple[str, int | None], str] = {}  # each stream's unfinished line, newest last
    alerts_due = time.monotonic() + ALERT_LOOK_EVERY
    try:
        for items, partials in follower.updates(idle=alerts is not None):
            if alerts is not None and time.monotonic() >= alerts_due:
                alerts_due = time.monotonic() + ALERT_LOOK_EVERY
                if showing:
                    control("\r\x1b[K")  # the alert's line takes the row of the unfinished one
                    showing = False
                sys.stdout.flush()  # the lines before the alert come before it
                alerts.show_new(quiet_if_unavailable=True)
            if showing:
                control("\r\x1b[K")  # the unfinished line makes room for what came
                showing = False
            for key, line in items:
                write(f"{follower.prefix(key)}{visible(line)}\n")
            if live:
                for key, text in partials.items():
                    current.pop(key, None)
                    if text:
                        current[key] = text
                if current:
                    key, text = next(reversed(current.items()))
                    write(render.fit_width(f"{follower.prefix(key)}{visible(text)}", columns()))
                    showing = True
            sys.stdout.flush()  # a follower sees each line as soon as the job prints it
    finally:
        if showing:
            control("\r\x1b[K")  # an interrupt leaves no half line behind
        sys.stdout.flush()
    for label, why in follower.unavailable.items():
        err(f"[{label}] {render.one_line(why)}" if follower.several else render.one_line(why))
    if follower.errors:
        print("log read problems: " + "; ".join(follower.errors), file=sys.stderr)
    return list(follower.unavailable)


def _print_lines(lines: Any) -> None:
    """Each line as a terminal shows it (a progress bar's last state), flushed at once."""
    write, flush, visible = sys.stdout.write, sys.stdout.flush, render.visible_line
    for line in lines:
        write(visible(line) + "\n")
        flush()  # a follower sees each line as soon as the job prints it


#: the commands of this module, by name (see the package's ``_command``)
COMMANDS = {"logs": _logs}
