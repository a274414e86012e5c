"""Jupyter server extension: the JupyterLab sidebar's authenticated way to the job service.

Enabled by ``etc/jupyter/jupyter_server_config.d/ma_jupyter.json`` (installed with the wheel), it
is one reverse proxy behind Jupyter's own authentication, and TensorBoard:

``<base_url>/ma-jupyter/api/v1/<path>``
    The job service's REST API (``/api/v1/<path>``, see :mod:`ma_jupyter.service.app`) behind
    Jupyter's authentication: the request's method, query and body, and the answer's status,
    content type and body pass through unchanged (the answer is relayed as it arrives, so the
    service's long-polls simply take their time).  Jupyter's token or cookie (with its XSRF check for
    unsafe methods) lets a request in; the service's credentials for the Jupyter user go out
    (see "Users" below), and nothing of Jupyter's credentials reaches the service.
``<base_url>/ma-jupyter/service``
    Whether a job service runs for this home (``running``, ``url``, ``pid``, ``home``...), from
    :meth:`ma_jupyter.client.Client.service_status`; it starts none.
``<base_url>/ma-jupyter/devenv-kernel``
    ``POST {"job", "node"}``: start the job's dev environment and install its kernelspec for this
    server's account (:class:`DevEnvKernelHandler`), so Lab can open a notebook on it.
``<base_url>/ma-jupyter/debug-terminal``
    ``POST {"job", "node"}``: a Jupyter terminal running ``ma-jupyter shell JOB --node NODE`` as an
    argv (:class:`DebugTerminalHandler`), which Lab's tab then connects to.
``<base_url>/ma-jupyter/tensorboard/<id>/<path>``
    The job's TensorBoard (which listens on loopback only), started through the service on
    first use and again if it was reaped as idle.

Users: whom a request acts as at the service.

1. Without JupyterHub (no ``$JUPYTERHUB_USER``: a single-user Jupyter server) the Jupyter user is
   the service owner: the owner's token goes out, as the kernels' clients send it.
2. Under JupyterHub, the hub user who owns this server (``$JUPYTERHUB_USER``) is the service owner
   too: its kernels act as the owner anyway.
3. Any other hub user Jupyter authenticated (a shared server) is forwarded by name: the proxy
   token of the runtime file, which only this extension sends, with ``X-MA-Forwarded-User``.  The
   service puts that name in a namespace of its own (``hub:<name>``, a non-admin created on first
   sight) and applies the access rules to it: a hub user named like the service's owner, an admin
   or any other service user is never that user (see :mod:`ma_jupyter.service.users`).

The service's address and tokens come from :class:`ma_jupyter.client.Client` (its runtime file),
which starts the service on first use, on a worker thread.  The proxied requests themselves go
through tornado's ``AsyncHTTPClient``: the Jupyter server's event loop never waits on them.

Why one module (over 600 lines): it is the Jupyter server extension, one entry point Jupyter
loads: the proxy, the service's status, the dev environment's kernel, the debug terminal and
TensorBoard are its handlers, sharing the user rules above (whom a request acts as) and the
upstream they reach.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote, unquote

import tornado.web
from jupyter_server.base.handlers import APIHandler, JupyterHandler
from jupyter_server.utils import url_path_join
from tornado import httputil
from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from tornado.httputil import HTTPHeaders

from ..client import API_PREFIX, FORWARDED_USER_HEADER, Client
from ..client.service import read_runtime
from ..client.spec import with_storage_credentials
from ..errors import (
    BackendUnavailable,
    Forbidden,
    InvalidSpec,
    MaJupyterError,
    NotFound,
    error_from_body,
)
from ..models import check_node_target

NAMESPACE = "ma-jupyter"

# Seconds one proxied call may take: above the service's longest long-poll (60 s).
SERVICE_TIMEOUT = 180.0
TENSORBOARD_TIMEOUT = 120.0
CONNECT_TIMEOUT = 10.0
MAX_CLIENTS = 64  # concurrent upstream requests (open job views each hold a long-poll)

# Service start and discovery, and TensorBoard starts, block: they run here, never on the loop.
_EXECUTOR = ThreadPoolExecutor(max_workers=4, thread_name_prefix="ma-jupyter-serverext")
_CLIENT: Client | None = None
_SERVICE: Upstream | None = None
_HTTP: tuple[Any, AsyncHTTPClient] | None = None
# (forwarded user or None, job id) -> the direct URL of its TensorBoard
# (``http://127.0.0.1:PORT/tb/<id>/<secret>/``): a user reaches a board the service once let it open
_BOARDS: dict[tuple[str | None, str], str] = {}

# Hop-by-hop headers and those tornado sets itself are not copied through the proxy.
_SKIP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "server", "date"}
_SERVICE_REQUEST_HEADERS = ("accept", "content-type", "if-none-match")
_BOARD_REQUEST_HEADERS = ("accept", "accept-encoding", "content-type", "if-none-match")
_BODY_METHODS = ("POST", "PUT", "PATCH")


class Upstream:
    """The service as this extension reaches it: its URL, the owner's headers, the proxy token."""

    def __init__(self, url: str, owner_headers: dict[str, str], proxy_token: str | None):
        self.url = url
        self.owner_headers = owner_headers
        self.proxy_token = proxy_token

    def headers(self, forwarded: str | None) -> dict[str, str]:
        """The credentials of a request for ``forwarded`` (None: the owner; see "Users")."""
        if forwarded is None:
            return dict(self.owner_headers)
        if not self.proxy_token:
            raise BackendUnavailable(
                "the job service's runtime file has no proxy token (an older service): restart it "
                "with `ma-jupyter service stop` so that hub users can reach it"
            )
        return {"Authorization": f"Bearer {self.proxy_token}", FORWARDED_USER_HEADER: forwarded}


def forwarded_user(jupyter_user: str | None, hub_owner: str | None) -> str | None:
    """The user name to forward for a Jupyter user, or None to act as the service owner.

    Args:
        jupyter_user: the name Jupyter authenticated the request as.
        hub_owner: ``$JUPYTERHUB_USER`` (the hub user owning this server), None without a hub.
    """
    if not hub_owner or not jupyter_user or jupyter_user == hub_owner:
        return None  # rules 1 and 2
    return jupyter_user  # rule 3


def _user_name(user: Any) -> str | None:
    """The name of Jupyter's ``current_user`` (a ``User``, a hub model dict, or a string)."""
    if user is None:
        return None
    if isinstance(user, dict):
        return user.get("name") or user.get("username")
    return getattr(user, "username", None) or getattr(user, "name", None) or str(user)


def _client(fresh: bool = False) -> Client:
    """The extension's client of the job service (thread-safe; a new one after a restart)."""
    global _CLIENT
    if _CLIENT is None or fresh:
        _CLIENT = Client()
    return _CLIENT


async def _service(fresh: bool = False) -> Upstream:
    """The service as this extension reaches it, starting it if none runs.

    Raises:
        BackendUnavailable: no service answers and none could be started.
    """
    global _SERVICE
    if _SERVICE is None or fresh:

        def connect() -> Upstream:
            client = _client(fresh).connect()
            runtime = read_runtime()
            same = runtime is not None and runtime["url"].rstrip("/") == client.url
            return Upstream(client.url, client.auth_headers(), runtime.get("proxy_token") if same else None)

        _SERVICE = await asyncio.get_running_loop().run_in_executor(_EXECUTOR, connect)
    return _SERVICE


def _http() -> AsyncHTTPClient:
    """This event loop's HTTP client for the proxies (more connections than tornado's shared one)."""
    global _HTTP
    loop = asyncio.get_running_loop()
    if _HTTP is None or _HTTP[0] is not loop:
        _HTTP = (loop, AsyncHTTPClient(force_instance=True, max_clients=MAX_CLIENTS))
    return _HTTP[1]


def _error(handler: JupyterHandler, exc: MaJupyterError) -> None:
    """Answer with a typed error's status and ``{"error", "message", "field"}`` body."""
    handler.set_status(exc.status)
    handler.set_header("Content-Type", "application/json")
    handler.finish(json.dumps(exc.to_body()))


class _Relay:
    """Copies an upstream answer to ``handler`` as it arrives: status and headers, then the body."""

    def __init__(self, handler: ProxyMixin):
        self.handler = handler
        self.code = 0
        self.reason = ""
        self.headers = HTTPHeaders()
        self.started = False

    def header_line(self, line: str) -> None:
        """``header_callback`` of the upstream request."""
        if line.startswith("HTTP/"):
            first = httputil.parse_response_start_line(line.strip())
            self.code, self.reason, self.headers = first.code, first.reason, HTTPHeaders()
        elif line.strip():
            self.headers.parse_line(line)

    def start(self) -> None:
        """Send the upstream status and headers (once)."""
        if self.started:
            return
        self.started = True
        handler = self.handler
        handler.set_status(self.code, self.reason)
        for name, value in self.headers.get_all():
            lower = name.lower()
            if lower == "set-cookie":
                handler.add_header(name, value)
            elif lower not in _SKIP_HEADERS:
                handler.set_header(name, value)  # replaces Jupyter's defaults (e.g. Content-Type)

    def body_chunk(self, chunk: bytes) -> None:
        """``streaming_callback`` of the upstream request: pass the bytes on at once."""
        self.start()
        if self.handler.gone:
            return
        self.handler.write(chunk)
        self.handler.flush()


class _PageRelay(_Relay):
    """A relay that holds TensorBoard's page whole and makes its root-absolute asset URLs relative.

    TensorBoard's ``index.html`` inlines its fonts' ``@font-face`` rules with URLs such as
    ``url(/font-roboto/x.woff2)``: root-absolute, so behind this proxy they would leave it for
    the Jupyter server's root (404) whatever TensorBoard's ``--path_prefix``.  Made relative
    (``url(font-roboto/x.woff2)``) they resolve under the page's own URL, through the proxy.
    The page is small and asked uncompressed, so holding it costs nothing.
    """

    def __init__(self, handler: ProxyMixin):
        super().__init__(handler)
        self.body = bytearray()

    def body_chunk(self, chunk: bytes) -> None:
        self.body += chunk

    def start(self) -> None:
        # the body changes length (and so its tag): the upstream's values would be wrong
        for name in ("Content-Length", "ETag"):
            if name in self.headers:
                del self.headers[name]
        super().start()

    def finish_page(self) -> None:
        """Send the held page, its root-absolute ``url(/...)`` references made relative."""
        self.start()
        if self.handler.gone:
            return
        body = bytes(self.body)
        if "html" in self.headers.get("Content-Type", ""):
            body = _ROOT_URL.sub(rb"\1", body)
        self.handler.write(body)


# ``url(/x`` and ``url('/x`` (not ``url(//host``): a root-absolute URL in a style rule
_ROOT_URL = re.compile(rb"(url\(\s*['\"]?)/(?!/)")


class ProxyMixin(JupyterHandler):
    """Forwarding of one request to an upstream URL, relaying its answer."""

    gone = False

    def on_connection_close(self) -> None:
        self.gone = True  # the browser left (e.g. an aborted long-poll): drop what still comes

    async def relay(
        self, url: str, headers: dict[str, str], timeout: float, relay: _Relay | None = None
    ) -> tuple[_Relay, Exception | None]:
        """Send this request's method and body to ``url``; the answer is relayed while it arrives
        (by ``relay``, default a plain :class:`_Relay`).

        Returns:
            The relay (``started`` once anything was sent back) and the error that ended the
            exchange early (refused connection, timeout...), None when the answer came whole.
        """
        method = self.request.method or "GET"
        body = (self.request.body or b"") if method in _BODY_METHODS else None
        relay = relay or _Relay(self)
        request = HTTPRequest(
            url,
            method=method,
            body=body,
            headers=headers,
            follow_redirects=False,
            decompress_response=False,
            connect_timeout=CONNECT_TIMEOUT,
            request_timeout=timeout,
            allow_nonstandard_methods=True,
            header_callback=relay.header_line,
            streaming_callback=relay.body_chunk,
        )
        try:
            await _http().fetch(request, raise_error=False)
        except Exception as exc:  # no (complete) answer: the caller decides what to tell the browser
            return relay, exc
        return relay, None

    def give_up(self, relay: _Relay, problem: MaJupyterError) -> None:
        """End an exchange that failed: a typed error if nothing was sent yet, else cut the answer off.

        A relayed answer cannot change its status any more: closing the connection makes the
        browser see a failed request rather than a complete but truncated body.
        """
        if not relay.started:
            _error(self, problem)
            return
        self.log.warning(
            "ma_jupyter proxy: %s %s cut off: %s", self.request.method, self.request.path, problem
        )
        self.request.connection.close()

    def forwarded_headers(self, names: tuple[str, ...]) -> dict[str, str]:
        """The request's headers among ``names`` (lower case)."""
        return {k: v for k, v in self.request.headers.get_all() if k.lower() in names}

    def forwarded_user(self) -> str | None:
        """Whom this request acts as at the service: a hub user's name, or None for the owner."""
        return forwarded_user(_user_name(self.current_user), os.environ.get("JUPYTERHUB_USER"))


class ServiceProxyHandler(ProxyMixin, APIHandler):
    """``<base_url>/ma-jupyter/api/v1/<path>`` -> the job service's ``/api/v1/<path>``."""

    async def _forward(self, path: str) -> None:
        # the raw (still percent-encoded) path, so a job id arrives exactly as the browser sent it
        prefix = url_path_join(self.base_url, NAMESPACE, "api", "v1") + "/"
        raw = self.request.path[len(prefix) :]
        if any(unquote(part) in (".", "..") for part in raw.split("/")):
            _error(self, NotFound(f"no route {path!r} in the job service's API"))
            return
        query = f"?{self.request.query}" if self.request.query else ""
        if self.request.method == "POST" and raw.rstrip("/") in ("jobs", "plan", "export"):
            # the Lab's create form names s3:// paths: the credentials are this server's user's
            self.request.body = with_storage_credentials(self.request.body or b"")
        for fresh in (False, True):
            try:
                upstream = await _service(fresh)
                auth = upstream.headers(self.forwarded_user())
            except MaJupyterError as exc:
                _error(self, exc)
                return
            headers = {**self.forwarded_headers(_SERVICE_REQUEST_HEADERS), **auth}
            url = f"{upstream.url}{API_PREFIX}/{raw}{query}"
            relay, error = await self.relay(url, headers, SERVICE_TIMEOUT)
            # A restarted service has a new port and token: find it and retry once, but only when
            # the connection was refused (the request never reached a service, nothing ran twice).
            if relay.started or not isinstance(error, ConnectionRefusedError):
                break
        if error is not None:
            self.give_up(relay, BackendUnavailable(f"the job service does not answer ({error})"))
            return
        relay.start()
        self.finish(set_content_type=relay.headers.get("Content-Type", "application/json"))

    @tornado.web.authenticated
    async def get(self, path: str) -> None:
        await self._forward(path)

    @tornado.web.authenticated
    async def post(self, path: str) -> None:
        await self._forward(path)

    @tornado.web.authenticated
    async def put(self, path: str) -> None:
        await self._forward(path)

    @tornado.web.authenticated
    async def patch(self, path: str) -> None:
        await self._forward(path)

    @tornado.web.authenticated
    async def delete(self, path: str) -> None:
        await self._forward(path)


class ServiceStatusHandler(APIHandler):
    """``GET <base_url>/ma-jupyter/service``: whether a job service runs for this home (starts none)."""

    @tornado.web.authenticated
    async def get(self) -> None:
        status = await asyncio.get_running_loop().run_in_executor(
            _EXECUTOR, lambda: _client().service_status()
        )
        self.finish(json.dumps(status))


class DevEnvKernelHandler(APIHandler):
    """``POST <base_url>/ma-jupyter/devenv-kernel`` ``{"job": ID, "node": N}``: start the job's
    dev environment and install its kernelspec for this server's account
    (:mod:`ma_jupyter.client.kernelspec`); answers ``{"kernel_name", "display_name", "devenv"}``.

    The kernel runs as this server's account and the dev environment as the service owner, so
    only the server's own user (users rules 1 and 2) may: a forwarded hub user gets a 403 that
    says to start it from their own server (``%ma_devenv JOB --kernel``)."""

    @tornado.web.authenticated
    async def post(self) -> None:
        if forwarded_user(_user_name(self.current_user), os.environ.get("JUPYTERHUB_USER")) is not None:
            self.set_status(403)
            self.finish(
                json.dumps(
                    {
                        "error": "forbidden",
                        "message": "a dev environment's kernel runs as this server's account: start it from "
                        "your own Jupyter server (%ma_devenv JOB --kernel)",
                    }
                )
            )
            return
        try:
            body = json.loads(self.request.body or b"{}")
            job_id, node = str(body["job"]), body.get("node")
        except (ValueError, KeyError, TypeError):
            self.set_status(400)
            self.finish(json.dumps({"error": "invalid", "message": 'give {"job": ID, "node": N}'}))
            return

        def start() -> dict[str, Any]:
            from ..client.kernelspec import start_devenv_kernel

            started = start_devenv_kernel(_client(), job_id, node)
            return {
                "kernel_name": started.kernel_name,
                "display_name": started.display_name,
                "devenv": started.devenv.info.model_dump(mode="json"),
            }

        try:
            answer = await asyncio.get_running_loop().run_in_executor(_EXECUTOR, start)
        except MaJupyterError as exc:
            _error(self, exc)
            return
        self.set_status(201)
        self.finish(json.dumps(answer))


def debug_terminal_argv(job_id: str, node: str) -> list[str]:
    """The command a debug terminal runs: ``ma-jupyter shell`` with this server's interpreter, the
    job and node as arguments of their own (checked by :func:`ma_jupyter.models.check_node_target`
    first, so neither can read as an option)."""
    return [sys.executable, "-m", "ma_jupyter.frontends.cli", "shell", job_id, "--node", node]


class DebugTerminalHandler(APIHandler):
    """``POST <base_url>/ma-jupyter/debug-terminal`` ``{"job": ID, "node": N}``: a Jupyter terminal
    whose process is :func:`debug_terminal_argv`; answers 201 ``{"name": TERMINAL}``, the terminal
    session the Lab tab connects to (the node's shell ends it, and so the tab).

    Rules:

    1. ``job`` and ``node`` must match the wire model's patterns
       (:func:`ma_jupyter.models.check_node_target`), else a 400 naming the field; nothing starts.
    2. The command is an argv: the id and node are arguments of the process the terminal runs,
       never text typed into a shell (a control character in a notebook's output once erased the
       typed line and ran the rest).
    3. Only the server's own user (users rules 1 and 2): the terminal runs as this server's
       account and its CLI acts as the service owner, so a forwarded hub user gets a 403 that says
       to open it from their own server.  The service still checks that the owner may open it.
    4. A server with terminals turned off answers 503 saying so.
    """

    @tornado.web.authenticated
    async def post(self) -> None:
        if self.forwarded_user() is not None:
            _error(
                self,
                Forbidden(
                    "a debug terminal runs as this server's account: open it from your own Jupyter "
                    "server (the job page's Terminal, or %ma_shell JOB)"
                ),
            )
            return
        try:
            body = json.loads(self.request.body or b"{}")
        except ValueError:
            body = None
        if not isinstance(body, dict):
            _error(self, InvalidSpec('give {"job": ID, "node": N}'))
            return
        try:
            job_id, node = check_node_target(body.get("job"), body.get("node"))
        except MaJupyterError as exc:
            _error(self, exc)
            return
        terminals = self.settings.get("terminal_manager")
        if terminals is None:
            _error(
                self,
                BackendUnavailable(
                    "this Jupyter server has terminals turned off (ServerApp.terminals_enabled): "
                    "run `ma-jupyter shell JOB --node NODE` in a terminal of your own"
                ),
            )
            return
        model = terminals.create(shell_command=debug_terminal_argv(job_id, node))
        self.set_status(201)
        self.finish(json.dumps({"name": model["name"]}))

    def forwarded_user(self) -> str | None:
        """Whom this request acts as at the service (see "Users")."""
        return forwarded_user(_user_name(self.current_user), os.environ.get("JUPYTERHUB_USER"))


class TensorBoardProxyHandler(ProxyMixin):
    """``<base_url>/ma-jupyter/tensorboard/<id>/<path>`` -> the job's TensorBoard.

    TensorBoard's pages use relative URLs (``tb-relative-root``), so they work under this prefix
    while TensorBoard itself keeps its ``/tb/<id>/<secret>`` path prefix; the few root-absolute
    ones of its page (the fonts) are made relative on the way (:class:`_PageRelay`).  The board is started (or
    found) through the job service on first use, and again if it was reaped as idle.
    """

    def check_xsrf_cookie(self) -> None:
        """Jupyter's XSRF check, except for TensorBoard's own data queries.

        TensorBoard's scripts POST their queries with TensorBoard's XSRF header
        ``X-XSRF-Protected: 1`` and without Jupyter's token.  A page of another origin cannot add
        such a header without a CORS preflight, which this route never grants, and a request
        whose ``Origin`` is another site is refused outright; so the header is proof enough.
        Every other unsafe request (a plain cross-site form POST with the session cookie, say)
        needs Jupyter's XSRF token, or it is refused before any board starts.
        """
        if not hasattr(self, "_jupyter_current_user"):
            return None  # called before authentication: Jupyter checks again once it is known
        if (
            self.request.method == "POST"
            and self.request.headers.get("X-XSRF-Protected") == "1"
            and self.check_origin()
        ):
            return None
        return super().check_xsrf_cookie()

    async def _target(self, job_id: str, fresh: bool) -> str:
        user = self.forwarded_user()
        url = None if fresh else _BOARDS.get((user, job_id))
        if url is None:
            url = await _start_board(job_id, user)
            _BOARDS[(user, job_id)] = url
        return url

    async def _proxy(self, job_id: str, path: str) -> None:
        headers = self.forwarded_headers(_BOARD_REQUEST_HEADERS)
        page = path in ("", "index.html")
        if page:  # held and rewritten (_PageRelay): asked uncompressed
            headers = {
                k: v for k, v in headers.items() if k.lower() not in ("accept-encoding", "if-none-match")
            }
        query = f"?{self.request.query}" if self.request.query else ""
        for fresh in (False, True):
            try:
                target = await self._target(job_id, fresh)
            except MaJupyterError as exc:
                _error(self, exc)
                return
            relay, error = await self.relay(
                target + path + query, headers, TENSORBOARD_TIMEOUT, _PageRelay(self) if page else None
            )
            if relay.started or error is None:  # otherwise no answer at all, e.g. a board reaped as idle
                break
        if error is not None:
            self.give_up(
                relay, BackendUnavailable(f"the TensorBoard of job {job_id} does not answer: {error}")
            )
            return
        if isinstance(relay, _PageRelay):
            relay.finish_page()
        relay.start()
        self.finish()

    @tornado.web.authenticated
    async def get(self, job_id: str, path: str) -> None:
        await self._proxy(job_id, path)

    @tornado.web.authenticated
    async def post(self, job_id: str, path: str) -> None:
        await self._proxy(job_id, path)

    @tornado.web.authenticated
    async def head(self, job_id: str, path: str) -> None:
        await self._proxy(job_id, path)


async def _start_board(job_id: str, user: str | None) -> str:
    """Start (or find) the job's TensorBoard through the service, as ``user``: the service checks
    that this user may open it.

    Raises:
        MaJupyterError: the service's typed refusal (404 for a job hidden from the user...).
    """
    for fresh in (False, True):
        upstream = await _service(fresh)
        request = HTTPRequest(
            f"{upstream.url}{API_PREFIX}/jobs/{quote(job_id, safe='')}/tensorboard",
            method="POST",
            body=b"",
            headers=upstream.headers(user),
            connect_timeout=CONNECT_TIMEOUT,
            request_timeout=TENSORBOARD_TIMEOUT,
        )
        try:
            answer = await _http().fetch(request, raise_error=False)
        except ConnectionRefusedError:
            continue  # a restarted service: find it once more
        except Exception as exc:  # a timeout, a dropped connection
            raise BackendUnavailable(f"the job service does not answer ({exc})") from exc
        try:
            body = json.loads(answer.body or b"{}")
        except ValueError:
            body = {}
        if answer.code == 200 and isinstance(body, dict) and body.get("url"):
            return str(body["url"])
        if answer.code == 599:  # tornado's "no answer"
            raise BackendUnavailable(f"the job service does not answer ({answer.error})")
        raise error_from_body(answer.code, body if isinstance(body, dict) else None)
    raise BackendUnavailable("the job service does not answer (connection refused)")


def setup_handlers(web_app: Any) -> None:
    """Add the proxy routes under ``<base_url>/ma-jupyter/`` to a Jupyter server's web app."""
    base = url_path_join(web_app.settings["base_url"], NAMESPACE)
    web_app.add_handlers(
        ".*$",
        [
            (url_path_join(base, "api", "v1") + "/(?P<path>.*)$", ServiceProxyHandler),
            (url_path_join(base, "service") + "/?$", ServiceStatusHandler),
            (url_path_join(base, "devenv-kernel") + "/?$", DevEnvKernelHandler),
            (url_path_join(base, "debug-terminal") + "/?$", DebugTerminalHandler),
            (
                url_path_join(base, "tensorboard", r"(?P<job_id>[^/]+)") + r"/(?P<path>.*)$",
                TensorBoardProxyHandler,
            ),
        ],
    )


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    """Tell Jupyter Server which module holds the extension (this one)."""
    return [{"module": "ma_jupyter.frontends.serverext"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    """Register the handlers on a running Jupyter server.

    Args:
        serverapp: the ``jupyter_server.serverapp.ServerApp`` loading the extension.
    """
    setup_handlers(serverapp.web_app)
    serverapp.log.info(
        "ma_jupyter server extension: the job service's API proxied under %s/api/v1", NAMESPACE
    )
