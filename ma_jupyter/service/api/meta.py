"""The service itself: ``GET /health`` (alive, pid, version, backend) and ``GET /openapi.json``
(the published schema, :mod:`.schema`); both behind the token, as every route."""

from __future__ import annotations

import os

from fastapi import APIRouter, Request

from ... import __version__
from ...models import API_PREFIX
from .deps import AUTH, ServicesDep
from .schema import published_schema

router = APIRouter(prefix=API_PREFIX)


# FastAPI's own (open) schema and docs routes are off: this one checks the token.
@router.get("/openapi.json", dependencies=AUTH, include_in_schema=False)
def openapi(request: Request) -> dict:
    return published_schema(request.app)


@router.get("/health", dependencies=AUTH)
def health(services: ServicesDep) -> dict:
    return {"ok": True, "pid": os.getpid(), "version": __version__, "backend": services.backend.name}
