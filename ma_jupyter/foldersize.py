"""How much the files below a folder hold: the package's one folder walk (:func:`walk`), and
its one removal of a folder (:func:`remove_tree`).

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
   and no more).
6. What cannot be read (gone meanwhile, no permission) counts as nothing; it never raises.
   :func:`walk` tells ``onerror`` of each such error instead (which may raise to end the walk).
7. ``ignore(folder, names)`` (``shutil.copytree``'s shape: the folder's path, its entries' names)
   returns the names left out there, folders not entered: the size a filtered copy would have.
8. **Bounded, whatever a job made** (a chain of folders thousands deep, millions of names in one
   folder): the walk is iterative (an explicit stack, never recursion), holds at most
   :data:`HELD_FDS` descriptors whatever the depth, and refuses with
   :class:`~ma_jupyter.errors.FolderRefused` (the one error every caller handles) a folder
   more than ``max_depth`` (:data:`MAX_DEPTH`) folders below the one named, more than
   ``max_entries`` (:data:`MAX_ENTRIES`) names listed, ignored ones too, or a walk longer than
   ``max_seconds`` (:data:`MAX_SECONDS`).  A folder is listed lazily and each name counts as it
   is listed: a folder of a million names is refused after ``max_entries`` of them, not read
   whole first.

:func:`remove_tree` is the one removal of a folder a job or a user wrote (instead of
:func:`shutil.rmtree`, which recurses once per level and raises ``RecursionError`` on a deep
chain): through descriptors, following no link, any depth, and it never raises for what it finds.

Standard library only (and the package's bottom room, :mod:`ma_jupyter.errors`): every node
runner imports it.
"""

from __future__ import annotations

import errno
import itertools
import os
import stat
import time
from collections.abc import Callable, Iterable, Iterator

from .errors import FolderRefused

#: folders below the one named a walk enters at most (rule 8): far deeper than any real tree
MAX_DEPTH = 512
#: names a walk lists at most when its caller sets no lower bound (rule 8)
MAX_ENTRIES = 2_000_000
#: seconds a walk takes at most when its caller sets no lower bound (rule 8)
MAX_SECONDS = 120.0
#: descriptors a walk holds at most, whatever its ``max_depth`` (rule 8): of the folders on its
#: path with subfolders left to enter, the last :data:`_RECENT` and at most :data:`_CHECKPOINTS`
#: more, evenly spaced (every 16th within :data:`MAX_DEPTH`); a folder whose descriptor was
#: closed is opened again from the nearest one held, name by name
HELD_FDS = 64
_RECENT = 16
_CHECKPOINTS = 32
#: removal: folders deeper than this below the one removed are moved up to it first, so that a
#: chain of any depth is removed holding at most twice this many descriptors
_REMOVE_LEVELS = 24
#: removal: times a folder is listed again when entries appeared in it meanwhile
_REMOVE_ROUNDS = 5
#: removal: failures it names (it counts them all)
_REMOVE_NAMED = 20

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW


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


class _Folder:
    """One folder on the walk's path: its path below the folder named, its name in its parent,
    its identity, its descriptor (-1 while closed: rule 8) and the subfolders left to enter."""

    __slots__ = ("path", "name", "ident", "fd", "depth", "pending")

    def __init__(self, path: str, name: str, ident: tuple[int, int], fd: int, depth: int):
        self.path = path
        self.name = name
        self.ident = ident
        self.fd = fd
        self.depth = depth
        self.pending: list[str] = []


def _reopen(stack: list[_Folder], index: int) -> int:
    """The descriptor of ``stack[index]``, opened again from the nearest folder above it that
    still holds one, name by name without following a link; -1 when a folder on the way is no
    longer the one walked (swapped or gone meanwhile: its subfolders are not entered)."""
    start = index
    while stack[start].fd < 0:
        start -= 1
    fd = stack[start].fd
    for folder in stack[start + 1 : index + 1]:
        try:
            below = os.open(folder.name, _DIR_FLAGS, dir_fd=fd)
        except OSError:
            below = -1
        if fd != stack[start].fd:
            os.close(fd)
        if below < 0:
            return -1
        st = os.fstat(below)
        if (st.st_dev, st.st_ino) != folder.ident:
            os.close(below)
            return -1
        fd = below
    stack[index].fd = fd
    return fd


def walk(
    folders: Iterable[str | os.PathLike],
    *,
    device: int | None = None,
    follow_top: bool = True,
    ignore: Callable[[str, list[str]], set[str]] | None = None,
    onerror: Callable[[OSError], None] | None = None,
    max_entries: int | None = None,
    max_depth: int = MAX_DEPTH,
    max_seconds: float | None = None,
) -> Iterator[tuple[str, int, list[tuple[str, os.stat_result]]]]:
    """Each folder below ``folders`` (rules 1, 2, 4, 6, 7 and 8), top-down, as
    ``(path, dir_fd, entries)``: its path relative to the folder named (``.``, ``./sub``), a
    descriptor of it valid until the next step (open its entries through it, never by path), and
    its entries kept that are not folders, each with its ``lstat``.  Which folders below are
    entered is the walk's, not the caller's.  ``max_entries`` and ``max_seconds`` None: the
    module's bounds (:data:`MAX_ENTRIES`, :data:`MAX_SECONDS`).

    Raises:
        FolderRefused: past ``max_entries`` names listed (ignored ones too: checked as each
            is listed, before any of the folder that passed it is looked at), a folder to
            enter more than ``max_depth`` folders deep, or past ``max_seconds``.
    """
    limit = MAX_ENTRIES if max_entries is None else max_entries
    every = max(1, max_depth // _CHECKPOINTS)  # the depths whose descriptors are kept
    deadline = time.monotonic() + (MAX_SECONDS if max_seconds is None else max_seconds)
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
        stack: list[_Folder] = []
        try:
            st = os.fstat(top_fd)
            if (st.st_dev, st.st_ino) in seen or (device is not None and st.st_dev != device):
                continue
            seen.add((st.st_dev, st.st_ino))
            stack.append(_Folder(".", ".", (st.st_dev, st.st_ino), top_fd, 0))
            entering = True  # the folder on top of the stack is still to be listed
            while stack:
                folder = stack[-1]
                if entering:
                    entering = False
                    names: list[str] = []
                    try:
                        with os.scandir(folder.fd) as listing:
                            for entry in listing:  # lazily: the bound is checked per name
                                listed += 1
                                if listed > limit:
                                    raise _refused(
                                        f"{top}: more than {limit} files and folders below it; "
                                        "remove some (or most) of them",
                                        "entries",
                                    )
                                if listed & 1023 == 0 and time.monotonic() > deadline:
                                    raise _too_slow(top, max_seconds)
                                names.append(entry.name)
                    except OSError as exc:
                        if onerror is not None:
                            onerror(exc)
                        stack.pop()
                        _close(folder, top_fd)
                        continue
                    skipped = (
                        ignore(os.path.normpath(os.path.join(top, folder.path)), names) if ignore else ()
                    )
                    found: list[tuple[str, os.stat_result]] = []
                    for name in names:
                        if name in skipped:
                            continue
                        try:
                            entry = os.stat(name, dir_fd=folder.fd, follow_symlinks=False)
                        except OSError as exc:
                            if onerror is not None:
                                onerror(exc)
                            continue
                        if device is not None and entry.st_dev != device:
                            continue
                        if stat.S_ISDIR(entry.st_mode):
                            # links to folders, and folders seen or elsewhere, not entered
                            if (entry.st_dev, entry.st_ino) not in seen:
                                seen.add((entry.st_dev, entry.st_ino))
                                folder.pending.append(name)
                            continue
                        found.append((name, entry))
                    folder.pending.reverse()  # entered in the order listed
                    yield folder.path, folder.fd, found
                    continue
                if not folder.pending:
                    stack.pop()
                    _close(folder, top_fd)
                    continue
                if time.monotonic() > deadline:
                    raise _too_slow(top, max_seconds)
                name = folder.pending.pop()
                fd = folder.fd if folder.fd >= 0 else _reopen(stack, len(stack) - 1)
                if fd < 0:
                    folder.pending.clear()  # swapped or gone meanwhile: nothing below is entered
                    continue
                try:
                    below = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:  # gone, or swapped for a link (never followed)
                    if onerror is not None:
                        onerror(exc)
                    continue
                if not folder.pending and folder.fd != top_fd:
                    os.close(folder.fd)  # nothing more to enter from it: a chain holds two
                    folder.fd = -1
                st = os.fstat(below)
                if not stat.S_ISDIR(st.st_mode) or (device is not None and st.st_dev != device):
                    os.close(below)
                    continue
                if folder.depth + 1 > max_depth:
                    os.close(below)
                    raise _refused(
                        f"{top}: a chain of folders more than {max_depth} deep below it "
                        f"({os.path.join(folder.path, name)[:40]}...); remove it",
                        "depth",
                    )
                stack.append(
                    _Folder(
                        os.path.join(folder.path, name), name, (st.st_dev, st.st_ino), below, folder.depth + 1
                    )
                )
                entering = True
                # rule 8: the descriptors held are bounded, whatever the depth
                if len(stack) > _RECENT:
                    old = stack[-1 - _RECENT]
                    if old.fd >= 0 and old.depth % every and old.fd != top_fd:
                        os.close(old.fd)
                        old.fd = -1
        finally:
            for folder in stack:
                _close(folder, top_fd)
            os.close(top_fd)


def _close(folder: _Folder, top_fd: int) -> None:
    if folder.fd >= 0 and folder.fd != top_fd:
        os.close(folder.fd)
    folder.fd = -1


def _too_slow(top: str | os.PathLike, max_seconds: float | None) -> FolderRefused:
    seconds = MAX_SECONDS if max_seconds is None else max_seconds
    return _refused(
        f"{top}: walking the folders below it took more than {seconds:g} s; remove some of them", "seconds"
    )


def _refused(message: str, bound: str) -> FolderRefused:
    refused = FolderRefused(message)
    refused.bound = bound
    return refused


def folder_size(
    folders: Iterable[str | os.PathLike],
    *,
    limit: int | None = None,
    max_entries: int | None = None,
    max_depth: int = MAX_DEPTH,
    max_seconds: float | None = None,
    device: int | None = None,
    allocated: bool = False,
    follow_top: bool = True,
    ignore: Callable[[str, list[str]], set[str]] | None = None,
) -> FolderSize:
    """The bytes and files below ``folders`` (the module's rules).

    Raises:
        FolderRefused: past a bound of rule 8; its ``counted`` is what was counted before.
    """
    total = files = 0
    folders_below = walk(
        folders,
        device=device,
        follow_top=follow_top,
        ignore=ignore,
        max_entries=max_entries,
        max_depth=max_depth,
        max_seconds=max_seconds,
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
    except FolderRefused as exc:
        exc.counted = FolderSize(total, files)
        raise
    finally:
        folders_below.close()  # its descriptors now, not when the generator is collected
    return FolderSize(total, files)


class Removal:
    """What :func:`remove_tree` did: ``removed`` entries; ``failures`` it could not remove, the
    first :data:`_REMOVE_NAMED` of them named in ``failed`` (path below the folder, why);
    ``complete``: the folder named is gone."""

    __slots__ = ("removed", "failures", "failed", "complete")

    def __init__(self) -> None:
        self.removed = 0
        self.failures = 0
        self.failed: list[tuple[str, str]] = []
        self.complete = False

    def _fail(self, path: str, exc: OSError) -> None:
        self.failures += 1
        if len(self.failed) < _REMOVE_NAMED:
            self.failed.append((path, exc.strerror or str(exc)))

    def __repr__(self) -> str:
        return f"Removal(removed={self.removed}, failures={self.failures}, complete={self.complete})"


class _Emptying:
    """One folder being emptied by :func:`remove_tree`: its name in its parent, descriptor and
    listing, and how often it was listed."""

    __slots__ = ("name", "path", "fd", "listing", "again", "moved_in", "rounds")

    def __init__(self, name: str, path: str, fd: int):
        self.name = name
        self.path = path
        self.fd = fd
        self.listing = None
        self.again = False
        self.moved_in = False  # folders moved up here (rule 2): listed again, not a round
        self.rounds = 0


def remove_tree(path: str | os.PathLike, *, max_seconds: float | None = None) -> Removal:
    """Remove ``path`` and all below it, whatever a job made there; never raises for it.

    1. No link is followed, the named one included (a link named is removed, not its target);
       every entry is removed through its folder's descriptor, so a folder swapped for a link
       meanwhile is not entered.
    2. Any depth, iteratively: a folder more than :data:`_REMOVE_LEVELS` below ``path`` is first
       moved up to ``path`` itself (a rename within the folder removed), so the descriptors held
       stay bounded and a chain of any depth goes, level by level.
    3. Nothing on another file system than ``path``'s is entered (a mount point below it).
    4. What cannot be removed (no permission, a mount point, an entry another process keeps
       adding to) is counted and named in the answer (:class:`Removal`), and the rest is removed
       still; ``max_seconds`` (None: no bound) stops it early, saying so (``complete`` false).
    """
    done = Removal()
    deadline = None if max_seconds is None else time.monotonic() + max_seconds
    path = os.fspath(path)
    try:
        root_fd = os.open(path, _DIR_FLAGS)
    except FileNotFoundError:
        done.complete = True
        return done
    except OSError:  # a link, a file, or a folder it may not open
        try:
            os.unlink(path)
            done.removed += 1
            done.complete = True
        except FileNotFoundError:
            done.complete = True
        except OSError as exc:
            done._fail(".", exc)
        return done
    moved = itertools.count()
    device = os.fstat(root_fd).st_dev
    stack = [_Emptying(".", ".", root_fd)]
    try:
        while stack:
            folder = stack[-1]
            if deadline is not None and time.monotonic() > deadline:
                return done
            if folder.listing is None:
                try:
                    folder.listing = os.scandir(folder.fd)
                except OSError as exc:
                    done._fail(folder.path, exc)
                    folder.listing = iter(())
                folder.rounds += 1
            entry = next(folder.listing, None)
            if entry is None:  # this folder is listed to its end
                if hasattr(folder.listing, "close"):
                    folder.listing.close()
                folder.listing = None
                if folder.moved_in or (folder.again and folder.rounds < _REMOVE_ROUNDS):
                    if folder.moved_in:
                        folder.rounds -= 1  # progress (rule 2), not another try
                    folder.again = folder.moved_in = False
                    continue  # entries moved or made here meanwhile: list it again
                stack.pop()
                if folder.fd != root_fd:
                    os.close(folder.fd)
                if stack:
                    try:
                        os.rmdir(folder.name, dir_fd=stack[-1].fd)
                        done.removed += 1
                    except FileNotFoundError:
                        pass
                    except OSError as exc:
                        if stack[-1].rounds < _REMOVE_ROUNDS and _not_empty(exc):
                            stack[-1].again = True  # written to meanwhile: once more
                        else:
                            done._fail(folder.path, exc)
                continue
            name = entry.name
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                is_dir = False
            if not is_dir:
                try:
                    os.unlink(name, dir_fd=folder.fd)
                    done.removed += 1
                except FileNotFoundError:
                    pass
                except IsADirectoryError:  # swapped for a folder meanwhile
                    folder.again = True
                except OSError as exc:
                    done._fail(os.path.join(folder.path, name), exc)
                continue
            if len(stack) > _REMOVE_LEVELS:  # rule 2: moved up, emptied from there later
                try:
                    os.rename(
                        name,
                        f".removing-{os.getpid()}-{next(moved)}",
                        src_dir_fd=folder.fd,
                        dst_dir_fd=root_fd,
                    )
                    stack[0].moved_in = True
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    done._fail(os.path.join(folder.path, name), exc)
                continue
            try:
                below = os.open(name, _DIR_FLAGS, dir_fd=folder.fd)
            except FileNotFoundError:
                continue
            except OSError as exc:
                if _is_link(exc):  # swapped for a link meanwhile: the link goes
                    folder.again = True
                else:
                    done._fail(os.path.join(folder.path, name), exc)
                continue
            if os.fstat(below).st_dev != device:  # a mount point: what lies there is not the tree's
                os.close(below)
                done._fail(os.path.join(folder.path, name), OSError(errno.EXDEV, "another file system"))
                continue
            stack.append(_Emptying(name, os.path.join(folder.path, name), below))
    finally:
        for folder in stack:
            if folder.listing is not None and hasattr(folder.listing, "close"):
                folder.listing.close()
            if folder.fd != root_fd:
                os.close(folder.fd)
        os.close(root_fd)
    try:
        os.rmdir(path)
        done.removed += 1
        done.complete = True
    except FileNotFoundError:
        done.complete = True
    except OSError as exc:
        done._fail(".", exc)
    return done


def _not_empty(exc: OSError) -> bool:
    return exc.errno in (errno.ENOTEMPTY, errno.EEXIST)


def _is_link(exc: OSError) -> bool:
    return exc.errno in (errno.ELOOP, errno.ENOTDIR)
