"""The job service's REST API (FastAPI), under ``/api/v1``, every route behind the token.

Routes: ``GET /health``; ``POST /jobs`` (submit), ``POST /plan`` (dry run), ``GET /jobs``
(filter by name substring, status, creator, spec, outputs, algorithm folder, the caller's
favourite algorithms; paged), ``GET /algorithms`` and ``POST|DELETE /algorithms/favourites``
(the caller's algorithm folders and favourites, :mod:`.algorithms`), ``GET|PATCH|DELETE
/jobs/{id}``, ``GET /jobs/{id}/status`` (the job once its status differs from ``since`` or is
terminal, long-poll ``wait``), ``POST /jobs/{id}/stop``, ``GET /jobs/{id}/events``, ``GET /jobs/{id}/logs``
(streams), ``GET /jobs/{id}/logs/read`` (by node and rank from a byte offset, long-poll
``wait``), ``GET /specs``, ``GET /nodes``, ``POST|DELETE /jobs/{id}/tensorboard``; ``GET
/jobs/{id}/export`` and ``POST /export`` (a job, or a spec not submitted, as another platform's
manifests: ``format=k8s``, :mod:`ma_jupyter.export`); ``GET /jobs/{id}/devenv`` (the job as a
notebook that submits it again, :mod:`ma_jupyter.export.notebook`); ``GET
/users/me``, and for admins ``GET|POST /users``, ``DELETE /users/{name}``, ``POST
/users/{name}/token``; ``GET|DELETE /cache`` (the caller's persistent cache; every user's
for admins); ``GET /data``, ``DELETE /data/{key}`` (data preparation's shared copies: those the
caller's jobs took, every one for admins; removal refused while a job uses it).

Errors are the typed errors of :mod:`ma_jupyter.errors` as ``{"error", "message", "field"}``
bodies.  The caller is the user of the request's token (:mod:`.users`); what it may do with a
job is :mod:`.access`'s matrix, applied on every route that names a job and on the listing.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from fastapi import Body, Depends, FastAPI, Header, Path, Query, Request, WebSocket
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import __version__, config, export
from ..commands import parse_command
from ..errors import (
    Conflict,
    Forbidden,
    InvalidSpec,
    MaJupyterError,
    NotFound,
    PayloadTooLarge,
    RefusedFile,
    Unauthorized,
)
from ..export import notebook as devenv_notebook
from ..jobdir import PLACEHOLDER
from ..models import (
    API_PREFIX,
    FORWARDED_USER_HEADER,
    Algorithm,
    CacheInfo,
    ClusterView,
    Event,
    FavouriteAlgorithm,
    Job,
    JobPage,
    JobSort,
    JobSpec,
    JobStatus,
    JobType,
    LogChunk,
    LogStream,
    NewUser,
    Node,
    NodeDrain,
    Plan,
    PreparedData,
    Priority,
    ResourceUsage,
    Spec,
    User,
    UserToken,
    parse_duration,
    parse_spec,
)
from . import access, algorithms, logs, shell
from . import cluster as cluster_view
from .access import Op
from .guard import MAX_BODY, GuardMiddleware
from .supervisor import Supervisor
from .users import Caller, Directory

IDEMPOTENCY_HEADER = "Idempotency-Key"
#: Bounds of every query and path parameter (rule: nothing unbounded reaches SQLite or a file
#: read, so an out-of-range value is a 400 naming the parameter, never a 500): SQLite's
#: INTEGER is 64-bit, and a listing offset past a billion jobs finds nothing anyway.
MAX_OFFSET = 1_000_000_000
MAX_BYTE_OFFSET = 1 << 53
MAX_RANK = 65535
#: a job id, a node name (``worker-0``) or a user name in a path or a query
MAX_ID = 128
MAX_TEXT = 4096
MAX_STATUSES = len(JobStatus)
JobId = Path(max_length=MAX_ID, description="A job id as POST /jobs answered it.")
#: seconds a force-delete answer waits (asynchronously) for the job to stop before answering 202
FORCE_DELETE_WAIT = 10.0
_ERRORS_BY_STATUS = {
    400: InvalidSpec,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
}


#: The request bodies taken as a dict (to answer the typed 400 of :func:`parse_spec`) are
#: published with the schema they are validated against, so a fuzzer's schema-valid body
#: reaches the rules the schema cannot say (cross-field ones), which answer a 400 naming them.
SPEC_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/In_JobSpec"}}},
    }
}
UPDATE_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "priority": {"anyOf": [{"enum": [p.value for p in Priority]}, {"type": "null"}]},
                        "duration": {
                            "anyOf": [
                                {"type": "number", "exclusiveMinimum": 0},
                                {"type": "string", "maxLength": 40},
                                {"type": "null"},
                            ]
                        },
                    },
                }
            }
        },
    }
}


def published_schema(app: FastAPI) -> dict:
    """The OpenAPI document of ``app`` with :class:`JobSpec`'s input schema (as ``In_<Model>``
    components) under the bodies :data:`SPEC_BODY` names; built once per app."""
    if app.openapi_schema is None:
        schema = app.openapi()
        spec = JobSpec.model_json_schema(mode="validation", ref_template="#/components/schemas/In_{model}")
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for name, definition in spec.pop("$defs", {}).items():
            components[f"In_{name}"] = definition
        components["In_JobSpec"] = spec
    return app.openapi_schema


def create_app(supervisor: Supervisor, users: Directory, tensorboards: Any = None) -> FastAPI:
    """The FastAPI app for one service; ``users`` authenticates every request."""
    # The schema is served by a token-checked route below, never by FastAPI's open default.
    app = FastAPI(
        title="ma_jupyter job service", version=__version__, openapi_url=None, docs_url=None, redoc_url=None
    )
    store = supervisor.store
    favourite_store = algorithms.Favourites(store)
    app.add_middleware(GuardMiddleware, max_body=MAX_BODY, home=str(config.home()))

    def authenticate(request: Request) -> Caller:
        # Only the Authorization header: a token in the URL would land in logs and browser
        # history.  Who calls comes from the token alone (a header naming a user is ignored,
        # but the proxy's forwarded user with the proxy token: see users.Directory).
        return users.authenticate(
            request.headers.get("authorization", ""), request.headers.get(FORWARDED_USER_HEADER)
        )

    # An urgent submit or PATCH counts the creator's urgent jobs and then adds one: one at a
    # time, so two at once cannot both pass the cap.
    urgent_lock = threading.Lock()

    def urgent_quota(caller: Caller, creator: str, rules: access.Rules) -> None:
        held = store.count_jobs(creator, access.URGENT_COUNTED, Priority.urgent.rank)
        access.check_urgent_quota(caller, creator, held, rules)

    @app.exception_handler(MaJupyterError)
    async def _typed(_request: Request, exc: MaJupyterError):
        return JSONResponse(status_code=exc.status, content=exc.to_body())

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException):
        cls = _ERRORS_BY_STATUS.get(exc.status_code, MaJupyterError)
        detail = exc.detail if isinstance(exc.detail, str) else f"HTTP {exc.status_code}"
        if exc.status_code == 404:
            detail = "no such route in the job service API (/api/v1/...)"
        body = cls(detail).to_body()
        return JSONResponse(status_code=exc.status_code, content=body, headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _validation(_request: Request, exc: RequestValidationError):
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ())[1:]) or 'request'}: {e.get('msg')}"
            for e in exc.errors()
        )
        fields = {str(e["loc"][1]) for e in exc.errors() if len(e.get("loc", ())) > 1}
        field = fields.pop() if len(fields) == 1 else None
        return JSONResponse(status_code=400, content=InvalidSpec(problems, field=field).to_body())

    api = API_PREFIX
    auth = [Depends(authenticate)]

    @app.get(f"{api}/openapi.json", dependencies=auth, include_in_schema=False)
    def openapi() -> dict:
        return published_schema(app)

    @app.get(f"{api}/health", dependencies=auth)
    def health() -> dict:
        import os

        return {"ok": True, "pid": os.getpid(), "version": __version__, "backend": supervisor.backend.name}

    @app.post(f"{api}/jobs", status_code=201, response_model=Job, openapi_extra=SPEC_BODY)
    def submit(
        body: dict = Body(...),
        user: Caller = Depends(authenticate),
        idempotency_key: str | None = Header(default=None, alias=IDEMPOTENCY_HEADER, max_length=200),
    ) -> Job:
        # access.py's rules 1 to 4, in order; a retried submit (same key, same user) gets the job
        # the first one created, also when the cap was reached since.
        rules = access.load_rules()
        spec = access.new_job_spec(parse_spec(body), user, rules)
        access.check_priority(user, spec.priority)
        if spec.priority is not Priority.urgent or user.admin:
            job = supervisor.submit(spec, creator=user.name, idempotency_key=idempotency_key)
        else:
            with urgent_lock:
                job = supervisor.submit(
                    spec,
                    creator=user.name,
                    idempotency_key=idempotency_key,
                    admit=lambda: urgent_quota(user, user.name, rules),
                )
        return _as_seen(job, user)

    @app.post(f"{api}/plan", response_model=Plan, openapi_extra=SPEC_BODY)
    def plan(body: dict = Body(...), user: Caller = Depends(authenticate)) -> Plan:
        spec = access.new_job_spec(parse_spec(body), user, access.load_rules())
        access.check_priority(user, spec.priority)
        return supervisor.plan(spec)

    def _export(
        spec: JobSpec,
        job_id: str | None,
        chosen: str | None,
        outputs: str,
        fmt: str,
        image: str | None,
        mounts_as: str | None,
    ) -> Response:
        # What the job would be elsewhere, with the spec it ran with (else its first) and the
        # resources a parameter server takes here; nothing is placed, reserved or started.
        media = export.FORMATS.get(export.check_format(fmt))
        scheduler = supervisor.scheduler
        known = {s.name for s in scheduler.cluster.specs}
        flavor = scheduler.cluster.spec(chosen if chosen in known else spec.specs[0])
        text = export.render(
            fmt,
            spec,
            job_id=job_id,
            flavor_of=lambda role: scheduler.task_flavor(flavor, role),
            outputs=outputs,
            image=image,
            mounts_as=mounts_as,
        )
        return Response(text, media_type=media)

    @app.post(f"{api}/export", openapi_extra=SPEC_BODY)
    def export_spec(
        body: dict = Body(...),
        fmt: str = Query(default="k8s", alias="format", max_length=40),
        image: str | None = Query(default=None, max_length=300),
        mounts_as: str | None = Query(default=None, max_length=40),
        user: Caller = Depends(authenticate),
    ) -> Response:
        # the dry run of a submit, exported: the same edge rules as POST /plan (and the secret
        # values shown as ***, as there)
        spec = access.new_job_spec(parse_spec(body), user, access.load_rules()).masked()
        access.check_priority(user, spec.priority)
        if spec.type.value != "batch":
            parse_command(spec.command or "")
        outputs = spec.outputs or str(PLACEHOLDER.outputs)
        return _export(spec, None, None, outputs, fmt, image, mounts_as)

    @app.get(f"{api}/jobs/{{job_id}}/export")
    def export_job(
        job_id: str = JobId,
        fmt: str = Query(default="k8s", alias="format", max_length=40),
        image: str | None = Query(default=None, max_length=300),
        mounts_as: str | None = Query(default=None, max_length=40),
        user: Caller = Depends(authenticate),
    ) -> Response:
        # exporting shows the job's spec, as cloning does: viewing is enough
        job = access.check(store.get(job_id), user, Op.view)
        outputs = job.outputs_folder or config.outputs_folder(job.id, job.spec.outputs)
        return _export(job.spec, job.id, job.chosen_spec, outputs, fmt, image, mounts_as)

    @app.get(f"{api}/jobs/{{job_id}}/devenv")
    def devenv(job_id: str = JobId, user: Caller = Depends(authenticate)) -> dict:
        # the seed's "create a development environment": it shows the job's spec and code, as
        # cloning does, so viewing is enough; the code comes through the backend, never opened here
        job = access.check(store.get(job_id), user, Op.view)
        sources = None
        if devenv_notebook.cell_script(job.spec) and job.spec.algorithm:
            try:
                sources = supervisor.backend.code_sources(job.spec)
            except Exception:  # unreadable code: the notebook runs the job's command instead
                sources = None
        return {
            "name": devenv_notebook.file_name(job),
            "notebook": devenv_notebook.devenv_notebook(job, sources),
        }

    @app.get(f"{api}/jobs", response_model=JobPage)
    def list_jobs(
        name: str | None = Query(default=None, max_length=MAX_ID),
        status: list[JobStatus] = Query(default=[], max_length=MAX_STATUSES),
        creator: str | None = Query(default=None, max_length=MAX_ID),
        spec: str | None = Query(default=None, max_length=MAX_ID),
        outputs: str | None = Query(default=None, max_length=MAX_TEXT),
        algorithm: str | None = Query(
            default=None,
            max_length=MAX_TEXT,
            description="Jobs running this algorithm folder (an absolute path).",
        ),
        favourites: bool = Query(
            default=False, description="Jobs running one of the caller's favourite algorithms."
        ),
        offset: int = Query(default=0, ge=0, le=MAX_OFFSET),
        limit: int = Query(default=50, ge=1, le=500),
        type: JobType | None = Query(default=None),
        sort: JobSort = Query(
            default=JobSort.newest,
            description="Order: a column (created, name, id, status, creator, outputs, priority, mode, "
            "spec, elapsed), '-' first for descending; ties newest first.",
        ),
        user: Caller = Depends(authenticate),
    ) -> JobPage:
        # the store filters what the caller may see, so pages and the total count only those
        items, total = store.list(
            algorithms_in=algorithm_filter(user, algorithm, favourites),
            name=name,
            statuses=[s.value for s in status],
            creator=creator,
            spec=spec,
            outputs=outputs,
            offset=offset,
            limit=limit,
            viewer=None if user.admin else user.name,
            type=type.value if type else None,
            sort=sort.value,
        )
        return JobPage(items=[_as_seen(j, user) for j in items], total=total, offset=offset, limit=limit)

    def algorithm_filter(user: Caller, algorithm: str | None, favourite_only: bool) -> list[str] | None:
        # algorithms.py's rule 2: one folder, the caller's favourites, or the folder if a favourite
        wanted = [algorithms.normalise(algorithm)] if algorithm else None
        if not favourite_only:
            return wanted
        marked = favourite_store.of(user.name)
        return marked if wanted is None else [p for p in wanted if p in marked]

    @app.get(f"{api}/algorithms", response_model=list[Algorithm])
    def list_algorithms(user: Caller = Depends(authenticate)) -> list[Algorithm]:
        # the caller's favourites first (oldest first), then the folders of their own jobs
        used = algorithms.used_by(store, user.name)
        marked = favourite_store.of(user.name)
        found = [Algorithm(path=p, favourite=True, jobs=used.get(p, 0)) for p in marked]
        found += [Algorithm(path=p, jobs=n) for p, n in used.items() if p not in marked]
        return found

    @app.post(f"{api}/algorithms/favourites", status_code=201, response_model=Algorithm)
    def add_favourite(body: FavouriteAlgorithm, user: Caller = Depends(authenticate)) -> Algorithm:
        path = favourite_store.add(user.name, body.path)
        return Algorithm(path=path, favourite=True, jobs=algorithms.used_by(store, user.name).get(path, 0))

    @app.delete(f"{api}/algorithms/favourites", status_code=204)
    def remove_favourite(
        path: str = Query(max_length=MAX_TEXT, description="The folder to unmark."),
        user: Caller = Depends(authenticate),
    ) -> Response:
        if not favourite_store.remove(user.name, path):
            raise NotFound(
                f"{path!r} is not one of your favourite algorithms: `ma-jupyter algorithms` lists them"
            )
        return Response(status_code=204)

    def _as_seen(job: Job, user: Caller, estimate: bool = False) -> Job:
        # what the caller may do with it, and its queue position from the supervisor's queue
        # index: exact, and without reading the queue; the estimated start (one reservation per
        # job ahead) for a single job's read only, never for each row of a listing
        update: dict = {"allowed": [op.value for op in access.allowed(job, user)]}
        if job.status is JobStatus.queued:
            update["queue_position"] = supervisor.queue_position(job.id)
            if estimate:
                update["estimated_start"] = supervisor.estimated_start(job.id)
        return job.model_copy(update=update)

    @app.get(f"{api}/jobs/{{job_id}}", response_model=Job)
    def get_job(job_id: str = JobId, user: Caller = Depends(authenticate)) -> Job:
        return _as_seen(access.check(store.get(job_id), user, Op.view), user, estimate=True)

    @app.patch(f"{api}/jobs/{{job_id}}", response_model=Job, openapi_extra=UPDATE_BODY)
    def update_job(job_id: str = JobId, body: dict = Body(...), user: Caller = Depends(authenticate)) -> Job:
        job = access.check(store.get(job_id), user, Op.view)
        unknown = set(body) - {"priority", "duration"}
        if unknown:
            raise InvalidSpec(f"only priority and duration can change, not {', '.join(sorted(unknown))}")
        try:
            priority = Priority(body["priority"]) if body.get("priority") is not None else None
            duration = parse_duration(body.get("duration"))
        except ValueError as exc:
            raise InvalidSpec(str(exc)) from exc
        if priority is not None:
            access.check(job, user, Op.priority)
            access.check_priority(user, priority)
        if duration is not None:
            access.check(job, user, Op.duration)
        raising = (
            priority is Priority.urgent
            and job.spec.priority is not Priority.urgent
            and job.status is JobStatus.queued
            and not user.admin
        )
        if not raising:
            return _as_seen(
                supervisor.update(job_id, priority=priority, duration=duration, by=user.name), user
            )
        with urgent_lock:
            urgent_quota(user, job.spec.creator or user.name, access.load_rules())
            changed = supervisor.update(job_id, priority=priority, duration=duration, by=user.name)
        return _as_seen(changed, user, estimate=True)

    @app.get(f"{api}/jobs/{{job_id}}/status", response_model=Job)
    async def wait_status(
        job_id: str = JobId,
        since: JobStatus | None = None,
        wait: float = Query(default=0.0, ge=0, le=logs.MAX_WAIT),
        user: Caller = Depends(authenticate),
    ) -> Job:
        # Long-poll: answers once the status differs from ``since`` (without it: once the job is
        # terminal) or after ``wait`` seconds, with the job as GET /jobs/{id} gives it (without
        # the estimated start, which only a job's own read computes).
        await run_in_threadpool(lambda: access.check(store.get(job_id), user, Op.view))
        await store.wait_status(job_id, since, wait)
        return await run_in_threadpool(lambda: _as_seen(access.check(store.get(job_id), user, Op.view), user))

    @app.post(f"{api}/jobs/{{job_id}}/stop", response_model=Job)
    def stop_job(job_id: str = JobId, user: Caller = Depends(authenticate)) -> Job:
        access.check(store.get(job_id), user, Op.stop)
        return _as_seen(supervisor.request_stop(job_id, by=user.name), user, estimate=True)

    @app.websocket(f"{api}/jobs/{{job_id}}/shell")
    async def job_shell(
        websocket: WebSocket,
        job_id: str = JobId,
        node: str | None = Query(default=None, max_length=MAX_ID),
        # 0: the client does not know its size (the node's terminal is then 24 x 80)
        rows: int = Query(default=24, ge=0, le=1000),
        cols: int = Query(default=80, ge=0, le=1000),
        command: str | None = Query(default=None, max_length=MAX_TEXT),
    ) -> None:
        """The debug terminal of one node (shell.py's protocol)."""

        def open_agent():
            user = users.authenticate(
                websocket.headers.get("authorization", ""), websocket.headers.get(FORWARDED_USER_HEADER)
            )
            job = access.check(store.get(job_id), user, Op.shell)
            try:
                argv = shell.parse_argv(command)
            except ValueError as exc:
                raise InvalidSpec(str(exc), field="command") from None
            names = [n.name for n in job.nodes]
            target = node or (names[0] if names else "worker-0")
            if not job.spec.debug_terminal:
                raise Conflict(
                    f"job {job_id} has no debug terminal: submit it with --debug-terminal "
                    "(debug_terminal=True), or clone it with that option"
                )
            # a failed job's nodes may keep their sandboxes for a while: the backend knows
            if job.status not in (JobStatus.running, JobStatus.error):
                raise Conflict(
                    f"job {job_id} is {job.status.value}: a debug terminal is open while the job runs"
                )
            if target not in names:
                raise NotFound(
                    f"job {job_id} has no node {target!r}; its nodes: {', '.join(names)}", field="node"
                )
            conn = supervisor.backend.open_shell(job, target, rows, cols, argv)
            what = "a command" if argv else "a debug terminal"
            store.add_event(
                Event(
                    job_id=job_id,
                    status=job.status,
                    reason=f"{what} opened on {target}",
                    node=target,
                    by=user.name,
                )
            )
            return conn

        await shell.serve(websocket, lambda: run_in_threadpool(open_agent))

    @app.delete(f"{api}/jobs/{{job_id}}", status_code=204)
    async def delete_job(
        job_id: str = JobId, force: bool = False, user: Caller = Depends(authenticate)
    ) -> Response:
        def start() -> bool:
            access.check(store.get(job_id), user, Op.delete)
            return supervisor.delete(job_id, force=force, by=user.name)

        if await run_in_threadpool(start):
            return Response(status_code=204)
        # A live job stops within its grace period (maybe an hour): wait a little without holding
        # a thread, then leave the deletion to the supervisor.
        deadline = time.monotonic() + FORCE_DELETE_WAIT
        while time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            try:
                await run_in_threadpool(store.status, job_id)
            except NotFound:
                return Response(status_code=204)
        return JSONResponse(
            status_code=202,
            content={
                "id": job_id,
                "deleting": True,
                "message": f"job {job_id} is stopping; the service deletes it once it has stopped",
            },
        )

    @app.get(f"{api}/jobs/{{job_id}}/events", response_model=list[Event])
    def events(
        job_id: str = JobId,
        after: int = Query(default=0, ge=0, le=MAX_BYTE_OFFSET),
        user: Caller = Depends(authenticate),
    ) -> list[Event]:
        access.check(store.get(job_id), user, Op.view)
        return store.events(job_id, after=after)

    @app.get(f"{api}/jobs/{{job_id}}/resources", response_model=ResourceUsage)
    def resources(
        job_id: str = JobId,
        since: float | None = Query(default=None, ge=0, le=MAX_BYTE_OFFSET),
        user: Caller = Depends(authenticate),
    ) -> ResourceUsage:
        job = access.check(store.get(job_id), user, Op.view)  # as reading its logs
        return supervisor.resources.report(job, supervisor.scheduler, since)

    @app.get(f"{api}/jobs/{{job_id}}/logs", response_model=list[LogStream])
    def log_streams(job_id: str = JobId, user: Caller = Depends(authenticate)) -> list[LogStream]:
        job = access.check(store.get(job_id), user, Op.view)
        return supervisor.backend.log_streams(job)

    @app.get(f"{api}/jobs/{{job_id}}/logs/read", response_model=LogChunk)
    async def read_log(
        job_id: str = JobId,
        node: str | None = Query(default=None, max_length=MAX_ID),
        rank: int | None = Query(default=None, ge=0, le=MAX_RANK),
        offset: int = Query(default=0, ge=0, le=MAX_BYTE_OFFSET),
        limit: int = Query(default=1 << 20, ge=1, le=8 << 20),
        wait: float = Query(default=0.0, ge=0, le=logs.MAX_WAIT),
        user: Caller = Depends(authenticate),
    ) -> LogChunk:
        backend = supervisor.backend

        def check() -> str:  # on the reading thread (the store and the streams, never in the loop)
            job = access.check(store.get(job_id), user, Op.view)
            chosen = node or logs.default_node(job)
            logs.ensure_stream(job, backend, chosen, rank)
            return chosen

        try:
            return await logs.read_chunk(
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
        except RefusedFile as exc:
            # The job planted something the service will not read: that ends the job.
            await run_in_threadpool(supervisor.fail_job, job_id, exc.message)
            raise

    @app.get(f"{api}/specs", response_model=list[Spec], dependencies=auth)
    def specs() -> list[Spec]:
        return supervisor.scheduler.cluster.specs

    @app.get(f"{api}/nodes", response_model=list[Node])
    def nodes(
        spec: str | None = Query(default=None, max_length=MAX_ID), user: Caller = Depends(authenticate)
    ) -> list[Node]:
        views = supervisor.health.annotate(supervisor.scheduler.node_views(supervisor.usage(), spec=spec))
        return views if user.admin else [_masked(view, user) for view in views]

    def _node_view(name: str) -> Node:
        views = supervisor.health.annotate(supervisor.scheduler.node_views(supervisor.usage()))
        view = next((v for v in views if v.name == name), None)
        if view is None:  # it left the inventory meanwhile (a Ray node)
            raise NotFound(f"no node {name!r} (any more): see `ma-jupyter nodes`")
        return view

    @app.post(f"{api}/nodes/{{name}}/drain", response_model=Node)
    def drain_node(
        name: str = Path(max_length=MAX_ID),
        body: NodeDrain | None = Body(default=None),
        user: Caller = Depends(authenticate),
    ) -> Node:
        # no new placement there; jobs with checkpoint resume are moved away (admins only)
        access.check_node_admin(user, "drain")
        supervisor.drain(name, body.reason if body else None, by=user.name)
        return _node_view(name)

    @app.post(f"{api}/nodes/{{name}}/undrain", response_model=Node)
    def undrain_node(name: str = Path(max_length=MAX_ID), user: Caller = Depends(authenticate)) -> Node:
        access.check_node_admin(user, "undrain")
        supervisor.undrain(name)
        return _node_view(name)

    @app.get(f"{api}/cluster", response_model=ClusterView)
    def cluster(
        spec: list[str] = Query(
            default=[], max_length=MAX_ID, description="Only nodes that fit these specs."
        ),
        model: list[str] = Query(default=[], max_length=MAX_ID, description="Only these board models."),
        user: Caller = Depends(authenticate),
    ) -> ClusterView:
        def visible(job_id: str) -> Job | None:
            try:
                job = store.get(job_id)
            except NotFound:
                return None
            return job if access.can_see(job, user) else None

        queued = cluster_view.queued_jobs(supervisor.queue.ids(), store.get)
        return cluster_view.view(supervisor.scheduler, supervisor.usage(), queued, visible, spec, model)

    def _masked(node: Node, user: Caller) -> Node:
        def seen(job_id: str) -> bool:
            try:
                return access.can_see(store.get(job_id), user)
            except NotFound:
                return False

        return cluster_view.masked(node, seen)

    @app.post(f"{api}/jobs/{{job_id}}/tensorboard")
    def start_tensorboard(job_id: str = JobId, user: Caller = Depends(authenticate)) -> dict:
        job = access.check(store.get(job_id), user, Op.tensorboard)
        if tensorboards is None:
            raise InvalidSpec("TensorBoard is not available in this service")
        # the backend starts it confined to the job's outputs, as the job's account
        return {"url": tensorboards.start(job)}

    @app.delete(f"{api}/jobs/{{job_id}}/tensorboard", status_code=204)
    def stop_tensorboard(job_id: str = JobId, user: Caller = Depends(authenticate)) -> Response:
        access.check(store.get(job_id), user, Op.tensorboard)
        if tensorboards is not None:
            tensorboards.stop(job_id)
        return Response(status_code=204)

    # ------------------------------------------------------------------------- caches

    @app.get(f"{api}/cache", response_model=list[CacheInfo])
    def cache(all: bool = False, user: Caller = Depends(authenticate)) -> list[CacheInfo]:
        # the size of the caller's cache; every user's for admins
        if all and not user.admin:
            raise Forbidden("only admins may see every user's cache; drop --all to see your own")
        return supervisor.backend.caches(user.name, every_user=all)

    @app.delete(f"{api}/cache", response_model=CacheInfo)
    def clear_cache(user: Caller = Depends(authenticate)) -> CacheInfo:
        return supervisor.clear_cache(user.name)

    # ------------------------------------------------------------------ prepared data

    @app.get(f"{api}/data", response_model=list[PreparedData])
    def prepared_data(user: Caller = Depends(authenticate)) -> list[PreparedData]:
        # the copies the caller's jobs took; every copy for admins.  A copy may be shared with
        # other users' jobs: only the jobs the caller may see are named
        found = supervisor.prepared_data(None if user.admin else user.name)
        if user.admin:
            return found
        return [d.model_copy(update={"jobs": [j for j in d.jobs if _visible(j, user)]}) for d in found]

    def _visible(job_id: str, user: Caller) -> bool:
        try:
            return access.can_see(store.get(job_id), user)
        except NotFound:
            return False

    @app.delete(f"{api}/data/{{key}}", response_model=PreparedData)
    def remove_prepared_data(
        key: str = Path(pattern=r"^[0-9a-f]{1,64}$", max_length=64), user: Caller = Depends(authenticate)
    ) -> PreparedData:
        return supervisor.remove_prepared(key, None if user.admin else user.name)

    # ------------------------------------------------------------------------- users

    @app.get(f"{api}/users/me", response_model=User)
    def whoami(user: Caller = Depends(authenticate)) -> User:
        return store.user(user.name)

    @app.get(f"{api}/users", response_model=list[User])
    def list_users(user: Caller = Depends(authenticate)) -> list[User]:
        return users.list(user)

    @app.post(f"{api}/users", status_code=201, response_model=UserToken)
    def add_user(body: NewUser, user: Caller = Depends(authenticate)) -> UserToken:
        return users.add(user, body.name, body.admin)

    @app.post(f"{api}/users/{{name}}/token", response_model=UserToken)
    def new_token(name: str = Path(max_length=MAX_ID), user: Caller = Depends(authenticate)) -> UserToken:
        return users.new_token(user, name)

    @app.delete(f"{api}/users/{{name}}", status_code=204)
    def remove_user(name: str = Path(max_length=MAX_ID), user: Caller = Depends(authenticate)) -> Response:
        users.remove(user, name)
        return Response(status_code=204)

    return app
