"""The node agent: one long-lived Ray actor per Ray node that runs the job nodes placed there.

The Ray backend creates one agent per Ray node (named ``agent-<node id>`` in the platform's
namespace, detached, pinned to its node, taking no CPU), and every job node on that Ray node
goes through it.  An agent holds its machine's :class:`~ma_jupyter.nodehost.host.NodeHost`, as
the local backend holds the service machine's: it starts each job node with the same node runner
(:mod:`ma_jupyter.nodehost.noderun`) in the same sandbox (bubblewrap when the node has it),
keeps the node's log and exit code in the node's job folder on that machine, and finds the node's processes again by their marker.  So:

1. everything an agent knows lives on its node's disk (the job folders) and in the processes'
   markers: an agent that was restarted, or a service that was restarted, finds every job node
   again; the job nodes never depend on the agent process (they run in their own sessions);
2. log reads go through the agent (:meth:`NodeAgent.read_log`), which opens the files as
   untrusted exactly like the local backend's node host; :meth:`NodeAgent.wait_log` and
   :meth:`NodeAgent.wait_exit` block on the agent's side, so the service learns of new bytes and
   of a node's end without polling over the network;
3. the ports it hands out are free on its node and never handed out twice while reserved,
   whichever job asks (one agent, one pool per Ray node);
4. the job nodes end with their Ray node: each runner it starts watches this node's raylet
   (``end_with``, :mod:`ma_jupyter.nodehost.hostwatch`) and ends its node within seconds
   of the raylet's end; and an agent, before it takes work, kills what runners of ended raylets
   left on its machine (:mod:`.leftovers`; :meth:`NodeAgent.info` reports them);
5. a dev environment's kernel is reached from the service's machine through a relay the agent
   starts for it on this node and closes when its node ends (:meth:`NodeAgent.kernel_relay`,
   :mod:`.kernel_relay`).

This module never imports Ray: the backend wraps :class:`NodeAgent` into an actor class, and the
agent's methods run on the actor's threads (calls for different jobs run concurrently).
"""

from __future__ import annotations

import os
import select
import tempfile
import threading
import time
from pathlib import Path

import ma_jupyter

from ... import accelerators, config
from ...errors import Conflict, InvalidSpec, RefusedFile
from ...foldersize import remove_tree
from ...jobdir import JobDir, check_job_id
from ...models import LogStream, NodeLaunch, NodeRun, RunAs
from ...modes.base import TaskSlot
from ...nodehost import caches, hostwatch, network, procfs
from ...nodehost import logs as job_logs
from ...nodehost import overlay as job_overlay
from ...nodehost.host import NodeHost, disk_free
from ...nodehost.overlay import Overlay
from ...nodehost.ports import PortPool
from ...nodehost.processes import process_fd
from ...nodehost.remote_shells import SSHD_PROGRAM
from ...nodehost.view import PACKAGE_DIR
from ..base import Attempt, ObjectFetch
from . import egress_gate, fence, leftovers, node_paths, objects, outputs_return, outputs_seed, ship
from .inventory import node_name
from .kernel_relay import KernelRelay
from .network_check import OverlayCheck

#: where an agent keeps its attempts' network namespaces until their runners are in
NAMESPACE_ROOT = Path("/run/ma_jupyter/netns")
#: seconds between looks at a log's size while a wait call blocks
WAIT_STEP = 0.02
#: seconds between looks at a node's exit where the runner's end cannot wake the agent itself
EXIT_STEP = 0.1
#: seconds between looks at a node's exit while the runner's end would wake the agent (a safety
#: net: the runner writes its exit code before it ends, but for a debug terminal's kept sandbox)
EXIT_RECHECK = 5.0


class NodeAgent:
    """The platform's agent on one Ray node (see the module docstring).

    Args:
        node_id: the Ray node it is pinned to (reported back by :meth:`info`).
        node_root: the folder of job folders on this node (the service's ``node_root``): the
            sweep of what dead nodes left (:mod:`.leftovers`) looks only below it.
    """

    def __init__(self, node_id: str = "", node_root: str = ""):
        self._node_id = node_id
        # Ray starts its workers, this actor among them, at nice 15 (its worker_niceness), so
        # they never starve the raylet; the job nodes started from here inherit the agent's
        # priority and are the cluster's real work: run them at normal priority, as the local
        # backend does (a service without the right to lower it keeps Ray's).
        try:
            os.setpriority(os.PRIO_PROCESS, 0, 0)
        except OSError:
            pass
        # The agent's own state folder on its node (the node runners' compiled modules): never a
        # service's home, which may not exist on this machine
        # (root's under /run; another account's under /tmp, checked: whoever made a folder of
        # that name first must not hand the runners their modules)
        os.environ[config.ENV_HOME] = str(network.private_folder(agent_home()))
        #: this Ray node's nodes (the node machinery on this machine) and its ports
        self._local = NodeHost()
        self._ports = PortPool()
        # root's own folder, never the agents' home under /tmp (another account could have made
        # it first): the namespaces are bind mounts made as root; and one per Ray node, since
        # two Ray nodes of one machine share it
        self._local.namespace_folder = NAMESPACE_ROOT / (node_id or "node")
        #: why this node cannot hold jobs' overlays (None: it can; docs/network.md)
        self._overlay_problem = job_overlay.supported()
        probes = self._local.namespace_folder.with_name(self._local.namespace_folder.name + "-probe")
        self._overlay_check = OverlayCheck(self._ports, probes, self._overlay_problem)
        self._local.end_with = _raylet(node_id)  # rule 4: its nodes end with this Ray node
        # before any work: nothing of a dead node runs on
        self._ended = leftovers.end_leftovers(node_root) if node_root else []
        self._local.prestart_runners()  # the first job's nodes need not wait for it
        self._relays: dict[tuple[str, int, str], KernelRelay] = {}  # dev environments' (kernel_relay)
        self._relays_lock = threading.Lock()

    def info(self) -> dict:
        """Who the agent is: its node, pid, the package version and folder, the node's isolation
        (``bubblewrap`` when bubblewrap works on this node, else ``symlink``), its jobs' network
        (``namespace``: each node here a machine of its own on its attempt's overlay;
        ``fence``: on the machine's network, fenced, with ``network_why`` saying why), and
        ``sshd``: whether OpenSSH's server is installed here (MPI's remote shell on an overlay,
        :mod:`.overlay_plan`), and ``ray_ports``: this machine's raylets' ports and worker port
        ranges (:func:`.fence.raylet_ports`)."""
        ports, ranges = fence.raylet_ports()
        return {
            "node_id": self._node_id,
            "pid": os.getpid(),
            "version": ma_jupyter.__version__,
            "package": PACKAGE_DIR,
            "isolation": self._local.isolation(),
            "network": "fence" if self._overlay_problem else "namespace",
            "network_why": self._overlay_problem or "",
            "sshd": os.access(SSHD_PROGRAM, os.X_OK),
            "leftovers_ended": self._ended,
            # this machine's raylets' ports and worker ranges: every attempt's egress gate
            # denies them on any address (egress_gate rule 1)
            "ray_ports": [sorted(ports), sorted(ranges)],
        }

    # ------------------------------------------------------------------------- ports

    def ports(self, count: int, within: tuple[int, int] | None = None) -> tuple[int, ...]:
        """``count`` ports free on every address of this node, reserved until released (taken
        from ``within``, ``[low, high)``, when the placement names a range)."""
        return self._ports.reserve_ports(count, within)

    def release_ports(self, ports: list[int]) -> None:
        self._ports.release_ports(ports)

    def hold_ports(self, ports: list[int]) -> None:
        self._ports.hold_ports(ports)

    # ----------------------------------------------------------------------- nodes

    def launch(
        self,
        attempt: Attempt,
        launches: list[NodeLaunch],
        job_secret: str,
        shipping: list[tuple[int | None, str]],
        cluster_ports: list[int] | None,
        overlay: Overlay | None,
        *archives: bytes,
    ) -> list[NodeRun]:
        """Start the attempt's nodes placed on this Ray node, all or none.

        1. each launch's ``shipping`` entry ``(archive, folder)``: where ``archive`` is not
           None, ``archives[archive]`` (the shipped algorithm folder, packed) is unpacked into
           ``folder``, the folder the launch's mounts read the algorithm from;
        2. the network (docs/network.md): with ``overlay``, each node a network namespace and
           an address of its own on this machine's part of the attempt's overlay
           (:mod:`ma_jupyter.nodehost.overlay`), and the attempt's way out where the admin's
           policy opens one (``overlay.egress``: this agent's gate, :mod:`.egress_gate`);
           without, each is fenced off the Ray cluster's ports (``cluster_ports``) and what
           else listens on this machine (:mod:`.fence`);
        3. the cards Ray gave each node's bundle are bound as this machine shows them.

        ``attempt`` names the job folder on this node.  Before anything, a named host path
        (dataset, volume, image...) this machine lacks refuses the launch, naming this Ray node
        and the path (:mod:`.node_paths`).
        """
        node_paths.check(launches, str(attempt.job_dir), node_name(self._node_id))
        for archive, folder in shipping:
            if archive is not None and folder:
                ship.unpack(archives[archive], folder)
        if overlay is not None:  # with the attempt's way out where the service sent one
            overlay = egress_gate.on_this_machine(overlay)
            return self._local.start_nodes(attempt, launches, job_secret, overlay=overlay)
        deny = fence.node_deny_list(cluster_ports or [], attempt)
        return self._local.start_nodes(attempt, launches, job_secret, deny_tcp=deny)

    def poll(self, attempt: Attempt, run: NodeRun) -> NodeRun:
        return self._local.poll(attempt, run)

    def stop(self, attempt: Attempt, runs: list[NodeRun], grace: float) -> None:
        """TERM, wait up to ``grace``, KILL; returns once no process of these nodes is left here."""
        self._local.stop(attempt, runs, grace)

    def failure(self, attempt: Attempt, run: NodeRun) -> tuple[int, int] | str | None:
        return self._local.failure(attempt, run)

    def explain(self, attempt: Attempt, run: NodeRun, lines: list[str]) -> str | None:
        """The node host's explanation, from the view the node ran in here."""
        return self._local.explain(attempt, run, lines)

    def not_distributed(self, attempt: Attempt, run: NodeRun) -> int | None:
        return self._local.not_distributed(attempt, run)

    def wait_exit(self, attempt: Attempt, run: NodeRun, timeout: float) -> bool:
        """Block until the node is no longer running, at most ``timeout`` seconds; whether it ended.

        The runner's end wakes it at once through a descriptor of the runner process
        (``pidfd_open``), so a job's end reaches the service without a polling delay and a
        waiting agent costs no CPU; where the kernel has no such descriptors it looks every
        :data:`EXIT_STEP` seconds.  The descriptor is opened before the first look, so it can
        only name the runner that look found running (a pid reused later is never watched).
        """
        deadline = time.monotonic() + timeout
        watch = process_fd(run.pid) if run.pid is not None else None
        # a failed node with a debug terminal writes its exit code and keeps its runner (and
        # sandbox) alive: its end is the exit code, which only a look finds
        recheck = EXIT_STEP if attempt.spec.debug_terminal else EXIT_RECHECK
        ended = select.poll()  # not select.select: Ray raises the descriptor limit past 1024
        if watch is not None:
            ended.register(watch, select.POLLIN)
        try:
            while True:
                if self._local.poll(attempt, run).state != "running":
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                if watch is None:
                    time.sleep(min(left, EXIT_STEP))
                    continue
                if ended.poll(min(left, recheck) * 1000):  # ended: the next look says so
                    ended.unregister(watch)
                    os.close(watch)
                    watch = None  # it never fires twice
        finally:
            if watch is not None:
                os.close(watch)

    def job_folders_free(self, node_root: str) -> int | None:
        """Free bytes on the disk of ``node_root`` (the job folders) on this node, for the
        service's node checks."""
        return disk_free(node_root)

    def network_fault(self, underlay: str) -> str | None:
        """Why this machine cannot give an attempt its overlay now (``underlay``: this Ray
        node's address), from the last probes; never waits (:mod:`.network_check`)."""
        return self._overlay_check.fault(underlay)

    def card_fault(self, task: TaskSlot) -> str | None:
        """Why one of the task's real cards on this node can no longer be used (the local
        backend's check, on this machine); None while they look healthy, and where this machine
        shows no card node of the task's type at all: its cards are a Ray resource without
        devices (emulated), as :func:`~ma_jupyter.nodehost.launch.with_machine_cards` treats
        them at the start."""
        if not task.card_type or not accelerators.has_device_nodes(task.card_type):
            return None
        return self._local.card_fault(task)

    def caches(self, base: str, user: str | None, every_user: bool) -> tuple[str, list[dict]]:
        """This machine's id (its boot id: two Ray nodes may share a machine, and its folders)
        and the per-user caches below ``base`` (the service's folder of caches: the path the
        nodes' launches mount)."""
        found = caches.usage(user, every_user=every_user, base=Path(base))
        return _machine_id(), [c.model_dump() for c in found]

    def clear_cache(self, base: str, user: str | None) -> None:
        """Empty ``user``'s cache below ``base`` on this node."""
        caches.clear(user, base=Path(base))

    def remove_job(self, node_root: str, job_id: str) -> bool:
        """Remove the job folder ``node_root/<job_id>`` on this node (a deleted job); whether
        there was one.  Links are removed, never followed, at any depth
        (:func:`ma_jupyter.foldersize.remove_tree`); a job id that is
        not a plain folder name is refused, so nothing outside ``node_root`` is touched."""
        check_job_id(job_id)
        folder = Path(node_root) / job_id
        if not folder.is_dir() or folder.is_symlink():
            return False
        remove_tree(folder)
        return True

    # ------------------------------------------------------- object storage, outputs

    def fetch_objects(
        self,
        node_root: str,
        job_id: str,
        fetches: list[ObjectFetch],
        credentials: dict[str, str],
        account: RunAs | None,
    ) -> list[str]:
        """Download a job's object storage prefixes on this machine (:mod:`.objects`); a line
        per prefix saying what was done.  ``credentials`` live in this call only."""
        return objects.fetch(node_root, job_id, fetches, credentials, account, host=node_name(self._node_id))

    def fetch_progress(self, job_id: str) -> list[str]:
        """The progress lines of ``job_id``'s downloads here since the last ask (:func:`.objects.progress`)."""
        return objects.progress(job_id)

    def outputs_listing(self, outputs: str, owner: int | None = None) -> dict[str, tuple[int, int]]:
        """The files of a node's outputs folder here (:func:`.outputs_return.listing`; ``owner``:
        a named folder's, only that uid's)."""
        return outputs_return.listing(outputs, owner)

    def outputs_read(
        self, outputs: str, relative: str, offset: int, limit: int, owner: int | None = None
    ) -> bytes:
        """A piece of one of them (:func:`.outputs_return.read_piece`)."""
        return outputs_return.read_piece(outputs, relative, offset, limit, owner)

    def outputs_seen(self, outputs: str, name: str) -> bool:
        """Whether a named outputs folder here holds the probe ``name`` (:func:`.outputs_return.seen`)."""
        return outputs_return.seen(outputs, name)

    def outputs_seed_listing(self, node_root: str, job_id: str, account: RunAs | None) -> dict:
        """The job's outputs folder here, made where missing, and its files
        (:func:`.outputs_seed.node_listing`)."""
        return outputs_seed.node_listing(node_root, job_id, account)

    def outputs_seed_room(self, node_root: str, job_id: str, needed: int, reserve: int) -> None:
        """Whether this disk takes the copy of the service's outputs folder (:func:`.outputs_seed.room`)."""
        outputs_seed.room(node_root, job_id, needed, reserve)

    def outputs_seed_write(
        self, node_root: str, job_id: str, pieces: list, account: RunAs | None, reserve: int
    ) -> None:
        """Pieces of the service's outputs folder written into the job's here (:func:`.outputs_seed.write`)."""
        outputs_seed.write(node_root, job_id, pieces, account, reserve)

    # --------------------------------------------------------------------- kernels

    def kernel_relay(self, attempt: Attempt, run: NodeRun, address: str) -> tuple[int, str]:
        """The relay of the kernel of dev environment node ``run`` (:mod:`.kernel_relay`): its
        port on ``address`` (this Ray node's) and its secret.  Started on the first ask, the
        same one answered while it lives; it ends when the node does.

        Raises:
            InvalidSpec: the job is no dev environment (no other job's folder is relayed).
            Conflict: the node does not run here (not yet, or any more).
        """
        if attempt.spec.devenv_of is None:
            raise InvalidSpec(f"job {attempt.job_id} is no dev environment: it has no kernel to relay")
        key = (attempt.job_id, attempt.number, run.name)
        with self._relays_lock:
            relay = self._relays.get(key)
            if relay is not None and not relay.closed:
                return relay.port, relay.secret
            if self._local.poll(attempt, run).state != "running":
                raise Conflict(
                    f"{run.name} of dev environment {attempt.job_id} does not run: its kernel cannot be reached"
                )
            relay = KernelRelay(attempt.jobdir.node(run.name).kernel, address)
            self._relays[key] = relay
        threading.Thread(
            target=self._end_relay,
            args=(key, relay, attempt, run),
            name=f"kernel-relay-{relay.port}-end",
            daemon=True,
        ).start()
        return relay.port, relay.secret

    def _end_relay(
        self, key: tuple[str, int, str], relay: KernelRelay, attempt: Attempt, run: NodeRun
    ) -> None:
        """Close ``relay`` once its node ends (the runner's end wakes :meth:`wait_exit` at once)."""
        try:
            while not relay.closed and not self.wait_exit(attempt, run, EXIT_RECHECK):
                pass
        finally:
            relay.close()
            with self._relays_lock:
                if self._relays.get(key) is relay:
                    del self._relays[key]

    def kernel_relays(self) -> list[dict]:
        """The relays open on this node: job, attempt, node, port and threads running."""
        with self._relays_lock:
            relays = list(self._relays.items())
        return [
            {
                "job_id": job_id,
                "attempt": number,
                "node": node,
                "port": relay.port,
                "threads": relay.threads(),
            }
            for (job_id, number, node), relay in relays
        ]

    # ------------------------------------------------------------------------ logs

    def log_streams(self, job_dir: str, nodes: list[str]) -> list[LogStream]:
        """The job's log streams on this node (see :func:`ma_jupyter.nodehost.logs.log_streams`),
        their ``file`` as this node sees it (the service keeps it only where its machine sees it too)."""
        return job_logs.log_streams(JobDir(Path(job_dir)), nodes)

    def read_log(self, job_dir: str, node: str, rank: int | None, offset: int, limit: int) -> tuple:
        """At most ``limit`` bytes of one stream from ``offset``, read as untrusted:
        ``("ok", data, size)``, ``("missing",)`` while it does not exist, or
        ``("refused", message)`` when the job left something unreadable there."""
        try:
            source = job_logs.open_log(JobDir(Path(job_dir)), node, rank)
        except RefusedFile as exc:
            return ("refused", exc.message)
        if source is None:
            return ("missing",)
        try:
            data, size = source.read(offset, limit)
        except RefusedFile as exc:
            return ("refused", exc.message)
        finally:
            source.close()
        return ("ok", data, size)

    def wait_log(self, job_dir: str, node: str, rank: int | None, size: int, timeout: float) -> int:
        """Block until the stream is bigger than ``size`` bytes, at most ``timeout`` seconds; its
        size then (-1 while it does not exist or cannot be read)."""
        deadline = time.monotonic() + timeout
        jd = JobDir(Path(job_dir))
        path = jd.root / jd.log_relative(node, rank)
        now = -1
        while True:
            try:
                st = os.lstat(path)  # looks only: the stream is opened as untrusted when read
                now = st.st_size
            except OSError:
                now = -1
            if now > size or time.monotonic() >= deadline:
                return now
            time.sleep(WAIT_STEP)


def agent_home() -> Path:
    """The agents' state folder on this machine: root's below ``/run`` (root's alone), another
    account's in the temporary folder, named by its uid."""
    if os.geteuid() == 0:
        return Path("/run/ma_jupyter/agent")
    return Path(tempfile.gettempdir()) / f"ma_jupyter-agent-{os.getuid()}"


def _raylet(node_id: str) -> dict | None:
    """The ``end_with`` entry of this node's raylet: the process Ray names as the one that started
    this worker (``RAY_RAYLET_PID``), else this worker's parent when that is a raylet; None when
    neither is known (the nodes then do not watch it)."""
    pid = os.environ.get("RAY_RAYLET_PID", "")
    if not pid.isdigit():
        parent = os.getppid()
        pid = str(parent) if procfs.command_name(parent) == "raylet" else ""
    if not pid:
        return None
    return hostwatch.host_process(int(pid), f"the raylet (pid {pid}) of Ray node {node_name(node_id)}")


def _machine_id() -> str:
    """This machine's boot id (the same for every Ray node on it), else its hostname."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip()
    except OSError:
        return os.uname().nodename
