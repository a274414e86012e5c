"""The mounts of a node's view: each folder of the ``/workspace`` layout
(:mod:`ma_jupyter.workspace`) with its host path checked and resolved (pure: it only reads paths).

Besides the user's folders, every node of the local backend gets two folders of the platform's:

* its **working copy** at ``/workspace/algorithm`` (kind ``workdir``, the working directory): a
  writable copy of the algorithm folder made at the node's first launch and kept across its
  attempts (``<job>/workdir/<node>``), so code that writes next to itself (``torch.save("m.pt")``,
  ``./runs``, ``lightning_logs/``) works and the user's folder is never written.  An empty one
  when the job has no algorithm.  Not made when the user mounts the folder writable
  (``algorithm_read_only=False``: it is then shown itself), nor when the folder holds more than
  the admin's limit (``[mounts] workdir_copy_mb``, default 512): the folder itself is then shown
  read-only, as the dry run says;
* the user's **cache** at ``~/.cache`` (kind ``cache``, see :mod:`.caches`).
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from .. import config
from ..errors import FolderRefused, InvalidSpec
from ..foldersize import folder_size
from ..jobdir import PLACEHOLDER, JobDir
from ..models import JobSpec, is_object_uri
from ..workspace import VIEW_ROOT, check_subfolder, folders, modelarts_layout, target, workdir_for
from .host_policy import HostPolicy, _inside, load_policy

__all__ = [
    "ALGORITHM_VIEW",
    "CACHE_KIND",
    "VIEW_ROOT",
    "MODELARTS_KIND",
    "WORKDIR_KIND",
    "Mount",
    "check_outside_writable",
    "mounts_for",
    "node_workdir",
    "path_hint",
    "with_working_copy",
]

#: the working directory of every node unless the spec names one
ALGORITHM_VIEW = target("algorithm")
#: kinds of the platform's own folders in a node's view
WORKDIR_KIND = "workdir"
CACHE_KIND = "cache"
#: the ModelArts container layout's own folders (``/home/ma-user/modelarts``, ``/cache``)
MODELARTS_KIND = "modelarts"


@dataclass(frozen=True)
class Mount:
    """One folder of the view.

    Attributes:
        source: the host path (symlinks resolved).
        target: where it appears: below ``/workspace``, except the user's cache (``~/.cache``)
            and (the ModelArts layout, added by :func:`.view.node_view`)
            ``/home/ma-user/modelarts`` and ``/cache``.
        read_only: whether the node can write to it (enforced by bubblewrap only).
        kind: ``algorithm``, ``dataset``, ``annotation``, ``model``, ``outputs``, ``volume``, or
            the platform's ``workdir`` (the node's working copy), ``cache`` (the user's) and
            ``modelarts`` (the ModelArts layout's folders).
        create: the backend creates ``source`` at launch (an outputs folder of a batch task, the
            job's own outputs folder when the spec names none, a working copy, a cache).
        copy_of: a working copy's original: the host folder copied into ``source`` before the
            node's first phase (None: an empty working folder).
    """

    source: str
    target: str
    read_only: bool
    kind: str
    create: bool = False
    copy_of: str | None = None


def _host_path(raw: str, what: str, field_name: str, *, directory: bool) -> str:
    """``raw`` as an existing absolute host path with symlinks resolved, or InvalidSpec."""
    if not raw or not os.path.isabs(raw):
        raise InvalidSpec(
            f"{what}: {raw!r} is not an absolute path; give the full host path (e.g. /data/{what.split()[0]})",
            field=field_name,
        )
    try:
        resolved = Path(raw).resolve(strict=True)
    except (OSError, RuntimeError):
        raise InvalidSpec(
            f"{what}: the host path {raw} does not exist; create it (mkdir -p {raw}) or fix the path",
            field=field_name,
        ) from None
    if directory and not resolved.is_dir():
        raise InvalidSpec(f"{what}: {raw} is not a folder; give a folder", field=field_name)
    return str(resolved)


def _writable_path(raw: str, what: str, field_name: str) -> tuple[str, bool]:
    """A writable folder (outputs, a volume) resolved, and whether the platform must create it:
    one that does not exist yet is made for the job (owned by its account) when its parent exists."""
    if raw and os.path.isabs(raw) and not os.path.lexists(raw):
        missing: list[str] = []
        existing = posixpath.normpath(raw)
        while not os.path.lexists(existing):
            existing, name = posixpath.split(existing)
            if name in ("", ".", ".."):
                raise InvalidSpec(f"{what}: {raw} is not a folder name", field=field_name)
            missing.insert(0, name)
        parent = _host_path(existing, what, field_name, directory=True)
        return os.path.join(parent, *missing), True
    return _host_path(raw, what, field_name, directory=True), False


def mounts_for(
    spec: JobSpec,
    *,
    job_dir: Path | None = None,
    outputs_subdir: str | None = None,
    algorithm: str | None = None,
    policy: HostPolicy | None = None,
) -> list[Mount]:
    """The mounts of a node's ``/workspace``, validated; a pure function (it only reads paths).

    Args:
        spec: the job.
        job_dir: the job's folder; when the spec names no outputs folder, ``<job_dir>/outputs``
            is used (and shown as ``<jobs>/<id>/outputs`` when no job exists yet, e.g. dry-run).
        outputs_subdir: for a batch task, the subfolder of the outputs folder it writes into
            (``<name>-<N>``), which the backend creates.
        algorithm: a batch task's own algorithm folder instead of ``spec.algorithm``.
        policy: the admin's host rules (default: :func:`~ma_jupyter.nodehost.host_policy.load_policy`);
            every source must pass :meth:`~ma_jupyter.nodehost.host_policy.HostPolicy.check_source`
            and every writable one must be writable by the account the job runs as.

    Returns:
        The mounts in bind order (parents before children).

    Raises:
        InvalidSpec: a host path is relative or missing (the message names it and says to
            create it), a folder is a file, a target would leave ``/workspace``, two mounts
            overlap (a dataset mounted with and without a version), a source is one no job may
            mount, or a writable one is not writable by the job's account.
    """
    policy = policy or load_policy()
    user = spec.creator
    run_as = policy.run_as(user)
    mounts: list[Mount] = []

    # Data preparation's copies: the job's folder links each dataset to its copy in the shared
    # store.  Only a path the platform put there (given inside the job's folder, resolving into
    # the store) skips the rules; the supervisor checked them on the original source.  A path
    # naming the store directly is checked like any other (and refused: it is in the home).
    prepared = str(JobDir(Path(job_dir)).prepared) if job_dir is not None else None
    store = os.path.realpath(config.prepared_root())

    def platform_copy(raw: str, source: str) -> bool:
        if prepared is None or not _inside(os.path.normpath(raw), prepared):
            return False
        return _inside(source, os.path.realpath(prepared)) or _inside(source, store)

    def checked(raw: str, what: str, field_name: str, *, directory: bool, writable: bool = False) -> str:
        source = _host_path(raw, what, field_name, directory=directory)
        if not platform_copy(raw, source):
            snapshot_ok = field_name == "algorithm" and not writable
            policy.check_source(source, what, field_name, user, snapshot_ok=snapshot_ok)
        if writable:
            policy.check_writable(source, run_as, what, field_name)
        return source

    for folder in folders(spec, algorithm=algorithm):
        if folder.kind != "outputs" and is_object_uri(folder.path):
            # object storage: downloaded into the prepared store before the launch, which then
            # names the job folder's link to it; only a dry run (no job folder yet) shows the URI
            if job_dir is not None and Path(job_dir) != PLACEHOLDER.root:
                raise InvalidSpec(
                    f"{folder.what}: {folder.path} was not downloaded before the launch; submit again",
                    field=folder.field,
                )
            mounts.append(Mount(str(folder.path), folder.target, True, folder.kind))
            continue
        if folder.kind == "outputs":
            if folder.path and not is_object_uri(folder.path):
                source, create = _writable_path(folder.path, "outputs", "outputs")
                policy.check_source(source, "outputs", "outputs", user)
                policy.check_writable(source, run_as, "outputs", "outputs")
            else:
                jd = JobDir(Path(job_dir)) if job_dir is not None else PLACEHOLDER
                source, create = str(jd.outputs), True
            if outputs_subdir is not None:
                source, create = str(Path(source) / check_subfolder(outputs_subdir)), True
        elif folder.kind == "volume":
            assert folder.path is not None
            source, create = _writable_path(folder.path, folder.what, folder.field)
            policy.check_source(source, folder.what, folder.field, user)
            policy.check_writable(source, run_as, folder.what, folder.field)
        else:
            assert folder.path is not None
            # the algorithm is a folder; a dataset, model or annotation may be a single file
            directory = folder.kind == "algorithm"
            source = checked(
                folder.path, folder.what, folder.field, directory=directory, writable=not folder.read_only
            )
            create = False
        mounts.append(Mount(source, folder.target, folder.read_only, folder.kind, create=create))
    # A read-only source inside (or equal to) a writable one could be written through the writable
    # mount, so read-only would be a lie: refuse it.
    for ro in (m for m in mounts if m.read_only):
        for rw in (m for m in mounts if not m.read_only):
            if ro.source == rw.source or ro.source.startswith(rw.source.rstrip("/") + "/"):
                raise InvalidSpec(
                    f"{ro.target} ({ro.source}) lies inside the writable {rw.target} ({rw.source}), so the job could "
                    "change it: use folders that do not contain each other"
                )
    check_outside_writable(mounts, [(m.source, m.target) for m in mounts])
    targets = sorted(m.target for m in mounts)
    for outer, inner in zip(targets, targets[1:], strict=False):
        if inner == outer or inner.startswith(outer + "/"):
            raise InvalidSpec(
                f"{inner} would lie inside {outer}: mount a dataset or model either with a version or without one"
            )
    return mounts


def check_outside_writable(mounts: list[Mount], sources: list[tuple[str, str]]) -> None:
    """Refuse a source that lies below a writable mount's source.

    bubblewrap binds each source by its path when the node starts; a job (one of its earlier
    phases, or another node of it that started first) could replace a folder on that path inside
    its writable mount with a symlink to anything on the host, and the later bind would follow it.

    Args:
        mounts: the node's mounts.
        sources: (host folder, what it is shown as) to check: the mounts' own sources and the
            image's folders.

    Raises:
        InvalidSpec: naming both folders.
    """
    for rw in (m for m in mounts if not m.read_only):
        below = rw.source.rstrip("/") + "/"
        for source, shown in sources:
            if source.startswith(below):
                raise InvalidSpec(
                    f"{shown} ({source}) lies inside the writable {rw.target} ({rw.source}), so the job could "
                    "redirect it before it is mounted: use folders that do not contain each other"
                )


def node_workdir(spec: JobSpec, algorithm: str | None = None) -> str:
    """A local node's working directory: ``spec.workdir``, else (ModelArts layout, a job with
    an algorithm) its code folder under ``user-job-dir``, else /workspace/algorithm, there
    whether or not the job has an algorithm (its working copy, or the algorithm folder itself;
    see the module docstring)."""
    if spec.workdir or (modelarts_layout(spec) and (algorithm or spec.algorithm)):
        return workdir_for(spec, algorithm)
    return ALGORITHM_VIEW


def folder_size_over(path: str, limit: int) -> bool:
    """Whether the regular files below ``path`` add up to more than ``limit`` bytes (symbolic
    links not followed; stops counting once over); a folder the walk refuses (too deep, too many
    entries: :class:`~ma_jupyter.errors.FolderRefused`) counts as over: no copy is made of it."""
    try:
        return folder_size([path], limit=limit).bytes > limit
    except FolderRefused:
        return True


def with_working_copy(
    mounts: Sequence[Mount], *, job_dir: Path, node: str, limit: int, sizes: dict[str, bool] | None = None
) -> tuple[list[Mount], str]:
    """The node's mounts with its working copy at /workspace/algorithm, and a note saying what
    the node works in (for the dry run); pure (it only reads sizes).

    Args:
        mounts: from :func:`mounts_for`.
        job_dir: the job's folder (the placeholder in a dry run of a job not yet made).
        node: the node's name: every node has a copy of its own.
        limit: the most bytes a copy may take (the admin's ``[mounts] workdir_copy_mb``).
        sizes: memo of :func:`folder_size_over` by folder, for the nodes of one job.
    """
    jd = JobDir(Path(job_dir))
    copy = str(jd.workdir(node))
    algorithm = next((m for m in mounts if m.kind == "algorithm"), None)
    rest = [m for m in mounts if m is not algorithm]
    if algorithm is None:
        mount = Mount(copy, ALGORITHM_VIEW, False, WORKDIR_KIND, create=True)
        return [mount, *rest], f"working directory {ALGORITHM_VIEW}: an empty writable folder of this node's"
    if not algorithm.read_only:
        return list(mounts), f"working directory {ALGORITHM_VIEW}: the algorithm folder itself, writable"
    made = jd.node(node).workdir_record.exists()
    if not made:
        memo = sizes if sizes is not None else {}
        if algorithm.source not in memo:
            memo[algorithm.source] = folder_size_over(algorithm.source, limit)
        if memo[algorithm.source]:
            return list(mounts), (
                f"working directory {ALGORITHM_VIEW}: the algorithm folder itself, read-only: it holds more "
                f"than the {limit // (1 << 20)} MB a working copy may take (write under /workspace/outputs, "
                "or mount it writable with --code-writable)"
            )
    mount = replace(
        algorithm, source=copy, read_only=False, kind=WORKDIR_KIND, create=True, copy_of=algorithm.source
    )
    return [mount, *rest], (
        f"working directory {ALGORITHM_VIEW}: a writable copy of {algorithm.source} made at this node's first "
        "launch and kept across its attempts; what the job writes there is kept in its outputs' workdir/"
    )


# ------------------------------------------------------------------- path failures

_READ_ONLY = re.compile(r"Read-only file system|EROFS|\[Errno 30\]")
#: a refused write the job's account may not make: ``os.makedirs("../data")`` under the
#: read-only ``/workspace`` (its folders are the platform's, not the job account's)
_DENIED = re.compile(r"Permission denied|EACCES|\[Errno 13\]")
#: torch.save's words for a file it could not create (it names no errno)
_CANNOT_OPEN = "cannot be opened"
#: a file that is not there (Python, the shell, TensorFlow's checkpoint readers)
#: (a module not found is no file: ``ModuleNotFoundError: No module named 'torch'``)
_MISSING = re.compile(
    r"No such file or directory|\[Errno 2\]|ENOENT|(?<!Module)NotFoundError(?!: No module named)"
    r"|Failed to find any matching files|does not exist"
)
#: a quoted path: the quote opens after no letter (the apostrophe of "can't" opens nothing)
_QUOTED = re.compile(r"""(?<!\w)['"\u2018\u201c]([^'"\u2018\u2019\u201c\u201d\n]+)['"\u2019\u201d]""")
_ABSOLUTE = re.compile(r"""(?<![\w.~])(/[^\s'"\u2018\u2019\u201c\u201d:,;()\[\]{}]+)""")
_WRITABLE_ELSEWHERE = "write under /workspace/outputs (the --output folder) or the working directory"
#: where a node's own ``/tmp`` is (the cache below it is the user's, shared by every node)
_NODE_TMP = "/tmp/"


def path_hint(lines: Iterable[str], mounts: Sequence[Mount], workdir: str, nodes: int = 1) -> str | None:
    """One sentence explaining a failed node from its last log lines in terms of its view: which
    mount a refused write hit, why, and how to change it; None when no line shows such a failure.

    1. The last line that says "Read-only file system" (errno 30, EROFS), "Permission denied"
       (errno 13, EACCES), or torch's "cannot be opened", is the failed write.
    2. A path it names (quoted, or absolute; a relative one is taken from ``workdir``) that lies
       in a read-only mount names that mount.  One in no mount at all is in ``/workspace``
       itself (read-only, the working directory's parent: a tutorial's ``../data``) or in the
       node's read-only system folders; for "Permission denied" only where that is sure: a path
       in ``/workspace``, directly under ``/``, or spelled ``../`` (a denied read of a file
       elsewhere says nothing about the view).
    3. A line that names no such path (torch: "open file failed with strerror: Read-only file
       system") is explained by the lines just before it (the traceback's own code line, e.g.
       ``torch.save(model, "/workspace/model/...")``), where only a read-only mount counts.
    4. Otherwise a read-only write that names nothing gets the general advice.
    5. Without such a write, on a job of several ``nodes``: the last line saying a file is
       missing that names a path in the node's own ``/tmp`` or its own working copy gets the
       advice that nodes do not share those (another node may have written it there).
    6. Without such a write, on a job with no algorithm folder (its working copy started
       empty): the last line saying a file is missing that names a path in the working copy
       gets the advice to ship the folder holding it (``bash -c "cd elsewhere && ..."`` ships
       nothing when the current folder holds none of the files the command names).
    """
    lines = list(lines)
    for index in range(len(lines) - 1, -1, -1):
        line = lines[index]
        erofs = bool(_READ_ONLY.search(line))
        denied = not erofs and bool(_DENIED.search(line))
        if not erofs and not denied and _CANNOT_OPEN not in line:
            continue
        for raw, path in _named_paths(line, workdir):
            mount = _mount_of(path, mounts)
            if mount is not None and mount.read_only:
                return _mount_hint(path, mount)
            if mount is not None or path.startswith(("/tmp/", "/dev/")):
                continue
            if _inside(path, VIEW_ROOT):
                return _workspace_hint(path, raw)
            if erofs or (denied and (path.count("/") == 1 or raw.startswith("../"))):
                return (
                    f"{path} lies in the node's read-only system folders{_spelled(path, raw)}: "
                    f"{_WRITABLE_ELSEWHERE} ({workdir}), or /tmp"
                )
        for before in reversed(lines[max(0, index - 8) : index]):
            for _raw, path in _named_paths(before, workdir):
                mount = _mount_of(path, mounts)
                if mount is not None and mount.read_only:
                    return _mount_hint(path, mount)
        if erofs:
            return f"a write to a read-only folder failed: {_WRITABLE_ELSEWHERE} ({workdir}), or /tmp"
        return None
    return _empty_workdir_hint(lines, mounts, workdir) or (
        _per_node_hint(lines, mounts, workdir) if nodes > 1 else None
    )


def _empty_workdir_hint(lines: list[str], mounts: Sequence[Mount], workdir: str) -> str | None:
    """Rule 6 of :func:`path_hint`."""
    copy = next((m for m in mounts if m.kind == WORKDIR_KIND), None)
    if copy is None or copy.copy_of is not None:
        return None
    for line in reversed(lines):
        if not _MISSING.search(line):
            continue
        for _raw, path in _named_paths(line, workdir):
            if _mount_of(path, mounts) is copy and path != copy.target:
                return (
                    f"{path} is missing: the job has no algorithm folder, so its working directory "
                    f"{copy.target} started empty; submit from the folder holding the file (a command "
                    "naming a file of the current folder ships that folder), or pass --code-dir DIR"
                )
        return None
    return None


def _workspace_hint(path: str, raw: str) -> str:
    where = "/workspace itself" if path != VIEW_ROOT else "/workspace"
    local = f" ({raw[1:]} instead of {raw})" if raw.startswith("../") and not raw.startswith("../../") else ""
    return (
        f"{path}{_spelled(path, raw)} is in {where}, which holds only the platform's mounts and is "
        "read-only (it is the working directory's parent): write under /workspace/outputs (the "
        f"--output folder) or in the working directory{local}, or mount a folder of yours "
        "writable with --volume NAME=PATH (at /workspace/volume/NAME)"
    )


def _spelled(path: str, raw: str) -> str:
    """`` (written ../data)`` where the log named ``path`` relatively."""
    return f" (written {raw})" if raw != path and not raw.startswith("/") else ""


def _per_node_hint(lines: list[str], mounts: Sequence[Mount], workdir: str) -> str | None:
    """Rule 5 of :func:`path_hint`: a missing file in what each node has of its own."""
    for line in reversed(lines):
        if not _MISSING.search(line):
            continue
        for _raw, path in _named_paths(line, workdir):
            mount = _mount_of(path, mounts)
            if mount is not None and mount.kind == WORKDIR_KIND:
                return (
                    f"{path} is missing in this node's own working copy ({mount.target}): each node of "
                    "the job works in a copy of its own, so a file another node wrote there is not "
                    "seen here; write what nodes share under /workspace/outputs (or a --volume), or "
                    "share the folder itself with --code-writable"
                )
            if mount is None and path.startswith(_NODE_TMP):
                return (
                    f"{path} is missing in this node's own /tmp: each node of the job has a /tmp of "
                    "its own, so a file another node wrote there is not seen here; write what nodes "
                    "share (checkpoints, downloads) under /workspace/outputs, or a --volume"
                )
        return None
    return None


def _named_paths(line: str, workdir: str) -> list[tuple[str, str]]:
    """``(as written, normalised)`` for each path a log line names (quoted or absolute),
    relative ones from ``workdir``."""
    raw = [r.strip().rstrip(".") for r in (*_QUOTED.findall(line), *_ABSOLUTE.findall(line)) if r.strip()]
    return [(r, posixpath.normpath(posixpath.join(workdir, r))) for r in raw if r]


def _mount_of(path: str, mounts: Sequence[Mount]) -> Mount | None:
    """The mount holding the in-view ``path`` (the deepest one)."""
    found = [m for m in mounts if path == m.target or path.startswith(m.target.rstrip("/") + "/")]
    return max(found, key=lambda m: len(m.target), default=None)


def _mount_hint(path: str, mount: Mount) -> str:
    parts = mount.target.split("/")
    name = parts[4] if len(parts) > 4 else parts[-1]
    where = f"{path} is in {mount.target}" if path != mount.target else f"{path} is"
    if mount.kind == "dataset":
        return (
            f"{where}, the dataset {name}, mounted read-only: {_WRITABLE_ELSEWHERE}, or mount the "
            f"dataset writable (--dataset {name}=PATH:rw)"
        )
    if mount.kind == "model":
        return f"{where}, the model {name}, which is always read-only: {_WRITABLE_ELSEWHERE}"
    if mount.kind == "annotation":
        name = parts[3] if len(parts) > 3 else name
        return f"{where}, the annotation set {name}, which is always read-only: {_WRITABLE_ELSEWHERE}"
    if mount.kind == "algorithm":
        return (
            f"{where}, the algorithm folder itself, read-only (it is larger than a working copy may "
            "be): write under /workspace/outputs (the --output folder), or mount it writable (--code-writable)"
        )
    return f"{where}, mounted read-only ({mount.kind}): {_WRITABLE_ELSEWHERE}"
