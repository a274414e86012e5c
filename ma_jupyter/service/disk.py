"""Telling a full disk apart, so a job ends with "disk full under <path>" and not a riddle.

A job whose disk fills up fails in many ways (a Python traceback, a lost node runner that could
not write its exit code, SQLite refusing a write); the one thing they share is a file system
with (almost) no space left.  The supervisor asks :func:`full_folder` about the folders a job
writes to, and reports the first full one.

Before it comes to that, the supervisor keeps a reserve on the jobs folder's disk
(``[limits] disk_reserve_mb``): :func:`disk_use` measures what each running job holds there, so
the one writing the most can be ended while the others still have room (see
:func:`ma_jupyter.service.policies.on_reserve`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from ..errors import FolderRefused
from ..foldersize import FolderSize, folder_size

#: a file system with less free space than this counts as full
FULL_BELOW = 256 << 10
#: submits are refused while the jobs folder has less free space than this (more than the
#: store's disk reserve, so that a reserve given up to record job ends is not used by new jobs)
SUBMIT_BELOW = 4 << 20
#: folders deep the reserve's measure walks (the walk is iterative: only entries bound it)
MEASURE_DEPTH = 1 << 20


def free_bytes(path: str | os.PathLike) -> int | None:
    """Bytes an unprivileged writer may still use on the file system of ``path`` (None if unknown)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def full_folder(paths: Iterable[str | os.PathLike], below: int = FULL_BELOW) -> Path | None:
    """The first of ``paths`` (existing folders; others are skipped) whose file system has less
    than ``below`` bytes free."""
    for path in paths:
        free = free_bytes(path)
        if free is not None and free < below:
            return Path(path)
    return None


def disk_use(folders: Iterable[str | os.PathLike], device: int) -> int:
    """Bytes the files below ``folders`` take on the file system ``device`` (its ``st_dev``):
    following no link, never crossing into another file system, each folder counted once (a
    job's default outputs lie inside its job folder).  A chain of folders of any depth is
    walked to its bottom (what a job hides there counts); past the walk's other bounds
    (:class:`~ma_jupyter.errors.FolderRefused`: too many entries, too slow) what was counted
    before is the answer, a lower bound."""
    try:
        found = folder_size(folders, device=device, allocated=True, follow_top=False, max_depth=MEASURE_DEPTH)
        return found.bytes
    except FolderRefused as exc:  # a lower bound, never an error that stops the reserve's watch
        return exc.counted.bytes if isinstance(exc.counted, FolderSize) else 0
