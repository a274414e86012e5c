"""The job folder, ``<home>/jobs/<id>/``: the only module that spells its layout (the names inside
a rank folder come from :mod:`ma_jupyter.nodeside.rank_log`, which writes them; re-exported here).

::

    logs/<node>.log                 a node's stdout+stderr (written by the node, never the service)
    logs/<node>/rank-<r>.log        per-rank logs; logs/<node>/ is the node's /job/logs ($MA_RANK_LOG_DIR)
    logs/<node>/failure.json        a launcher's report of the first failed rank (job-writable)
    logs/<node>/not-distributed.json  node 0's launcher: no rank joined a process group (job-writable)
    nodes/<node>/exit_code          written atomically by the node runner when the node ends
    nodes/<node>/failure.json       the report handed over by the runner, or {"refused": "..."}
    nodes/<node>/not-distributed.json  the same hand-over for the launcher's not-distributed report
    nodes/<node>/nsswitch.conf      its /etc/nsswitch.conf in its job's own network namespace
    nodes/<node>/passwd             its /etc/passwd where it runs sshd (modes/ssh.py)
    nodes/<node>/marker             MA_NODE_RUN value of this node's processes
    nodes/<node>/run.json           the NodeRun as launched
    nodes/<node>/node-run.json      the runner's instructions
    nodes/<node>/view.json          what the node runs (its view)
    nodes/<node>/placed.json        where a remote backend runs the node (the Ray node), service side
    nodes/<node>/hosts, hostname    bound over /etc/hosts, /etc/hostname
    nodes/<node>/workdir.json       written by the node runner once the working copy is complete
    nodes/<node>/view/              in-view file roots (/job, /etc/mpi, /user/config)
    nodes/<node>/workspace/, home/, tmp/   symlink mode only
    nodes/<node>/python/            symlink mode only: the node's PYTHONPATH folder (a link to the package)
    outputs/                        the default outputs folder
    workdir/<node>/                 the node's working copy, its /workspace/algorithm (kept across attempts)
    prepared/<source>-<name>-<ver>  data preparation: a link to the copy in <home>/prepared/

A new service reads these files from jobs an older one launched (re-attach): the names are an
on-disk format (``tests/unit/test_jobdir.py`` pins them). Standard library,
:mod:`ma_jupyter.errors` and the rank folder's names from :mod:`ma_jupyter.nodeside.rank_log`
only: the node runner imports this module.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import InvalidSpec

# The names inside a node's rank folder are spelled by the program that writes them, the rank
# log splitter, which must start each rank before importing this module (see its docstring).
from .nodeside.devenv_kernel import (  # the dev environment's kernel folder, for both sides
    CHANNEL_PORTS,
    CONNECTION_FILE,
    KERNEL_FOLDER,
    KERNEL_VIEW,
    NO_IPYKERNEL_SAYS,
    SOCKET_PREFIX,
)
from .nodeside.rank_log import FAILURE_REPORT, NOT_DISTRIBUTED_REPORT, RANK_LOG_ENV, rank_log_name, rank_of

#: in-view folder of a node's per-rank logs, backed by ``logs/<node>/``
RANK_LOG_VIEW = "/job/logs"
#: a node's combined log is ``logs/<node>.log``
_LOG_SUFFIX = ".log"


def check_job_id(job_id: str) -> str:
    """``job_id`` when it names a folder directly inside a folder of job folders, else
    InvalidSpec."""
    if not job_id or "/" in job_id or job_id.startswith(".") or "\0" in job_id:
        raise InvalidSpec(f"{job_id!r} is not a job id")
    return job_id


def check_node_name(node: str) -> str:
    """``node`` when it names a file inside the job folder, else InvalidSpec (field ``node``)."""
    if not node or "/" in node or node.startswith(".") or "\0" in node:
        raise InvalidSpec(f"{node!r} is not a node name", field="node")
    return node


def _is_folder(path: Path) -> bool:
    try:
        return stat.S_ISDIR(path.lstat().st_mode)
    except OSError:
        return False


class _Folder:
    """A folder of the layout, named by its root: immutable, equal when the roots are.

    Not a dataclass: importing dataclasses costs about 8 ms, paid at each node's start (the node
    runner and the rank-log helper import this module).
    """

    __slots__ = ("root",)
    root: Path

    def __init__(self, root: Path):
        object.__setattr__(self, "root", root)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self.root == other.root

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.root))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(root={self.root!r})"


class NodeDir(_Folder):
    """``<job>/nodes/<node>``: one node's own files."""

    __slots__ = ()

    #: files removed before each attempt
    STALE = ("exit_code", FAILURE_REPORT, NOT_DISTRIBUTED_REPORT, "heartbeat", "kept.json", "stop-claim")

    @property
    def exit_code(self) -> Path:
        return self.root / "exit_code"

    @property
    def kept(self) -> Path:
        """``{"until": unix time}``: the failed node's sandbox stays for its debug terminal."""
        return self.root / "kept.json"

    @property
    def failure(self) -> Path:
        return self.root / FAILURE_REPORT

    @property
    def stop_claim(self) -> Path:
        """Who relays a stop's SIGTERM to the node's processes (``runner`` or ``backend``), made by
        the first of them (see :mod:`ma_jupyter.nodehost.stopping`)."""
        return self.root / "stop-claim"

    @property
    def not_distributed(self) -> Path:
        """``{"nodes": N}``: node 0's launcher found that no rank joined a process group."""
        return self.root / NOT_DISTRIBUTED_REPORT

    @property
    def marker(self) -> Path:
        return self.root / "marker"

    @property
    def heartbeat(self) -> Path:
        """The file whose time the node runner refreshes while it runs (its heartbeat)."""
        return self.root / "heartbeat"

    @property
    def run_record(self) -> Path:
        return self.root / "run.json"

    @property
    def runner_spec(self) -> Path:
        return self.root / "node-run.json"

    @property
    def placed(self) -> Path:
        """Where a backend that runs nodes on other machines placed this one (the Ray node)."""
        return self.root / "placed.json"

    @property
    def view_record(self) -> Path:
        return self.root / "view.json"

    @property
    def workdir_record(self) -> Path:
        """The record of a complete working copy (``{"since": ns}``), written by the node runner."""
        return self.root / "workdir.json"

    @property
    def hosts(self) -> Path:
        return self.root / "hosts"

    @property
    def hostname(self) -> Path:
        return self.root / "hostname"

    @property
    def passwd(self) -> Path:
        """Its ``/etc/passwd`` where it runs sshd (the job account's shell and home for logins)."""
        return self.root / "passwd"

    @property
    def nsswitch(self) -> Path:
        """Its ``/etc/nsswitch.conf`` where it runs in its job's own network namespace."""
        return self.root / "nsswitch.conf"

    @property
    def files(self) -> Path:
        """The in-view file roots (``/job``, ``/etc/mpi``, ``/user/config``) on the host."""
        return self.root / "view"

    @property
    def tree(self) -> Path:
        """The symlink tree standing for ``/workspace`` (symlink mode)."""
        return self.root / "workspace"

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    @property
    def python(self) -> Path:
        """The folder on the node's PYTHONPATH holding only links to the package and the node's
        ``sitecustomize`` (symlink mode)."""
        return self.root / "python"

    @property
    def kernel(self) -> Path:
        """A dev environment's kernel folder: its connection file and the kernel's ZMQ sockets,
        shown writable in the node at :data:`~ma_jupyter.nodeside.devenv_kernel.KERNEL_VIEW`."""
        return self.root / KERNEL_FOLDER


class JobDir(_Folder):
    """``<home>/jobs/<id>``: one job's folder."""

    __slots__ = ()

    @property
    def job_id(self) -> str:
        return self.root.name

    # ---------------------------------------------------------------- logs

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def node_log(self, node: str) -> Path:
        """A node's combined stdout/stderr log."""
        return self.logs / f"{node}{_LOG_SUFFIX}"

    def rank_dir(self, node: str) -> Path:
        """The host side of a node's ``/job/logs``."""
        return self.logs / node

    def rank_log(self, node: str, rank: int) -> Path:
        return self.rank_dir(node) / rank_log_name(rank)

    def log(self, node: str, rank: int | None = None) -> Path:
        """A node's log, or one of its ranks' logs."""
        return self.node_log(node) if rank is None else self.rank_log(node, rank)

    def log_relative(self, node: str, rank: int | None = None) -> str:
        """The path of a log relative to the job folder; names that could leave it are refused."""
        check_node_name(node)
        if rank is None:
            return f"logs/{node}{_LOG_SUFFIX}"
        if rank < 0:
            raise InvalidSpec("rank must be 0 or more", field="rank")
        return f"logs/{node}/{rank_log_name(rank)}"

    def node_logs(self) -> list[str]:
        """The names of the nodes with a ``logs/<node>.log``, sorted (looks only, follows nothing)."""
        if not _is_folder(self.logs):
            return []
        return sorted(p.name[: -len(_LOG_SUFFIX)] for p in self.logs.glob(f"*{_LOG_SUFFIX}"))

    def rank_logs(self, node: str) -> list[tuple[int, Path]]:
        """A node's per-rank logs as ``(rank, path)``, sorted by rank (looks only, follows nothing)."""
        folder = self.rank_dir(node)
        if not _is_folder(folder):
            return []
        found = []
        try:
            paths = list(folder.iterdir())
        except OSError:  # not readable (the job changed its mode): no rank logs to show
            return []
        for path in paths:
            rank = rank_of(path.name)
            if rank is not None:
                found.append((rank, path))
        return sorted(found)

    # ---------------------------------------------------------------- nodes

    @property
    def nodes(self) -> Path:
        return self.root / "nodes"

    def node(self, name: str) -> NodeDir:
        return NodeDir(self.nodes / name)

    def failure_relative(self, node: str) -> str:
        """The path of a node's failure report relative to the job folder."""
        return f"nodes/{node}/{FAILURE_REPORT}"

    def not_distributed_relative(self, node: str) -> str:
        """The path of a node's not-distributed report relative to the job folder."""
        return f"nodes/{node}/{NOT_DISTRIBUTED_REPORT}"

    # ---------------------------------------------------------------- data

    @property
    def outputs(self) -> Path:
        """The outputs folder of a job whose spec names none."""
        return self.root / "outputs"

    @property
    def prepared(self) -> Path:
        return self.root / "prepared"

    @property
    def workdirs(self) -> Path:
        return self.root / "workdir"

    def workdir(self, node: str) -> Path:
        """A node's working copy (shown at ``/workspace/algorithm``), kept across attempts."""
        return self.workdirs / check_node_name(node)

    def prepared_dataset(self, source: str, name: str, version: str | None) -> Path:
        """The link to the prepared copy of one dataset version (see service/prepared.py)."""
        return self.prepared / f"{source}-{name}-{version}"

    def doomed(self) -> Path:
        """A fresh sibling name the folder is moved to before it is removed."""
        return self.root.with_name(f".deleted-{self.root.name}-{os.urandom(3).hex()}")


#: the job folder shown by the dry run of a job that does not exist yet
PLACEHOLDER = JobDir(Path("<jobs>") / "<job-id>")

__all__ = [
    "CHANNEL_PORTS",
    "CONNECTION_FILE",
    "FAILURE_REPORT",
    "KERNEL_FOLDER",
    "KERNEL_VIEW",
    "NO_IPYKERNEL_SAYS",
    "NOT_DISTRIBUTED_REPORT",
    "PLACEHOLDER",
    "RANK_LOG_ENV",
    "RANK_LOG_VIEW",
    "SOCKET_PREFIX",
    "JobDir",
    "NodeDir",
    "check_node_name",
    "rank_log_name",
    "rank_of",
]
