"""A job's algorithm folders and contents as the jobs table keeps them (rule 1 of :mod:`.algorithms`).

Below both the store (which writes the column with every job and filters on it) and
:mod:`.algorithms` (favourites and "my algorithm volumes", which read the store): the column's
format has this one owner, so neither of the two imports the other to learn it.

The column holds one line per folder of the job (normalised: ``/a/b``), each followed by a line
with the content the job ran from it when that is known (``sha256:...``, never starting with
``/``), all between line breaks (``"\\n/a\\nsha256:...\\n/b\\n"``), so :func:`matches` finds a
folder or a content by an exact, escaped substring test, never by a prefix of a longer path.
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from typing import Any

from sqlalchemy import false, or_

from ..models import JobSpec


def identities(spec: JobSpec) -> list[tuple[str, str | None]]:
    """The job's algorithm folders as its user knows them (a regular job's ``algorithm``, or
    the folder it was shipped from when it runs a snapshot: ``algorithm_origin``; each batch
    task's), normalised, in order, each once, with the content the job ran from it (None:
    not known)."""
    found = [(spec.algorithm_origin or spec.algorithm, spec.algorithm_digest)]
    found += [(task.algorithm, task.algorithm_digest) for task in spec.tasks]
    out: dict[str, str | None] = {}
    for path, digest in found:
        if path and path.startswith("/") and "\n" not in path and "\r" not in path:
            normal = posixpath.normpath(path)
            if normal not in out:
                out[normal] = digest
    return list(out.items())


def folders(spec: JobSpec) -> list[str]:
    """The job's algorithm folders (those of :func:`identities`)."""
    return [path for path, _ in identities(spec)]


def column(spec: JobSpec) -> str | None:
    """The jobs table's ``algorithms`` value for ``spec`` (None: no algorithm)."""
    lines = [line for path, digest in identities(spec) for line in (path, digest) if line]
    return "\n" + "\n".join(lines) + "\n" if lines else None


def split(value: str) -> list[tuple[str, str | None]]:
    """The folders of one ``algorithms`` column value, each with its content (None: not known):
    the inverse of :func:`column`."""
    out: list[tuple[str, str | None]] = []
    for line in value.strip("\n").split("\n"):
        if line.startswith("/"):
            out.append((line, None))
        elif out and out[-1][1] is None:
            out[-1] = (out[-1][0], line)
    return out


def matches(column_value: Any, wanted: Sequence[str]) -> Any:
    """The SQL condition: the job has one of ``wanted`` among its folders (normalised paths) or
    among the contents it ran (digests)."""
    if not wanted:
        return false()
    return or_(*(column_value.contains(f"\n{value}\n", autoescape=True) for value in wanted))
