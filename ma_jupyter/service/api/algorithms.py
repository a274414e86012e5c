"""The caller's algorithm folders (:mod:`..algorithms`): ``GET /algorithms`` (favourites first,
then the folders of the caller's own jobs, each with the versions its jobs ran) and
``POST|DELETE /algorithms/favourites``."""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi import APIRouter, Query
from fastapi.responses import Response

from ...errors import NotFound
from ...models import API_PREFIX, Algorithm, AlgorithmVersion, FavouriteAlgorithm
from .. import algorithms
from .deps import MAX_TEXT, CallerDep, ServicesDep

router = APIRouter(prefix=API_PREFIX)


@router.get("/algorithms", response_model=list[Algorithm])
def list_algorithms(services: ServicesDep, user: CallerDep) -> list[Algorithm]:
    # the caller's favourites first (oldest first), then the folders of their own jobs
    used = algorithms.used_by(services.store, user.name)
    marked = services.favourites.of(user.name)
    found = [_algorithm(p, used.get(p, []), favourite=True) for p in marked]
    found += [_algorithm(p, versions) for p, versions in used.items() if p not in marked]
    return found


def _algorithm(path: str, versions: list[algorithms.Version], favourite: bool = False) -> Algorithm:
    return Algorithm(
        path=path,
        favourite=favourite,
        jobs=algorithms.jobs_of(versions),
        versions=[
            AlgorithmVersion(digest=v.digest, jobs=v.jobs, last_used=datetime.fromtimestamp(v.last_used, UTC))
            for v in versions
        ],
    )


@router.post("/algorithms/favourites", status_code=201, response_model=Algorithm)
def add_favourite(services: ServicesDep, user: CallerDep, body: FavouriteAlgorithm) -> Algorithm:
    path = services.favourites.add(user.name, body.path)
    return _algorithm(path, algorithms.used_by(services.store, user.name).get(path, []), favourite=True)


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
