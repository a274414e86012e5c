"""The caller's algorithm folders (:mod:`..algorithms`): ``GET /algorithms`` (favourites first,
then the folders of the caller's own jobs) and ``POST|DELETE /algorithms/favourites``."""

from __future__ import annotations

from fastapi import APIRouter, Query
from fastapi.responses import Response

from ...errors import NotFound
from ...models import API_PREFIX, Algorithm, FavouriteAlgorithm
from .. import algorithms
from .deps import MAX_TEXT, CallerDep, ServicesDep

router = APIRouter(prefix=API_PREFIX)


@router.get("/algorithms", response_model=list[Algorithm])
def list_algorithms(services: ServicesDep, user: CallerDep) -> list[Algorithm]:
    # the caller's favourites first (oldest first), then the folders of their own jobs
    used = algorithms.used_by(services.store, user.name)
    marked = services.favourites.of(user.name)
    found = [Algorithm(path=p, favourite=True, jobs=used.get(p, 0)) for p in marked]
    found += [Algorithm(path=p, jobs=n) for p, n in used.items() if p not in marked]
    return found


@router.post("/algorithms/favourites", status_code=201, response_model=Algorithm)
def add_favourite(services: ServicesDep, user: CallerDep, body: FavouriteAlgorithm) -> Algorithm:
    path = services.favourites.add(user.name, body.path)
    return Algorithm(
        path=path, favourite=True, jobs=algorithms.used_by(services.store, user.name).get(path, 0)
    )


@router.delete("/algorithms/favourites", status_code=204)
def remove_favourite(
    services: ServicesDep,
    user: CallerDep,
    path: str = Query(max_length=MAX_TEXT, description="The folder to unmark."),
) -> Response:
    if not services.favourites.remove(user.name, path):
        raise NotFound(
            f"{path!r} is not one of your favourite algorithms: `ma-jupyter algorithms` lists them"
        )
    return Response(status_code=204)
