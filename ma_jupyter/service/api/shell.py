"""A node's debug terminal: the websocket ``/jobs/{id}/shell`` (:mod:`..shell`'s protocol),
opened through the backend for a job submitted with a debug terminal while it runs.

The checks read the store on the shared pool; the connection into the node runs on the pool of
its own (:meth:`..sessions.SessionCaps.in_node_pool`, with its timeout), once the terminal is
admitted under ``[limits] max_shells_per_job`` and ``max_shells_per_user`` (counted until it ends)."""

from __future__ import annotations

from fastapi import APIRouter, Query, WebSocket
from starlette.concurrency import run_in_threadpool

from ...errors import Conflict, InvalidSpec, NotFound
from ...models import API_PREFIX, FORWARDED_USER_HEADER, Event, JobStatus
from .. import access, shell
from ..access import Op
from .deps import MAX_ID, MAX_TEXT, JobId, ServicesDep

router = APIRouter(prefix=API_PREFIX)


@router.websocket("/jobs/{job_id}/shell")
async def job_shell(
    websocket: WebSocket,
    services: ServicesDep,
    job_id: str = JobId,
    node: str | None = Query(default=None, max_length=MAX_ID),
    # 0: the client does not know its size (the node's terminal is then 24 x 80)
    rows: int = Query(default=24, ge=0, le=1000),
    cols: int = Query(default=80, ge=0, le=1000),
    command: str | None = Query(default=None, max_length=MAX_TEXT),
) -> None:
    """The debug terminal of one node (shell.py's protocol)."""
    store = services.store

    def check():
        # authenticated here, not as a dependency: shell.serve answers a refusal on the socket
        user = services.users.authenticate(
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
            raise Conflict(f"job {job_id} is {job.status.value}: a debug terminal is open while the job runs")
        if target not in names:
            raise NotFound(
                f"job {job_id} has no node {target!r}; its nodes: {', '.join(names)}", field="node"
            )
        return user, job, argv, target

    async def open_agent():
        user, job, argv, target = await run_in_threadpool(check)
        release = services.sessions.admit("shell", job_id, user.name)
        try:
            conn = await services.sessions.in_node_pool(
                lambda: services.backend.open_shell(job, target, rows, cols, argv)
            )
        except BaseException:
            release()
            raise
        what = "a command" if argv else "a debug terminal"
        event = Event(
            job_id=job_id, status=job.status, reason=f"{what} opened on {target}", node=target, by=user.name
        )
        try:
            await run_in_threadpool(store.add_event, event)
        except BaseException:
            conn.close()
            release()
            raise
        return conn, release

    await shell.serve(websocket, open_agent)
