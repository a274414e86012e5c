"""Data preparation's shared copies (:mod:`..prepared`): ``GET /data`` (those the caller's jobs
took, every one for admins; only the jobs the caller may see are named) and ``DELETE
/data/{key}`` (remove one now; refused while a job uses it)."""

from __future__ import annotations

from fastapi import APIRouter, Path

from ...models import API_PREFIX, PreparedData
from .deps import CallerDep, ServicesDep

router = APIRouter(prefix=API_PREFIX)


@router.get("/data", response_model=list[PreparedData])
def prepared_data(services: ServicesDep, user: CallerDep) -> list[PreparedData]:
    # the copies the caller's jobs took; every copy for admins.  A copy may be shared with
    # other users' jobs: only the jobs the caller may see are named
    found = services.supervisor.prepared_data(None if user.admin else user.name)
    if user.admin:
        return found
    return [d.model_copy(update={"jobs": [j for j in d.jobs if services.can_see(j, user)]}) for d in found]


@router.delete("/data/{key}", response_model=PreparedData)
def remove_prepared_data(
    services: ServicesDep, user: CallerDep, key: str = Path(pattern=r"^[0-9a-f]{1,64}$", max_length=64)
) -> PreparedData:
    return services.supervisor.remove_prepared(key, None if user.admin else user.name)
