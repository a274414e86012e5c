"""The local backend: each node of a job is a process tree on this machine, in its own sandbox.

A thin :class:`~ma_jupyter.backends.base.Backend` over three things of this machine:

1. one :class:`~ma_jupyter.nodehost.host.NodeHost`, which starts, polls, stops and reads the
   nodes (everything the contract asks of a node is delegated to it);
2. one :class:`~ma_jupyter.nodehost.ports.PortPool`, whose ports ``bind`` hands the tasks;
3. the inventory (the cluster's node names), which decides the cores of each simulated node.
"""

from __future__ import annotations

import math
import os
import socket
import subprocess
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from ...errors import InvalidSpec
from ...models import CacheInfo, Job, JobSpec, LogStream, NodeLaunch, NodeRun, RunAs
from ...modes.base import Placement, RemoteShell, TaskSlot
from ...nodehost import logs as job_logs
from ...nodehost import network as network_ns
from ...nodehost import remote_shells
from ...nodehost.host import NodeHost
from ...nodehost.host_policy import load_policy
from ...nodehost.node_network import task_address
from ...nodehost.ports import PortPool
from ..base import (
    MAX_PROCESS_LOOKS,
    Attempt,
    Backend,
    DatasetState,
    NodeUsage,
    ProcessLook,
)


class LocalBackend(Backend):
    """Runs nodes as sandboxed process trees on this host.

    Args:
        sandbox: ``bubblewrap`` or ``symlink``; default: bubblewrap when ``bwrap`` is installed
            and works here, unless ``MA_JUPYTER_SANDBOX=none``.
        inventory: the cluster's node names in order (default: from ``cluster.toml``).
        port_range: where reserved ports come from, ``[low, high)`` (default: below the
            kernel's ephemeral range, :class:`~ma_jupyter.nodehost.ports.PortPool`).
    """

    name = "local"
    #: mpirun reaches the other simulated nodes through an agent that enters their sandboxes
    remote_shell = remote_shells.AGENT
    #: the same where each node is a machine on its job's network (:mod:`.remote_shells`)
    remote_shell_on_job_network = remote_shells.AGENT_ON_JOB_NETWORK
    #: where sshd is installed and nodes are sandboxed: OpenSSH in every node (modes/ssh.py), as
    #: a real cluster's nodes have it; the agent above stays for machines without openssh-server
    ssh_shell = remote_shells.SSH
    #: the same where each node is a machine on its job's network
    ssh_shell_on_job_network = remote_shells.SSH_ON_JOB_NETWORK

    def __init__(
        self,
        sandbox: str | None = None,
        inventory: list[str] | None = None,
        port_range: tuple[int, int] | None = None,
    ):
        #: this machine's nodes: everything the contract asks of a node is its
        self.node_host = NodeHost(sandbox)
        #: the ports ``bind`` hands the tasks
        self.ports = PortPool(port_range)
        # the cluster's node names in order (default: from cluster.toml): they decide the cores
        # of each simulated node
        self._inventory = inventory

    def on_node_end(self, wake: Callable[[], None]) -> None:
        """Wake the service when a runner this process started ends (a pidfd per runner)."""
        self.node_host.on_node_end(wake)

    def close(self) -> None:
        self.node_host.close()

    # ------------------------------------------------------------------------- bind

    def bind(self, placement: Placement, *, reserve: bool) -> Placement:
        """Simulated nodes on this host: task k (in launch order) is ``<role>-<index>`` at the
        address ``10.254.0.<k+1>`` of its attempt's job network (:func:`.network.node_address`;
        where this service may not make namespaces, the nodes share the host's network and
        task k is at the loopback address ``127.0.1.<k+1>``) with two free ports (see
        :meth:`.PortPool.reserve_ports`), pinned to a slice of this machine's cores chosen by its inventory node
        (so two jobs on one node share cores)."""
        if self._inventory is None:
            from ...config import load_cluster

            self._inventory = [n.name for n in load_cluster().nodes]
        order = {name: i for i, name in enumerate(self._inventory)}
        cores = os.cpu_count() or 1
        own_machines = network_ns.namespaces_supported()
        if own_machines and len(placement.tasks) > network_ns.MAX_JOB_NODES:
            raise InvalidSpec(
                f"a job has at most {network_ns.MAX_JOB_NODES} nodes on this backend, not {len(placement.tasks)}"
            )
        tasks = []
        for k, task in enumerate(placement.tasks):
            width = min(cores, max(1, math.ceil(task.cpu_request)))
            start = order.get(task.host, 0) * width
            tasks.append(
                replace(
                    task,
                    hostname=f"{task.role}-{task.index}",
                    address=task_address(k),
                    ports=self.ports.reserve_ports(2, placement.port_range) if reserve else (0, 0),
                    cpus=tuple(sorted({(start + i) % cores for i in range(width)})),
                )
            )
        shell = self._remote_shell(placement.creator, own_machines)
        return replace(placement, tasks=tuple(tasks), remote_shell=shell)

    def _remote_shell(self, creator: str | None, own_machines: bool) -> RemoteShell:
        """OpenSSH in the nodes where sshd is installed, the nodes are sandboxed (each node's sshd
        needs the node's own view: its passwd, its ``/etc/ssh``) and ``creator``'s jobs do not
        run as root; else the agent.  A root node cannot run sshd: OpenSSH insists on privilege
        separation (chroot, setuid), which needs the capabilities the sandbox drops, and giving
        them back would hand them to the job too.  ``own_machines``: each node is a machine on
        its job's network (its interface is the job network's, the agent speaks TCP)."""
        agent = self.remote_shell_on_job_network if own_machines else self.remote_shell
        if self.isolation() != "bubblewrap" or not os.access(remote_shells.SSHD_PROGRAM, os.X_OK):
            return agent
        if _runs_as_root(creator):
            return agent
        return self.ssh_shell_on_job_network if own_machines else self.ssh_shell

    def reserve_ports(self, count: int, within: tuple[int, int] | None = None) -> tuple[int, ...]:
        """``count`` ports reserved until :meth:`release_ports` (see :meth:`.PortPool.reserve_ports`)."""
        return self.ports.reserve_ports(count, within)

    def release_ports(self, ports: list[int] | tuple[int, ...]) -> None:
        """Forget ports :meth:`reserve_ports` handed out."""
        self.ports.release_ports(ports)

    def hold_ports(self, ports: list[int] | tuple[int, ...]) -> None:
        """Reserve ports again (a restarted process re-attaching)."""
        self.ports.hold_ports(ports)

    def release(self, placement: Placement) -> None:
        self.ports.release_ports([p for task in placement.tasks for p in task.ports])

    def hold(self, placement: Placement) -> None:
        self.ports.hold_ports([p for task in placement.tasks for p in task.ports])

    # ------------------------------------------------------------------ the nodes

    def isolation(self) -> str:
        return self.node_host.isolation()

    def dryrun(self, attempt: Attempt) -> list[NodeLaunch]:
        return self.node_host.dryrun(attempt)

    def launch(self, attempt: Attempt, launches: list[NodeLaunch]) -> list[NodeRun]:
        """Start every node of the attempt here (:meth:`.NodeHost.launch`)."""
        return self.node_host.launch(attempt, launches)

    def poll(self, attempt: Attempt, run: NodeRun) -> NodeRun:
        return self.node_host.poll(attempt, run)

    def heartbeat(self, attempt: Attempt, run: NodeRun) -> float | None:
        """The node runner's heartbeat (:meth:`.NodeHost.heartbeat`)."""
        return self.node_host.heartbeat(attempt, run)

    def job_folders_free(self, host: str) -> tuple[str, int] | None:
        """Every node of this backend is this machine (:meth:`.NodeHost.job_folders_free`)."""
        return self.node_host.job_folders_free(host)

    def network_fault(self, host: str) -> str | None:
        """Every node of this backend is this machine: the answer of its last network probes
        (:meth:`.NodeHost.network_fault`), never waiting for one."""
        return self.node_host.network_fault(host)

    def card_fault(self, task: TaskSlot) -> str | None:
        """The first of the task's real cards this machine no longer shows or NVML reports lost
        (:meth:`.NodeHost.card_fault`)."""
        return self.node_host.card_fault(task)

    def stop(self, attempt: Attempt, runs: list[NodeRun], grace: float) -> None:
        """Stop the nodes and return once none of their processes is left (:meth:`.NodeHost.stop`)."""
        self.node_host.stop(attempt, runs, grace)

    # ------------------------------------------------------------------------ logs

    def code_sources(self, spec: JobSpec) -> dict[str, str] | None:
        """The algorithm folder's Python files (see :func:`.code.python_sources`)."""
        return self.node_host.code_sources(spec)

    def log_streams(self, job: Job) -> list[LogStream]:
        """The files below ``<job_dir>/logs`` (:meth:`.NodeHost.log_streams`)."""
        return self.node_host.log_streams(job)

    def open_log(self, job_id: str, node: str, rank: int | None) -> job_logs.LocalLogSource | None:
        """The log file opened as untrusted (see :mod:`.logs`)."""
        return self.node_host.open_log(job_id, node, rank)

    def failure(self, attempt: Attempt, run: NodeRun) -> tuple[int, int] | str | None:
        """The report the node runner moved to ``nodes/<node>/failure.json`` (or its refusal)."""
        return self.node_host.failure(attempt, run)

    def not_distributed(self, attempt: Attempt, run: NodeRun) -> int | None:
        """The report the node runner moved to ``nodes/<node>/not-distributed.json``."""
        return self.node_host.not_distributed(attempt, run)

    def explain(self, attempt: Attempt, run: NodeRun, lines: list[str]) -> str | None:
        """What ``lines`` hit, from the view the node ran in (:meth:`.NodeHost.explain`)."""
        return self.node_host.explain(attempt, run, lines)

    # ----------------------------------------------------------------------- looks

    def usage(self, job_id: str, runs: list[NodeRun]) -> list[NodeUsage] | None:
        """Each running node's use (:meth:`.NodeHost.usage`)."""
        return [NodeUsage(*used) for used in self.node_host.usage(job_id, runs)]

    def processes(self, job_id: str, runs: list[NodeRun]) -> dict[str, list[ProcessLook]] | None:
        """The processes below each running node's runner, at most :data:`MAX_PROCESS_LOOKS` of
        each (:meth:`.NodeHost.processes`)."""
        del job_id
        found = self.node_host.processes(runs, MAX_PROCESS_LOOKS)
        return {node: [ProcessLook(*seen) for seen in looks] for node, looks in found.items()}

    def open_shell(
        self, job: Job, node: str, rows: int, cols: int, command: list[str] | None = None
    ) -> socket.socket:
        """The node's shell agent (:meth:`.NodeHost.open_shell`)."""
        return self.node_host.open_shell(job, node, rows, cols, command)

    def start_outputs_reader(
        self, job: Job, argv: list[str], env: dict[str, str], output: int | None = None
    ) -> subprocess.Popen:
        """The program as the job's account, in a sandbox showing only the job's outputs,
        read-only (:meth:`.NodeHost.start_outputs_reader`)."""
        return self.node_host.start_outputs_reader(job, argv, env, output)

    def kept_until(self, attempt: Attempt, run: NodeRun) -> float | None:
        """The time the failed node's runner keeps its sandbox until (its ``kept.json``)."""
        return self.node_host.kept_until(attempt, run)

    def forget(self, job_id: str) -> None:
        """End the sandboxes a failed debug-terminal job keeps, off the caller's thread
        (:meth:`.NodeHost.forget`; contract rule 16)."""
        self.node_host.forget(job_id)

    # ------------------------------------------------------------ caches and data

    def caches(self, user: str | None, *, every_user: bool = False) -> list[CacheInfo]:
        """The size of ``user``'s cache (``every_user``: of every user's), see :mod:`.caches`."""
        return self.node_host.caches(user, every_user=every_user)

    def clear_cache(self, user: str | None) -> None:
        """Empty ``user``'s cache (the caller made sure no job of theirs runs)."""
        self.node_host.clear_cache(user)

    def job_account(self, user: str | None) -> RunAs | None:
        """The account of ``user``'s jobs by this machine's host rules (:mod:`~ma_jupyter.nodehost.host_policy`)."""
        return self.node_host.job_account(user)

    def look_at_dataset(self, user: str | None, source: str) -> DatasetState:
        """The dataset's state read as the job's account on this machine (:mod:`.prepare`)."""
        return DatasetState(*self.node_host.look_at_dataset(user, source))

    def copy_dataset(
        self, user: str | None, source: str, into: Path, cancel: threading.Event | None = None
    ) -> DatasetState:
        """The copy made as the job's account on this machine (:mod:`.prepare`)."""
        return DatasetState(*self.node_host.copy_dataset(user, source, into, cancel))


def _runs_as_root(creator: str | None) -> bool:
    """Whether ``creator``'s job nodes run as root here: a root service whose host rules keep
    the job in the service's own account (an admin's ``allow_root``, or a job of the service's
    own).  A user whose account cannot be settled is not root (the launch refuses the job)."""
    if os.geteuid() != 0:
        return False
    try:
        return load_policy().run_as(creator) is None
    except InvalidSpec:
        return False
