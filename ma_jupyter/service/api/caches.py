"""The users' persistent caches (``~/.cache`` in their jobs): ``GET /cache`` (the caller's size;
every user's for admins with ``all``) and ``DELETE /cache`` (empty the caller's)."""

from __future__ import annotations

from fastapi import APIRouter

from ...errors import Forbidden
from ...models import API_PREFIX, CacheInfo
from .deps import CallerDep, ServicesDep

router = APIRouter(prefix=API_PREFIX)


@router.get("/cache", response_model=list[CacheInfo])
def cache(services: ServicesDep, user: CallerDep, all: bool = False) -> list[CacheInfo]:
    # the size of the caller's cache; every user's for admins
    if all and not user.admin:
        raise Forbidden("only admins may see every user's cache; drop --all to see your own")
    return services.backend.caches(user.name, every_user=all)


@router.delete("/cache", response_model=CacheInfo)
def clear_cache(services: ServicesDep, user: CallerDep) -> CacheInfo:
    return services.supervisor.clear_cache(user.name)
