"""A node's working copy: ``python -I -S workdir.py copy|export ...`` (standard library only).

Every node works in its own writable copy of the job's algorithm folder, shown at
``/workspace/algorithm`` (the user's folder itself is never written).  This helper runs inside
the node's sandbox, as the job's own account, so it reads and writes exactly what the job could:

* ``copy SRC DST LIMIT``, at a node's first launch before anything else (called by
  :mod:`.exec_env` in the node's first phase; by the node runner itself in the symlink mode):
  copies the folder SRC into the empty folder DST.  Symbolic links are copied as links (never followed), FIFOs, sockets and devices
  are left out, every file and folder keeps its mode plus write permission for its owner and
  its modification time.  More than LIMIT bytes of files: nothing more is copied, exit 3.
* ``export SRC DST SINCE``, run by the node runner after a node's last phase (a phase of its
  own, only when something changed): what the job wrote in its working copy
  SRC (every file or link whose status changed after SINCE, nanoseconds since the epoch, i.e.
  after the copy was complete; ``__pycache__`` folders left out) is copied to DST, the
  ``workdir/`` folder of the job's outputs, each file through a temporary name, so a reader
  never sees half a file.  Prints one line saying what it kept.

Exit codes: 0 done, 2 usage, 3 over the copy limit, 1 anything else (the message is printed).
Nothing here follows a symbolic link: folders are opened relative to their parent's descriptor
with ``O_NOFOLLOW``.
"""

from __future__ import annotations

import os
import stat
import sys

# ``shutil`` is not imported on purpose (13 ms): this runs at every node's first start

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_SKIPPED_FOLDERS = ("__pycache__",)
_CHUNK = 1 << 20


#: folders deep :func:`entries` goes (as ``ma_jupyter.foldersize.MAX_DEPTH``: a submit refuses a
#: deeper algorithm folder; a job may still make one in its working copy)
MAX_DEPTH = 512


class OverLimit(Exception):
    """The folder holds more bytes than the copy may take."""


def entries(dir_fd: int, prefix: str = ""):
    """Every entry below the folder ``dir_fd``, parents before children, as ``(relative path,
    parent folder's descriptor, name, lstat result)``; no symbolic link is followed.

    The parent's descriptor is valid only until the next item is taken.  Iterative (an explicit
    stack, one descriptor a level): a chain of folders more than :data:`MAX_DEPTH` deep, which
    a job may make, raises :class:`OSError` saying so, never ``RecursionError``.
    """
    stack = [(dir_fd, prefix, iter(_names(dir_fd)))]
    try:
        while stack:
            fd, above, names = stack[-1]
            name = next(names, None)
            if name is None:
                stack.pop()
                if fd != dir_fd:
                    os.close(fd)
                continue
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:  # removed meanwhile
                continue
            path = f"{above}{name}"
            yield path, fd, name, st
            if not stat.S_ISDIR(st.st_mode):
                continue
            if len(stack) > MAX_DEPTH:
                raise OSError(f"{path[:60]}...: a chain of folders more than {MAX_DEPTH} deep; remove it")
            try:
                child = os.open(name, _DIR, dir_fd=fd)
            except OSError:  # replaced meanwhile (by a link, a file): not followed
                continue
            try:
                below = _names(child)
            except BaseException:
                os.close(child)
                raise
            stack.append((child, path + "/", iter(below)))
    finally:
        for fd, _, _ in stack:
            if fd != dir_fd:
                os.close(fd)


def _names(dir_fd: int) -> list[str]:
    with os.scandir(dir_fd) as listing:
        return sorted(entry.name for entry in listing)


def changed_since(root: str, since: int) -> bool:
    """Whether anything below ``root`` (outside ``__pycache__``) changed status after ``since``."""
    try:
        fd = os.open(root, _DIR)
    except OSError:
        return False
    try:
        for path, _, _, st in entries(fd):
            if not stat.S_ISDIR(st.st_mode) and st.st_ctime_ns > since and not _skipped(path):
                return True
        return False
    finally:
        os.close(fd)


def _skipped(path: str) -> bool:
    return any(part in _SKIPPED_FOLDERS for part in path.split("/")[:-1])


def _copy_data(src_fd: int, dst_fd: int) -> None:
    while True:
        data = os.read(src_fd, _CHUNK)
        if not data:
            return
        view = memoryview(data)
        while view:
            view = view[os.write(dst_fd, view) :]


def copy(src: str, dst: str, limit: int) -> tuple[int, int]:
    """Copy the folder ``src`` into the existing folder ``dst``; returns (files, bytes).

    Raises:
        OverLimit: the files add up to more than ``limit`` bytes (what was copied stays).
    """
    files = total = 0
    src_root = os.open(src, _DIR)
    dst_root = os.open(dst, _DIR)
    # destination folders by relative path (their descriptors), parents opened first
    folders = {"": dst_root}
    try:
        for path, parent_fd, name, st in entries(src_root):
            parent = path.rpartition("/")[0]
            out = folders.get(parent)
            if out is None:  # a folder that could not be made (see below): skip what it holds
                continue
            mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISDIR(st.st_mode):
                try:
                    os.mkdir(name, 0o700, dir_fd=out)
                    folders[path] = os.open(name, _DIR, dir_fd=out)
                except OSError as exc:
                    print(f"[ma_jupyter] working copy: left out {path}/: {exc.strerror}", file=sys.stderr)
                    continue
                # its mode and time are set once its content is written (below)
                continue
            if stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(name, dir_fd=parent_fd), name, dir_fd=out)
                continue
            if not stat.S_ISREG(st.st_mode):
                continue  # FIFOs, sockets, devices: nothing a program's folder needs
            total += st.st_size
            if total > limit:
                raise OverLimit(f"more than {limit} bytes")
            try:
                fin = os.open(
                    name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=parent_fd
                )
            except PermissionError:
                print(
                    f"[ma_jupyter] working copy: left out {path} (this job may not read it)", file=sys.stderr
                )
                continue
            try:
                fout = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600, dir_fd=out)
                try:
                    _copy_data(fin, fout)
                    os.fchmod(fout, mode | stat.S_IWUSR)
                    os.utime(fout, ns=(st.st_atime_ns, st.st_mtime_ns))
                finally:
                    os.close(fout)
            finally:
                os.close(fin)
            files += 1
        # folders last, deepest first: their times would change while their content was written
        for path, _, _, st in _folders(src_root):
            fd = folders.get(path)
            if fd is not None:
                os.fchmod(fd, stat.S_IMODE(st.st_mode) | stat.S_IRWXU)
                os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns))
    finally:
        for fd in folders.values():
            os.close(fd)
        os.close(src_root)
    return files, total


def _folders(src_root: int) -> list:
    found = [item for item in entries(src_root) if stat.S_ISDIR(item[3].st_mode)]
    return sorted(found, key=lambda item: item[0].count("/"), reverse=True)


def export(src: str, dst: str, since: int) -> tuple[int, int]:
    """Copy what changed in ``src`` after ``since`` into ``dst`` (made when needed); (files, bytes)."""
    files = total = 0
    src_root = os.open(src, _DIR)
    made: set[str] = set()
    try:
        for path, parent_fd, name, st in entries(src_root):
            if _skipped(path + "/") or st.st_ctime_ns <= since:
                continue
            target = os.path.join(dst, path)
            if stat.S_ISDIR(st.st_mode):
                continue  # made below when a file in it is kept
            folder = os.path.dirname(target)
            if folder not in made:
                os.makedirs(folder, exist_ok=True)
                made.add(folder)
            temp = os.path.join(folder, f".{name}.ma-partial")
            if stat.S_ISLNK(st.st_mode):
                _remove(temp)
                os.symlink(os.readlink(name, dir_fd=parent_fd), temp)
            elif stat.S_ISREG(st.st_mode):
                fin = os.open(
                    name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=parent_fd
                )
                try:
                    _remove(temp)
                    fout = os.open(
                        temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
                    )
                    try:
                        _copy_data(fin, fout)
                        os.fchmod(fout, stat.S_IMODE(st.st_mode))
                        os.utime(fout, ns=(st.st_atime_ns, st.st_mtime_ns))
                    finally:
                        os.close(fout)
                finally:
                    os.close(fin)
                total += st.st_size
            else:
                continue
            if os.path.isdir(target) and not os.path.islink(target):
                _remove(temp)
                print(f"[ma_jupyter] not kept: {path} (a folder of that name is in {dst})", file=sys.stderr)
                continue
            os.replace(temp, target)
            files += 1
    finally:
        os.close(src_root)
    return files, total


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _size(count: int) -> str:
    for unit in ("bytes", "kB", "MB", "GB"):
        if count < 1000 or unit == "GB":
            return f"{count} {unit}" if unit == "bytes" else f"{count:.1f} {unit}"
        count /= 1000  # type: ignore[assignment]
    return str(count)


def write_record(path: str | os.PathLike, since: int) -> None:
    """Record a node's working copy complete since ``since`` (nanoseconds since the epoch), as
    ``{"since": ns}``, atomically (the node runner's ``nodes/<node>/workdir.json``; the copy
    made, :func:`export` later keeps what changed after it)."""
    path = os.fspath(path)
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(f'{{"since": {int(since)}}}')
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def read_record(path: str | os.PathLike) -> int | None:
    """The time :func:`write_record` recorded; None without a (readable) record."""
    import json  # here, not above: a copy never reads a record

    try:
        with open(path, "rb") as fh:
            since = json.loads(fh.read(4096))["since"]
        return since if isinstance(since, int) else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def main(argv: list[str]) -> int:
    if len(argv) != 4 or argv[0] not in ("copy", "export") or not argv[3].isdigit():
        print("usage: workdir.py copy SRC DST LIMIT | export SRC DST SINCE", file=sys.stderr)
        return 2
    action, src, dst, number = argv[0], argv[1], argv[2], int(argv[3])
    try:
        if action == "copy":
            copy(src, dst, number)
            return 0
        files, total = export(src, dst, number)
    except OverLimit:
        print(
            f"[ma_jupyter] the algorithm folder holds more than {_size(number)}, more than a node's working "
            "copy may take: the job did not start; move its data to a dataset (--dataset), or mount the "
            "folder itself writable (--code-writable)",
            file=sys.stderr,
        )
        return 3
    except OSError as exc:
        what = "make the working copy" if action == "copy" else f"keep the working directory's files in {dst}"
        print(f"[ma_jupyter] could not {what}: {exc}", file=sys.stderr)
        return 1
    if files:
        print(
            f"[ma_jupyter] kept {files} file(s), {_size(total)}, the job wrote in its working directory: {dst}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
