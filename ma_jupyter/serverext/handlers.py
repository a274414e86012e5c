"""Tornado handlers under ``<base_url>/ma-jupyter/api`` that forward to the job service.

Every handler is a Jupyter ``APIHandler`` guarded by ``@tornado.web.authenticated`` (403
without Jupyter's token or cookie) and answers with the JSON of the wire model, exactly what
the job service's REST API returns.  The calls go through :class:`ma_jupyter.client.Client`
(which starts the service on first use); they block, so they run on a thread pool and never on
the IOLoop, which matters most for the log long-poll (``wait`` seconds).

Routes (``{id}`` is a job id)::

    GET    service                       service status (running, url, pid, home)
    GET    jobs?name&status&creator&spec&outputs&offset&limit   -> JobPage
    POST   jobs          (JobSpec)       -> 201 Job
    POST   plan          (JobSpec)       -> Plan
    GET    jobs/{id}                     -> Job
    PATCH  jobs/{id}     {priority|duration} -> Job
    DELETE jobs/{id}?force=true          -> 204
    POST   jobs/{id}/stop                -> Job
    GET    jobs/{id}/events?after        -> [Event]
    GET    jobs/{id}/logs                -> [LogStream]
    GET    jobs/{id}/logs/read?node&rank&offset&limit&wait -> LogChunk
    POST   jobs/{id}/tensorboard         -> {"url", "direct_url"} (url: the proxy below)
    DELETE jobs/{id}/tensorboard         -> 204
    GET    specs                         -> [Spec]
    GET    nodes?spec                    -> [Node]

and, outside ``api``, ``<base_url>/ma-jupyter/tensorboard/{id}/...``: the job's TensorBoard
through Jupyter's authentication, so it opens wherever JupyterLab does (TensorBoard itself
listens on loopback only).

A typed error of :mod:`ma_jupyter.errors` becomes its HTTP status with the body
``{"error", "message", "field"}``, the same body the job service sends.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar
from urllib.parse import quote

import tornado.web
from jupyter_server.base.handlers import APIHandler, JupyterHandler
from jupyter_server.utils import url_path_join
from pydantic import BaseModel
from tornado.httpclient import AsyncHTTPClient, HTTPRequest

from ..client import Client
from ..errors import BackendUnavailable, InvalidSpec, MaJupyterError
from ..models import JobStatus
from . import NAMESPACE

T = TypeVar("T")

MAX_WAIT = 30.0  # seconds a browser's log long-poll may hold a worker thread
# Long-polls hold a thread each for up to MAX_WAIT: enough workers that a few open job views
# never starve the short calls.
_EXECUTOR = ThreadPoolExecutor(max_workers=16, thread_name_prefix="ma-jupyter-serverext")
_LOCAL = threading.local()
_STATUSES = [s.value for s in JobStatus]


def _client() -> Client:
    """This worker thread's client (a ``requests`` session is not meant to be shared by threads)."""
    client = getattr(_LOCAL, "client", None)
    if client is None:
        client = _LOCAL.client = Client()
    return client


def _jsonable(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


class ServiceHandler(APIHandler):
    """Base: run a client call off the IOLoop and answer with its JSON or its typed error."""

    async def call(self, fn: Callable[[Client], T], status: int = 200) -> None:
        """Run ``fn(client)`` on the thread pool and write its result as JSON.

        Args:
            fn: the client call; it returns a model, a list of models, a dict or None.
            status: the HTTP status of a success (204 when ``fn`` returns None).
        """
        loop = asyncio.get_running_loop()
        try:
            result = await loop.run_in_executor(_EXECUTOR, lambda: fn(_client()))
        except MaJupyterError as exc:
            self.set_status(exc.status)
            self.finish(json.dumps(exc.to_body()))
            return
        if result is None:
            self.set_status(204)
            self.finish()
            return
        self.set_status(status)
        self.finish(json.dumps(_jsonable(result)))

    def body(self) -> Any:
        """The request's JSON body.

        Raises:
            InvalidSpec: the body is not JSON.
        """
        try:
            return json.loads(self.request.body or b"null")
        except ValueError as exc:
            raise InvalidSpec(f"the request body is not JSON ({exc}): send the job as a JSON object") from exc

    def arg_int(self, name: str, default: int | None = None) -> int | None:
        """An integer query argument, or ``default`` when absent.

        Raises:
            InvalidSpec: the argument is not an integer.
        """
        raw = self.get_argument(name, None)
        if raw is None or raw == "":
            return default
        try:
            return int(raw)
        except ValueError as exc:
            raise InvalidSpec(f"{name} must be an integer, not {raw!r}", field=name) from exc

    def arg_float(self, name: str, default: float = 0.0) -> float:
        """A float query argument, or ``default`` when absent.

        Raises:
            InvalidSpec: the argument is not a number.
        """
        raw = self.get_argument(name, None)
        if raw is None or raw == "":
            return default
        try:
            return float(raw)
        except ValueError as exc:
            raise InvalidSpec(f"{name} must be a number of seconds, not {raw!r}", field=name) from exc

    def write_typed_error(self, exc: MaJupyterError) -> None:
        """Answer with ``exc``'s status and JSON body (for errors found before the call)."""
        self.set_status(exc.status)
        self.finish(json.dumps(exc.to_body()))


class ServiceStatusHandler(ServiceHandler):
    """``GET service``: whether a job service runs for this home (starts none)."""

    @tornado.web.authenticated
    async def get(self) -> None:
        await self.call(lambda c: c.service_status())


class JobsHandler(ServiceHandler):
    """``GET jobs`` (filtered page) and ``POST jobs`` (submit a JobSpec)."""

    @tornado.web.authenticated
    async def get(self) -> None:
        statuses = [s for s in self.get_arguments("status") if s]
        try:
            offset = self.arg_int("offset", 0) or 0
            limit = self.arg_int("limit", 50) or 50
            unknown = [s for s in statuses if s not in _STATUSES]
            if unknown:
                raise InvalidSpec(
                    f"unknown status {unknown[0]!r}: use one of {', '.join(_STATUSES)}", field="status"
                )
        except MaJupyterError as exc:
            self.write_typed_error(exc)
            return
        name = self.get_argument("name", None) or None
        creator = self.get_argument("creator", None) or None
        spec = self.get_argument("spec", None) or None
        outputs = self.get_argument("outputs", None) or None
        await self.call(
            lambda c: c.job_page(
                name=name,
                status=statuses or None,
                creator=creator,
                spec=spec,
                outputs=outputs,
                offset=offset,
                limit=limit,
            )
        )

    @tornado.web.authenticated
    async def post(self) -> None:
        try:
            body = self.body()
            if not isinstance(body, dict):
                raise InvalidSpec("send the job as a JSON object of JobSpec fields")
        except MaJupyterError as exc:
            self.write_typed_error(exc)
            return
        await self.call(lambda c: c.submit(body).info, status=201)


class PlanHandler(ServiceHandler):
    """``POST plan``: the dry-run plan of a JobSpec; creates nothing."""

    @tornado.web.authenticated
    async def post(self) -> None:
        try:
            body = self.body()
            if not isinstance(body, dict):
                raise InvalidSpec("send the job as a JSON object of JobSpec fields")
        except MaJupyterError as exc:
            self.write_typed_error(exc)
            return
        await self.call(lambda c: c.plan(body))


class JobHandler(ServiceHandler):
    """``GET``, ``PATCH`` (priority or duration) and ``DELETE`` (``force`` stops first) of one job."""

    @tornado.web.authenticated
    async def get(self, job_id: str) -> None:
        await self.call(lambda c: c.get(job_id))

    @tornado.web.authenticated
    async def patch(self, job_id: str) -> None:
        try:
            body = self.body()
            if not isinstance(body, dict):
                raise InvalidSpec('send {"priority": ...} or {"duration": ...}')
        except MaJupyterError as exc:
            self.write_typed_error(exc)
            return
        await self.call(
            lambda c: c.update(job_id, priority=body.get("priority"), duration=body.get("duration"))
        )

    @tornado.web.authenticated
    async def delete(self, job_id: str) -> None:
        force = self.get_argument("force", "").lower() in ("1", "true", "yes")
        await self.call(lambda c: c.delete(job_id, force=force))


class StopHandler(ServiceHandler):
    """``POST jobs/{id}/stop``."""

    @tornado.web.authenticated
    async def post(self, job_id: str) -> None:
        await self.call(lambda c: c.stop(job_id))


class EventsHandler(ServiceHandler):
    """``GET jobs/{id}/events?after=<seq>``."""

    @tornado.web.authenticated
    async def get(self, job_id: str) -> None:
        try:
            after = self.arg_int("after", 0) or 0
        except MaJupyterError as exc:
            self.write_typed_error(exc)
            return
        await self.call(lambda c: c.events(job_id, after=after))


class LogStreamsHandler(ServiceHandler):
    """``GET jobs/{id}/logs``: the job's log streams per node and rank."""

    @tornado.web.authenticated
    async def get(self, job_id: str) -> None:
        await self.call(lambda c: c.log_streams(job_id))


class LogReadHandler(ServiceHandler):
    """``GET jobs/{id}/logs/read``: bytes from an offset, long-polling up to ``wait`` (at most MAX_WAIT) seconds."""

    @tornado.web.authenticated
    async def get(self, job_id: str) -> None:
        try:
            rank = self.arg_int("rank")
            offset = self.arg_int("offset", 0) or 0
            limit = self.arg_int("limit", 1 << 20) or (1 << 20)
            wait = min(max(self.arg_float("wait", 0.0), 0.0), MAX_WAIT)
        except MaJupyterError as exc:
            self.write_typed_error(exc)
            return
        node = self.get_argument("node", None) or None
        await self.call(
            lambda c: c.read_log(job_id, node=node, rank=rank, offset=offset, wait=wait, limit=limit)
        )


class TensorBoardHandler(ServiceHandler):
    """``POST`` starts (or finds) the job's TensorBoard; ``DELETE`` stops it."""

    @tornado.web.authenticated
    async def post(self, job_id: str) -> None:
        proxy = url_path_join(self.base_url, NAMESPACE, "tensorboard", quote(job_id, safe="")) + "/"

        def start(c: Client) -> dict[str, str]:
            direct = c.tensorboard(job_id)
            _BOARDS[job_id] = direct
            return {"url": proxy, "direct_url": direct}

        await self.call(start)

    @tornado.web.authenticated
    async def delete(self, job_id: str) -> None:
        await self.call(lambda c: c.stop_tensorboard(job_id))


class SpecsHandler(ServiceHandler):
    """``GET specs``: the spec catalog."""

    @tornado.web.authenticated
    async def get(self) -> None:
        await self.call(lambda c: c.specs())


class NodesHandler(ServiceHandler):
    """``GET nodes?spec=``: the node inventory and its usage."""

    @tornado.web.authenticated
    async def get(self) -> None:
        spec = self.get_argument("spec", None) or None
        await self.call(lambda c: c.nodes(spec=spec))


# job id -> the direct URL of its TensorBoard (``http://127.0.0.1:PORT/tb/<id>/``)
_BOARDS: dict[str, str] = {}
# Hop-by-hop headers and those tornado sets itself are not copied through the proxy.
_SKIP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "server", "date"}


class TensorBoardProxyHandler(JupyterHandler):
    """``<base_url>/ma-jupyter/tensorboard/<id>/<path>`` -> the job's TensorBoard.

    TensorBoard's pages use relative URLs (``tb-relative-root``), so they work under this prefix
    while TensorBoard itself keeps its ``/tb/<id>`` path prefix.  The board is started (or
    found) through the job service on first use, and again if it was reaped as idle.
    """

    def check_xsrf_cookie(self) -> None:
        # TensorBoard's own POSTs (data queries) carry no Jupyter XSRF token; they change
        # nothing, and the request is still authenticated by Jupyter's cookie or token.
        return None

    async def _target(self, job_id: str, fresh: bool) -> str:
        url = None if fresh else _BOARDS.get(job_id)
        if url is None:
            loop = asyncio.get_running_loop()
            url = await loop.run_in_executor(_EXECUTOR, lambda: _client().tensorboard(job_id))
            _BOARDS[job_id] = url
        return url

    async def _proxy(self, job_id: str, path: str) -> None:
        body = self.request.body if self.request.method in ("POST", "PUT") else None
        headers = {
            k: v
            for k, v in self.request.headers.get_all()
            if k.lower() in ("accept", "accept-encoding", "content-type", "if-none-match")
        }
        response = None
        for fresh in (False, True):
            try:
                target = await self._target(job_id, fresh)
            except MaJupyterError as exc:
                self.set_status(exc.status)
                self.set_header("Content-Type", "application/json")
                self.finish(json.dumps(exc.to_body()))
                return
            url = target + path + (f"?{self.request.query}" if self.request.query else "")
            request = HTTPRequest(
                url,
                method=self.request.method,
                body=body,
                headers=headers,
                follow_redirects=False,
                decompress_response=False,
                request_timeout=120,
                allow_nonstandard_methods=True,
            )
            response = await AsyncHTTPClient().fetch(request, raise_error=False)
            if response.code != 599:  # 599: no answer at all, e.g. a board reaped as idle
                break
        assert response is not None
        if response.code == 599:
            self.set_status(503)
            self.set_header("Content-Type", "application/json")
            body = BackendUnavailable(f"the TensorBoard of job {job_id} does not answer: {response.error}")
            self.finish(json.dumps(body.to_body()))
            return
        self.set_status(response.code, response.reason)
        for name, value in response.headers.get_all():
            lower = name.lower()
            if lower == "set-cookie":
                self.add_header(name, value)
            elif lower not in _SKIP_HEADERS:
                self.set_header(name, value)  # replaces Jupyter's defaults (e.g. Content-Type)
        self.finish(response.body or b"")

    @tornado.web.authenticated
    async def get(self, job_id: str, path: str) -> None:
        await self._proxy(job_id, path)

    @tornado.web.authenticated
    async def post(self, job_id: str, path: str) -> None:
        await self._proxy(job_id, path)

    @tornado.web.authenticated
    async def head(self, job_id: str, path: str) -> None:
        await self._proxy(job_id, path)


_JOB = r"(?P<job_id>[^/]+)"
ROUTES: list[tuple[str, type[ServiceHandler]]] = [
    ("service", ServiceStatusHandler),
    ("jobs", JobsHandler),
    ("plan", PlanHandler),
    (f"jobs/{_JOB}", JobHandler),
    (f"jobs/{_JOB}/stop", StopHandler),
    (f"jobs/{_JOB}/events", EventsHandler),
    (f"jobs/{_JOB}/logs", LogStreamsHandler),
    (f"jobs/{_JOB}/logs/read", LogReadHandler),
    (f"jobs/{_JOB}/tensorboard", TensorBoardHandler),
    ("specs", SpecsHandler),
    ("nodes", NodesHandler),
]


def setup_handlers(web_app: Any) -> None:
    """Add the routes under ``<base_url>/ma-jupyter/api/`` to a Jupyter server's web app."""
    base_url = web_app.settings["base_url"]
    handlers: list[tuple[str, type]] = [
        (url_path_join(base_url, NAMESPACE, "api", pattern) + "/?$", cls) for pattern, cls in ROUTES
    ]
    handlers.append(
        (url_path_join(base_url, NAMESPACE, "tensorboard", _JOB) + r"/(?P<path>.*)$", TensorBoardProxyHandler)
    )
    web_app.add_handlers(".*$", handlers)
