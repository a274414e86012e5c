"""The Ray cluster as the service sees it: its nodes, one node agent per node, and calls to them
(items 1, 2 and 7 of :mod:`.backend`).

1. **inventory** -- :meth:`Agents.refresh` lists the cluster's live nodes (every
   :data:`INVENTORY_EVERY` seconds on a thread of its own, :meth:`Agents.start`); a change
   replaces :attr:`Agents.nodes` and wakes the service, so a node that joins or leaves counts
   without a restart (contract rule 14).  Every Ray node seen stays known by its inventory
   name (:meth:`Agents.node` refuses one that left);
2. **agents** -- one agent per Ray node (:mod:`.agent`: a named, detached actor pinned to its
   node that takes no CPU, shared by every job), started on first sight (:meth:`Agents.agent`);
   its ``info()`` answer is kept (:meth:`Agents.info` waits up to :data:`AGENT_START` for it;
   a failed one is asked again next time);
3. **sweeps** -- the leftovers a new agent ended on its machine (rule 7 of :mod:`.backend`)
   are said once per agent, as a notice of each job node of this service's ``node_root``;
4. **calls** -- :meth:`Agents.get` gives an agent call's result with the contract's errors: the
   agent's own :class:`MaJupyterError` unchanged, :class:`NodeGone` when the agent or its node
   died, :class:`BackendUnavailable` for no answer within the timeout or another Ray failure.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...errors import BackendUnavailable, MaJupyterError, NodeGone
from ...models import Node
from .agent import NodeAgent
from .inventory import RayNode, inventory, node_name, ray_nodes

log = logging.getLogger("ma_jupyter.ray")

#: the Ray namespace of the agents and placement groups
NAMESPACE = "ma_jupyter"
INVENTORY_EVERY = 1.0  # seconds between looks at the cluster's nodes
AGENT_START = 120.0  # seconds an agent may take to start (a new worker process on its node)
CALL_TIMEOUT = 30.0  # seconds for an ordinary agent call
POLL_TIMEOUT = 3.0  # seconds for a poll (a node's state is kept when it does not answer)
AGENT_THREADS = 256  # concurrent calls per agent (waits for log growth and exits block a thread)


class Agents:
    """The rules of the module docstring, for one service connected to one cluster.

    Args:
        ray: the ``ray`` module, connected.
        node_root: the folder of job folders on every Ray node.
        wake: gives what wakes the service (None until the service asks to be woken).
        notice: gives what records a notice on a job (None until the service asks for them).

    Attributes:
        nodes: the inventory now (rule 1).
        node_root: the folder of job folders on every Ray node.
    """

    def __init__(
        self,
        ray: Any,
        node_root: Path,
        wake: Callable[[], Callable[[], None] | None],
        notice: Callable[[], Callable[[str, str | None, str], None] | None],
    ):
        self._ray = ray
        self.node_root = node_root
        self._wake = wake
        self._notice = notice
        self._agent_class = ray.remote(NodeAgent)
        self._lock = threading.Lock()
        self._agents: dict[str, Any] = {}  # node id -> actor handle
        self._infos: dict[str, concurrent.futures.Future] = {}  # node id -> info()'s answer
        self._by_name: dict[str, RayNode] = {}  # every Ray node seen, alive or not
        self.nodes: list[Node] = []
        self._swept: set[str] = set()  # Ray nodes whose agent's sweep was reported
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._watch_inventory, name="ma-ray-inventory", daemon=True)

    # ------------------------------------------------------------------- inventory

    def start(self) -> None:
        """Rule 1: look at the cluster now, then every :data:`INVENTORY_EVERY` seconds."""
        self.refresh()
        self._thread.start()

    def close(self) -> None:
        """Stop the inventory's thread (agents stay: a restarted service re-attaches to them)."""
        self._halt.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def refresh(self) -> None:
        """Look at the cluster's nodes; a change replaces the inventory list and wakes the service."""
        records = self._ray.nodes()
        found = ray_nodes(records)
        nodes = inventory(records)
        with self._lock:
            for node in found:
                self._by_name[node.name] = node
            changed = [n.model_dump() for n in nodes] != [n.model_dump() for n in self.nodes]
            if changed:
                self.nodes = nodes
        for node in found:
            if node.alive:
                self.agent(node.node_id)  # started on first sight, so its first job need not wait
        for node_id, future in list(self._infos.items()):
            if node_id not in self._swept and future.done():
                self._swept.add(node_id)
                self._report_sweep(node_id, future)
        wake = self._wake()
        if changed and wake is not None:
            wake()

    def _watch_inventory(self) -> None:
        while not self._halt.wait(INVENTORY_EVERY):
            try:
                self.refresh()
            except Exception:  # the cluster is unreachable for a moment: keep the last inventory
                log.warning("cannot list the Ray cluster's nodes", exc_info=True)

    def _report_sweep(self, node_id: str, info: concurrent.futures.Future) -> None:
        """Rule 3: an event for each job node of this service whose leftovers the new agent of
        ``node_id`` ended on its machine (rule 7 of :mod:`.backend`); the agent names each by
        its marker and folder, and only folders below this service's ``node_root`` are its
        jobs' (job ids are unique per home only)."""
        if info.exception() is not None:
            return
        for entry in info.result().get("leftovers_ended") or []:
            parts = str(entry.get("marker", "")).split("/")
            folder = Path(str(entry.get("node_dir", "")))
            ours = {self.node_root, self.node_root.resolve()}
            if len(parts) < 4 or len(folder.parents) < 3 or folder.parents[2] not in ours:
                continue
            reason = (
                f"{parts[2]}'s processes left running after its Ray node ended were ended by the agent "
                f"of Ray node {node_name(node_id)} on that machine (pids "
                f"{', '.join(str(p) for p in entry.get('pids', [])[:8])})"
            )
            log.warning("job %s: %s", parts[0], reason)
            notice = self._notice()
            if notice is not None:
                notice(parts[0], parts[2], reason)

    def node(self, name: str) -> RayNode:
        """The Ray node of an inventory name.

        Raises:
            NodeGone: no such node, or it left the cluster.
        """
        node = self._by_name.get(name)
        if node is None or not node.alive:
            raise NodeGone(f"the Ray node {name} is not in the cluster (any more)")
        return node

    def live(self) -> dict[str, RayNode]:
        """The Ray nodes alive now, by inventory name."""
        return {node.name: node for node in list(self._by_name.values()) if node.alive}

    # ---------------------------------------------------------------------- agents

    def agent(self, node_id: str) -> Any:
        """The agent of a Ray node, started on first use (one per node, shared by every job)."""
        with self._lock:
            agent = self._agents.get(node_id)
            if agent is not None:
                return agent
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            agent = self._agent_class.options(
                name=f"agent-{node_id}",
                namespace=NAMESPACE,
                lifetime="detached",  # outlives this service: jobs are re-attached through it
                get_if_exists=True,
                num_cpus=0,
                max_concurrency=AGENT_THREADS,
                max_restarts=-1,  # an agent keeps nothing in memory that its node's disk lacks
                max_task_retries=-1,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            ).remote(node_id, str(self.node_root))
            self._agents[node_id] = agent
            self._infos[node_id] = agent.info.remote().future()
            return agent

    def agent_of(self, host: str) -> Any:
        """The agent of the Ray node an inventory name means (NodeGone if it left)."""
        return self.agent(self.node(host).node_id)

    def agent_at(self, placed: dict) -> Any:
        """The agent of the Ray node in ``placed`` (NodeGone if that node left)."""
        node = self._by_name.get(placed.get("host", ""))
        if node is None or not node.alive:
            raise NodeGone(
                f"the Ray node {placed.get('host')} that ran this job node has left the cluster: "
                "its files (logs) went with it"
            )
        return self.agent(node.node_id)

    def every(self) -> list[Any]:
        """The agents started so far (each node's, alive or not)."""
        with self._lock:
            return list(self._agents.values())

    def info(self, host: str) -> dict:
        """What the agent of ``host`` reported (waits for its start)."""
        node = self.node(host)
        self.agent(node.node_id)
        try:
            return self._infos[node.node_id].result(timeout=AGENT_START)
        except concurrent.futures.TimeoutError:
            raise BackendUnavailable(
                f"the platform's agent on Ray node {host} did not start within {AGENT_START:g} s"
            ) from None
        except Exception as exc:
            with self._lock:  # ask again next time
                self._agents.pop(node.node_id, None)
                self._infos.pop(node.node_id, None)
            raise BackendUnavailable(f"the platform's agent on Ray node {host} failed: {exc}") from exc

    def answered(self, node_id: str) -> dict | None:
        """What the agent of ``node_id`` reported, where it answered already (never waits)."""
        answer = self._infos.get(node_id)
        if answer is not None and answer.done() and answer.exception() is None:
            return answer.result()
        return None

    def every_answer(self) -> list[dict]:
        """What each agent that answered reported (never waits)."""
        return [f.result() for f in list(self._infos.values()) if f.done() and f.exception() is None]

    def get(self, ref: Any, timeout: float = CALL_TIMEOUT) -> Any:
        """Rule 4: the result of an agent call, with the errors of the contract.

        Raises:
            MaJupyterError: the agent's own (InvalidSpec, RefusedFile...), unchanged.
            NodeGone: the agent or its node died.
            BackendUnavailable: no answer within ``timeout``, or another Ray failure.
        """
        exceptions = self._ray.exceptions
        try:
            return self._ray.get(ref, timeout=timeout)
        except exceptions.GetTimeoutError:
            raise BackendUnavailable(f"a Ray node did not answer within {timeout:g} s") from None
        except exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, MaJupyterError):
                raise cause from None
            raise BackendUnavailable(f"a Ray node failed: {cause or exc}") from exc
        except (exceptions.RayActorError, exceptions.NodeDiedError) as exc:
            raise NodeGone(f"a Ray node or its agent is gone: {exc}") from exc
        except exceptions.RayError as exc:  # an object lost, a worker crashed...: not the job's fault
            raise BackendUnavailable(f"a Ray call failed: {exc}") from exc
