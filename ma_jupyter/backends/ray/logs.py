"""A job log on a Ray node, read through that node's agent.

Implements :class:`~ma_jupyter.backends.base.LogSource`.  :meth:`RayLogSource.read` asks the
agent for the bytes (the agent opens the file as untrusted, as the local backend does).
:meth:`RayLogSource.size` must never block (the service's long-poll calls it on its event loop
every few milliseconds), so it answers from what it knows and keeps one
:meth:`~ma_jupyter.backends.ray.agent.NodeAgent.wait_log` call pending on the agent: that call
returns as soon as the file grows, and the next ``size()`` sees the new size.  A line printed
on a Ray node so reaches a follower within the agent's look interval plus one round trip.
"""

from __future__ import annotations

import errno
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from ...errors import RefusedFile

#: seconds one pending wait for growth lasts on the agent before it is asked again
WAIT = 2.0


class RayLogSource:
    """One log stream of a job node, on the Ray node its ``agent`` runs on.

    Args:
        agent: the node agent's actor handle.
        call: ``call(object_ref)`` -> the result, raising the backend's errors (see
            :meth:`~ma_jupyter.backends.ray.backend.RayBackend._get`).
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
