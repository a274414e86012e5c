"""A job's TensorBoard: ``POST /jobs/{id}/tensorboard`` (start or reuse it over the job's
outputs, confined to them, as the job's account; its URL) and ``DELETE`` (stop it)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from ...errors import InvalidSpec
from ...models import API_PREFIX
from .. import access
from ..access import Op
from .deps import CallerDep, JobId, ServicesDep

router = APIRouter(prefix=API_PREFIX)


@router.post("/jobs/{job_id}/tensorboard")
def start_tensorboard(services: ServicesDep, user: CallerDep, job_id: str = JobId) -> dict:
    job = access.check(services.store.get(job_id), user, Op.tensorboard)
    if services.tensorboards is None:
        raise InvalidSpec("TensorBoard is not available in this service")
    # the backend starts it confined to the job's outputs, as the job's account
    return {"url": services.tensorboards.start(job)}


@router.delete("/jobs/{job_id}/tensorboard", status_code=204)
def stop_tensorboard(services: ServicesDep, user: CallerDep, job_id: str = JobId) -> Response:
    access.check(services.store.get(job_id), user, Op.tensorboard)
    if services.tensorboards is not None:
        services.tensorboards.stop(job_id)
    return Response(status_code=204)
