"""The HTTP client of the job service: the one way the front ends reach jobs.

:class:`Client` finds the service of ``$MA_JUPYTER_HOME`` through its runtime file
(``service.json``: url, the owner's token, pid), or at ``$MA_JUPYTER_URL``.  It acts as the user
of its token: ``Client(token=...)``, else ``$MA_JUPYTER_TOKEN``, else the service owner's token
from the runtime file (which only the owner's account can read).  If no service answers there, it starts one
(``python -m ma_jupyter.service``, detached in its own session so it outlives the kernel) under an
``fcntl`` lock, so two kernels starting at the same moment end up with one service.  Error
responses come back as the typed errors of :mod:`ma_jupyter.errors`, the same ones local
validation raises.

:class:`JobHandle` is what ``submit`` returns: a job by id, with ``status``, ``wait``, ``logs``
(optionally following the log with the service's long-poll, line by line, nothing lost or
repeated), ``events``, ``stop`` and ``delete``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import quote

from .. import statehome
from ..errors import (
    BackendUnavailable,
    InvalidSpec,
    JobFailed,
    MaJupyterError,
    NotFound,
    ReadTimedOut,
    TransportError,
    Unreachable,
    error_from_body,
)
from ..wire import API_PREFIX, JobSort, JobStatus, JobType
from .logs import FOLLOW_WAIT, READ_LIMIT, LogLines
from .plain import FIELDS, Plain, model_name
from .service import read_runtime, start_service, stop_service_process
from .spec import host_path, spec_body
from .transport import Connection

TYPE_CHECKING = False  # typing's, without importing typing (a command line's call: ~5 ms)
if TYPE_CHECKING:  # the models are imported when an answer is validated, not with the client
    from typing import Any

    from ..models import (
        API_PREFIX,
        Algorithm,
        CacheInfo,
        ClusterView,
        Event,
        Job,
        JobPage,
        JobSort,
        JobSpec,
        JobStatus,
        JobSummary,
        JobType,
        KernelRoute,
        LogChunk,
        LogFile,
        LogStream,
        Node,
        NotifySettings,
        Plan,
        PreparedData,
        RegisteredImage,
        ResourceUsage,
        Spec,
        User,
        UserToken,
    )
    from .shell import ShellSession

#: the token a client acts with when none is passed (a user's own, from an admin)
ENV_TOKEN = "MA_JUPYTER_TOKEN"
#: the service's URL when it is not this home's (e.g. for a user who cannot read its runtime file)
ENV_URL = "MA_JUPYTER_URL"
IDEMPOTENCY_HEADER = "Idempotency-Key"
RETRY_FOR = 30.0  # seconds a request keeps retrying while the service restarts
#: a field :meth:`Client.set_notify` leaves as it is
KEEP = object()


def _new_key() -> str:
    """A fresh idempotency key: 128 random bits as 32 hex digits (what ``uuid4().hex`` gave,
    without importing :mod:`uuid`, which loads :mod:`platform` on every CLI call)."""
    return os.urandom(16).hex()


class Client:
    """A connection to the job service of ``$MA_JUPYTER_HOME``.

    Args:
        url: the service's base URL (``http://127.0.0.1:PORT``); default ``$MA_JUPYTER_URL``,
            else from the runtime file.
        token: the token of the user this client acts as; default ``$MA_JUPYTER_TOKEN``, else
            the service owner's from the runtime file.  The service knows the user by it alone.
        autostart: start the service when none answers (only without an explicit ``url``).
        timeout: seconds for one ordinary request (a long-poll adds its wait to it).
        local_logs: read log bytes straight from the job's files where the service says they
            are on this machine (see :class:`LogLines`); the service still decides what may be
            read and when a log ends.
        retry_for: seconds a request is retried while the service is unreachable or drops the
            connection (a restart): every request of this client is safe to repeat (submits
            carry an idempotency key), so a retry never runs anything twice.
        service_args: options given to a service this client starts (``--backend ray
            --ray-address HOST:PORT``); without them it follows ``cluster.toml``.
        plain: answer jobs, pages, log chunks and events as read-only views of the service's
            JSON (:class:`~ma_jupyter.client.plain.Plain`: the models' field names, read
            without pydantic) and leave a submitted spec's validation to the service, whose
            refusal is the same :class:`~ma_jupyter.errors.InvalidSpec`; and its first call
            goes to the service of the runtime file (or ``url``) without asking ``/health``
            first: only when nothing answers there is the service looked for (and started) as
            :meth:`connect` does, before the call is sent again.  What a command line uses, to
            start fast.  Default: validated pydantic models, the service probed first.

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
        return f"<Client {self._url or 'not connected'} home={statehome.home()}>"

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

    def connect(self) -> Client:
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
        runtime file as it is, a ``/health`` round trip saved; without either, :meth:`connect`."""
        with self._lock:
            if self._url and self._token:
                return
            runtime = None if self._fixed else read_runtime()
            if self._fixed and self._token:
                self._unprobed = True
            elif runtime:
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

    # ------------------------------------------------------------------------------- jobs

    def submit(self, spec: JobSpec | dict[str, Any] | None = None, **fields: Any) -> JobHandle:
        """Submit a job.

        Args:
            spec: a :class:`JobSpec` or a dict of its fields (optional).
            **fields: JobSpec fields, overriding ``spec``'s. Relative host paths (algorithm,
                outputs, mounts, image) are taken from the current directory.

        A spec without ``algorithm`` whose command names a file of the current folder
        (``python train.py``, ``bash -c "python train.py | tee log"``) ships a read-only copy of
        that folder as ``/workspace/algorithm``, the job's working directory; with
        ``algorithm_read_only=False`` the folder itself, writable
        (:func:`ma_jupyter.client.snapshot.ship_working_folder`; the handle's ``shipped`` says so).

        Returns:
            A :class:`JobHandle` of the new job (usually queued or running).

        Raises:
            InvalidSpec: the spec breaks a rule (checked locally first, so the message is the
                same as the service's and comes at once), or the service refuses it (unknown
                spec, missing host folder...).
        """
        body = self._spec_body(spec, fields)
        from .snapshot import is_snapshot, ship_working_folder  # a folder copy: submits only

        shipped = ship_working_folder(body)
        # One key per submit call: the retries of this call (after a timeout or a dropped
        # connection) return the job the first attempt created instead of a second one.
        key = {IDEMPOTENCY_HEADER: _new_key()}
        try:
            job = self._answer("Job", self._request("POST", "/jobs", json_body=body, headers=key))
        except BaseException:
            if shipped and is_snapshot(body["algorithm"]):
                _remove_tree(body["algorithm"])  # no job will run it
            raise
        handle = JobHandle(self, job)
        handle.shipped = shipped
        return handle

    def plan(self, spec: JobSpec | dict[str, Any] | None = None, **fields: Any) -> Plan:
        """Dry run: the resolved per-node plan (argv, env, files, mounts); creates nothing.

        Args:
            spec, **fields: as for :meth:`submit`.

        Raises:
            InvalidSpec: as for :meth:`submit`.
        """
        body = self._spec_body(spec, fields)
        from .snapshot import is_snapshot, ship_working_folder  # a folder copy: submits only

        shipped = ship_working_folder(body)
        try:
            plan = self._answer("Plan", self._request("POST", "/plan", json_body=body))
        finally:
            if shipped and is_snapshot(body["algorithm"]):
                _remove_tree(body["algorithm"])  # a dry run leaves nothing
        if shipped:
            plan.notes.append(
                shipped.replace("shipped ", "would ship ", 1).replace("mounted ", "would mount ", 1)
            )
        return plan

    def export(
        self, job_id: str, format: str = "k8s", *, image: str | None = None, mounts_as: str | None = None
    ) -> str:
        """What job ``job_id`` would be on another platform, as that platform's text.

        Args:
            job_id: the job (yours, or another user's you may view).
            format: ``k8s``: Kubernetes manifests, multi-document YAML for ``kubectl apply -f``
                (an Indexed Job per role, a headless Service; :mod:`ma_jupyter.export.k8s`).
            image: the container image (default: one for the job's mode).
            mounts_as: ``pvc`` (claims standing for the host folders, the default) or
                ``hostpath`` (the host folders themselves).

        Raises:
            InvalidSpec: an unknown format (the message names the known ones), or a job the
                format cannot express (it says why).
            NotFound: no such job (or it is hidden from this user).
        """
        params = {"format": format, "image": image, "mounts_as": mounts_as}
        return self._request("GET", f"/jobs/{_segment(job_id)}/export", params=params, text=True)

    def export_spec(
        self,
        spec: JobSpec | dict[str, Any] | None = None,
        format: str = "k8s",
        *,
        image: str | None = None,
        mounts_as: str | None = None,
        **fields: Any,
    ) -> str:
        """What a job would be on another platform, without submitting it (``--dry-run --format``).

        Args:
            spec, **fields: as for :meth:`submit`; a command naming a file of the current folder
                without ``algorithm`` gets this folder as its ``/workspace/algorithm``, as a
                submit would ship it (nothing is copied).
            format, image, mounts_as: as for :meth:`export`.

        Raises:
            InvalidSpec: as for :meth:`submit` and :meth:`export`.
        """
        body = self._spec_body(spec, fields)
        from .snapshot import names_local_file

        if not body.get("algorithm") and names_local_file(body.get("command"), Path.cwd()):
            body["algorithm"] = str(Path.cwd())
        params = {"format": format, "image": image, "mounts_as": mounts_as}
        return self._request("POST", "/export", params=params, json_body=body, text=True)

    def _spec_body(self, spec: JobSpec | dict[str, Any] | None, fields: dict[str, Any]) -> dict[str, Any]:
        return spec_body(spec, fields, validate=not self.plain)

    def jobs(
        self,
        name: str | None = None,
        status: str | JobStatus | list[str | JobStatus] | None = None,
        creator: str | None = None,
        spec: str | None = None,
        outputs: str | None = None,
        offset: int = 0,
        limit: int = 50,
        *,
        algorithm: str | None = None,
        algorithm_digest: str | None = None,
        favourites: bool = False,
        type: str | JobType | None = None,
    ) -> list[JobHandle]:
        """Jobs, newest first, filtered.

        Args:
            name: substring of the job name.
            status: one status or a list of them.
            creator: the submitting user.
            spec: a spec name the job asked for.
            outputs: its outputs folder.
            offset, limit: paging.
            algorithm: the algorithm folder it runs (relative to the current directory): the jobs
                shipped from it or using it, and the jobs that ran its current content
                wherever that lay (see :meth:`job_page`).
            algorithm_digest: also (or, without ``algorithm``, only) the jobs that ran this
                content (``sha256:...``, a job's ``spec.algorithm_digest``).
            favourites: only jobs running one of this user's favourite algorithms.
            type: ``regular`` or ``batch`` jobs only.

        Returns:
            Handles of the matching jobs on this page (see :meth:`job_page` for the total), each
            with the job's summary; a handle's ``info`` (the whole job) is fetched when used.
        """
        page = self.job_page(
            name,
            status,
            creator,
            spec,
            outputs,
            offset,
            limit,
            algorithm=algorithm,
            algorithm_digest=algorithm_digest,
            favourites=favourites,
            type=type,
        )
        return [JobHandle(self, job) for job in page.items]

    def job_page(
        self,
        name: str | None = None,
        status: str | JobStatus | list[str | JobStatus] | None = None,
        creator: str | None = None,
        spec: str | None = None,
        outputs: str | None = None,
        offset: int = 0,
        limit: int = 50,
        *,
        algorithm: str | None = None,
        algorithm_digest: str | None = None,
        favourites: bool = False,
        type: str | JobType | None = None,
        sort: str | JobSort = JobSort.newest,
    ) -> JobPage:
        """Like :meth:`jobs`, as the service's page (``items`` and ``total``); ``sort``: a
        column (``created``, ``name``, ``id``, ``status``, ``creator``, ``outputs``,
        ``priority``, ``mode``, ``spec``, ``elapsed``), ``-`` first for descending.  Its items
        are :class:`~ma_jupyter.models.JobSummary`: :meth:`get` has the whole job.

        With ``algorithm`` and no ``algorithm_digest``, the folder's current content is read
        here, with this user's own rights (the service never reads a folder a search names), and
        searched for too: the page's ``algorithm_digest`` is that content (None when the folder
        cannot be read whole), so a job whose ``spec.algorithm_digest`` equals it ran the
        folder's current code, another of the folder's jobs an older version."""
        statuses = status if isinstance(status, list) else [status] if status else []
        folder = host_path(algorithm, Path.cwd()) if algorithm else None
        if folder is not None and algorithm_digest is None:
            from .. import algorithm_content  # hashing a folder: only a search by folder needs it

            algorithm_digest = algorithm_content.digest(folder)
        params = {
            "name": name,
            "status": [JobStatus(s).value for s in statuses] or None,
            "creator": creator,
            "spec": spec,
            "outputs": outputs,
            "algorithm": folder,
            "algorithm_digest": algorithm_digest,
            "favourites": "true" if favourites else None,
            "type": JobType(type).value if type else None,
            "sort": JobSort(sort).value,
            "offset": offset,
            "limit": limit,
        }
        return self._answer("JobPage", self._request("GET", "/jobs", params=params))

    def job(self, job_id: str) -> JobHandle:
        """The job ``job_id``: an id, or a name as :meth:`get` takes it.

        Raises:
            NotFound: no such job (or it is hidden from this user).
        """
        return JobHandle(self, self.get(job_id))

    def job_by_id(self, job_id: str) -> JobHandle:
        """The job of id ``job_id`` (never a name).

        Raises:
            NotFound: no such job (or it is hidden from this user).
        """
        return JobHandle(self, self._get_by_id(job_id))

    def get(self, job_id: str) -> Job:
        """The current state of job ``job_id`` as a :class:`~ma_jupyter.models.Job`: an id, or
        a name, meaning what it means in the CLI (your newest job of that name; see
        :mod:`ma_jupyter.client.resolve`).

        Raises:
            NotFound: neither the id nor the name of a job this user may view.
            InvalidSpec: none of this user's jobs has the name and several other users' do.
        """
        try:
            return self._get_by_id(job_id)
        except NotFound:
            from .resolve import named_job  # only a name needs it

            return self._get_by_id(named_job(self, job_id, hint="`Client().jobs()`")[0])

    def _get_by_id(self, job_id: str) -> Job:
        return self._answer("Job", self._request("GET", f"/jobs/{_segment(job_id)}"))

    def wait_status(self, job_id: str, since: str | JobStatus | None = None, wait: float = 0) -> Job:
        """The job once its status differs from ``since`` or is terminal, or after ``wait`` seconds.

        Args:
            job_id: the job.
            since: the status the caller knows; None: wait for a terminal status only.
            wait: long-poll seconds (the service allows up to 60).

        Returns:
            The job's current state (possibly still ``since`` when the wait ran out).
        """
        params = {"since": JobStatus(since).value if since else None, "wait": wait or None}
        data = self._request(
            "GET", f"/jobs/{_segment(job_id)}/status", params=params, timeout=self.timeout + wait
        )
        return self._answer("Job", data)

    def update(self, job_id: str, priority: str | None = None, duration: float | str | None = None) -> Job:
        """Change a queued job's priority or a running job's duration (seconds or ``30m``, ``2h``).

        Raises:
            Conflict: the job's status does not allow the change.
            InvalidSpec: nothing to change, or a bad value.
        """
        body = {k: v for k, v in (("priority", priority), ("duration", duration)) if v is not None}
        if not body:
            raise InvalidSpec("give a priority (queued jobs) or a duration (running jobs) to change")
        return self._answer("Job", self._request("PATCH", f"/jobs/{_segment(job_id)}", json_body=body))

    def stop(self, job_id: str) -> Job:
        """Ask the service to stop the job (SIGTERM, then SIGKILL after its grace period)."""
        return self._answer("Job", self._request("POST", f"/jobs/{_segment(job_id)}/stop"))

    def shell(
        self,
        job_id: str,
        node: str | None = None,
        *,
        rows: int = 24,
        cols: int = 80,
        command: Sequence[str] | None = None,
    ) -> ShellSession:
        """Open the debug terminal of a node of a running job submitted with ``debug_terminal``:
        an interactive shell inside the node's sandbox, or ``command`` run on that terminal.

        Args:
            node: the node (default: the job's first).

        The service's refusals (no debug terminal, job not running, another user's job) come
        from the session's first :meth:`ShellSession.receive`.
        """
        import json
        from urllib.parse import urlencode

        self.connect()
        query = {"rows": rows, "cols": cols}
        if node:
            query["node"] = node
        if command:
            query["command"] = json.dumps(list(command))
        url = f"{self._url}{API_PREFIX}/jobs/{_segment(job_id)}/shell?{urlencode(query)}"
        from .shell import open_session  # the debug terminal's protocol: only `shell` needs it

        return open_session(url, self.auth_headers(), self.timeout)

    def delete(self, job_id: str, force: bool = False) -> None:
        """Delete a finished job and its files.

        Args:
            force: stop it first if it still runs; a job that takes more than a few seconds to
                stop (its grace period) is deleted by the service once it has stopped, after
                this call returns.

        Raises:
            Conflict: it still runs and ``force`` is false.
        """
        self._request("DELETE", f"/jobs/{_segment(job_id)}", params={"force": "true" if force else None})

    def events(self, job_id: str, after: int = 0) -> list[Event]:
        """The job's events with a sequence number above ``after``, oldest first."""
        data = self._request("GET", f"/jobs/{_segment(job_id)}/events", params={"after": after})
        return [self._answer("Event", e) for e in data]

    def resources(self, job_id: str, since: float | None = None) -> ResourceUsage:
        """The job's resource samples (taken after ``since``, a Unix time) and node limits."""
        data = self._request("GET", f"/jobs/{_segment(job_id)}/resources", params={"since": since})
        return self._answer("ResourceUsage", data)

    def log_streams(self, job_id: str) -> list[LogStream]:
        """The job's log streams: each node's combined log (rank None), then per-rank logs."""
        data = self._request("GET", f"/jobs/{_segment(job_id)}/logs")
        return [self._answer("LogStream", s) for s in data]

    def read_log(
        self,
        job_id: str,
        node: str | None = None,
        rank: int | None = None,
        offset: int = 0,
        wait: float = 0,
        limit: int = READ_LIMIT,
    ) -> LogChunk:
        """Bytes of one log stream from a byte ``offset``.

        Args:
            job_id: the job.
            node: node name (``worker-0``...); default the job's first primary node.
            rank: a rank's own log; None for the node's combined log.
            offset: byte offset to read from (the previous chunk's ``next_offset``).
            wait: long-poll seconds: the answer comes as soon as there are new bytes, the job
                is terminal, or the wait is over.
            limit: most bytes to return.

        Returns:
            The chunk; ``eof`` is true once the job is terminal and everything was read.
        """
        params = {"node": node, "rank": rank, "offset": offset, "limit": limit, "wait": wait or None}
        data = self._request(
            "GET", f"/jobs/{_segment(job_id)}/logs/read", params=params, timeout=self.timeout + wait
        )
        return self._answer("LogChunk", data)

    def local_log_file(self, job_id: str, node: str, rank: int | None = None) -> LogFile | None:
        """Where this client may read a log stream's file itself, else None.

        Only the backend knows where a log lives: the answer is the service's description of
        the stream (:meth:`log_streams`, its ``file``), asked for only when ``local_logs`` is on
        and this client talks to the service of this machine's ``$MA_JUPYTER_HOME`` (the files
        a service describes are on its own machine).  Whether the file is readable shows when
        the reader opens it.
        """
        if not self.reads_local_files():
            return None
        for stream in self.log_streams(job_id):
            if stream.node == node and stream.rank == rank:
                return stream.file
        return None

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

    def tensorboard(self, job_id: str) -> str:
        """Start (or reuse) the job's TensorBoard over its outputs; returns its URL."""
        return self._request("POST", f"/jobs/{_segment(job_id)}/tensorboard")["url"]

    def stop_tensorboard(self, job_id: str) -> None:
        """Stop the job's TensorBoard if one runs."""
        self._request("DELETE", f"/jobs/{_segment(job_id)}/tensorboard")

    # ------------------------------------------------------------------------ catalog

    def specs(self) -> list[Spec]:
        """The spec catalog (compute flavors)."""
        return [self._answer("Spec", s) for s in self._request("GET", "/specs")]

    def nodes(self, spec: str | None = None) -> list[Node]:
        """The node inventory with what is in use now; ``spec``: only nodes that fit it."""
        return [self._answer("Node", n) for n in self._request("GET", "/nodes", params={"spec": spec})]

    def drain_node(self, name: str, reason: str | None = None) -> Node:
        """Take a node out of placement (admins only): no new job goes there, and jobs with
        checkpoint resume running there checkpoint and resume elsewhere."""
        body = {"reason": reason} if reason else None
        return self._answer("Node", self._request("POST", f"/nodes/{_segment(name)}/drain", json_body=body))

    def undrain_node(self, name: str) -> Node:
        """Put a drained or faulty node back into placement (admins only)."""
        return self._answer("Node", self._request("POST", f"/nodes/{_segment(name)}/undrain"))

    def cluster(self, specs: list[str] | None = None, models: list[str] | None = None) -> ClusterView:
        """The cluster view: nodes and their use (cards as ``1(0):job``), how many more of each
        spec could start now, the queue and card demand per board model; ``specs``/``models``
        filter it."""
        params = {"spec": list(specs or []), "model": list(models or [])}
        return self._answer("ClusterView", self._request("GET", "/cluster", params=params))

    # -------------------------------------------------------------------------- users

    def notify_settings(self) -> NotifySettings:
        """Where your own jobs' alerts and terminal states go (``GET /users/me/notify``)."""
        return self._answer("NotifySettings", self._request("GET", "/users/me/notify"))

    def set_notify(
        self, webhook: str | None | object = KEEP, *, address: str | None | object = KEEP
    ) -> NotifySettings:
        """Send your jobs' alerts and terminal states to ``webhook`` (an http(s) URL getting
        each event as a JSON POST), and name ``address`` (a mail address, a chat handle: it is
        in each event the administrator's ``[notify]`` command gets, which delivers it there);
        None forgets one, :data:`KEEP` (the default) leaves it as it is (``PUT /users/me/notify``)."""
        body = {k: v for k, v in (("webhook", webhook), ("address", address)) if v is not KEEP}
        return self._answer("NotifySettings", self._request("PUT", "/users/me/notify", json_body=body))

    def whoami(self) -> User:
        """The user this client acts as (its token's)."""
        return self._answer("User", self._request("GET", "/users/me"))

    def users(self) -> list[User]:
        """Every user of the service (admins only; tokens are never shown).

        Raises:
            Forbidden: this client's user is no admin.
        """
        return [self._answer("User", u) for u in self._request("GET", "/users")]

    def add_user(self, name: str, admin: bool = False) -> UserToken:
        """Add a user; the answer carries its token, shown this once (admins only).

        Raises:
            Forbidden: this client's user is no admin.
            Conflict: the user exists.
            InvalidSpec: the name is not a user name.
        """
        body = {"name": name, "admin": admin}
        return self._answer("UserToken", self._request("POST", "/users", json_body=body, retry_for=0))

    def new_token(self, name: str) -> UserToken:
        """Give a user a new token (its old one stops working); shown this once (admins only)."""
        data = self._request("POST", f"/users/{_segment(name)}/token", retry_for=0)
        return self._answer("UserToken", data)

    def remove_user(self, name: str) -> None:
        """Remove a user: its token stops working at once; its jobs stay (admins only)."""
        self._request("DELETE", f"/users/{_segment(name)}")

    def clone(self, job_id: str, **fields: Any) -> JobHandle:
        """Submit a copy of a job as this client's user, with ``fields`` overriding the job's.

        Cloning needs only view access to the job (see the access rules); the copy is the
        caller's own job.
        """
        source = self.get(job_id).spec.model_dump(mode="json", exclude={"creator"}, exclude_unset=True)
        return self.submit({**source, **fields})

    def devenv(self, job_id: str) -> dict[str, Any]:
        """The job as a notebook whose code cell submits it again (the seed's "create a
        development environment from a job"): ``{"name": "<job name>-devenv.ipynb", "notebook":
        <nbformat 4 JSON>}``; see :mod:`ma_jupyter.export.notebook` for what the cells hold.

        Needs view access to the job, as cloning does.
        """
        return self._request("GET", f"/jobs/{_segment(job_id)}/devenv")

    def create_devenv(self, job_id: str, node: str | int | None = None) -> JobHandle:
        """Start a dev environment of one of the job's nodes (default its first): a job of this
        client's user with that node's sandbox and a Jupyter kernel as its command
        (``POST /jobs/{id}/devenv``; only the job's owner or an admin may).  Attach a notebook
        with the kernelspec :func:`ma_jupyter.client.kernelspec.install_devenv_kernel` installs."""
        body = {} if node is None else {"node": node}
        data = self._request(
            "POST",
            f"/jobs/{_segment(job_id)}/devenv",
            json_body=body,
            headers={IDEMPOTENCY_HEADER: _new_key()},
        )
        return JobHandle(self, self._answer("Job", data))

    def kernel_route(self, devenv_id: str) -> KernelRoute:
        """How to reach the kernel of the running dev environment ``devenv_id`` (``POST
        /jobs/{id}/kernel``; its owner or an admin): its kernel folder on the service's machine,
        or the relay on the Ray node that runs it, with the relay's secret."""
        return self._answer("KernelRoute", self._request("POST", f"/jobs/{_segment(devenv_id)}/kernel"))

    # -------------------------------------------------------------------- algorithms

    def algorithms(self) -> list[Algorithm]:
        """This user's algorithm folders: their favourites first, then the folders their own
        jobs ran, each with how many of their jobs used it."""
        return [self._answer("Algorithm", a) for a in self._request("GET", "/algorithms")]

    def favourite(self, path: str) -> Algorithm:
        """Mark an algorithm folder (relative to the current directory) a favourite of this user."""
        body = {"path": host_path(path, Path.cwd())}
        return self._answer("Algorithm", self._request("POST", "/algorithms/favourites", json_body=body))

    def unfavourite(self, path: str) -> None:
        """Unmark a favourite algorithm folder.

        Raises:
            NotFound: it was not a favourite.
        """
        self._request("DELETE", "/algorithms/favourites", params={"path": host_path(path, Path.cwd())})

    # ------------------------------------------------------------------------ caches

    def cache(self, every_user: bool = False) -> list[CacheInfo]:
        """The size of the caller's persistent cache (``~/.cache`` in their jobs); with
        ``every_user``, of every user's (admins only)."""
        params = {"all": "true"} if every_user else None
        return [self._answer("CacheInfo", c) for c in self._request("GET", "/cache", params=params)]

    def clear_cache(self) -> CacheInfo:
        """Empty the caller's persistent cache; what it held.  Refused (Conflict) while a job of
        the caller runs."""
        return self._answer("CacheInfo", self._request("DELETE", "/cache"))

    def prepared_data(self) -> list[PreparedData]:
        """Data preparation's shared copies that the caller's jobs took (every one for admins),
        with their sizes and the jobs using them; expired ones are removed first."""
        return [self._answer("PreparedData", d) for d in self._request("GET", "/data")]

    def remove_prepared_data(self, key: str) -> PreparedData:
        """Remove one prepared copy now; what it was.  Refused (Conflict) while a job uses it."""
        return self._answer("PreparedData", self._request("DELETE", f"/data/{key}"))

    # ------------------------------------------------------------------------ images

    def images(self) -> list[RegisteredImage]:
        """The registered images the caller may use (public ones and their own; admins: all)."""
        return [self._answer("RegisteredImage", i) for i in self._request("GET", "/images")]

    def register_image(self, image: RegisteredImage | dict[str, Any]) -> RegisteredImage:
        """Register an image (``POST /images``): ``name``, ``environment`` (``{"python": PATH}``,
        ``{"venv": DIR}`` or ``{"conda_env": ENV}``), ``card_type``, ``scopes``, ``visibility``
        (``public``: admins only), ``description``; what the service stored."""
        body = image if isinstance(image, dict) else image.model_dump(mode="json", exclude_none=True)
        return self._answer("RegisteredImage", self._request("POST", "/images", json_body=body))

    def remove_image(self, name: str) -> None:
        """Remove a registered image of the caller's (an admin: any)."""
        self._request("DELETE", f"/images/{quote(name, safe='')}")

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

    def close(self) -> None:
        """Close the HTTP connections (the service keeps running)."""
        with self._lock:
            for session in self._all_sessions:
                session.close()
            self._all_sessions.clear()
        self._sessions = threading.local()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class JobHandle:
    """A job of the service, by id.

    A handle from a listing (:meth:`Client.jobs`) holds the job's
    :class:`~ma_jupyter.models.JobSummary` (:attr:`summary`: no variables, mounts or commands);
    its :attr:`info`, the whole job, is fetched on first use.

    Attributes:
        id: the job id.
        summary: the job as the listing gave it (None for a handle made from the whole job).
    """

    def __init__(self, client: Client, job: Job | JobSummary):
        self.client = client
        self.id = job.id
        summary = model_name(job) == "JobSummary"
        self.summary: JobSummary | None = job if summary else None
        self._info: Job | None = None if summary else job
        #: what :meth:`Client.submit` shipped as the algorithm (a sentence), or None
        self.shipped: str | None = None

    @property
    def info(self) -> Job:
        """The last whole :class:`~ma_jupyter.models.Job` seen (refreshed by :meth:`refresh`,
        :attr:`status`, :meth:`wait`, :meth:`stop`); a listed handle's is fetched on first use."""
        if self._info is None:
            self._info = self.client._get_by_id(self.id)
        return self._info

    @info.setter
    def info(self, job: Job) -> None:
        self._info = job

    @property
    def name(self) -> str:
        """The job's name."""
        return (self.summary or self.info).spec.name

    def refresh(self) -> Job:
        """Fetch the job's current state into :attr:`info` and return it."""
        self.info = self.client._get_by_id(self.id)
        return self.info

    @property
    def status(self) -> JobStatus:
        """The job's current status (asks the service)."""
        return self.refresh().status

    def wait(self, timeout: float | None = None, *, check: bool = True) -> Job:
        """Block until the job is terminal and return its final state.

        It long-polls the job's status (the service answers as soon as the job ends), so the
        end is seen at once without busy polling.  Like a training script's own exit status, a
        failed job is an exception: with ``check`` (the default) a job that ended ``error`` or
        ``expired`` raises; ``stopped`` (someone stopped it) and ``succeeded`` return.  Pass
        ``check=False`` to get every final state back and look at ``status`` yourself.

        Raises:
            JobFailed: ``check`` and the job ended ``error`` or ``expired``; the message names
                the job, its status and reason, and ``exc.job`` is its final state.
            TimeoutError: the job is still not terminal after ``timeout`` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        job = self.refresh()
        while not job.status.is_terminal():
            remaining = FOLLOW_WAIT if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"job {self.id} is still {job.status.value} after {timeout} s")
            job = self.info = self.client.wait_status(self.id, wait=min(remaining, FOLLOW_WAIT))
        if check and job.status in (JobStatus.error, JobStatus.expired):
            raise JobFailed(
                f"job {job.id} ({job.spec.name}) ended {job.status.value}"
                + (f": {job.reason}" if job.reason else "")
                + f"; its log: ma-jupyter logs {job.id}",
                job=job,
            )
        return job

    def stop(self) -> Job:
        """Ask the service to stop the job; returns its state right after the request."""
        self.info = self.client.stop(self.id)
        return self.info

    def delete(self, force: bool = False) -> None:
        """Delete the job (``force``: stop it first if it still runs)."""
        self.client.delete(self.id, force=force)

    def resources(self, since: float | None = None) -> ResourceUsage:
        """The job's resource samples (see :meth:`Client.resources`)."""
        return self.client.resources(self.id, since=since)

    def events(self, after: int = 0) -> list[Event]:
        """The job's events after sequence number ``after``."""
        return self.client.events(self.id, after=after)

    def logs(
        self, follow: bool = False, node: str | None = None, rank: int | None = None, offset: int = 0
    ) -> LogLines:
        """The job's log as lines (without the newline).

        Args:
            follow: keep reading until the job is terminal and its log fully read (long-poll);
                otherwise stop at the current end of the log.
            node: node name; default the job's first primary node.
            rank: a rank's own log; None for the node's combined log.
            offset: byte offset to start at (e.g. a previous iterator's :attr:`LogLines.offset`).

        Returns:
            An iterator of lines; a partial last line is held back until it is complete or the
            log ends. Its ``offset`` attribute is the byte offset just after the last line
            yielded, so a later reader can continue exactly there.
        """
        return LogLines(self.client, self.id, follow=follow, node=node, rank=rank, offset=offset)

    def __repr__(self) -> str:
        status = (self._info or self.summary or self.info).status.value
        return f"<JobHandle id={self.id} name={self.name} status={status}>"


def _segment(job_id: str) -> str:
    """A job id as one URL path segment."""
    if not job_id:
        raise InvalidSpec("a job id is empty: give one from `ma-jupyter jobs`")
    return quote(str(job_id), safe="")


def _remove_tree(path: str) -> None:
    """Remove a folder made for a submit that did not happen (``shutil``, whose import pulls
    in the compression modules, only then)."""
    import shutil

    shutil.rmtree(path, ignore_errors=True)
