"""The node's limits, watched from its runner (:mod:`.noderun` rule 1), and what a node uses.

Every :data:`MEMORY_SAMPLE` seconds :func:`watch` walks every process below the runner
(:func:`.procfs.process_tree`) and, in this order:

1. processes: past ``max_processes`` tasks (processes and threads, what ``RLIMIT_NPROC``
   counts), it kills the node, unless the kernel bounds it (the node's own user namespace,
   :mod:`.userns`), where it only says once that the limit was reached.  The count comes first:
   the children a fork bomb has not exec'd yet each count the parent's resident pages again, so
   the memory sum passes its limit too, and would name the wrong cause;
2. memory: where the node has a cgroup of its own (:mod:`.cgroup`), the kernel bounds every
   page the node holds (tmpfs, memfd and System V shared memory included) and the watchdog only
   reads its OOM kills: one ends the node with the memory reason (:func:`memory_reason`).
   Elsewhere (no writable memory cgroup: the fallback), the resident memory of those processes
   plus what their sandboxes hold in their memory-backed folders (:func:`tmpfs_held`); past
   ``memory_gb`` it kills the node (memory a job holds unmapped escapes this sum);
3. logs: the size of every file in the job's ``logs/`` folder (all its nodes on this machine,
   :func:`ma_jupyter.foldersize.folder_size`); past ``max_log_bytes`` it kills the node and cuts
   what the node's own log holds past the cap (:func:`cut_overflow`: sampled, the cap is passed
   by what the job wrote in one sample, which on a small disk can be all of it, and the other
   jobs there need that room to go on), and the logs may then grow by :data:`LOG_SLACK` more
   (what the later phases print); a folder of more than :data:`MAX_LOG_ENTRIES` entries ends it
   too, as does one the walk refuses (a chain of folders deeper than the walk's bound, a walk past
   :data:`LOG_WALK_SECONDS`); and while the logs' disk has less than
   ``disk_reserve_bytes`` free, logs growing at ``disk_flood_rate`` or more (less the fuller the
   disk: the supervisor's rule, see :mod:`ma_jupyter.service.policies`) end it.

Past a limit, ``on_exceeded(reason)`` runs first (the runner records the first reason, says it in
the node's log and starts no further phase but ``on_stop``), then every process below the runner
gets SIGKILL.  It watches until ``ended`` is set, so the phases after a kill are held to the same
limits.

:func:`tree_usage` and :func:`tree_pids` are the same walk for the service's resource sampler.

Standard library only: every node runner imports it.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable

from ..errors import FolderRefused
from ..foldersize import folder_size
from .instructions import RunnerInstructions
from .procfs import CSTIME, NUM_THREADS, PAGE, RSS, UTIME, process_tree, resident, stat_fields

#: seconds between two samples of a node's limits (a read of /proc per sample)
MEMORY_SAMPLE = 0.2
#: the node's memory-backed folders (bubblewrap's tmpfs), counted in its memory
TMPFS_FOLDERS = ("/tmp", "/dev/shm", "/run")
#: bytes the job's logs may still grow by after its node was killed for them (on_stop's lines)
LOG_SLACK = 1 << 20
#: files and folders the job's logs folder may hold (a node log, per-rank logs and reports)
MAX_LOG_ENTRIES = 10000
#: seconds one measure of the job's logs may take (a walk past it ends the node, as its size would)
LOG_WALK_SECONDS = 10.0
#: a disk with less free space counts as full (``ma_jupyter.service.disk.FULL_BELOW``): each
#: job writing there ends "disk full", the reserve's rule stands aside
FULL_BELOW = 256 << 10


class Limits:
    """One node's limits, from its runner's instructions (:class:`.instructions.RunnerInstructions`);
    0 is no limit."""

    __slots__ = (
        "node",
        "memory_gb",
        "max_processes",
        "kernel_bound",
        "max_log_bytes",
        "logs_dir",
        "disk_reserve_bytes",
        "disk_flood_rate",
    )

    def __init__(self, given: RunnerInstructions, *, kernel_bound: bool):
        self.node: str = given.node
        self.memory_gb = float(given.memory_gb or 0)
        self.max_processes = given.max_processes
        #: the kernel bounds the node's processes (its own user namespace, not root)
        self.kernel_bound = kernel_bound
        self.max_log_bytes = given.max_log_bytes
        self.logs_dir: str | None = given.logs_dir
        self.disk_reserve_bytes = given.disk_reserve_bytes
        self.disk_flood_rate = float(given.disk_flood_rate)

    def watched(self) -> bool:
        """Whether any limit needs the watchdog."""
        return bool(self.memory_gb or self.max_processes or self.max_log_bytes)


def _gb(value: float) -> str:
    return f"{value:.3g} GB"


def _stats(tree: list[int]) -> tuple[int, int]:
    """``(resident bytes, tasks)`` of the processes ``tree``: one read of ``/proc/<pid>/stat``
    each (tasks: processes and their threads, what ``RLIMIT_NPROC`` counts)."""
    memory = tasks = 0
    for pid in tree:
        fields = stat_fields(pid)
        if fields is None:  # ended meanwhile
            continue
        try:
            tasks += int(fields[NUM_THREADS])
            memory += int(fields[RSS]) * PAGE
        except (ValueError, IndexError):
            continue
    return memory, tasks


def tmpfs_held(tree: list[int]) -> int:
    """Bytes the sandboxes of the processes ``tree`` hold in their memory-backed folders
    (:data:`TMPFS_FOLDERS`), each file system counted once.

    A process whose root is the runner's own (the outer bubblewrap, the symlink mode) has none;
    the others are seen through ``/proc/<pid>/root``, one process per distinct root, and a
    ``statvfs`` of each folder there is the tmpfs's own: files deleted but still open count too.

    Only those folders are counted: a tmpfs mounted anywhere else, or in a mount namespace of
    its own, is not seen.  Mounting one takes CAP_SYS_ADMIN in a user namespace, which no process
    of the node has: the sandbox drops every capability (``--cap-drop ALL``, ``setpriv``,
    no-new-privileges) and the node's own user namespace may hold no other
    (:func:`.userns.node_user_namespace`), so the job can neither mount over these folders nor
    make a namespace of its own to mount in.  A node without a user namespace of its own (no
    root, or the kernel refuses one) has no such bar: where the host lets any account make user
    namespaces, a job can mount a tmpfs there whose memory only the host's limits bound.
    """
    try:
        own = os.stat("/")
    except OSError:
        return 0
    roots: set[tuple[int, int]] = {(own.st_dev, own.st_ino)}
    seen: set[int] = set()
    held = 0
    for pid in tree:
        try:
            root = os.stat(f"/proc/{pid}/root")
        except OSError:
            continue
        if (root.st_dev, root.st_ino) in roots:
            continue
        roots.add((root.st_dev, root.st_ino))
        for folder in TMPFS_FOLDERS:
            path = f"/proc/{pid}/root{folder}"
            try:
                dev = os.stat(path).st_dev
                if dev in seen or dev == root.st_dev:
                    continue  # counted already, or not a file system of its own
                fs = os.statvfs(path)
            except OSError:
                continue
            seen.add(dev)
            held += (fs.f_blocks - fs.f_bfree) * fs.f_frsize
    return held


def logs_size(folder: str) -> int | FolderRefused:
    """Bytes of every regular file below ``folder`` (the job's logs), following no link; or why
    they cannot be measured (a :class:`~ma_jupyter.errors.FolderRefused`: more than
    :data:`MAX_LOG_ENTRIES` entries, a chain of folders too deep, a walk too slow), which ends
    the node as its log size would: a job making files there without end would make every
    sample slower, and a folder it cannot measure would lift the log cap."""
    try:
        return folder_size([folder], max_entries=MAX_LOG_ENTRIES, max_seconds=LOG_WALK_SECONDS).bytes
    except FolderRefused as exc:
        return exc


def _log_flood(folder: str, grown: int, seconds: float, reserve: int, flood_rate: float) -> str | None:
    """Why the job's logs are ended for the disk reserve, or None: its disk has less than
    ``reserve`` bytes free (but is not full, where every writer ends "disk full") and they grew
    by ``grown`` bytes in ``seconds``, at ``flood_rate`` or more, less the fuller the disk."""
    if grown <= 0 or seconds <= 0:
        return None
    try:
        fs = os.statvfs(folder)
    except OSError:
        return None
    free = fs.f_bavail * fs.f_frsize
    if free >= reserve or free < FULL_BELOW or grown / seconds < flood_rate * free / reserve:
        return None
    mb = 1 << 20
    return (
        f"disk nearly full under {folder}: {free / mb:.1f} MB free, under the reserve of {reserve / mb:g} MB "
        f"([limits] disk_reserve_mb); the job's logs grew by {grown / mb:.1f} MB in the last {seconds:.1f} s"
    )


def cut_overflow(overflow: int, fd: int = 1) -> int:
    """Cut the last ``overflow`` bytes of the node's own log (the runner's ``fd``, opened for
    appending: what is written later follows the cut), once its writers were killed for the log
    cap; the bytes cut (0 when ``fd`` is not a regular file)."""
    try:
        st = os.fstat(fd)
        if not (st.st_mode & 0o170000 == 0o100000) or overflow <= 0:
            return 0
        cut = min(overflow, st.st_size)
        os.ftruncate(fd, st.st_size - cut)
        return cut
    except OSError:
        return 0


def settle_logs(limits: Limits, say: Callable[[str], None]) -> str | None:
    """At the node's end (its processes gone, before its exit code is written): logs past
    ``max_log_bytes`` (a job that filled its disk between two samples, and ended for it before
    the watchdog saw the cap passed) have their overflow cut from the node's own log
    (:func:`cut_overflow`), so the other jobs on that disk get the room back; the cap's reason
    then, else None."""
    if not (limits.max_log_bytes and limits.logs_dir):
        return None
    size = logs_size(limits.logs_dir)
    if isinstance(size, FolderRefused):
        # the job made its logs folder unmeasurable: that is the reason, worded as the watch
        # loop words it (whichever saw it first); nothing is cut from a size not known
        if size.bound == "entries":
            return f"the job's logs folder holds more than {MAX_LOG_ENTRIES} files and folders (all its nodes together)"
        return f"the job's logs folder cannot be measured for [limits] max_log_mb ({size.message})"
    if size is None or size <= limits.max_log_bytes + LOG_SLACK:
        return None
    cut = cut_overflow(size - limits.max_log_bytes)
    if cut:
        say(f"{cut / (1 << 20):.1f} MB written past [limits] max_log_mb were cut from this log")
    return (
        f"the job's logs exceeded [limits] max_log_mb of {limits.max_log_bytes / (1 << 20):g} MB "
        f"(all its nodes together: {size / (1 << 20):.1f} MB); what {limits.node} wrote past it was cut"
    )


def _wait_gone(pid: int, timeout: float = 2.0) -> None:
    """Wait (bounded) until the killed ``pid`` has ended (reaped, or a zombie)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        fields = stat_fields(pid)
        if fields is None or fields[0] in (b"Z", b"X"):
            return
        time.sleep(0.01)


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):  # ended meanwhile (its pid not reused yet)
        pass


def memory_reason(limits: Limits, oom_kills: int, peak: int) -> str:
    """The node's failure when the kernel killed ``oom_kills`` of its processes in its cgroup
    (rule 2), the same sentence's head as the watchdog's own."""
    return (
        f"the job exceeded its memory limit of {_gb(limits.memory_gb)} on {limits.node} "
        f"(all it held, resident, in /tmp, /dev/shm and /run, and shared memory: peak "
        f"{_gb(peak / (1 << 30))}; the kernel killed {oom_kills} process"
        f"{'es' if oom_kills != 1 else ''} for memory): killed"
    )


def watch(
    limits: Limits,
    ended: threading.Event,
    say: Callable[[str], None],
    on_exceeded: Callable[[str], None],
    memory_cgroup=None,
) -> None:
    """Watch the processes below this one against ``limits`` until ``ended`` is set (the module's
    rules 1-3); ``say`` writes a line in the node's log, ``on_exceeded(reason)`` runs before each
    kill; ``memory_cgroup`` (a :class:`.cgroup.NodeCgroup`): the kernel bounds the node's memory
    there (rule 2).  Runs on the caller's thread."""
    node = limits.node
    memory = limits.memory_gb * (1 << 30)
    log_cap = limits.max_log_bytes
    reserve, flood_rate = limits.disk_reserve_bytes, limits.disk_flood_rate
    last_size, last_time = None, time.monotonic()
    said_processes = False
    cap_exceeded = False
    while not ended.wait(MEMORY_SAMPLE):
        tree = process_tree(os.getpid())
        used, tasks = _stats(tree)
        exceeded = None
        if limits.max_processes and tasks >= limits.max_processes:
            if not limits.kernel_bound:  # the watchdog is the bound
                exceeded = (
                    f"the job exceeded its limit of {limits.max_processes} processes and threads on {node} "
                    f"([limits] max_node_processes; {tasks} running): killed"
                )
            elif not said_processes:
                said_processes = True
                say(
                    f"{node} reached its limit of {limits.max_processes} processes and threads "
                    "([limits] max_node_processes): starting more fails until some end"
                )
        if memory_cgroup is not None:
            kills = memory_cgroup.oom_kills() if memory and exceeded is None else 0
            if kills:
                exceeded = memory_reason(limits, kills, memory_cgroup.peak_bytes())
            held = used = 0  # the kernel's bound, not this sum
        else:
            held = tmpfs_held(tree) if memory and exceeded is None else 0
        if exceeded is None and memory and used + held > memory:
            exceeded = (
                f"the job exceeded its memory limit of {_gb(limits.memory_gb)} on {node} "
                f"({_gb((used + held) / (1 << 30))}: {_gb(used / (1 << 30))} resident, "
                f"{_gb(held / (1 << 30))} in /tmp, /dev/shm and /run): killed"
            )
        if exceeded is None and log_cap and limits.logs_dir:
            size = logs_size(limits.logs_dir)
            if isinstance(size, FolderRefused) and size.bound == "entries":
                exceeded = (
                    f"the job's logs folder holds more than {MAX_LOG_ENTRIES} files and folders "
                    f"(all its nodes together); {node} was killed"
                )
            elif isinstance(size, FolderRefused):
                exceeded = (
                    f"the job's logs folder cannot be measured for [limits] max_log_mb ({size.message}); "
                    f"{node} was killed"
                )
            elif size > log_cap:
                cap_exceeded = log_cap == limits.max_log_bytes  # the cap itself, not its slack
                exceeded = (
                    f"the job's logs exceeded [limits] max_log_mb of {limits.max_log_bytes / (1 << 20):g} MB "
                    f"(all its nodes together: {size / (1 << 20):.1f} MB); {node} was killed"
                )
                log_cap = size + LOG_SLACK
            else:
                now = time.monotonic()
                if last_size is not None and reserve and flood_rate:
                    exceeded = _log_flood(
                        limits.logs_dir, size - last_size, now - last_time, reserve, flood_rate
                    )
                    if exceeded:
                        exceeded += f"; {node} was killed"
                last_size, last_time = size, now
        if exceeded is None:
            continue
        on_exceeded(exceeded)
        for pid in tree:
            _signal(pid, signal.SIGKILL)
        if cap_exceeded:
            cap_exceeded = False
            for pid in tree:  # the writers are gone before their overflow is cut
                _wait_gone(pid)
            cut = cut_overflow(size - limits.max_log_bytes)
            if cut:  # the reason's line may have been cut with the overflow: said again
                say(f"{exceeded} ({cut / (1 << 20):.1f} MB written past the cap were cut from this log)")
                log_cap = size - cut + LOG_SLACK


def tree_usage(root: int) -> tuple[float, int] | None:
    """What the node below runner ``root`` uses now: ``(cpu seconds, resident bytes)``, or None
    once ``root`` is gone.

    The service's resource sampler calls it (through the local backend) with the tree walk the
    memory watchdog uses.  The CPU seconds are cumulative and never shrink while the runner
    lives: each process counts its own time and that of the children it reaped (``utime``,
    ``stime``, ``cutime``, ``cstime``), so a child's time moves to its parent when it ends.
    The memory is that of the processes below the runner and their memory-backed folders (the
    watchdog's sum, rule 2).
    """
    ticks = 0
    for pid in (root, *process_tree(root)):
        fields = stat_fields(pid)
        if fields is None:
            if pid == root:
                return None
            continue  # ended meanwhile: its time is in its parent's once reaped
        ticks += sum(int(f) for f in fields[UTIME : CSTIME + 1])
    tree = process_tree(root)
    used = sum(resident(pid) for pid in tree) + tmpfs_held(tree)
    return ticks / os.sysconf("SC_CLK_TCK"), used


def tree_pids(root: int) -> set[int]:
    """``root`` and every process below it now (whose card memory is the node's)."""
    return {root, *process_tree(root)}
