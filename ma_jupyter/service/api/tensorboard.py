"""A job's TensorBoard: ``POST /jobs/{id}/tensorboard`` (start or reuse it over the job's
outputs, confined to them, as the job's account; its URL) and ``DELETE`` (stop it).

A new one is started only while the caller has fewer running than ``[limits]
tensorboards_per_user`` (:mod:`..sessions`); a job has one at most (a start reuses it)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from ...errors import InvalidSpec, NotFound
from ...models import API_PREFIX
from .. import access
from ..access import Op
from ..sessions import check_count
from .deps import CallerDep, JobId, ServicesDep

router = APIRouter(prefix=API_PREFIX)


@router.post("/jobs/{job_id}/tensorboard")
def start_tensorboard(services: ServicesDep, user: CallerDep, job_id: str = JobId) -> dict:
    job = access.check(services.store.get(job_id), user, Op.tensorboard)
    if services.tensorboards is None:
        raise InvalidSpec("TensorBoard is not available in this service")
    with services.sessions.serial("tensorboard", user.name):
        running = services.tensorboards.running()
        if job.id not in running:
            held = sum(1 for other in running if _owner(services, other) == user.name)
            limits = services.scheduler.cluster.limits
            check_count("tensorboard", "user", held, limits, f"user {user.name}")
        # the backend starts it confined to the job's outputs, as the job's account
        return {"url": services.tensorboards.start(job)}


def _owner(services, job_id: str) -> str | None:
    try:
        return services.store.get(job_id).spec.creator
    except NotFound:
        return None


@router.delete("/jobs/{job_id}/tensorboard", status_code=204)
def stop_tensorboard(services: ServicesDep, user: CallerDep, job_id: str = JobId) -> Response:
    access.check(services.store.get(job_id), user, Op.tensorboard)
    if services.tensorboards is not None:
        services.tensorboards.stop(job_id)
    return Response(status_code=204)
