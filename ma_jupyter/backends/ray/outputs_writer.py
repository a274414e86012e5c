"""The writer of a named outputs folder on the service's machine: what a Ray job node wrote into
its ``--output /host/path`` on another machine, written here as the job's account
(:mod:`.outputs_return` rule 5 starts it and feeds it).

The local backend lets a job's node write into its named outputs folder as the job's account,
through a bind mount made after the service's mount rules.  This process gives the copy back
the same rights, no more:

1. the service (root) opens the folder as a bind mount would (the path followed), checks the
   folder the kernel names it by against the job's mount rules
   (``outputs_return.NamedFolder``), and hands its descriptor to this process, which drops to the job's
   account (no supplementary groups) before anything else and opens the folder again through
   ``/proc/self/fd`` with that account's own rights (``ma_jupyter.nodehost.datacopy``'s way);
2. every name it is given is a plain relative path (no empty, ``.`` or ``..`` part), at most
   ``max_depth`` folders deep and :data:`MAX_PATH` bytes long; each folder on the way is opened from the top without following
   a link (a link or a non-folder there refuses the file: nothing outside the folder is
   reached), made (0755) where missing;
3. a file is written into a new name beside its place (created exclusively, never through a
   link), given the source's modification time, and renamed over its place once whole; an
   aborted or refused file leaves nothing;
4. at most ``max_files`` names are written in all, and none while its bytes would leave less
   than ``reserve`` bytes free on the folder's disk (the service's ``[limits]
   disk_reserve_mb``); the account's quota holds as for the job's own writes.

Protocol, on stdin: a JSON line of at most :data:`MAX_LINE` bytes (``{"op": "file", "path",
"mtime_ns"}``, ``{"op": "probe", "name"}`` or ``{"op": "unprobe", "name"}``); a longer one puts
the stream out of step, and the writer ends.  One JSON line answers each request: ``{"ok":
true}`` or ``{"refused": why}``.  A file's request is answered once its new file is open (a
place refused there is refused before any of its bytes are sent: none follow); then come its
pieces (an 8-byte big-endian length and that many bytes, at most ``CHUNK``), ended by a length
0 (write it) or :data:`ABORT` (drop it), and one more answer: at that end, or at once when a
piece is refused (the disk reserve), so the service stops sending the rest; the pieces up to the
end are then read and dropped, with no further answer.

Standard library only: it runs as a script of its own (``python -I <this file>``), with nothing
of the package imported under the job's account.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import stat
import struct
import sys

#: the length that drops the file being sent
ABORT = (1 << 64) - 1
#: bytes of one piece at most (the reads through the agent's: ``outputs_return.CHUNK``)
CHUNK = 8 << 20
#: bytes of a request line at most
MAX_LINE = 64 << 10
#: bytes of a file's relative path at most: its request, escaped as JSON (6 bytes a byte at
#: worst), stays within :data:`MAX_LINE`
MAX_PATH = 8 << 10
#: characters of a refusal's message at most (its answer stays one short line)
MAX_SAID = 1000

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


#: a request this writer does not carry out (its message goes back to the service); the
#: standard library's, as nothing of the package is imported here
Refused = ValueError


def plain_parts(relative: str, max_depth: int) -> list[str]:
    """Rule 2: ``relative``'s parts.

    Raises:
        Refused: not a plain relative path, or more than ``max_depth`` folders deep.
    """
    parts = relative.split("/")
    if not relative or "\0" in relative or any(p in ("", ".", "..") for p in parts):
        raise Refused(f"{relative[:200]!r} is not a plain relative path")
    if len(os.fsencode(relative)) > MAX_PATH:
        raise Refused(f"{relative[:200]}... is longer than {MAX_PATH} bytes")
    if len(parts) - 1 > max_depth:
        raise Refused(f"{relative[:200]}... is more than {max_depth} folders deep")
    return parts


def open_folder(top: int, parts: list[str]) -> int:
    """Rule 2: a descriptor of the folder ``parts`` below ``top``, made where missing, no link
    followed.

    Raises:
        Refused: a part is a link or not a folder.
    """
    fd = os.dup(top)
    try:
        for part in parts:
            try:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass  # made meanwhile: opened below as anything else is
                try:
                    nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    raise Refused(f"{part} is not a folder ({exc.strerror})") from None
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise Refused(
                        f"{part} is a link or not a folder: nothing is written through it"
                    ) from None
                raise
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


class _Open:
    """A file being received: its new file ``temp``, open as ``fd`` in ``folder``."""

    def __init__(self, relative: str, mtime_ns: int, folder: int, name: str, temp: str, fd: int):
        self.relative = relative
        self.mtime_ns = mtime_ns
        self.folder = folder
        self.name = name
        self.temp = temp
        self.fd = fd


def _said(problem: object) -> str:
    return str(problem)[:MAX_SAID]


class Writer:
    """Rules 2 to 4 over the folder ``top`` (a descriptor opened with the account's rights)."""

    def __init__(self, top: int, max_files: int, max_depth: int, reserve: int):
        self.top = top
        self.max_files = max_files
        self.max_depth = max_depth
        self.reserve = reserve
        self.written: set[str] = set()

    def probe(self, name: str, make: bool) -> None:
        """Make (or remove) the empty file ``name`` in the top folder: whether another machine
        sees it tells the service that its folder is this one (shared storage)."""
        if not name.startswith(".ma-jupyter-probe-") or "/" in name:
            raise Refused(f"{name!r} is no probe name")
        if make:
            os.close(
                os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=self.top)
            )
        else:
            os.unlink(name, dir_fd=self.top)

    def open(self, relative: str, mtime_ns: int) -> _Open:
        """Rules 2 to 4 up to ``relative``'s new file beside its place, open.

        Raises:
            Refused: rules 2 to 4 refuse it (nothing is left).
        """
        parts = plain_parts(relative, self.max_depth)
        if relative not in self.written and len(self.written) >= self.max_files:
            raise Refused(f"more than {self.max_files} files were written")
        folder = open_folder(self.top, parts[:-1])
        try:
            name = parts[-1]
            # the new file's name within the disk's 255 bytes, whatever the script of ``name``
            temp = f".{os.fsdecode(os.fsencode(name)[:200])}.{secrets.token_hex(4)}.part"
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            try:
                fd = os.open(temp, flags, 0o644, dir_fd=folder)
            except OSError as exc:
                raise Refused(f"{relative[:200]}: its new file cannot be made ({exc.strerror})") from None
        except BaseException:
            os.close(folder)
            raise
        return _Open(relative, mtime_ns, folder, name, temp, fd)

    def receive(self, opened: _Open, pieces, say) -> None:
        """Rule 3 for the file ``opened``, its bytes from ``pieces`` (an iterator of bytes, None:
        aborted): ``say(reply)`` once, at once when a piece is refused (its pieces are read all
        the same: the stream stays in step), else at the end.  The folder and the file are
        closed, and the new file is gone unless renamed over its place."""
        folder, fd, temp = opened.folder, opened.fd, opened.temp
        problem: Exception | None = None
        try:
            whole = False
            try:
                for piece in pieces:
                    if piece is None:
                        break  # aborted: the next round sends it as it is then
                    if problem is None:
                        try:
                            self._room(fd, len(piece))
                            view = memoryview(piece)
                            while view:
                                view = view[os.write(fd, view) :]
                        except (Refused, OSError) as exc:
                            problem = exc
                            say({"refused": _said(exc)})  # the service stops sending
                else:
                    whole = problem is None
            except BaseException:  # the stream ended mid-file (the service went): nothing is left
                os.close(fd)
                fd = -1
                os.unlink(temp, dir_fd=folder)
                raise
            finally:
                if fd >= 0:
                    os.close(fd)
            if not whole:
                os.unlink(temp, dir_fd=folder)
                if problem is None:
                    say({"ok": True})
                return
            try:
                os.utime(temp, ns=(opened.mtime_ns, opened.mtime_ns), dir_fd=folder, follow_symlinks=False)
                os.rename(temp, opened.name, src_dir_fd=folder, dst_dir_fd=folder)
            except OSError as exc:
                os.unlink(temp, dir_fd=folder)
                say({"refused": _said(f"{opened.relative}: its place cannot be replaced ({exc.strerror})")})
                return
            self.written.add(opened.relative)
            say({"ok": True})
        finally:
            os.close(folder)

    def _room(self, fd: int, size: int) -> None:
        """Rule 4: ``size`` more bytes leave the reserve free on the folder's disk."""
        st = os.fstatvfs(fd)
        if st.f_bavail * st.f_frsize - size < self.reserve:
            raise Refused(
                f"writing it would leave less than the disk reserve ({self.reserve >> 20} MB, "
                "[limits] disk_reserve_mb) free on the outputs folder's disk"
            )


def _pieces(stream):
    """The pieces of one file from ``stream`` (None once aborted); stops at its end."""
    while True:
        head = stream.read(8)
        if len(head) < 8:
            raise EOFError
        (size,) = struct.unpack(">Q", head)
        if size == 0:
            return
        if size == ABORT:
            yield None
            return
        if size > CHUNK:
            raise EOFError  # not the service's stream: nothing more is read
        data = stream.read(size)
        if len(data) < size:
            raise EOFError
        yield data


def serve(writer: Writer, stream, answer) -> None:
    """The protocol of the module docstring until ``stream`` ends (or is out of step)."""

    def say(reply: dict) -> None:
        answer.write(json.dumps(reply) + "\n")
        answer.flush()

    while True:
        line = stream.readline(MAX_LINE)
        if not line.endswith(b"\n"):
            return  # its end, or a line longer than any request: nothing after it is in step
        try:
            request = json.loads(line)
            op = request["op"]
            if op == "file":
                opened = writer.open(str(request["path"]), int(request["mtime_ns"]))
                say({"ok": True})  # open: its pieces follow
                try:
                    writer.receive(opened, _pieces(stream), say)
                except EOFError:
                    return
                continue
            if op in ("probe", "unprobe"):
                writer.probe(str(request["name"]), op == "probe")
            else:
                raise Refused(f"unknown request {str(op)[:100]!r}")
            reply: dict = {"ok": True}
        except (Refused, OSError, ValueError, KeyError, TypeError) as exc:
            reply = {"refused": _said(exc)}
        say(reply)


def main(argv: list[str]) -> int:
    """``TOP_FD MAX_FILES MAX_DEPTH RESERVE [UID GID]``: rule 1, then :func:`serve` on stdin."""
    top_fd, max_files, max_depth, reserve = (int(a) for a in argv[:4])
    if len(argv) > 4:  # the job's account, before anything of the folder is touched
        uid, gid = int(argv[4]), int(argv[5])
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
    os.umask(0o022)
    try:
        # again with the account's own rights: it writes only where the account may
        top = os.open(f"/proc/self/fd/{top_fd}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        print(json.dumps({"refused": f"the account cannot open the folder ({exc.strerror})"}), flush=True)
        return 2
    os.close(top_fd)
    if not stat.S_ISDIR(os.fstat(top).st_mode):
        return 2
    print(json.dumps({"ok": True}), flush=True)  # ready
    serve(Writer(top, max_files, max_depth, reserve), sys.stdin.buffer, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
