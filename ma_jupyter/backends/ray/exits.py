"""A Ray attempt's node ends, learnt as they happen (item 6 of :mod:`.backend`).

One pending ``wait_exit`` call per running job node blocks on its agent
(:meth:`.agent.NodeAgent.wait_exit`); an answer that the node ended wakes the service at once
(contract rule 11), an answer that it still runs arms the next call.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable
from typing import Any

from ...models import NodeRun
from ..base import Attempt

EXIT_WAIT = 30.0  # seconds one wait_exit call blocks before it is made again


class ExitWatch:
    """One pending ``wait_exit`` call per running job node; an answer that the node ended wakes
    the service (contract rule 11).  A thread collects the answers, so no Ray call is made from
    Ray's own callback threads.

    Args:
        agent_of: the agent of a Ray node by inventory name (:meth:`.agents.Agents.agent_of`).
        wake: gives what wakes the service (None until the service asks to be woken).
    """

    def __init__(self, agent_of: Callable[[str], Any], wake: Callable[[], Callable[[], None] | None]):
        self._agent_of = agent_of
        self._wake = wake
        self._lock = threading.Lock()
        self._pending: dict[concurrent.futures.Future, tuple[Attempt, NodeRun]] = {}
        self._keys: set[tuple[str, int, str]] = set()
        self._added = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="ma-ray-exits", daemon=True)
        self._thread.start()

    def watch(self, on_nodes: Attempt, run: NodeRun) -> None:
        """Wait for the end of ``run`` (once per node of an attempt)."""
        key = (on_nodes.job_id, on_nodes.number, run.name)
        with self._lock:
            if self._closed or key in self._keys:
                return
            self._keys.add(key)
        self._arm(on_nodes, run)

    def _arm(self, on_nodes: Attempt, run: NodeRun) -> None:
        try:
            agent = self._agent_of(run.host)
            future = agent.wait_exit.remote(on_nodes, run, EXIT_WAIT).future()
        except Exception:  # the node is gone: the service's poll finds it lost
            self._ended(on_nodes, run)
            return
        with self._lock:
            self._pending[future] = (on_nodes, run)
        self._added.set()

    def _ended(self, on_nodes: Attempt, run: NodeRun) -> None:
        with self._lock:
            self._keys.discard((on_nodes.job_id, on_nodes.number, run.name))
        wake = self._wake()
        if wake is not None:
            wake()

    def _run(self) -> None:
        while not self._closed:
            with self._lock:
                futures = list(self._pending)
            if not futures:
                self._added.wait(0.5)
                self._added.clear()
                continue
            done, _ = concurrent.futures.wait(
                futures, timeout=0.5, return_when=concurrent.futures.FIRST_COMPLETED
            )
            for future in done:
                with self._lock:
                    on_nodes, run = self._pending.pop(future)
                try:
                    ended = bool(future.result())
                except Exception:
                    ended = True  # the agent failed: let the poll decide
                if ended:
                    self._ended(on_nodes, run)
                elif not self._closed:
                    self._arm(on_nodes, run)

    def close(self) -> None:
        self._closed = True
        self._added.set()
