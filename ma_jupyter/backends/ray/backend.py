"""The Ray backend: the same jobs, on the nodes of an existing Ray cluster.

The service connects to the cluster as a Ray driver (``ray.init(address=...)``) and:

1. **inventory** -- lists the cluster's live nodes every second (:mod:`.agents`,
   :mod:`.inventory`); the scheduler places on them, so a node that joins or leaves counts
   without a restart (contract rule 14);
2. **agents** -- keeps one node agent per Ray node (:mod:`.agent`: a named, detached actor pinned
   to its node that takes no CPU; :mod:`.agents` in the service), created on first sight; every
   job node on that Ray node is started, watched, stopped and read through it;
3. **bind** -- for a real attempt (:mod:`.placement`), reserves the scheduler's nodes as one Ray placement group
   named ``ma-<home tag>-<job id>-<nonce>`` (detached, so it outlives a service restart; the
   tag keeps services of different homes apart; a group of the same job an earlier service
   left unrecorded is removed first): one bundle per job node
   (its CPUs, memory and cards), each pinned to its inventory node by Ray's ``ray.io/node-id`` label,
   ``STRICT_SPREAD`` when every job node has its own Ray node (workers and the chief always do;
   parameter servers and batch tasks may share a node, then ``SPREAD``).  The group is created
   only for a placement the scheduler found free, and is removed again when Ray cannot reserve
   it within :data:`.placement.RESERVE_WAIT` seconds (other users of the cluster hold the resources): bind
   then gives None and the job waits in the queue holding nothing (contract rule 15).  The agents hand
   out ports free on their nodes; addresses are the Ray nodes' own;
4. **dry run and launch** (:mod:`.launch`) -- each job node runs the local backend's node runner in the same
   sandbox on its Ray node, in the node's job folder on that machine (``node_root/<job id>``;
   ``node_root`` defaults to this service's ``jobs/`` folder, at the same path on every node).
   The algorithm folder is shipped (:mod:`.ship`): packed once per attempt into Ray's object
   store and unpacked by each agent into the node's own folder (``nodes/<node>/algorithm``),
   from which the node's working copy at ``/workspace/algorithm`` is made (or which it shows
   itself, when the algorithm is mounted writable or is too big for a copy).  Every other host path a job names (datasets, models, outputs, volumes) and the image (the
   Python environment, with this package) must exist at the same path on every Ray node (a
   node lacking one refuses the launch naming it: :mod:`.node_paths`); datasets and models in
   object storage are downloaded on each Ray node instead (:meth:`RayBackend.fetch_objects`,
   :mod:`.fetches`, :mod:`.objects`), and the job's outputs folder (its own, or a named one where
   the Ray node's is not this machine's) comes back to this machine while the nodes write it
   (:mod:`.outputs_return`);
5. **logs** -- read through the agents (:mod:`.logs`); which Ray node holds a job node's files
   is kept in the service's job folder (``nodes/<node>/placed.json``, :mod:`.node_files`), so a restarted service
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
(:mod:`.networks` decides overlay or fence, :mod:`.overlay_plan`: each node's sshd at its
own overlay address); a fenced attempt has none,
and the horovod mode refuses it at submit saying so.
"""

from __future__ import annotations

import logging
import subprocess
import threading
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
)
from ...jobdir import PLACEHOLDER
from ...models import (
    CacheInfo,
    Job,
    JobSpec,
    KernelRelay,
    KernelRoute,
    LogStream,
    Node,
    NodeLaunch,
    NodeRun,
    RunAs,
    is_object_uri,
)
from ...modes.base import Placement, TaskSlot
from ...nodehost import caches, prepare
from ...nodehost.code import python_sources
from ...nodehost.host import NodeHost
from ...nodehost.host_policy import load_policy
from ..base import Attempt, Backend, DatasetState, ObjectFetch
from . import egress_gate, fence, logs, overlay_plan
from . import launch as ray_launch
from .agents import NAMESPACE, POLL_TIMEOUT, Agents
from .exits import ExitWatch
from .fetches import Fetches
from .logs import RayLogSource
from .networks import Networks
from .node_files import NodeFiles
from .outputs_return import FINAL_WAIT, NamedFolder, OutputsReturn, disk_reserve
from .outputs_seed import SeedsOutputs
from .placement import Groups

log = logging.getLogger("ma_jupyter.ray")

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


class RayBackend(SeedsOutputs, Backend):
    """Runs each job node on a node of a Ray cluster (see the module docstring): the backend
    contract over the rooms of this package.

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
        self._node_root = Path(node_root) if node_root else config.jobs_root()
        self._lock = threading.Lock()
        # runs the jobs' TensorBoards on this machine (start_outputs_reader); made on first use
        self._here: NodeHost | None = None
        self._wake: Callable[[], None] | None = None
        self._notice: Callable[[str, str | None, str], None] | None = None
        self._agents = Agents(ray, self._node_root, lambda: self._wake, lambda: self._notice)
        self._networks = Networks(self._agents, network)
        self._groups = Groups(ray, self._agents)
        self._files = NodeFiles(self._node_root)
        self._fetches = Fetches(ray, self._agents)
        self._exits = ExitWatch(self._agents.agent_of, lambda: self._wake)
        # outputs of nodes whose job folder this machine does not see (.outputs_return)
        self._returns = OutputsReturn(self._agents.get, lambda: self._wake)
        self._init_seeds()  # a resumed attempt's outputs carried to its Ray nodes (.outputs_seed)
        self._agents.start()

    # ------------------------------------------------------------------- inventory

    def inventory(self) -> list[Node]:
        return self._agents.nodes

    # ------------------------------------------------------------------------ bind

    def bind(self, placement: Placement, *, reserve: bool) -> Placement | None:
        """Each task named ``<role>-<index>``, at its own overlay address with MPI's remote
        shell over the overlay (:mod:`.overlay_plan`), or fenced at its Ray node's address with
        none; with ``reserve``, the placement group holding the nodes and two ports per task
        from the nodes' agents (:mod:`.placement`)."""
        nodes = [self._agents.node(task.host) for task in placement.tasks]
        # the Ray nodes' own addresses are not reachable from inside the job's namespaces
        hosts = [task.host for task in placement.tasks]
        shell = None
        if self._networks.overlay(hosts):
            addresses = overlay_plan.task_addresses(len(hosts))
            infos = [self._agents.info(host) for host in dict.fromkeys(hosts)]  # answered: overlay() waited
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
        return self._groups.reserve(bound, nodes)

    def _runs_as_root(self, creator: str | None) -> bool:
        """Whether ``creator``'s job nodes run as root on the agents (root, as overlays need):
        the host rules keep them in the agents' account.  A user whose account cannot be settled
        is not root (the launch refuses the job)."""
        try:
            return self.job_account(creator) is None
        except InvalidSpec:
            return False

    def release(self, placement: Placement) -> None:
        """Give the ports back to the agents and remove the placement group (:mod:`.placement`)."""
        self._groups.release(placement)

    def hold(self, placement: Placement) -> None:
        """Declare the placement's ports to the agents again (its placement group is detached:
        it still holds the nodes)."""
        self._groups.hold(placement)

    # ----------------------------------------------------------------- node checks

    def job_folders_free(self, host: str) -> tuple[str, int] | None:
        """Asked of the node's agent within :data:`POLL_TIMEOUT` seconds (None: it did not
        answer, or the node is gone)."""
        try:
            free = self._agents.get(
                self._agents.agent_of(host).job_folders_free.remote(str(self._node_root)), POLL_TIMEOUT
            )
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
            return self._agents.get(self._agents.agent_of(task.host).card_fault.remote(task), POLL_TIMEOUT)
        except MaJupyterError:
            return None

    def network_fault(self, host: str) -> str | None:
        """The last answer of the node's agent (:meth:`.networks.Networks.fault`), never waiting
        for one; None on a fenced cluster (its jobs share their machines' networks)."""
        return self._networks.fault(host)

    # ------------------------------------------------- this machine's and every node's

    def code_sources(self, spec: JobSpec) -> dict[str, str] | None:
        """The algorithm folder's Python files, read here: the folder is shipped from this
        machine, so what the nodes run is what is read (see :func:`ma_jupyter.nodehost.code.python_sources`)."""
        return python_sources(Path(spec.algorithm)) if spec.algorithm else None

    def caches(self, user: str | None, *, every_user: bool = False) -> list[CacheInfo]:
        """Each user's caches on the Ray nodes, added up per user: every machine keeps its own
        copy (at this service's cache path, the one the launches mount), shared by the Ray
        nodes on it; ``path`` says on how many machines it lies."""
        agents = self._agents.every()
        base = str(caches.root())
        found: dict[str, dict[str, CacheInfo]] = {}
        for ref in [agent.caches.remote(base, user, every_user) for agent in agents]:
            try:
                machine, items = self._agents.get(ref)
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
        agents = self._agents.every()
        base = str(caches.root())
        for ref in [agent.clear_cache.remote(base, user) for agent in agents]:
            try:
                self._agents.get(ref)
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
        agents = self._agents.every()
        self._fetches.forget(job_id)
        for agent in agents:
            agent.remove_job.remote(str(self._node_root), job_id)

    # -------------------------------------------------------------- dry run, launch

    def isolation(self) -> str:
        """``bubblewrap`` when every known Ray node has it, else ``symlink``."""
        kinds = {info.get("isolation") for info in self._agents.every_answer()}
        return "symlink" if "symlink" in kinds else "bubblewrap"

    def dryrun(self, attempt: Attempt) -> list[NodeLaunch]:
        """The local backend's launches, each in its Ray node's isolation, with the job folder on
        the nodes and the algorithm folder shipped into each node's own folder (:mod:`.launch`)."""
        on_nodes, fetched = self._fetches.mounts(attempt, self._files.on_nodes(attempt))
        kinds = [self._agents.info(plan.task.host).get("isolation", "bubblewrap") for plan in attempt.plans]
        return ray_launch.dry_run(on_nodes, kinds, fetched)

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
        its agent (:mod:`.fetches`, :mod:`.objects`), all at once, within
        :data:`.fetches.FETCH_TIMEOUT` seconds; the credentials travel as an argument of that one
        agent call and are written nowhere.

        Raises:
            Conflict: the job ended (``cancel``) meanwhile.
            BackendUnavailable: a Ray node failed, with the reason (a listing or download error
                names the bucket), or did not finish in time.
        """
        return self._fetches.fetch(job_id, hosts, fetches, credentials, account, cancel, say)

    def launch(self, attempt: Attempt, launches: list[NodeLaunch]) -> list[NodeRun]:
        """Each machine's nodes started by its agent (:func:`.launch.send`), all or nothing."""
        if len(launches) != len(attempt.plans):
            raise ValueError(f"{len(launches)} launches for the {len(attempt.plans)} nodes of the attempt")
        # without the datasets and models downloaded on the nodes (as the dry run made them)
        on_nodes, _ = self._fetches.mounts(attempt, self._files.on_nodes(attempt))
        # the network (docs/network.md): bind gave overlay addresses where every machine of the
        # attempt can hold its namespace; else each node is fenced off the cluster's ports
        # (see .fence), read once per attempt
        overlays = self._networks.segments(attempt)
        # [network] egress: the agents' gates
        overlays = egress_gate.gated(overlays, on_nodes, self._ray, self._agents.every_answer())
        cluster_ports = None if overlays else fence.cluster_ports(self._ray)
        runs, error = ray_launch.send(self._ray, self._agents, on_nodes, launches, overlays, cluster_ports)
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
        for run in runs:
            self._files.record(attempt, run, self._agents.node(run.host).node_id)
            self._exits.watch(on_nodes, run)
            self._return_outputs(attempt, run)
        return runs

    def _return_outputs(self, attempt: Attempt, run: NodeRun) -> None:
        """Bring ``run``'s outputs back to this machine while it runs (:mod:`.outputs_return`):
        the job's own outputs folder (none named, or outputs in object storage), where the node
        writes it elsewhere than this service's outputs folder or on a machine whose job
        folder this one does not see; a named one by :meth:`_return_named`."""
        key = (attempt.job_id, attempt.number, run.name)
        spec = attempt.spec
        if self._returns.watched(key) or Path(attempt.job_dir) == PLACEHOLDER.root:
            return
        on_nodes = self._files.on_nodes(attempt)
        here = Path(config.outputs_folder(attempt.job_id, spec.outputs))
        placed = self._files.where(attempt.job_id, run.name)
        if placed is None:
            return
        if spec.outputs and not is_object_uri(spec.outputs):
            self._return_named(key, attempt, placed)
            return
        if (
            on_nodes.jobdir.outputs == here
            and self._files.shared(attempt.job_id, run.name, placed) is not None
        ):
            return  # the very folder, seen here
        try:
            agent = self._agents.agent_at(placed)
        except NodeGone:
            return
        root = config.jobdir(attempt.job_id).root
        copied = self.seeded(attempt.job_id, placed["host"])  # sent there: not sent back
        self._returns.watch(
            key, agent, str(on_nodes.jobdir.outputs), here, root, reserve=disk_reserve, copied=copied
        )

    def _return_named(self, key: tuple[str, int, str], attempt: Attempt, placed: dict) -> None:
        """A named outputs host path brought back into this machine's folder of that path
        (:mod:`.outputs_return` rule 5): written as the job's account, where the job's mount
        rules let it mount the folder the path leads to then; on the Ray node only that
        account's files are read; nothing where the probe finds the very same folder.  The
        account, the rules and the reserve are read on the copy's own thread (this may run
        under the supervisor's lock)."""
        spec = attempt.spec
        folder = str(spec.outputs)

        def start() -> NamedFolder:
            policy = load_policy()

            def check(opened: str) -> None:
                policy.check_source(opened, "outputs", "outputs", spec.creator)

            return NamedFolder(folder, self.job_account(spec.creator), check, disk_reserve())

        try:
            agent = self._agents.agent_at(placed)
        except NodeGone:
            return
        self._returns.watch(key, agent, folder, Path(folder), Path(folder), named=start)

    # ------------------------------------------------------------------- observe

    def _host(self, attempt: Attempt, run: NodeRun) -> str:
        if run.host:
            return run.host
        return next((p.task.host for p in attempt.plans if p.name == run.name), "")

    def poll(self, attempt: Attempt, run: NodeRun) -> NodeRun:
        on_nodes = self._files.on_nodes(attempt)
        try:
            agent = self._agents.agent_of(self._host(attempt, run))
            # short: the supervisor polls under its lock, and the agent of a node that just
            # died answers nothing until the inventory says the node left
            polled = self._agents.get(agent.poll.remote(on_nodes, run), POLL_TIMEOUT)
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
        on_nodes = self._files.on_nodes(attempt)
        groups: dict[str, list[NodeRun]] = {}
        for run in runs:
            groups.setdefault(self._host(attempt, run), []).append(run)
        calls = []
        for host, group in groups.items():
            try:
                calls.append(self._agents.agent_of(host).stop.remote(on_nodes, group, grace))
            except NodeGone:
                # its runner ends its processes when it sees its raylet gone (rule 7), and the
                # host's next agent kills any it left
                continue
        error = None
        for ref in calls:
            try:
                self._agents.get(ref, grace + 90.0)
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
            agent = self._agents.agent_of(self._host(attempt, run))
            answer = self._agents.get(agent.failure.remote(self._files.on_nodes(attempt), run))
        except NodeGone:
            left = f"the Ray node {run.host} of {run.name} left the cluster"
            placed = self._files.where(attempt.job_id, run.name)
            shared = self._files.shared(attempt.job_id, run.name, placed) if placed else None
            report = logs.runner_failure(shared, run.name) if shared is not None else None
            # the runner's own report says what it ended when it saw its raylet gone
            return f"{left}; {report}" if isinstance(report, str) else left
        return tuple(answer) if isinstance(answer, list) else answer

    def explain(self, attempt: Attempt, run: NodeRun, lines: list[str]) -> str | None:
        """The local backend's explanation (a refused write, a file missing from what each node
        has of its own), made by the agent of the Ray node from the view the node ran in there."""
        try:
            agent = self._agents.agent_of(self._host(attempt, run))
            return self._agents.get(agent.explain.remote(self._files.on_nodes(attempt), run, list(lines)))
        except MaJupyterError:  # the node left, or did not answer: the reason goes without it
            return None

    def not_distributed(self, attempt: Attempt, run: NodeRun) -> int | None:
        try:
            agent = self._agents.agent_of(self._host(attempt, run))
            return self._agents.get(agent.not_distributed.remote(self._files.on_nodes(attempt), run))
        except NodeGone:  # gone with its node: nothing is known
            return None

    # ------------------------------------------------------------------------ logs

    def log_streams(self, job: Job) -> list[LogStream]:
        """Each node's streams from the agent of its Ray node, in the job's node order
        (:func:`.logs.log_streams`)."""
        return logs.log_streams(self._agents, self._files, job)

    def open_log(self, job_id: str, node: str, rank: int | None) -> RayLogSource | None:
        """The stream read through the agent of the Ray node that ran ``node``
        (:func:`.logs.open_log`): None while it does not exist; once that Ray node is gone, the
        file read here when this machine sees it (shared storage), else :class:`NodeLost`."""
        return logs.open_log(self._agents, self._files, job_id, node, rank)

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
        placed = self._files.where(job.id, node)
        if run is None or placed is None or placed.get("attempt") != job.attempt:
            raise Conflict(f"{node} of dev environment {job.id} is not running: its kernel cannot be reached")
        on_nodes = Attempt(job.id, job.spec, job.attempt, Path(placed["job_dir"]), ())
        try:
            agent = self._agents.agent_at(placed)
        except NodeGone as exc:
            raise Conflict(f"the kernel of dev environment {job.id} is gone: {exc}") from None
        address = self._agents.node(placed["host"]).address
        port, secret = self._agents.get(agent.kernel_relay.remote(on_nodes, run, address))
        return KernelRoute(node=node, relay=KernelRelay(host=address, port=port, secret=secret))

    # ------------------------------------------------------------------- lifecycle

    def on_node_end(self, wake: Callable[[], None]) -> None:
        self._wake = wake

    def on_notice(self, notice: Callable[[str, str | None, str], None]) -> None:
        self._notice = notice

    def close(self) -> None:
        """Stop this process's threads and leave the cluster; agents, placement groups and job
        nodes stay (a restarted service re-attaches to them)."""
        self._agents.close()
        self._exits.close()
        try:
            self._ray.shutdown()
        except Exception:
            log.warning("leaving the Ray cluster failed", exc_info=True)
