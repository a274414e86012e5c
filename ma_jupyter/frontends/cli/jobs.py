"""``ma-jupyter jobs``, ``get``, ``events``, ``top``, ``wait``, ``stop``, ``delete``, ``update``: listing and
acting on jobs."""

from __future__ import annotations

import argparse
import sys
import time

from ...client import Client
from ...client.plain import as_json
from ...client.resolve import resolve_job
from .. import jobactions, render, usage
from .output import (
    EXIT_OK,
    EXIT_USAGE,
    JOBS_HINT,
    control,
    err,
    finished,
    out,
    print_alerts,
)


def _jobs(args: argparse.Namespace) -> int:
    page = Client(plain=True).job_page(offset=args.offset, **jobactions.list_filters(args))
    if args.json:
        out(as_json(page), args)
        return EXIT_OK
    by_algorithm = bool(args.algorithm)  # then a column says which ran its current content
    rows = [["ID", "NAME", "STATUS", "SPEC", "NODES", "CREATED", "ELAPSED"]]
    rows[0] += ["CODE"] if by_algorithm else []
    rows[0] += ["REASON"]  # last: the one column of free text
    for job in page.items:
        status = job.status.value + (f" #{job.queue_position + 1}" if job.queue_position is not None else "")
        rows.append(
            [
                job.id,
                job.spec.name,
                status,
                job.chosen_spec or ",".join(job.spec.specs),
                str(job.spec.nodes),
                render.clock(job.created_at),
                render.elapsed(job),
            ]
            + ([jobactions.code_version(job, page)] if by_algorithm else [])
            + [render.list_reason(job)]
        )
    print(render.text_table(rows), end="")
    shown = len(page.items)
    if page.total > args.offset + shown:
        print(f"({shown} of {page.total} jobs shown; use --offset/--limit for more)")
    return EXIT_OK


def _get(args: argparse.Namespace) -> int:
    job = resolve_job(Client(plain=True), args.job).info
    out(as_json(job) if args.json else render.format_job(job), args)
    return EXIT_OK


def _events(args: argparse.Namespace) -> int:
    client = Client(plain=True)
    handle = resolve_job(client, args.job)
    events = handle.events()
    if args.json:
        out(as_json(events), args)
        return EXIT_OK
    rows = [["SEQ", "TIME", "STATUS", "WHERE", "BY", "REASON"]]
    for e in events:
        where = (e.node or "") + (f"/rank-{e.rank}" if e.rank is not None else "")
        reason = render.event_reason(e)
        rows.append(
            [str(e.seq), render.clock(e.time), e.status.value, where, e.by or "", render.one_line(reason)]
        )
    print(render.text_table(rows), end="")
    return EXIT_OK


def _top(args: argparse.Namespace) -> int:
    handle = resolve_job(Client(plain=True), args.job)
    while True:
        used = handle.resources()
        if args.json:
            out(as_json(used), args)
            return EXIT_OK
        if args.follow and sys.stdout.isatty():
            control("\x1b[H\x1b[2J")  # redraw in place, as top does
        print(render.text_table([usage.HEADERS, *usage.rows(used)]), end="")
        ended = handle.refresh().status.is_terminal()
        if usage.note(used, ended=ended):
            print(usage.note(used, ended=ended))
        if not args.follow or ended:
            return EXIT_OK
        time.sleep(used.interval)


def _wait(args: argparse.Namespace) -> int:
    handle = resolve_job(Client(plain=True), args.job)
    final = handle.wait(timeout=args.timeout, check=False)
    if not args.json and final.status.is_terminal():
        print_alerts(handle)
    return finished(final, args)


def _stop(args: argparse.Namespace) -> int:
    handle = resolve_job(Client(plain=True), args.job)
    job = handle.stop()
    out(as_json(job) if args.json else f"stopping {job.id}: {job.status.value}", args)
    return EXIT_OK


def _delete(args: argparse.Namespace) -> int:
    outcomes = []
    several = len(set(args.jobs)) > 1  # then each line names the job as it was given too
    # several jobs (the seed's batch delete): each on its own, a refusal said for that job on
    # stderr and the others still deleted; one job: its refusal is the usual one-line error
    for done in jobactions.delete_jobs(Client(plain=True), args.jobs, force=args.force, hint=JOBS_HINT):
        outcomes.append(done)
        if done.error is not None:
            err(f"{done.ref}: not deleted: {render.one_line(done.error.message)}")
        else:
            print(
                f"deleted {done.handle.id}"
                + (f" ({done.ref})" if several and done.ref != done.handle.id else "")
            )
    failed = jobactions.not_done(outcomes)
    if failed:
        err(f"error: {len(failed)} of {len(outcomes)} jobs not deleted")
    return EXIT_USAGE if failed else EXIT_OK


def _update(args: argparse.Namespace) -> int:
    client = Client(plain=True)
    handle = resolve_job(client, args.job)
    job = client.update(handle.id, priority=args.priority, duration=args.duration)
    out(as_json(job) if args.json else render.format_job(job), args)
    return EXIT_OK


#: the commands of this module, by name (see the package's ``_command``)
COMMANDS = {
    "jobs": _jobs,
    "get": _get,
    "events": _events,
    "top": _top,
    "wait": _wait,
    "stop": _stop,
    "delete": _delete,
    "update": _update,
}
