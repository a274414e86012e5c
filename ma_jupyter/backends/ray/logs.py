"""A job's logs on the Ray nodes, read through their agents (item 5 of :mod:`.backend`).

1. :func:`log_streams` lists each node's streams from the agent of the Ray node that ran it
   (where its ``placed.json`` says: :mod:`.node_files`), in the job's node order, then the
   streams of earlier attempts' nodes found there; a stream's ``file`` is kept only where this
   machine sees that very launch's job folder;
2. :func:`open_log` opens one stream through that agent (:class:`RayLogSource`); once that Ray
   node is gone, the file is read here when this machine sees the node's job folder (shared
   storage), else the read raises :class:`NodeLost`;
3. :func:`runner_failure` reads, from shared storage, the failure report of a node whose Ray
   node left, waiting a moment for a runner that is still ending its node.

:class:`RayLogSource` implements :class:`~ma_jupyter.backends.base.LogSource`.  :meth:`RayLogSource.read` asks the
agent for the bytes (the agent opens the file as untrusted, as the local backend does).
:meth:`RayLogSource.size` must never block (the service's long-poll calls it on its event loop
every few milliseconds), so it answers from what it knows and keeps one
:meth:`~ma_jupyter.backends.ray.agent.NodeAgent.wait_log` call pending on the agent: that call
returns as soon as the file grows, and the next ``size()`` sees the new size.  A line printed
on a Ray node so reaches a follower within the agent's look interval plus one round trip.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import NodeGone, RefusedFile
from ...jobdir import PLACEHOLDER, JobDir
from ...models import Job, LogStream
from ...nodehost import logs as local_logs

if TYPE_CHECKING:
    from .agents import Agents
    from .node_files import NodeFiles

#: seconds one pending wait for growth lasts on the agent before it is asked again
WAIT = 2.0
#: seconds the failure of a node whose Ray node left waits for its runner's report, when that runner
#: still beats (it is ending its node: hostwatch rule 5)
HOST_REPORT_WAIT = 3.0
#: seconds a look for the runner's beat lasts (it beats every second: noderun's HEARTBEAT_EVERY)
RUNNER_BEAT_LOOK = 1.5


class RayLogSource:
    """One log stream of a job node, on the Ray node its ``agent`` runs on.

    Args:
        agent: the node agent's actor handle.
        call: ``call(object_ref)`` -> the result, raising the backend's errors (see
            :meth:`~ma_jupyter.backends.ray.agents.Agents.get`).
        job_dir, node, rank: the stream (``job_dir`` is the job folder on that Ray node).
        size: its size when opened.
    """

    def __init__(
        self,
        agent: Any,
        call: Callable[[Any], Any],
        job_dir: str,
        node: str,
        rank: int | None,
        size: int,
    ):
        self._agent = agent
        self._call = call
        self._where = (job_dir, node, rank)
        self._size = size
        self._pending: Future | None = None
        self._closed = False
        self._lock = threading.Lock()

    def read(self, offset: int, limit: int) -> tuple[bytes, int]:
        if self._closed:
            raise OSError(errno.EBADF, "the log was closed")
        if offset < 0 or limit < 0:
            raise ValueError("offset and limit must be >= 0")
        answer = self._call(self._agent.read_log.remote(*self._where, offset, limit))
        if answer[0] == "refused":
            raise RefusedFile(answer[1])
        if answer[0] == "missing":  # removed meanwhile: nothing more to read
            return b"", self._size
        data, size = answer[1], answer[2]
        with self._lock:
            self._size = max(self._size, size)  # a stream only grows
        return data, size

    def size(self) -> int:
        with self._lock:
            pending = self._pending
            if pending is not None and pending.done():
                self._pending = None
                try:
                    self._size = max(self._size, int(pending.result()))
                except Exception:  # the agent is gone or busy: the next read says so
                    pass
            if self._pending is None and not self._closed:
                ref = self._agent.wait_log.remote(*self._where, self._size, WAIT)
                self._pending = ref.future()
            return self._size

    def close(self) -> None:
        # a pending wait ends on the agent by itself within WAIT seconds
        self._closed = True


def log_streams(agents: Agents, files: NodeFiles, job: Job) -> list[LogStream]:
    """Rule 1: each node's streams from the agent of its Ray node, in the job's node order;
    streams of earlier attempts' nodes found there follow.  A stream's ``file`` is kept only
    where this machine sees that very launch's job folder (shared storage, or the Ray node is
    this machine): elsewhere the file is on the Ray node, read through its agent."""
    names = [n.name for n in job.nodes]
    places: dict[tuple[str, str], list[str]] = {}
    for name in names:
        placed = files.where(job.id, name)
        if placed is not None:
            places.setdefault((placed["host"], placed["job_dir"]), []).append(name)
    found: dict[str, list[LogStream]] = {}
    extra: list[LogStream] = []
    for (host, job_dir), here in places.items():
        # the nodes whose files of that very launch this machine sees at the same path
        shared = [n for n in here if files.shared(job.id, n, files.where(job.id, n) or {})]
        try:
            agent = agents.agent_at({"host": host})
            streams = agents.get(agent.log_streams.remote(job_dir, here))
            streams = [s if s.node in shared else s.model_copy(update={"file": None}) for s in streams]
        except NodeGone:
            # gone with its Ray node, unless its files are readable here (shared storage)
            if not shared:
                continue
            streams = local_logs.log_streams(JobDir(Path(job_dir)), shared)
            here = shared
        for stream in streams:
            if stream.node in here:
                found.setdefault(stream.node, []).append(stream)
            elif stream.node not in names and all(
                s.node != stream.node or s.rank != stream.rank for s in extra
            ):
                extra.append(stream)
    ordered = [s for name in names for s in found.get(name, [])]
    return ordered + sorted(extra, key=lambda s: (s.node, -1 if s.rank is None else s.rank))


def open_log(agents: Agents, files: NodeFiles, job_id: str, node: str, rank: int | None):
    """Rule 2: the stream read through the agent of the Ray node that ran ``node``; None while
    it does not exist (or the node never ran on this backend).  Once that Ray node is gone: the
    file read here when this machine sees the node's job folder (shared storage), else
    :class:`NodeLost`."""
    JobDir(PLACEHOLDER.root).log_relative(node, rank)  # InvalidSpec for names that cannot be streams
    placed = files.where(job_id, node)
    if placed is None:
        return None
    try:
        agent = agents.agent_at(placed)
    except NodeGone:
        shared = files.shared(job_id, node, placed)
        if shared is None:
            raise files.lost(node, placed) from None
        return local_logs.open_log(shared, node, rank)
    answer = agents.get(agent.read_log.remote(placed["job_dir"], node, rank, 0, 0))
    if answer[0] == "refused":
        raise RefusedFile(answer[1])
    if answer[0] == "missing":
        return None
    return RayLogSource(agent, agents.get, placed["job_dir"], node, rank, answer[2])


def runner_failure(shared: JobDir, node: str) -> tuple[int, int] | str | None:
    """The failure report of ``node`` read from shared storage.  A runner that was still beating
    when its Ray node left sees its raylet end and writes its report within moments of that
    (:mod:`ma_jupyter.nodehost.hostwatch`), but the cluster may tell this service first: such a
    report is waited for, at most :data:`HOST_REPORT_WAIT` seconds (this runs on the finishing
    thread, off the supervisor's lock).  Whether the runner still beats is judged by its heartbeat
    file's time changing during :data:`RUNNER_BEAT_LOOK` seconds, never against this machine's
    clock (the file's time is another machine's); a runner gone with its machine does not beat."""
    report = local_logs.failure(shared, node)
    heartbeat = shared.node(node).heartbeat

    def beat() -> float | None:
        try:
            return os.stat(heartbeat).st_mtime
        except OSError:
            return None

    first = beat()
    if report is not None or first is None:
        return report
    began = time.monotonic()
    beating = False
    while report is None and time.monotonic() - began < HOST_REPORT_WAIT:
        time.sleep(0.1)
        report = local_logs.failure(shared, node)
        beating = beating or beat() != first
        if not beating and time.monotonic() - began > RUNNER_BEAT_LOOK:
            break
    return report
