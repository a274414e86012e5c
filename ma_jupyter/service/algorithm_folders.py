"""A job's algorithm folders as the jobs table keeps them (rule 1 of :mod:`.algorithms`).

Below both the store (which writes the column with every job and filters on it) and
:mod:`.algorithms` (favourites and "my algorithm volumes", which read the store): the column's
format has this one owner, so neither of the two imports the other to learn it.

The column holds the job's folders, each normalised and between line breaks
(``"\\n/a\\n/b\\n"``), so :func:`matches` finds a folder by an exact, escaped substring test,
never by a prefix of a longer path.
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from typing import Any

from sqlalchemy import false, or_

from ..models import JobSpec


def folders(spec: JobSpec) -> list[str]:
    """The job's algorithm folders as its user knows them (a regular job's ``algorithm``, or
    the folder it was shipped from when it runs a snapshot: ``algorithm_origin``; each batch
    task's), normalised, in order, each once."""
    found = [spec.algorithm_origin or spec.algorithm] + [task.algorithm for task in spec.tasks]
    out: list[str] = []
    for path in found:
        if path and path.startswith("/") and "\n" not in path and "\r" not in path:
            normal = posixpath.normpath(path)
            if normal not in out:
                out.append(normal)
    return out


def column(spec: JobSpec) -> str | None:
    """The jobs table's ``algorithms`` value for ``spec`` (None: no algorithm)."""
    paths = folders(spec)
    return "\n" + "\n".join(paths) + "\n" if paths else None


def split(value: str) -> list[str]:
    """The folders of one ``algorithms`` column value (the inverse of :func:`column`)."""
    return value.strip("\n").split("\n")


def matches(column_value: Any, paths: Sequence[str]) -> Any:
    """The SQL condition: the job has one of ``paths`` (normalised) among its folders."""
    if not paths:
        return false()
    return or_(*(column_value.contains(f"\n{path}\n", autoescape=True) for path in paths))
