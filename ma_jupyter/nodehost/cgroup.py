"""A node's own control group: the kernel bounds everything the node holds in memory.

The memory watchdog (:mod:`.watchdog`) sums resident pages and the sandbox's tmpfs folders;
memory a job holds without mapping it (a memfd written then unmapped, System V shared memory, a
tmpfs of its own) escapes that sum.  A memory cgroup charges every page the node's processes
touch, tmpfs and shared memory included, so where one can be made the kernel is the bound:

1. detection (the service, once per process, :func:`detect`): the memory controller of the
   service's own cgroup (v1: its ``memory`` hierarchy; v2: the unified one, with ``memory``
   enabled for its children) where a child can be made (a probe child made and removed); the
   ``pids`` controller likewise, optional.  Where no memory cgroup can be made the service log
   says why, once, and the watchdog stays the memory bound (nothing is lost silently);
2. name: one cgroup per node, ``ma-node.<service>.<job>.<attempt>.<node>`` (:func:`node_name`;
   ``<service>`` a digest of the service's home), directly
   below the service's own cgroup in each hierarchy, so it is unique and found by its name;
3. the runner makes it (:meth:`NodeCgroup.create`) before any phase starts: ``memory`` limited to
   the node's ``memory_gb`` (swap included where the kernel counts it), ``pids`` to
   ``[limits] max_node_processes``;
4. every phase's first process moves itself in before it executes anything of the job
   (:meth:`NodeCgroup.enter`, in the child between fork and exec), so everything the node
   starts, the debug terminal's shells included, is in it; the runner itself stays outside, so
   a job's OOM never kills the runner; a child that cannot move in exits 126 (never runs
   unbounded);
5. an OOM kill in it (:meth:`NodeCgroup.oom_kills`) ends the node with the memory reason the
   watchdog gives ("the job exceeded its memory limit of N GB on <node>");
6. it is removed when the node ends (:meth:`NodeCgroup.remove`); one a crashed runner left is
   removed, once empty, by the next service's start (:func:`sweep`).

Standard library only: every node runner imports it.
"""

from __future__ import annotations

import os
import re
import time

#: every node cgroup's name starts so (rule 2; what :func:`sweep` removes)
PREFIX = "ma-node."
#: a leftover older than this, and empty, is removed by :func:`sweep` (a runner between two
#: phases holds an empty one for milliseconds only)
SWEEP_AGE = 60.0

_DETECTED: tuple[dict | None, str] | None = None


def _own_cgroups() -> dict[str, str]:
    """controller (``memory``, ``pids``, or ``""`` for v2) -> this process's cgroup path."""
    found: dict[str, str] = {}
    with open("/proc/self/cgroup") as fh:
        for line in fh:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for name in controllers.split(",") if controllers else [""]:
                found[name] = path
    return found


def _mounts() -> dict[str, tuple[str, str]]:
    """controller (as in :func:`_own_cgroups`) -> (the hierarchy's root as mounted, mount point)."""
    found: dict[str, tuple[str, str]] = {}
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            fields = line.split()
            sep = fields.index("-")
            fstype, options = fields[sep + 1], fields[sep + 3]
            root, point = fields[3], fields[4].replace("\\040", " ")
            if fstype == "cgroup2":
                found.setdefault("", (root, point))
            elif fstype == "cgroup":
                for option in options.split(","):
                    if option in ("memory", "pids"):
                        found.setdefault(option, (root, point))
    return found


def _folder(mount: tuple[str, str], path: str) -> str:
    root, point = mount
    rel = path[len(root) :] if root != "/" and path.startswith(root) else path
    return os.path.join(point, rel.lstrip("/"))


def _probe(folder: str) -> str | None:
    """None when a child cgroup can be made and removed in ``folder``, else why not."""
    probe = os.path.join(folder, f"{PREFIX}probe-{os.getpid()}")
    try:
        os.mkdir(probe)
    except FileExistsError:
        pass
    except OSError as exc:
        return f"cannot make a cgroup in {folder}: {exc.strerror or exc}"
    try:
        os.rmdir(probe)
    except OSError:
        pass
    return None


def _v2_enable(folder: str, controller: str) -> str | None:
    """v2: ``controller`` enabled for the children of ``folder`` (None), or why not."""
    try:
        with open(os.path.join(folder, "cgroup.subtree_control")) as fh:
            if controller in fh.read().split():
                return None
        with open(os.path.join(folder, "cgroup.subtree_control"), "w") as fh:
            fh.write(f"+{controller}")
        return None
    except OSError as exc:
        # most often the service's own cgroup holds processes (v2's "no internal processes")
        return f"cannot enable {controller} below {folder}: {exc.strerror or exc}"


def detect() -> tuple[dict | None, str]:
    """Rule 1, once per process: ``({"version": 1|2, "memory": folder, "pids": folder|None},
    "")`` where node cgroups can be made, else ``(None, why)``."""
    global _DETECTED
    if _DETECTED is None:
        _DETECTED = _detect()
    return _DETECTED


def _detect() -> tuple[dict | None, str]:
    try:
        own, mounts = _own_cgroups(), _mounts()
    except (OSError, ValueError) as exc:
        return None, f"cannot read this process's cgroups: {exc}"
    if "memory" in own and "memory" in mounts:
        memory = _folder(mounts["memory"], own["memory"])
        why = _probe(memory)
        if why:
            return None, why
        pids = None
        if "pids" in own and "pids" in mounts:
            candidate = _folder(mounts["pids"], own["pids"])
            pids = candidate if _probe(candidate) is None else None
        return {"version": 1, "memory": memory, "pids": pids}, ""
    if "" in own and "" in mounts:
        folder = _folder(mounts[""], own[""])
        if not os.path.exists(os.path.join(folder, "cgroup.controllers")):
            return None, "no cgroup v2 here and no v1 memory controller"
        why = _v2_enable(folder, "memory") or _probe(folder)
        if why:
            return None, why
        pids = folder if _v2_enable(folder, "pids") is None else None
        return {"version": 2, "memory": folder, "pids": pids}, ""
    return None, "no memory cgroup controller is mounted here"


def node_name(job_id: str, attempt: int | str, node: str, scope: str = "") -> str:
    """Rule 2: the node's cgroup name (only name-safe characters kept); ``scope`` tells apart
    services of one host (their job ids may repeat; a v1 ``pids`` hierarchy may be shared)."""
    return PREFIX + _safe(*([scope] if scope else []), job_id, attempt, node)


def _safe(*parts: object) -> str:
    return ".".join(re.sub(r"[^A-Za-z0-9_-]", "_", str(p)) for p in parts)


def sandbox_binds(where: dict, root: str = "/sys/fs/cgroup") -> list[tuple[str, str]]:
    """(host folder, where the sandbox shows it) of the node's own cgroup (``where``: the
    runner's instructions), under ``root`` as the kernel's hierarchies would show it there: v1
    each controller's folder at ``<root>/<controller>``, v2 the node's folder at ``root``."""
    node = NodeCgroup(where)
    if node.version == 2:
        return [(node.memory, root)]
    binds = [(node.memory, f"{root}/memory")]
    if node.pids and node.pids != node.memory:
        binds.append((node.pids, f"{root}/pids"))
    return binds


class NodeCgroup:
    """One node's cgroup (rules 3-6), from the runner's instructions ``{"version", "memory",
    "pids", "name"}``."""

    def __init__(self, where: dict):
        self.version = int(where["version"])
        self.memory = os.path.join(where["memory"], where["name"])
        self.pids = os.path.join(where["pids"], where["name"]) if where.get("pids") else None

    def folders(self) -> list[str]:
        return [self.memory] if self.pids is None or self.pids == self.memory else [self.memory, self.pids]

    def create(self, memory_bytes: int, max_processes: int) -> None:
        """Rule 3: make it (again, when a sweep removed it between two phases) with its limits;
        raises OSError when it cannot."""
        for folder in self.folders():
            os.makedirs(folder, exist_ok=True)
        if self.version == 1:
            if memory_bytes:
                _write(self.memory, "memory.limit_in_bytes", memory_bytes)
                _try_write(self.memory, "memory.memsw.limit_in_bytes", memory_bytes)  # swap too
            if self.pids and max_processes:
                _write(self.pids, "pids.max", max_processes)
        else:
            if memory_bytes:
                _write(self.memory, "memory.max", memory_bytes)
                _try_write(self.memory, "memory.swap.max", 0)
            if self.pids and max_processes:
                _write(self.pids, "pids.max", max_processes)

    def enter(self) -> None:
        """Rule 4, in the phase's child between fork and exec: move this process in; on failure
        say so on stderr and exit 126 (nothing of the job runs outside the node's bound)."""
        try:
            for folder in self.folders():
                _write(folder, "cgroup.procs", os.getpid())
        except OSError as exc:
            os.write(2, f"[ma_jupyter] cannot enter the node's cgroup: {exc}\n".encode())
            os._exit(126)

    def oom_kills(self) -> int:
        """Rule 5: processes the kernel killed here for memory so far."""
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        try:
            with open(os.path.join(self.memory, name)) as fh:
                for line in fh:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def peak_bytes(self) -> int:
        name = "memory.max_usage_in_bytes" if self.version == 1 else "memory.peak"
        try:
            with open(os.path.join(self.memory, name)) as fh:
                return int(fh.read())
        except (OSError, ValueError):
            return 0

    def pids_in(self) -> list[int]:
        try:
            with open(os.path.join(self.memory, "cgroup.procs")) as fh:
                return [int(p) for p in fh.read().split()]
        except (OSError, ValueError):
            return []

    def remove(self, wait: float = 5.0) -> bool:
        """Rule 6: remove it once its processes are gone (waiting up to ``wait`` seconds for the
        last ones to be reaped); whether it is gone."""
        deadline = time.monotonic() + wait
        while True:
            left = []
            for folder in self.folders():
                try:
                    os.rmdir(folder)
                except FileNotFoundError:
                    pass
                except OSError:
                    left.append(folder)
            if not left or time.monotonic() > deadline:
                return not left
            time.sleep(0.05)


def sweep(where: dict | None = None) -> list[str]:
    """Rule 6: remove the node cgroups left below the service's own that are empty and older than
    :data:`SWEEP_AGE` (a runner that crashed); the names removed."""
    if where is None:
        where, _ = detect()
        if where is None:
            return []
    removed = []
    for parent in {where["memory"], where.get("pids")} - {None}:
        try:
            names = [n for n in os.listdir(parent) if n.startswith(PREFIX)]
        except OSError:
            continue
        for name in names:
            folder = os.path.join(parent, name)
            try:
                if time.time() - os.stat(folder).st_mtime < SWEEP_AGE:
                    continue
                os.rmdir(folder)  # refused while it holds a process: a live node's
                removed.append(name)
            except OSError:
                continue
    return removed


def _write(folder: str, name: str, value: object) -> None:
    fd = os.open(os.path.join(folder, name), os.O_WRONLY)
    try:
        os.write(fd, str(value).encode())
    finally:
        os.close(fd)


def _try_write(folder: str, name: str, value: object) -> None:
    try:
        _write(folder, name, value)
    except OSError:
        pass  # the kernel does not count swap here (no file, or swap accounting off)
