"""Acting on jobs: ``%ma_stop``, ``%ma_delete``, ``%ma_update`` (through the command layer,
:mod:`ma_jupyter.frontends.jobactions`, as the CLI does).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from IPython.core.error import UsageError

from .parsing import JOBS_HINT, job_parser, parse, resolve_job

if TYPE_CHECKING:
    from IPython.core.magic import Magics


def ma_stop(magics: Magics, line: str):
    """Stop jobs: ``%ma_stop JOB [JOB ...]``."""
    from ... import jobactions
    from ..session import get_client

    parser = job_parser("%ma_stop", "Stop running or queued jobs.", job="many")
    args = parse(parser, line)
    if args is None:
        return None
    for done in jobactions.stop_jobs(get_client(), args.job, hint=JOBS_HINT):
        if done.error is not None:
            raise done.error
        print(f"job {done.handle.id} ({done.handle.name}): stop requested, now {done.result.status.value}")
    return None


def ma_delete(magics: Magics, line: str):
    """Delete finished jobs (``--force`` stops a running one first): ``%ma_delete JOB [JOB ...] [--force]``.

    Each job on its own: one that cannot be deleted is reported, the others are still
    deleted, and then the cell fails naming how many were not.
    """
    from ... import jobactions, render
    from .. import record as notebook_record
    from ..session import get_client

    parser = job_parser("%ma_delete", "Delete jobs and their records.", job="many")
    parser.add_argument("--force", action="store_true", help="stop the job first if it still runs")
    args = parse(parser, line)
    if args is None:
        return None
    outcomes = []
    for done in jobactions.delete_jobs(get_client(), args.job, force=args.force, hint=JOBS_HINT):
        outcomes.append(done)
        if done.error is not None:
            print(f"job {done.ref}: not deleted: {render.one_line(done.error.message)}")
            continue
        notebook_record.forget(done.handle.id)
        print(f"job {done.handle.id} ({done.handle.name}) deleted")
    failed = jobactions.not_done(outcomes)
    if failed:
        raise UsageError(
            f"%ma_delete: {len(failed)} of {len(outcomes)} jobs not deleted: {', '.join(failed)}"
        )
    return None


def ma_update(magics: Magics, line: str):
    """Change a queued job's priority or a job's duration: ``%ma_update JOB --priority urgent``,
    ``%ma_update JOB --duration 2h``."""
    from ....models import Priority
    from ... import render
    from ..session import get_client

    parser = job_parser("%ma_update", "Change a queued job's priority or a queued or running job's duration.")
    parser.add_argument("--priority", choices=[p.value for p in Priority], help="queued jobs")
    parser.add_argument("--duration", metavar="TIME", help="seconds or 30m, 2h, 1d (queued or running jobs)")
    args = parse(parser, line)
    if args is None:
        return None
    if args.priority is None and args.duration is None:
        raise UsageError("%ma_update: give --priority (queued jobs) or --duration (queued or running jobs)")
    client = get_client()
    handle = resolve_job(client, args.job)
    job = client.update(handle.id, priority=args.priority, duration=args.duration)
    handle.info = job
    changed = []
    if args.priority is not None:
        changed.append(f"priority {job.spec.priority.value}")
    if args.duration is not None:
        shown = render.format_seconds(job.spec.duration) if job.spec.duration else "none"
        changed.append(f"duration {shown}")
    print(f"job {job.id} ({job.spec.name}): {', '.join(changed)}; now {job.status.value}")
    return handle
