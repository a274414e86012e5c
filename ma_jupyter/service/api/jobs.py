"""Jobs: ``POST /jobs`` (submit), ``POST /plan`` (dry run), ``GET /jobs`` (filter by name
substring, status, creator, spec, outputs, algorithm folder or content, the caller's favourite
algorithms; paged), ``GET|PATCH|DELETE /jobs/{id}``, ``GET /jobs/{id}/status`` (the job once its status
differs from ``since`` or is terminal, long-poll ``wait``), ``POST /jobs/{id}/stop``, ``GET
/jobs/{id}/events``, ``GET /jobs/{id}/resources``, ``POST /jobs/{id}/devenv`` (a dev environment
of one of the job's nodes: :mod:`..devenv`), ``POST /jobs/{id}/kernel`` (how to reach a running dev
environment's kernel).

Every job the caller gets is :func:`as_seen`: with what the caller may do with it and, while
queued, its queue position.  What the caller may do is :mod:`..access`'s matrix.  The listing
gives each job's :class:`~ma_jupyter.models.JobSummary` (bounded whatever its spec holds);
``GET /jobs/{id}`` the whole job.
"""

from __future__ import annotations

import asyncio
import threading
import time

from fastapi import APIRouter, Body, Header, Query
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from ...errors import Conflict, InvalidSpec, LimitReached, NotFound, PayloadTooLarge
from ...models import (
    API_PREFIX,
    Event,
    Job,
    JobPage,
    JobSort,
    JobSpec,
    JobStatus,
    JobSummary,
    JobType,
    KernelRoute,
    Plan,
    Priority,
    ResourceUsage,
    parse_duration,
    parse_spec,
)
from .. import access, algorithms, devenv
from ..access import Op
from ..logs import MAX_WAIT
from ..sessions import check_count
from ..users import Caller
from .deps import (
    IDEMPOTENCY_HEADER,
    MAX_BYTE_OFFSET,
    MAX_ID,
    MAX_OFFSET,
    MAX_STATUSES,
    MAX_TEXT,
    CallerDep,
    JobId,
    Services,
    ServicesDep,
)
from .schema import SPEC_BODY, UPDATE_BODY

router = APIRouter(prefix=API_PREFIX)

#: the statuses of a job not ended (a dev environment in one counts against its caps)
LIVE = tuple(s for s in JobStatus if not s.is_terminal())
#: seconds a force-delete answer waits (asynchronously) for the job to stop before answering 202
FORCE_DELETE_WAIT = 10.0


def as_seen(services: Services, job: Job, user: Caller, estimate: bool = False) -> Job:
    """``job`` as ``user`` gets it: what the caller may do with it, and its queue position from
    the supervisor's queue index (exact, and without reading the queue); the estimated start
    (one reservation per job ahead) only with ``estimate``: a single job's read, never each row
    of a listing."""
    update: dict = {"allowed": [op.value for op in access.allowed(job, user)]}
    if job.status is JobStatus.queued:
        update["queue_position"] = services.supervisor.queue_position(job.id)
        if estimate:
            update["estimated_start"] = services.supervisor.estimated_start(job.id)
    return job.model_copy(update=update)


def _urgent_quota(services: Services, caller: Caller, creator: str, rules: access.Rules) -> None:
    """The creator's urgent jobs counted against the cap; called under ``services.urgent_lock``."""
    held = services.store.count_jobs(creator, access.URGENT_COUNTED, Priority.urgent.rank)
    access.check_urgent_quota(caller, creator, held, rules)


@router.post("/jobs", status_code=201, response_model=Job, openapi_extra=SPEC_BODY)
def submit(
    services: ServicesDep,
    user: CallerDep,
    body: dict = Body(...),
    idempotency_key: str | None = Header(default=None, alias=IDEMPOTENCY_HEADER, max_length=200),
) -> Job:
    spec = parse_spec(body)
    if spec.devenv_of is not None:
        raise InvalidSpec(
            "devenv_of is set by the service: create a dev environment with POST /jobs/{id}/devenv "
            "(ma-jupyter devenv JOB --kernel)",
            field="devenv_of",
        )
    return _submit(services, user, spec, idempotency_key)


def _submit(services: Services, user: Caller, spec: JobSpec, idempotency_key: str | None) -> Job:
    # access.py's rules 1, 2, 4 and 5, in order (rule 3 comes with the preflight, after the
    # mount rules); a retried submit (same key, same user) gets the job the first one created,
    # also when the cap was reached since.  Then the per-user bounds (_check_spec_bytes,
    # _queued_quota): counted and the job added under the user's own lock, so two submits at
    # once cannot both pass, while other users' submits never wait for it.
    rules = access.load_rules()
    spec = access.new_job_spec(spec, user, rules)
    access.check_priority(user, spec.priority)
    spec = services.images.resolve(spec, services.scheduler.cluster)  # a registered image's rules
    limits = services.scheduler.cluster.limits
    _check_spec_bytes(spec, limits.max_spec_bytes)
    supervisor = services.supervisor

    def admit() -> None:
        _queued_quota(services, user.name, limits.max_queued_jobs_per_user)
        if spec.priority is Priority.urgent and not user.admin:
            _urgent_quota(services, user, user.name, rules)

    with _submit_lock(user.name):
        if spec.priority is not Priority.urgent or user.admin:
            job = supervisor.submit(spec, creator=user.name, idempotency_key=idempotency_key, admit=admit)
        else:
            with services.urgent_lock:
                job = supervisor.submit(spec, creator=user.name, idempotency_key=idempotency_key, admit=admit)
    return as_seen(services, job, user)


_SUBMIT_LOCKS: dict[str, threading.Lock] = {}
_SUBMIT_LOCKS_GUARD = threading.Lock()


def _submit_lock(user: str) -> threading.Lock:
    """The lock one user's submits count and add their jobs under (one per user name)."""
    with _SUBMIT_LOCKS_GUARD:
        return _SUBMIT_LOCKS.setdefault(user, threading.Lock())


def _check_spec_bytes(spec: JobSpec, cap: int) -> None:
    """A spec larger than ``[limits] max_spec_bytes`` as stored is refused (413)."""
    size = len(spec.model_dump_json().encode())
    if size > cap:
        raise PayloadTooLarge(
            f"the job's spec is {size} bytes, over [limits] max_spec_bytes of {cap}: keep large values "
            "(variables, commands) in files of the algorithm folder or a dataset, and pass their paths",
            field="max_spec_bytes",
        )


def _queued_quota(services: Services, creator: str, cap: int) -> None:
    """The creator's queued jobs counted against ``[limits] max_queued_jobs_per_user`` (429)."""
    queued = services.store.count_jobs(creator, [JobStatus.queued], priority=None)  # one query, every rank
    if queued >= cap:
        raise LimitReached(
            f"{creator} has {queued} queued jobs, and [limits] max_queued_jobs_per_user is {cap}: wait "
            "until some start, or stop queued ones (ma-jupyter jobs --status queued; ma-jupyter stop JOB)",
            field="max_queued_jobs_per_user",
        )


@router.post("/jobs/{job_id}/devenv", status_code=201, response_model=Job)
def create_devenv(
    services: ServicesDep,
    user: CallerDep,
    job_id: str = JobId,
    body: dict = Body(default={}),
    idempotency_key: str | None = Header(default=None, alias=IDEMPOTENCY_HEADER, max_length=200),
) -> Job:
    """A dev environment of the job's node ``{"node": "worker-1"}`` (or ``1``; default its
    first): a job of the caller's own, see :mod:`..devenv` for what it is made of."""
    job = access.check(services.store.get(job_id), user, Op.view)
    devenv.check_may_create(job, user)
    node = body.get("node") if isinstance(body, dict) else None
    if node is not None and not isinstance(node, (str, int)) or isinstance(node, bool):
        raise InvalidSpec("node: a node name (worker-1) or index (1)", field="node")
    name = devenv.pick_node(job.spec, node)
    secrets = services.store.secrets(job.id)
    storage_secrets = services.store.storage_secrets(job.id)
    # the source's own plan gives the node's variables (its secrets as the launch has them; its
    # stored spec has both kinds masked, which a plan refuses)
    plan = services.supervisor.plan(
        job.spec.model_copy(update={"secret_env": secrets, "storage_credentials": storage_secrets})
    )
    variables = devenv.node_variables(plan, job.spec, name)
    spec = devenv.devenv_spec(job, name, variables, secrets, storage_secrets)
    # [limits] max_devenvs_per_job and max_devenvs_per_user, over the dev environments not ended
    with services.sessions.serial("devenv", user.name):
        # a retry (the supervisor's key: the creator's name, NUL, the client's key) makes no new one
        if idempotency_key and services.store.job_for_key(f"{user.name}\0{idempotency_key}"):
            return _submit(services, user, spec, idempotency_key)
        live = [j for j in services.store.by_status(*LIVE) if j.spec.devenv_of is not None]
        limits = services.scheduler.cluster.limits
        of_job = sum(1 for j in live if j.spec.devenv_of.job_id == job.id)
        check_count("devenv", "job", of_job, limits, f"job {job.id}")
        of_user = sum(1 for j in live if j.spec.creator == user.name)
        check_count("devenv", "user", of_user, limits, f"user {user.name}")
        return _submit(services, user, spec, idempotency_key)


@router.post("/jobs/{job_id}/kernel", response_model=KernelRoute)
def kernel_route(services: ServicesDep, user: CallerDep, job_id: str = JobId) -> KernelRoute:
    """How the caller's kernel bridge reaches the kernel of the running dev environment
    ``job_id``: its kernel folder here, or the relay on the Ray node that runs it, with that
    relay's secret (see the backend's ``kernel_route``).  Only the dev environment's owner or an
    admin may (as for a debug terminal: the kernel runs with the job's secret variables)."""
    job = access.check(services.store.get(job_id), user, Op.shell)
    if job.spec.devenv_of is None:
        raise Conflict(
            f"job {job_id} is no dev environment: start one with `ma-jupyter devenv {job_id} --kernel`"
        )
    if job.status is not JobStatus.running:
        raise Conflict(f"dev environment {job_id} is {job.status.value}: its kernel is reached while it runs")
    node = job.nodes[0].name if job.nodes else "worker-0"
    return services.backend.kernel_route(job, node)


@router.post("/plan", response_model=Plan, openapi_extra=SPEC_BODY)
def plan(services: ServicesDep, user: CallerDep, body: dict = Body(...)) -> Plan:
    spec = access.new_job_spec(parse_spec(body), user, access.load_rules())
    access.check_priority(user, spec.priority)
    plan = services.supervisor.plan(services.images.resolve(spec, services.scheduler.cluster))
    if spec.image.name:  # what the registered image stood for, checked
        plan.notes.append(services.images.describe(spec.image.name))
    return plan


@router.get("/jobs", response_model=JobPage)
def list_jobs(
    services: ServicesDep,
    user: CallerDep,
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
    algorithm_digest: str | None = Query(
        default=None,
        max_length=MAX_TEXT,
        description="Also the jobs that ran this content (sha256:...; with algorithm: that "
        "folder's current content as the caller read it), said back in the page.",
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
) -> JobPage:
    # the store filters what the caller may see, so pages and the total count only those
    if algorithm_digest is not None:
        algorithms.check_digest(algorithm_digest)
    filters = dict(
        algorithms_in=_algorithm_filter(services, user, algorithm, algorithm_digest, favourites),
        name=name,
        statuses=[s.value for s in status],
        creator=creator,
        spec=spec,
        outputs=outputs,
        viewer=None if user.admin else user.name,
        type=type.value if type else None,
        sort=sort.value,
    )
    # Each job as its summary (no variables, mounts or commands: the answer is bounded per job),
    # made as the store reads the page's rows one at a time: a large page never holds every
    # whole spec at once, and the page costs one query and one count (a query per slice of it
    # and a count with each had taken most of a listing's time).
    summaries, total = services.store.list(
        offset=offset, limit=limit, each=lambda job: JobSummary.of(as_seen(services, job, user)), **filters
    )
    return JobPage(
        items=summaries,
        total=total,
        offset=offset,
        limit=limit,
        algorithm_digest=algorithm_digest,
    )


def _algorithm_filter(
    services: Services, user: Caller, algorithm: str | None, digest: str | None, favourite_only: bool
) -> list[str] | None:
    # algorithms.py's rule 2: one folder, the caller's favourites, or the folder if a favourite;
    # rule 6: and the jobs of the content (of the folder, when the folder is searched)
    wanted = [algorithms.normalise(algorithm)] if algorithm else None
    if favourite_only:
        marked = services.favourites.of(user.name)
        wanted = marked if wanted is None else [p for p in wanted if p in marked]
    if digest is not None and (wanted is None or (algorithm and wanted)):
        wanted = [*(wanted or []), digest]
    return wanted


@router.get("/jobs/{job_id}", response_model=Job)
def get_job(services: ServicesDep, user: CallerDep, job_id: str = JobId) -> Job:
    return as_seen(services, access.check(services.store.get(job_id), user, Op.view), user, estimate=True)


@router.patch("/jobs/{job_id}", response_model=Job, openapi_extra=UPDATE_BODY)
def update_job(services: ServicesDep, user: CallerDep, job_id: str = JobId, body: dict = Body(...)) -> Job:
    supervisor = services.supervisor
    job = access.check(services.store.get(job_id), user, Op.view)
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
        changed = supervisor.update(job_id, priority=priority, duration=duration, by=user.name)
        return as_seen(services, changed, user)
    with services.urgent_lock:
        _urgent_quota(services, user, job.spec.creator or user.name, access.load_rules())
        changed = supervisor.update(job_id, priority=priority, duration=duration, by=user.name)
    return as_seen(services, changed, user, estimate=True)


@router.get("/jobs/{job_id}/status", response_model=Job)
async def wait_status(
    services: ServicesDep,
    user: CallerDep,
    job_id: str = JobId,
    since: JobStatus | None = None,
    wait: float = Query(default=0.0, ge=0, le=MAX_WAIT),
) -> Job:
    # Long-poll: answers once the status differs from ``since`` (without it: once the job is
    # terminal) or after ``wait`` seconds, with the job as GET /jobs/{id} gives it (without
    # the estimated start, which only a job's own read computes).
    store = services.store
    await run_in_threadpool(lambda: access.check(store.get(job_id), user, Op.view))
    await store.wait_status(job_id, since, wait)
    return await run_in_threadpool(
        lambda: as_seen(services, access.check(store.get(job_id), user, Op.view), user)
    )


@router.post("/jobs/{job_id}/stop", response_model=Job)
def stop_job(services: ServicesDep, user: CallerDep, job_id: str = JobId) -> Job:
    access.check(services.store.get(job_id), user, Op.stop)
    return as_seen(services, services.supervisor.request_stop(job_id, by=user.name), user, estimate=True)


@router.delete("/jobs/{job_id}", status_code=204)
async def delete_job(
    services: ServicesDep, user: CallerDep, job_id: str = JobId, force: bool = False
) -> Response:
    store = services.store

    def start() -> bool:
        access.check(store.get(job_id), user, Op.delete)
        return services.supervisor.delete(job_id, force=force, by=user.name)

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


@router.get("/jobs/{job_id}/events", response_model=list[Event])
def events(
    services: ServicesDep,
    user: CallerDep,
    job_id: str = JobId,
    after: int = Query(default=0, ge=0, le=MAX_BYTE_OFFSET),
) -> list[Event]:
    access.check(services.store.get(job_id), user, Op.view)
    return services.store.events(job_id, after=after)


@router.get("/jobs/{job_id}/resources", response_model=ResourceUsage)
def resources(
    services: ServicesDep,
    user: CallerDep,
    job_id: str = JobId,
    since: float | None = Query(default=None, ge=0, le=MAX_BYTE_OFFSET),
) -> ResourceUsage:
    job = access.check(services.store.get(job_id), user, Op.view)  # as reading its logs
    return services.resources.report(job, services.scheduler, since)
