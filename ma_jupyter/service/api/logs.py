"""A job's logs: ``GET /jobs/{id}/logs`` (its streams, each with where a client on this machine
may read it directly) and ``GET /jobs/{id}/logs/read`` (bytes of one stream, by node and rank,
from a byte offset, long-poll ``wait``: :func:`..logs.read_chunk`).

A read that waits is a log follower: it is admitted under ``[limits] max_log_followers_per_job``
and ``max_log_followers_per_user`` (:mod:`..sessions`), counted while it waits; a read that does
not wait is not counted."""

from __future__ import annotations

from fastapi import APIRouter, Query
from starlette.concurrency import run_in_threadpool

from ...errors import RefusedFile
from ...models import API_PREFIX, LogChunk, LogFile, LogStream
from .. import access
from ..access import Op
from ..logs import MAX_WAIT, default_node, ensure_stream, read_chunk
from .deps import MAX_BYTE_OFFSET, MAX_ID, MAX_RANK, CallerDep, JobId, ServicesDep

router = APIRouter(prefix=API_PREFIX)


@router.get("/jobs/{job_id}/logs", response_model=list[LogStream])
def log_streams(services: ServicesDep, user: CallerDep, job_id: str = JobId) -> list[LogStream]:
    job = access.check(services.store.get(job_id), user, Op.view)
    return services.backend.log_streams(job)


@router.get("/jobs/{job_id}/logs/read", response_model=LogChunk)
async def read_log(
    services: ServicesDep,
    user: CallerDep,
    job_id: str = JobId,
    node: str | None = Query(default=None, max_length=MAX_ID),
    rank: int | None = Query(default=None, ge=0, le=MAX_RANK),
    offset: int = Query(default=0, ge=0, le=MAX_BYTE_OFFSET),
    limit: int = Query(default=1 << 20, ge=1, le=8 << 20),
    wait: float = Query(default=0.0, ge=0, le=MAX_WAIT),
) -> LogChunk:
    store, backend = services.store, services.backend
    located: list[LogFile | None] = [None]

    def check() -> str:  # on the reading thread (the store and the streams, never in the loop)
        job = access.check(store.get(job_id), user, Op.view)
        chosen = node or default_node(job)
        ensure_stream(job, backend, chosen, rank)
        if offset == 0:  # the first read also says where the file is: no second request for it
            found = (s.file for s in backend.log_streams(job) if s.node == chosen and s.rank == rank)
            located[0] = next(found, None)
        return chosen

    release = None
    if wait > 0:  # a follower: admitted once it may see the job (an outsider takes no slot)
        await run_in_threadpool(lambda: access.check(store.get(job_id), user, Op.view))
        release = services.sessions.admit("log_follower", job_id, user.name)
    try:
        chunk = await read_chunk(
            backend,
            job_id,
            check,
            rank,
            offset,
            limit,
            wait,
            lambda: store.status(job_id).is_terminal(),
            changes=store.changes,
        )
        return chunk if located[0] is None else chunk.model_copy(update={"file": located[0]})
    except RefusedFile as exc:
        # The job planted something the service will not read: that ends the job.
        await run_in_threadpool(services.supervisor.fail_job, job_id, exc.message)
        raise
    finally:
        if release is not None:
            release()
