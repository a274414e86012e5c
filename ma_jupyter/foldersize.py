"""How much the files below a folder hold: the package's one folder-size walk.

Every measure of a folder goes through :func:`folder_size`: a node's logs (its runner's
watchdog), the algorithm folder a working copy or a Ray node receives, a user's cache, and what
each running job holds on a nearly full disk.  Its rules, whatever the caller:

1. No symbolic link is followed below the folders named (a job may plant one towards anything);
   each folder is opened through its parent's descriptor without following a link, so a folder
   swapped for a link during the walk is not entered either.  The folders named are entered
   through a link only with ``follow_top``.
2. Each folder is counted once, even when the folders named overlap (a job's default outputs lie
   inside its job folder).
3. What counts: the size of each regular file (its contents); with ``allocated``, the blocks of
   every entry that is not a folder (what the disk holds: links and empty files included).
4. ``device``: only what lies on that file system (its ``st_dev``); a folder on another one is
   not entered.
5. ``limit``: counting stops as soon as the total passes it (the answer is then over the limit,
   and no more); ``max_entries``: None as soon as more entries than that were seen (a job making
   files without end would make every look slower).
6. What cannot be read (gone meanwhile, no permission) counts as nothing; it never raises.

Standard library only: every node runner imports it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable


class FolderSize:
    """What :func:`folder_size` found: ``bytes`` (rule 3) and ``files``, the entries counted
    (regular files; with ``allocated``, every entry that is not a folder).

    A plain class, not a NamedTuple or a dataclass: every node runner imports this module, and
    ``typing`` or ``dataclasses`` would add milliseconds to each runner's start."""

    __slots__ = ("bytes", "files")

    def __init__(self, bytes: int, files: int):  # noqa: A002 (the name says what it counts)
        self.bytes = bytes
        self.files = files

    def __repr__(self) -> str:
        return f"FolderSize(bytes={self.bytes}, files={self.files})"


def folder_size(
    folders: Iterable[str | os.PathLike],
    *,
    limit: int | None = None,
    max_entries: int | None = None,
    device: int | None = None,
    allocated: bool = False,
    follow_top: bool = True,
) -> FolderSize | None:
    """The bytes and files below ``folders`` (the module's rules); None only past ``max_entries``."""
    total = files = entries = 0
    seen: set[tuple[int, int]] = set()
    for top in folders:
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | (0 if follow_top else os.O_NOFOLLOW)
        try:
            top_fd = os.open(top, flags)
        except OSError:
            continue
        try:
            st = os.fstat(top_fd)
            if (st.st_dev, st.st_ino) in seen or (device is not None and st.st_dev != device):
                continue
            seen.add((st.st_dev, st.st_ino))
            # fwalk opens each folder below through its parent's descriptor, never through a link
            for _path, dirs, names, dir_fd in os.fwalk(".", dir_fd=top_fd, follow_symlinks=False):
                entries += len(dirs) + len(names)
                if max_entries is not None and entries > max_entries:
                    return None
                kept = []
                for name in dirs + names:
                    try:
                        found = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                    except OSError:
                        continue
                    if device is not None and found.st_dev != device:
                        continue
                    if stat.S_ISDIR(found.st_mode):
                        if (found.st_dev, found.st_ino) not in seen:
                            seen.add((found.st_dev, found.st_ino))
                            kept.append(name)
                        continue
                    if allocated:
                        total += found.st_blocks * 512
                    elif stat.S_ISREG(found.st_mode):
                        total += found.st_size
                    else:
                        continue
                    files += 1
                    if limit is not None and total > limit:
                        return FolderSize(total, files)
                dirs[:] = kept  # links to folders, and folders seen or elsewhere, not entered
        finally:
            os.close(top_fd)
    return FolderSize(total, files)
