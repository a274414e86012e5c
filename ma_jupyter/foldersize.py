"""How much the files below a folder hold: the package's one folder walk (:func:`walk`).

Every measure of a folder goes through :func:`folder_size`: a node's logs (its runner's
watchdog), the algorithm folder a working copy or a Ray node receives, a user's cache, and what
each running job holds on a nearly full disk; the content identity of an algorithm folder
(:mod:`ma_jupyter.algorithm_content`) reads the same walk.  Its rules, whatever the caller:

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
   :func:`walk` tells ``onerror`` of each such error instead (which may raise to end the walk).
7. ``ignore(folder, names)`` (``shutil.copytree``'s shape: the folder's path, its entries' names)
   returns the names left out there, folders not entered: the size a filtered copy would have.

Standard library only: every node runner imports it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable, Iterator


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


class TooManyEntries(Exception):
    """:func:`walk` saw more entries than its ``max_entries``."""


def walk(
    folders: Iterable[str | os.PathLike],
    *,
    device: int | None = None,
    follow_top: bool = True,
    ignore: Callable[[str, list[str]], set[str]] | None = None,
    onerror: Callable[[OSError], None] | None = None,
    max_entries: int | None = None,
) -> Iterator[tuple[str, int, list[tuple[str, os.stat_result]]]]:
    """Each folder below ``folders`` (rules 1, 2, 4, 5's ``max_entries``, 6 and 7), top-down, as
    ``(path, dir_fd, entries)``: its path relative to the folder named (``.``, ``./sub``), a
    descriptor of it valid until the next step (open its entries through it, never by path), and
    its entries kept that are not folders, each with its ``lstat``.  Which folders below are
    entered is the walk's, not the caller's.

    Raises:
        TooManyEntries: more than ``max_entries`` names were listed (ignored ones too), before
            any of the folder that passed it is looked at.
    """
    seen: set[tuple[int, int]] = set()
    listed = 0
    for top in folders:
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | (0 if follow_top else os.O_NOFOLLOW)
        try:
            top_fd = os.open(top, flags)
        except OSError as exc:
            if onerror is not None:
                onerror(exc)
            continue
        try:
            st = os.fstat(top_fd)
            if (st.st_dev, st.st_ino) in seen or (device is not None and st.st_dev != device):
                continue
            seen.add((st.st_dev, st.st_ino))
            # fwalk opens each folder below through its parent's descriptor, never through a link
            for path, dirs, names, dir_fd in os.fwalk(
                ".", dir_fd=top_fd, follow_symlinks=False, onerror=onerror
            ):
                listed += len(dirs) + len(names)
                if max_entries is not None and listed > max_entries:
                    raise TooManyEntries(f"more than {max_entries} entries below {top}")
                skipped = ignore(os.path.normpath(os.path.join(top, path)), dirs + names) if ignore else ()
                kept: list[str] = []
                found: list[tuple[str, os.stat_result]] = []
                for name in dirs + names:
                    if name in skipped:
                        continue
                    try:
                        entry = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                    except OSError as exc:
                        if onerror is not None:
                            onerror(exc)
                        continue
                    if device is not None and entry.st_dev != device:
                        continue
                    if stat.S_ISDIR(entry.st_mode):
                        if (entry.st_dev, entry.st_ino) not in seen:
                            seen.add((entry.st_dev, entry.st_ino))
                            kept.append(name)
                        continue
                    found.append((name, entry))
                dirs[:] = kept  # links to folders, and folders seen or elsewhere, not entered
                yield path, dir_fd, found
        finally:
            os.close(top_fd)


def folder_size(
    folders: Iterable[str | os.PathLike],
    *,
    limit: int | None = None,
    max_entries: int | None = None,
    device: int | None = None,
    allocated: bool = False,
    follow_top: bool = True,
    ignore: Callable[[str, list[str]], set[str]] | None = None,
) -> FolderSize | None:
    """The bytes and files below ``folders`` (the module's rules); None only past ``max_entries``."""
    total = files = 0
    folders_below = walk(
        folders, device=device, follow_top=follow_top, ignore=ignore, max_entries=max_entries
    )
    try:
        for _path, _dir_fd, found in folders_below:
            for _name, entry in found:
                if allocated:
                    total += entry.st_blocks * 512
                elif stat.S_ISREG(entry.st_mode):
                    total += entry.st_size
                else:
                    continue
                files += 1
                if limit is not None and total > limit:
                    return FolderSize(total, files)
    except TooManyEntries:
        return None
    finally:
        folders_below.close()  # its descriptors now, not when the generator is collected
    return FolderSize(total, files)
