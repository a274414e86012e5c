"""One machine's nodes, hosted: what a backend asks of the machine its nodes run on.

:class:`NodeHost` is the node machinery's one face to a backend: the local backend holds one
for this machine, a Ray node's agent one for its Ray node, and the Ray backend one on the
service's machine (the outputs reader).  It starts, polls and stops the nodes of an attempt
that run here, reads their logs and their use, opens their debug terminal, reads their outputs,
and measures, clears and copies what the machine keeps for jobs (caches, datasets).

``launch`` starts one :mod:`ma_jupyter.nodehost.noderun` runner per node, in its own session, with the
node's stdout/stderr going straight to ``<job_dir>/logs/<node>.log``; the runner starts the
node's command inside bubblewrap (see :mod:`ma_jupyter.nodehost.bwrap`) and writes the exit code to
``<job_dir>/nodes/<node>/exit_code``.

Everything ``poll`` and ``stop`` need is durable: the runner's pid and start time (stored in the
:class:`~ma_jupyter.models.NodeRun`), the exit-code file, and a marker variable
(``MA_NODE_RUN=<job>/<attempt>/<node>/<nonce>``) in the environment of every process of the node,
so a service started after a crash still finds a node's processes, whatever sessions they made.

It knows nothing of the backend contract (``backends/base.py``): an attempt is what
:class:`HostedAttempt` names, and what the contract returns as its own types (a node's usage, a
process's look, a dataset's state) is handed back as plain tuples for the backend to wrap.
Which ports a task gets is :mod:`.ports`'s, which machine a task runs on the backend's.

Why one module: it is one object's state (the runners it started and
reaps, the egress gates it keeps, the network probe's last answers, the fork server) shared by
every call; what needs none of it lives in the rooms around it (:mod:`.node_network`,
:mod:`.node_cgroups`, :mod:`.probes`, :mod:`.ports`, :mod:`.stopping`, :mod:`.egress`, ...).
"""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import os
import secrets
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import psutil

from .. import accelerators, config
from ..errors import BackendUnavailable, Conflict, InvalidSpec, RefusedFile, ServerUnavailable
from ..jobdir import NO_IPYKERNEL_SAYS
from ..models import CacheInfo, Job, JobSpec, JobStatus, LogStream, NodeLaunch, NodeRun, RunAs
from ..modes.base import NodePlan, TaskSlot
from ..untrusted import read_small
from . import (
    caches,
    egress,
    outputs_reader,
    prepare,
    shell_agent,
    stopping,
    watchdog,
)
from . import logs as job_logs
from . import network as network_ns
from . import overlay as job_overlay
from .agent_wire import JOB_SECRET_ENV
from .bwrap import sandbox_argv
from .code import python_sources
from .forkserver import RunnerForkServer
from .host_policy import load_policy
from .instructions import RunnerInstructions
from .launch import compile_node_helpers, node_launches, prepare_node, with_machine_cards
from .mounts import Mount, path_hint
from .netcheck import NetworkCheck
from .node_cgroups import node_cgroup as _node_cgroup
from .node_cgroups import remove_node_cgroups
from .node_network import await_joined, network_spec
from .overlay import Overlay
from .prepare import DataState
from .probes import bwrap_works, user_namespace_works
from .processes import ExitWatcher, marked_processes, read_exit_code
from .procfs import (
    NODE_MARKER,
    descendants,
    ignores_signal,
    is_marked,
    process_look,
    process_start_time,
)
from .runner_env import runner_env
from .view import HELPERS_VIEW, SYSTEM_PATH, JobAttempt, NodeView, default_sandbox, host_workdir, launch_view
from .workcopy import copy_args, copy_needed, export_argv

#: seconds a debug terminal waits for the shell agent of a running node that is still starting
AGENT_START_WAIT = 30.0
#: seconds before a restarted service looks again for a running attempt's egress gate it did not find
REGATE_AGAIN = 10.0

#: one running node's use now: (node, cpu seconds, memory bytes, card percent, card memory MiB),
#: the fields of the contract's ``NodeUsage``
NodeUse = tuple[str, float, int, float | None, float | None]
#: one process of a running node: (pid, name, state, wait), the fields of the contract's ``ProcessLook``
ProcessSeen = tuple[int, str, str, str]


class HostedAttempt(JobAttempt, Protocol):
    """What the node host reads of one attempt: the contract's ``Attempt`` is one."""

    @property
    def number(self) -> int: ...

    @property
    def job_dir(self) -> Path: ...


log = logging.getLogger("ma_jupyter.nodehost")

#: seconds a closing host waits for a network probe under way, to remove what it made
PROBE_CLOSE_WAIT = 10.0


class NodeHost:
    """The nodes of one machine, run as sandboxed process trees here.

    Args:
        sandbox: ``bubblewrap`` or ``symlink``; default: bubblewrap when ``bwrap`` is installed
            and works here, unless ``MA_JUPYTER_SANDBOX=none``.
    """

    def __init__(self, sandbox: str | None = None):
        self._sandbox = sandbox
        # runners started by this process, kept only to reap them (state lives on disk)
        self._children: dict[int, subprocess.Popen] = {}
        self._exits: ExitWatcher | None = None
        # started on the first node (or by prestart_runners), and kept for the next ones
        self._forks = RunnerForkServer(runner_env)
        self._helpers_compiled = False
        #: the process whose end ends every node started from now on (``end_with`` of
        #: :mod:`.hostwatch`: a Ray node's raylet, set by its agent); None: none
        self.end_with: dict | None = None
        self._namespaces_swept = False
        #: ``<job id>-<attempt>`` -> the forwarder of that attempt's way out (``[network] egress``,
        #: :mod:`.egress`), while it runs
        self._gates: dict[str, egress.Forwarder] = {}
        #: per forwarder, the (runner pid, node namespace inode) pairs it lives for
        self._gate_runners: dict[str, list[tuple[int, int]]] = {}
        #: attempts a re-attached service looked for a gate to open again (:meth:`_regate`)
        #: (monotonic time before which it is not looked for again)
        self._gates_looked: dict[str, float] = {}
        #: where namespaces wait for their runners (None: ``<home>/netns``); a Ray node's agent
        #: names its own, since two agents of one machine share a home
        self.namespace_folder: Path | None = None
        #: the network probe's rules (:mod:`.netcheck`) around :meth:`probe_network`, looked up
        #: at each probe; its ``every`` is the seconds an answer stands for
        self.network_check = NetworkCheck(lambda: self.probe_network())
        self._probe_run_lock = threading.Lock()
        #: the caches whose locks a thread is looking at (:meth:`_release_locks_of`) -> whether
        #: another look was asked for meanwhile (a node that ended after its first look)
        self._releasing: dict[Path, bool] = {}
        self._releasing_lock = threading.Lock()
        #: guards the gates' tables (:meth:`_open_gate`, :meth:`_regate`)
        self._gates_lock = threading.Lock()

    def on_node_end(self, wake: Callable[[], None]) -> None:
        """Wake the service when a runner this process started ends (a pidfd per runner)."""
        self._exits = ExitWatcher(wake)

    def prestart_runners(self) -> None:
        """Start the node runners' fork server now rather than at the first node (a Ray node's
        agent, whose first job should not wait for it); where it cannot start, runners start
        the slow way."""
        self._compile_helpers()
        if self.isolation() == "bubblewrap":
            user_namespace_works(self._forks)  # checked now rather than at the first node
        try:
            self._forks.start()
        except ServerUnavailable as exc:
            print(f"[ma_jupyter] {exc}: node runners start without it", file=sys.stderr, flush=True)

    def _compile_helpers(self) -> None:
        """Once per backend: the compiled modules of what the nodes run from this package
        (:func:`.launch.compile_node_helpers`)."""
        if not self._helpers_compiled:
            compile_node_helpers()
            self._helpers_compiled = True

    def close(self) -> None:
        self._forks.close()
        if self._exits is not None:
            self._exits.close()
        self._remove_probes()

    def _remove_probes(self) -> None:
        """What a network probe made is gone once the host closes: a probe under way (seconds)
        is waited for, up to :data:`PROBE_CLOSE_WAIT`; its namespaces stay mounted otherwise,
        and the folder holding them (a home, a test's or a benchmark's temporary folder)
        cannot be removed until the next service's sweep."""
        probes = self._probes_folder()
        if not self._probe_run_lock.acquire(timeout=PROBE_CLOSE_WAIT):
            return  # left to the next start's sweep
        try:
            network_ns.sweep(probes)
        finally:
            self._probe_run_lock.release()

    def _probes_folder(self) -> Path:
        folder = self.namespace_folder or config.home() / "netns"
        return folder.with_name(folder.name + "-probe")

    # ------------------------------------------------------------------ isolation

    def isolation(self) -> str:
        if self._sandbox is None:
            self._sandbox = default_sandbox()
            if self._sandbox == "bubblewrap" and not bwrap_works():
                self._sandbox = "symlink"
        return self._sandbox

    # ---------------------------------------------------------------------- launch

    def dryrun(self, attempt: HostedAttempt) -> list[NodeLaunch]:
        return node_launches(attempt, self.isolation())

    def launch(self, attempt: HostedAttempt, launches: list[NodeLaunch]) -> list[NodeRun]:
        if len(launches) != len(attempt.plans):
            raise ValueError(f"{len(launches)} launches for the {len(attempt.plans)} nodes of the attempt")
        # One secret per attempt, seen only by this attempt's nodes: peers of a job use it to
        # recognise each other (e.g. mpirun's agent entering another node), other jobs cannot.
        policy = config.load_egress()  # the admin's, as the file says now
        if policy is not None and (why := egress.why_not_enforceable()):
            raise BackendUnavailable(
                f"{config.cluster_file()}: [network] egress lists destinations, but {why}"
            )
        return self._start_all(
            attempt, launches, secrets.token_hex(16), namespace_key=attempt.job_id, egress_policy=policy
        )

    def _job_namespace(
        self, key: str, plans: list[NodePlan], overlay: Overlay | None = None, *, gateway: bool = False
    ) -> network_ns.JobNetwork | None:
        """The network of an attempt's nodes ``plans`` (see :mod:`.network`), its namespaces
        kept as files in the namespace folder until its runners are in; None where this service
        may not make namespaces (not root: the nodes then share the host's network).

        1. each node a machine of its own at its task's address on the attempt's job network
           (:func:`.network.make_job_network`), its files ``<folder>/<key>.*``, with its way out
           to the egress gate where ``gateway``;
        2. with ``overlay``, the job network's switch also holds this machine's end of the
           attempt's overlay (:mod:`.overlay`), and the tasks' addresses are overlay addresses.

        Raises:
            BackendUnavailable: it cannot be made, or a task's address is not on the job network.
        """
        if not network_ns.namespaces_supported():
            if overlay is not None:
                raise BackendUnavailable("cannot make the job's network namespace: not root here")
            return None
        folder = self.namespace_folder or config.home() / "netns"
        try:
            network_ns.private_folder(folder)  # before the sweep, which removes what is there
            if not self._namespaces_swept:  # what a service that ended while launching left
                network_ns.sweep(folder)
                self._namespaces_swept = True
            addresses = [(p.name, p.task.address) for p in plans]
            if overlay is not None:
                return job_overlay.make(folder, key, addresses, overlay)
            for name, address in addresses:
                if not network_ns.on_job_network(address):
                    raise BackendUnavailable(
                        f"node {name} was bound to {address}, not an address of the job network "
                        f"({network_ns.JOB_NETWORK}/{network_ns.JOB_PREFIX}): submit the job again"
                    )
            return network_ns.make_job_network(folder, key, addresses, gateway=gateway)
        except OSError as exc:
            raise BackendUnavailable(f"cannot make the job's network namespace: {exc}") from exc

    def start_nodes(
        self,
        attempt: HostedAttempt,
        launches: list[NodeLaunch],
        job_secret: str,
        *,
        deny_tcp: list[list[int]] | None = None,
        overlay: Overlay | None = None,
    ) -> list[NodeRun]:
        """Start the nodes of an attempt that run on this host, as :meth:`launch` starts each of
        its nodes.

        For a backend that runs the other nodes on other machines (the Ray backend's node
        agent): the caller gives the attempt's shared secret and stops the nodes it started
        when another machine's fail.  The nodes' network (see :mod:`.network`):

        1. ``overlay``: each node a machine of its own on this machine's part of the attempt's
           overlay (:mod:`.overlay`: a namespace per node, a switch holding the VXLAN device),
           entered by every runner before it starts anything, the files dropped once they are
           in (as :meth:`launch` does);
        2. else ``deny_tcp`` (``[low, high]`` port ranges): the nodes share the host's network,
           each fenced (:func:`.network.fence`);
        3. else the host's network, unfenced.

        All or nothing: when one node cannot start, the ones started are stopped.

        Raises:
            InvalidSpec: a node would run as another account without a sandbox.
            BackendUnavailable: the namespace cannot be made, or a runner did not enter it.
        """
        key = f"{attempt.job_id}-{attempt.number}" if overlay is not None else None
        return self._start_all(
            attempt,
            launches,
            job_secret,
            namespace_key=key,
            planned_elsewhere=True,
            overlay=overlay,
            deny_tcp=deny_tcp,
        )

    def _start_all(
        self,
        attempt: HostedAttempt,
        launches: list[NodeLaunch],
        job_secret: str,
        *,
        namespace_key: str | None,
        planned_elsewhere: bool = False,
        overlay: Overlay | None = None,
        deny_tcp: list[list[int]] | None = None,
        egress_policy: tuple[config.EgressRule, ...] | None = None,
    ) -> list[NodeRun]:
        """The one launch sequence of :meth:`launch` and :meth:`start_nodes`, in this order:

        1. every node's view is built before anything starts, its cards as this machine shows
           them now (a card node gone since the plan refuses);
        2. with ``namespace_key``, the nodes' job network is made (closed, or with ``overlay``
           joined to the attempt's other machines; none where this service may not make a
           closed one): the nodes then resolve names from ``/etc/hosts`` only; with
           ``egress_policy`` (a closed network), or an ``overlay`` carrying the gate the
           service resolved (``overlay.egress``), its gate is opened before any runner starts
           (:mod:`.egress`: names as looked up ahead, added to every node's ``/etc/hosts``) and its
           forwarder, this process's, runs once every runner is in, until none is left;
        3. each node's runner is started, entering the namespace first thing (or fenced with
           ``deny_tcp``);
        4. once every runner is in, the namespace's file is dropped: it lives exactly as long as
           a process of the job there.

        All or nothing: when a step fails, every node of ``launches`` is stopped (by its marker
        too: the one that failed may have a runner), then the error is raised.
        """
        plans = {plan.name: plan for plan in attempt.plans}
        prepared = []
        for launch in launches:
            plan = plans[launch.name]
            launch = with_machine_cards(launch, plan.task.card_type, planned_elsewhere=planned_elsewhere)
            prepared.append((plan, launch, launch_view(attempt, launch)))
        _refuse_unsandboxed([view for _, _, view in prepared])
        attempt.jobdir.logs.mkdir(parents=True, exist_ok=True)
        plans_here = [plan for plan, _, _ in prepared]
        # the way out: the local policy's, or the one the service sent with an overlay
        sent = overlay.egress if overlay is not None else None
        gateway = (egress_policy is not None and overlay is None) or sent is not None
        namespace = (
            self._job_namespace(namespace_key, plans_here, overlay, gateway=gateway and overlay is None)
            if namespace_key
            else None
        )
        gate, listener = None, None
        if gateway and namespace is not None and namespace.switch is not None:
            try:
                if sent is not None:  # resolved by the service, names included
                    gate = sent
                else:
                    bounds = config.load_egress_bounds()
                    gate = egress.gate_for(egress_policy or (), attempt.spec.creator, bounds)
                listener = egress.open_gate(namespace.switch, gate)
            except BaseException:
                network_ns.remove_job_network(namespace)
                raise
            for problem in gate.problems:
                print(
                    f"[ma_jupyter] job {attempt.job_id}: [network] egress: {problem}",
                    file=sys.stderr,
                    flush=True,
                )
            extra = egress.hosts_lines(gate)
            prepared = [
                (p, launch, dataclasses.replace(v, hosts=v.hosts + extra)) for p, launch, v in prepared
            ]
        network: dict[str, dict] = {
            p.name: {"deny_tcp": deny_tcp} if deny_tcp is not None else {} for p in plans_here
        }
        if namespace:  # no name server there: the nodes resolve names from /etc/hosts only
            network = {name: network_spec(namespace, name) for name in network}
            prepared = [
                (p, launch, dataclasses.replace(v, private_network=True)) for p, launch, v in prepared
            ]
        runs: list[NodeRun] = []
        try:
            for plan, launch, view in prepared:
                runs.append(self._launch_node(attempt, plan, launch, view, job_secret, network[plan.name]))
            # the locks no process holds in the user's cache, looked at off the launch (caches
            # rule 6: it waits a second, the caller holds the supervisor's lock)
            self._release_locks_of(attempt.spec.creator)
            if namespace:
                inodes = {name: inode for name, (_, inode) in namespace.nodes.items()}
                await_joined(runs, inodes, self._alive)
                if listener is not None and gate is not None:
                    watched = [(run.pid, inodes[run.name]) for run in runs if run.pid is not None]
                    self._open_gate(f"{attempt.job_id}-{attempt.number}", listener, gate, watched)
                    listener = None
        except BaseException:
            started = {r.name for r in runs}
            rest = [NodeRun(name=p.name, host=p.task.host) for p, _, _ in prepared if p.name not in started]
            self.stop(attempt, runs + rest, grace=1.0)
            raise
        finally:
            if listener is not None:  # never handed to a forwarder
                listener.close()
            if namespace:  # each lives on while a process of the job is in it
                network_ns.remove_job_network(namespace)
        return runs

    def _open_gate(
        self, key: str, listener: socket.socket, gate: egress.Gate, watched: list[tuple[int, int]]
    ) -> None:
        """Start the forwarder of an attempt's gate (:class:`.egress.Forwarder`); it ends once
        no runner of ``watched`` (runner pid, its node's namespace inode: a list others may add
        to) is in its node's namespace."""

        def alive() -> bool:
            # a runner lives in its node's namespace: a pid reused since is elsewhere
            return any(network_ns.namespace_of(pid) == inode for pid, inode in list(watched))

        forwarder = egress.Forwarder(listener, gate, alive, key)
        with self._gates_lock:  # the forwarders of attempts that ended are forgotten
            ended = {k for k, f in self._gates.items() if not f.running()}
            self._gates = {k: f for k, f in self._gates.items() if k not in ended}
            self._gate_runners = {k: w for k, w in self._gate_runners.items() if k not in ended}
            self._gates[key] = forwarder
            self._gate_runners[key] = watched

    def _regate(self, attempt: HostedAttempt, run: NodeRun) -> None:
        """For a running node of an attempt this process did not launch (a restarted service
        re-attaching): open its attempt's egress gate again where it had one, under the policy
        as ``cluster.toml`` says now (:func:`.egress.reopen_gate`), and keep it for as long as a
        runner seen here lives."""
        key = f"{attempt.job_id}-{attempt.number}"
        inode = network_ns.namespace_of(run.pid) if run.pid is not None else None
        if inode is None:
            return
        with self._gates_lock:
            watched = self._gate_runners.get(key)
            if watched is not None:
                if (run.pid, inode) not in watched:
                    watched.append((run.pid, inode))
                return
            if time.monotonic() < self._gates_looked.get(key, float("-inf")):
                return
            if len(self._gates_looked) > 10_000:  # bounded: looking again costs one failed bind
                self._gates_looked.clear()
            # looked for again only after a while (a gate not found now, e.g. a runner's switch
            # not seen at this moment or the policy fixed since, may be found then)
            self._gates_looked[key] = time.monotonic() + REGATE_AGAIN
            # the other nodes' looks add their runners here meanwhile
            watched = self._gate_runners[key] = [(run.pid, inode)]

        def reopen() -> None:  # off the caller's thread: names may take seconds to resolve
            listener = None
            try:
                policy = config.load_egress()
                if policy is not None and not egress.why_not_enforceable():
                    # a few tries: a socket of the ended service's forwarder may still hold the
                    # port for a moment
                    for wait in (0.0, 0.5, 1.0, 2.0):
                        time.sleep(wait)
                        listener = egress.reopen_gate(run.pid)
                        if listener is not None:
                            break
                if listener is not None:
                    gate = egress.resolve(
                        policy or (), user=attempt.spec.creator, bounds=config.load_egress_bounds()
                    )
                    self._open_gate(key, listener, gate, watched)
                    return
            except InvalidSpec as exc:
                print(
                    f"[ma_jupyter] job {attempt.job_id}: egress gate left closed: {exc.message}",
                    file=sys.stderr,
                )
            with self._gates_lock:
                if self._gate_runners.get(key) is watched:
                    del self._gate_runners[key]
            if listener is not None:
                listener.close()

        threading.Thread(target=reopen, name=f"regate-{key}", daemon=True).start()

    def _launch_node(
        self,
        attempt: HostedAttempt,
        plan: NodePlan,
        launch: NodeLaunch,
        view: NodeView,
        job_secret: str,
        network: dict | None = None,
    ) -> NodeRun:
        nd = attempt.jobdir.node(launch.name)
        _end_kept(nd)  # an earlier attempt's kept sandbox holds the node's debug terminal
        prepare_node(view)
        node_dir = nd.root
        marker = f"{attempt.job_id}/{attempt.number}/{launch.name}/{secrets.token_hex(4)}"
        nd.marker.write_text(marker + "\n")
        # the dry run's environment plus only the launch-only variables (LAUNCH_ENV)
        env = {**launch.env, NODE_MARKER: marker, JOB_SECRET_ENV: job_secret}
        if view.sandbox == "symlink":
            for folder in (nd.home, nd.tmp):
                folder.mkdir(exist_ok=True)

        # the node's first phase fills its working copy first, at its first launch only
        copy = copy_needed(view)
        first = "on_start" if launch.on_start else "argv"

        # the node's own cgroup, where one can be made here: the runner makes it, and the
        # sandbox shows it (and no other job's) under /sys/fs/cgroup
        node_cgroup = _node_cgroup(attempt.job_id, attempt.number, launch.name)

        def wrap(command: list[str], phase: str = "") -> list[str]:
            return sandbox_argv(view, command, copy=copy and phase == first, cgroup=node_cgroup)

        limits = config.load_cluster().limits
        # --debug-terminal: the node's command runs under the shell agent, which serves the
        # terminal from inside the command's own sandbox (see .shell_agent); only in a sandbox:
        # a debug shell never runs in the host's own view
        terminal = attempt.spec.debug_terminal and view.sandbox == "bubblewrap"
        command = launch.command
        if terminal:
            command = shell_agent.command_argv(
                view.image.python, HELPERS_VIEW, attempt.job_id, launch.name, launch.command
            )
        spec = RunnerInstructions(
            node=launch.name,
            node_dir=str(node_dir),
            rank_log_dir=str(attempt.jobdir.rank_dir(launch.name)),
            sandbox=view.sandbox,
            argv=wrap(command, "argv"),
            # The environment the runner starts each phase with.  bubblewrap gets a fixed one (the
            # job's variables are applied inside, after the switch to the job's account); only
            # the symlink mode, which never runs as another account, hands the job's to it.
            env=env
            if view.sandbox == "symlink"
            else {"PATH": SYSTEM_PATH, "LANG": "C.UTF-8", NODE_MARKER: marker},
            # bubblewrap: the variables the runner hands to the sandbox as a file (never argv)
            job_env=env if view.sandbox == "bubblewrap" else None,
            cwd=host_workdir(view),
            cpus=list(view.cpus),
            # the spec's memory per node (its tmpfs included): the runner's watchdog ends the node
            # past it; the admin's bounds on its processes and on the job's logs (noderun rule 1)
            memory_gb=plan.task.memory_gb or None,
            max_processes=limits.max_node_processes,
            # the node's own cgroup (memory, tmpfs included, and processes bounded by the kernel,
            # see .cgroup), where one can be made here; None: the watchdog bounds its memory
            cgroup=node_cgroup,
            # the node in a user namespace of its own, where its process limit is its own count
            own_user_namespace=view.sandbox == "bubblewrap" and user_namespace_works(self._forks),
            # the account the node's processes run as (the kernel's process limit spares root)
            account_uid=view.run_as.uid if view.run_as else os.geteuid(),
            max_log_bytes=int(limits.max_log_mb * (1 << 20)),
            logs_dir=str(attempt.jobdir.logs),
            # the jobs folder's disk reserve: a log flood under it ends the job at the runner's pace
            disk_reserve_bytes=int(limits.disk_reserve_mb * (1 << 20)),
            disk_flood_rate=config.DISK_FLOOD_RATE,
            on_start=wrap(launch.on_start, "on_start") if launch.on_start else None,
            on_stop=wrap(launch.on_stop) if launch.on_stop else None,
            # the node's working copy: filled by its first phase (bubblewrap) or by the runner
            # (symlink mode) at its first launch; what the job wrote there kept in its outputs
            # after the last phase
            copy=copy_args(view) if copy and view.sandbox == "symlink" else None,
            export=export_argv(view),
            workdir=view.working_copy.source if view.working_copy else None,
            # the command runs under the debug terminal's agent (the terminal can be opened)
            shell_agent=terminal,
            # the process whose end ends the node (noderun rule 8): a Ray node's raylet
            end_with=self.end_with,
            # a failed command keeps the sandbox for the debug terminal this long ([limits])
            keep_failed_seconds=limits.debug_keep_hours * 3600.0 if terminal else 0,
            # the user's cache lease, held by the runner while it lives (caches rule 6)
            cache_lease=str(caches.lease_file(Path(view.cache.source))) if view.cache else None,
            # where its network rules hold: the attempt's namespace, or a fence (see .network)
            **(network or {}),
        )
        spec_file = nd.runner_spec
        spec.write(spec_file)  # it holds the job's variables: the service's user alone may read it
        fd = _open_log(attempt.jobdir.node_log(plan.name), plan.name)
        try:
            pid, started = self._start_runner(spec_file, node_dir, marker, fd)
        finally:
            os.close(fd)
        if self._exits is not None:
            self._exits.add(pid)
        run = NodeRun(
            name=plan.name,
            role=plan.task.role,
            index=plan.task.index,
            host=plan.task.host,
            hostname=view.hostname,
            address=plan.task.address,
            pid=pid,
            start_time=started,
            primary=plan.primary,
            state="running",
            # global ranks: every worker runs `slots` processes, numbered node by node
            ranks=[plan.task.index * plan.task.slots + r for r in range(plan.task.slots)]
            if plan.rank_logs
            else [],
        )
        nd.run_record.write_text(run.model_dump_json())
        return run

    def _start_runner(
        self, spec_file: Path, node_dir: Path, marker: str, log_fd: int
    ) -> tuple[int, float | None]:
        """Start a node's runner with its stdout and stderr on ``log_fd`` and ``marker`` in its
        environment: forked by the fork server (:mod:`.forkserver`), or started as a process of
        its own where the server cannot fork it; its pid and start time."""
        self._compile_helpers()
        try:
            return self._forks.fork_runner(str(spec_file), str(node_dir), marker, log_fd)
        except ServerUnavailable as exc:
            print(f"[ma_jupyter] {exc}: this node runner starts without it", file=sys.stderr, flush=True)
        except OSError as exc:
            # the server took the request and gave no answer (it is killed now): a runner it
            # forked meanwhile carries the marker, written first thing after the fork
            time.sleep(0.05)
            _end_marked(marker)
            raise BackendUnavailable(f"cannot start the node runner: {exc}") from exc
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "ma_jupyter.nodehost.noderun", str(spec_file)],
                stdin=subprocess.DEVNULL,
                stdout=log_fd,
                stderr=log_fd,
                env={**runner_env(), NODE_MARKER: marker},
                cwd=str(node_dir),
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            raise BackendUnavailable(f"cannot start the node runner: {exc}") from exc
        self._children[proc.pid] = proc
        return proc.pid, process_start_time(proc.pid)

    # ------------------------------------------------------------------------ poll

    def _reap(self) -> None:
        for pid, proc in list(self._children.items()):
            if proc.poll() is not None:
                self._children.pop(pid, None)  # the loop and finishing threads both reap

    def _alive(self, run: NodeRun) -> bool:
        """Whether the runner process of ``run`` is still the one that was launched."""
        self._reap()
        if run.pid is None:
            return False
        started = process_start_time(run.pid)
        if started is None:
            return False
        return run.start_time is None or abs(started - run.start_time) < 0.05

    def poll(self, attempt: HostedAttempt, run: NodeRun) -> NodeRun:
        exit_file = attempt.jobdir.node(run.name).exit_code
        code = read_exit_code(exit_file)
        if code is None:
            if run.pid is None:
                return run
            if self._alive(run):
                self._regate(attempt, run)
                return run.model_copy(update={"state": "running", "exit_code": None})
            code = read_exit_code(exit_file)  # it may have finished between the two looks
        if run.state == "running":  # its end, seen now (once): caches rule 6
            self._release_locks_of(attempt.spec.creator)
        if code is not None:
            return run.model_copy(update={"state": "exited", "exit_code": code})
        return run.model_copy(update={"state": "lost"})

    def _release_locks_of(self, user: str | None) -> None:
        """Remove the build locks of ``user``'s cache that no process holds open any more
        (:mod:`.caches` rule 6), on a thread of its own (it looks twice, a second apart), one at a
        time per cache: a job waiting behind a lock of a job that just ended goes on."""
        cache = caches.cache_dir(user)
        with self._releasing_lock:
            if cache in self._releasing:
                self._releasing[cache] = True  # its thread looks once more: never a thread each
                return
            self._releasing[cache] = False

        def release() -> None:
            while True:
                try:
                    released = caches.release_stale_locks(cache, unheld=True)
                    if released:
                        log.info("released stale locks in %s: %s", cache, released[:5])
                except OSError as exc:
                    log.warning("could not look for stale locks in %s: %s", cache, exc)
                finally:
                    with self._releasing_lock:
                        again = self._releasing.pop(cache, False)
                        if again:
                            self._releasing[cache] = False
                if not again:
                    return

        try:
            threading.Thread(target=release, name="cache-locks", daemon=True).start()
        except RuntimeError as exc:  # no thread to be had now: the next launch or end looks
            with self._releasing_lock:
                self._releasing.pop(cache, None)
            log.warning("could not look for stale locks in %s: %s", cache, exc)

    def heartbeat(self, attempt: HostedAttempt, run: NodeRun) -> float | None:
        """The time of the node runner's heartbeat file (it refreshes it every second), a stat
        that follows no link; before its first beat, the runner's start (one that froze before
        beating is judged from then); None when neither is known."""
        try:
            return os.lstat(attempt.jobdir.node(run.name).heartbeat).st_mtime
        except OSError:
            return run.start_time

    def job_folders_free(self, host: str) -> tuple[str, int] | None:
        """Every node of this backend is this machine (``host`` does not matter): its job
        folders' root and the free bytes there."""
        del host
        root = config.jobs_root()
        free = disk_free(root)
        return None if free is None else (str(root), free)

    def network_fault(self, host: str) -> str | None:
        """Every node of this backend is this machine (``host`` does not matter): the answer of
        :attr:`network_check` (:mod:`.netcheck`: the last probes' answer, never waiting for one;
        a new probe of :meth:`probe_network` on a thread of its own once it is old; a fault once
        two failed in a row).  None where this service makes no namespaces (not root: its
        nodes share the host's network)."""
        del host
        if not network_ns.namespaces_supported():
            return None
        return self.network_check.answer()

    def probe_network(self) -> str | None:
        """Why this machine cannot give a job its network now, or None: a job network of two
        nodes made, crossed and removed as an attempt's would be
        (:func:`.network.probe_job_network`), in a folder beside the attempts' (their sweep
        never removes a probe's), itself swept of what a killed service left."""
        probes = self._probes_folder()
        with self._probe_run_lock:  # one probe at a time: each sweeps the folder first
            try:
                network_ns.private_folder(probes)
                network_ns.sweep(probes)
            except OSError as exc:
                return f"the job network cannot be made: {exc}"
            return network_ns.probe_job_network(probes, f"probe-{os.getpid()}")

    def card_fault(self, task: TaskSlot) -> str | None:
        """The first of the task's real cards that this machine no longer shows, or that NVML
        reports lost (:func:`ma_jupyter.accelerators.card_fault`)."""
        if not task.card_type:
            return None
        for index in task.devices:
            reason = accelerators.card_fault(task.card_type, index)
            if reason is not None:
                return reason
        return None

    # ------------------------------------------------------------------------ stop

    def _marker(self, attempt: HostedAttempt, run: NodeRun) -> str | None:
        return self._read_marker(attempt.jobdir, run.name)

    @staticmethod
    def _read_marker(jd, node: str) -> str | None:
        """The marker the node's processes carry in their environment (its ``marker`` file)."""
        try:
            relative = jd.node(node).marker.relative_to(jd.root)
            return read_small(jd.root, str(relative), limit=4096).decode().strip()
        except (OSError, ValueError, RefusedFile):
            return None

    def _leftovers(self, attempt: HostedAttempt, runs: list[NodeRun]) -> list[psutil.Process]:
        self._reap()
        found: dict[int, psutil.Process] = {}
        for run in runs:
            marker = self._marker(attempt, run)
            if marker:
                for proc in marked_processes(marker):
                    found[proc.pid] = proc
            if self._alive(run):
                found[run.pid] = psutil.Process(run.pid)
        return list(found.values())

    def stop(self, attempt: HostedAttempt, runs: list[NodeRun], grace: float) -> None:
        """TERM each node's runner (it relays the signal to the node's processes); where a runner
        has not claimed the relay within :data:`.stopping.RELAY_WAIT` seconds (frozen), TERM the
        node's processes here instead (:mod:`.stopping`: never twice, never bubblewrap); wait up
        to ``grace`` seconds, then KILL every process carrying the node's marker; return once none
        is left."""
        for run in runs:
            if self._alive(run):
                try:
                    os.killpg(run.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        start = time.monotonic()
        deadline = start + max(grace, 0.0)
        # a short grace period leaves half of it to the processes signalled here
        relay_by = start + min(stopping.RELAY_WAIT, max(grace, 0.0) / 2)
        unrelayed = [r for r in runs if self._alive(r)]
        signalled: list[psutil.Process] = []  # what this backend TERMed itself
        while time.monotonic() < deadline:
            unrelayed = [r for r in unrelayed if self._alive(r) and not self._relayed(attempt, r)]
            if unrelayed and time.monotonic() >= relay_by:
                for run in unrelayed:
                    signalled += self._relay_stop(attempt, run)
                unrelayed = []
            live = [r for r in runs if self._alive(r)]
            if not live:
                break
            if signalled and not unrelayed and all(_ended(p) for p in signalled):
                # the frozen runners' processes saved and ended: the runners cannot end by
                # themselves, nothing is left to wait for
                frozen = {r.name for r in runs if self._relayed_by_backend(attempt, r)}
                if all(r.name in frozen for r in live):
                    break
            time.sleep(0.05)
        deadline = time.monotonic() + 30.0
        while True:
            left = self._leftovers(attempt, runs)
            if not left:
                remove_node_cgroups(attempt, runs)  # a runner killed here could not
                return
            for run in runs:
                if self._alive(run):
                    try:
                        os.killpg(run.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            for proc in left:
                try:
                    proc.kill()
                except psutil.Error:
                    pass
            if time.monotonic() > deadline:
                names = ", ".join(f"{p.pid}" for p in left)
                raise BackendUnavailable(f"processes {names} of job {attempt.job_id} survive SIGKILL")
            time.sleep(0.05)

    def _relayed(self, attempt: HostedAttempt, run: NodeRun) -> bool:
        """Whether the stop's relay of ``run`` is claimed (by its runner, or already here)."""
        return stopping.holder(attempt.jobdir.node(run.name).stop_claim) is not None

    def _relayed_by_backend(self, attempt: HostedAttempt, run: NodeRun) -> bool:
        return stopping.holder(attempt.jobdir.node(run.name).stop_claim) == stopping.BACKEND

    def _relay_stop(self, attempt: HostedAttempt, run: NodeRun) -> list[psutil.Process]:
        """Deliver the stop's SIGTERM to the node's processes for a runner that did not (rule 2
        of :mod:`.stopping`), when this backend wins the claim; the processes signalled that the
        signal can end (not those ignoring it, whose end :meth:`stop` would wait for in vain)."""
        nd = attempt.jobdir.node(run.name)
        if run.pid is None or not stopping.claim(nd.stop_claim, stopping.BACKEND):
            return []
        try:
            relative = nd.runner_spec.relative_to(attempt.jobdir.root)
            sandbox = RunnerInstructions.from_json(
                read_small(attempt.jobdir.root, str(relative), limit=16 << 20), unversioned=True
            ).sandbox
        except (OSError, ValueError, RefusedFile):
            sandbox = "bubblewrap"  # the safe reading: bubblewrap's own processes are spared
        signalled = []  # those the signal can end: waited for (but no longer than the grace)
        for pid in stopping.targets(run.pid, sandbox):
            try:
                proc = psutil.Process(pid)
                ignores = _ignores_term(pid)
                proc.send_signal(signal.SIGTERM)
                if not ignores:
                    signalled.append(proc)
            except psutil.Error:
                pass
        said = (
            f"[ma_jupyter] the node runner of {run.name} did not relay the stop (it does not answer): "
            f"the platform sent SIGTERM to the node's processes itself\n"
        )
        print(said, end="", file=sys.stderr, flush=True)
        try:  # said in the node's log too, where the user looks for the missing save
            fd = _open_log(attempt.jobdir.node_log(run.name), run.name)
            try:
                os.write(fd, said.encode())
            finally:
                os.close(fd)
        except (OSError, RefusedFile):
            pass
        return signalled

    # ------------------------------------------------------------------------ logs

    def code_sources(self, spec: JobSpec) -> dict[str, str] | None:
        """The algorithm folder's Python files (see :func:`.code.python_sources`)."""
        return python_sources(Path(spec.algorithm)) if spec.algorithm else None

    def log_streams(self, job: Job) -> list[LogStream]:
        """The files below ``<job_dir>/logs``, looked at with ``lstat`` only; every one readable
        directly on this machine (the job folder's own path)."""
        return job_logs.log_streams(config.jobdir(job.id), [n.name for n in job.nodes])

    def open_log(self, job_id: str, node: str, rank: int | None) -> job_logs.LocalLogSource | None:
        """The log file opened as untrusted (see :mod:`.logs`)."""
        return job_logs.open_log(config.jobdir(job_id), node, rank)

    def failure(self, attempt: HostedAttempt, run: NodeRun) -> tuple[int, int] | str | None:
        """The report the node runner moved to ``nodes/<node>/failure.json`` (or its refusal)."""
        return job_logs.failure(attempt.jobdir, run.name)

    def not_distributed(self, attempt: HostedAttempt, run: NodeRun) -> int | None:
        """The report the node runner moved to ``nodes/<node>/not-distributed.json``."""
        return job_logs.not_distributed(attempt.jobdir, run.name)

    def explain(self, attempt: HostedAttempt, run: NodeRun, lines: list[str]) -> str | None:
        """A refused write in ``lines`` (which mount of the node's view it hit, why, and how to
        change it), or a file missing from what each node of a multi-node job has of its own
        (its ``/tmp``, its working copy): :func:`.mounts.path_hint`, from the view the node ran in;
        a dev environment's interpreter without ipykernel: the line saying what to install."""
        if attempt.spec.devenv_of is not None:
            said = next((line for line in reversed(lines) if NO_IPYKERNEL_SAYS in line), None)
            if said is not None:
                return said.strip()
        try:
            relative = attempt.jobdir.node(run.name).view_record.relative_to(attempt.jobdir.root)
            view = json.loads(read_small(attempt.job_dir, str(relative), limit=4 << 20))
            mounts = [Mount(**m) for m in view["mounts"]]
            workdir = str(view["workdir"])
        except (OSError, ValueError, TypeError, KeyError, RefusedFile):
            return None
        return path_hint(lines, mounts, workdir, nodes=attempt.spec.nodes)

    # ---------------------------------------------------------------------- caches

    def usage(self, job_id: str, runs: list[NodeRun]) -> list[NodeUse]:
        """Each running node's process tree read from ``/proc`` (``watchdog.tree_usage``, the
        memory watchdog's walk), with its real cards' use and its processes' card memory (NVML);
        a runner whose pid now belongs to another process is skipped."""
        found: list[NodeUse] = []
        for run in runs:
            if run.state != "running" or run.pid is None or not self._alive(run):
                continue
            used = watchdog.tree_usage(run.pid)
            if used is not None:
                cards = self._card_use(job_id, run)
                found.append(
                    (
                        run.name,
                        used[0],
                        used[1],
                        cards.percent if cards else None,
                        cards.memory_mb if cards else None,
                    )
                )
        return found

    def processes(self, runs: list[NodeRun], most: int) -> dict[str, list[ProcessSeen]]:
        """The processes below each running node's runner, deepest first (the training code
        before its launchers; bubblewrap itself left out), at most ``most`` of each, as ``/proc``
        names their state and wait channel (``nodehost.procfs``); a runner whose pid now belongs
        to another process is skipped."""
        found: dict[str, list[ProcessSeen]] = {}
        for run in runs:
            if run.state != "running" or run.pid is None or not self._alive(run):
                continue
            looks: list[ProcessSeen] = []
            for pid, _parent, state in reversed(descendants(run.pid)):
                look = process_look(pid) if state != "Z" else None
                if look is None or look[0] == "bwrap":
                    continue
                looks.append((pid, *look))
                if len(looks) == most:
                    break
            found[run.name] = looks
        return found

    @staticmethod
    def _card_use(job_id: str, run: NodeRun) -> accelerators.CardUse | None:
        """The use of the node's real cards (named in its ``view.json``) and the card memory of
        its processes, through NVML; None for a node without real cards or without NVML."""
        jd = config.jobdir(job_id)
        try:
            relative = jd.node(run.name).view_record.relative_to(jd.root)
            view = json.loads(read_small(jd.root, str(relative), limit=16 << 20))
            devices, paths = list(view.get("devices") or []), list(view.get("device_nodes") or [])
        except (OSError, ValueError, RefusedFile, AttributeError, TypeError):
            return None
        kind = accelerators.card_type_of(paths)
        if not kind or run.pid is None:
            return None
        return accelerators.sample(kind, devices, watchdog.tree_pids(run.pid))

    def open_shell(
        self, job: Job, node: str, rows: int, cols: int, command: list[str] | None = None
    ) -> socket.socket:
        """The node's shell agent (:func:`.shell_agent.connect`), found by the job's id and
        reached with the attempt's secret kept in the node's runner spec."""
        jd = config.jobdir(job.id)
        try:
            relative = jd.node(node).runner_spec.relative_to(jd.root)
            spec = RunnerInstructions.from_json(
                read_small(jd.root, str(relative), limit=16 << 20), unversioned=True
            )
            secret = str((spec.job_env or spec.env).get(JOB_SECRET_ENV, ""))
        except (OSError, ValueError, RefusedFile):
            raise Conflict(
                f"node {node} of job {job.id} has not started yet: try again in a moment"
            ) from None
        if not spec.shell_agent:
            raise Conflict(
                f"node {node} of job {job.id} runs without a sandbox, and a debug terminal never opens "
                "in the host's own view: install bubblewrap (apt-get install bubblewrap)"
            )
        marker = self._read_marker(jd, node)
        opener = self._opener_into(jd, node) if spec.netns else None

        def the_nodes(pid: int) -> bool:  # the agent the node's runner started, nobody else
            return bool(marker) and is_marked(pid, marker)

        # a node that just started may not listen yet: wait a little for a running job's agent
        deadline = time.monotonic() + (AGENT_START_WAIT if job.status is JobStatus.running else 0.0)
        while True:
            try:
                return shell_agent.connect(
                    job.id, node, secret, rows, cols, command, trust=the_nodes, opener=opener
                )
            except PermissionError as exc:
                raise Conflict(f"{exc}: the debug terminal of job {job.id} stays closed") from None
            except TimeoutError:
                # the agent is there but does not answer within its bound (stopped, flooded):
                # asking again would only hold a thread of the node pool longer
                raise Conflict(
                    f"the debug terminal of node {node} of job {job.id} does not answer: "
                    "try again later, or stop the job"
                ) from None
            except OSError:
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.1)
        raise Conflict(
            f"the debug terminal of node {node} of job {job.id} is not up: the node is starting "
            "(try again in a moment) or has ended"
        )

    def _opener_into(self, jd, node: str) -> Callable[[bytes], socket.socket]:
        """What connects to an abstract socket of ``node``, which lives in its attempt's network
        namespace: a connection made from inside the namespace of the node's runner (checked to
        be the runner that was launched)."""
        try:
            relative = jd.node(node).run_record.relative_to(jd.root)
            run = NodeRun.model_validate_json(read_small(jd.root, str(relative), limit=1 << 20))
        except (OSError, ValueError, RefusedFile):
            run = None

        def opener(address: bytes) -> socket.socket:
            if run is None or run.pid is None or not self._alive(run):
                raise ConnectionRefusedError(f"the runner of node {node} does not run")
            return network_ns.connect_in(run.pid, address)

        return opener

    def start_outputs_reader(
        self, job: Job, argv: list[str], env: dict[str, str], output: int | None = None
    ) -> subprocess.Popen:
        """The program as the job's account, in a bubblewrap sandbox showing only the job's
        outputs, read-only (see :mod:`.outputs_reader`, which also says what the symlink mode
        does)."""
        return outputs_reader.start(job, argv, env, output, self.isolation())

    def kept_until(self, attempt: HostedAttempt, run: NodeRun) -> float | None:
        """The time the failed node's runner keeps its sandbox until (its ``kept.json``)."""
        nd = attempt.jobdir.node(run.name)
        try:
            data = json.loads(
                read_small(attempt.job_dir, str(nd.kept.relative_to(attempt.jobdir.root)), limit=4096)
            )
            return float(data["until"])
        except (OSError, ValueError, KeyError, TypeError, RefusedFile):
            return None

    def forget(self, job_id: str) -> None:
        """End the sandboxes a failed debug-terminal job keeps (deleting it ends them early).

        The markers are read now (the job's folder goes next); the processes are ended on a
        thread, so the caller never waits for them (contract rule 16)."""
        jd = config.jobdir(job_id)
        try:
            nodes = [
                jd.node(entry.name) for entry in os.scandir(jd.nodes) if entry.is_dir(follow_symlinks=False)
            ]
        except OSError:
            return
        markers = [m for m in map(_kept_marker, nodes) if m]
        if markers:
            threading.Thread(
                target=lambda: [_end_marked(m) for m in markers], name=f"forget-{job_id}", daemon=True
            ).start()

    def caches(self, user: str | None, *, every_user: bool = False) -> list[CacheInfo]:
        """The size of ``user``'s cache (``every_user``: of every user's), see :mod:`.caches`."""
        return caches.usage(user, every_user=every_user)

    def clear_cache(self, user: str | None) -> None:
        """Empty ``user``'s cache (the caller made sure no job of theirs runs)."""
        caches.clear(user)

    def job_account(self, user: str | None) -> RunAs | None:
        """The account of ``user``'s jobs by this machine's host rules (:mod:`~ma_jupyter.nodehost.host_policy`)."""
        found = load_policy().run_as(user)
        return None if found is None else RunAs(name=found.name, uid=found.uid, gid=found.gid)

    def look_at_dataset(self, user: str | None, source: str) -> DataState:
        """The dataset's state read as the job's account on this machine (:mod:`.prepare`)."""
        return prepare.look_at_dataset(user, source)

    def copy_dataset(
        self, user: str | None, source: str, into: Path, cancel: threading.Event | None = None
    ) -> DataState:
        """The copy made as the job's account on this machine (:mod:`.prepare`)."""
        return prepare.copy_dataset(user, source, into, cancel)


def _kept_marker(nd) -> str | None:
    """The marker of a node whose runner kept its sandbox for the debug terminal (it leaves
    ``kept.json``: without it there is nothing to look for, and a scan of every process's
    environment is not free); None otherwise."""
    if not os.path.lexists(nd.kept):
        return None
    try:
        return (nd.marker.read_text().strip() if not nd.marker.is_symlink() else "") or None
    except OSError:
        return None


def _end_marked(marker: str) -> None:
    """End every process carrying ``marker``: TERM, then KILL what is left after 5 s."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        left = marked_processes(marker)
        for proc in left:
            try:
                proc.send_signal(signum)
            except psutil.Error:
                pass
        if left:
            psutil.wait_procs(left, timeout=5.0)


def _end_kept(nd) -> None:
    """End what still runs of an earlier attempt of this node (a sandbox kept for the debug
    terminal), before the node starts again."""
    marker = _kept_marker(nd)
    if marker:
        _end_marked(marker)


def _ended(proc: psutil.Process) -> bool:
    """Whether ``proc`` has ended (gone, or a zombie its frozen parent cannot reap)."""
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def _ignores_term(pid: int) -> bool:
    """Whether ``pid`` ignores SIGTERM now (the kernel discards one sent to it): the debug
    terminal's agent while the node's command runs, an interactive shell."""
    return ignores_signal(pid, signal.SIGTERM)


def _refuse_unsandboxed(views: list[NodeView]) -> None:
    """Refuse nodes that would run as another account without bubblewrap: without a sandbox
    the node's interpreter and folders are host paths its account may not reach, and nothing
    would keep it from the rest of the host."""
    for view in views:
        if view.sandbox == "symlink" and view.run_as is not None:
            raise InvalidSpec(
                "bubblewrap does not work on this machine, and jobs of a root service must run as "
                f"{view.run_as.name} inside it: install bubblewrap (apt-get install bubblewrap), or "
                "let this user's jobs run as root ([users] allow_root in cluster.toml)"
            )


def _open_log(path: Path, node: str) -> int:
    """Open a node's log for appending, readable by the service's user only (mode 0600); a later
    attempt reuses the file, so it is untrusted: never written through a symlink, never a FIFO
    (``O_NONBLOCK`` makes that fail at once)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO):
            kind = "a symbolic link" if exc.errno == errno.ELOOP else "a FIFO"
            raise RefusedFile(
                f"{node} left {kind} at {path}: the service does not write through it"
            ) from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise RefusedFile(f"{node} left something that is not a regular file at {path}")
    if st.st_mode & 0o077 and st.st_uid == os.geteuid() and st.st_nlink == 1:
        os.fchmod(fd, 0o600)  # a log an earlier version left readable (never a file linked in)
    return fd


def disk_free(path: str | os.PathLike) -> int | None:
    """Bytes an unprivileged writer may still use on the file system of ``path``, or of its
    nearest existing parent (a job folders' root not made yet); None if unknown."""
    folder = Path(path)
    while True:
        try:
            st = os.statvfs(folder)
        except FileNotFoundError:
            if folder.parent == folder:
                return None
            folder = folder.parent
            continue
        except OSError:
            return None
        return st.f_bavail * st.f_frsize
