"""Who may do what with a job: the seed's "others' access" matrix, priorities and the urgent cap.

The creator of a job and every admin may do everything with it.  Any other user gets what the
job's others' access (``spec.access``) allows:

=====================================================  ======  ======  ======
operation (routes)                                      rw      ro      none
=====================================================  ======  ======  ======
view: get, status, events, logs (and so clone)          yes     yes     404
tensorboard: start or stop the job's TensorBoard        yes     yes     404
duration: PATCH ``duration``                            yes     403     404
priority: PATCH ``priority``                            yes     403     404
stop                                                    yes     403     404
delete                                                  yes     403     404
=====================================================  ======  ======  ======

A ``none`` job does not exist for others: it is never listed (nor counted) and every route
answers 404.  Cloning is viewing a job and submitting its spec as one's own job.

Priorities and sharing, in the order a submit (or a PATCH) meets them:

1. The creator is the caller (its token), whatever the body says.
2. With ``[users] sharing = false`` in ``cluster.toml`` every new job's others' access is ``none``
   (the administrator turned sharing off).
3. A job's others' access may not exceed what its resources allow others (the seed: "the
   application's access may not be higher than the resources' access"): each folder the job
   mounts (dataset, annotation set, model, volume, the algorithm and the outputs folder) allows
   others ``rw`` when other users may write it, ``ro`` when they may read it, else ``none`` (its
   own mode bits, :func:`resource_access`; ACLs are not read).  A higher access is refused (400,
   field ``access``) naming the folder; a spec that names no access gets the default ``ro``
   lowered to what its folders allow (:func:`default_access`), so a job shipped from a private
   folder is private rather than refused.  The algorithm is judged by the folder the user shipped
   the code from (``algorithm_origin``), never by the platform's snapshot of it (always 0755,
   the platform's copy, not a resource of the user's; a link there is judged by the folder it
   points to, as the mount rules resolve it); a snapshot with no such folder (a
   notebook cell without ``--code-dir``) is no folder of the user's and caps nothing.  Each batch
   task's folder counts, and the outputs folder by its own mode (the job's default outputs, in
   its job folder, are the platform's); an outputs folder or a volume that does not exist yet
   by the mode the platform makes it with at launch (0755: others read it).  Others reach both through the job (a dev environment
   of it mounts its algorithm, its TensorBoard reads its outputs), but a code folder mounted
   read-only (the default) can only be read through it: it caps the job at ``none`` when others
   may not read it and leaves ``rw`` alone otherwise (``rw`` gives others no write to a
   read-only mount); one mounted writable (``algorithm_read_only = false``) caps as a volume
   does.  The supervisor applies it after the mount rules (:func:`check_resource_access`): a
   folder no job may mount is refused for that first, and a missing one is left to them.
4. Only admins may choose ``very-urgent`` (403 otherwise).
5. A non-admin's submit or PATCH that would give a user more urgent jobs (running + queued)
   than ``[users] urgent_quota`` (default :data:`DEFAULT_URGENT_QUOTA`) is refused with a 403
   naming the cap.  The user is the job's creator; admins are not capped.

Nodes: only admins drain or undrain a node (``POST /nodes/{name}/drain|undrain``; 403
otherwise, :func:`check_node_admin`).

The rules are re-read from ``cluster.toml`` when it changes: an admin's edit applies to the
next request without a restart.
"""

from __future__ import annotations

import os
import stat
import threading
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from .. import config
from ..errors import Forbidden, InvalidSpec, NotFound
from ..models import Access, Job, JobSpec, JobStatus, Priority, is_object_uri
from .users import Caller

DEFAULT_URGENT_QUOTA = 2
#: the statuses whose urgent jobs count against the cap
URGENT_COUNTED = (JobStatus.queued, JobStatus.running)


def check_node_admin(caller: Caller, what: str) -> None:
    """Only admins drain or undrain nodes (they move every user's jobs).

    Raises:
        Forbidden: the caller is not an admin.
    """
    if not caller.admin:
        raise Forbidden(f"only admins may {what} a node; ask an admin ({caller.name} is not one)")


class Op(str, Enum):
    """What a request does to a job (the rows of the matrix)."""

    view = "view"
    tensorboard = "tensorboard"
    duration = "duration"
    priority = "priority"
    stop = "stop"
    delete = "delete"
    shell = "shell"


#: what others may do, by the job's others' access; a debug terminal never (it runs as the job's
#: account, with its secret variables in reach): the owner's or an admin's alone
OTHERS: dict[Access, frozenset[Op]] = {
    Access.rw: frozenset(Op) - {Op.shell},
    Access.ro: frozenset({Op.view, Op.tensorboard}),
    Access.none: frozenset(),
}

_VERBS = {
    Op.view: "view",
    Op.tensorboard: "open the TensorBoard of",
    Op.duration: "change the duration of",
    Op.priority: "change the priority of",
    Op.stop: "stop",
    Op.delete: "delete",
    Op.shell: "open a debug terminal on",
}


def is_own(job: Job, caller: Caller) -> bool:
    """Whether the caller may do everything with the job: its creator, an admin, or anyone for a
    job of the service's own (no creator)."""
    return caller.admin or job.spec.creator in (None, caller.name)


def can_see(job: Job, caller: Caller) -> bool:
    """Whether the job exists for the caller at all."""
    return is_own(job, caller) or job.spec.access is not Access.none


def allowed(job: Job, caller: Caller) -> list[Op]:
    """Every operation the caller may do with the job (what :func:`check` lets through)."""
    if is_own(job, caller):
        return list(Op)
    return [op for op in Op if op in OTHERS[job.spec.access]]


def check(job: Job, caller: Caller, op: Op) -> Job:
    """The job, if the caller may do ``op`` with it.

    Raises:
        NotFound: the job is hidden from the caller (the same answer as for no job at all).
        Forbidden: the caller sees the job but may not do ``op``; the message says whose it is.
    """
    if is_own(job, caller) or op in OTHERS[job.spec.access]:
        return job
    if not can_see(job, caller):
        raise NotFound(f"no job {job.id!r}: list jobs with `ma-jupyter jobs` or %ma_jobs")
    raise Forbidden(
        f"job {job.id} belongs to {job.spec.creator} and allows others {job.spec.access.value} access; "
        f"ask its owner to {_VERBS[op]} it"
    )


@dataclass(frozen=True)
class Rules:
    """The admin's settings of ``[users]`` in ``cluster.toml`` that this module applies."""

    sharing: bool = True
    urgent_quota: int = DEFAULT_URGENT_QUOTA
    source: str = "cluster.toml"


_RULES: tuple[tuple[int, int] | None, Rules] | None = None
_RULES_LOCK = threading.Lock()


def load_rules(path: Path | None = None) -> Rules:
    """The rules of this home's ``cluster.toml`` (defaults without one), re-read when it changes.

    Raises:
        InvalidSpec: ``sharing`` is not a boolean or ``urgent_quota`` not a whole number >= 0.
    """
    global _RULES
    path = path or config.cluster_file()
    try:
        st = os.stat(path)
        stamp: tuple[int, int] | None = (st.st_mtime_ns, st.st_size)
    except OSError:
        stamp = None
    with _RULES_LOCK:
        if _RULES is not None and _RULES[0] == stamp and _RULES[1].source == str(path):
            return _RULES[1]
    users: dict = {}
    if stamp is not None:
        users = config.read_cluster_file(path).get("users", {})
    # the types (and unknown keys, e.g. a misspelt sharing) are the schema's
    sharing = users.get("sharing", True)
    quota = users.get("urgent_quota", DEFAULT_URGENT_QUOTA)
    rules = Rules(sharing=sharing, urgent_quota=quota, source=str(path))
    with _RULES_LOCK:
        _RULES = (stamp, rules)
    return rules


def new_job_spec(spec: JobSpec, caller: Caller, rules: Rules) -> JobSpec:
    """The spec as the service stores it: the caller's (rule 1), private when sharing is off (rule
    2); a spec that names no access gets the default ``ro`` capped by its folders (rule 3)."""
    update: dict = {"creator": caller.name}
    if not rules.sharing:
        update["access"] = Access.none
    elif "access" not in spec.model_fields_set:
        update["access"] = default_access(spec)
    return spec.model_copy(update=update)


#: how much each access gives others, to compare them (rule 3)
_RANK = {Access.none: 0, Access.ro: 1, Access.rw: 2}


def resource_access(path: str) -> Access | None:
    """What a resource folder (or file) allows other users by its own mode bits: ``rw`` when
    they may write it, ``ro`` when they may read it (a folder: read and enter), else ``none``;
    None when it cannot be looked at (missing: the mount rules judge it)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    readable = stat.S_IROTH | (stat.S_IXOTH if stat.S_ISDIR(st.st_mode) else 0)
    if st.st_mode & readable != readable:
        return Access.none
    return Access.rw if st.st_mode & stat.S_IWOTH else Access.ro


def _resources(spec: JobSpec) -> list[tuple[str, str, str]]:
    """Rule 3's folders: (kind, name, path) of each folder the job mounts that caps its access."""
    found = [
        *(("dataset", m.name, m.path) for m in spec.datasets),
        *(("annotation set", m.name, m.path) for m in spec.annotations),
        *(("model", m.name, m.path) for m in spec.models),
        *(("volume", m.name, m.path) for m in spec.volumes),
        *_code_folders(spec),
    ]
    if spec.outputs and not is_object_uri(spec.outputs):
        found.append(("outputs", "folder", spec.outputs))
    return found


def _allows(spec: JobSpec, kind: str, path: str) -> tuple[Access | None, bool]:
    """What one of rule 3's folders allows others (None: it cannot be looked at), and whether
    it is a folder the platform makes at launch."""
    allows = resource_access(path)
    # a writable folder that does not exist yet is made at launch with mode 0755
    # (untrusted.make_dirs): judged as it will be, else a missing one would escape the rule
    created = allows is None and kind in ("outputs", "volume") and not os.path.lexists(path)
    if created:
        allows = Access.ro
    if allows is Access.ro and kind.startswith("algorithm") and spec.algorithm_read_only:
        allows = Access.rw  # code read through the job only: its rw writes nothing there
    return allows, created


def default_access(spec: JobSpec) -> Access:
    """Rule 3 for a spec that names no access: the default ``ro``, lowered to what its folders
    allow (a job shipped from a private folder is private), never refused."""
    access = Access.ro
    for kind, _name, path in _resources(spec):
        allows, _created = _allows(spec, kind, path)
        if allows is not None and _RANK[allows] < _RANK[access]:
            access = allows
    return access


def check_resource_access(spec: JobSpec) -> None:
    """Rule 3: refuse others' access above what any of the job's resources allows.

    Raises:
        InvalidSpec: naming the first such resource, its mode and the two ways out.
    """
    if spec.access is Access.none:
        return
    for kind, name, path in _resources(spec):
        allows, created = _allows(spec, kind, path)
        if allows is None or _RANK[allows] >= _RANK[spec.access]:
            continue
        try:
            mode = 0o755 if created else stat.S_IMODE(os.stat(path).st_mode)
        except OSError:  # removed since the look above
            continue  # the mount rules refuse a missing dataset, model or code folder
        opening = "o+w" if spec.access is Access.rw else "o+rx"
        how = (
            f"create it open to others first (mkdir -m 777 {path})"
            if created
            else (f"open the folder to others (chmod {opening} {path})")
        )
        raise InvalidSpec(
            f"others' access {spec.access.value} is more than {kind} {name} allows: {path} "
            f"({'made at launch, ' if created else ''}mode {mode:o}) gives other users {allows.value} "
            f"access. Choose --access {allows.value}, or {how}",
            field="access",
        )


def _code_folders(spec: JobSpec) -> list[tuple[str, str, str]]:
    """Rule 3's code folders: (kind, name, path) of the folder the user shipped the algorithm
    from, else the algorithm folder itself unless it is one of the platform's snapshots; each
    batch task's folder likewise."""
    # the snapshots' folder is the client's (client/snapshot.py); the host policy spells it too
    snapshots = os.path.realpath(os.path.join(str(config.home()), "snapshots"))

    def is_snapshot(path: str) -> bool:
        # resolved, as the mount rules resolve it: the client writes snapshots as the user, so a
        # user's link in the snapshots folder to a private folder would be mounted (the host
        # policy judges its target) yet waved through here as the platform's copy
        return os.path.dirname(os.path.realpath(path)) == snapshots

    found = []
    if spec.algorithm_origin:
        found.append(("algorithm", "folder", spec.algorithm_origin))
    if spec.algorithm and not is_snapshot(spec.algorithm):
        found.append(("algorithm", "folder", spec.algorithm))
    for k, task in enumerate(spec.tasks):
        if task.algorithm and not is_snapshot(task.algorithm):
            found.append(("algorithm of task", str(k), task.algorithm))
    return found


def check_priority(caller: Caller, priority: Priority | None) -> None:
    """Rule 4: only admins choose very-urgent.

    Raises:
        Forbidden: naming the priorities the caller may choose.
    """
    if priority is Priority.very_urgent and not caller.admin:
        raise Forbidden(
            f"only admins may choose very-urgent; {caller.name} may choose normal or urgent",
            field="priority",
        )


def check_urgent_quota(caller: Caller, creator: str, held: int, rules: Rules) -> None:
    """Rule 5: one more urgent job for ``creator``, who holds ``held`` now.

    Raises:
        Forbidden: naming the cap, the setting and what to do.
    """
    if caller.admin or held < rules.urgent_quota:
        return
    raise Forbidden(
        f"{creator} has {held} urgent job(s) running or queued and the cap is {rules.urgent_quota} "
        f"per user ([users] urgent_quota in {rules.source}): wait for one to end, lower one to "
        "normal, or choose normal",
        field="priority",
    )
