"""The ``/workspace`` view of one node of a job.

Every node of a job sees the platform's layout (seed 002)::

    /workspace/algorithm                                   the node's writable copy of the code, its
                                                           working directory (see :mod:`.mounts`)
    /workspace/anno_dataset/<name>/annotation              annotation sets (read-only)
    /workspace/dataset/{private,favorite}/<name>[/<ver>]   datasets (read-only unless read_only=False)
    /workspace/model/{pretrained,private,favorite}/<name>[/<ver>]   models (always read-only)
    /workspace/outputs                                     writable; batch task N: <outputs>/<name>-<N>/
    /workspace/volume/<name>                               writable storage volumes

plus the node's own ``/etc/hosts`` and ``/etc/hostname`` (every task of the job listed, so peers
resolve each other by hostname), the files its distributed mode writes (``/job/hostfile``,
``/etc/mpi/hostfile``, ``/user/config/jobstart_hccl.json``...) and a writable per-rank log folder
at ``/job/logs`` (``$MA_RANK_LOG_DIR``), and its user's persistent cache at ``~/.cache``
(:mod:`.caches`; ``XDG_CACHE_HOME`` and ``TORCH_EXTENSIONS_DIR`` point into it).

A node's first phase at its first launch fills its working copy from the algorithm folder
before its command runs (shown read-only at ``/run/ma_jupyter/algorithm`` for that phase only);
after its last phase, the node runner keeps what the job wrote there in ``workdir/`` of its
outputs (see :mod:`ma_jupyter.nodeside.workdir`); both in the node's sandbox, as the job's account.

Two ways to build that view:

* **bubblewrap** (the normal case): a minimal root made of read-only binds of the system and of
  the Python installation, fresh ``/proc``, ``/dev`` and ``/tmp`` (``/dev`` holding the device
  nodes of the node's own real cards and their driver's, nothing of other cards:
  :func:`card_device_args`), its own pid, UTS and IPC
  namespaces, and no capabilities (``--cap-drop ALL``), so that even root cannot remount a
  read-only bind writable.  The network is the attempt's, not the sandbox's: every node of a
  job runs in the job's own network namespace (its runner enters it before starting
  bubblewrap, see :mod:`.network`), where the service hands each node its own loopback address
  and ports.
* **symlink** (bubblewrap missing, or ``MA_JUPYTER_SANDBOX=none``): a per-node tree of symlinks at
  ``<job_dir>/nodes/<node>/workspace`` mirroring the layout, ``$MA_WORKSPACE`` pointing at it, and
  every argument or variable that starts with an in-view path (``/workspace``, ``/job``...)
  rewritten to the tree.  Nothing is enforced in this mode: read-only mounts are writable, the
  hostname is the machine's, and a job that writes to ``/workspace`` literally (not through
  ``$MA_WORKSPACE``) fails.  The supervisor says so in the job's events.

The functions here are pure where they can be (:func:`mounts_for`, :func:`node_view`,
:func:`bwrap_argv`, :func:`sandbox_argv`) so ``--dry-run`` can show the same mounts a launch uses;
:func:`prepare_node` is the one that writes the node's files.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import posixpath
import re
import shutil
import subprocess
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import ma_jupyter

from .. import accelerators, models, workspace
from ..commands import expand_argv, expand_env
from ..errors import InvalidSpec
from ..jobdir import RANK_LOG_ENV, RANK_LOG_VIEW, NodeDir
from ..models import NodeLaunch
from ..nodeside.exec_env import COPY_FD, ENV_FD, ENV_FILE
from ..untrusted import make_dirs, real_ancestor
from . import caches
from .host_policy import HostPolicy, RunAs, load_policy
from .image import SYSTEM_DIRS, ImageEnv, resolve_image
from .mounts import (
    CACHE_KIND,
    MODELARTS_KIND,
    VIEW_ROOT,
    WORKDIR_KIND,
    Mount,
    check_outside_writable,
    mounts_for,
    node_workdir,
    with_working_copy,
)
from .noderun import write_record
from .procfs import NODE_MARKER

if TYPE_CHECKING:  # the backend contract imports nothing from here; avoid a cycle at runtime
    from ..backends.base import Attempt
    from ..modes.base import NodePlan, TaskSlot

#: in-view folders a distributed mode may write files into
FILE_ROOTS = ("/job", "/etc/mpi", "/user/config")
#: file roots the node may write: the Ascend launcher flips ``/user/config/jobstart_hccl.json``
#: to ``completed`` in place, so ``$RANK_TABLE_FILE`` stays ``/user/config`` (seed 000)
WRITABLE_FILE_ROOTS = ("/user/config",)
SANDBOX_ENV = "MA_JUPYTER_SANDBOX"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: this package, shown read-only in every sandbox: the modes' launchers run inside nodes as
#: ``python -m ma_jupyter.nodeside....``
PACKAGE_DIR = str(Path(ma_jupyter.__file__).resolve().parent)
#: the folder on every node's PYTHONPATH (bubblewrap): it holds a link to this package and
#: nothing else, so the modes' launchers import it while a job sees nothing more of the folder
#: the package lies in (an editable install's repository: its tests/, bench/...)
HELPERS_VIEW = "/run/ma_jupyter/python"
#: the helper that makes a node's working copy and keeps what the job wrote there
WORKDIR_HELPER = str(Path(PACKAGE_DIR) / "nodeside" / "workdir.py")
#: where the working copy's original is shown (read-only) while it is copied, and only then
COPY_SOURCE_VIEW = "/run/ma_jupyter/algorithm"
#: the folder of the job's outputs holding what its nodes wrote in their working copies
KEPT_WORKDIR = "workdir"

# ---------------------------------------------------------------------------- node view


@dataclass(frozen=True)
class NodeView:
    """Everything needed to run a command inside one node's view; saved as ``view.json``.

    Attributes:
        job_id, node, hostname, address: who the node is.
        node_dir: ``<job_dir>/nodes/<node>``: its own files (hosts, plan files, exit code).
        rank_log_dir: host folder of its per-rank logs (``<job_dir>/logs/<node>``).
        mounts: the ``/workspace`` mounts.
        workdir: in-view working directory.
        image: the Python environment.
        files: in-view path -> content written before launch (the mode's hostfiles...).
        hosts: content of its ``/etc/hosts``.
        sandbox: ``bubblewrap`` or ``symlink``.
        cpus, devices: the cores and the machine's card indices of its task.
        device_nodes: the host's device nodes bound into its sandbox (its real cards' and their
            driver's control nodes, see :mod:`ma_jupyter.accelerators`); empty for emulated
            cards, a CPU task, and the symlink mode (which shows the host's whole /dev).
        run_as: the account its processes run as; None: the service's own
            (see :meth:`~ma_jupyter.nodehost.host_policy.HostPolicy.run_as`).
        export_to: in-view folder where what the job wrote in its working copy is kept after
            each attempt (None: it has no working copy).
        copy_limit: the most bytes its working copy may take.
        tmpfs_limit: the most bytes each of its memory-backed folders (``/tmp``, ``/dev/shm``,
            ``/run``) may hold: its spec's memory, which their use counts in too (see
            :mod:`.noderun` rule 1); 0: no cap.
        private_network: it runs in its job's own network namespace (:mod:`.network`), where
            no name server can be reached: its ``/etc/nsswitch.conf`` looks host names up in
            ``/etc/hosts`` only (:func:`nsswitch_conf`).
    """

    job_id: str
    node: str
    hostname: str
    address: str
    node_dir: str
    rank_log_dir: str
    mounts: tuple[Mount, ...]
    workdir: str
    image: ImageEnv
    files: dict[str, str]
    hosts: str
    sandbox: str
    cpus: tuple[int, ...] = ()
    devices: tuple[int, ...] = ()
    device_nodes: tuple[str, ...] = ()
    run_as: RunAs | None = None
    export_to: str | None = None
    copy_limit: int = 0
    tmpfs_limit: int = 0
    private_network: bool = False

    @property
    def nd(self) -> NodeDir:
        return NodeDir(Path(self.node_dir))

    @property
    def files_dir(self) -> Path:
        """Host folder holding the in-view file roots (``view/job``, ``view/etc/mpi``...)."""
        return self.nd.files

    @property
    def tree(self) -> Path:
        """The symlink tree standing in for /workspace in the symlink mode."""
        return self.nd.tree

    @property
    def working_copy(self) -> Mount | None:
        """The node's working copy (a mount of kind ``workdir``), if it has one."""
        return next((m for m in self.mounts if m.kind == WORKDIR_KIND), None)

    @property
    def cache(self) -> Mount | None:
        """The user's cache, if the node shows one."""
        return next((m for m in self.mounts if m.kind == CACHE_KIND), None)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)


def nsswitch_conf(host: str | None) -> str:
    """The ``/etc/nsswitch.conf`` of a node in a network namespace of its own: the host's (else
    an empty one) with host names looked up in ``/etc/hosts`` only.

    No name server is reachable there, and glibc answers a name service it cannot reach with a
    temporary failure (``EAI_AGAIN``) instead of the numeric address: torch's store warned "The
    hostname of the client socket cannot be retrieved" for every client, whose IPv4-mapped
    address ``/etc/hosts`` never holds.  With ``files`` alone an address it does not name reads
    as itself.
    """
    lines = [line for line in (host or "").splitlines() if not line.strip().startswith("hosts:")]
    return "\n".join([*lines, "hosts: files"]) + "\n"


def hosts_file(own: TaskSlot, tasks: list[TaskSlot] | tuple[TaskSlot, ...]) -> str:
    """A node's ``/etc/hosts``: its own name first, then localhost, then every peer.

    The own line comes first so that resolving the node's hostname gives its own address
    (launchers that key peers by hostname, like torch's c10d, need every name to resolve).
    """
    lines = [f"{own.address}\t{own.hostname}"]
    if own.address == "127.0.0.1":
        lines = [f"127.0.0.1\t{own.hostname} localhost"]
    else:
        lines.append("127.0.0.1\tlocalhost")
    lines.append("::1\tlocalhost ip6-localhost ip6-loopback")
    for task in tasks:
        if task.hostname != own.hostname:
            lines.append(f"{task.address}\t{task.hostname}")
    return "\n".join(lines) + "\n"


def _check_file_path(path: str) -> str:
    norm = posixpath.normpath(path)
    if not posixpath.isabs(path) or not any(norm == r or norm.startswith(r + "/") for r in FILE_ROOTS):
        raise InvalidSpec(f"node file {path!r} must lie under one of {', '.join(FILE_ROOTS)}")
    if norm in FILE_ROOTS or norm == RANK_LOG_VIEW or norm.startswith(RANK_LOG_VIEW + "/"):
        raise InvalidSpec(f"node file {path!r} would replace a folder of the view")
    return norm


def default_sandbox() -> str:
    """``bubblewrap`` when ``bwrap`` is on PATH and ``MA_JUPYTER_SANDBOX`` is not ``none``."""
    if os.environ.get(SANDBOX_ENV, "").lower() in ("none", "symlink"):
        return "symlink"
    return "bubblewrap" if shutil.which("bwrap") else "symlink"


def export_dir(attempt: Attempt, plan: NodePlan) -> str:
    """The in-view folder keeping what a node wrote in its working copy: ``workdir/`` of its
    outputs, or ``workdir/<node>/`` when other nodes write to the same outputs folder."""
    base = f"{VIEW_ROOT}/outputs/{KEPT_WORKDIR}"
    sharing = sum(1 for p in attempt.plans if p.outputs_subdir == plan.outputs_subdir)
    return f"{base}/{plan.name}" if sharing > 1 else base


def node_mounts(
    attempt: Attempt,
    plan: NodePlan,
    mounts: list[Mount],
    policy: HostPolicy,
    sizes: dict[str, bool] | None = None,
) -> tuple[list[Mount], list[str]]:
    """A node's mounts: the workspace ``mounts`` (from :func:`mounts_for`) with the node's
    working copy, plus its user's cache; and the notes saying so (for the dry run); pure."""
    mounts, note = with_working_copy(
        mounts, job_dir=attempt.jobdir.root, node=plan.name, limit=policy.workdir_copy_limit, sizes=sizes
    )
    notes = [note]
    if any(m.kind == WORKDIR_KIND for m in mounts):
        notes.append(f"what the job writes in its working directory is kept in {export_dir(attempt, plan)}")
    cache = caches.cache_dir(attempt.spec.creator)
    mounts.append(Mount(str(cache), caches.CACHE_VIEW, False, CACHE_KIND, create=True))
    notes.append(f"~/.cache ({caches.CACHE_VIEW}) is {cache}: this user's cache, kept across their jobs")
    return mounts, notes


def node_view(
    attempt: Attempt,
    plan: NodePlan,
    sandbox: str,
    *,
    mounts: list[Mount] | None = None,
    image: ImageEnv | None = None,
    policy: HostPolicy | None = None,
) -> NodeView:
    """The view of one node of an attempt; pure (validates, writes nothing).

    ``mounts`` (the node's whole list, see :func:`node_mounts`), ``image`` and ``policy`` may be
    given when already resolved for this node.

    Raises:
        InvalidSpec: from :func:`mounts_for`, :func:`resolve_image`, or a plan file outside the
            allowed roots.
    """
    jd = attempt.jobdir
    files = {_check_file_path(p): content for p, content in plan.files.items()}
    policy = policy or load_policy()
    if mounts is None:
        job_mounts = mounts_for(
            attempt.spec,
            job_dir=jd.root,
            outputs_subdir=plan.outputs_subdir,
            algorithm=plan.algorithm,
            policy=policy,
        )
        mounts = node_mounts(attempt, plan, job_mounts, policy)[0]
    image = image or resolve_image(attempt.spec.image)
    check_outside_writable(mounts, [(root, "the image folder") for root in image.roots])
    if workspace.modelarts_layout(attempt.spec):
        if sandbox != "bubblewrap":
            raise InvalidSpec(
                "the ModelArts container layout (/home/ma-user/modelarts, /cache) needs bubblewrap: "
                "install it (apt-get install bubblewrap), or submit without --convention modelarts",
                field="convention",
            )
        mounts = [*mounts, *_modelarts_mounts(mounts, jd.node(plan.name).root)]
    has_copy = any(m.kind == WORKDIR_KIND for m in mounts)
    return NodeView(
        job_id=attempt.job_id,
        node=plan.name,
        hostname=plan.task.hostname or plan.name,
        address=plan.task.address,
        node_dir=str(jd.node(plan.name).root),
        rank_log_dir=str(jd.rank_dir(plan.name)),
        mounts=tuple(mounts),
        workdir=node_workdir(attempt.spec, plan.algorithm),
        image=image,
        files=files,
        hosts=hosts_file(plan.task, [p.task for p in attempt.plans]),
        sandbox=sandbox,
        cpus=tuple(plan.task.cpus),
        devices=tuple(plan.task.devices),
        device_nodes=tuple(card_device_nodes(plan.task, sandbox)),
        run_as=policy.run_as(attempt.spec.creator),
        export_to=export_dir(attempt, plan) if has_copy else None,
        copy_limit=policy.workdir_copy_limit,
        tmpfs_limit=int((plan.task.memory_gb or 0) * (1 << 30)),
    )


def card_device_nodes(task: TaskSlot, sandbox: str) -> list[str]:
    """The device nodes of ``task``'s real cards and their driver that this machine shows
    (:func:`accelerators.device_paths`), for a bubblewrap sandbox; [] for emulated cards, a CPU
    task or the symlink mode.  Where the node starts on another machine (Ray), what that
    machine shows is bound there (:func:`with_machine_cards`)."""
    if not task.card_type or not task.devices or sandbox != "bubblewrap":
        return []
    return accelerators.device_paths(task.card_type, task.devices)


def with_machine_cards(launch: NodeLaunch, card_type: str, *, planned_elsewhere: bool = False) -> NodeLaunch:
    """The launch with the device nodes of its real cards (``card_type``: its task's) as the
    machine it starts on shows them, where that differs from what its plan saw: a launch planned
    by a service on another machine (the Ray backend's), or a card whose node appeared or went
    since.  The card variables the plan set from the machine's indices then become the numbers
    the node can open (a value the job set itself is kept).  Called by the backend just before
    a node starts, on the node's machine; a launch without real cards, or outside bubblewrap, is
    returned as it is, and so is one ``planned_elsewhere`` on a machine that shows no card node
    of its type at all (a Ray node whose cards are a resource without devices: emulated).

    Raises:
        InvalidSpec: a card of the launch has no device node on this machine (the node must not
            start seeing fewer cards than it holds).
    """
    if not card_type or not launch.devices or launch.isolation != "bubblewrap":
        return launch
    known = accelerators.TYPES.get(card_type)
    if known is None or accelerators.cards_turned_off():
        return launch
    if planned_elsewhere and not accelerators.has_device_nodes(card_type):
        return launch
    gone = accelerators.missing_cards(card_type, launch.devices)
    if gone:
        raise InvalidSpec(
            f"{launch.host or launch.name}: {known.vendor} card(s) {', '.join(map(str, gone))} have no device "
            f"node ({', '.join(accelerators.card_node(card_type, i) for i in gone)}) on this machine: check the driver "
            f"({known.tool}), or mark the node emulated = true in cluster.toml"
        )
    paths = accelerators.device_paths(card_type, launch.devices)
    if paths == list(launch.device_nodes):
        return launch
    planned = ",".join(map(str, accelerators.visible_indices(launch.devices, bool(launch.device_nodes))))
    visible = ",".join(str(i) for i in accelerators.visible_indices(launch.devices, sandboxed=True))
    env = dict(launch.env)
    for name in ("CUDA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES"):
        if env.get(name) == planned:
            env[name] = visible
    return launch.model_copy(update={"device_nodes": paths, "env": env})


def card_device_args(view: NodeView) -> list[str]:
    """The bubblewrap options giving the node its cards: ``--dev-bind`` of each of
    :attr:`NodeView.device_nodes` (nothing for a node without real cards)."""
    return accelerators.bwrap_args(view.device_nodes)


# ------------------------------------------------------------------------- launches


def _modelarts_mounts(mounts: list[Mount], node_dir: Path) -> list[Mount]:
    """The ModelArts container layout (seed 000 table 2) beside ``/workspace``: the node's own
    writable ``/home/ma-user/modelarts`` (empty at the first attempt) holding the algorithm at
    ``user-job-dir/<its folder name>``, and the node's writable ``/cache``; both live in the
    node's folder of the job.  ``/dev/shm`` is every node's (see :func:`bwrap_argv`)."""
    extra = [Mount(str(node_dir / "modelarts"), workspace.MODELARTS_HOME, False, MODELARTS_KIND, create=True)]
    for m in mounts:
        # the algorithm folder, or the node's working copy of it (the same folder as
        # /workspace/algorithm, so both paths show what the job writes)
        original = m.source if m.kind == "algorithm" else m.copy_of if m.kind == WORKDIR_KIND else None
        if original:
            extra.append(Mount(m.source, workspace.modelarts_code_dir(original), m.read_only, "algorithm"))
    extra.append(
        Mount(str(node_dir / "cache"), workspace.MODELARTS_CACHE, False, MODELARTS_KIND, create=True)
    )
    return extra


def node_launches(attempt: Attempt, sandbox: str) -> list[NodeLaunch]:
    """What every node of the attempt runs, resolved (the local backend's dry run); pure.

    The image and the host policy are resolved once, the mounts once per distinct
    ``(algorithm, outputs_subdir)``.  ``env`` lacks the launch-only variables (the node-run
    marker and the job's secret), so ``${VAR}`` of those expands to nothing in ``command``.

    Raises:
        InvalidSpec: from :func:`node_view`, or an unusable lifecycle command.
    """
    from ..commands import parse_command

    policy = load_policy()
    image = resolve_image(attempt.spec.image)
    lifecycle = attempt.spec.lifecycle
    hooks = {
        "on_start": parse_command(lifecycle.on_start, field="lifecycle") if lifecycle.on_start else None,
        "on_stop": parse_command(lifecycle.on_stop, field="lifecycle") if lifecycle.on_stop else None,
    }
    mounts: dict[tuple[str | None, str | None], list[Mount]] = {}
    sizes: dict[str, bool] = {}
    launches = []
    for plan in attempt.plans:
        key = (plan.algorithm, plan.outputs_subdir)
        if key not in mounts:
            mounts[key] = mounts_for(
                attempt.spec,
                job_dir=attempt.jobdir.root,
                outputs_subdir=plan.outputs_subdir,
                algorithm=plan.algorithm,
                policy=policy,
            )
        own, notes = node_mounts(attempt, plan, mounts[key], policy, sizes)
        view = node_view(attempt, plan, sandbox, mounts=own, image=image, policy=policy)
        env = node_env(view, plan.env, "", plan.job_env)
        env.pop(NODE_MARKER, None)
        launches.append(
            NodeLaunch(
                name=plan.name,
                role=plan.task.role,
                index=plan.task.index,
                primary=plan.primary,
                host=plan.task.host,
                hostname=view.hostname,
                address=view.address,
                ports=list(plan.task.ports),
                cpus=list(view.cpus),
                devices=list(view.devices),
                device_nodes=list(view.device_nodes),
                argv=list(plan.argv),
                command=command_argv(view, plan.argv, env),
                env=env,
                files=view.files,
                mounts=[models.Mount(**asdict(m)) for m in view.mounts],
                workdir=view.workdir,
                image=models.ImageInfo(
                    python=image.python, bin_dir=image.bin_dir, roots=list(image.roots), env=dict(image.env)
                ),
                isolation=sandbox,
                run_as=models.RunAs(name=view.run_as.name, uid=view.run_as.uid, gid=view.run_as.gid)
                if view.run_as
                else None,
                on_start=command_argv(view, hooks["on_start"], env) if hooks["on_start"] else None,
                on_stop=command_argv(view, hooks["on_stop"], env) if hooks["on_stop"] else None,
                notes=list(plan.notes) + notes,
            )
        )
    return launches


def launch_view(attempt: Attempt, launch: NodeLaunch) -> NodeView:
    """The view a launch runs in, made from the launch alone (and the attempt's folders and peers)."""
    jd = attempt.jobdir
    image = launch.image
    if image is None:
        raise InvalidSpec(f"the launch of {launch.name} names no image")
    tasks = [p.task for p in attempt.plans]
    own = next(t for t in tasks if t.role == launch.role and t.index == launch.index)
    plan = next(p for p in attempt.plans if p.name == launch.name)
    mounts = tuple(Mount(**m.model_dump()) for m in launch.mounts)
    return NodeView(
        job_id=attempt.job_id,
        node=launch.name,
        hostname=launch.hostname,
        address=launch.address,
        node_dir=str(jd.node(launch.name).root),
        rank_log_dir=str(jd.rank_dir(launch.name)),
        mounts=mounts,
        workdir=launch.workdir,
        image=ImageEnv(
            python=image.python, bin_dir=image.bin_dir, roots=tuple(image.roots), env=dict(image.env)
        ),
        files=dict(launch.files),
        hosts=hosts_file(own, tasks),
        sandbox=launch.isolation,
        cpus=tuple(launch.cpus),
        devices=tuple(launch.devices),
        device_nodes=tuple(launch.device_nodes),
        run_as=RunAs(uid=launch.run_as.uid, gid=launch.run_as.gid, name=launch.run_as.name)
        if launch.run_as
        else None,
        export_to=export_dir(attempt, plan) if any(m.kind == WORKDIR_KIND for m in mounts) else None,
        copy_limit=load_policy().workdir_copy_limit,
        tmpfs_limit=int((plan.task.memory_gb or 0) * (1 << 30)),
    )


def _file_roots_used(view: NodeView) -> list[str]:
    """The in-view file roots the node needs: /job always (it holds /job/logs), others if used."""
    return [r for r in FILE_ROOTS if r == "/job" or any(p.startswith(r + "/") for p in view.files)]


def prepare_node(view: NodeView) -> None:
    """Write the node's own files on the host: hosts, hostname, plan files, rank-log folder,
    outputs folders to create, ``view.json``, and (symlink mode) the symlink tree.

    Idempotent; stale results of an earlier attempt (exit code, failure report) are removed.

    Raises:
        RefusedFile: a folder to create has a symlink (or a file) on its way below the job's
            folder or the outputs folder; the launch fails with that message.
    """
    node_dir = Path(view.node_dir)
    node_dir.mkdir(parents=True, exist_ok=True)
    job_dir = node_dir.parent.parent
    owner = (view.run_as.uid, view.run_as.gid) if view.run_as is not None else None
    for stale in NodeDir.STALE:
        (node_dir / stale).unlink(missing_ok=True)
    view.nd.hosts.write_text(view.hosts)
    view.nd.hostname.write_text(view.hostname + "\n")
    if view.private_network:
        try:
            host = Path("/etc/nsswitch.conf").read_text()
        except OSError:
            host = None
        view.nd.nsswitch.write_text(nsswitch_conf(host))
    # the job writes its per-rank logs here (as its own account); a job of an earlier attempt may
    # have left anything in it, so it is made and given away without following symlinks
    make_dirs(
        Path(view.rank_log_dir), trusted=job_dir, owner=f"{view.node} of an earlier attempt", chown=owner
    )
    if view.files_dir.exists():
        shutil.rmtree(view.files_dir)
    for root in _file_roots_used(view):
        (view.files_dir / root.lstrip("/")).mkdir(parents=True, exist_ok=True)
    # the mount point of the writable rank-log folder inside the read-only /job
    (view.files_dir / RANK_LOG_VIEW.lstrip("/")).mkdir(parents=True, exist_ok=True)
    for path, content in view.files.items():
        host = view.files_dir / path.lstrip("/")
        host.parent.mkdir(parents=True, exist_ok=True)
        host.write_text(content)
    if owner is not None:  # freshly made above (the old tree removed without following links)
        for root in _file_roots_used(view):
            if root in WRITABLE_FILE_ROOTS:
                folder = view.files_dir / root.lstrip("/")
                for path in [folder, *folder.rglob("*")]:
                    os.lchown(path, *owner)
    for mount in view.mounts:
        if mount.kind == CACHE_KIND:
            caches.ensure(Path(mount.source), owner)
        elif mount.kind == WORKDIR_KIND:
            _prepare_working_copy(view, mount, job_dir, owner)
        elif mount.create:
            # A job may have planted a symlink where a task folder goes (shared outputs): create
            # it following none below the job's folder or the user's outputs folder, and give it
            # to the node's account through the folder's own descriptor.
            source = Path(mount.source)
            trusted = job_dir if source.is_relative_to(job_dir) else real_ancestor(source)
            make_dirs(source, trusted=trusted, owner="a job", chown=owner)
            if mount.target == workspace.MODELARTS_HOME:
                # the code folder's mount point: made fresh, by the service, so nothing an
                # earlier attempt left there (a symlink) decides where the bind goes
                jobs = Path(source) / "user-job-dir"
                if jobs.is_symlink() or jobs.is_file():
                    jobs.unlink()
                elif jobs.is_dir():
                    shutil.rmtree(jobs)
                jobs.mkdir(mode=0o755)
    if view.sandbox == "symlink":
        _build_tree(view)
    view.nd.view_record.write_text(view.to_json())


def working_copy_made(view: NodeView) -> bool:
    """Whether the node's working copy is complete (the runner recorded it)."""
    return view.nd.workdir_record.exists()


def _prepare_working_copy(view: NodeView, mount: Mount, job_dir: Path, owner: tuple[int, int] | None) -> None:
    """Keep a complete working copy as the earlier attempt left it; otherwise (first launch, or a
    copy that did not finish) start from an empty folder for the runner to fill.  An empty
    working folder (no algorithm) is complete as soon as it exists."""
    source = Path(mount.source)
    if working_copy_made(view):
        if source.is_dir() and not source.is_symlink():
            return
        view.nd.workdir_record.unlink()  # recorded, but gone since: made again
    if os.path.lexists(source):
        shutil.rmtree(source)  # follows no symlink
    make_dirs(source, trusted=job_dir, owner="a job", chown=owner)
    if mount.copy_of is None:
        # complete as it is: what changes in it from now on is the job's
        write_record(view.nd.workdir_record, time.time_ns())


def _build_tree(view: NodeView) -> None:
    if view.tree.exists():
        shutil.rmtree(view.tree)
    view.tree.mkdir(parents=True)
    helpers = view.nd.python
    if helpers.is_symlink() or helpers.is_file():
        helpers.unlink()
    helpers.mkdir(exist_ok=True)
    (helpers / "ma_jupyter").unlink(missing_ok=True)
    (helpers / "ma_jupyter").symlink_to(PACKAGE_DIR)
    for mount in view.mounts:
        if mount.kind == CACHE_KIND:
            home = view.nd.home
            home.mkdir(exist_ok=True)
            for link, target in [(".cache", mount.source), *caches.home_links(".", mount.source)]:
                path = home / link
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)  # an earlier attempt replaced the link with a folder
                path.unlink(missing_ok=True)
                path.symlink_to(target)
            continue
        link = view.tree / posixpath.relpath(mount.target, VIEW_ROOT)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(mount.source)


# -------------------------------------------------------------------------- env and argv


def _rewrites(view: NodeView) -> dict[str, str]:
    """In-view path prefix -> host path, for the symlink mode."""
    mapping = {VIEW_ROOT: str(view.tree), RANK_LOG_VIEW: view.rank_log_dir}
    for root in _file_roots_used(view):
        mapping[root] = str(view.files_dir / root.lstrip("/"))
    if view.cache is not None:
        mapping[caches.CACHE_VIEW] = str(view.nd.home / ".cache")
    return mapping


def to_host(view: NodeView, value: str) -> str:
    """Symlink mode: rewrite in-view paths inside ``value`` (at its start or after ``=``, ``:``
    or ``,``) to the host paths standing in for them; bubblewrap mode: ``value`` unchanged."""
    if view.sandbox != "symlink":
        return value
    mapping = _rewrites(view)
    roots = sorted(mapping, key=len, reverse=True)
    pattern = re.compile(r"(^|[=:,])(" + "|".join(re.escape(r) for r in roots) + r")(?=/|$|[:,])")
    return pattern.sub(lambda m: m.group(1) + mapping[m.group(2)], value)


def node_env(
    view: NodeView, plan_env: dict[str, str], marker: str, job_env: tuple[str, ...] = ()
) -> dict[str, str]:
    """The node's complete environment (the host's is not inherited).

    Layers, later ones winning: a clean base (PATH with the image's bin first, HOME=/tmp, LANG,
    PYTHONUNBUFFERED=1 so prints reach the log at once, and the user's cache as
    ``XDG_CACHE_HOME`` with ``TORCH_EXTENSIONS_DIR`` in it, one folder per image), the image's
    activation variables, card visibility from the task's devices, the plan's variables (mode +
    job env), then what the platform guarantees: ``MA_WORKSPACE``, ``MA_RANK_LOG_DIR``,
    ``HOSTNAME`` and the node-run marker used to find every process of the node again.

    The job's own variables (``job_env``, the names in ``plan_env`` that are the job's ``--env``)
    are expanded like the command (:func:`ma_jupyter.commands.expand_env`): a value may name any
    variable of the layers above but the marker, and the job's variables given before it.
    """
    env = {
        "PATH": f"{view.image.bin_dir}:{SYSTEM_PATH}",
        "HOME": "/tmp",
        # a login's shell: Open MPI's remote start asks for it (a warning on every MPI job without)
        "SHELL": "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
        "TMPDIR": "/tmp",
    }
    if view.sandbox == "symlink":  # set before the job's variables may refer to them
        env["HOME"] = str(Path(view.node_dir) / "home")
        env["TMPDIR"] = str(Path(view.node_dir) / "tmp")
    if view.cache is not None:
        env["XDG_CACHE_HOME"] = caches.CACHE_VIEW
        # extensions built against one image's torch must never load in another's
        image_key = hashlib.sha256(view.image.python.encode()).hexdigest()[:12]
        env["TORCH_EXTENSIONS_DIR"] = f"{caches.CACHE_VIEW}/torch_extensions/{image_key}"
        # compiled kernels kept across the user's jobs: CUDA's own (keyed by the driver inside),
        # Triton's and torch inductor's (keyed by the image, like the extensions above)
        env["CUDA_CACHE_PATH"] = f"{caches.CACHE_VIEW}/nv/ComputeCache"
        env["TRITON_CACHE_DIR"] = f"{caches.CACHE_VIEW}/triton/{image_key}"
        env["TORCHINDUCTOR_CACHE_DIR"] = f"{caches.CACHE_VIEW}/torchinductor/{image_key}"
    env.update(view.image.env)
    env.update(card_env(view))
    guaranteed = {"MA_WORKSPACE": VIEW_ROOT, RANK_LOG_ENV: RANK_LOG_VIEW, "HOSTNAME": view.hostname}
    own = {k: plan_env[k] for k in job_env if k in plan_env}
    platform = {**env, **{k: v for k, v in plan_env.items() if k not in own}, **guaranteed}
    expanded = expand_env(own, platform)
    plan_env = {k: expanded.get(k, v) for k, v in plan_env.items()}
    env.update(plan_env)
    helpers = str(view.nd.python) if view.sandbox == "symlink" else HELPERS_VIEW
    # the job's own PYTHONPATH first: its modules win over ours
    env["PYTHONPATH"] = ":".join(p for p in (plan_env.get("PYTHONPATH", ""), helpers) if p)
    env.update({**guaranteed, NODE_MARKER: marker})
    if view.sandbox == "symlink":
        env = {k: to_host(view, v) for k, v in env.items()}
        env["HOME"] = str(Path(view.node_dir) / "home")
        env["TMPDIR"] = str(Path(view.node_dir) / "tmp")
    return env


def card_env(view: NodeView) -> dict[str, str]:
    """The card variables of a node with cards (none without).

    ``CUDA_VISIBLE_DEVICES`` / ``ASCEND_RT_VISIBLE_DEVICES`` hold the card numbers the node's
    processes can open (:func:`accelerators.visible_indices`): in a bubblewrap sandbox showing
    only the node's real cards, CUDA numbers them 0..k-1, so the machine's indices would name
    cards that do not exist there; emulated cards and the symlink mode keep the machine's.
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` makes CUDA's numbering nvidia-smi's order.
    ``ASCEND_VISIBLE_DEVICES`` keeps the machine's indices (the Ascend container runtime's
    meaning), as does ``MA_CARD_INDICES``, for logs and for tools that ask NVML about the card.
    ``NCCL_SOCKET_IFNAME=lo`` on a node reached over loopback; ``NCCL_DEBUG`` is the job's.
    A job's own ``--env`` wins over each of them.
    """
    if not view.devices:
        return {}
    sandboxed = bool(view.device_nodes) and view.sandbox == "bubblewrap"
    visible = ",".join(str(i) for i in accelerators.visible_indices(view.devices, sandboxed))
    machine = ",".join(str(d) for d in view.devices)
    env = {
        "CUDA_VISIBLE_DEVICES": visible,
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "ASCEND_RT_VISIBLE_DEVICES": visible,
        "ASCEND_VISIBLE_DEVICES": machine,
        "MA_CARD_INDICES": machine,
    }
    if view.address.startswith("127.") or view.address == "::1":
        # simulated nodes talk over loopback aliases: NCCL would look for a network interface
        # and, on a machine whose only other one is down or firewalled, hang at its first call
        env["NCCL_SOCKET_IFNAME"] = "lo"
    return env


def command_argv(view: NodeView, argv: list[str], env: dict[str, str]) -> list[str]:
    """The command as the node runs it: ``${VAR}`` expanded from the node's env, ``python``/
    ``python3`` replaced by the image's interpreter, in-view paths rewritten (symlink mode)."""
    command = expand_argv(list(argv), env)
    if command and command[0] in ("python", "python3"):
        command[0] = view.image.python
    return [to_host(view, a) for a in command]


def compile_node_helpers() -> None:
    """Write the compiled modules of what a node runs from this package (its ``__init__`` and
    ``nodeside/``) next to their sources, where they are missing or older than the sources.

    Inside a sandbox the package is read-only, so no interpreter there can write them: where they
    were never written (a source tree run with ``PYTHONDONTWRITEBYTECODE``, which container
    images often set) every rank's log splitter compiled them again, about 10 ms of each rank's
    start.  A package folder this account cannot write is left as it is (an installed package
    has them from its installation); they serve the nodes whose interpreter is this one's
    version (another version compiles its own, as before).
    """
    import compileall

    package = Path(PACKAGE_DIR)
    try:
        compileall.compile_file(str(package / "__init__.py"), quiet=2)
        compileall.compile_dir(str(package / "nodeside"), maxlevels=0, quiet=2)
    except OSError:
        pass


def _host_program(name: str) -> str:
    """The absolute path of a system program the platform runs (never looked up on a job's PATH)."""
    found = shutil.which(name, path=SYSTEM_PATH)
    if not found:
        raise InvalidSpec(f"{name} is not installed on this machine (looked in {SYSTEM_PATH})")
    return found


#: the helper that applies the node's variables (standard library only: it runs under the
#: job's interpreter)
EXEC_ENV = str(Path(PACKAGE_DIR) / "nodeside" / "exec_env.py")


def enter_env_argv(view: NodeView, command: list[str], *, copy: bool = False) -> list[str]:
    """The command that, inside the sandbox, switches to the node's account and then (and only
    then) applies the job's environment: ``setpriv`` (as root only), then
    :mod:`ma_jupyter.nodeside.exec_env` reading :data:`ENV_FILE`; with ``copy``, exec_env first
    fills the node's working copy from :data:`COPY_SOURCE_VIEW` and reports its end on the
    descriptor the runner puts in place of :data:`COPY_FD`.

    The job's variables never reach a program running with privileges (``LD_PRELOAD`` or a
    ``PATH`` of the job's apply to the job's own command, after the switch), and never stand on
    a command line, which every user of the host can read.
    """
    fill: list[str] = []
    if copy:
        mount = view.working_copy
        assert mount is not None
        fill = ["--copy", COPY_SOURCE_VIEW, mount.target, str(view.copy_limit), COPY_FD]
    return _enter_argv(view.run_as, view.image.python, command, fill)


def _enter_argv(
    run_as: RunAs | None, python: str, command: list[str], fill: list[str] | None = None
) -> list[str]:
    """``setpriv`` to ``run_as`` (none: no switch), then ``exec_env`` under ``python`` applying
    :data:`ENV_FILE`, then ``command`` (see :func:`enter_env_argv`)."""
    prefix: list[str] = []
    if run_as is not None:
        prefix = [
            _host_program("setpriv"),
            f"--reuid={run_as.uid}",
            f"--regid={run_as.gid}",
            "--clear-groups",
            "--inh-caps=-all",
            "--",
        ]
    return prefix + [python, "-I", "-S", EXEC_ENV, ENV_FILE, *(fill or []), "--", *command]


def bwrap_argv(
    view: NodeView,
    command: list[str],
    *,
    pid_namespace: bool = True,
    copy: bool = False,
) -> list[str]:
    """The bubblewrap argv running ``command`` in the node's view, with the variables the runner
    hands over through :data:`ENV_FD`.

    A minimal root (never ``--dev-bind / /``): the system folders, ``/etc`` entry by entry (so
    the node's own hosts, hostname and ``/etc/mpi`` can take their places) and the image's
    installation, all read-only; fresh /proc, /dev, /tmp; the workspace mounts; the node's file
    roots read-only (but ``/user/config``) and its rank-log folder writable at ``/job/logs``.  ``--cap-drop ALL`` keeps
    root from remounting read-only binds; ``--unshare-pid`` + ``--die-with-parent`` make the
    node's processes die together when bwrap is killed, whatever sessions they made.
    ``--clearenv`` plus :func:`enter_env_argv`: bubblewrap runs with the caller's fixed
    environment, and the job's own variables apply only after the switch to its account.

    Args:
        view: the node.
        command: argv to run inside (already expanded, see :func:`command_argv`).
        env: the node's environment (:func:`node_env`); None: none but a system PATH.
        pid_namespace: False to share the host's pid namespace (e.g. a helper that must see
            processes outside).
        copy: the node's first phase at its first launch: it fills the working copy before
            the command runs (:func:`enter_env_argv`), the original shown read-only at
            :data:`COPY_SOURCE_VIEW` for this phase only.
    """
    args = [_host_program("bwrap"), "--die-with-parent", "--new-session", "--unshare-uts", "--unshare-ipc"]
    if pid_namespace:
        args.append("--unshare-pid")
    args += ["--hostname", view.hostname]
    args += _system_args(view.tmpfs_limit)
    args += card_device_args(view)
    args += _etc_args(view)
    args += _python_args(view.image.roots) + _helpers_args(view)
    args += ["--perms", "0755", "--dir", VIEW_ROOT]
    for mount in view.mounts:
        if not mount.target.startswith("/tmp/"):  # /tmp is there already (its tmpfs)
            args += _parents(mount.target)
        args += ["--ro-bind" if mount.read_only else "--bind", mount.source, mount.target]
    for root in _file_roots_used(view):
        if root.startswith("/etc/"):
            continue  # bound together with /etc, see _etc_args
        bind = "--bind" if root in WRITABLE_FILE_ROOTS else "--ro-bind"
        args += _parents(root) + [bind, str(view.files_dir / root.lstrip("/")), root]
    args += ["--bind", view.rank_log_dir, RANK_LOG_VIEW]
    args += _env_file_args()
    if copy and view.working_copy is not None and view.working_copy.copy_of:
        args += ["--ro-bind", view.working_copy.copy_of, COPY_SOURCE_VIEW]
    args += ["--remount-ro", "/etc", "--chdir", view.workdir, "--clearenv", "--setenv", "PATH", SYSTEM_PATH]
    args += _capability_args(view.run_as)
    return args + ["--"] + enter_env_argv(view, list(command), copy=copy)


def _system_args(tmpfs_limit: int = 0) -> list[str]:
    """The system folders read-only, fresh ``/proc`` and ``/dev``, and empty ``/tmp``, ``/run``
    and ``/dev/shm`` (each at most ``tmpfs_limit`` bytes when it is positive): the base of every
    sandbox."""
    args: list[str] = []
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    # /tmp is every account's (HOME=/tmp): sticky and world-writable, like a host's /tmp
    args += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777"]
    args += [*_tmpfs(tmpfs_limit, "/tmp"), *_tmpfs(tmpfs_limit, "/run")]
    # shared memory every account may use (PyTorch's data loaders; seed 000 lists /dev/shm)
    args += ["--perms", "1777", *_tmpfs(tmpfs_limit, "/dev/shm")]
    return args


log = logging.getLogger(__name__)
_TMPFS_SIZE_LOCK = threading.Lock()
_TMPFS_SIZE_OK: bool | None = None


def tmpfs_size_works(bwrap: str | None = None) -> bool:
    """Whether bubblewrap caps a tmpfs here (``--size``: bubblewrap 0.7 and later, and refused
    by a setuid install), tried once per process with a real 4 KiB tmpfs (``bwrap`` names
    another program than the machine's, for a test: then nothing is remembered).  When it cannot,
    the service log says so once and the memory-backed folders stay uncapped: the node's memory
    watchdog still counts what they hold, but one of them may take up to half the host's memory
    before a sample sees it."""
    global _TMPFS_SIZE_OK
    with _TMPFS_SIZE_LOCK:
        if _TMPFS_SIZE_OK is not None and bwrap is None:
            return _TMPFS_SIZE_OK
        argv = [bwrap or _host_program("bwrap"), "--ro-bind", "/", "/", "--size", "4096", "--tmpfs", "/tmp"]
        argv += ["--", "true"]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=20)
            works = done.returncode == 0
            why = done.stderr.strip()[:300] or f"exit code {done.returncode}"
        except (OSError, subprocess.SubprocessError) as exc:
            works, why = False, str(exc)
        if not works:
            log.warning(
                "bubblewrap cannot cap a tmpfs here (--size needs bubblewrap 0.7 or later, not "
                "installed setuid: %s): the nodes' /tmp, /run and /dev/shm are uncapped, their use "
                "still counts in each node's memory",
                why,
            )
        if bwrap is None:
            _TMPFS_SIZE_OK = works
        return works


def _tmpfs(limit: int, path: str) -> list[str]:
    """A memory-backed folder no larger than ``limit`` bytes (a node's memory,
    :attr:`NodeView.tmpfs_limit`, where its use counts too): without a cap each would take up to
    half the host's memory, outside the node's limit.  Uncapped where bubblewrap cannot cap it
    (:func:`tmpfs_size_works`)."""
    size = ["--size", str(limit)] if limit > 0 and tmpfs_size_works() else []
    return [*size, "--tmpfs", path]


def _python_args(roots: tuple[str, ...] | list[str]) -> list[str]:
    """The Python installation's folders ``roots`` and this package, read-only."""
    args: list[str] = []
    for root in roots:
        args += _parents(root) + ["--ro-bind", root, root]
    if not any(PACKAGE_DIR == r or PACKAGE_DIR.startswith(r + "/") for r in roots):
        args += _parents(PACKAGE_DIR) + ["--ro-bind", PACKAGE_DIR, PACKAGE_DIR]
    return args


def _helpers_args(view: NodeView) -> list[str]:
    """:data:`HELPERS_VIEW` holding a link to this package, and (with the user's cache) the links
    of the folders frameworks keep in HOME to theirs in the cache (:func:`.caches.home_links`)."""
    args = _parents(HELPERS_VIEW) + ["--perms", "0755", "--dir", HELPERS_VIEW]
    args += ["--symlink", PACKAGE_DIR, f"{HELPERS_VIEW}/ma_jupyter"]
    if view.cache is not None:
        home = posixpath.dirname(caches.CACHE_VIEW)
        for link, target in caches.home_links(home, caches.CACHE_VIEW):
            args += ["--symlink", posixpath.relpath(target, home), link]
    return args


def _env_file_args() -> list[str]:
    """:data:`ENV_FILE`, read-only, from the descriptor the runner puts in place of :data:`ENV_FD`."""
    folder = ["--perms", "0755", "--dir", posixpath.dirname(ENV_FILE)]
    return folder + ["--perms", "0444", "--ro-bind-data", ENV_FD, ENV_FILE]


def _capability_args(run_as: RunAs | None) -> list[str]:
    """No capability survives, but the two setpriv needs to switch to ``run_as``."""
    args = ["--cap-drop", "ALL"]
    if run_as is not None:
        args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    return args


def _parents(target: str) -> list[str]:
    """``--perms 0755 --dir`` for each ancestor of ``target`` (bwrap would make them 0700)."""
    out: list[str] = []
    parts = target.strip("/").split("/")[:-1]
    for i in range(1, len(parts) + 1):
        out += ["--perms", "0755", "--dir", "/" + "/".join(parts[:i])]
    return out


def _etc_args(view: NodeView) -> list[str]:
    """/etc as a tmpfs holding the host's entries read-only, except the ones the node owns."""
    own_files = {"hosts": view.nd.hosts, "hostname": view.nd.hostname}
    if view.private_network:
        own_files["nsswitch.conf"] = view.nd.nsswitch
    owned = set(own_files) | {r.split("/")[2] for r in _file_roots_used(view) if r.startswith("/etc/")}
    if all(os.path.isfile(f"/etc/{name}") and not os.path.islink(f"/etc/{name}") for name in owned):
        # Every entry the node owns already exists as a file on the host: bind /etc whole and lay the
        # node's files over them (binding over an existing file creates nothing on the host, and one
        # bind instead of one per entry makes the sandbox start much faster).
        args = ["--ro-bind", "/etc", "/etc"]
        for name, path in own_files.items():
            args += ["--ro-bind", str(path), f"/etc/{name}"]
        for root in _file_roots_used(view):
            if root.startswith("/etc/"):
                args += ["--ro-bind", str(view.files_dir / root.lstrip("/")), root]
        return args
    args = ["--perms", "0755", "--tmpfs", "/etc"]
    try:
        entries = sorted(os.listdir("/etc"))
    except OSError:
        entries = []
    for name in entries:
        if name in owned:
            continue
        path = f"/etc/{name}"
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.exists(path):
            args += ["--ro-bind", path, path]
    for name, path in own_files.items():
        args += ["--ro-bind", str(path), f"/etc/{name}"]
    for root in _file_roots_used(view):
        if root.startswith("/etc/"):
            args += ["--ro-bind", str(view.files_dir / root.lstrip("/")), root]
    return args


def sandbox_argv(
    view: NodeView, command: list[str], *, pid_namespace: bool = True, copy: bool = False
) -> list[str]:
    """``command`` wrapped to run in the node's view: bubblewrap (the runner hands the node's
    variables over through :data:`ENV_FD`; ``copy``: see :func:`bwrap_argv`), or as is in the
    symlink mode (where the command's paths were already rewritten by :func:`command_argv`, the
    runner applies the variables to the command alone, and copies the working copy itself)."""
    if view.sandbox == "bubblewrap":
        return bwrap_argv(view, command, pid_namespace=pid_namespace, copy=copy)
    return list(command)


#: a reader's argv holds this argument where the runner puts the descriptor of the folder the
#: reader is shown (:func:`reader_argv`)
SHOWN_FD = "{shown-fd}"


def reader_argv(image: ImageEnv, run_as: RunAs | None, shown: str, command: list[str]) -> list[str]:
    """The bubblewrap argv running ``command``, a program of the platform's own that reads one
    folder of a job's for the service (its TensorBoard over the outputs), as ``run_as``.

    The same minimal root as a node's (:func:`bwrap_argv`): the system folders, ``/etc``, the
    image (``image``: the interpreter that runs ``command``) and this package, all read-only;
    fresh ``/proc``, ``/dev`` and ``/tmp``; its own pid, UTS and IPC namespaces; no capability
    but the two ``setpriv`` needs; the variables from :data:`ENV_FD` applied after the switch
    (:func:`enter_env_argv`).  Then the folder, read-only at ``shown``, bound from the
    descriptor the caller puts in place of :data:`SHOWN_FD` (the folder it opened and checked,
    never a path resolved again), and nothing else: no job folder, no service home, nothing
    writable but its ``/tmp``.  The network is the caller's (the service's, whose proxy reaches
    the program on loopback).

    ``--die-with-parent``: it ends with the *thread* that started bwrap (a parent-death signal
    follows the thread, not the process), so the caller starts it from one that lives as long as
    the reader should.  No ``--new-session``: the reader stays in the process group the caller
    made, so one ``killpg`` ends all of it (its stdin is not a terminal, so a new session keeps
    nothing from it).
    """
    args = [_host_program("bwrap"), "--die-with-parent", "--unshare-uts", "--unshare-ipc", "--unshare-pid"]
    args += ["--hostname", "reader"]
    args += _system_args()
    args += ["--ro-bind", "/etc", "/etc"]
    args += _python_args(image.roots)
    args += _parents(shown) + ["--ro-bind-fd", SHOWN_FD, shown]
    args += _env_file_args()
    args += ["--chdir", "/", "--clearenv", "--setenv", "PATH", SYSTEM_PATH]
    args += _capability_args(run_as)
    return args + ["--"] + _enter_argv(run_as, image.python, list(command))


def unsandboxed_reader_argv(command: list[str]) -> list[str]:
    """The symlink mode's :func:`reader_argv`: ``command`` as it is, on the host, ending with
    the thread that started it as bubblewrap's ``--die-with-parent`` would make it."""
    return [_host_program("setpriv"), "--pdeathsig", "KILL", "--", *command]


def copy_needed(view: NodeView) -> bool:
    """Whether the node's working copy must be filled before its first phase (its first launch,
    or a copy that did not finish)."""
    mount = view.working_copy
    return mount is not None and mount.copy_of is not None and not working_copy_made(view)


def copy_args(view: NodeView) -> list[str]:
    """Symlink mode: ``[original, working copy, limit]`` for the node runner, which copies itself
    (it runs as the job's account there: the service's own)."""
    mount = view.working_copy
    assert mount is not None and mount.copy_of is not None
    return [mount.copy_of, mount.source, str(view.copy_limit)]


def export_argv(view: NodeView) -> list[str] | None:
    """The phase that keeps what the job wrote in its working copy in :attr:`NodeView.export_to`
    (run by the node runner after the node's last phase, in its sandbox); the runner appends the
    time the copy was complete.  None without a working copy."""
    mount = view.working_copy
    if mount is None or view.export_to is None:
        return None
    helper = [view.image.python, "-I", "-S", WORKDIR_HELPER, "export", mount.target, view.export_to]
    if view.sandbox == "bubblewrap":
        return bwrap_argv(view, helper)
    return [to_host(view, a) for a in helper[:-2]] + [mount.source, to_host(view, view.export_to)]


def host_workdir(view: NodeView) -> str | None:
    """The working directory to start the sandbox in: None for bubblewrap (``--chdir`` does it),
    the rewritten path in the symlink mode."""
    return None if view.sandbox == "bubblewrap" else to_host(view, view.workdir)
