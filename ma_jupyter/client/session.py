"""The client's session with the job service: which service, as whom, and one call to it.

:class:`ServiceSession` is what every resource group of :class:`~ma_jupyter.client.Client`
calls through (``client/jobs.py``, ``devtools.py``, ``cluster.py``, ``account.py``): it finds
the service of ``$MA_JUPYTER_HOME`` through its runtime file (``service.json``: url, the
owner's token, pid), or at ``$MA_JUPYTER_URL``, and starts one when none answers (under an
``fcntl`` lock, :mod:`ma_jupyter.client.service`); it holds the token it acts with, one
kept-alive connection per thread (:mod:`ma_jupyter.client.transport`), the timeouts, the
retries while a service restarts, and turns an error answer into the typed errors of
:mod:`ma_jupyter.errors`.  A resource method names its route and its answer's model only
(:meth:`ServiceSession._request`, :meth:`ServiceSession._answer`).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from urllib.parse import quote

from .. import statehome
from ..errors import (
    BackendUnavailable,
    InvalidSpec,
    MaJupyterError,
    ReadTimedOut,
    TransportError,
    Unreachable,
    error_from_body,
)
from ..wire import API_PREFIX
from .plain import FIELDS, Plain
from .service import read_runtime, runtime_alive, start_service, stop_service_process
from .spec import spec_body
from .transport import Connection

TYPE_CHECKING = False  # typing's, without importing typing (a command line's call: ~5 ms)
if TYPE_CHECKING:
    from typing import Any, Self

    from ..models import JobSpec

#: the token a client acts with when none is passed (a user's own, from an admin)
ENV_TOKEN = "MA_JUPYTER_TOKEN"
#: the service's URL when it is not this home's (e.g. for a user who cannot read its runtime file)
ENV_URL = "MA_JUPYTER_URL"
IDEMPOTENCY_HEADER = "Idempotency-Key"
RETRY_FOR = 30.0  # seconds a request keeps retrying while the service restarts


def new_key() -> str:
    """A fresh idempotency key: 128 random bits as 32 hex digits (what ``uuid4().hex`` gave,
    without importing :mod:`uuid`, which loads :mod:`platform` on every CLI call)."""
    return os.urandom(16).hex()


def segment(job_id: str) -> str:
    """A job id (or a node's, a user's name) as one URL path segment."""
    if not job_id:
        raise InvalidSpec("a job id is empty: give one from `ma-jupyter jobs`")
    return quote(str(job_id), safe="")


class ServiceSession:
    """The connection to the job service every resource group of the client shares; its
    arguments are :class:`~ma_jupyter.client.Client`'s (documented there).

    Nothing is contacted until the first call (or :meth:`connect`).
    """

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        autostart: bool = True,
        timeout: float = 30.0,
        local_logs: bool = True,
        retry_for: float = RETRY_FOR,
        service_args: Sequence[str] = (),
        plain: bool = False,
    ):
        url = url or os.environ.get(ENV_URL) or None
        self._fixed = url is not None
        self.local_logs = local_logs
        self._url = url.rstrip("/") if url else None
        # a token of one's own; None: the owner's, read with the runtime file
        self._given_token = token or os.environ.get(ENV_TOKEN) or None
        self._token = self._given_token
        self.autostart = autostart and not self._fixed
        self.timeout = timeout
        self.retry_for = retry_for
        self.service_args = tuple(service_args)
        self.plain = plain
        self._sessions = threading.local()  # one HTTP connection per thread (widgets poll from threads)
        self._all_sessions: list[Connection] = []
        self._lock = threading.RLock()
        self.pid: int | None = None
        # the address was taken from the runtime file (or url) without a /health probe (plain)
        self._unprobed = False

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._url or 'not connected'} home={statehome.home()}>"

    # ----------------------------------------------------------------------- connection

    @property
    def _session(self) -> Connection:
        session = getattr(self._sessions, "session", None)
        if session is None:
            # The service listens on loopback: the transport takes no proxy from the
            # environment (HTTP_PROXY without a NO_PROXY for it), so the token never leaves
            session = self._sessions.session = Connection()
            with self._lock:
                self._all_sessions.append(session)
        return session

    @property
    def url(self) -> str:
        """The service's base URL (connects first if needed)."""
        self.connect()
        assert self._url is not None
        return self._url

    def connect(self) -> Self:
        """Make sure a service answers, starting one if allowed; returns self.

        Raises:
            BackendUnavailable: no service answers and none could be started; the message
                names the service log.
        """
        with self._lock:
            if self._url and self._token:
                return self
            self._discover()
            return self

    def _connect_unprobed(self) -> None:
        """A plain client's first call: take the address of ``url`` (with a token) or of the
        runtime file as it is, a ``/health`` round trip saved, where the process that file names
        still runs (its pid and start: a request, perhaps carrying secrets, never goes to an
        address a stale file names); otherwise :meth:`connect`."""
        with self._lock:
            if self._url and self._token:
                return
            runtime = None if self._fixed else read_runtime()
            if self._fixed and self._token:
                self._unprobed = True
            elif runtime and runtime_alive(runtime):
                self._use(runtime)
                self._unprobed = True
            else:
                self._discover()

    def _discover(self) -> None:
        if self._fixed:
            if not self._token:
                runtime = read_runtime()
                if runtime and runtime["url"].rstrip("/") == self._url:
                    self._token = runtime["token"]
            if not self._token:
                raise BackendUnavailable(
                    f"no token for {self._url}: pass token=... or set ${ENV_TOKEN}, or leave the url "
                    f"unset to use {statehome.runtime_file()}"
                )
            self._probe(self._url, self._token)
            return
        runtime = read_runtime()
        if runtime and self._probe(runtime["url"], runtime["token"], quiet=True):
            self._use(runtime)
            return
        if not self.autostart:
            raise BackendUnavailable(
                f"no job service answers for {statehome.home()}: start one with `ma-jupyter service start`"
            )
        self._use(self._start_service())

    def _use(self, runtime: dict[str, Any]) -> None:
        self._url = runtime["url"].rstrip("/")
        self._token = self._given_token or runtime["token"]
        self.pid = runtime.get("pid")

    def _probe(self, url: str, token: str, *, quiet: bool = False) -> dict[str, Any] | None:
        """The /health answer of ``url`` with ``token``, or None (quiet) / the service's 401 /
        BackendUnavailable."""
        try:
            r = self._session.request(
                "GET",
                f"{url.rstrip('/')}{API_PREFIX}/health",
                headers={"Authorization": f"Bearer {token}"},
                timeout=min(self.timeout, 5.0),
            )
            if r.status_code == 200:
                body = r.json()
                if body.get("ok"):
                    return body
            if r.status_code == 401 and not quiet:
                raise error_from_body(401, r.json())
            problem = f"HTTP {r.status_code}"
        except (TransportError, ValueError) as exc:
            problem = str(exc)
        if quiet:
            return None
        raise BackendUnavailable(f"the job service at {url} does not answer ({problem})")

    def _start_service(self) -> dict[str, Any]:
        """Start the service under the autostart lock (or find the one another client started)."""
        return start_service(lambda url, token: self._probe(url, token, quiet=True), self.service_args)

    def auth_headers(self) -> dict[str, str]:
        """The headers of an authenticated request as this client's user (a proxy forwards them)."""
        return {"Authorization": f"Bearer {self._token}"}

    def _request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        json_body: Any = None,
        timeout: float | None = None,
        headers: dict[str, str] | None = None,
        retry_for: float | None = None,
        text: bool = False,
    ) -> Any:
        """One API call; JSON answer (None for 204; the body as text with ``text``); typed errors
        for 4xx/5xx.

        Every call is safe to repeat, so a connection that is refused, reset or dropped before
        the answer (a service restarting, even after ``kill -9``) is retried for up to
        ``retry_for`` seconds (default :attr:`retry_for`), finding the new service's address
        and token in between; a read timeout is retried once.
        """
        if self.plain:
            self._connect_unprobed()
        else:
            self.connect()
        budget = self.retry_for if retry_for is None else retry_for
        deadline = time.monotonic() + budget
        tries = 0
        timed_out = False
        while True:
            url = self._url
            try:
                r = self._session.request(
                    method,
                    f"{url}{API_PREFIX}{path}",
                    params=params,
                    json_body=json_body,
                    headers={**self.auth_headers(), **(headers or {})},
                    timeout=timeout or self.timeout,
                )
                self._unprobed = False
                break
            except TransportError as exc:
                if self._unprobed:
                    # nothing answers where the runtime file (or url) said: look for the service
                    # (start it when allowed) as connect() does, or say at once that none answers
                    with self._lock:
                        self._unprobed = False
                        if self._url == url and not self._fixed:
                            self._url, self._token = None, self._given_token
                        self._discover()
                    continue
                # refused, reset or dropped mid-answer (a restarting service): retried; a read
                # timeout: one more try only
                again = isinstance(exc, Unreachable) or (isinstance(exc, ReadTimedOut) and not timed_out)
                timed_out = timed_out or isinstance(exc, ReadTimedOut)
                if not again or time.monotonic() >= deadline:
                    raise BackendUnavailable(
                        f"the job service does not answer {method} {path} ({exc}); see {statehome.service_log()}"
                    ) from exc
                tries += 1
                time.sleep(min(1.0, 0.05 * 2**tries))
                if not self._fixed:
                    # A restarted service has a new port and token: look for it (or start it).
                    with self._lock:
                        if self._url == url:
                            self._url, self._token = None, self._given_token
                        try:
                            self.connect()
                        except MaJupyterError:
                            self._url = url  # nothing answers yet: keep trying the old address
                continue
        if (r.status_code == 204 or not r.content) and r.ok:
            return None
        if not r.ok:
            try:
                body = r.json()
            except ValueError:
                body = {"message": f"the job service answered HTTP {r.status_code}: {r.text[:200]}"}
            raise error_from_body(r.status_code, body if isinstance(body, dict) else None)
        return r.text if text else r.json()

    def _answer(self, model: str, data: Any) -> Any:
        """An answer's JSON as wire model ``model``: a plain view where this client is plain
        and the model has one (:mod:`ma_jupyter.client.plain`), else the validated model."""
        if self.plain and model in FIELDS:
            return Plain(model, data)
        from .. import models  # pydantic: imported on the first answer that needs it

        return getattr(models, model).model_validate(data)

    def _spec_body(self, spec: JobSpec | dict[str, Any] | None, fields: dict[str, Any]) -> dict[str, Any]:
        return spec_body(spec, fields, validate=not self.plain)

    # ------------------------------------------------------------------------ service

    def service_status(self) -> dict[str, Any]:
        """Whether a service runs for this home, without starting one.

        Returns:
            ``{"running", "home", "log", "url", "pid", "version", "backend"}`` (url, pid,
            version and backend None when nothing answers).
        """
        status: dict[str, Any] = {
            "running": False,
            "home": str(statehome.home()),
            "log": str(statehome.service_log()),
            "url": None,
            "pid": None,
            "version": None,
            "backend": None,
        }
        runtime = read_runtime() if not self._fixed else {"url": self._url, "token": self._token}
        if runtime and runtime.get("token"):
            health = self._probe(runtime["url"], runtime["token"], quiet=True)
            if health:
                status.update(
                    running=True,
                    url=runtime["url"],
                    pid=health.get("pid"),
                    version=health.get("version"),
                    backend=health.get("backend"),
                )
        return status

    def shutdown_service(self, timeout: float = 20.0) -> bool:
        """Stop the service process this home runs (its jobs keep running on their own).

        Sends SIGTERM to the pid the service itself reports, waits for it to exit (SIGKILL
        after ``timeout``), and reaps it if this process started it.

        Returns:
            True if a service was stopped, False if none was running.
        """
        status = self.service_status()
        pid = status["pid"]
        if not status["running"] or not pid:
            return False
        stop_service_process(pid, timeout)
        with self._lock:
            if not self._fixed:
                self._url, self._token = None, self._given_token
                self.pid = None
        return True

    def reads_local_files(self) -> bool:
        """Whether this client may read a stream's file itself where the service describes one:
        ``local_logs`` is on and its service is this machine's (the files a service describes
        are on its own machine)."""
        return self.local_logs and self._serves_this_home()

    def _serves_this_home(self) -> bool:
        """Whether this client's service is the one of this machine's ``$MA_JUPYTER_HOME``."""
        if not self._fixed:
            return True  # found through this home's runtime file
        runtime = read_runtime()
        return bool(runtime) and runtime["url"].rstrip("/") == self._url

    def close(self) -> None:
        """Close the HTTP connections (the service keeps running)."""
        with self._lock:
            for session in self._all_sessions:
                session.close()
            self._all_sessions.clear()
        self._sessions = threading.local()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
