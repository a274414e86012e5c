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

from ..errors import RefusedFile
from ..untrusted import read_small

MAX_FILES = 300
MAX_FILE_BYTES = 2 << 20
MAX_TOTAL_BYTES = 16 << 20


def python_sources(root: Path) -> dict[str, str] | None:
    """Every ``.py`` file below ``root`` (hidden folders and ``__pycache__`` left out) as
    ``{relative path: text}``, or None when they cannot all be read within the bounds."""

    def unreadable(exc: OSError) -> None:
        raise exc  # a folder that cannot be listed may hide part of the code

    found: dict[str, str] = {}
    total = 0
    try:
        if root.is_symlink() or not root.is_dir():
            return None  # a folder swapped for a link since the submit: not read through it
        for folder, dirs, files in os.walk(root, onerror=unreadable):  # symlinked folders not entered
            dirs[:] = [d for d in dirs if not d.startswith(".") and d != "__pycache__"]
            for name in files:
                if not name.endswith(".py"):
                    continue
                rel = os.path.relpath(os.path.join(folder, name), root)
                data = read_small(root, rel, owner="the algorithm folder", limit=MAX_FILE_BYTES)
                total += len(data)
                if len(found) >= MAX_FILES or total > MAX_TOTAL_BYTES:
                    return None
                found[rel.replace(os.sep, "/")] = data.decode("utf-8")
    except (OSError, RefusedFile, UnicodeDecodeError):
        return None
    return found
