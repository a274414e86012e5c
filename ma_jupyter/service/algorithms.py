"""Algorithms: the folders jobs run code from, and each user's favourite ones.

The seed lets a user search jobs by "my algorithm volumes" (我的算法卷) and "favourite
algorithms" (算法收藏).  Here an algorithm is a host folder a job shows at
``/workspace/algorithm`` (a regular job's ``algorithm``, each batch task's), named by its
normalised absolute path:

1. The jobs table keeps each job's folders in a column for the filter; its format is
   :mod:`.algorithm_folders`' (below the store and this module alike).
2. ``GET /jobs?algorithm=PATH`` lists the jobs of one folder; ``favourites=true`` the jobs of
   the caller's favourite folders (both: the folder, if it is a favourite).
3. Favourites are per user, kept in the service's database (:class:`Favourites`, the table
   ``favourite_algorithms``); at most :data:`MAX_FAVOURITES` per user.  A favourite is a name
   for a folder: it need not exist (a folder on another machine of the cluster), and marking
   one twice is the same as once.
4. A job that runs a snapshot (a fresh copy per submit: the folder the command line shipped,
   a notebook cell with its ``--code-dir``) is found under the folder it was shipped from
   (``algorithm_origin``), so every job of one folder is found by it, however many snapshots
   they ran; a cell without ``--code-dir`` has no such folder and is found under its snapshot.
5. A job is also known by the content it runs (``algorithm_digest``, each batch task's:
   :mod:`ma_jupyter.algorithm_content`), which the service reads itself when it accepts the job
   (:func:`identified`), after the backend's dry run has let the caller mount the folder: the
   folder is on this machine for every backend (the Ray backend ships it from here), and a
   snapshot never changes.  A folder used as is (a ``--code-dir`` of the command line, a batch
   task's folder) is read again when the job first starts (:func:`at_start`): an edit made while
   it was queued is the content recorded, and its events say so.  The digest is the content at
   that first start: a later attempt runs the folder as it is then (the Ray backend packs it
   again for each attempt, the local backend shows it as it is), which the digest does not
   follow.  That read runs off the supervisor's lock (the job's placement waits for it), and at
   most :data:`AT_START_READ_LIMIT` bytes of files changed since the submit are read again; past
   that the digest is unknown (None) and the events say the folder was not read again.  A
   digest the caller sent is replaced.
6. ``GET /jobs?algorithm=PATH&algorithm_digest=D`` lists the jobs of the folder or of the
   content ``D`` (the folder's current content as the caller read it: a search never makes the
   service read a folder the caller names, whose digest would tell of files the caller may not
   read), and the page says ``D`` back, so a listing marks which jobs ran the current content
   and which another version; ``algorithm_digest`` alone lists the jobs of that content.
7. :func:`used_by` groups each folder's jobs by the content they ran (its versions).
8. Where the job's nodes run as another account than the service's (the host rules'
   ``run_as``, :meth:`~ma_jupyter.backends.base.Backend.job_account`), a folder holding an
   entry that account cannot read has no digest (None): the service reads with its own rights,
   and a digest that changes with a file the user's job cannot read would tell of that file
   (:mod:`ma_jupyter.algorithm_content` rule 4: mode bits, owner and group; ACLs are not
   considered).
"""

from __future__ import annotations

import posixpath
import re
import time
from dataclasses import dataclass

from sqlalchemy import delete, func, select
from sqlalchemy.exc import IntegrityError

from .. import algorithm_content
from ..errors import Conflict, FolderRefused, InvalidSpec
from ..models import DIGEST_PATTERN, MAX_PATH, JobSpec, RunAs
from . import algorithm_folders
from .store import Store, jobs_table
from .store_schema import favourites_table

#: the most favourite algorithms one user keeps
MAX_FAVOURITES = 200


def normalise(path: str, field: str = "algorithm") -> str:
    """``path`` as the filter compares it: absolute, normalised (``/a/b/../c/`` → ``/a/c``).

    Raises:
        InvalidSpec: a relative path, or one with a NUL byte or a line break (naming ``field``).
    """
    if not path or not path.startswith("/"):
        raise InvalidSpec(
            f"{field} {path!r}: give the algorithm folder as an absolute path, e.g. /home/me/algorithms/mnist",
            field=field,
        )
    if any(c in path for c in "\x00\n\r") or len(path) > MAX_PATH:
        raise InvalidSpec(
            f"{field}: a folder path without NUL bytes or line breaks, at most {MAX_PATH} characters",
            field=field,
        )
    return posixpath.normpath(path).replace("//", "/")


def check_digest(value: str, field: str = "algorithm_digest") -> str:
    """``value`` when it is a content digest (``sha256:`` and 64 lowercase hex digits).

    Raises:
        InvalidSpec: anything else, naming ``field``.
    """
    if not re.match(DIGEST_PATTERN, value):
        raise InvalidSpec(
            f"{field} {value[:80]!r}: give an algorithm content as sha256: and 64 hex digits, as a "
            "job's algorithm_digest shows it",
            field=field,
        )
    return value


def account_of(run_as: RunAs | None) -> algorithm_content.Account | None:
    """The account a job's folders must be readable by (rule 8), from the backend's
    :meth:`~ma_jupyter.backends.base.Backend.job_account`; None: the service's own."""
    return None if run_as is None else algorithm_content.Account(run_as.uid, run_as.gid)


#: the most bytes of files changed since the submit read again at a job's first start (rule 5)
AT_START_READ_LIMIT = 64 << 20


def identified(spec: JobSpec, account: algorithm_content.Account | None = None) -> JobSpec:
    """``spec`` with the content of each algorithm folder it runs, read here (rule 5); whatever
    digests it came with are replaced (None where a folder cannot be read whole, or where an
    entry is not readable by ``account``, the job's: rule 8).  A folder holding a chain of
    folders too deep to walk raises :class:`~ma_jupyter.errors.FolderRefused` (the submit is
    refused with what to remove).  Call it
    once the backend's dry run has accepted the spec's folders, outside any lock (it reads
    files: a snapshot at the ship limit takes about a tenth of a second)."""
    read: dict[str, str | None] = {}

    def content(folder: str | None) -> str | None:
        if not folder:
            return None
        if folder not in read:  # batch tasks often share one folder
            read[folder] = algorithm_content.digest(folder, account)
        return read[folder]

    tasks = [task.model_copy(update={"algorithm_digest": content(task.algorithm)}) for task in spec.tasks]
    return spec.model_copy(update={"algorithm_digest": content(spec.algorithm), "tasks": tasks})


@dataclass
class Started:
    """What :func:`at_start` found: the spec with its digests, the folders whose content changed
    since the submit, and those not read again (more than :data:`AT_START_READ_LIMIT` bytes of
    changed files: their digest is None)."""

    spec: JobSpec
    changed: list[str]
    unread: list[str]


def reads_at_start(spec: JobSpec) -> bool:
    """Whether :func:`at_start` has a folder to read: one used as is (rule 5)."""
    return bool((spec.algorithm and not spec.algorithm_origin) or any(t.algorithm for t in spec.tasks))


def with_digests(spec: JobSpec, read: JobSpec) -> JobSpec:
    """``spec`` with the digests of ``read`` (what :func:`at_start` read from an earlier copy
    of it): whatever else changed meanwhile (its priority) is kept."""
    tasks = [
        t.model_copy(update={"algorithm_digest": r.algorithm_digest})
        for t, r in zip(spec.tasks, read.tasks, strict=False)
    ]
    return spec.model_copy(update={"algorithm_digest": read.algorithm_digest, "tasks": tasks})


def at_start(
    spec: JobSpec, account: algorithm_content.Account | None = None, read_limit: int | None = None
) -> Started:
    """Rule 5 when a job first starts (off the supervisor's lock: its launch waits for it on a
    thread of its own, :mod:`.supervisor.launch`): ``spec`` with the content of
    each folder it uses as is read again (a shipped snapshot, ``algorithm_origin`` set, never
    changes and is not), as ``account`` may read it (rule 8).  Unchanged files are remembered
    (:mod:`ma_jupyter.algorithm_content` rule 5): an unchanged folder costs a walk; at most
    ``read_limit`` (default :data:`AT_START_READ_LIMIT`) bytes of other files are read, for all
    the folders together."""
    budget = algorithm_content.ReadBudget(AT_START_READ_LIMIT if read_limit is None else read_limit)
    read: dict[str, str | None] = {}
    changed: list[str] = []
    unread: list[str] = []

    def content(folder: str | None, recorded: str | None) -> str | None:
        if not folder:
            return None
        if folder not in read:
            try:
                read[folder], cut = algorithm_content.digest_bounded(folder, account, budget)
            except FolderRefused:  # made too deep since the submit: unknown, as its start says
                read[folder], cut = None, False
            if cut:
                unread.append(folder)
            elif recorded is not None and read[folder] != recorded:
                changed.append(folder)
        return read[folder]

    update: dict = {}
    if spec.algorithm and not spec.algorithm_origin:
        update["algorithm_digest"] = content(spec.algorithm, spec.algorithm_digest)
    if spec.tasks:
        update["tasks"] = [
            t.model_copy(update={"algorithm_digest": content(t.algorithm, t.algorithm_digest)})
            for t in spec.tasks
        ]
    return Started(spec.model_copy(update=update), changed, unread)


class Favourites:
    """Each user's favourite algorithm folders (rule 3), in the store's database."""

    def __init__(self, store: Store):
        self.store = store  # whose schema holds the table (store_schema.py)

    def of(self, user: str) -> list[str]:
        """``user``'s favourites, oldest first."""
        query = (
            select(favourites_table.c.path)
            .where(favourites_table.c.user == user)
            .order_by(favourites_table.c.added, favourites_table.c.path)
        )
        with self.store.engine.connect() as conn:
            return [row[0] for row in conn.execute(query).all()]

    def add(self, user: str, path: str) -> str:
        """Mark ``path`` a favourite of ``user``; returns it normalised.

        Raises:
            InvalidSpec: not an absolute folder path.
            Conflict: the user has :data:`MAX_FAVOURITES` already.
        """
        path = normalise(path, "path")
        count = select(func.count()).select_from(favourites_table).where(favourites_table.c.user == user)
        with self.store.writing() as conn:  # the store's one writer (and its disk-full rule)
            exists = conn.execute(
                select(favourites_table.c.path).where(
                    favourites_table.c.user == user, favourites_table.c.path == path
                )
            ).first()
            if exists is not None:
                return path
            if conn.execute(count).scalar_one() >= MAX_FAVOURITES:
                raise Conflict(
                    f"{user} has {MAX_FAVOURITES} favourite algorithms, the most one user keeps: remove one first "
                    "(ma-jupyter algorithms unfavourite PATH)"
                )
            try:
                conn.execute(favourites_table.insert().values(user=user, path=path, added=time.time()))
            except IntegrityError:  # marked at the same moment by another request: the same
                pass
        return path

    def remove(self, user: str, path: str) -> bool:
        """Unmark ``path``; whether it was a favourite."""
        path = normalise(path, "path")
        with self.store.writing() as conn:
            result = conn.execute(
                delete(favourites_table).where(
                    favourites_table.c.user == user, favourites_table.c.path == path
                )
            )
        return bool(result.rowcount)


@dataclass
class Version:
    """One content a folder's jobs ran (rule 7): how many of them, and the newest one's submit
    time (epoch seconds)."""

    digest: str | None
    jobs: int
    last_used: float


def used_by(store: Store, user: str, limit: int = 500) -> dict[str, list[Version]]:
    """The algorithm folders of ``user``'s own jobs (the seed's "my algorithm volumes"), each with
    the contents its jobs ran, the most recently used first (rule 7); the ``limit`` most recently
    used groups are read."""
    query = (
        select(jobs_table.c.algorithms, func.count(), func.max(jobs_table.c.created))
        .where(jobs_table.c.creator == user, jobs_table.c.algorithms.is_not(None))
        .group_by(jobs_table.c.algorithms)
        .order_by(func.max(jobs_table.c.created).desc())
        .limit(limit)
    )
    found: dict[str, dict[str | None, Version]] = {}
    with store.engine.connect() as conn:
        for value, count, last in conn.execute(query).all():
            for path, digest in algorithm_folders.split(value):
                versions = found.setdefault(path, {})
                version = versions.setdefault(digest, Version(digest, 0, last))
                version.jobs += int(count)
                version.last_used = max(version.last_used, last)
    return {
        path: sorted(versions.values(), key=lambda v: v.last_used, reverse=True)
        for path, versions in found.items()
    }


def jobs_of(versions: list[Version]) -> int:
    """How many jobs ran these versions of a folder."""
    return sum(v.jobs for v in versions)
