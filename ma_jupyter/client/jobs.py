"""The client's calls on jobs: submit, plan, list, get, wait, change, stop, delete, clone; a
job's events, resource samples, log streams and log bytes, its TensorBoard.

A mixin of :class:`~ma_jupyter.client.Client` over its :class:`~.session.ServiceSession`;
every method is documented as ``Client``'s.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import InvalidSpec, NotFound
from ..wire import JobSort, JobStatus, JobType
from .handle import JobHandle
from .logs import READ_LIMIT
from .session import IDEMPOTENCY_HEADER, ServiceSession, new_key, segment
from .spec import host_path

TYPE_CHECKING = False  # typing's, without importing typing (a command line's call: ~5 ms)
if TYPE_CHECKING:  # the models are imported when an answer is validated, not with the client
    from typing import Any

    from ..models import (
        Event,
        Job,
        JobPage,
        JobSpec,
        LogChunk,
        LogFile,
        LogStream,
        Plan,
        ResourceUsage,
    )


class JobCalls(ServiceSession):
    """Jobs and what a job holds (``/jobs``, ``/plan``)."""

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
        key = {IDEMPOTENCY_HEADER: new_key()}
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
        return self._answer("Job", self._request("GET", f"/jobs/{segment(job_id)}"))

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
            "GET", f"/jobs/{segment(job_id)}/status", params=params, timeout=self.timeout + wait
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
        return self._answer("Job", self._request("PATCH", f"/jobs/{segment(job_id)}", json_body=body))

    def stop(self, job_id: str) -> Job:
        """Ask the service to stop the job (SIGTERM, then SIGKILL after its grace period)."""
        return self._answer("Job", self._request("POST", f"/jobs/{segment(job_id)}/stop"))

    def delete(self, job_id: str, force: bool = False) -> None:
        """Delete a finished job and its files.

        Args:
            force: stop it first if it still runs; a job that takes more than a few seconds to
                stop (its grace period) is deleted by the service once it has stopped, after
                this call returns.

        Raises:
            Conflict: it still runs and ``force`` is false.
        """
        self._request("DELETE", f"/jobs/{segment(job_id)}", params={"force": "true" if force else None})

    def clone(self, job_id: str, **fields: Any) -> JobHandle:
        """Submit a copy of a job as this client's user, with ``fields`` overriding the job's.

        Cloning needs only view access to the job (see the access rules); the copy is the
        caller's own job.
        """
        source = self.get(job_id).spec.model_dump(mode="json", exclude={"creator"}, exclude_unset=True)
        return self.submit({**source, **fields})

    def events(self, job_id: str, after: int = 0) -> list[Event]:
        """The job's events with a sequence number above ``after``, oldest first."""
        data = self._request("GET", f"/jobs/{segment(job_id)}/events", params={"after": after})
        return [self._answer("Event", e) for e in data]

    def resources(self, job_id: str, since: float | None = None) -> ResourceUsage:
        """The job's resource samples (taken after ``since``, a Unix time) and node limits."""
        data = self._request("GET", f"/jobs/{segment(job_id)}/resources", params={"since": since})
        return self._answer("ResourceUsage", data)

    def log_streams(self, job_id: str) -> list[LogStream]:
        """The job's log streams: each node's combined log (rank None), then per-rank logs."""
        data = self._request("GET", f"/jobs/{segment(job_id)}/logs")
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
            "GET", f"/jobs/{segment(job_id)}/logs/read", params=params, timeout=self.timeout + wait
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

    def tensorboard(self, job_id: str) -> str:
        """Start (or reuse) the job's TensorBoard over its outputs; returns its URL."""
        return self._request("POST", f"/jobs/{segment(job_id)}/tensorboard")["url"]

    def stop_tensorboard(self, job_id: str) -> None:
        """Stop the job's TensorBoard if one runs."""
        self._request("DELETE", f"/jobs/{segment(job_id)}/tensorboard")


def _remove_tree(path: str) -> None:
    """Remove a folder made for a submit that did not happen (``shutil``, whose import pulls
    in the compression modules, only then)."""
    import shutil

    shutil.rmtree(path, ignore_errors=True)
