"""Object storage downloaded on a job's Ray nodes, as the service asks and sees it (contract rule
29; each agent's side is :mod:`.objects`).

1. :meth:`Fetches.fetch` has each Ray node of a job download the prefixes itself, through its
   agent, all at once, within :data:`FETCH_TIMEOUT` seconds, saying the nodes' progress as it
   comes; the credentials travel as an argument of that one agent call (Ray keeps a task's
   arguments in its own stores and never shows them in its dashboard or state API) and are
   written nowhere;
2. what was downloaded is remembered per job: its links exist on the Ray nodes only, so the
   launches mount them from each node's job folder there (:meth:`Fetches.mounts`), not by the
   local backend's mount rules, which look at this machine;
3. :meth:`Fetches.forget` drops a job's memory of them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from ...errors import BackendUnavailable, Conflict, DiskFull, InvalidSpec
from ...jobdir import PLACEHOLDER
from ...models import Mount, RunAs
from ...workspace import folders
from ..base import Attempt, ObjectFetch
from .agents import POLL_TIMEOUT, Agents

#: seconds the agents of a placement may take to download a job's object storage prefixes
FETCH_TIMEOUT = 3600.0


class Fetches:
    """The rules of the module docstring.

    Args:
        ray: the ``ray`` module, connected.
        agents: the cluster's agents.
    """

    def __init__(self, ray: Any, agents: Agents):
        self._ray = ray
        self._agents = agents
        self._lock = threading.Lock()
        self._fetched: dict[str, set[str]] = {}  # job id -> links fetch made on the nodes

    def fetch(
        self,
        job_id: str,
        hosts: list[str],
        fetches: list[ObjectFetch],
        credentials: dict[str, str],
        account: RunAs | None,
        cancel: threading.Event,
        say: Callable[[str], None],
    ) -> bool:
        """Rule 1 (the contract's ``fetch_objects``).

        Raises:
            Conflict: the job ended (``cancel``) meanwhile.
            BackendUnavailable: a Ray node failed, with the reason (a listing or download error
                names the bucket), or did not finish in time.
            InvalidSpec, DiskFull: a Ray node's disk cannot take a download (``objects.py``
                rule 6), naming that node.
        """
        node_root = str(self._agents.node_root)
        calls = {
            host: self._agents.agent_of(host).fetch_objects.remote(
                node_root, job_id, fetches, credentials, account
            )
            for host in hosts
        }
        pending = list(calls.values())
        deadline = time.monotonic() + FETCH_TIMEOUT
        while pending:
            if cancel.is_set():
                raise Conflict(f"job {job_id} ended while its data was being downloaded on its Ray nodes")
            if time.monotonic() > deadline:
                raise BackendUnavailable(
                    f"the Ray nodes did not download the job's object storage data within {FETCH_TIMEOUT:.0f} s"
                )
            _, pending = self._ray.wait(pending, num_returns=len(pending), timeout=1.0)
            for host, ref in calls.items():  # the nodes' download progress (objects.py rule 5)
                try:
                    # a poll's wait, not a call's: a busy agent must not hold the loop's
                    # cancel and deadline checks for CALL_TIMEOUT per node
                    lines = (
                        self._agents.get(
                            self._agents.agent_of(host).fetch_progress.remote(job_id), POLL_TIMEOUT
                        )
                        if ref in pending
                        else []
                    )
                except BackendUnavailable:  # the download's own call says what failed
                    lines = []
                for line in lines:
                    say(f"{line} on Ray node {host}")
        for host, ref in calls.items():
            try:
                lines = self._agents.get(ref)
            except (DiskFull, InvalidSpec) as exc:  # objects.py rule 6: which machine's disk
                raise type(exc)(f"Ray node {host}: {exc}", field=exc.field) from None
            for line in lines:
                say(f"{line} on Ray node {host}")
        with self._lock:
            self._fetched[job_id] = {f.into for f in fetches if f.into != "outputs"}
        return True

    def mounts(self, attempt: Attempt, on_nodes: Attempt) -> tuple[Attempt, list[Mount]]:
        """Rule 2: ``on_nodes`` without the datasets and models :meth:`fetch` downloaded on the
        nodes, and their mounts: each node's link in its job folder there, read-only."""
        fetched = self._fetched.get(attempt.job_id) or set()
        if not fetched or Path(attempt.job_dir) == PLACEHOLDER.root:
            return on_nodes, []
        spec = attempt.spec

        def moved(item) -> str | None:
            try:
                relative = str(Path(item.path).relative_to(attempt.job_dir))
            except ValueError:
                return None
            return relative if relative in fetched else None

        datasets = [d for d in spec.datasets if moved(d)]
        models = [m for m in spec.models if moved(m)]
        if not datasets and not models:
            return on_nodes, []
        only = spec.model_copy(update={"datasets": datasets, "models": models})
        sources = {d.path: moved(d) for d in [*datasets, *models]}
        mounts = [
            Mount(
                source=str(on_nodes.jobdir.root / str(sources[f.path])),
                target=f.target,
                read_only=True,
                kind=f.kind,
            )
            for f in folders(only)
            if f.kind in ("dataset", "model") and f.path in sources
        ]
        rest = spec.model_copy(
            update={
                "datasets": [d for d in spec.datasets if not moved(d)],
                "models": [m for m in spec.models if not moved(m)],
            }
        )
        return replace(on_nodes, spec=rest), mounts

    def forget(self, job_id: str) -> None:
        """Rule 3."""
        with self._lock:
            self._fetched.pop(job_id, None)
