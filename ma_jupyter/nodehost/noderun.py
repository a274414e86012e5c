"""The per-node runner: ``python -m ma_jupyter.nodehost.noderun <node-run.json>``.

The local backend starts one runner per node, in its own session, with stdout/stderr already
pointing at the node's log file; the service is never in the log path.  The runner:

1. pins itself to the task's cores (inherited by everything it starts), and watches the
   node's limits: every ``MEMORY_SAMPLE`` seconds it walks every process below it (through
   ``/proc/<pid>/task/<tid>/children``) and

   a. memory: sums their resident memory and what the node's sandboxes hold in their
      memory-backed folders (``/tmp``, ``/dev/shm``, ``/run``: tmpfs, each capped at the
      node's memory by bubblewrap, read with ``statvfs`` through ``/proc/<pid>/root``); past
      the spec's ``memory_gb`` it kills them all and reports "exceeded its memory limit of N GB
      on <node>" as the node's failure (no kernel memory limit is set: a watchdog works
      wherever the platform does, cgroup or not);
   b. processes: the node's tasks (processes and threads) are bounded by the kernel at
      ``max_processes`` (``[limits] max_node_processes``): as root, in bubblewrap (where the
      backend found it works, ``own_user_namespace``: :func:`check_user_namespace`), the runner
      makes the node a user namespace of its own, mapping every id to itself (files keep their
      owners), and starts each phase in it with that ``RLIMIT_NPROC``; the kernel counts a
      limit per (user namespace, uid) since Linux 5.14, so the node's count is its own, not
      that of every job running as the same account (``nobody``).  Reaching it, a fork fails
      with ``EAGAIN`` in the job and the node's log says so once.  Where no such namespace can
      be made (not root, the symlink mode), or the node runs as root (an admin's
      ``allow_root``), the watchdog kills the node past it instead;
   c. logs: sums the sizes of every file in the job's ``logs/`` folder (all its nodes on this
      machine); past ``max_log_bytes`` (``[limits] max_log_mb``) it kills the node and reports
      "logs exceeded ... max_log_mb": the job ends in error with that reason (the node log is
      written by the job's processes directly, so the cap ends the writer rather than cutting
      what it writes); a folder of more than ``MAX_LOG_ENTRIES`` entries ends it too; and
      while the logs' disk has less than ``disk_reserve_bytes`` free, logs growing at
      ``disk_flood_rate`` or more (less the fuller the disk: the supervisor's rule, see
      :mod:`ma_jupyter.service.policies`) end it with "disk nearly full under <logs>";
2. at the node's first launch, has its working copy filled from the algorithm folder (see
   :mod:`ma_jupyter.nodeside.workdir`): by the first phase itself in bubblewrap (as the job's
   account, before the command; it reports the end on a pipe), by the runner in the symlink
   mode; and records it complete in ``nodes/<node>/workdir.json``, so later attempts continue
   in it; a copy that fails ends the node with its code (3 over the size limit);
3. runs the optional lifecycle ``on_start`` command, then the node's command, then ``on_stop``,
   each already wrapped in the node's sandbox by the backend, then (``export``, when anything in
   the working copy changed since the copy) keeps what the job wrote there in its outputs;
4. forwards SIGTERM/SIGINT to every process of the node (not to bubblewrap itself, which would
   kill the node at once) so training code gets its chance to save a checkpoint;
5. when a phase ends, kills what it left behind (a bubblewrap pid namespace does this by
   itself; in the symlink mode the runner is a child subreaper and finds them as descendants);
6. moves ``$MA_RANK_LOG_DIR/failure.json`` (a launcher's report of the first failed rank) to
   ``nodes/<node>/failure.json``, and ``not-distributed.json`` (torch's launcher on node 0: no
   rank joined a process group) to ``nodes/<node>/``, each when it is a small regular file (see
   :func:`ma_jupyter.untrusted.collect_report`) and writes the exit code atomically to
   ``nodes/<node>/exit_code``, so a service that was down meanwhile learns the result;
7. beats: every ``HEARTBEAT_EVERY`` seconds, while it runs, it sets the time of
   ``nodes/<node>/heartbeat`` to now (one ``utime``), so the service's node inspection sees a
   runner that stopped (frozen, or its machine gone) by the file's age;
8. ends with its host: where the spec names the process hosting the node (``end_with``: a Ray
   node's raylet, see :mod:`.hostwatch`), the end of that process ends the node as a stop
   would, but within ``HOST_GRACE`` seconds: TERM to its processes, then KILL to every process
   below the runner until it ends (``on_stop`` included); what was ended is said in the log and
   written as the node's failure report.

Exit codes follow the shell: a command killed by signal N ends with 128+N.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ..jobdir import FAILURE_REPORT, NOT_DISTRIBUTED_REPORT, NodeDir
from ..nodeside import workdir
from ..nodeside.exec_env import COPY_FD, ENV_FD, env_file_data
from ..untrusted import collect_report
from . import hostwatch

#: seconds between two samples of a node's limits (a read of /proc per sample)
MEMORY_SAMPLE = 0.2
#: the node's memory-backed folders (bubblewrap's tmpfs), counted in its memory
TMPFS_FOLDERS = ("/tmp", "/dev/shm", "/run")
CLONE_NEWUSER = 0x10000000
#: the user namespaces a process's own user namespace may still hold (a per-namespace count)
USERNS_LIMIT = "/proc/sys/user/max_user_namespaces"
#: bytes the job's logs may still grow by after its node was killed for them (on_stop's lines)
LOG_SLACK = 1 << 20
#: files and folders the job's logs folder may hold (a node log, per-rank logs and reports)
MAX_LOG_ENTRIES = 10000
#: a disk with less free space counts as full (``ma_jupyter.service.disk.FULL_BELOW``): each
#: job writing there ends "disk full", the reserve's rule stands aside
FULL_BELOW = 256 << 10
#: seconds between two heartbeats (rule 7); the service's faulty threshold is several of them
HEARTBEAT_EVERY = 1.0
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
#: seconds the processes of a node whose host process ended get between TERM and KILL (rule 8)
HOST_GRACE = 3.0
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the runner still works, with less cleanup
        pass


def _descendants(root: int) -> list[tuple[int, int, str]]:
    """``(pid, parent pid, state)`` of every process below ``root``, parents before children.

    Read from ``/proc`` directly rather than with psutil: its import (15 ms) would delay every
    node's start, and the runner needs nothing else from it.
    """
    table: dict[int, list[tuple[int, str]]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:  # ended meanwhile
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ')'
        fields = stat[stat.rfind(b")") + 2 :].split()
        table.setdefault(int(fields[1]), []).append((int(entry), fields[0].decode()))
    found: list[tuple[int, int, str]] = []
    parents = [root]
    while parents:
        parent = parents.pop(0)
        for pid, state in table.get(parent, ()):
            found.append((pid, parent, state))
            parents.append(pid)
    return found


def _tree(root: int) -> list[int]:
    """Every process below ``root``, walked through ``/proc/<pid>/task/<tid>/children`` (it
    reads only the tree, not all of ``/proc``: the memory watchdog samples it often); the whole
    ``/proc`` scan of :func:`_descendants` where the kernel has no such files."""
    if not os.path.exists(f"/proc/{root}/task/{root}/children"):
        return [pid for pid, _, state in _descendants(root) if state != "Z"]
    found: list[int] = []
    todo = [root]
    while todo:
        pid = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:  # ended meanwhile
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/children", "rb") as fh:
                    children = [int(c) for c in fh.read().split()]
            except (OSError, ValueError):
                continue
            found += children
            todo += children
    return found


def _rss(pid: int) -> int:
    """Resident memory of one process in bytes (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as fh:
            return int(fh.read().split()[1]) * PAGE
    except (OSError, ValueError, IndexError):
        return 0


def _stats(tree: list[int]) -> tuple[int, int]:
    """``(resident bytes, tasks)`` of the processes ``tree``: one read of ``/proc/<pid>/stat``
    each (tasks: processes and their threads, what ``RLIMIT_NPROC`` counts)."""
    resident = tasks = 0
    for pid in tree:
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:  # ended meanwhile
            continue
        # fields after "pid (comm)": num_threads is [17], rss (pages) [21]
        fields = stat[stat.rfind(b")") + 2 :].split()
        try:
            tasks += int(fields[17])
            resident += int(fields[21]) * PAGE
        except (ValueError, IndexError):
            continue
    return resident, tasks


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
    (:func:`node_user_namespace`), so the job can neither mount over these folders nor make a
    namespace of its own to mount in.  A node without a user namespace of its own (no root, or
    the kernel refuses one) has no such bar: where the host lets any account make user
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


def logs_size(folder: str) -> int | None:
    """Bytes of every regular file below ``folder`` (the job's logs), following no link; None
    when it holds more than :data:`MAX_LOG_ENTRIES` entries (a job making files there without
    end would make every sample slower)."""
    total = entries_seen = 0
    todo = [folder]
    while todo:
        try:
            with os.scandir(todo.pop()) as entries:
                for entry in entries:
                    entries_seen += 1
                    if entries_seen > MAX_LOG_ENTRIES:
                        return None
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            todo.append(entry.path)
                        elif entry.is_file(follow_symlinks=False):
                            total += entry.stat(follow_symlinks=False).st_size
                    except OSError:
                        continue
        except OSError:  # gone, or not a folder
            continue
    return total


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


def node_user_namespace() -> int | None:
    """A new user namespace mapping every uid and gid to itself, as a descriptor to ``setns``
    into; None where none can be made (not root, or the kernel refuses).

    A helper process unshares it and waits while this (privileged) process writes its maps; the
    namespace outlives the helper through the descriptor.  Ids mapped to themselves keep every
    file's owner and the account's permissions as they are; only the kernel's per-user counts
    (``RLIMIT_NPROC``) start from zero in it.

    Once the maps are written the helper (root of the new namespace, with every capability in
    it) sets the namespace's own ``/proc/sys/user/max_user_namespaces`` to 0: no process of the
    node can then make a user namespace (``unshare -U`` fails with ENOSPC), in which it would be
    root and could mount a tmpfs the node's memory watchdog never sees (:func:`tmpfs_held`).  No
    one in the node can raise it again: that takes CAP_SYS_RESOURCE in the namespace, which
    ``--cap-drop ALL`` and ``setpriv`` take from every process there.  A namespace whose limit
    cannot be set is not used (None).
    """
    if os.geteuid() != 0:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the helper: unshare, say so, wait until the maps are written, close the door
        try:
            os.close(ready_r)
            os.close(done_w)
            os.write(ready_w, b"1" if libc.unshare(CLONE_NEWUSER) == 0 else b"0")
            if os.read(done_r, 1) == b"1":
                # the sysctl a process reads and writes is its own user namespace's; root of the
                # host (mapped now) passes /proc/sys's owner check, the namespace's caps the rest
                with open(USERNS_LIMIT, "w") as fh:
                    fh.write("0\n")
                os.write(ready_w, b"1")
        finally:
            os._exit(0)
    os.close(ready_w)
    os.close(done_r)
    fd = None
    try:
        if os.read(ready_r, 1) == b"1":
            for name in ("uid_map", "gid_map"):
                with open(f"/proc/{pid}/{name}", "w") as fh:
                    fh.write("0 0 4294967295\n")
            fd = os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
            os.write(done_w, b"1")
            if os.read(ready_r, 1) != b"1":  # the limit is not set: the namespace is no barrier
                os.close(fd)
                fd = None
    except OSError:
        if fd is not None:
            os.close(fd)
        fd = None
    finally:
        os.close(done_w)
        os.close(ready_r)
        os.waitpid(pid, 0)
    return fd


def tree_usage(root: int) -> tuple[float, int] | None:
    """What the node below runner ``root`` uses now: ``(cpu seconds, resident bytes)``, or None
    once ``root`` is gone.

    The service's resource sampler calls it (through the local backend) with the tree walk the
    memory watchdog uses.  The CPU seconds are cumulative and never shrink while the runner
    lives: each process counts its own time and that of the children it reaped (``utime``,
    ``stime``, ``cutime``, ``cstime``), so a child's time moves to its parent when it ends.
    The memory is that of the processes below the runner and their memory-backed folders (the
    watchdog's sum, rule 1a).
    """
    ticks = 0
    for pid in (root, *_tree(root)):
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            if pid == root:
                return None
            continue  # ended meanwhile: its time is in its parent's once reaped
        # fields after "pid (comm)": state is [0], utime [11], stime [12], cutime [13], cstime [14]
        fields = stat[stat.rfind(b")") + 2 :].split()
        ticks += sum(int(f) for f in fields[11:15])
    tree = _tree(root)
    used = sum(_rss(pid) for pid in tree) + tmpfs_held(tree)
    return ticks / os.sysconf("SC_CLK_TCK"), used


def tree_pids(root: int) -> set[int]:
    """``root`` and every process below it now (whose card memory is the node's)."""
    return {root, *_tree(root)}


def _gb(value: float) -> str:
    return f"{value:.3g} GB"


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):  # ended meanwhile (its pid not reused yet)
        pass


def _comm(pid: int) -> str:
    """A process's command name (``?`` once it is gone)."""
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return "?"


def _die_with_runner() -> None:
    """In the sandbox's first process: SIGKILL it if the runner dies (no orphaned node)."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _enter_node(userns: int | None, max_processes: int) -> Callable[[], None]:
    """What each phase's first process runs before its program: die with the runner, and (with
    the node's user namespace) enter it with the node's process limit (rule 1b).

    Any namespace the host owns (one made outside the node) must be joined before that
    ``setns``: inside the node's user namespace no process can join one."""

    # looked up here, not in the forked child (where another thread may have held a lock)
    setns = ctypes.CDLL(None, use_errno=True).setns if userns is not None else None

    def enter() -> None:
        _die_with_runner()
        if setns is None:
            return
        if setns(userns, CLONE_NEWUSER) != 0:
            os.write(2, b"[ma_jupyter] cannot enter the node's user namespace\n")
            os._exit(126)
        resource.setrlimit(resource.RLIMIT_NPROC, (max_processes, max_processes))

    return enter


def reap_ended() -> None:
    """Collect every child process that has ended, without waiting for the others."""
    while True:
        try:
            done, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if done == 0:
            return


def write_exit_code(path: Path, code: int) -> None:
    """Atomically write ``code`` to ``path`` (tmp file + fsync + rename)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as fh:
        fh.write(f"{code}\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def write_report(path: Path, data: dict) -> None:
    """Atomically write a small JSON report the runner itself makes."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


class NodeRunner:
    """Runs the phases of one node and relays signals to them."""

    def __init__(self, spec: dict):
        self.spec = spec
        self.stopping = False
        self.current: subprocess.Popen | None = None
        self.agent: subprocess.Popen | None = None  # the debug terminal's shell agent
        self.exceeded: str | None = None  # the failure sentence, once the watchdog acted
        self.host_gone: str | None = None  # the failure sentence, once the host process ended
        self._ended = threading.Event()
        # rule 1b: the node's own user namespace (a descriptor), where one could be made
        self.userns: int | None = None
        self.max_processes = int(spec.get("max_processes") or 0)

    def _preexec(self) -> Callable[[], None]:
        return _enter_node(self.userns, self.max_processes)

    def _kernel_bound(self) -> bool:
        """Whether the kernel bounds the node's processes (rule 1b): in its own user namespace,
        as an account other than root (``RLIMIT_NPROC`` never applies to root)."""
        return self.userns is not None and self.spec.get("account_uid") != 0

    def _watch(self) -> None:
        """The watchdog (rule 1): past a limit, say so in the node's log and kill every process
        of the node (the phase then ends with 128+9).

        It watches until the job's last phase (``on_stop``) ends, so the phases after a kill
        are held to the same limits; the first reason is the node's.  After a kill for its
        logs, they may grow by :data:`LOG_SLACK` more (what those phases print).
        """
        node = self.spec.get("node", "the node")
        limit_gb = float(self.spec.get("memory_gb") or 0)
        memory = limit_gb * (1 << 30)
        max_logs = int(self.spec.get("max_log_bytes") or 0)
        logs_dir = self.spec.get("logs_dir")
        log_cap = max_logs
        reserve = int(self.spec.get("disk_reserve_bytes") or 0)
        flood_rate = float(self.spec.get("disk_flood_rate") or 0)
        last_size, last_time = None, time.monotonic()
        said_processes = False
        while not self._ended.wait(MEMORY_SAMPLE):
            tree = _tree(os.getpid())
            resident, tasks = _stats(tree)
            exceeded = None
            # The process count first: the children a fork bomb has not exec'd yet each count
            # the parent's resident pages again (shared, copy-on-write), so the memory sum
            # passes its limit too, and would name the wrong cause.
            if self.max_processes and tasks >= self.max_processes:
                if not self._kernel_bound():  # the watchdog is the bound
                    exceeded = (
                        f"the job exceeded its limit of {self.max_processes} processes and threads on {node} "
                        f"([limits] max_node_processes; {tasks} running): killed"
                    )
                elif not said_processes:
                    said_processes = True
                    self._say(
                        f"{node} reached its limit of {self.max_processes} processes and threads "
                        "([limits] max_node_processes): starting more fails until some end"
                    )
            held = tmpfs_held(tree) if memory and exceeded is None else 0
            if exceeded is None and memory and resident + held > memory:
                exceeded = (
                    f"the job exceeded its memory limit of {_gb(limit_gb)} on {node} "
                    f"({_gb((resident + held) / (1 << 30))}: {_gb(resident / (1 << 30))} resident, "
                    f"{_gb(held / (1 << 30))} in /tmp, /dev/shm and /run): killed"
                )
            if exceeded is None and log_cap and logs_dir:
                size = logs_size(logs_dir)
                if size is None:
                    exceeded = (
                        f"the job's logs folder holds more than {MAX_LOG_ENTRIES} files and folders "
                        f"(all its nodes together); {node} was killed"
                    )
                elif size > log_cap:
                    exceeded = (
                        f"the job's logs exceeded [limits] max_log_mb of {max_logs / (1 << 20):g} MB "
                        f"(all its nodes together: {size / (1 << 20):.1f} MB); {node} was killed"
                    )
                    log_cap = size + LOG_SLACK
                else:
                    now = time.monotonic()
                    if last_size is not None and reserve and flood_rate:
                        exceeded = _log_flood(
                            logs_dir, size - last_size, now - last_time, reserve, flood_rate
                        )
                        if exceeded:
                            exceeded += f"; {node} was killed"
                    last_size, last_time = size, now
            if exceeded is None:
                continue
            if self.exceeded is None:
                self.exceeded = exceeded
                self._say(exceeded)
            self.stopping = True  # no further phase but on_stop
            for pid in tree:
                _signal(pid, signal.SIGKILL)

    @staticmethod
    def _say(text: str) -> None:
        """A line of the platform's in the node's log (never fatal: the disk may be full)."""
        try:
            print(f"[ma_jupyter] {text}", file=sys.stderr, flush=True)
        except OSError:
            pass

    def _beat(self, path: Path) -> None:
        """Rule 7: refresh the heartbeat file's time until the node ends."""
        while not self._ended.is_set():
            try:
                path.touch()  # an existing file: its time only
            except OSError:
                if not path.parent.is_dir():
                    return  # the node's folder is gone (the job was deleted): nothing to say
                # else transient (a full disk, an interrupted call): beat again next time
            self._ended.wait(HEARTBEAT_EVERY)

    def _end_with_host(self, what: str) -> None:
        """Rule 8: ``what`` (the process hosting the node) ended: end every process of the node."""
        node = self.spec.get("node", "the node")
        below = _tree(os.getpid())
        names = ", ".join(f"{_comm(pid)} ({pid})" for pid in below[:8]) + (", ..." if len(below) > 8 else "")
        self.host_gone = (
            f"{what} ended: the processes of {node} on that machine were ended with it "
            f"(TERM, KILL after {HOST_GRACE:g} s): {names or 'none left'}"
        )
        print(f"[ma_jupyter] {self.host_gone}", file=sys.stderr, flush=True)
        self.stopping = True  # no further phase
        self._signal_all(signal.SIGTERM)
        deadline = time.monotonic() + HOST_GRACE
        while time.monotonic() < deadline and _tree(os.getpid()) and not self._ended.wait(0.1):
            pass
        while not self._ended.is_set():  # what is left, and on_stop: nothing outlives the host
            for pid in _tree(os.getpid()):
                _signal(pid, signal.SIGKILL)
            self._ended.wait(0.2)

    # the processes of the node a stop signal is meant for
    def _targets(self) -> list[int]:
        current = self.current
        if current is None:
            return []
        top = current.pid
        below = _descendants(top)
        if self.spec.get("sandbox") == "bubblewrap":
            # bwrap (outer) -> bwrap (pid 1 of the namespace) -> the command...: signal the
            # command's processes only; killing bwrap would end the node without a grace period
            return [pid for pid, parent, _ in below if parent != top]
        return [top, *(pid for pid, _, _ in below)]

    def _signal_all(self, signum: int) -> None:
        for pid in self._targets():
            _signal(pid, signum)

    def _on_signal(self, signum, _frame) -> None:
        self.stopping = True
        self._signal_all(signal.SIGTERM if signum == signal.SIGTERM else signum)

    def _with_env_fd(self, argv: list[str]) -> tuple[list[str], int | None]:
        """``argv`` reading the job's variables from a fresh descriptor (bubblewrap), and that
        descriptor (the caller passes it on and closes it); unchanged and None without them.

        The variables reach the sandbox as a file: a command line is readable by every user of
        the host; bubblewrap reads them from this descriptor.
        """
        if self.spec.get("job_env") is None:
            return argv, None
        env_fd = os.memfd_create("ma-job-env")
        data = env_file_data(self.spec["job_env"])
        while data:
            data = data[os.write(env_fd, data) :]
        os.lseek(env_fd, 0, os.SEEK_SET)
        return [str(env_fd) if a == ENV_FD else a for a in argv], env_fd

    def _start_agent(self) -> None:
        """--debug-terminal: start the shell agent (shell_agent) in the node's view, beside the
        phases; it is spared by the leftover sweep and ended by :meth:`_stop_agent`."""
        argv = self.spec["shell_agent"]
        argv, env_fd = self._with_env_fd(argv)  # the variables as a file, as for the phases
        cwd = self.spec.get("cwd")
        if cwd:
            Path(cwd).mkdir(parents=True, exist_ok=True)
        try:
            self.agent = subprocess.Popen(
                argv,
                env=self.spec["env"],
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=self._preexec(),
                pass_fds=(env_fd,) if env_fd is not None else (),
            )
        except OSError as exc:
            print(f"[ma_jupyter] cannot start the debug terminal: {exc}", file=sys.stderr, flush=True)
        finally:
            if env_fd is not None:
                os.close(env_fd)

    def _agent_pids(self) -> set[int]:
        if self.agent is None:
            return set()
        return {self.agent.pid, *_tree(self.agent.pid)}

    def _stop_agent(self) -> None:
        """End the shell agent and every shell it serves (TERM, then KILL after 5 s)."""
        if self.agent is None:
            return
        for signum in (signal.SIGTERM, signal.SIGKILL):
            for pid in sorted(self._agent_pids()):
                _signal(pid, signum)
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline and self.agent.poll() is None:
                time.sleep(0.05)
            if self.agent.poll() is not None:
                break
        self.agent = None

    def _run(self, argv: list[str]) -> int:
        """Run one phase to its end, reaping adopted orphans meanwhile; its exit code."""
        env = self.spec["env"]
        cwd = self.spec.get("cwd")
        if cwd:
            Path(cwd).mkdir(parents=True, exist_ok=True)
        copy_r = copy_w = None
        if COPY_FD in argv:
            # the phase fills the working copy first and writes the time it was complete here
            copy_r, copy_w = os.pipe()
            argv = [str(copy_w) if a == COPY_FD else a for a in argv]
        argv, env_fd = self._with_env_fd(argv)
        try:
            self.current = subprocess.Popen(
                argv,
                env=env,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # a TERM to the runner's group must not hit bwrap
                preexec_fn=self._preexec(),
                pass_fds=tuple(fd for fd in (env_fd, copy_w) if fd is not None),
            )
        except OSError as exc:
            if copy_r is not None:
                os.close(copy_r)
            print(f"[ma_jupyter] cannot start {argv[0]}: {exc}", file=sys.stderr, flush=True)
            return 127 if isinstance(exc, FileNotFoundError) else 126
        finally:
            for fd in (env_fd, copy_w):
                if fd is not None:
                    os.close(fd)
        if copy_r is not None:
            self._record_copy(copy_r)
        status = self._wait(self.current.pid)
        self._kill_leftovers()
        self.current = None
        if os.WIFSIGNALED(status):
            return 128 + os.WTERMSIG(status)
        return os.WEXITSTATUS(status)

    def _record_copy(self, fd: int) -> None:
        """Wait for the phase to report its working copy complete (a line: the time), and record
        it; nothing arrives when the copy failed (the phase ends, closing the pipe)."""
        data = b""
        try:
            while not data.endswith(b"\n"):
                chunk = os.read(fd, 64)
                if not chunk:
                    break
                data += chunk
        finally:
            os.close(fd)
        if data.endswith(b"\n") and data.strip().isdigit():
            write_record(NodeDir(Path(self.spec["node_dir"])).workdir_record, int(data))

    def _wait(self, pid: int) -> int:
        while True:
            try:
                done, status = os.waitpid(-1, 0)  # also reaps orphans adopted as subreaper
            except ChildProcessError:
                # the child is gone without a status we could collect: report a failure, never success
                return 255 << 8
            if done == pid:
                return status

    def _kill_leftovers(self) -> None:
        """Kill what the finished command left running (background children, setsid'd ones)."""
        for _ in range(50):
            spared = self._agent_pids()  # the debug terminal lives as long as the node
            left = [pid for pid, _, state in _descendants(os.getpid()) if state != "Z" and pid not in spared]
            for pid in left:
                _signal(pid, signal.SIGKILL)
            reap_ended()
            if not left:
                return
            time.sleep(0.02)

    def run(self) -> int:
        """Run the copy, on_start, the command, on_stop and the export; record and return the
        node's exit code."""
        spec = self.spec
        refused = isolate_network(spec)  # first: before any thread, and before anything starts
        if refused:
            print(f"[ma_jupyter] {refused}", file=sys.stderr, flush=True)
            node_dir = NodeDir(Path(spec["node_dir"]))
            write_report(node_dir.failure, {"reason": refused})
            write_exit_code(node_dir.exit_code, 126)
            return 126
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        cpus = set(spec.get("cpus") or ())
        if cpus and hasattr(os, "sched_setaffinity"):
            usable = cpus & os.sched_getaffinity(0)
            if usable:
                os.sched_setaffinity(0, usable)
        node_dir = NodeDir(Path(spec["node_dir"]))
        if self.max_processes and spec.get("own_user_namespace"):
            # made before any thread starts: it forks a helper
            self.userns = node_user_namespace()
        if (
            self.max_processes
            and spec.get("sandbox") == "bubblewrap"
            and self.userns is None
            and os.geteuid() == 0
        ):
            self._say("no user namespace of its own for this node here: its process limit is the watchdog's")
        threading.Thread(target=self._beat, args=(node_dir.heartbeat,), daemon=True).start()
        if spec.get("memory_gb") or self.max_processes or spec.get("max_log_bytes"):
            threading.Thread(target=self._watch, daemon=True).start()
        if spec.get("end_with"):
            hostwatch.watch(spec["end_with"], self._end_with_host)
        code = 0
        if spec.get("shell_agent"):
            self._start_agent()
        if spec.get("copy"):  # the symlink mode: the runner runs as the job's account
            code = workdir.main(["copy", *spec["copy"]])
            if code == 0:
                write_record(node_dir.workdir_record, time.time_ns())
        if code == 0 and spec.get("on_start"):  # nothing runs in an incomplete working copy
            code = self._run(spec["on_start"])
            if code != 0:
                print(f"[ma_jupyter] lifecycle on_start exited with code {code}", file=sys.stderr, flush=True)
        if code == 0 and not self.stopping:
            code = self._run(spec["argv"])
        elif self.stopping:
            code = 128 + signal.SIGTERM
        if spec.get("on_stop"):
            stop_code = self._run(spec["on_stop"])
            if stop_code != 0:
                print(
                    f"[ma_jupyter] lifecycle on_stop exited with code {stop_code}",
                    file=sys.stderr,
                    flush=True,
                )
        keep = float(spec.get("keep_failed_seconds") or 0)
        # a failed command (not a stop) keeps the sandbox for its debug terminal
        kept = (
            code != 0
            and not self.stopping
            and keep > 0
            and self.agent is not None
            and self.agent.poll() is None
        )
        if not kept:
            self._stop_agent()
        self._ended.set()
        self._export(node_dir)
        # the job could leave anything there (a FIFO, a symlink): never follow or read it here
        for report in (FAILURE_REPORT, NOT_DISTRIBUTED_REPORT):
            collect_report(Path(spec["rank_log_dir"]), node_dir.root, spec.get("node", "the node"), report)
        if self.exceeded:  # the runner's own report wins over the launcher's
            write_report(node_dir.failure, {"reason": self.exceeded})
            code = code or 128 + signal.SIGKILL
        if self.host_gone:
            write_report(node_dir.failure, {"reason": self.host_gone})
            code = code or 128 + signal.SIGTERM
        if kept:  # recorded before the exit code, which ends the job: its events can say so
            until = time.time() + keep
            write_report(node_dir.kept, {"until": until})
        write_exit_code(node_dir.exit_code, code)
        if kept:
            self._keep_for_debugging(until)
        return code

    def _keep_for_debugging(self, until: float) -> None:
        """Keep the shell agent (and so the sandbox: its mounts and files) until ``until``, a
        stop signal (the job deleted, or a new attempt) or the agent's own end; then end it."""
        stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(until))
        print(
            f"[ma_jupyter] the command failed: this node's sandbox stays for the debug terminal until {stamp}",
            file=sys.stderr,
            flush=True,
        )
        while time.time() < until and not self.stopping and self.agent.poll() is None:
            time.sleep(0.5)
        self._stop_agent()

    def _export(self, node_dir: NodeDir) -> None:
        """Keep what the job wrote in its working copy, when anything changed since the copy (a
        look at file times, following no link: most nodes write nothing there)."""
        since = read_record(node_dir.workdir_record)
        export, folder = self.spec.get("export"), self.spec.get("workdir")
        if not export or since is None or not folder or not workdir.changed_since(folder, since):
            return
        code = self._run([*export, str(since)])
        if code != 0:
            print(
                f"[ma_jupyter] keeping the working directory's files ended with code {code}",
                file=sys.stderr,
                flush=True,
            )


def isolate_network(spec: dict) -> str | None:
    """Put the runner, and so everything it starts, where the node's network rules hold (see
    :mod:`.network`): into the attempt's namespace (``netns``: its file), or behind the fence
    (``deny_tcp``: the ports it may not connect to); None when done, else why not (the node then
    runs nothing: never on a network it should not have)."""
    if not spec.get("netns") and spec.get("deny_tcp") is None:
        return None
    from . import network

    try:
        if spec.get("netns"):
            network.enter(spec["netns"])
        if spec.get("deny_tcp") is not None:
            network.fence(spec["deny_tcp"])
    except OSError as exc:
        return f"the node's network cannot be isolated: {exc.strerror or exc}"
    return None


def write_record(path: Path, since: int) -> None:
    """Record the node's working copy complete (atomically): ``{"since": ns}``."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as fh:
        json.dump({"since": since}, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def read_record(path: Path) -> int | None:
    """The time a node's working copy was complete; None without a (readable) record."""
    try:
        with open(path, "rb") as fh:
            since = json.loads(fh.read(4096))["since"]
        return since if isinstance(since, int) else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


#: the argument that asks :func:`main` whether nodes can have user namespaces of their own
CHECK_USER_NAMESPACE = "--check-user-namespace"


def check_user_namespace(bwrap: str) -> int:
    """0 when a sandbox can start in a user namespace of its own here (rule 1b): one is made and
    ``bwrap`` mounts a fresh ``/proc`` and ``/dev`` in it (a host whose ``/proc`` has covered
    paths, as some containers have, refuses that in a user namespace); 1 otherwise."""
    userns = node_user_namespace()
    if userns is None:
        return 1
    argv = [bwrap, "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--unshare-pid"]
    argv += ["--cap-drop", "ALL", "--", "true"]
    try:
        done = subprocess.run(argv, preexec_fn=_enter_node(userns, 64), capture_output=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return 1
    return 0 if done.returncode == 0 else 1


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the node described by the JSON file named in ``argv``
    (``--check-user-namespace BWRAP``: :func:`check_user_namespace`)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 2 and args[0] == CHECK_USER_NAMESPACE:
        return check_user_namespace(args[1])
    if len(args) != 1:
        print("usage: python -m ma_jupyter.nodehost.noderun <node-run.json>", file=sys.stderr)
        return 2
    spec = json.loads(Path(args[0]).read_text())
    return NodeRunner(spec).run()


if __name__ == "__main__":
    code = main()
    # the exit code is on disk: end now rather than after the interpreter's teardown (its daemon
    # threads and modules), which would only delay the node's end
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
