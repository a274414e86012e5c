"""The Ray backend: the same jobs, on the nodes of an existing Ray cluster.

The service connects to the cluster as a Ray driver (``ray.init(address=...)``) and:

1. **inventory** -- lists the cluster's live nodes every :data:`INVENTORY_EVERY` seconds
   (:mod:`.inventory`); the scheduler places on them, so a node that joins or leaves counts
   without a restart (contract rule 14);
2. **agents** -- keeps one node agent per Ray node (:mod:`.agent`: a named, detached actor pinned
   to its node that takes no CPU), created on first sight; every job node on that Ray node is
   started, watched, stopped and read through it;
3. **bind** -- for a real attempt, reserves the scheduler's nodes as one Ray placement group
   named ``ma-<home tag>-<job id>-<nonce>`` (detached, so it outlives a service restart; the
   tag keeps services of different homes apart; a group of the same job an earlier service
   left unrecorded is removed first): one bundle per job node
   (its CPUs, memory and cards), each pinned to its inventory node by Ray's ``ray.io/node-id`` label,
   ``STRICT_SPREAD`` when every job node has its own Ray node (workers and the chief always do;
   parameter servers and batch tasks may share a node, then ``SPREAD``).  The group is created
   only for a placement the scheduler found free, and is removed again when Ray cannot reserve
   it within :data:`RESERVE_WAIT` seconds (other users of the cluster hold the resources): bind
   then gives None and the job waits in the queue holding nothing (contract rule 15).  The agents hand
   out ports free on their nodes; addresses are the Ray nodes' own;
4. **dry run and launch** -- each job node runs the local backend's node runner in the same
   sandbox on its Ray node, in the node's job folder on that machine (``node_root/<job id>``;
   ``node_root`` defaults to this service's ``jobs/`` folder, at the same path on every node).
   The algorithm folder is shipped (:mod:`.ship`): packed once per attempt into Ray's object
   store and unpacked by each agent into the node's own folder (``nodes/<node>/algorithm``),
   from which the node's working copy at ``/workspace/algorithm`` is made (or which it shows
   itself, when the algorithm is mounted writable or is too big for a copy).  Every other host path a job names (datasets, models, outputs, volumes) and the image (the
   Python environment, with this package) must exist at the same path on every Ray node (a
   node lacking one refuses the launch naming it: :mod:`.node_paths`); datasets and models in
   object storage are downloaded on each Ray node instead (:meth:`RayBackend.fetch_objects`,
   :mod:`.objects`), and the job's own outputs folder comes back to this machine while the
   nodes write it (:mod:`.outputs_return`);
5. **logs** -- read through the agents (:mod:`.logs`); which Ray node holds a job node's files
   is kept in the service's job folder (``nodes/<node>/placed.json``), so a restarted service
   still reads the logs of jobs that ended.  Once that Ray node is gone, its files are read
   from this machine where they are readable here at the same path (shared storage: the node's
   ``marker`` file there names that very launch), else a read raises :class:`NodeLost`
   (``node_lost``, never retried) naming the node and why;
6. **ends** -- one ``wait_exit`` call per running node blocks on its agent; its answer wakes
   the service, so a node's end is handled at once (contract rule 11; :mod:`.exits`);
7. **a lost Ray node** -- a job node's processes never outlive the Ray node that hosts them:
   its runner watches that node's raylet and ends the node (TERM, then KILL) within seconds of
   the raylet's end, writing what it ended as the node's failure report; an agent, at its start
   and before it takes work, kills what runners of dead raylets left on its machine (see
   :mod:`.leftovers`).  The node is ``lost`` to the service, and its failure says what was
   ended where that report is readable here (shared storage).
8. **dev environments** -- a dev environment's kernel is reached through a relay that the agent
   of its Ray node starts for it and closes with its node (:meth:`RayBackend.kernel_route`,
   :mod:`.kernel_relay`): a Unix socket connects processes of one machine only.

MPI's remote shell (``Placement.remote_shell``) is given by ``bind`` on an overlay only
(:mod:`.overlay_plan`: each node's sshd at its own overlay address); a fenced attempt has none,
and the horovod mode refuses it at submit saying so.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import logging
import secrets
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from ... import config
from ...errors import (
    BackendUnavailable,
    Conflict,
    InvalidSpec,
    MaJupyterError,
    NodeGone,
    NodeLost,
    RefusedFile,
)
from ...jobdir import PLACEHOLDER, JobDir, check_node_name
from ...models import (
    CacheInfo,
    Job,
    JobSpec,
    KernelRelay,
    KernelRoute,
    LogStream,
    Mount,
    Node,
    NodeLaunch,
    NodeRun,
    RunAs,
    is_object_uri,
)
from ...modes.base import NodePlan, Placement, TaskSlot
from ...nodehost import caches, prepare
from ...nodehost import logs as local_logs
from ...nodehost import overlay as job_overlay
from ...nodehost.code import python_sources
from ...nodehost.host import NodeHost
from ...nodehost.host_policy import load_policy
from ...nodehost.launch import node_launches
from ...nodehost.mounts import WORKDIR_KIND, mounts_for
from ...nodehost.overlay import Overlay
from ...untrusted import read_small
from ...workspace import folders
from ..base import Attempt, Backend, DatasetState, ObjectFetch
from . import egress_gate, fence, overlay_plan, ship
from .agent import NodeAgent
from .exits import ExitWatch
from .inventory import ACCELERATORS, RayNode, inventory, node_name, ray_nodes
from .logs import RayLogSource
from .network_check import AgentAnswers
from .outputs_return import FINAL_WAIT, OutputsReturn

log = logging.getLogger("ma_jupyter.ray")

#: the Ray namespace of the agents and placement groups
NAMESPACE = "ma_jupyter"
#: Ray's label naming a node by id (placement group bundles are pinned with it)
NODE_LABEL = "ray.io/node-id"
INVENTORY_EVERY = 1.0  # seconds between looks at the cluster's nodes
RESERVE_WAIT = 2.0  # seconds a placement group may take to be reserved before the job waits
AGENT_START = 120.0  # seconds an agent may take to start (a new worker process on its node)
CALL_TIMEOUT = 30.0  # seconds for an ordinary agent call
POLL_TIMEOUT = 3.0  # seconds for a poll (a node's state is kept when it does not answer)
LAUNCH_TIMEOUT = 180.0  # seconds for an agent to unpack the algorithm and start a node
AGENT_THREADS = 256  # concurrent calls per agent (waits for log growth and exits block a thread)
#: seconds the agents of a placement may take to download a job's object storage prefixes
FETCH_TIMEOUT = 3600.0
#: bytes up to which the shipped algorithm folder travels inside the launch calls (below Ray's
#: limit for arguments it inlines, 100 KiB)
INLINE_ARCHIVE = 64 << 10

RAY_MISSING = (
    "the ray backend needs Ray, which is not installed here: pip install ma_jupyter[ray] "
    "(or pip install 'ray[default]')"
)


def require_ray() -> Any:
    """The ``ray`` module; BackendUnavailable naming the extra to install when it is missing."""
    try:
        import ray
    except ImportError:
        raise BackendUnavailable(RAY_MISSING) from None
    return ray


class RayBackend(Backend):
    """Runs each job node on a node of a Ray cluster (see the module docstring).

    Args:
        address: the cluster's address (``HOST:PORT`` of its GCS, or ``auto``).
        node_root: the folder of job folders on every Ray node (default: this service's
            ``jobs/`` folder path).
        network: ``auto`` (each attempt on an overlay of namespaces where its machines can
            make them, else fenced) or ``fence`` (always fenced): docs/network.md.

    Raises:
        BackendUnavailable: Ray is not installed, or the cluster does not answer.
    """

    name = "ray"
    # a poll is a call to the node's agent; ends are pushed by the pending wait_exit calls
    # (contract rule 11), which also answer when a node or its agent dies, so polls are a safety net:
    # one per node every 5 s.  Each call costs the service and the agent a few ms of CPU (Ray's
    # actor call path), taken from the jobs on the same machines; a cluster running a thousand
    # job nodes would take ten thousand calls a second at the local backend's pace.
    poll_every = 5.0

    def __init__(self, address: str, node_root: str | None = None, network: str = "auto"):
        ray = require_ray()
        self._ray = ray
        try:
            ray.init(
                address=address,
                namespace=NAMESPACE,
                log_to_driver=False,
                logging_level=logging.WARNING,
                configure_logging=False,
            )
        except Exception as exc:  # ConnectionError, RuntimeError, ValueError depending on the failure
            raise BackendUnavailable(f"cannot connect to the Ray cluster at {address}: {exc}") from exc
        self._address = address
        self._network = network
        if network == "auto":  # said once: jobs that download or install at run time fail there
            log.info(
                "jobs on Ray run in network namespaces of their own where the agents can make them: "
                'no outbound network (network = "fence" under [backend] keeps the machines\' network)'
            )
        self._fenced_hosts: set[str] = set()  # hosts whose fallback to the fence was logged
        # names this service's placement groups apart from those of services of other homes
        # sharing the cluster (job ids are unique per home only)
        where = f"{socket.gethostname()}:{config.home()}"
        self._tag = hashlib.sha256(where.encode()).hexdigest()[:6]
        self._node_root = Path(node_root) if node_root else config.jobs_root()
        self._agent_class = ray.remote(NodeAgent)
        self._lock = threading.Lock()
        self._agents: dict[str, Any] = {}  # node id -> actor handle
        # runs the jobs' TensorBoards on this machine (start_outputs_reader); made on first use
        self._here: NodeHost | None = None
        self._infos: dict[str, concurrent.futures.Future] = {}  # node id -> info()'s answer
        self._by_name: dict[str, RayNode] = {}  # every Ray node seen, alive or not
        self._cards_task: Any = None  # the remote function reading a bundle's card ids
        self._nodes: list[Node] = []
        self._placed: dict[tuple[str, str], dict] = {}  # (job id, node) -> placed.json
        self._wake: Callable[[], None] | None = None
        self._notice: Callable[[str, str | None, str], None] | None = None
        self._swept: set[str] = set()  # Ray nodes whose agent's sweep was reported
        self._halt = threading.Event()
        self._exits = ExitWatch(self)
        # outputs of nodes whose job folder this machine does not see (.outputs_return)
        self._returns = OutputsReturn(self._get, lambda: self._wake)
        self._fetched: dict[str, set[str]] = {}  # job id -> links fetch_objects made on the nodes
        self._network_answers = AgentAnswers()  # network_fault's (.network_check)
        self._refresh()
        self._thread = threading.Thread(target=self._watch_inventory, name="ma-ray-inventory", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------- inventory

    def _refresh(self) -> None:
        """Look at the cluster's nodes; a change replaces the inventory list and wakes the service."""
        records = self._ray.nodes()
        found = ray_nodes(records)
        nodes = inventory(records)
        with self._lock:
            for node in found:
                self._by_name[node.name] = node
            changed = [n.model_dump() for n in nodes] != [n.model_dump() for n in self._nodes]
            if changed:
                self._nodes = nodes
        for node in found:
            if node.alive:
                self._agent(node.node_id)  # started on first sight, so its first job need not wait
        for node_id, future in list(self._infos.items()):
            if node_id not in self._swept and future.done():
                self._swept.add(node_id)
                self._report_sweep(node_id, future)
        if changed and self._wake is not None:
            self._wake()

    def _watch_inventory(self) -> None:
        while not self._halt.wait(INVENTORY_EVERY):
            try:
                self._refresh()
            except Exception:  # the cluster is unreachable for a moment: keep the last inventory
                log.warning("cannot list the Ray cluster's nodes", exc_info=True)

    def inventory(self) -> list[Node]:
        return self._nodes

    def _report_sweep(self, node_id: str, info: concurrent.futures.Future) -> None:
        """An event for each job node of this service whose leftovers the new agent of
        ``node_id`` ended on its machine (rule 7); the agent names each by its marker and folder,
        and only folders below this service's ``node_root`` are its jobs' (job ids are unique
        per home only)."""
        if info.exception() is not None:
            return
        for entry in info.result().get("leftovers_ended") or []:
            parts = str(entry.get("marker", "")).split("/")
            folder = Path(str(entry.get("node_dir", "")))
            ours = {self._node_root, self._node_root.resolve()}
            if len(parts) < 4 or len(folder.parents) < 3 or folder.parents[2] not in ours:
                continue
            reason = (
                f"{parts[2]}'s processes left running after its Ray node ended were ended by the agent "
                f"of Ray node {node_name(node_id)} on that machine (pids "
                f"{', '.join(str(p) for p in entry.get('pids', [])[:8])})"
            )
            log.warning("job %s: %s", parts[0], reason)
            if self._notice is not None:
                self._notice(parts[0], parts[2], reason)

    def _node(self, name: str) -> RayNode:
        """The Ray node of an inventory name.

        Raises:
            NodeGone: no such node, or it left the cluster.
        """
        node = self._by_name.get(name)
        if node is None or not node.alive:
            raise NodeGone(f"the Ray node {name} is not in the cluster (any more)")
        return node

    # ---------------------------------------------------------------------- agents

    def _agent(self, node_id: str) -> Any:
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
            ).remote(node_id, str(self._node_root))
            self._agents[node_id] = agent
            self._infos[node_id] = agent.info.remote().future()
            return agent

    def _agent_of(self, host: str) -> Any:
        """The agent of the Ray node an inventory name means (NodeGone if it left)."""
        return self._agent(self._node(host).node_id)

    def _info(self, host: str) -> dict:
        """What the agent of ``host`` reported (waits for its start)."""
        node = self._node(host)
        self._agent(node.node_id)
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

    def _get(self, ref: Any, timeout: float = CALL_TIMEOUT) -> Any:
        """The result of an agent call, with the errors of the contract.

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

    # ------------------------------------------------------------------------ bind

    def bind(self, placement: Placement, *, reserve: bool) -> Placement | None:
        """Each task named ``<role>-<index>``, at its own overlay address with MPI's remote
        shell over the overlay (:mod:`.overlay_plan`), or fenced at its Ray node's address with
        none; with ``reserve``, the placement group holding the nodes and two ports per task
        from the nodes' agents."""
        nodes = [self._node(task.host) for task in placement.tasks]
        # the Ray nodes' own addresses are not reachable from inside the job's namespaces
        hosts = [task.host for task in placement.tasks]
        shell = None
        if self._job_network(hosts):
            addresses = overlay_plan.task_addresses(len(hosts))
            infos = [self._info(host) for host in dict.fromkeys(hosts)]  # answered: _job_network waited
            shell = overlay_plan.remote_shell(infos, self._runs_as_root(placement.creator))
        else:
            addresses = [node.address for node in nodes]
        tasks = [
            replace(task, hostname=task.name, address=address, ports=(0, 0), cpus=())
            for task, address in zip(placement.tasks, addresses, strict=True)
        ]
        bound = replace(placement, tasks=tuple(tasks), remote_shell=shell, reservation="")
        if not reserve:
            return bound
        from ray.util.placement_group import placement_group, remove_placement_group

        prefix = f"ma-{self._tag}-{placement.job_id}-"
        self._remove_groups(prefix)
        name = prefix + secrets.token_hex(4)
        hosts = [t.host for t in tasks]
        group = placement_group(
            [_bundle(task, node) for task, node in zip(tasks, nodes, strict=True)],
            strategy="STRICT_SPREAD" if len(set(hosts)) == len(hosts) else "SPREAD",
            name=name,
            lifetime="detached",  # a restarted service finds it by name (the stored reservation)
            bundle_label_selector=[{NODE_LABEL: node.node_id} for node in nodes],
        )
        if not group.wait(RESERVE_WAIT):
            remove_placement_group(group)  # never hold part of a job's nodes while it waits
            log.info("job %s: Ray could not reserve %s now; it waits", placement.job_id, ", ".join(hosts))
            return None
        refs = [self._agent(node.node_id).ports.remote(2, placement.port_range) for node in nodes]
        try:
            ports = [tuple(self._get(ref, AGENT_START)) for ref in refs]
            cards = self._card_ids(group, tasks, nodes)
        except BaseException:
            remove_placement_group(group)
            raise
        tasks = [
            replace(
                task,
                ports=p,
                devices=ids or task.devices,
                # real cards of the Ray node's machine where it shows their device nodes: bound
                # there by the agent's start (launch.with_machine_cards)
                card_type=ACCELERATORS.get(node.accelerator or "", "") if task.devices else "",
            )
            for task, node, p, ids in zip(tasks, nodes, ports, cards, strict=True)
        ]
        return replace(bound, tasks=tuple(tasks), reservation=name)

    def _runs_as_root(self, creator: str | None) -> bool:
        """Whether ``creator``'s job nodes run as root on the agents (root, as overlays need):
        the host rules keep them in the agents' account.  A user whose account cannot be settled
        is not root (the launch refuses the job)."""
        try:
            return self.job_account(creator) is None
        except InvalidSpec:
            return False

    def _card_ids(
        self, group: Any, tasks: list[TaskSlot], nodes: list[RayNode]
    ) -> list[tuple[int, ...] | None]:
        """The cards Ray assigned to each task's bundle (its GPU/NPU ids on the Ray node), read by
        a task that asks for all of the bundle's cards inside it; None for a task without cards
        (and an empty tuple where Ray keeps no ids for the resource: the scheduler's stay).

        The job node then gets exactly those cards, never indices chosen apart from Ray, so it
        cannot collide with other Ray work on the same machine (Ray gives each bundle's card
        instances to one holder at a time)."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        refs: list[Any] = []
        for index, (task, node) in enumerate(zip(tasks, nodes, strict=True)):
            if not task.devices or not node.accelerator:
                refs.append(None)
                continue
            strategy = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index)
            options = {"num_cpus": 0, "resources": {node.accelerator: float(len(task.devices))}}
            if node.accelerator == "GPU":
                options = {"num_cpus": 0, "num_gpus": float(len(task.devices))}
            if self._cards_task is None:
                self._cards_task = self._ray.remote(_assigned_cards)
            refs.append(
                self._cards_task.options(scheduling_strategy=strategy, **options).remote(node.accelerator)
            )
        return [None if ref is None else tuple(self._get(ref, AGENT_START)) for ref in refs]

    def _remove_groups(self, prefix: str) -> None:
        """Remove this home's placement groups of a job about to be bound: a job in the queue
        holds none, so any found is what a service killed between reserving it and recording the
        placement left behind."""
        from ray.util import placement_group_table
        from ray.util.placement_group import get_placement_group, remove_placement_group

        for group in placement_group_table().values():
            if group.get("name", "").startswith(prefix) and group.get("state") != "REMOVED":
                try:
                    remove_placement_group(get_placement_group(group["name"]))
                    log.warning("removed the placement group %s left by an earlier service", group["name"])
                except ValueError:
                    pass

    def job_folders_free(self, host: str) -> tuple[str, int] | None:
        """Asked of the node's agent within :data:`POLL_TIMEOUT` seconds (None: it did not
        answer, or the node is gone)."""
        try:
            free = self._get(self._agent_of(host).job_folders_free.remote(str(self._node_root)), POLL_TIMEOUT)
        except MaJupyterError:
            return None
        return None if free is None else (str(self._node_root), free)

    def card_fault(self, task: TaskSlot) -> str | None:
        """Asked of the node's agent (the local backend's check on that machine) within
        :data:`POLL_TIMEOUT` seconds; None for a task without real cards, or when it does not
        answer (a node that is gone is found by its runners' ends)."""
        if not task.card_type:
            return None
        try:
            return self._get(self._agent_of(task.host).card_fault.remote(task), POLL_TIMEOUT)
        except MaJupyterError:
            return None

    def network_fault(self, host: str) -> str | None:
        """The last answer of the node's agent (:mod:`.network_check`), never waiting for one;
        None on a fenced cluster (its jobs share their machines' networks)."""
        if self._network == "fence":
            return None
        return self._network_answers.fault(
            host, lambda: self._agent_of(host).network_fault.remote(self._node(host).address).future()
        )

    def code_sources(self, spec: JobSpec) -> dict[str, str] | None:
        """The algorithm folder's Python files, read here: the folder is shipped from this
        machine, so what the nodes run is what is read (see :func:`ma_jupyter.nodehost.code.python_sources`)."""
        return python_sources(Path(spec.algorithm)) if spec.algorithm else None

    def caches(self, user: str | None, *, every_user: bool = False) -> list[CacheInfo]:
        """Each user's caches on the Ray nodes, added up per user: every machine keeps its own
        copy (at this service's cache path, the one the launches mount), shared by the Ray
        nodes on it; ``path`` says on how many machines it lies."""
        with self._lock:
            agents = list(self._agents.values())
        base = str(caches.root())
        found: dict[str, dict[str, CacheInfo]] = {}
        for ref in [agent.caches.remote(base, user, every_user) for agent in agents]:
            try:
                machine, items = self._get(ref)
            except (NodeGone, BackendUnavailable):
                continue  # a node that left took its cache with it
            for item in items:
                info = CacheInfo.model_validate(item)
                found.setdefault(info.user, {})[machine] = info
        return [
            CacheInfo(
                user=name,
                path=f"{next(iter(parts.values())).path} on {len(parts)} machine(s)",
                bytes=sum(p.bytes for p in parts.values()),
                files=sum(p.files for p in parts.values()),
            )
            for name, parts in sorted(found.items())
        ]

    def clear_cache(self, user: str | None) -> None:
        """Empty ``user``'s cache on every Ray node the service knows."""
        with self._lock:
            agents = list(self._agents.values())
        base = str(caches.root())
        for ref in [agent.clear_cache.remote(base, user) for agent in agents]:
            try:
                self._get(ref)
            except NodeGone:
                continue

    def start_outputs_reader(
        self, job: Job, argv: list[str], env: dict[str, str], output: int | None = None
    ) -> subprocess.Popen:
        """On the service's machine, over the job's outputs folder there (the path every Ray node
        writes at), by a :class:`.NodeHost` of that machine as the local backend runs it: the
        job's account, a sandbox showing only that folder, read-only."""
        with self._lock:
            if self._here is None:
                self._here = NodeHost()
            here = self._here
        return here.start_outputs_reader(job, argv, env, output)

    def job_account(self, user: str | None) -> RunAs | None:
        """The account of ``user``'s jobs by the service machine's host rules, where the algorithm
        folders are read and packed (each Ray node's agent applies the same rules there)."""
        found = load_policy().run_as(user)
        return None if found is None else RunAs(name=found.name, uid=found.uid, gid=found.gid)

    def look_at_dataset(self, user: str | None, source: str) -> DatasetState:
        """The dataset's state read as the job's account on the service's machine, where the
        copies are made (see ``service/prepared.py``)."""
        return DatasetState(*prepare.look_at_dataset(user, source))

    def copy_dataset(
        self, user: str | None, source: str, into: Path, cancel: threading.Event | None = None
    ) -> DatasetState:
        """The copy made as the job's account on the service's machine."""
        return DatasetState(*prepare.copy_dataset(user, source, into, cancel))

    def forget(self, job_id: str) -> None:
        """Ask every agent to remove the job's folder on its node (``node_root/<job id>``): a
        job node's files stay on the Ray node that ran it, which is not this machine, or is
        but with ``node_root`` apart from the service's job folders.  Fire and forget: an
        agent that is gone has nothing left to remove that anyone reads."""
        with self._lock:
            agents = list(self._agents.values())
            self._fetched.pop(job_id, None)
        for agent in agents:
            agent.remove_job.remote(str(self._node_root), job_id)

    def release(self, placement: Placement) -> None:
        """Give the ports back to the agents and remove the placement group."""
        for task in placement.tasks:
            if any(task.ports):
                try:
                    self._agent_of(task.host).release_ports.remote(list(task.ports))
                except NodeGone:
                    pass
        if placement.reservation:
            from ray.util.placement_group import get_placement_group, remove_placement_group

            try:
                remove_placement_group(get_placement_group(placement.reservation))
            except ValueError:  # already gone
                pass

    def hold(self, placement: Placement) -> None:
        """Declare the placement's ports to the agents again (its placement group is detached:
        it still holds the nodes)."""
        for task in placement.tasks:
            try:
                self._agent_of(task.host).hold_ports.remote(list(task.ports))
            except NodeGone:
                pass

    # -------------------------------------------------------------- dry run, launch

    def isolation(self) -> str:
        """``bubblewrap`` when every known Ray node has it, else ``symlink``."""
        kinds = set()
        for future in list(self._infos.values()):
            if future.done() and future.exception() is None:
                kinds.add(future.result().get("isolation"))
        return "symlink" if "symlink" in kinds else "bubblewrap"

    def _on_nodes(self, attempt: Attempt) -> Attempt:
        """The attempt with its job folder on the Ray nodes (``node_root/<job id>``)."""
        if Path(attempt.job_dir) == PLACEHOLDER.root:
            return attempt
        return replace(attempt, job_dir=self._node_root / attempt.job_id)

    def dryrun(self, attempt: Attempt) -> list[NodeLaunch]:
        """The local backend's launches, each in its Ray node's isolation, with the job folder on
        the nodes and the algorithm folder shipped into each node's own folder."""
        on_nodes = self._on_nodes(attempt)
        on_nodes, fetched = self._fetched_mounts(attempt, on_nodes)
        kinds = [self._info(plan.task.host).get("isolation", "bubblewrap") for plan in attempt.plans]
        made = {kind: node_launches(on_nodes, kind) for kind in set(kinds)}
        launches = []
        for i, (plan, kind) in enumerate(zip(attempt.plans, kinds, strict=True)):
            launch = made[kind][i]
            if fetched:
                launch = launch.model_copy(update={"mounts": [*launch.mounts, *fetched]})
            launches.append(self._shipped(on_nodes, plan, launch))
        return launches

    def _fetched_mounts(self, attempt: Attempt, on_nodes: Attempt) -> tuple[Attempt, list[Mount]]:
        """``on_nodes`` without the datasets and models :meth:`fetch_objects` downloaded on the
        nodes (their links exist on the Ray nodes only, so the local backend's mount rules,
        which look at this machine, are not theirs), and their mounts: each node's link in its
        job folder there, read-only."""
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

    def fetch_objects(
        self,
        job_id: str,
        hosts: list[str],
        fetches: list[ObjectFetch],
        credentials: dict[str, str],
        account: RunAs | None,
        cancel: threading.Event,
        say: Callable[[str], None],
    ) -> bool:
        """Contract rule 29: each Ray node of ``hosts`` downloads the prefixes itself, through
        its agent (:mod:`.objects`), all at once, within :data:`FETCH_TIMEOUT` seconds.

        The credentials travel as an argument of that one agent call (Ray keeps a task's
        arguments in its own stores and never shows them in its dashboard or state API, which
        list tasks by name and state); the agent uses them for that call only, writing them
        nowhere.

        Raises:
            Conflict: the job ended (``cancel``) meanwhile.
            BackendUnavailable: a Ray node failed, with the reason (a listing or download error
                names the bucket), or did not finish in time.
        """
        calls = {
            host: self._agent_of(host).fetch_objects.remote(
                str(self._node_root), job_id, fetches, credentials, account
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
                        self._get(self._agent_of(host).fetch_progress.remote(job_id), POLL_TIMEOUT)
                        if ref in pending
                        else []
                    )
                except BackendUnavailable:  # the download's own call says what failed
                    lines = []
                for line in lines:
                    say(f"{line} on Ray node {host}")
        for host, ref in calls.items():
            for line in self._get(ref):
                say(f"{line} on Ray node {host}")
        with self._lock:
            self._fetched[job_id] = {f.into for f in fetches if f.into != "outputs"}
        return True

    def _shipped(self, on_nodes: Attempt, plan: NodePlan, launch: NodeLaunch) -> NodeLaunch:
        """``launch`` reading the algorithm folder from the node's own shipped copy: the source of
        an algorithm mount shown itself (writable, or too big for a working copy), or the
        original a working copy is made from."""
        mounts = []
        copy = str(_ship_target(on_nodes, launch.name))
        for mount in launch.mounts:
            original = _shipped_original(mount)
            if original is not None:
                size = ship.folder_size(original)
                field = "source" if mount.kind == "algorithm" else "copy_of"
                mount = Mount(**{**mount.model_dump(), field: copy})
                note = f"algorithm folder ({size / 1e6:.1f} MB) shipped to Ray node {plan.task.host}: {copy}"
                launch = launch.model_copy(update={"notes": [*launch.notes, note]})
            mounts.append(mount)
        return launch.model_copy(update={"mounts": mounts})

    def _algorithm_source(self, on_nodes: Attempt, plan: NodePlan) -> str | None:
        """The folder on this machine that a node's algorithm mount ships (None: no such mount)."""
        mounts = mounts_for(
            on_nodes.spec,
            job_dir=on_nodes.jobdir.root,
            outputs_subdir=plan.outputs_subdir,
            algorithm=plan.algorithm,
            policy=load_policy(),
        )
        return next((m.source for m in mounts if m.kind == "algorithm"), None)

    def launch(self, attempt: Attempt, launches: list[NodeLaunch]) -> list[NodeRun]:
        if len(launches) != len(attempt.plans):
            raise ValueError(f"{len(launches)} launches for the {len(attempt.plans)} nodes of the attempt")
        # without the datasets and models downloaded on the nodes (as the dry run made them)
        on_nodes, _ = self._fetched_mounts(attempt, self._on_nodes(attempt))
        job_secret = secrets.token_hex(16)  # shared by this attempt's nodes only (see NodeHost.launch)
        # the network (docs/network.md): bind gave overlay addresses where every machine of the
        # attempt can hold its namespace; else each node is fenced off the cluster's ports
        # (see .fence), read once per attempt
        overlays = self._overlays(attempt)
        overlays = egress_gate.gated(overlays, on_nodes, self._ray)  # [network] egress: the agents' gates
        cluster_ports = None if overlays else fence.cluster_ports(self._ray)
        archives: dict[str, Any] = {}  # one packed folder per algorithm source
        by_host: dict[str, list[tuple[NodeLaunch, str | None, str]]] = {}
        for plan, launch in zip(attempt.plans, launches, strict=True):
            source = None
            shipped = _ship_target(on_nodes, launch.name)
            if any(m.source == str(shipped) or m.copy_of == str(shipped) for m in launch.mounts):
                source = self._algorithm_source(on_nodes, plan)
                if source is not None and source not in archives:
                    packed = ship.pack(source)
                    # A small archive travels inside each call (Ray inlines small arguments):
                    # fetching an object from another node's store costs a round trip of
                    # ~15 ms, on the start of every node but the first.  A big one is put in
                    # the object store once and fetched by each machine that unpacks it.
                    archives[source] = packed if len(packed) <= INLINE_ARCHIVE else self._ray.put(packed)
            by_host.setdefault(plan.task.host, []).append((launch, source, str(shipped)))
        calls = []
        for host, items in by_host.items():
            # each machine gets the archives its own nodes unpack, as top-level arguments (Ray
            # resolves those, not references inside a list)
            used = list(dict.fromkeys(source for _, source, _ in items if source is not None))
            calls.append(
                self._agent_of(host).launch.remote(
                    on_nodes,
                    [launch for launch, _, _ in items],
                    job_secret,
                    [(None if source is None else used.index(source), folder) for _, source, folder in items],
                    cluster_ports,
                    overlays[host] if overlays else None,
                    *(archives[source] for source in used),
                )
            )
        runs: list[NodeRun] = []
        error: BaseException | None = None
        for ref in calls:
            try:
                runs.extend(self._get(ref, LAUNCH_TIMEOUT))
            except Exception as exc:
                error = error or exc
        if error is not None:
            # all or nothing: stop every node of the attempt, those that answered by their pids
            # too, the others by name (a launch whose answer was lost may still have started
            # its node: its processes carry its marker)
            arrived = {run.name: run for run in runs}
            everyone = [arrived.get(p.name) or NodeRun(name=p.name, host=p.task.host) for p in attempt.plans]
            try:
                self.stop(attempt, everyone, grace=1.0)
            finally:
                raise error
        order = {p.name: i for i, p in enumerate(attempt.plans)}
        runs.sort(key=lambda run: order[run.name])
        for run in runs:
            self._record(attempt, run)
            self._exits.watch(on_nodes, run)
            self._return_outputs(attempt, run)
        return runs

    def _return_outputs(self, attempt: Attempt, run: NodeRun) -> None:
        """Bring ``run``'s outputs back to this machine while it runs (:mod:`.outputs_return`):
        the job's own outputs folder (none named, or outputs in object storage), where the node
        writes it elsewhere than this service's outputs folder or on a machine whose job
        folder this one does not see."""
        key = (attempt.job_id, attempt.number, run.name)
        spec = attempt.spec
        if self._returns.watched(key) or (spec.outputs and not is_object_uri(spec.outputs)):
            return
        if Path(attempt.job_dir) == PLACEHOLDER.root:
            return
        on_nodes = self._on_nodes(attempt)
        here = Path(config.outputs_folder(attempt.job_id, spec.outputs))
        placed = self._where(attempt.job_id, run.name)
        if placed is None:
            return
        if on_nodes.jobdir.outputs == here and self._shared(attempt.job_id, run.name, placed) is not None:
            return  # the very folder, seen here
        try:
            agent = self._agent_at(placed)
        except NodeGone:
            return
        self._returns.watch(
            key, agent, str(on_nodes.jobdir.outputs), here, config.jobdir(attempt.job_id).root
        )

    def _job_network(self, hosts: list[str]) -> bool:
        """Whether an attempt on ``hosts`` gets an overlay (docs/network.md), in this order:

        1. never where the cluster file says ``network = "fence"``;
        2. every host's agent can make one, and every host's address is IPv4 and outside the
           overlay's range (``10.253.0.0/16``: a machine's own address there would be taken
           for an overlay address);
        3. and so can every other live Ray node's agent that answered already: a cluster is
           all overlay or all fenced, since a fenced job shares its machine's network, from
           which it could send frames to the overlays' UDP ports.

        The agents of ``hosts`` are waited for (as the dry run's launches wait for them): a
        submit just after the service's start must not be planned fenced, and so refused as an
        MPI job, for an agent still starting.  A host that cannot is logged once, with why; the
        attempt is then fenced.
        """
        if self._network == "fence":
            return False
        live = {node.name: node for node in self._by_name.values() if node.alive}
        for host in dict.fromkeys([*hosts, *live]):
            node = live.get(host) or self._node(host)
            answer = self._infos.get(node.node_id)
            if host in hosts:
                info = self._info(host)
            elif answer is not None and answer.done() and answer.exception() is None:
                info = answer.result()
            else:
                continue  # another node whose agent has not answered: judged once it has
            why = ""
            if info.get("network") != "namespace":
                why = info.get("network_why") or "its agent cannot make network namespaces"
            elif not job_overlay.is_ipv4(node.address):
                why = f"its address {node.address} is not IPv4"
            elif job_overlay.is_overlay_address(node.address):
                why = f"its address {node.address} lies in the overlay's range"
            if why:
                if host not in self._fenced_hosts:
                    self._fenced_hosts.add(host)
                    log.warning(
                        "jobs on this Ray cluster are fenced, not in namespaces of their own: Ray node %s: %s",
                        host,
                        why,
                    )
                return False
        return True

    def _overlays(self, attempt: Attempt) -> dict[str, Overlay] | None:
        """Each Ray node's part of the attempt's overlay (:func:`.overlay_plan.segments`), where
        bind gave the tasks overlay addresses; None where it did not (or the cluster file says
        ``network = "fence"``)."""
        if self._network == "fence":
            return None
        return overlay_plan.segments(
            [plan.task for plan in attempt.plans], lambda host: self._node(host).address
        )

    def _record(self, attempt: Attempt, run: NodeRun) -> None:
        """Note in the service's job folder which Ray node holds a node's files."""
        node = self._node(run.host)
        placed = {
            "host": run.host,
            "node_id": node.node_id,
            "job_dir": str(self._on_nodes(attempt).job_dir),
            "attempt": attempt.number,  # names the launch whose files a shared copy must hold
        }
        path = attempt.jobdir.node(run.name).placed
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(placed))
        self._placed[(attempt.job_id, run.name)] = placed

    def _where(self, job_id: str, node: str) -> dict | None:
        """``placed.json`` of a job node (None: never launched on this backend)."""
        placed = self._placed.get((job_id, node))
        if placed is not None:
            return placed
        jd = config.jobdir(job_id)
        try:
            placed_file = jd.node(check_node_name(node)).placed.relative_to(jd.root)
            raw = read_small(jd.root, placed_file, limit=4096)
            placed = json.loads(raw)
        except (OSError, ValueError, RefusedFile):
            return None
        self._placed[(job_id, node)] = placed
        return placed

    def _shared(self, job_id: str, node: str, placed: dict) -> JobDir | None:
        """The job folder of ``placed`` as this machine sees it, when the files of that very
        launch of ``node`` are readable here at the same path (shared storage, or the Ray node
        ran on this machine); None otherwise.

        Its ``marker`` file names the launch (``<job>/<attempt>/<node>/<nonce>``): a folder of
        the same path on this machine that an earlier attempt (or nothing) wrote is not it.
        """
        attempt = placed.get("attempt")
        if not isinstance(attempt, int) or not placed.get("job_dir"):
            return None  # recorded before launches named their attempt
        jd = JobDir(Path(placed["job_dir"]))
        try:
            relative = jd.node(check_node_name(node)).marker.relative_to(jd.root)
            marker = read_small(jd.root, str(relative), limit=512).decode("utf-8", "replace")
        except (OSError, ValueError, RefusedFile, MaJupyterError):
            return None
        return jd if marker.startswith(f"{job_id}/{attempt}/{node}/") else None

    def _lost(self, node: str, placed: dict) -> NodeLost:
        """The error of a read of ``node``'s files whose Ray node is gone and whose files are
        not readable here."""
        return NodeLost(
            f"the logs of {node} are unavailable: the Ray node {placed.get('host')} that ran it left "
            f"the cluster, and its job folder ({placed.get('job_dir')}) is not on storage this "
            "service can read (put node_root on shared storage to keep them)"
        )

    def _agent_at(self, placed: dict) -> Any:
        """The agent of the Ray node in ``placed`` (NodeGone if that node left)."""
        node = self._by_name.get(placed.get("host", ""))
        if node is None or not node.alive:
            raise NodeGone(
                f"the Ray node {placed.get('host')} that ran this job node has left the cluster: "
                "its files (logs) went with it"
            )
        return self._agent(node.node_id)

    # ------------------------------------------------------------------- observe

    def _host(self, attempt: Attempt, run: NodeRun) -> str:
        if run.host:
            return run.host
        return next((p.task.host for p in attempt.plans if p.name == run.name), "")

    def poll(self, attempt: Attempt, run: NodeRun) -> NodeRun:
        on_nodes = self._on_nodes(attempt)
        try:
            agent = self._agent_of(self._host(attempt, run))
            # short: the supervisor polls under its lock, and the agent of a node that just
            # died answers nothing until the inventory says the node left
            polled = self._get(agent.poll.remote(on_nodes, run), POLL_TIMEOUT)
        except NodeGone:
            self._returns.settled((attempt.job_id, attempt.number, run.name))  # nothing more comes
            if run.state == "exited":
                return run
            return run.model_copy(update={"state": "lost"})
        except BackendUnavailable:  # no answer now: the node keeps its last known state
            return run
        if polled.state == "running":
            self._exits.watch(on_nodes, run)  # also after a restart of the service
            self._return_outputs(attempt, run)
        elif not self._returns.settled((attempt.job_id, attempt.number, run.name)):
            # its outputs' last copy is not here yet: its end is reported once it is
            # (.outputs_return rule 3), so the service never records it before
            return run if run.state == "running" else polled
        return polled

    def stop(self, attempt: Attempt, runs: list[NodeRun], grace: float) -> None:
        """Each Ray node's agent stops its job nodes (TERM, grace, KILL, nothing left), all at once."""
        on_nodes = self._on_nodes(attempt)
        groups: dict[str, list[NodeRun]] = {}
        for run in runs:
            groups.setdefault(self._host(attempt, run), []).append(run)
        calls = []
        for host, group in groups.items():
            try:
                calls.append(self._agent_of(host).stop.remote(on_nodes, group, grace))
            except NodeGone:
                # its runner ends its processes when it sees its raylet gone (rule 7), and the
                # host's next agent kills any it left
                continue
        error = None
        for ref in calls:
            try:
                self._get(ref, grace + 90.0)
            except NodeGone:
                continue
            except Exception as exc:
                error = error or exc
        for run in runs:  # the last copy of what each wrote (.outputs_return rule 3)
            self._returns.settled((attempt.job_id, attempt.number, run.name), wait=FINAL_WAIT)
        if error is not None:
            raise error

    def failure(self, attempt: Attempt, run: NodeRun) -> tuple[int, int] | str | None:
        try:
            agent = self._agent_of(self._host(attempt, run))
            answer = self._get(agent.failure.remote(self._on_nodes(attempt), run))
        except NodeGone:
            left = f"the Ray node {run.host} of {run.name} left the cluster"
            placed = self._where(attempt.job_id, run.name)
            shared = self._shared(attempt.job_id, run.name, placed) if placed else None
            report = local_logs.failure(shared, run.name) if shared is not None else None
            # the runner's own report says what it ended when it saw its raylet gone
            return f"{left}; {report}" if isinstance(report, str) else left
        return tuple(answer) if isinstance(answer, list) else answer

    def explain(self, attempt: Attempt, run: NodeRun, lines: list[str]) -> str | None:
        """The local backend's explanation (a refused write, a file missing from what each node
        has of its own), made by the agent of the Ray node from the view the node ran in there."""
        try:
            agent = self._agent_of(self._host(attempt, run))
            return self._get(agent.explain.remote(self._on_nodes(attempt), run, list(lines)))
        except MaJupyterError:  # the node left, or did not answer: the reason goes without it
            return None

    def not_distributed(self, attempt: Attempt, run: NodeRun) -> int | None:
        try:
            agent = self._agent_of(self._host(attempt, run))
            return self._get(agent.not_distributed.remote(self._on_nodes(attempt), run))
        except NodeGone:  # gone with its node: nothing is known
            return None

    # ------------------------------------------------------------------------ logs

    def log_streams(self, job: Job) -> list[LogStream]:
        """Each node's streams from the agent of its Ray node, in the job's node order; streams of
        earlier attempts' nodes found there follow.  A stream's ``file`` is kept only where this
        machine sees that very launch's job folder (shared storage, or the Ray node is this
        machine): elsewhere the file is on the Ray node, read through its agent."""
        names = [n.name for n in job.nodes]
        places: dict[tuple[str, str], list[str]] = {}
        for name in names:
            placed = self._where(job.id, name)
            if placed is not None:
                places.setdefault((placed["host"], placed["job_dir"]), []).append(name)
        found: dict[str, list[LogStream]] = {}
        extra: list[LogStream] = []
        for (host, job_dir), here in places.items():
            # the nodes whose files of that very launch this machine sees at the same path
            shared = [n for n in here if self._shared(job.id, n, self._where(job.id, n) or {})]
            try:
                agent = self._agent_at({"host": host})
                streams = self._get(agent.log_streams.remote(job_dir, here))
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

    def open_log(self, job_id: str, node: str, rank: int | None) -> RayLogSource | None:
        """The stream read through the agent of the Ray node that ran ``node``; None while it
        does not exist (or the node never ran on this backend).  Once that Ray node is gone: the
        file read here when this machine sees the node's job folder (shared storage), else
        :class:`NodeLost`."""
        JobDir(PLACEHOLDER.root).log_relative(node, rank)  # InvalidSpec for names that cannot be streams
        placed = self._where(job_id, node)
        if placed is None:
            return None
        try:
            agent = self._agent_at(placed)
        except NodeGone:
            shared = self._shared(job_id, node, placed)
            if shared is None:
                raise self._lost(node, placed) from None
            return local_logs.open_log(shared, node, rank)
        answer = self._get(agent.read_log.remote(placed["job_dir"], node, rank, 0, 0))
        if answer[0] == "refused":
            raise RefusedFile(answer[1])
        if answer[0] == "missing":
            return None
        return RayLogSource(agent, self._get, placed["job_dir"], node, rank, answer[2])

    # --------------------------------------------------------------------- kernels

    def kernel_route(self, job: Job, node: str) -> KernelRoute:
        """The relay of the dev environment's kernel on the Ray node that runs it, started by
        that node's agent (:meth:`.agent.NodeAgent.kernel_relay`), always: one path, whether or
        not this machine also sees the node's folder (a Unix socket connects processes of one
        machine only, so shared storage would not do).

        Raises:
            Conflict: the node does not run on this backend now.
        """
        run = next((n for n in job.nodes if n.name == node), None)
        placed = self._where(job.id, node)
        if run is None or placed is None or placed.get("attempt") != job.attempt:
            raise Conflict(f"{node} of dev environment {job.id} is not running: its kernel cannot be reached")
        on_nodes = Attempt(job.id, job.spec, job.attempt, Path(placed["job_dir"]), ())
        try:
            agent = self._agent_at(placed)
        except NodeGone as exc:
            raise Conflict(f"the kernel of dev environment {job.id} is gone: {exc}") from None
        address = self._node(placed["host"]).address
        port, secret = self._get(agent.kernel_relay.remote(on_nodes, run, address))
        return KernelRoute(node=node, relay=KernelRelay(host=address, port=port, secret=secret))

    # ------------------------------------------------------------------- lifecycle

    def on_node_end(self, wake: Callable[[], None]) -> None:
        self._wake = wake

    def on_notice(self, notice: Callable[[str, str | None, str], None]) -> None:
        self._notice = notice

    def close(self) -> None:
        """Stop this process's threads and leave the cluster; agents, placement groups and job
        nodes stay (a restarted service re-attaches to them)."""
        self._halt.set()
        self._exits.close()
        self._thread.join(timeout=5)
        try:
            self._ray.shutdown()
        except Exception:
            log.warning("leaving the Ray cluster failed", exc_info=True)


def _ship_target(on_nodes: Attempt, node: str) -> Path:
    """Where a job node's copy of the algorithm folder goes on its Ray node."""
    return on_nodes.jobdir.node(node).root / ship.FOLDER


def _shipped_original(mount: Mount) -> str | None:
    """The folder on this machine a launch's mount reads the algorithm from, or None: an
    algorithm mount shown itself, or the original of a working copy."""
    if mount.kind == "algorithm":
        return mount.source
    if mount.kind == WORKDIR_KIND and mount.copy_of:
        return mount.copy_of
    return None


def _assigned_cards(resource: str) -> list[int]:
    """Runs as a Ray task inside a bundle: the ids of the cards of ``resource`` Ray gave it."""
    import ray

    ids = ray.get_runtime_context().get_accelerator_ids().get(resource, [])
    return sorted(int(i) for i in ids)


def _bundle(task: TaskSlot, node: RayNode) -> dict[str, float]:
    """The resources of one job node in its placement group: its CPUs, memory and cards (so
    Ray's own tasks cannot take the memory the scheduler counted as the job's)."""
    bundle = {"CPU": max(task.cpu_request, 0.01)}
    if task.memory_gb > 0:
        bundle["memory"] = float(int(task.memory_gb * 2**30))
    if task.devices and node.accelerator:
        bundle[node.accelerator] = float(len(task.devices))
    return bundle
