"""What of the host a job may touch: the folders it may mount, and the account it runs as.

An admin sets both in ``$MA_JUPYTER_HOME/cluster.toml``::

    [mounts]
    allowed_roots = ["/data", "/srv/projects"]   # more than the user's home and the project folder
    workdir_copy_mb = 512    # the most a node's working copy of the algorithm folder may take

    [users]
    allow_root = ["root"]    # users whose jobs may run as root (default: nobody's)
    job_account = "nobody"   # the account of users without a Unix account of their own

Mount rules, applied to every host folder a job names, after resolving symlinks:

1. Never ``/``, ``/proc``, ``/sys``, ``/dev``, ``/etc``, ``/boot`` or ``/run``, nor anything
   inside them; never a folder containing ``/root``, ``/home`` or the service's home.
2. Never the service's home (its token, database and every job's folder) nor anything inside it,
   except one of the platform's own code snapshots (``<home>/snapshots/<one folder>``), which
   ``%%ma_train`` makes to be mounted as the algorithm.
3. Otherwise the folder must lie inside an allowed root: the submitting user's home, the project
   folder, or one of ``allowed_roots`` (which add to those two); the refusal names the roots and
   the exact ``allowed_roots`` line that would allow it.

Accounts, when the service runs as root (otherwise every job runs as the service's own user,
the only account it can use):

1. A user with a Unix account of the same name runs as that account (uid, primary gid, no
   supplementary groups).
2. The account ``root`` runs as root only when ``[users] allow_root`` names the user; otherwise,
   like users without an account, as ``job_account``.

The project folder is the folder the service was started for: ``$MA_JUPYTER_PROJECT_DIR``, which
the client sets to its working directory when it starts the service.
"""

from __future__ import annotations

import json
import os
import pwd
from dataclasses import dataclass
from pathlib import Path

from .. import config
from ..errors import InvalidSpec

#: system folders no job may see, nor anything inside them
NEVER_INSIDE = ("/proc", "/sys", "/dev", "/etc", "/boot", "/run")
#: folders a mount may lie inside (users' homes) but never contain whole
NEVER_CONTAINING = ("/root", "/home")
DEFAULT_JOB_ACCOUNT = "nobody"
DEFAULT_WORKDIR_COPY_MB = 512


@dataclass(frozen=True)
class RunAs:
    """The Unix account a job's processes run as."""

    uid: int
    gid: int
    name: str


def _inside(path: str, root: str) -> bool:
    """Whether ``path`` is ``root`` or lies below it (both absolute and resolved)."""
    return path == root or path.startswith(root.rstrip("/") + "/")


@dataclass(frozen=True)
class HostPolicy:
    """The admin's rules for one service (see the module docstring).

    Attributes:
        allowed_roots: folders jobs may mount from besides the defaults (the submitting user's
            home and the project folder); None when the admin named none.
        allow_root: users whose jobs may run as root.
        job_account: the account of users without one (and of root when not allowed).
        service_home: ``$MA_JUPYTER_HOME``, resolved.
        project_dir: the project folder, resolved, or None.
        source: the file the rules came from, named in refusals.
        workdir_copy_limit: the most bytes a node's working copy of the algorithm may take
            (larger folders are shown read-only themselves, see :mod:`.mounts`).
    """

    allowed_roots: tuple[str, ...] | None
    allow_root: frozenset[str]
    job_account: str
    service_home: str
    project_dir: str | None
    source: str
    workdir_copy_limit: int = DEFAULT_WORKDIR_COPY_MB << 20

    # ------------------------------------------------------------------------ mounts

    def roots_for(self, user: str | None) -> list[str]:
        """The folders ``user``'s jobs may mount from, resolved: the user's home, the project
        folder, then the admin's ``allowed_roots``."""
        raw = [p for p in (_home_of(user), self.project_dir) if p] + list(self.allowed_roots or ())
        roots = []
        for path in raw:
            resolved = os.path.realpath(path)
            if resolved != "/" and resolved not in roots:
                roots.append(resolved)
        return roots

    def check_source(
        self, source: str, what: str, field: str, user: str | None, *, snapshot_ok: bool = False
    ) -> None:
        """Refuse a resolved host folder a job may not mount (rules 1 to 3).

        ``snapshot_ok``: the mount is a read-only algorithm, the only kind rule 2's exception
        (a code snapshot of the platform's own) applies to.

        Raises:
            InvalidSpec: the message says which rule refuses it and, for rule 3, which roots
                are allowed and where to add one.
        """
        home = self.service_home
        snapshots = os.path.join(home, "snapshots")
        if snapshot_ok and os.path.dirname(source) == snapshots:
            return  # a code snapshot of the platform's own (rule 2's exception)
        self.check_private(source, what, field)
        roots = self.roots_for(user)
        if not any(_inside(source, root) for root in roots):
            allowed = ", ".join(roots) or "none"
            raise InvalidSpec(
                f"{what}: {source} lies outside the folders jobs may mount ({allowed}); move the data "
                f"under one of them, or let jobs mount its folder with [mounts] allowed_roots in "
                f"{self.source} (an admin's edit: the account that started the service is one; it adds "
                f"to the folders above and applies to the next job): {self.roots_line(source)}",
                field=field,
            )

    def roots_line(self, source: str) -> str:
        """The ``allowed_roots`` line of ``cluster.toml`` that keeps the admin's roots and adds the
        folder holding ``source`` (``source`` itself when that folder is a top-level one such as
        ``/srv``, too wide to suggest): a notebook's ``./data`` and ``./outputs`` both fit."""
        parent = os.path.dirname(source)
        folder = parent if parent.count("/") >= 2 else source
        return "allowed_roots = " + json.dumps([*(self.allowed_roots or ()), folder])

    def check_private(self, source: str, what: str, field: str) -> None:
        """Rules 1 and 2 without the roots: for folders a sandbox shows read-only on behalf of
        the job (a job's own interpreter or virtualenv), which may lie anywhere else.

        Raises:
            InvalidSpec: ``source`` is a system folder or the service's home, or contains one,
                or contains ``/root`` or ``/home`` whole.
        """
        home = self.service_home
        for system in NEVER_INSIDE:
            if _inside(source, system) or _inside(system, source):
                raise InvalidSpec(
                    f"{what}: {source} is or contains the system folder {system}, which no job may mount; "
                    "mount a folder of your own data instead",
                    field=field,
                )
        if _inside(source, home) or _inside(home, source):
            raise InvalidSpec(
                f"{what}: {source} is or contains the job service's home {home} (its token and every "
                "job's files), which no job may mount; mount a folder outside it",
                field=field,
            )
        for whole in NEVER_CONTAINING:
            if _inside(whole, source):
                raise InvalidSpec(
                    f"{what}: {source} contains {whole} (every user's files); mount a folder inside it instead",
                    field=field,
                )

    # ---------------------------------------------------------------------- accounts

    def run_as(self, user: str | None) -> RunAs | None:
        """The account ``user``'s jobs run as; None when it is the service's own (no switch).

        Raises:
            InvalidSpec: the job account does not exist on this machine.
        """
        if os.geteuid() != 0:
            return None
        # a job without a creator is the service's own (jobs made by the service itself)
        account = _account(user) if user else pwd.getpwuid(os.geteuid())
        user = user or account.pw_name
        if account is not None and account.pw_uid != 0:
            return RunAs(account.pw_uid, account.pw_gid, account.pw_name)
        if account is not None and user in self.allow_root:
            return None  # root, allowed by the admin
        job = _account(self.job_account)
        if job is None or job.pw_uid == 0:
            raise InvalidSpec(
                f"the job account {self.job_account!r} ([users] job_account in {self.source}) is not an "
                "unprivileged account of this machine; name one that exists (e.g. nobody)"
            )
        return RunAs(job.pw_uid, job.pw_gid, job.pw_name)

    def check_writable(self, path: str, run_as: RunAs | None, what: str, field: str) -> None:
        """Refuse a writable mount its job's account could not write to.

        Raises:
            InvalidSpec: naming the account and the ways out (chown, a new folder, the admin).
        """
        if run_as is None:
            return
        try:
            st = os.stat(path)
        except OSError:
            return  # a folder the platform creates for the job (owned by its account)
        if st.st_uid == run_as.uid:
            writable = st.st_mode & 0o200
        elif st.st_gid == run_as.gid:
            writable = st.st_mode & 0o020
        else:
            writable = st.st_mode & 0o002
        if not writable:
            raise InvalidSpec(
                f"{what}: {path} is not writable by {run_as.name} (uid {run_as.uid}), the account this "
                f"job runs as; give it the folder (chown {run_as.uid}:{run_as.gid} {path}), name a folder "
                "that does not exist yet (it is created for the job), or make it read-only",
                field=field,
            )


def service_user() -> str:
    """The name of the account the service runs as."""
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def _account(name: str | None) -> pwd.struct_passwd | None:
    if not name:
        return None
    try:
        return pwd.getpwnam(name)
    except KeyError:
        return None


def _home_of(user: str | None) -> str | None:
    """The home folder of ``user``'s account; the service's own user's without one."""
    account = _account(user)
    if account is not None and account.pw_dir and os.path.isdir(account.pw_dir):
        return account.pw_dir
    if user is None:
        return str(Path.home())
    return None


def load_policy() -> HostPolicy:
    """The rules of this service's home (``cluster.toml`` re-read on each call: cheap, and an
    admin's edit applies to the next job without a restart).

    Raises:
        InvalidSpec: the ``[mounts]`` or ``[users]`` table is malformed.
    """
    path = config.cluster_file()
    data = config.read_cluster_file(path)
    mounts = data.get("mounts", {})
    users = data.get("users", {})
    roots = mounts.get("allowed_roots")  # the types (and unknown keys) are the schema's
    if roots is not None and not all(os.path.isabs(r) for r in roots):
        raise InvalidSpec(f"{path}: [mounts] allowed_roots must be a list of absolute paths")
    copy_mb = mounts.get("workdir_copy_mb", DEFAULT_WORKDIR_COPY_MB)
    allow_root = users.get("allow_root", [])
    project = os.environ.get(config.ENV_PROJECT_DIR)
    return HostPolicy(
        allowed_roots=tuple(roots) if roots is not None else None,
        allow_root=frozenset(allow_root),
        job_account=str(users.get("job_account", DEFAULT_JOB_ACCOUNT)),
        service_home=str(config.home()),
        project_dir=os.path.realpath(project) if project else None,
        source=str(path),
        workdir_copy_limit=int(copy_mb * (1 << 20)),
    )
