"""Looking at jobs: ``%ma_jobs`` (the listing), ``%ma_algorithms`` (your folders and favourites),
``%ma_top`` (a job's CPU and memory per node).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from IPython.core.error import UsageError

from .parsing import MagicParser, job_parser, parse, resolve_job

if TYPE_CHECKING:
    from IPython.core.magic import Magics


def ma_jobs(magics: Magics, line: str):
    """A table of jobs: ``%ma_jobs [--status running ...] [--name TEXT] [--spec SPEC] [--creator USER]
    [--outputs TEXT] [--algorithm FOLDER] [--favourites] [--type batch] [--limit N]``; a batch
    job's status counts its tasks by status; searched by ``--algorithm``, a ``code`` column says
    which jobs ran the folder's current content (``current``) and which another version."""
    from ....models import JobStatus
    from ... import jobactions, render
    from ..session import get_client

    parser = MagicParser(prog="%ma_jobs", description="List jobs, newest first.")
    jobactions.add_list_filters(parser)
    args = parse(parser, line)
    if args is None:
        return None
    page = get_client().job_page(**jobactions.list_filters(args))
    rows = []
    for job in page.items:
        status = job.status.value
        if job.status is JobStatus.queued and job.queue_position is not None:
            status += f" (#{job.queue_position + 1})"
        if job.task_counts:
            status += f"; tasks: {render.task_summary(job)}"
        rows.append(
            [
                job.id,
                job.spec.name,
                status,
                job.spec.mode.value,
                job.spec.nodes,
                job.chosen_spec or ",".join(job.spec.specs),
                render.clock(job.created_at),
                render.reason_summary(job),
            ]
            # searched by algorithm: whether it ran the folder's current content
            + ([jobactions.code_version(job, page)] if args.algorithm else [])
        )
    from IPython.display import display

    if not rows:
        print("no jobs match")
        return None
    columns = ["id", "name", "status", "mode", "nodes", "spec", "created", "reason"]
    display(render.table_bundle(columns + (["code"] if args.algorithm else []), rows), raw=True)
    return None


def ma_algorithms(magics: Magics, line: str):
    """Your algorithm folders and favourites: ``%ma_algorithms [favourite|unfavourite FOLDER]``.

    Lists the folders your jobs ran and the ones you marked favourite (``%ma_jobs
    --algorithm FOLDER`` / ``--favourites`` lists their jobs), or marks and unmarks one.
    """
    from ... import render
    from ..session import get_client

    parser = MagicParser(prog="%ma_algorithms", description="Your algorithm folders and favourites.")
    parser.add_argument("action", nargs="?", choices=["list", "favourite", "unfavourite"], default="list")
    parser.add_argument("folder", nargs="?", metavar="FOLDER", help="the folder to mark or unmark")
    args = parse(parser, line)
    if args is None:
        return None
    client = get_client()
    if args.action != "list":
        if not args.folder:
            raise UsageError(f"%ma_algorithms {args.action} needs the FOLDER")
        if args.action == "favourite":
            print(f"favourite: {client.favourite(args.folder).path}")
        else:
            client.unfavourite(args.folder)
            print(f"no longer a favourite: {args.folder}")
        return None
    found = client.algorithms()
    if not found:
        print("no algorithm folders yet: jobs with --code-dir (or a shipped folder) add theirs")
        return None
    from IPython.display import display

    from ... import jobactions

    # each folder with its versions (the contents its jobs ran, the most recent first)
    rows = [
        [
            a.path,
            "yes" if a.favourite else "",
            a.jobs,
            ", ".join(f"{jobactions.short_digest(v.digest)} ({v.jobs})" for v in a.versions),
        ]
        for a in found
    ]
    display(render.table_bundle(["folder", "favourite", "your jobs", "versions"], rows), raw=True)
    return None


def ma_top(magics: Magics, line: str):
    """A job's CPU and memory per node: ``%ma_top JOB`` (a table: now, mean, peak, limit);
    ``--inline`` draws them over time as a PNG."""
    from ... import render, usage
    from ..session import get_client

    parser = job_parser("%ma_top", "Show a job's CPU and memory use per node.")
    parser.add_argument("--inline", action="store_true", help="draw CPU and memory over time (PNG)")
    args = parse(parser, line)
    if args is None:
        return None
    client = get_client()
    handle = resolve_job(client, args.job)
    used = client.resources(handle.id)
    ended = handle.refresh().status.is_terminal()
    from IPython.display import Image, display

    if args.inline:
        display(Image(data=usage.png(used), format="png"))
    else:
        display(render.table_bundle([h.lower() for h in usage.HEADERS], usage.rows(used)), raw=True)
    if usage.note(used, ended=ended):
        print(usage.note(used, ended=ended))
    return None
