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
  :func:`card_device_args` in :mod:`.bwrap`), its own pid, UTS and IPC
  namespaces, and no capabilities (``--cap-drop ALL``), so that even root cannot remount a
  read-only bind writable.  The network is the attempt's, not the sandbox's: every node of a
  job runs in a network namespace of its own on the attempt's switch (its runner enters it
  before starting bubblewrap, see :mod:`.network`), at its own address.
* **symlink** (bubblewrap missing, or ``MA_JUPYTER_SANDBOX=none``): a per-node tree of symlinks at
  ``<job_dir>/nodes/<node>/workspace`` mirroring the layout, ``$MA_WORKSPACE`` pointing at it, and
  every argument or variable that starts with an in-view path (``/workspace``, ``/job``...)
  rewritten to the tree.  Nothing is enforced in this mode: read-only mounts are writable, the
  hostname is the machine's, and a job that writes to ``/workspace`` literally (not through
  ``$MA_WORKSPACE``) fails.  The supervisor says so in the job's events.

This module owns the view itself: :class:`NodeView` (everything needed to run a command inside
one node, saved as ``view.json``), how it is computed from an attempt and a launch
(:func:`node_view`, :func:`launch_view`), the node's files (hosts, nsswitch) and variables
(:func:`node_env`), and the symlink mode's rewriting of in-view paths (:func:`to_host`).  All of
it is pure (nothing written, nothing started), so ``--dry-run`` shows the same mounts a launch
uses.  Its neighbours: :mod:`.bwrap` turns a view into bubblewrap argv, :mod:`.launch` plans a
node's launches and writes its files, :mod:`.workcopy` owns its working copy.

Why one module (over 600 lines): it builds a node's whole view in one pass (the issue's rule:
mounts, host policy and layout composed, not called back and forth): the bubblewrap and symlink
forms of the same layout, and the mounts they share, change together; the argv itself is
:mod:`.bwrap`'s.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import ma_jupyter

from .. import accelerators, workspace
from ..commands import expand_env
from ..errors import InvalidSpec
from ..jobdir import RANK_LOG_ENV, RANK_LOG_VIEW, JobDir, NodeDir
from ..models import JobSpec, NodeLaunch
from ..nodeside.devenv_kernel import KERNEL_VIEW
from . import caches, network
from .host_policy import HostPolicy, RunAs, load_policy
from .image import ImageEnv, resolve_image
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
from .procfs import NODE_MARKER

if TYPE_CHECKING:
    from ..modes.base import NodePlan, TaskSlot


class JobAttempt(Protocol):
    """What the node machinery reads of one attempt of a job: the backend contract's ``Attempt``
    is one (it is named here, not imported: nothing of the node machinery depends on the
    contract it serves)."""

    @property
    def job_id(self) -> str: ...

    @property
    def spec(self) -> JobSpec: ...

    @property
    def plans(self) -> tuple[NodePlan, ...]: ...

    @property
    def jobdir(self) -> JobDir: ...


#: the mount kind of a dev environment's kernel folder (its connection file and ZMQ sockets)
DEVENV_KIND = "devenv"


#: in-view folders a distributed mode may write files into
FILE_ROOTS = ("/job", "/etc/mpi", "/user/config", "/etc/ssh")


#: file roots the node may write: the Ascend launcher flips ``/user/config/jobstart_hccl.json``
#: to ``completed`` in place, so ``$RANK_TABLE_FILE`` stays ``/user/config`` (seed 000)
WRITABLE_FILE_ROOTS = ("/user/config",)


SANDBOX_ENV = "MA_JUPYTER_SANDBOX"


SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


#: this package, shown read-only in every sandbox: the modes' launchers run inside nodes as
#: ``python -m ma_jupyter.nodeside....``
PACKAGE_DIR = str(Path(ma_jupyter.__file__).resolve().parent)


#: the folder on every node's PYTHONPATH (bubblewrap): it holds a link to this package and
#: the node's ``sitecustomize`` (:data:`SITECUSTOMIZE`), nothing else, so the modes' launchers import it while a job sees nothing more of the folder
#: the package lies in (an editable install's repository: its tests/, bench/...)
HELPERS_VIEW = "/run/ma_jupyter/python"

#: the node's ``sitecustomize`` (linked as ``sitecustomize.py`` beside the package's link in the
#: helpers folder): JAX's cluster detection, then the image's own ``sitecustomize``
#: (:mod:`ma_jupyter.nodeside.node_sitecustomize`)
SITECUSTOMIZE = str(Path(PACKAGE_DIR) / "nodeside" / "node_sitecustomize.py")


#: where the working copy's original is shown (read-only) while it is copied, and only then
COPY_SOURCE_VIEW = "/run/ma_jupyter/algorithm"


#: the folder of the job's outputs holding what its nodes wrote in their working copies
KEPT_WORKDIR = "workdir"


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


def sshd_nsswitch_conf(text: str) -> str:
    """A node's ``/etc/nsswitch.conf`` (``text``: the host's or :func:`nsswitch_conf`'s) where
    it runs sshd: shadow entries from ``/etc/shadow`` only.  systemd's NSS module makes up a
    locked shadow entry for ``nobody`` (the usual job account), and sshd refuses every login of
    a locked account, keys included; the file itself the job's account cannot read."""
    lines = [line for line in text.splitlines() if not line.strip().startswith("shadow:")]
    return "\n".join([*lines, "shadow: files"]) + "\n"


def runs_sshd(view: NodeView) -> bool:
    """Whether the node runs its own sshd (its mode wrote ``/etc/ssh/ssh_config``, modes/ssh.py)."""
    return any(path.startswith("/etc/ssh/") for path in view.files)


def sshd_passwd(host: str, uid: int) -> str:
    """The ``/etc/passwd`` of a node running sshd: the host's, with the line of the node's
    account (``uid``) given the node's HOME (``/tmp``) and ``/bin/sh`` as its shell.

    sshd runs every login through the account's shell and enters its home: a job account such
    as ``nobody`` has ``/usr/sbin/nologin`` and ``/nonexistent``, which would refuse every
    command arriving over ssh.  Only the node sees this file.
    """
    lines = []
    for line in host.splitlines():
        fields = line.split(":")
        if len(fields) == 7 and fields[2] == str(uid):
            fields[5], fields[6] = "/tmp", "/bin/sh"
            line = ":".join(fields)
        lines.append(line)
    return "\n".join(lines) + "\n"


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


def export_dir(attempt: JobAttempt, plan: NodePlan) -> str:
    """The in-view folder keeping what a node wrote in its working copy: ``workdir/`` of its
    outputs, or ``workdir/<node>/`` when other nodes write to the same outputs folder."""
    base = f"{VIEW_ROOT}/outputs/{KEPT_WORKDIR}"
    sharing = sum(1 for p in attempt.plans if p.outputs_subdir == plan.outputs_subdir)
    return f"{base}/{plan.name}" if sharing > 1 else base


def node_mounts(
    attempt: JobAttempt,
    plan: NodePlan,
    sandbox: str,
    *,
    policy: HostPolicy,
    image: ImageEnv,
    workspace_mounts: list[Mount] | None = None,
    sizes: dict[str, bool] | None = None,
) -> tuple[list[Mount], list[str]]:
    """Every mount of one node, composed in one pass, and the notes saying what the dry run
    should show; pure (validates, writes nothing).  In this order:

    1. the ``/workspace`` layout's folders checked against the host policy
       (:func:`~.mounts.mounts_for`; ``workspace_mounts`` when already made for the node's
       ``(algorithm, outputs_subdir)``);
    2. the node's working copy of the algorithm folder (:func:`~.mounts.with_working_copy`,
       ``sizes`` caching the folder sizes it measures), and where what the job writes there is kept;
    3. its user's cache at ``~/.cache``;
    4. the image's folders checked against every writable mount
       (:func:`~.mounts.check_outside_writable`);
    5. the ModelArts layout beside ``/workspace`` (``--convention modelarts``; bubblewrap only);
    6. a dev environment's kernel folder (bubblewrap only).

    Raises:
        InvalidSpec: from a step above; the message says which folder and what to do.
    """
    spec, jd = attempt.spec, attempt.jobdir
    if workspace_mounts is None:
        workspace_mounts = mounts_for(
            spec, job_dir=jd.root, outputs_subdir=plan.outputs_subdir, algorithm=plan.algorithm, policy=policy
        )
    mounts, note = with_working_copy(
        workspace_mounts, job_dir=jd.root, node=plan.name, limit=policy.workdir_copy_limit, sizes=sizes
    )
    notes = [note]
    if any(m.kind == WORKDIR_KIND for m in mounts):
        notes.append(f"what the job writes in its working directory is kept in {export_dir(attempt, plan)}")
    cache = caches.cache_dir(spec.creator)
    mounts.append(Mount(str(cache), caches.CACHE_VIEW, False, CACHE_KIND, create=True))
    notes.append(f"~/.cache ({caches.CACHE_VIEW}) is {cache}: this user's cache, kept across their jobs")
    check_outside_writable(mounts, [(root, "the image folder") for root in image.roots])
    if workspace.modelarts_layout(spec):
        if sandbox != "bubblewrap":
            raise InvalidSpec(
                "the ModelArts container layout (/home/ma-user/modelarts, /cache) needs bubblewrap: "
                "install it (apt-get install bubblewrap), or submit without --convention modelarts",
                field="convention",
            )
        mounts = [*mounts, *_modelarts_mounts(mounts, jd.node(plan.name).root, spec)]
    if spec.devenv_of is not None:
        if sandbox != "bubblewrap":
            raise InvalidSpec(
                "a dev environment's kernel needs bubblewrap (its sockets are shown at "
                f"{KERNEL_VIEW}): install it (apt-get install bubblewrap)",
                field="devenv_of",
            )
        kernel = str(jd.node(plan.name).kernel)
        mounts = [*mounts, Mount(kernel, KERNEL_VIEW, False, DEVENV_KIND, create=True)]
    return mounts, notes


def node_view(
    attempt: JobAttempt,
    plan: NodePlan,
    sandbox: str,
    *,
    mounts: list[Mount] | None = None,
    image: ImageEnv | None = None,
    policy: HostPolicy | None = None,
) -> NodeView:
    """The view of one node of an attempt; pure (validates, writes nothing).

    ``mounts`` (the node's whole list, from :func:`node_mounts`), ``image`` and ``policy`` may be
    given when already resolved for this node; the view only assembles them.

    Raises:
        InvalidSpec: from :func:`node_mounts`, :func:`resolve_image`, or a plan file outside the
            allowed roots.
    """
    jd = attempt.jobdir
    files = {_check_file_path(p): content for p, content in plan.files.items()}
    policy = policy or load_policy()
    image = image or resolve_image(attempt.spec.image)
    if mounts is None:
        mounts = node_mounts(attempt, plan, sandbox, policy=policy, image=image)[0]
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


def _modelarts_mounts(mounts: list[Mount], node_dir: Path, spec: JobSpec) -> list[Mount]:
    """The ModelArts container layout (seed 000 table 2) beside ``/workspace``: the node's own
    writable ``/home/ma-user/modelarts`` (empty at the first attempt) holding the algorithm at
    ``user-job-dir/<its folder name>``, and the node's writable ``/cache``; both live in the
    node's folder of the job.  ``/dev/shm`` is every node's (see :func:`.bwrap.bwrap_argv`)."""
    extra = [Mount(str(node_dir / "modelarts"), workspace.MODELARTS_HOME, False, MODELARTS_KIND, create=True)]
    for m in mounts:
        # the algorithm folder, or the node's working copy of it (the same folder as
        # /workspace/algorithm, so both paths show what the job writes)
        original = m.source if m.kind == "algorithm" else m.copy_of if m.kind == WORKDIR_KIND else None
        if original:
            origin = workspace.origin_of(spec, original)
            extra.append(
                Mount(m.source, workspace.modelarts_code_dir(original, origin), m.read_only, "algorithm")
            )
    extra.append(
        Mount(str(node_dir / "cache"), workspace.MODELARTS_CACHE, False, MODELARTS_KIND, create=True)
    )
    return extra


def launch_view(attempt: JobAttempt, launch: NodeLaunch) -> NodeView:
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


def file_roots_used(view: NodeView) -> list[str]:
    """The in-view file roots the node needs: /job always (it holds /job/logs), others if used."""
    return [r for r in FILE_ROOTS if r == "/job" or any(p.startswith(r + "/") for p in view.files)]


def _rewrites(view: NodeView) -> dict[str, str]:
    """In-view path prefix -> host path, for the symlink mode."""
    mapping = {VIEW_ROOT: str(view.tree), RANK_LOG_VIEW: view.rank_log_dir}
    for root in file_roots_used(view):
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
    ``NCCL_SOCKET_IFNAME`` names the interface the node reaches its peers on: ``lo`` on a node
    reached over loopback, ``ma0`` on the local job network; ``NCCL_DEBUG`` is the job's.
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
        env["NCCL_SOCKET_IFNAME"] = network.SHARED_INTERFACE
    elif network.on_job_network(view.address):
        # each node a machine of its own on its attempt's job network: its one interface
        env["NCCL_SOCKET_IFNAME"] = network.NODE_INTERFACE
    return env


#: the helper that applies the node's variables (standard library only: it runs under the
#: job's interpreter)
EXEC_ENV = str(Path(PACKAGE_DIR) / "nodeside" / "exec_env.py")


def host_workdir(view: NodeView) -> str | None:
    """The working directory to start the sandbox in: None for bubblewrap (``--chdir`` does it),
    the rewritten path in the symlink mode."""
    return None if view.sandbox == "bubblewrap" else to_host(view, view.workdir)
