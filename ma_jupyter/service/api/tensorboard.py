"""A job's TensorBoard: ``POST /jobs/{id}/tensorboard`` (start or reuse it over the job's
outputs, confined to them, as the job's account; its URL), ``GET`` (its state: running,
starting, ended with the reason, or none) and ``DELETE`` (stop it).

Rules:

1. Starting, reusing and reading its state is viewing the job (``Op.tensorboard``); a board the
   caller starts counts against the caller's own ``[limits] max_tensorboards_per_user``
   (:mod:`..tensorboard`, rule 1), whatever the job's owner.
2. Stopping it is stopping the job (``Op.stop``: its owner, a ``rw`` user, an admin): a ``ro``
   user gets a 403 naming the owner, never ends a board someone else reads.
3. A start never holds a request thread while TensorBoard comes up: the route awaits the
   manager's future (:mod:`..tensorboard`, rule 2).
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from ...errors import Forbidden, InvalidSpec
from ...models import API_PREFIX
from .. import access
from ..access import Op
from .deps import CallerDep, JobId, ServicesDep

router = APIRouter(prefix=API_PREFIX)


@router.post("/jobs/{job_id}/tensorboard")
async def start_tensorboard(services: ServicesDep, user: CallerDep, job_id: str = JobId) -> dict:
    job = await run_in_threadpool(lambda: access.check(services.store.get(job_id), user, Op.tensorboard))
    if services.tensorboards is None:
        raise InvalidSpec("TensorBoard is not available in this service")
    # the backend starts it confined to the job's outputs, as the job's account (rule 3)
    # shielded: the future is shared by every caller starting this board, and one caller
    # going away must not cancel it for the others
    return {"url": await asyncio.shield(asyncio.wrap_future(services.tensorboards.begin(job, user.name)))}


@router.get("/jobs/{job_id}/tensorboard")
def tensorboard_state(services: ServicesDep, user: CallerDep, job_id: str = JobId) -> dict:
    access.check(services.store.get(job_id), user, Op.tensorboard)
    if services.tensorboards is None:
        return {
            "state": "none",
            "url": None,
            "reason": "TensorBoard is not available here",
            "started_by": None,
        }
    return services.tensorboards.state(job_id)


@router.delete("/jobs/{job_id}/tensorboard", status_code=204)
def stop_tensorboard(services: ServicesDep, user: CallerDep, job_id: str = JobId) -> Response:
    job = access.check(services.store.get(job_id), user, Op.tensorboard)
    try:
        access.check(job, user, Op.stop)  # rule 2
    except Forbidden:
        raise Forbidden(
            f"job {job.id} belongs to {job.spec.creator} and allows others {job.spec.access.value} access: "
            "ask its owner to stop its TensorBoard (only the owner, a user the job allows rw access or an "
            "admin stops a job's TensorBoard; an unused one ends by itself)"
        ) from None
    if services.tensorboards is not None:
        services.tensorboards.stop(job_id)
    return Response(status_code=204)
