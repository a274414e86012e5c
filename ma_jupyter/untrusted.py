"""Files and folders a job could have written: used without trusting them.

A job can write below its own log folder (``<job_dir>/logs/<node>/`` is ``/job/logs``), its
outputs and volumes, and, in the symlink mode, anywhere the service's user can.  What it leaves
there may be a FIFO (an ``open()`` blocks forever), a symlink (to the service's token, say), a
device, a hard link or a file of many gigabytes.  The service therefore never opens such a
path the ordinary way; it uses this module, which:

* walks every component below a trusted folder with ``O_NOFOLLOW`` through ``dir_fd``, so no
  symlink below that folder is followed, not even one in the middle of the path;
* opens the file itself with ``O_NOFOLLOW | O_NONBLOCK`` and keeps it only when ``fstat`` says it
  is a regular file with one name (and, for whole-file reads, of bounded size);
* creates folder chains the same way (``mkdirat`` + ``O_NOFOLLOW | O_DIRECTORY``), refusing any
  component that is a symlink or not a folder.

Every refusal is a :class:`~ma_jupyter.errors.RefusedFile` whose message says what the job did,
e.g. ``worker-0 left a FIFO at /job/logs/failure.json``.  None of these calls can block on a
file the job controls; they are plain system calls on a local disk (still, callers in the
service's event loop run them on a thread).
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Callable, Iterable
from pathlib import Path, PurePosixPath

from .errors import RefusedFile
from .jobdir import FAILURE_REPORT, RANK_LOG_VIEW

#: largest small report (``failure.json``) read whole
MAX_REPORT = 64 << 10
#: how a folder is opened below one a job or user may write: a link in its place is not followed
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


def describe(mode: int) -> str:
    """What kind of file ``mode`` (an ``st_mode``) is, as a phrase: "a FIFO", "a symbolic link"..."""
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device file"
    if stat.S_ISDIR(mode):
        return "a folder"
    return "a special file"


def _parts(relative: str | os.PathLike) -> tuple[str, ...]:
    parts = PurePosixPath(relative).parts
    if not parts or PurePosixPath(relative).is_absolute() or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"{relative!r} is not a plain relative path")
    return parts


def _refuse(owner: str, what: str, shown: str, detail: str = "") -> RefusedFile:
    return RefusedFile(f"{owner} left {what} at {shown}{detail}: the service does not read or follow it")


def _kind_at(dir_fd: int, name: str) -> str:
    try:
        return describe(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return "something that is not a folder"


def descend(fd: int, parts: Iterable[str], open_part: Callable[[int, str], int]) -> int:
    """The folder ``parts`` below the open folder ``fd``, one part at a time: ``open_part(dir_fd,
    part)`` opens each from the one above (with :data:`DIR_FLAGS`, so never through a link the
    job left, making it where the caller makes folders) and raises the caller's error for a part
    it refuses.  ``fd`` is the descent's: each folder is closed once the next is open, and the
    one held is closed on any failure, so no descriptor is left behind either way."""
    try:
        for part in parts:
            nxt = open_part(fd, part)
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def _walk(root: Path, parts: tuple[str, ...], owner: str, shown: str) -> int:
    """An fd of the folder ``root/parts...``; no component below ``root`` may be a symlink."""

    def open_part(fd: int, part: str) -> int:
        try:
            return os.open(part, DIR_FLAGS, dir_fd=fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise _refuse(owner, _kind_at(fd, part), shown, f" (in place of the folder {part})") from None
            raise

    # root itself is trusted
    return descend(os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), parts, open_part)


def open_file(
    root: Path, relative: str | os.PathLike, *, owner: str = "the job", shown: str | None = None
) -> int:
    """Open ``root/relative`` for reading without trusting anything below ``root``.

    Args:
        root: a folder the service trusts (e.g. the job's folder, which the job cannot replace).
        relative: the file's path below ``root``; no component may be a symlink.
        owner: who could have written it, for the message ("worker-0").
        shown: how to name the file in the message (e.g. its in-sandbox path); default the host path.

    Returns:
        A file descriptor of a regular file with a single name (the caller closes it).

    Raises:
        FileNotFoundError: it (or a folder on the way) does not exist.
        RefusedFile: a component is a symlink or not a folder, or the file is not a regular file
            (FIFO, socket, device, symlink, folder) or has more than one name (a hard link).
    """
    parts = _parts(relative)
    shown = shown or str(Path(root, *parts))
    dir_fd = _walk(root, parts[:-1], owner, shown)
    try:
        before = os.stat(parts[-1], dir_fd=dir_fd, follow_symlinks=False)
        if not stat.S_ISREG(before.st_mode):  # looked at first: opening a device may do something
            raise _refuse(owner, describe(before.st_mode), shown)
        try:
            fd = os.open(parts[-1], _FILE_FLAGS, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # swapped for a symlink since the look
                raise _refuse(owner, "a symbolic link", shown) from None
            raise
    finally:
        os.close(dir_fd)
    st = os.fstat(fd)
    problem = None
    if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (before.st_dev, before.st_ino):
        problem = describe(st.st_mode) if not stat.S_ISREG(st.st_mode) else "a file swapped while opening it"
    elif st.st_nlink > 1:
        problem = f"a hard link ({st.st_nlink} names for one file)"
    if problem:
        os.close(fd)
        raise _refuse(owner, problem, shown)
    return fd


def pread_range(fd: int, offset: int, limit: int) -> tuple[bytes, int]:
    """At most ``limit`` bytes of an open regular file from ``offset``; (data, size of the file now)."""
    size = os.fstat(fd).st_size
    if offset >= size or limit <= 0:
        return b"", size
    want = min(limit, size - offset)
    chunks = []
    while want > 0:
        data = os.pread(fd, want, offset)
        if not data:
            break
        chunks.append(data)
        offset += len(data)
        want -= len(data)
    return b"".join(chunks), size


def read_small(
    root: Path,
    relative: str | os.PathLike,
    *,
    owner: str = "the job",
    shown: str | None = None,
    limit: int = MAX_REPORT,
) -> bytes:
    """The whole content of a small file a job could have written (see :func:`open_file`).

    Raises:
        FileNotFoundError: it does not exist.
        RefusedFile: as :func:`open_file`, or it is larger than ``limit`` bytes.
    """
    fd = open_file(root, relative, owner=owner, shown=shown)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise _refuse(
                owner, f"a file of {size} bytes", shown or str(Path(root, relative)), f" (at most {limit})"
            )
        data, _ = pread_range(fd, 0, limit)
        return data
    finally:
        os.close(fd)


def make_dirs(
    path: Path,
    *,
    trusted: Path,
    mode: int = 0o755,
    owner: str = "a job",
    chown: tuple[int, int] | None = None,
) -> None:
    """Create the folder ``path`` and its missing parents below ``trusted``, following no symlink.

    Every component below ``trusted`` is created with ``mkdirat`` or opened with
    ``O_NOFOLLOW | O_DIRECTORY``, so a symlink planted there (``ln -s /elsewhere
    <outputs>/report-0``) is refused instead of redirecting the folder.

    Args:
        path: the folder to create; must be ``trusted`` or lie below it.
        trusted: an existing folder the service trusts (symlinks up to it are the user's own).
        mode: permissions of created folders (before the umask).
        owner: who could have planted something, for the message.
        chown: (uid, gid) to give ``path`` itself to, through the descriptor just opened without
            following any symlink (never by its name, which a job could redirect meanwhile).

    Raises:
        RefusedFile: a component below ``trusted`` is a symlink or not a folder.
        ValueError: ``path`` is not below ``trusted``.
    """
    path, trusted = Path(path), Path(trusted)
    if path == trusted:
        parts: tuple[str, ...] = ()
    else:
        parts = _parts(path.relative_to(trusted))
    fd = os.open(trusted, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts:
            try:
                os.mkdir(part, mode, dir_fd=fd)
            except FileExistsError:
                pass
            try:
                nxt = os.open(part, DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise RefusedFile(
                        f"{owner} left {_kind_at(fd, part)} at {path.parent if part == parts[-1] else trusted}/{part}"
                        f" where the folder {path} must be created: refusing to create it through that"
                    ) from None
                raise
            os.close(fd)
            fd = nxt
        if chown is not None:
            os.fchown(fd, *chown)
    finally:
        os.close(fd)


def real_ancestor(path: Path) -> Path:
    """The deepest existing ancestor of ``path`` (``path``'s parent or above) reached without any
    symlink: where :func:`make_dirs` can start when only the folders above ``path`` that the
    user named (already resolved when the job was submitted) are trusted."""
    folder = Path(path).parent
    while folder != folder.parent and not (folder.is_dir() and os.path.realpath(folder) == str(folder)):
        folder = folder.parent
    return folder


def collect_report(
    rank_log_dir: Path, node_dir: Path, node: str, name: str = FAILURE_REPORT, shown: str = RANK_LOG_VIEW
) -> None:
    """Hand a launcher's report ``name`` (``failure.json``, ``not-distributed.json``) from the
    job-writable rank-log folder to the node folder.

    Only a small regular file with one name is moved (``rename`` never follows a symlink);
    anything else stays where it is and ``node_dir/<name>`` records what the job left
    (``{"refused": "worker-0 left a FIFO at /job/logs/failure.json ..."}``).
    """
    report = Path(rank_log_dir) / name
    shown = f"{shown}/{name}"
    try:
        st = os.lstat(report)
    except OSError:
        return
    target = Path(node_dir) / name
    if stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and st.st_size <= MAX_REPORT:
        try:
            os.replace(report, target)
        except OSError:
            pass
        return
    what = (
        describe(st.st_mode)
        if not stat.S_ISREG(st.st_mode)
        else (f"a hard link ({st.st_nlink} names)" if st.st_nlink > 1 else f"a file of {st.st_size} bytes")
    )
    message = f"{node} left {what} at {shown}: the service did not read it"
    tmp = target.with_name(target.name + ".tmp")
    try:
        with open(tmp, "w") as fh:
            json.dump({"refused": message}, fh)
        os.replace(tmp, target)
    except OSError:
        pass


# ---------------------------------------------------------------------------- datasets
#
# Data preparation copies a dataset that jobs may have written (a writable volume of another
# job, a folder a user fills).  The walk below is what the copy process runs, after it switched
# to the job's account (``nodehost/datacopy.py``); it follows the same rules as above:
# only regular files, folders and symbolic links (copied as links, never followed), every
# entry opened relative to its folder's descriptor with ``O_NOFOLLOW | O_NONBLOCK`` and
# checked with ``fstat`` after the open.

#: the kinds a dataset may hold; anything else is refused (see :func:`open_dataset`)
DATASET_KINDS = "regular files, folders and symbolic links"


def _dataset_refusal(shown: str, mode: int) -> RefusedFile:
    return RefusedFile(
        f"{shown} is {describe(mode)}: data preparation copies only {DATASET_KINDS} "
        "(kept as links); remove it from the dataset, or submit without data preparation"
    )


def open_dataset(path: str | os.PathLike) -> int:
    """Open the root of a dataset, a folder or a regular file, without blocking on it.

    ``path`` is resolved already (its last component is not followed if it became a symlink
    since).  A FIFO, socket or device is refused before it is opened (opening a device may
    act); the open itself uses ``O_NONBLOCK`` and its ``fstat`` must match the look.

    Raises:
        FileNotFoundError: nothing is there.
        RefusedFile: it is neither a folder nor a regular file (the message names it).
    """
    before = os.lstat(path)
    if not (stat.S_ISDIR(before.st_mode) or stat.S_ISREG(before.st_mode)):
        raise _dataset_refusal(str(path), before.st_mode)
    try:
        fd = os.open(path, _FILE_FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _dataset_refusal(str(path), stat.S_IFLNK) from None
        raise
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != (before.st_dev, before.st_ino) or not (
        stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)
    ):
        os.close(fd)
        raise _dataset_refusal(str(path), st.st_mode)
    return fd


#: folders deep a dataset's walk goes (it recurses three calls a level)
DATASET_DEPTH = 256


class DatasetWalk:
    """One walk of a dataset from its open root (:func:`open_dataset`): its digest, size and
    file count, and, with ``dest_fd``, its copy.

    The digest covers, in sorted order, every entry's path below the root, kind, size,
    modification time and permission bits (a link: its target's text), and the files'
    contents as long as the bytes seen so far are at most ``content_limit`` (it is used only
    when the whole dataset is that small: see ``service/prepared.py``).  A copy and a look at
    the same unchanged dataset give the same digest.

    The copy (rules):

    1. is created as ``name`` in the folder ``dest_fd`` with ``O_CREAT | O_EXCL`` (never
       through an existing entry) by the process's own account, which owns every file of it;
    2. keeps the permission bits but never the setuid, setgid and sticky bits;
    3. copies a symbolic link as a link with the same target, never what it points to;
    4. refuses FIFOs, sockets and devices anywhere (:class:`RefusedFile` naming the path),
       as an entry that changed between its look and its open;
    5. keeps modification times (folders' once their entries are written).
    """

    def __init__(self, shown: str, content_limit: int):
        self.shown = shown.rstrip("/") or "/"
        self.content_limit = content_limit
        self.bytes = 0
        self.files = 0
        import hashlib  # here: a command-line call that reads a log never digests a tree

        self._meta = hashlib.sha256()
        self._content = hashlib.sha256()

    def digest(self) -> str:
        """The dataset's digest (see the class docstring)."""
        whole = self._meta.copy()
        if self.bytes <= self.content_limit:
            whole.update(b"\0contents\0" + self._content.digest())
        return whole.hexdigest()

    def run(self, src_fd: int, dest_fd: int | None = None, name: str = "data") -> DatasetWalk:
        """Walk (and copy) the dataset whose root ``src_fd`` is open; returns itself."""
        st = os.fstat(src_fd)
        if stat.S_ISDIR(st.st_mode):
            self._folder(src_fd, st, "", dest_fd, name)
        else:
            self._file(src_fd, st, "", dest_fd, name)
        return self

    def _note(self, rel: str, st: os.stat_result, extra: str = "") -> None:
        kind = "d" if stat.S_ISDIR(st.st_mode) else "l" if stat.S_ISLNK(st.st_mode) else "f"
        size = st.st_size if kind == "f" else 0
        self._meta.update(
            f"\0{rel}\0{kind}\0{size}\0{st.st_mtime_ns}\0{stat.S_IMODE(st.st_mode) & 0o777:o}{extra}".encode(
                "utf-8", "surrogateescape"
            )
        )

    def _folder(self, fd: int, st: os.stat_result, rel: str, dest_fd: int | None, name: str) -> None:
        if rel.count("/") >= DATASET_DEPTH:  # this walk recurses: bounded well below Python's limit
            raise RefusedFile(
                f"{self.shown}/{rel[:60]}...: a chain of folders more than {DATASET_DEPTH} deep in the "
                "dataset; data preparation copies none that deep: remove it"
            )
        out = None
        if dest_fd is not None:
            os.mkdir(name, 0o700, dir_fd=dest_fd)
            out = os.open(name, DIR_FLAGS, dir_fd=dest_fd)
        try:
            for entry in sorted(os.listdir(fd)):
                self._entry(fd, entry, f"{rel}/{entry}" if rel else entry, out)
            if out is not None:
                os.fchmod(out, stat.S_IMODE(st.st_mode) & 0o777)  # after its entries: 0o555 too
                os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            if out is not None:
                os.close(out)

    def _entry(self, parent: int, entry: str, rel: str, out: int | None) -> None:
        shown = f"{self.shown}/{rel}"
        try:
            self._copy_entry(parent, entry, rel, out, shown)
        except PermissionError as exc:
            if exc.filename not in (entry, None):
                raise  # an entry further down already named itself
            raise RefusedFile(
                f"{shown} cannot be read by the account the job runs as ({exc.strerror}): make it "
                "readable to that account, or leave it out of the dataset"
            ) from None

    def _copy_entry(self, parent: int, entry: str, rel: str, out: int | None, shown: str) -> None:
        st = os.stat(entry, dir_fd=parent, follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            target = os.readlink(entry, dir_fd=parent)
            self._note(rel, st, f"\0->{target}")
            if out is not None:
                os.symlink(target, entry, dir_fd=out)
            return
        if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
            raise _dataset_refusal(shown, st.st_mode)  # looked at first: opening a device may act
        try:
            fd = os.open(entry, DIR_FLAGS if stat.S_ISDIR(st.st_mode) else _FILE_FLAGS, dir_fd=parent)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # swapped since the look
                raise _dataset_refusal(
                    shown, os.stat(entry, dir_fd=parent, follow_symlinks=False).st_mode
                ) from None
            raise
        try:
            now = os.fstat(fd)
            if not (stat.S_ISDIR(now.st_mode) or stat.S_ISREG(now.st_mode)):
                raise _dataset_refusal(shown, now.st_mode)
            if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                raise RefusedFile(f"{shown} was replaced while data preparation read it: submit again")
            if stat.S_ISDIR(now.st_mode):
                self._note(rel, now)
                self._folder(fd, now, rel, out, entry)
            else:
                self._file(fd, now, rel, out, entry)
        finally:
            os.close(fd)

    def _file(self, fd: int, st: os.stat_result, rel: str, dest_fd: int | None, name: str) -> None:
        self._note(rel, st)
        self.files += 1
        out = None
        if dest_fd is not None:
            out = os.open(
                name,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
                dir_fd=dest_fd,
            )
        try:
            offset, fast = 0, hasattr(os, "copy_file_range")
            while True:
                hashing = self.bytes + (st.st_size - offset) <= self.content_limit
                if out is None and not hashing:
                    self.bytes += st.st_size - offset
                    break
                if out is not None and not hashing and fast:
                    try:  # in the kernel, without the bytes passing through this process
                        done = os.copy_file_range(fd, out, 64 << 20, offset, offset)
                    except OSError:
                        fast = False  # a file system or kernel without it: read and write
                        continue
                    if not done:
                        break
                    offset += done
                    self.bytes += done
                    continue
                data = os.pread(fd, 1 << 20, offset)
                if not data:
                    break
                if hashing:
                    self._content.update(data)
                if out is not None:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(out, view) :]
                offset += len(data)
                self.bytes += len(data)
            if out is not None:
                os.fchmod(out, stat.S_IMODE(st.st_mode) & 0o777)  # rule 2: no setuid, setgid, sticky
                os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            if out is not None:
                os.close(out)
