"""The mounts of a node's ``/workspace``: each folder of the layout (:mod:`ma_jupyter.workspace`)
with its host path checked and resolved (pure: it only reads paths)."""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from pathlib import Path

from ...errors import InvalidSpec
from ...jobdir import PLACEHOLDER, JobDir
from ...models import JobSpec
from ...workspace import VIEW_ROOT, check_subfolder, folders, workdir_for
from .host_policy import HostPolicy, load_policy

__all__ = ["VIEW_ROOT", "Mount", "check_outside_writable", "mounts_for", "workdir_for"]


@dataclass(frozen=True)
class Mount:
    """One folder of the view.

    Attributes:
        source: the host path (symlinks resolved).
        target: where it appears: below ``/workspace``, or (the ModelArts layout, added by
            :func:`.sandbox.node_view`) ``/home/ma-user/modelarts`` and ``/cache``.
        read_only: whether the node can write to it (enforced by bubblewrap only).
        kind: ``algorithm``, ``dataset``, ``annotation``, ``model``, ``outputs`` or ``volume``.
        create: the backend creates ``source`` at launch (an outputs folder of a batch task, or
            the job's own outputs folder when the spec names none).
    """

    source: str
    target: str
    read_only: bool
    kind: str
    create: bool = False


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
        policy: the admin's host rules (default: :func:`~ma_jupyter.backends.local.host_policy.load_policy`);
            every source must pass :meth:`~ma_jupyter.backends.local.host_policy.HostPolicy.check_source`
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

    # the platform's own copies of this job's datasets (data preparation) live in its folder
    prepared = str(JobDir(Path(job_dir)).prepared) if job_dir is not None else None

    def checked(raw: str, what: str, field_name: str, *, directory: bool, writable: bool = False) -> str:
        source = _host_path(raw, what, field_name, directory=directory)
        if prepared is None or not (source + "/").startswith(prepared + "/"):
            snapshot_ok = field_name == "algorithm" and not writable
            policy.check_source(source, what, field_name, user, snapshot_ok=snapshot_ok)
        if writable:
            policy.check_writable(source, run_as, what, field_name)
        return source

    for folder in folders(spec, algorithm=algorithm):
        if folder.kind == "outputs":
            if folder.path:
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
