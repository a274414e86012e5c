"""A job of the service, by id: what :meth:`Client.submit <ma_jupyter.client.Client.submit>`
and the listings return (``status``, ``wait``, ``logs``, ``events``, ``stop``, ``delete``)."""

from __future__ import annotations

import time

from ..errors import JobFailed
from ..wire import JobStatus
from .logs import FOLLOW_WAIT, LogLines
from .plain import model_name

TYPE_CHECKING = False  # typing's, without importing typing (a command line's call: ~5 ms)
if TYPE_CHECKING:  # an annotation's: no class at run time
    from typing import Protocol

    from ..models import Event, Job, JobSummary, ResourceUsage
    from .logs import LogClient

    class HandleClient(LogClient, Protocol):
        """What a handle needs of its client: :class:`ma_jupyter.client.Client` is one (this
        module does not import it: the client's calls build on the handle, not both ways)."""

        def _get_by_id(self, job_id: str) -> Job: ...

        def wait_status(self, job_id: str, since: str | JobStatus | None = None, wait: float = 0) -> Job: ...

        def stop(self, job_id: str) -> Job: ...

        def delete(self, job_id: str, force: bool = False) -> None: ...

        def resources(self, job_id: str, since: float | None = None) -> ResourceUsage: ...

        def events(self, job_id: str, after: int = 0) -> list[Event]: ...


class JobHandle:
    """A job of the service, by id.

    A handle from a listing (:meth:`Client.jobs`) holds the job's
    :class:`~ma_jupyter.models.JobSummary` (:attr:`summary`: no variables, mounts or commands);
    its :attr:`info`, the whole job, is fetched on first use.

    Attributes:
        id: the job id.
        summary: the job as the listing gave it (None for a handle made from the whole job).
    """

    def __init__(self, client: HandleClient, job: Job | JobSummary):
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
