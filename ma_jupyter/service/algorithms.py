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
"""

from __future__ import annotations

import posixpath
import time

from sqlalchemy import Column, Float, MetaData, String, Table, delete, func, select
from sqlalchemy.exc import IntegrityError

from ..errors import Conflict, InvalidSpec
from ..models import MAX_PATH
from . import algorithm_folders
from .store import Store, jobs_table

#: the most favourite algorithms one user keeps
MAX_FAVOURITES = 200

_metadata = MetaData()
favourites_table = Table(
    "favourite_algorithms",
    _metadata,
    Column("user", String, primary_key=True),
    Column("path", String, primary_key=True),
    Column("added", Float, nullable=False),
)


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


class Favourites:
    """Each user's favourite algorithm folders (rule 3), in the store's database."""

    def __init__(self, store: Store):
        self.store = store
        self._made = False

    def _table(self) -> None:
        """Create the table at first use (an older database lacks it; an app built without a
        store, to list its routes, never touches it)."""
        if not self._made:
            favourites_table.create(self.store.engine, checkfirst=True)
            self._made = True

    def of(self, user: str) -> list[str]:
        """``user``'s favourites, oldest first."""
        self._table()
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
        self._table()
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
        self._table()
        with self.store.writing() as conn:
            result = conn.execute(
                delete(favourites_table).where(
                    favourites_table.c.user == user, favourites_table.c.path == path
                )
            )
        return bool(result.rowcount)


def used_by(store: Store, user: str, limit: int = 500) -> dict[str, int]:
    """The algorithm folders of ``user``'s own jobs (the seed's "my algorithm volumes") with how
    many of their jobs use each; the ``limit`` most recently used groups are read."""
    query = (
        select(jobs_table.c.algorithms, func.count(), func.max(jobs_table.c.created))
        .where(jobs_table.c.creator == user, jobs_table.c.algorithms.is_not(None))
        .group_by(jobs_table.c.algorithms)
        .order_by(func.max(jobs_table.c.created).desc())
        .limit(limit)
    )
    counts: dict[str, int] = {}
    with store.engine.connect() as conn:
        for value, count, _last in conn.execute(query).all():
            for path in algorithm_folders.split(value):
                counts[path] = counts.get(path, 0) + int(count)
    return counts
