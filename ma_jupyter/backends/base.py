"""The contract between the service's supervisor and a backend that runs node processes.

The supervisor owns the job's bookkeeping (statuses, events, restarts, expiry); a backend only
starts, watches and stops the nodes of one attempt.  The service is never in the log path: a
backend makes each node write its stdout/stderr itself (the local backend: into
``<job_dir>/logs/<node>.log``, and ``<job_dir>/logs/<node>/rank-<r>.log`` where the launcher
splits ranks), so that logs keep flowing while the service is down; the service reads them, and
the failure reports nodes leave, only through the backend (:meth:`Backend.open_log`,
:meth:`Backend.failure`).

A node's state must be observable by a *new* service process after a crash: :meth:`poll`
works from the persisted :class:`~ma_jupyter.models.NodeRun` alone (pid + process start time,
and an exit-code file the node's runner writes), never from in-memory child handles.

Why one module (over 600 lines): it is the backend contract, the one place its rules are
numbered: the abstract :class:`Backend`, its default methods and the small records it speaks in
(:class:`Attempt`, :class:`DatasetState`, :class:`NodeUsage`...) are read together by whoever
writes a backend.
"""

from __future__ import annotations

import socket
import subprocess
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..errors import Conflict, InvalidSpec
from ..jobdir import JobDir
from ..models import CacheInfo, Job, JobSpec, KernelRoute, LogStream, Node, NodeLaunch, NodeRun, RunAs
from ..modes.base import NodePlan, Placement, RemoteShell, TaskSlot

# where a process of :meth:`Backend.start_outputs_reader` finds the job's outputs folder (the
# path the job's own nodes write it at), named by the contract: the foundation module's
from ..workspace_paths import OUTPUTS_VIEW  # noqa: F401 - re-exported


@dataclass(frozen=True)
class DatasetState:
    """A dataset as a job's account sees it now (:meth:`Backend.look_at_dataset`).

    Attributes:
        key: the prepared-data store's key of this state: the same for the same dataset path,
            account and contents (see ``service/prepared.py``), different after any change.
        bytes: the size of its regular files.
        files: how many regular files it holds.
    """

    key: str
    bytes: int
    files: int


@dataclass(frozen=True)
class ObjectFetch:
    """One prefix in object storage that a job's nodes need on their own machines
    (:meth:`Backend.fetch_objects`, contract rule 29).

    Attributes:
        what: how the job names it (``datasets d``, ``models m``, ``outputs``), for messages.
        uri: the ``s3://`` or ``obs://`` URI.
        endpoint: the endpoint the service checked for it (None: the library's default).
        into: where it goes, relative to the job folder: ``prepared/<...>`` (the link the
            effective spec names, to a read-only copy) or ``outputs`` (the prefix's current
            content copied into the node's outputs folder).
        trusted: the endpoint is the administrator's (``[storage] allow_endpoints``): its
            connections skip the guard of ``objectstore`` rule 5.
        disk_reserve: bytes the download must leave free on the disk it writes to
            (``[limits] disk_reserve_mb``, as the service reads it at each call).
        retention: seconds an unheld cached copy is kept after its last use on the node's
            machine (``[data] retention``, as the service reads it at each call; None: it could
            not be read, and no copy is removed for its age).
    """

    what: str
    uri: str
    endpoint: str | None
    into: str
    trusted: bool = False
    disk_reserve: int = 0
    retention: float | None = None


@dataclass(frozen=True)
class Attempt:
    """One attempt of a job: what a backend needs to launch it.

    Attributes:
        job_id: the job's id.
        spec: the job's spec (mounts, image, workdir, env...).
        number: attempt number (0 first, +1 per fault restart / resume).
        job_dir: ``<home>/jobs/<id>``; the backend writes logs and per-node files below it.
        plans: the per-node plans from :func:`ma_jupyter.modes.plan_job`.
    """

    job_id: str
    spec: JobSpec
    number: int
    job_dir: Path
    plans: tuple[NodePlan, ...]

    @property
    def jobdir(self) -> JobDir:
        return JobDir(Path(self.job_dir))


#: processes of one node :meth:`Backend.processes` describes at most
MAX_PROCESS_LOOKS = 6
#: variable holding a secret shared by the nodes of one attempt and by nothing else
JOB_SECRET_ENV = "MA_JOB_SECRET"
#: the debug terminal's frames on an :meth:`Backend.open_shell` connection: a ``!BI`` header
#: (channel, payload length), then the payload; channels: terminal bytes (both ways), the exit
#: status as ASCII (last, from the node), a JSON ``{"rows", "cols"}`` resize (to the node)
SHELL_FRAME_HEADER = "!BI"
SHELL_DATA, SHELL_EXIT, SHELL_RESIZE = 1, 3, 4
#: the largest payload a frame may declare (nodehost.agent_wire.MAX_FRAME): a larger one ends it
SHELL_MAX_FRAME = 1 << 20
#: the only variables :meth:`Backend.launch` may add to a :class:`NodeLaunch`'s ``env``
LAUNCH_ENV = ("MA_NODE_RUN", JOB_SECRET_ENV)


@dataclass(frozen=True)
class NodeUsage:
    """What one running node uses now (see :meth:`Backend.usage`).

    Attributes:
        node: the node's name (``worker-0``).
        cpu_seconds: CPU time its processes used since the node started, cumulative (it never
            shrinks while the node runs: the sampler turns two readings into a percentage).
        memory_bytes: memory it holds now: its processes' resident memory, plus (local backend)
            what it keeps in its memory-backed folders (``/tmp``, ``/dev/shm``), as its limit counts it.
        card_percent: use of its cards now, 0..100, or None when the backend cannot tell.
        card_memory_mb: card memory its processes hold now (MiB), or None when it cannot tell.
    """

    node: str
    cpu_seconds: float
    memory_bytes: int
    card_percent: float | None = None
    card_memory_mb: float | None = None


@dataclass(frozen=True)
class ProcessLook:
    """What one process of a running node is doing now (see :meth:`Backend.processes`).

    Attributes:
        pid: its pid on the node's machine.
        name: its command name (``/proc/<pid>/comm``).
        state: its state in words (``sleeping``, ``running``, ``in uninterruptible wait``...).
        wait: the kernel function it sleeps in (``/proc/<pid>/wchan``: ``futex_wait``,
            ``hrtimer_nanosleep``...), empty when it runs or the kernel does not say.
    """

    pid: int
    name: str
    state: str
    wait: str


class Backend(ABC):
    """Binds placements, and starts, observes and stops the node processes of job attempts.

    The contract: the rules every backend keeps, numbered once, here.  Code and pages cite
    them as "contract rule N" (docs/architecture.md, *The backend contract*, lists their
    titles); a new rule is added at the end, and no number is ever reused.

    1. **``bind`` is the only place** hostnames, addresses, ports and cores are chosen. With
       ``reserve=False`` (a dry run) it reserves nothing and gives port 0. It also sets the
       placement's ``remote_shell``, how MPI's launcher reaches the other nodes (None: the backend
       has none, and MPI jobs are refused at submit).
    2. **``dryrun(attempt)`` has no effects.** It validates (raising ``InvalidSpec`` that names the
       field) and returns one typed ``NodeLaunch`` per node plan, in order: argv as planned, the
       command that execs, the node's whole environment (with the plan's ``job_env`` expanded by
       ``commands.expand_env``), files, mounts, working directory, account. ``--dry-run`` shows
       exactly this list.
    3. **``launch(attempt, launches)`` runs exactly the dry run.** It may add only the ``LAUNCH_ENV``
       variables (the node-run marker and the attempt's secret, which a command's ``${VAR}`` never
       sees) and wrap the command in its isolation. All or nothing: if it raises, every node it
       started is stopped first.
    4. **Durable state only.** Everything but ``bind`` and ``dryrun`` works in a fresh service process
       from persisted values: the stored bound placement, the ``NodeRun`` records and what the nodes
       write. Reserved ports are declared again with ``hold()`` after a restart; ``release()`` forgets
       them.
    5. **The service is not in the log path.** Nodes write their own logs, which keep being written
       while the service is down.
    6. **Logs are byte streams.** ``log_streams(job)`` lists them, each saying where a client on the
       service's machine may read it itself (``LogStream.file``: the file the node writes, opened below
       ``root`` following no link) or None (only ``open_log`` can read it: the file is on another
       machine); only the backend knows where a log lives. ``open_log(job, node, rank)`` gives a
       ``LogSource`` whose ``read(offset, limit)`` returns bytes starting exactly at ``offset`` and the
       size now; a stream only grows within an attempt; ``size()`` is cheap and never blocks; a stream
       the job replaced by something unreadable raises ``RefusedFile``; no call blocks on a file the
       job controls.
    7. **``poll``** reports ``running``, ``exited`` with the code, or ``lost`` (gone without an exit code:
       never a success), from durable evidence only; **``failure``** names the first failed rank
       ``(rank, exit code)``, or says in a sentence what the job left instead of a report;
       **``explain``** turns a failed node's last log lines into a sentence about the backend's view
       (a write to a read-only mount: which one, and how to change it), which the supervisor puts on
       the first line of the job's reason.
    8. **``stop``** sends TERM, waits up to ``grace``, sends KILL, and returns only when no process of
       these nodes is left, whatever sessions they made. The local backend (and through it each
       Ray agent) TERMs each node's runner, which relays the signal; a runner that has not claimed
       the relay in ``nodes/<node>/stop-claim`` within ``stopping.RELAY_WAIT`` (2 s, half the grace
       period when shorter) is frozen, and the backend claims it and TERMs the node's processes
       itself, never bubblewrap: each process gets the stop's SIGTERM once (``nodehost/stopping.py``).
    9. **Errors.** ``InvalidSpec`` for what the user can fix, ``BackendUnavailable`` when the backend
       cannot act now, ``NodeLost`` for a log (or other file) that went with the machine that ran the
       node; the supervisor turns anything else into the job's error.
    10. **Threads.** ``poll``, ``stop`` and the log calls may run concurrently for different jobs.
    11. **Ends are pushed.** A backend that learns of a node's end calls the ``wake`` given to
        ``on_node_end`` (the local backend: a pidfd per runner, one epoll thread; the Ray backend: a
        blocking ``wait_exit`` call per node on its agent, which waits on the runner's pidfd), so a
        job's end is recorded within milliseconds; the supervisor still polls running jobs each
        tick, at least every ``poll_every``. ``close()`` releases the backend's threads, never its
        nodes.
    12. **Advice only.** ``code_sources(spec)`` may return the algorithm folder's Python files for the
        single-copy warning, read as untrusted files within bounds; None (the default) means "not
        known", and the warning stays silent.
    13. **Caches.** ``caches(user)`` sizes the persistent cache a backend keeps per user between
        jobs (``every_user`` for all); ``clear_cache(user)`` empties it at once. The supervisor checks,
        under its lock, that no job of the user runs before it clears (409 otherwise).
    14. **Inventory.** ``inventory()`` gives the nodes jobs are placed on, live, or None when
        ``cluster.toml``'s ``[[node]]`` inventory applies (the local backend). It is cheap and returns
        the same list object while nothing changed: the scheduler asks it at each placement
        (``Scheduler(cluster, inventory=backend.inventory)``), and the supervisor, seeing a new list,
        runs an admission pass (a node joined: a queued job may fit). The scheduler never imports a
        backend.
    15. **Bind may decline.** With ``reserve=True``, ``bind`` may return None when the backend cannot
        hold the nodes the scheduler chose now (resources taken outside this service); it then holds
        nothing, the job stays queued, and the supervisor runs another pass within ``BIND_RETRY``
        (1 s). ``Placement.reservation`` names what bind reserved (the Ray backend: its placement
        group), stored with the placement for a restarted service.
    16. **Forget.** ``forget(job_id)`` removes what the backend keeps of a deleted job outside the
        service's job folder, without waiting on remote work (the Ray backend asks each agent to
        remove ``node_root/<job id>`` on its node; the local backend keeps nothing else).
    17. **Heartbeat.** ``heartbeat(attempt, run)`` says when a running node last gave a sign of life
        (epoch seconds), cheaply and without blocking on the job; None (the default) means not known,
        and the node is judged by ``poll`` only.
    18. **Usage.** ``usage(job_id, runs)`` says what each running node uses now (``NodeUsage``:
        cumulative CPU seconds, resident bytes, cards' use and card memory or None); cheap, never
        raising for a node that is gone, from the persisted ``NodeRun``s. The local backend reads
        ``/proc`` for the node runner's process tree (``nodehost/watchdog.py``'s ``tree_usage``, the memory
        watchdog's walk and sum: resident memory plus what the node holds in ``/tmp``, ``/dev/shm`` and ``/run``);
        the Ray backend returns None (the default): its jobs keep no samples.
    19. **Debug terminal.** ``open_shell(job, node, rows, cols, command)`` returns a connection to a
        shell (or ``command``) *inside* the node's own sandbox, speaking ``SHELL_FRAME_HEADER`` frames
        (terminal bytes both ways, a resize to the node, the exit status last); Conflict (409) when
        the backend has none (the default; the Ray backend) or the node's is not up. Locally the
        command phase of a ``--debug-terminal`` node is the shell agent (``shell_agent --serve ...
        -- COMMAND``), which runs the node's command and serves shells beside it in the same
        sandbox (its processes, ``/tmp``, ``/dev/shm``, network, account and limits). ``kept_until``
        says until when a failed node keeps that sandbox for it (None: it keeps none).
    20. **Outputs reader.** ``start_outputs_reader(job, argv, env, output)`` starts a Python program
        of the platform's own that reads a job's outputs for a user, the job's TensorBoard, so that
        it reads nothing the job's own nodes could not: as the job's account, seeing the job's
        outputs folder read-only at ``OUTPUTS_VIEW`` (``/workspace/outputs``, from ``workspace_paths.py``), the system and
        ``argv[0]``'s Python installation read-only, and nothing else (no service home, no other
        job's folder); ``env`` its only variables, never on a command line; the caller's network; a
        process group of its own led by the returned process. The service decides what runs and
        when (``service/tensorboard.py``: port, secret, first use, idle reaping); the backend decides
        how it is confined, because only the backend knows accounts and sandboxes (the service
        never imports a backend's own modules). The local backend does it with the node
        machinery's outputs reader (see docs/isolation.md); the Ray backend runs it the
        same way on the service's machine, over the outputs folder there; the default refuses (409).
    21. **Datasets.** ``look_at_dataset(user, source)`` gives a dataset's state (``DatasetState``: the
        store key, bytes, files) and ``copy_dataset(user, source, into, cancel)`` copies it to
        ``into/data``, both as the account of ``user``'s jobs and by the untrusted-file rules (a job may
        have written the dataset): regular files, folders and symlinks only (links copied as links,
        never followed; a FIFO, socket or device refused by name, never opened to block), no
        setuid, setgid or sticky bit kept, the copy owned by that account. The copy blocks for as
        long as the data takes: the supervisor calls it off its lock; ``cancel`` ends it, leaving
        nothing at ``into``. The local and Ray backends do both on the service's machine (the node
        machinery's data copy: the service opens the dataset's root and checks the path the kernel
        names the root *opened* by (``/proc/self/fd/N``): it must be the resolved path and pass the
        job's mount rules (``HostPolicy.check_source``, never the service's home), so a folder on the
        path swapped for a symlink after the supervisor's check is refused; a copy process gets the
        descriptor and drops to the job's account before reading anything); the default refuses
        data preparation.
    22. **Cards.** ``card_fault(task)`` says why a real card a running task holds can no longer be
        used (None: healthy, or the backend knows of no cards: the default); cheap, for the node
        inspection (docs/jobs.md, *Node health* 1b).
    23. **Notices.** A backend that learns something about a job's node by itself calls the
        ``notice(job_id, node, reason)`` given to ``on_notice``, from any thread; the supervisor records
        it as an event of the job (none for a job that is gone). The Ray backend: what a new agent
        on a lost Ray node's machine ended there.
    24. **Kernel route.** ``kernel_route(job, node)`` says how a client on the service's machine
        reaches a running dev environment's kernel (``KernelRoute``): by default its kernel folder,
        where the node's log stream says this machine sees its job folder; the Ray backend answers
        the relay its node's agent starts for it (``backends/ray/kernel_relay.py``: a TCP listener on
        the Ray node's address with a secret of its own, held in the agent's memory only, closed
        with the node).
    25. **Job folders' disk.** ``job_folders_free(host)`` says where the job folders of an inventory
        node lie on its machine and how many bytes are free there, for the node checks; None when
        not known. Bounded in time (the pre-check runs under the supervisor's lock): the local
        backend looks at its jobs folder, the Ray backend asks the node's agent within 3 s.
        ``card_fault(task)`` likewise: on Ray, asked of the task's node's agent.
    26. **Job account.** ``job_account(user)`` names the account a user's jobs' nodes run as (the
        host rules), None for the service's own; the service digests an algorithm folder only where
        that account may read every entry of it (mode bits, owner and group; no ACLs).
    27. **Processes.** ``processes(job_id, runs)`` says what each running node's processes are doing
        (``ProcessLook``: pid, name, state, kernel wait channel; at most ``MAX_PROCESS_LOOKS`` a node,
        the deepest first), for the hang alert; cheap, never raising for a node that is gone. The
        local backend reads ``/proc/<pid>/stat`` and ``/proc/<pid>/wchan`` through ``nodehost/procfs.py``;
        None (the default, the Ray backend) means not known.
    28. **Network check.** ``network_fault(host)`` says why inventory node ``host``'s machine cannot
        give a job its network now (a job network cannot be made there, or its nodes do not reach
        each other), for the node checks; None when it can or when not known (the default). It
        never waits (it runs under the supervisor's lock): the local backend answers its last
        probe's result and starts the next one on a thread of its own when that is 10 s old (a
        two-node job network made, crossed and removed: ``nodehost/network.py``'s
        ``probe_job_network``); the Ray backend answers each node's agent's last answer, the
        agent probing its machine's end of an overlay the same way (``ray/network_check.py``).
    29. **Object storage on the nodes' machines.** ``fetch_objects(job_id, hosts, fetches,
        credentials, account, cancel, say)`` downloads a job's object storage prefixes
        (``ObjectFetch``: datasets and models as links below the job folder, the outputs prefix
        into its outputs folder) on the machines of ``hosts`` themselves, before each attempt, off
        every lock; False (the default, the local backend) leaves them to the service's data
        preparation. The Ray backend answers True: its agents download into a cache of their
        machine (``backends/ray/objects.py``), so no Ray node needs the service's disk.
    30. **Outputs on the nodes' machines.** ``seeds_outputs(job)`` says, cheaply (under the
        supervisor's lock), whether the job's next attempt is to start with the service's copy
        of its own outputs folder on its nodes' machines (False, the default: the nodes write the
        service's folder itself, as the local backend's do); ``seed_outputs(job_id, hosts,
        account, reserve, cancel, say)`` then writes that copy into the outputs folder each
        machine of ``hosts`` keeps, before the attempt's launch, off every lock (through data
        preparation's thread, ``service/preparation.py`` rule 7), owned by ``account``, leaving
        ``reserve`` bytes free on each machine's disk, ``say`` making lines events of the job; a
        copy that fails fails the attempt with the reason (``DiskFull``: the job stays queued).
        The Ray backend seeds a resumed or restarted attempt's Ray nodes that do not share the
        service's folder (``backends/ray/outputs_seed.py``), so what the job wrote is not lost
        when it moves.

    Besides, ``not_distributed(attempt, run)`` hands over node 0's report that no rank joined a
    process group (docs/jobs.md, step 8), and ``isolation()`` names the kind of sandbox the
    backend's nodes run in.
    """

    #: short name stored on the job (``local``, ``ray``)
    name: str = "base"
    #: how MPI's launcher reaches the other nodes of a job; None: MPI jobs are refused
    remote_shell: RemoteShell | None = None
    #: the longest the service waits between two polls of a running node (contract rule 11)
    poll_every: float = 0.1

    def on_node_end(self, wake: Callable[[], None]) -> None:
        """Call ``wake`` whenever a node this backend launched may have ended (contract rule 11); the
        default never does."""
        del wake

    def on_notice(self, notice: Callable[[str, str | None, str], None]) -> None:
        """Call ``notice(job_id, node, reason)`` for what the backend learns by itself about a
        job's node (the Ray backend: what the next agent on a lost node's machine ended there);
        the service makes it an event of the job.  The default never does."""
        del notice

    def close(self) -> None:
        """Release what the backend holds in this process (threads, descriptors); nodes keep
        running (the default holds nothing)."""
        return None

    def forget(self, job_id: str) -> None:
        """Remove what the backend keeps of a deleted, ended job outside the service's own job
        folder (which the service removes): its files on other machines.  Must not block the
        caller on remote work (start it and return); the default keeps nothing else."""
        del job_id

    def inventory(self) -> list[Node] | None:
        """The nodes jobs are placed on, now (contract rule 14); None: ``cluster.toml``'s (the default)."""
        return None

    @abstractmethod
    def bind(self, placement: Placement, *, reserve: bool) -> Placement | None:
        """``placement`` with every task's hostname, address, ports and cores, and the backend's
        remote shell; None when ``reserve`` is set and the nodes cannot be held now (contract rule 15).

        Args:
            placement: the scheduler's placement (inventory nodes, slots, cards).
            reserve: reserve the ports (and whatever else the backend holds for an attempt)
                until :meth:`release` (False for a dry run: ports 0, nothing held, never None).
        """

    @abstractmethod
    def release(self, placement: Placement) -> None:
        """Forget what :meth:`bind` reserved for a finished attempt."""

    @abstractmethod
    def hold(self, placement: Placement) -> None:
        """Reserve again what a bound placement holds (a restarted service re-attaching)."""

    @abstractmethod
    def isolation(self) -> str:
        """How each node's ``/workspace`` is made (the local backend: ``bubblewrap`` or ``symlink``)."""

    @abstractmethod
    def dryrun(self, attempt: Attempt) -> list[NodeLaunch]:
        """What every node of the attempt would run, resolved: one launch per plan, in order.

        Has no effects: creates no file, reserves nothing, starts nothing (``attempt`` may name
        the placeholder job folder of :data:`ma_jupyter.jobdir.PLACEHOLDER`).  Validates what
        a launch would refuse.  The variables of :data:`LAUNCH_ENV` are not in the launches'
        ``env`` and never expanded in their ``command``.

        Raises:
            InvalidSpec: a mount path is missing or escapes its root, the image is unusable...
        """

    @abstractmethod
    def launch(self, attempt: Attempt, launches: list[NodeLaunch]) -> list[NodeRun]:
        """Start every node of the attempt exactly as ``launches`` (from :meth:`dryrun`) say and
        return their records (pid, start time...).

        Each node execs its launch's ``command`` (wrapped in the backend's isolation) with its
        launch's ``env`` plus only the :data:`LAUNCH_ENV` variables, its mounts, files and
        workdir; nothing else of the launch is changed.

        Must not leave anything running if it raises: a node that started before a later node
        failed to start is stopped again before the error propagates.

        Raises:
            InvalidSpec: the launches cannot run here (e.g. no isolation for another account).
            BackendUnavailable: the backend cannot run processes right now.
        """

    @abstractmethod
    def poll(self, attempt: Attempt, run: NodeRun) -> NodeRun:
        """The node's current state: ``running``, ``exited`` with its exit code, or ``lost``
        (the process is gone and left no exit code).  Works in a fresh service process."""

    @abstractmethod
    def stop(self, attempt: Attempt, runs: list[NodeRun], grace: float) -> None:
        """SIGTERM every node's training processes, wait up to ``grace`` seconds, then SIGKILL.

        The SIGTERM (the checkpoint signal) reaches the node's own processes exactly once, also
        when the node's runner cannot relay it (frozen, on a faulty node): the runner or the
        backend claims the stop, never both (:mod:`ma_jupyter.nodehost.stopping`).  Returns only
        when no process of these nodes is left (no orphans, whatever the job's processes did
        with their own sessions)."""

    def heartbeat(self, attempt: Attempt, run: NodeRun) -> float | None:
        """When the running node ``run`` last gave a sign of life (epoch seconds), for the
        service's node inspection; None when it is not known (the default: the backend has no
        heartbeat, and nodes are judged by ``poll`` only).  Cheap; never blocks on the job."""
        del attempt, run
        return None

    def job_folders_free(self, host: str) -> tuple[str, int] | None:
        """Where the job folders of inventory node ``host`` lie on its machine and how many bytes
        an unprivileged writer may still use on their disk now, for the service's node checks;
        None when not known (the default).  Bounded in time: a node that does not answer soon
        is not known (the check may run under the supervisor's lock)."""
        del host
        return None

    def card_fault(self, task: TaskSlot) -> str | None:
        """Why a real card of the running ``task`` (its ``devices`` of ``card_type``) can no
        longer be used (its device node is gone, the driver reports it lost), for the service's
        node inspection; None while its cards look healthy, and for tasks without real cards.
        The default knows of no cards.  Cheap; never blocks on the job."""
        del task
        return None

    def network_fault(self, host: str) -> str | None:
        """Why inventory node ``host`` cannot give a job its network now (a job network cannot
        be made on its machine, or its nodes do not reach each other), for the service's node
        checks (contract rule 28); None when it can, or when the backend cannot tell (the
        default).  It must not wait: it runs under the supervisor's lock."""
        del host
        return None

    def code_sources(self, spec: JobSpec) -> dict[str, str] | None:
        """The Python files of the job's algorithm folder (path below it → text), read for
        advice only (the warning of :mod:`ma_jupyter.modes.single_copy`); None when the backend
        cannot read them completely and safely.  The default reads nothing."""
        return None

    @abstractmethod
    def log_streams(self, job: Job) -> list[LogStream]:
        """Every log stream of ``job``: each node's combined log (rank None), then its per-rank
        logs, with their sizes now.  Looks only: a stream the job replaced with something
        unreadable is listed (size 0) and refused when opened.

        Only the backend knows where a log lives: a stream's ``file`` says where a client on the
        service's machine may read it itself (the file the node writes, on a disk this machine
        sees, opened below ``root`` following no link), None when only :meth:`open_log` can read
        it (the file is on another machine)."""

    @abstractmethod
    def open_log(self, job_id: str, node: str, rank: int | None) -> LogSource | None:
        """One log stream of a job (``rank`` None: the node's combined log), ready to read by
        offset; None while it does not exist yet.  The caller closes it.

        Raises:
            InvalidSpec: ``node`` or ``rank`` cannot name a stream (field ``node`` or ``rank``).
            RefusedFile: the job replaced the stream with something unreadable (a FIFO, a symlink...).
        """

    @abstractmethod
    def failure(self, attempt: Attempt, run: NodeRun) -> tuple[int, int] | str | None:
        """What the failed node ``run`` left about its failure: ``(rank, exit code)`` of the first
        rank its launcher saw fail; or one sentence saying what the job left instead of a
        readable report (``worker-0 left a FIFO at ...``); or None (no report).

        Works in a fresh service process; never blocks on a file the job controls."""

    def not_distributed(self, attempt: Attempt, run: NodeRun) -> int | None:
        """The number of nodes of the job when ``run``'s launcher found that no rank of any node
        joined a process group (torch's launcher on node 0 tells, see
        :mod:`ma_jupyter.nodeside.torch_run` rule 5): the nodes ran side by side, not together.
        None when the node did not say so, or the backend cannot tell (the default).

        Works in a fresh service process; never blocks on a file the job controls."""
        del attempt, run
        return None

    def explain(self, attempt: Attempt, run: NodeRun, lines: list[str]) -> str | None:
        """One sentence explaining the failed node ``run`` from its last log ``lines`` in terms of
        the backend's view, e.g. a write to a read-only folder: which mount it was and how to
        change it; None when nothing is recognised (the default)."""
        del attempt, run, lines
        return None

    def usage(self, job_id: str, runs: list[NodeRun]) -> list[NodeUsage] | None:
        """What each running node of ``runs`` (one attempt of job ``job_id``) uses now, for the
        service's resource sampler (``GET /jobs/{id}/resources``).

        1. Cheap and non-blocking: it is called every few seconds for every running job (the
           local backend reads ``/proc`` for each node's process tree, as the memory watchdog).
        2. A node that is gone or not started yet is left out; it never raises for one.
        3. Works from the persisted ``NodeRun`` records (pid and start time), in a fresh
           service process too.
        4. None (the default) means the backend cannot sample: the Ray backend, whose nodes run
           on other machines, returns None, and its jobs have no resource samples.
        """
        del job_id, runs
        return None

    def processes(self, job_id: str, runs: list[NodeRun]) -> dict[str, list[ProcessLook]] | None:
        """What the processes of each running node of ``runs`` are doing now, by node name, for
        the supervisor's hang alert (contract rule 27).

        1. Cheap and bounded: at most :data:`MAX_PROCESS_LOOKS` processes a node (the deepest
           first: the training code rather than its launchers); called once per quiet spell.
        2. A node that is gone is left out; it never raises for one.
        3. None (the default) means the backend cannot tell (the Ray backend).
        """
        del job_id, runs
        return None

    def open_shell(
        self, job: Job, node: str, rows: int, cols: int, command: list[str] | None = None
    ) -> socket.socket:
        """A connection to the debug terminal of ``node`` of the running ``job`` (submitted with
        ``debug_terminal``), speaking the shell agent's frames (``nodehost.shell_agent``,
        its request already sent): an interactive shell, or ``command`` on the terminal.

        Raises:
            Conflict: the backend offers no debug terminal (the default), or the node's is not
                up (not started yet, or ended); the message says what to do.
        """
        del job, node, rows, cols, command
        raise Conflict(
            f"the {self.name} backend offers no debug terminal: run the job on the local backend "
            "(ma-jupyter service start --backend local)"
        )

    def kernel_route(self, job: Job, node: str) -> KernelRoute:
        """How a client on the service's machine reaches the kernel of ``node`` of the running dev
        environment ``job`` (the service checked who asks and that it is one).

        The default: its kernel folder, where the node's combined log stream's ``file`` says this
        machine sees the node's job folder (the local backend).  A backend whose nodes run on
        other machines answers a relay there instead (Ray: ``backends/ray/kernel_relay.py``).

        Raises:
            Conflict: the node's folder is not visible here; the message says what to do.
        """
        for stream in self.log_streams(job):
            if stream.node == node and stream.rank is None and stream.file is not None:
                folder = JobDir(Path(stream.file.root)).node(node).kernel
                return KernelRoute(node=node, folder=str(folder))
        raise Conflict(
            f"this machine does not see the files of dev environment {job.id} (its node runs on "
            "another machine), and the backend offers no relay: run Jupyter where the node's job "
            "folder is visible"
        )

    def start_outputs_reader(
        self, job: Job, argv: list[str], env: dict[str, str], output: int | None = None
    ) -> subprocess.Popen:
        """Start ``argv``, a Python program of the platform's own that reads the job's outputs
        on a user's behalf (its TensorBoard), so that it reads nothing the job itself could not
        (contract rule 20); ``argv[0]`` is the interpreter, whose installation it is shown.

        1. It runs as the job's account, the one the job's nodes run as.
        2. It sees the job's outputs folder (``job.outputs_folder``: the spec's ``outputs``, or
           the one made for the job) read-only at :data:`OUTPUTS_VIEW`, the system and its
           Python installation read-only, and nothing else of the host: no service home, no
           other job's folder, so a symlink or a folder swapped under it by the job resolves
           inside that view.  The folder is opened once and checked to be the job's own (a
           spec's folder must still pass the mount rules), whatever lies on its path.
        3. ``env`` are its only variables (never on a command line: every user of the host
           reads those); ``output`` receives its stdout and stderr (None: discarded).
        4. Its network is the caller's: it may listen on the service's loopback, for the
           service's proxy.
        5. It leads a process group of its own: ``os.killpg(proc.pid, sig)`` reaches every
           process of it.  It is not durable, and ends with the thread that started it (a
           parent-death signal follows the thread): the caller starts it from a thread that
           lives as long as the program should, so a service that dies takes it along.

        Raises:
            InvalidSpec: the outputs folder does not exist yet, is no longer the job's (a spec's
                folder that now resolves outside the mount rules), or the job's account needs a
                sandbox this machine cannot make.
            Conflict: the backend cannot run such a program (the default).
        """
        del job, argv, env, output
        raise Conflict(f"the {self.name} backend cannot run a program over a job's outputs")

    def kept_until(self, attempt: Attempt, run: NodeRun) -> float | None:
        """When the failed node ``run`` of a ``debug_terminal`` job stops keeping its sandbox for
        the debug terminal (a Unix time), or None when it keeps none (the default).  Deleting
        the job ends it sooner (:meth:`forget`)."""
        del attempt, run
        return None

    def caches(self, user: str | None, *, every_user: bool = False) -> list[CacheInfo]:
        """The persistent cache of ``user`` (``every_user``: of every user) that the backend keeps
        between their jobs; the default keeps none."""
        del user, every_user
        return []

    def job_account(self, user: str | None) -> RunAs | None:
        """The account ``user``'s jobs' nodes run as, as the host rules of the service's machine
        decide it; None: the service's own (the default: the backend never switches accounts).
        The service reads an algorithm folder's content only where that account may read it
        (:mod:`ma_jupyter.service.algorithms` rule 8).

        Raises:
            InvalidSpec: the host rules name no usable account for ``user``.
        """
        del user
        return None

    def look_at_dataset(self, user: str | None, source: str) -> DatasetState:
        """The state of the dataset at ``source`` (a resolved path the job's mount rules
        allowed) as the account of ``user``'s jobs reads it, for data preparation.

        Rules every backend keeps (they are the untrusted-file rules of
        :mod:`ma_jupyter.untrusted`, since a job may have written the dataset):

        1. read with the job's account, never the service's rights;
        2. never blocks on what a job left (a FIFO is refused, not opened to wait);
        3. refuses anything but regular files, folders and symbolic links (never followed),
           naming what it refused.

        Raises:
            RefusedFile: the dataset holds a FIFO, socket or device, or is unreadable.
            InvalidSpec: the backend does not prepare data (the default).
        """
        del user, source
        raise InvalidSpec(f"the {self.name} backend does not prepare data", field="data_preparation")

    def copy_dataset(
        self, user: str | None, source: str, into: Path, cancel: threading.Event | None = None
    ) -> DatasetState:
        """Copy the dataset at ``source`` to ``into/data`` (``into`` must not exist) by the rules
        of :meth:`look_at_dataset`, as the account of ``user``'s jobs, which owns the copy; no
        setuid, setgid or sticky bit survives, links stay links.  Blocks while copying (call it
        off every lock); ``cancel`` set ends it early.  Nothing is left at ``into`` when it
        raises.  Returns the state of what it copied.

        Raises:
            RefusedFile: as :meth:`look_at_dataset`.
            InvalidSpec: the backend does not prepare data (the default).
        """
        del user, source, into, cancel
        raise InvalidSpec(f"the {self.name} backend does not prepare data", field="data_preparation")

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
        """Contract rule 29: download ``fetches`` on the machines of ``hosts`` themselves, into
        the job folder each of them keeps (a backend whose machines share no disk with the
        service); whether it did.  False (the default): the service downloads them on its own
        machine (``service/preparation.py``).  Called off every lock before each attempt;
        ``say`` makes a line an event of the job; ``account`` owns the outputs copied in.

        Raises:
            MaJupyterError, StorageError: a download failed (the job's error, with the reason).
        """
        del job_id, hosts, fetches, credentials, account, cancel, say
        return False

    def seeds_outputs(self, job: Job) -> bool:
        """Contract rule 30: whether ``job``'s next attempt starts with the service's copy of
        its outputs folder on its nodes' machines (cheap; False: the default)."""
        del job
        return False

    def seed_outputs(
        self,
        job_id: str,
        hosts: list[str],
        account: RunAs | None,
        reserve: int,
        cancel: threading.Event,
        say: Callable[[str], None],
    ) -> None:
        """Contract rule 30: the service's copy of the job's outputs folder written into the
        outputs folder of each machine of ``hosts``, off every lock (nothing: the default).

        Raises:
            MaJupyterError: a copy failed (the attempt's error, with the reason).
        """
        del job_id, hosts, account, reserve, cancel, say

    def clear_cache(self, user: str | None) -> None:
        """Empty ``user``'s persistent cache, at once (whatever removing its files takes happens
        in the background).  The supervisor calls it only while no job of the user runs.

        Raises:
            InvalidSpec: the backend keeps no caches (the default).
        """
        raise InvalidSpec(f"the {self.name} backend keeps no caches between jobs")


class LogSource(Protocol):
    """One open log stream of a job, read by byte offset (see :meth:`Backend.open_log`).

    Rules every backend keeps:

    1. :meth:`read` returns bytes starting exactly at ``offset`` (at most ``limit``; none when
       ``offset`` is at or past the end) and the stream's size now, so a reader that comes back
       with ``offset + len(data)`` misses nothing and gets nothing twice.
    2. A stream only grows during an attempt: its size never goes down, bytes once read never
       change.
    3. :meth:`size` is cheap and never blocks: a long-poll calls it on the event loop to wait for
       new bytes.
    4. A stream the job replaced with something unreadable (a FIFO, a symlink, a device...) raises
       :class:`~ma_jupyter.errors.RefusedFile` naming what the job left, when it is opened or read.
    5. No call blocks on a file the job controls.
    """

    def read(self, offset: int, limit: int) -> tuple[bytes, int]:
        """At most ``limit`` bytes from ``offset``; (data, size of the stream now)."""
        ...

    def size(self) -> int:
        """The stream's size now, in bytes."""
        ...

    def close(self) -> None:
        """Release the stream (idempotent); reading after closing raises ``OSError``."""
        ...
