"""The Python sources of a job's algorithm folder, read for advice (see
:mod:`ma_jupyter.modes.single_copy`), never to run anything.

The folder is the user's, not the job's, but it is read like a job's files
(:mod:`ma_jupyter.untrusted`): no symlink followed (folders or files), no FIFO opened, every file
and the whole bounded.  Anything that stops a complete read (too many files, a large file, an
unlistable folder, a symlink, a file that is not UTF-8) gives None: the caller cannot be sure
of the code, so it says nothing about it.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import FolderRefused, RefusedFile
from ..foldersize import walk
from ..untrusted import read_small

MAX_FILES = 300
MAX_FILE_BYTES = 2 << 20
MAX_TOTAL_BYTES = 16 << 20
#: names the walk lists at most (hidden and cache folders left out)
MAX_ENTRIES = 50_000


def python_sources(root: Path) -> dict[str, str] | None:
    """Every ``.py`` file below ``root`` (hidden folders and ``__pycache__`` left out) as
    ``{relative path: text}``, or None when they cannot all be read within the bounds."""

    def unreadable(exc: OSError) -> None:
        raise exc  # a folder that cannot be listed may hide part of the code

    def skipped(folder: str, names: list[str]) -> set[str]:
        # hidden folders and __pycache__ (an lstat by path: a link is never a folder here)
        return {
            n
            for n in names
            if (n.startswith(".") or n == "__pycache__")
            and os.path.isdir(os.path.join(folder, n))
            and not os.path.islink(os.path.join(folder, n))
        }

    found: dict[str, str] = {}
    total = 0
    try:
        if root.is_symlink() or not root.is_dir():
            return None  # a folder swapped for a link since the submit: not read through it
        # the one bounded, iterative walk (no link followed): a deep chain is refused, not recursed
        folders = walk([root], follow_top=False, ignore=skipped, onerror=unreadable, max_entries=MAX_ENTRIES)
        for folder, _dir_fd, files in folders:
            for name, _entry in files:
                if not name.endswith(".py"):
                    continue  # a .py link is read_small's refusal: the code is then not known whole
                rel = os.path.normpath(os.path.join(folder, name))
                data = read_small(root, rel, owner="the algorithm folder", limit=MAX_FILE_BYTES)
                total += len(data)
                if len(found) >= MAX_FILES or total > MAX_TOTAL_BYTES:
                    return None
                found[rel.replace(os.sep, "/")] = data.decode("utf-8")
    except (OSError, RefusedFile, FolderRefused, UnicodeDecodeError):
        return None
    return found
