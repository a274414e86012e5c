"""The job service's web app (FastAPI): the routers of :mod:`.api` over one bundle of services.

Every route is under ``/api/v1`` and behind the token; :mod:`.api` says which module serves
which route.  Errors are the typed errors of :mod:`ma_jupyter.errors` as ``{"error", "message",
"field"}`` bodies, FastAPI's own (an unknown route, a bad parameter) included.  The caller is the
user of the request's token (:mod:`.users`); what it may do with a job is :mod:`.access`'s
matrix, applied on every route that names a job and on the listing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import __version__, config
from ..errors import Conflict, Forbidden, InvalidSpec, MaJupyterError, NotFound, PayloadTooLarge, Unauthorized
from .api import ROUTERS
from .api.deps import Services
from .guard import MAX_BODY, GuardMiddleware
from .tensorboard import TensorBoardManager
from .users import Directory

if TYPE_CHECKING:
    from .supervisor import Supervisor

_ERRORS_BY_STATUS = {
    400: InvalidSpec,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
}


def create_app(
    supervisor: Supervisor, users: Directory, tensorboards: TensorBoardManager | None = None
) -> FastAPI:
    """The FastAPI app for one service; ``users`` authenticates every request, ``tensorboards``
    serves the jobs' TensorBoards (None: not available)."""
    # The schema is served by a token-checked route (.api.meta), never by FastAPI's open default.
    app = FastAPI(
        title="ma_jupyter job service", version=__version__, openapi_url=None, docs_url=None, redoc_url=None
    )
    app.state.services = Services.of(supervisor, users, tensorboards)
    app.add_middleware(GuardMiddleware, max_body=MAX_BODY, home=str(config.home()))
    app.add_exception_handler(MaJupyterError, _typed)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(RequestValidationError, _validation)
    for router in ROUTERS:
        app.include_router(router)
    return app


async def _typed(_request: Request, exc: MaJupyterError) -> JSONResponse:
    return JSONResponse(status_code=exc.status, content=exc.to_body())


async def _http(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
    cls = _ERRORS_BY_STATUS.get(exc.status_code, MaJupyterError)
    detail = exc.detail if isinstance(exc.detail, str) else f"HTTP {exc.status_code}"
    if exc.status_code == 404:
        detail = "no such route in the job service API (/api/v1/...)"
    body = cls(detail).to_body()
    return JSONResponse(status_code=exc.status_code, content=body, headers=getattr(exc, "headers", None))


async def _validation(_request: Request, exc: RequestValidationError) -> JSONResponse:
    problems = "; ".join(
        f"{'.'.join(str(p) for p in e.get('loc', ())[1:]) or 'request'}: {e.get('msg')}" for e in exc.errors()
    )
    fields = {str(e["loc"][1]) for e in exc.errors() if len(e.get("loc", ())) > 1}
    field = fields.pop() if len(fields) == 1 else None
    return JSONResponse(status_code=400, content=InvalidSpec(problems, field=field).to_body())
