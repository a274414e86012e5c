"""A fake backend for testing the supervisor's own rules in-process: no process is started.

The supervisor's rules (admission, scheduling, fault restarts, checkpoint resume, performance
alerts, heartbeat loss, stops) depend only on what the backend contract reports: a node is
running, has exited with a code, is lost, last beat at some time, wrote some log lines.  This
backend reports exactly what the test scripts, at once, so a rule test takes milliseconds of
backend time instead of a sandbox and an interpreter per node.  What is *launched* (sandboxes,
argv, environment, files, signals) is the real backends' business and is tested against them
(``tests/service/test_local_backend.py``, ``tests/ray``).

The contract's rules it keeps (``ma_jupyter.backends.base.Backend``):

1. :meth:`bind` chooses hostnames (``<role>-<index>``), loopback addresses and ports, as the
   local backend does; ports come from a counter, never reused while held.
2. :meth:`dryrun` is the node machinery's own (``nodehost.launch.node_launches``, in the
   ``symlink`` view), so a spec the real backend refuses is refused here too.
3. :meth:`launch` creates the folders the launches mark ``create`` (the job's outputs...),
   appends each node's scripted lines to the node's own log file in the job
   folder (rule 4: nodes write their own logs; the service reads them through
   :meth:`open_log`, the local backend's reader) and records the node as running.
4. :meth:`poll` answers from the script: ``running`` until the node's scripted exit code is
   due or the test ends it (:meth:`end`, :meth:`lose`); :meth:`stop` ends every running node
   of the attempt with the node's ``stop_code`` (143: killed by SIGTERM) and records the call.
5. :meth:`on_node_end`'s ``wake`` is called whenever a node ends, as rule 6 asks.

How a node behaves: ``FakeBackend(script)`` where ``script(attempt, launch)`` returns a
:class:`FakeNode`; the default runs every node to ``exit_code`` 0 with no lines.  ``attempt``
gives the job's spec, its id and its attempt number (``attempt.number``), so one script can
fail a first attempt and pass the next.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from ma_jupyter.backends.base import Attempt, Backend
from ma_jupyter.models import Job, LogStream, NodeLaunch, NodeRun
from ma_jupyter.modes.base import Placement
from ma_jupyter.nodehost import logs as job_logs
from ma_jupyter.nodehost.launch import node_launches

#: the exit code of a node ended by the stop's SIGTERM (as a shell reports it)
TERMINATED = 143


@dataclass
class FakeNode:
    """What one node of one attempt does.

    ``lines``: written to the node's log at its launch; ``exit_code``: the code it ends with at
    its first poll (None: it runs until stopped, ended by :meth:`FakeBackend.end` or lost);
    ``stop_code``: the code a stop ends it with; ``heartbeat``: what :meth:`FakeBackend.heartbeat`
    answers while it runs (None: the time of the poll, a live node).
    """

    lines: list[str] = field(default_factory=list)
    exit_code: int | None = 0
    stop_code: int = TERMINATED
    heartbeat: float | None = None


def runs_to(exit_code: int | None = 0, *lines: str) -> Callable[[Attempt, NodeLaunch], FakeNode]:
    """A script where every node of every attempt prints ``lines`` and ends with ``exit_code``."""
    return lambda attempt, launch: FakeNode(list(lines), exit_code)


class FakeBackend(Backend):
    """A backend whose nodes do what the test's script says, in this process (module docstring)."""

    name = "fake"
    poll_every = 0.02

    def __init__(self, script: Callable[[Attempt, NodeLaunch], FakeNode] | None = None) -> None:
        self.script = script or runs_to(0)
        self._lock = threading.Lock()
        self._ports = itertools.count(31000)
        self._pids = itertools.count(4_000_000)
        self.held: set[int] = set()
        #: (job id, attempt, node) -> its behaviour and its state: "running", "exited", "lost"
        self.nodes: dict[tuple[str, int, str], FakeNode] = {}
        self.states: dict[tuple[str, int, str], tuple[str, int | None]] = {}
        #: every launch (job id, attempt, node names) and every stop (job id, attempt, grace), in order
        self.launches: list[tuple[str, int, list[str]]] = []
        self.stops: list[tuple[str, int, float]] = []
        self._wake: Callable[[], None] = lambda: None

    # ------------------------------------------------------------- what a test does

    def end(self, job_id: str, node: str, exit_code: int) -> None:
        """The node of the job's latest attempt exits with ``exit_code`` now."""
        self._set(self._latest(job_id, node), "exited", exit_code)

    def write(self, job_id: str, node: str, *lines: str) -> None:
        """The running node of the job's latest attempt prints ``lines`` now."""
        from ma_jupyter import config

        self._latest(job_id, node)
        with open(config.jobdir(job_id).node_log(node), "ab") as fh:
            fh.write("".join(line + "\n" for line in lines).encode())

    def lose(self, job_id: str, node: str) -> None:
        """The node of the job's latest attempt disappears without an exit code (its machine died)."""
        self._set(self._latest(job_id, node), "lost", None)

    def running(self, job_id: str) -> list[str]:
        """The names of the job's nodes that run now (any attempt)."""
        with self._lock:
            return [
                key[2] for key, (state, _) in self.states.items() if key[0] == job_id and state == "running"
            ]

    def _latest(self, job_id: str, node: str) -> tuple[str, int, str]:
        with self._lock:
            keys = [k for k in self.states if k[0] == job_id and k[2] == node]
        if not keys:
            raise KeyError(f"{job_id}/{node} was never launched")
        return max(keys, key=lambda k: k[1])

    def _set(self, key: tuple[str, int, str], state: str, code: int | None) -> None:
        with self._lock:
            self.states[key] = (state, code)
        self._wake()

    # ------------------------------------------------------------------ the contract

    def on_node_end(self, wake: Callable[[], None]) -> None:
        self._wake = wake

    def bind(self, placement: Placement, *, reserve: bool) -> Placement:
        tasks = []
        for k, task in enumerate(placement.tasks):
            ports = (next(self._ports), next(self._ports)) if reserve else (0, 0)
            if reserve:
                with self._lock:
                    self.held.update(ports)
            tasks.append(
                replace(
                    task,
                    hostname=f"{task.role}-{task.index}",
                    address=f"127.0.1.{k + 1}",
                    ports=ports,
                    cpus=(0,),
                )
            )
        return replace(placement, tasks=tuple(tasks), remote_shell=self.remote_shell)

    def release(self, placement: Placement) -> None:
        with self._lock:
            for task in placement.tasks:
                self.held.difference_update(task.ports)

    def hold(self, placement: Placement) -> None:
        with self._lock:
            for task in placement.tasks:
                self.held.update(p for p in task.ports if p)

    def isolation(self) -> str:
        """The view :meth:`dryrun` plans (a job's events say so, as for the local backend's)."""
        return "symlink"

    def dryrun(self, attempt: Attempt) -> list[NodeLaunch]:
        return node_launches(attempt, "symlink")

    def launch(self, attempt: Attempt, launches: list[NodeLaunch]) -> list[NodeRun]:
        if len(launches) != len(attempt.plans):
            raise ValueError(f"{len(launches)} launches for the {len(attempt.plans)} nodes of the attempt")
        runs = []
        for launch in launches:
            node = self.script(attempt, launch)
            for mount in launch.mounts:
                if mount.create:  # the folders a backend creates at launch (the job's outputs...)
                    Path(mount.source).mkdir(parents=True, exist_ok=True)
            log = attempt.jobdir.node_log(launch.name)
            log.parent.mkdir(parents=True, exist_ok=True)
            with open(log, "ab") as fh:
                start = fh.tell()
                fh.write("".join(line + "\n" for line in node.lines).encode())
            key = (attempt.job_id, attempt.number, launch.name)
            with self._lock:
                self.nodes[key] = node
                self.states[key] = ("running", None)
            runs.append(
                NodeRun(
                    name=launch.name,
                    role=launch.role,
                    index=launch.index,
                    host=launch.host,
                    hostname=launch.hostname,
                    address=launch.address,
                    pid=next(self._pids),
                    start_time=time.time(),
                    primary=launch.primary,
                    state="running",
                    log_start=start,
                )
            )
        self.launches.append((attempt.job_id, attempt.number, [launch.name for launch in launches]))
        self._wake()
        return runs

    def poll(self, attempt: Attempt, run: NodeRun) -> NodeRun:
        key = (attempt.job_id, attempt.number, run.name)
        with self._lock:
            node = self.nodes.get(key)
            state, code = self.states.get(key, ("lost", None))
            if state == "running" and node is not None and node.exit_code is not None:
                state, code = self.states[key] = ("exited", node.exit_code)
        return run.model_copy(update={"state": state, "exit_code": code})

    def stop(self, attempt: Attempt, runs: list[NodeRun], grace: float) -> None:
        self.stops.append((attempt.job_id, attempt.number, grace))
        with self._lock:
            for run in runs:
                key = (attempt.job_id, attempt.number, run.name)
                if self.states.get(key, ("", None))[0] == "running":
                    self.states[key] = ("exited", self.nodes[key].stop_code)
        self._wake()

    def heartbeat(self, attempt: Attempt, run: NodeRun) -> float | None:
        key = (attempt.job_id, attempt.number, run.name)
        with self._lock:
            node = self.nodes.get(key)
        if node is None:
            return None
        return time.time() if node.heartbeat is None else node.heartbeat

    def log_streams(self, job: Job) -> list[LogStream]:
        from ma_jupyter import config

        return job_logs.log_streams(config.jobdir(job.id), [n.name for n in job.nodes])

    def open_log(self, job_id: str, node: str, rank: int | None):
        from ma_jupyter import config

        return job_logs.open_log(config.jobdir(job_id), node, rank)

    def failure(self, attempt: Attempt, run: NodeRun) -> None:
        return None
