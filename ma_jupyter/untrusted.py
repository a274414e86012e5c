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
from pathlib import Path, PurePosixPath

from .errors import RefusedFile
from .jobdir import FAILURE_REPORT

#: largest small report (``failure.json``) read whole
MAX_REPORT = 64 << 10
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
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


def _walk(root: Path, parts: tuple[str, ...], owner: str, shown: str) -> int:
    """An fd of the folder ``root/parts...``; no component below ``root`` may be a symlink."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # root itself is trusted
    try:
        for part in parts:
            try:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise _refuse(
                        owner, _kind_at(fd, part), shown, f" (in place of the folder {part})"
                    ) from None
                raise
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


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


def read_tail(root: Path, relative: str | os.PathLike, max_bytes: int, **names: str) -> bytes:
    """The last ``max_bytes`` of a file a job could have written; b"" when it does not exist.

    Raises:
        RefusedFile: as :func:`open_file`.
    """
    try:
        fd = open_file(root, relative, **names)
    except FileNotFoundError:
        return b""
    try:
        size = os.fstat(fd).st_size
        return pread_range(fd, max(0, size - max_bytes), max_bytes)[0]
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
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
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
    rank_log_dir: Path, node_dir: Path, node: str, shown: str = "/job/logs/failure.json"
) -> None:
    """Hand a launcher's ``failure.json`` from the job-writable rank-log folder to the node folder.

    Only a small regular file with one name is moved (``rename`` never follows a symlink);
    anything else stays where it is and ``node_dir/failure.json`` records what the job left
    (``{"refused": "worker-0 left a FIFO at /job/logs/failure.json ..."}``).
    """
    report = Path(rank_log_dir) / FAILURE_REPORT
    try:
        st = os.lstat(report)
    except OSError:
        return
    target = Path(node_dir) / FAILURE_REPORT
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
