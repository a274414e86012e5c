"""A job node's outputs brought back to the service's machine while it runs and at its end, for
a Ray node whose job folder this machine does not see (no shared disk): TensorBoard, the Outputs
tab and the uploads of outputs in object storage (``service/storage.py``) read the outputs
folder of the service's job folder (``config.outputs_folder``), which only this copy fills.

Rules:

1. The job's own outputs folder (no ``outputs`` host path named: the default folder, or the
   local folder of outputs in object storage) is brought back into the service's job folder; a
   named host path into this machine's folder of that path, by rule 5.
2. While a node runs, every :data:`PULL_EVERY` seconds, its agent lists the regular files of the
   node's outputs folder on its machine (:func:`listing`: the one bounded walk, no link
   followed) and each file whose size or modification time changed since the last copy is read
   through the agent in pieces of :data:`CHUNK` bytes (:func:`read_piece`: opened by the
   untrusted-file rules) into a new file beside its place here, renamed over it once whole: a
   reader never sees half a file, and nothing below the service's folder is followed (every
   folder is opened without following links, from the job folder down);
   a file whose copy was refused (its place, the disk) is not read again until it changes,
   but for the last copy; no piece is written that would leave less than the disk reserve
   (``[limits] disk_reserve_mb``) free on this machine's disk.
3. Once the node has ended (its end seen by the backend, or its stop returned), one last copy
   is made; only then does the backend report the node's end (``poll``), so the service records
   it, and uploads outputs in object storage (its final upload), after everything the node
   wrote is here.  That last copy waits at most :data:`FINAL_WAIT` seconds.
4. A file the job removed stays here (as an upload keeps an object); a name that is not a plain
   relative path is skipped.
5. A named outputs host path (``--output /host/path``) on a Ray node whose folder of that path
   is not this machine's comes back into this machine's folder of that path, written as the
   job's account, never as the service (:class:`NamedFolder`, :mod:`.outputs_writer`: the same
   rights as the local backend's bind mount of it, after the same mount rules; no link
   followed below it; at most :data:`MAX_FILES` files, folders as deep as the walk's bound, the
   disk reserve kept free on its disk).  On the Ray node only what the job's account owns is
   read (:func:`listing` and :func:`read_piece` with ``owner``: each folder from the top down
   and each file the account's), so a folder on its path swapped for a link to another's files
   gives nothing of them.  First a probe says whether the Ray node's folder is this very one
   (shared storage, or the same machine): an empty file the writer makes here, looked for there
   (:func:`seen`), then removed; then nothing is copied (the node writes here itself, and a copy
   would put an older state over its newer writes).  A folder the writer refuses (the account
   may not write it, the mount rules refuse where it leads now) is said once, and not copied.
6. A file the node's folder holds as the service's copy of it was carried there before the
   attempt (:mod:`.outputs_seed`: its size and modification time then) is not copied back
   until it changes.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import select
import signal
import stat
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ... import config, foldersize, untrusted
from ...errors import FolderRefused, RefusedFile
from ...models import RunAs
from . import outputs_writer

log = logging.getLogger("ma_jupyter.ray")

#: seconds between two copies of a running node's changed outputs
PULL_EVERY = 1.0
#: bytes of one read through the agent
CHUNK = 8 << 20
#: seconds the last copy of a node's outputs may take before its end is reported anyway
FINAL_WAIT = 600.0
#: files of one node's outputs folder listed at most
MAX_FILES = 100_000

#: seconds the writer of a named outputs folder may take to answer (rule 5)
WRITER_TIMEOUT = 120.0
#: the probe's name (rule 5), as the writer makes it
PROBE_PREFIX = ".ma-jupyter-probe-"


def disk_reserve() -> int:
    """The bytes a copy back leaves free on this machine's disk (``[limits] disk_reserve_mb`` of
    the service's ``cluster.toml``, read now)."""
    return int(config.load_cluster().limits.disk_reserve_mb * (1 << 20))


# ---------------------------------------------------------------- the agent's side


def listing(outputs: str, owner: int | None = None) -> dict[str, tuple[int, int]]:
    """Rule 2 on the Ray node: the regular files below ``outputs`` (relative path -> (size,
    mtime ns)); empty when it does not exist.  ``owner`` (rule 5): only the files of that uid
    in folders of that uid, from ``outputs`` down.

    Raises:
        RefusedFile: more than :data:`MAX_FILES` files, or the walk's own bounds.
    """
    found: dict[str, tuple[int, int]] = {}
    if not os.path.isdir(outputs):
        return found
    owned: dict[str, bool] = {}  # folder -> whether it and each folder above are the owner's
    try:
        for path, fd, entries in foldersize.walk([outputs], follow_top=False, max_entries=MAX_FILES * 2):
            below = "" if path == "." else path[2:] + "/"
            if owner is not None:
                above = owned.get(os.path.dirname(path), False) if path != "." else True
                owned[path] = above and os.fstat(fd).st_uid == owner
                if not owned[path]:
                    continue
            for name, st in entries:
                # a file with a second name could be one of this machine's own files: it is
                # never read (the untrusted-file rules refuse it too)
                if stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and owner in (None, st.st_uid):
                    found[below + name] = (st.st_size, st.st_mtime_ns)
                    if len(found) > MAX_FILES:
                        raise RefusedFile(f"the outputs folder holds more than {MAX_FILES} files")
    except FolderRefused as exc:
        raise RefusedFile(f"the outputs folder cannot be listed: {exc}") from None
    return found


def read_piece(outputs: str, relative: str, offset: int, limit: int, owner: int | None = None) -> bytes:
    """At most ``min(limit, CHUNK)`` bytes of ``outputs/relative`` from ``offset``, opened by
    the untrusted-file rules (b"" once gone or refused: the next listing says what is there);
    ``owner`` (rule 5): b"" for a file that is not that uid's."""
    try:
        fd = untrusted.open_file(Path(outputs), relative)
    except (OSError, RefusedFile):
        return b""
    try:
        if owner is not None and os.fstat(fd).st_uid != owner:
            return b""
        data, _ = untrusted.pread_range(fd, offset, min(limit, CHUNK))
        return data
    finally:
        os.close(fd)


def seen(outputs: str, name: str) -> bool:
    """Rule 5's probe on the Ray node: whether ``outputs`` holds an entry ``name`` (a look only)."""
    if not name.startswith(PROBE_PREFIX) or "/" in name:
        return False
    return os.path.lexists(os.path.join(outputs, name))


# -------------------------------------------------------------- the service's side


def plain(relative: str) -> bool:
    """Rule 4: whether ``relative`` is a plain relative path (no empty, ``.`` or ``..`` part)."""
    parts = relative.split("/")
    return bool(relative) and "\0" not in relative and all(p not in ("", ".", "..") for p in parts)


class _Node:
    def __init__(
        self,
        agent: Any,
        outputs: str,
        here: Path,
        trusted: Path,
        named: Callable[[], NamedFolder] | None = None,
        reserve: Callable[[], int] | None = None,
        copied: dict[str, tuple[int, int]] | None = None,
    ):
        self.agent = agent
        self.reserve_of = reserve  # rule 2: the disk reserve, read on the copy's thread
        self.reserve = 0
        self.named = named  # rule 5: what starts the named folder's writer
        self.owner: int | None = None  # rule 5: the uid whose files are read on the Ray node
        self.writer: NamedFolder | None = None
        self.outputs = outputs  # the node's outputs folder on its Ray node
        self.here = here  # the outputs folder on this machine
        self.trusted = trusted  # the job folder here, which no job writes
        self.copied: dict[str, tuple[int, int]] = dict(copied or {})
        self.ended = threading.Event()  # rule 3: the node's end was seen
        self.done = threading.Event()  # rule 3: the last copy was made (or gave up)
        self.since = 0.0  # monotonic time its end was first seen
        # files whose place here was refused (said once), as they were listed then: not read
        # again until they change, or for the last copy (rule 2)
        self.refused: dict[str, tuple[int, int]] = {}


class OutputsReturn:
    """Rules 2 and 3 for every running node whose outputs come back (one thread each).

    Args:
        get: an agent call's result with the contract's errors (``Agents.get``, :mod:`.agents`).
        wake: told when a node's last copy is made (the service then polls its end).
    """

    def __init__(self, get: Callable[..., Any], wake: Callable[[], Callable[[], None] | None]):
        self._get = get
        self._wake = wake
        self._lock = threading.Lock()
        self._nodes: dict[tuple[str, int, str], _Node] = {}

    def watch(
        self,
        key: tuple[str, int, str],
        agent: Any,
        outputs: str,
        here: Path,
        trusted: Path,
        named: Callable[[], NamedFolder] | None = None,
        reserve: Callable[[], int] | None = None,
        copied: dict[str, tuple[int, int]] | None = None,
    ) -> None:
        """Bring ``outputs`` of the node ``key`` (job, attempt, node) back to ``here`` while it
        runs (once per node of an attempt); ``named``: a named outputs folder's writer's start
        (rule 5); ``reserve``: the bytes the copy leaves free on ``here``'s disk (rule 2);
        ``copied``: the files the node's folder holds as they came from here (rule 6)."""
        with self._lock:
            if key in self._nodes:
                return
            node = self._nodes[key] = _Node(agent, outputs, here, trusted, named, reserve, copied)
        threading.Thread(target=self._run, args=(key, node), name=f"ma-outputs-{key[0]}", daemon=True).start()

    def watched(self, key: tuple[str, int, str]) -> bool:
        with self._lock:
            return key in self._nodes

    def settled(self, key: tuple[str, int, str], wait: float = 0.0) -> bool:
        """Rule 3: the node ``key`` has ended; whether its last copy is made (within ``wait``
        seconds; at once for a node not watched, and past :data:`FINAL_WAIT`)."""
        with self._lock:
            node = self._nodes.get(key)
        if node is None:
            return True
        if not node.ended.is_set():
            node.since = time.monotonic()
            node.ended.set()
        if node.done.wait(wait):
            with self._lock:
                self._nodes.pop(key, None)
            return True
        return time.monotonic() - node.since > FINAL_WAIT

    def _run(self, key: tuple[str, int, str], node: _Node) -> None:
        failing_since: float | None = None
        try:
            if node.named is not None and not self._named(key, node):
                return
            if node.reserve_of is not None:
                try:
                    node.reserve = node.reserve_of()
                except Exception as exc:  # noqa: BLE001 (cluster.toml unreadable: the disk's own end)
                    log.warning("job %s: the disk reserve of its outputs copy is unknown: %s", key[0], exc)
            while True:
                last = node.ended.is_set()
                try:
                    self._copy(node, last)
                    failing_since = None
                except Exception as exc:  # noqa: BLE001 (the node or its agent is gone: it says so)
                    if failing_since is None:
                        log.warning("job %s: copying %s's outputs back failed: %s", key[0], key[2], exc)
                        failing_since = time.monotonic()
                    elif time.monotonic() - failing_since > FINAL_WAIT:
                        return  # its Ray node left, or its agent no longer answers: nothing more comes
                if last:
                    return
                node.ended.wait(PULL_EVERY)
        finally:
            if node.writer is not None:
                node.writer.close()
            node.done.set()
            wake = self._wake()
            if wake is not None:
                wake()

    def _named(self, key: tuple[str, int, str], node: _Node) -> bool:
        """Rule 5's start: whether the node's named folder is to be copied back (its writer
        started, and the probe found the Ray node's folder to be another)."""
        assert node.named is not None
        try:
            node.writer = node.named()
            node.owner = node.writer.owner
            if node.writer.probe(
                lambda name: bool(self._get(node.agent.outputs_seen.remote(node.outputs, name)))
            ):
                return False  # the very folder: the node writes here itself
        except Exception as exc:  # noqa: BLE001 (refused, or the agent is gone: said, nothing copied)
            log.warning("job %s: %s's outputs are not copied back to %s: %s", key[0], key[2], node.here, exc)
            return False
        return True

    def _copy(self, node: _Node, last: bool = False) -> None:
        """One round of rule 2 (``last``: the node's last copy)."""
        found = self._get(node.agent.outputs_listing.remote(node.outputs, node.owner))
        # what is kept of files no longer there goes: a job renaming its files every round
        # keeps the service's memory to one listing's (:data:`MAX_FILES`)
        for kept in (node.copied, node.refused):
            for gone in kept.keys() - found.keys():
                del kept[gone]
        for relative, seen in sorted(found.items()):
            seen = (int(seen[0]), int(seen[1]))
            if node.copied.get(relative) == seen or not plain(relative):
                continue
            if node.refused.get(relative) == seen and not last:
                continue  # a job's file too large for the disk is not read again every second
            try:
                if self._one(node, relative, seen[0], seen[1]):
                    node.copied[relative] = seen
            except (RefusedFile, OSError) as exc:  # this file's place here: the others still come
                if relative not in node.refused:
                    log.warning("the outputs file %s is not copied back to %s: %s", relative, node.here, exc)
                node.refused[relative] = seen

    def _one(self, node: _Node, relative: str, size: int, mtime_ns: int = 0) -> bool:
        """The file ``relative`` (``size`` bytes when listed) copied in place, whole or not at all;
        whether it was (not: it shrank or went meanwhile, and the next round looks again)."""
        if node.writer is not None:  # rule 5: written by the job's account

            def read(offset: int) -> bytes:
                return self._get(
                    node.agent.outputs_read.remote(node.outputs, relative, offset, CHUNK, node.owner)
                )

            return node.writer.write(relative, mtime_ns, size, read)
        parent, name = os.path.split(relative)
        folder = node.here / parent if parent else node.here
        untrusted.make_dirs(folder, trusted=node.trusted, owner="the outputs copied back")
        dir_fd = _open_below(node.trusted, folder)
        # its name within the disk's 255 bytes, whatever the script of ``name``
        temp = f".{os.fsdecode(os.fsencode(name)[:200])}.{secrets.token_hex(4)}.part"
        try:
            fd = os.open(
                temp,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o644,
                dir_fd=dir_fd,
            )
            try:
                offset = 0
                while offset < size:
                    data = self._get(node.agent.outputs_read.remote(node.outputs, relative, offset, CHUNK))
                    if not data:
                        break  # shorter now, or gone: the next round copies it as it is then
                    if node.reserve:  # a job's (sparse) file never fills the service's disk
                        st = os.fstatvfs(fd)
                        if st.f_bavail * st.f_frsize - len(data) < node.reserve:
                            raise RefusedFile(
                                f"writing it would leave less than the disk reserve "
                                f"({node.reserve >> 20} MB, [limits] disk_reserve_mb) free on its disk"
                            )
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view) :]
                    offset += len(data)
            finally:
                os.close(fd)
            if offset < size:
                os.unlink(temp, dir_fd=dir_fd)
                return False
            os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            return True
        except BaseException:
            try:
                os.unlink(temp, dir_fd=dir_fd)
            except OSError:
                pass
            raise
        finally:
            os.close(dir_fd)


def _open_below(trusted: Path, folder: Path) -> int:
    """A descriptor of ``folder``, opened from ``trusted`` down without following any link.

    Raises:
        RefusedFile: a part is a link or not a folder.
    """

    def open_part(fd: int, part: str) -> int:
        try:
            return os.open(part, untrusted.DIR_FLAGS, dir_fd=fd)
        except OSError as exc:
            raise RefusedFile(f"{folder}: {part} is not a folder ({exc.strerror})") from None

    top = os.open(trusted, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    return untrusted.descend(top, folder.relative_to(trusted).parts, open_part)


class NamedFolder:
    """Rule 5 on this machine: the writer of one node's named outputs folder
    (:mod:`.outputs_writer`), started as ``account`` over the folder at ``path``, opened here as
    its bind mount would be and checked by ``check`` (the job's mount rules) where it leads now.
    Every exchange with it is bounded by :data:`WRITER_TIMEOUT` (a folder on a stalled disk
    holds no thread of the service for longer); a writer that did not answer is killed.

    Raises:
        RefusedFile: the account may not open the folder, or its writer did not start.
        InvalidSpec: ``check`` refused the folder it leads to now.
    """

    def __init__(self, path: str, account: RunAs | None, check: Callable[[str], None], reserve: int):
        self.path = path
        #: the uid whose files are read on the Ray node (None: the service's own account)
        self.owner = None if account is None else account.uid
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:  # gone on this machine, or not a folder: as its docstring says
            raise RefusedFile(f"the outputs folder {path}: {exc.strerror}") from None
        try:
            check(os.readlink(f"/proc/self/fd/{fd}"))
            argv = [
                sys.executable,
                "-I",
                outputs_writer.__file__,
                str(fd),
                str(MAX_FILES),
                str(foldersize.MAX_DEPTH),
                str(reserve),
            ]
            if account is not None:
                argv += [str(account.uid), str(account.gid)]
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                pass_fds=[fd],
                env={"PATH": os.defpath},
                cwd="/",
                start_new_session=True,
            )
        except OSError as exc:
            raise RefusedFile(f"the outputs folder {path}: its writer cannot start ({exc})") from None
        finally:
            os.close(fd)
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._in = self._proc.stdin.fileno()
        os.set_blocking(self._in, False)
        self._out = self._proc.stdout
        try:
            self._answer()  # ready, with the account's rights on the folder
        except BaseException:
            self._kill()
            self._out.close()
            raise

    def probe(self, looks: Callable[[str], bool]) -> bool:
        """Rule 5's probe: whether ``looks`` (the Ray node's look for a name in its folder) sees
        an empty file this writer made here."""
        name = PROBE_PREFIX + secrets.token_hex(8)
        self._request({"op": "probe", "name": name})
        try:
            return looks(name)
        finally:
            self._request({"op": "unprobe", "name": name})

    def write(self, relative: str, mtime_ns: int, size: int, read: Callable[[int], bytes]) -> bool:
        """The file ``relative`` of ``size`` bytes (``read(offset)``: its next piece, b"" once it
        is shorter) written in place, whole or not at all; whether it was.  Nothing is read for a
        file whose place the writer refuses, and no more once it refuses a piece (the disk
        reserve): a hostile job's large file is not sent through the agent at every round.

        Raises:
            RefusedFile: the writer refused it (the reason), or does not answer; a path longer
                than ``outputs_writer.MAX_PATH`` bytes.
        """
        if len(os.fsencode(relative)) > outputs_writer.MAX_PATH:
            raise RefusedFile(
                f"the outputs folder {self.path}: {relative[:200]}... is longer than "
                f"{outputs_writer.MAX_PATH} bytes, the longest path copied back"
            )
        self._request({"op": "file", "path": relative, "mtime_ns": mtime_ns})  # its new file open
        offset = 0
        try:
            while offset < size:
                data = read(offset)
                if not data:
                    break
                self._send(struct.pack(">Q", len(data)) + data)
                offset += len(data)
                if self._said():  # refused mid-file: the rest is not read
                    break
        except BaseException:
            self._send(struct.pack(">Q", outputs_writer.ABORT))
            self._answer()
            raise
        self._send(struct.pack(">Q", outputs_writer.ABORT if offset < size else 0))
        self._answer()
        return offset >= size

    def _said(self) -> bool:
        """Whether the writer answered already (without waiting: the answer before it was read
        whole, so nothing waits in the reader's buffer)."""
        ready = select.poll()
        ready.register(self._out.fileno(), select.POLLIN)
        return bool(ready.poll(0))

    def close(self) -> None:
        """End the writer (it ends at the end of its input; killed past the timeout)."""
        try:
            # through the pipe's file object, its one owner: closed by number here, it would
            # close that number again when collected, whatever this process opened there
            # since (the jobs database's files: "disk I/O error" on every query after)
            if self._proc.stdin is not None:
                self._proc.stdin.close()
        except OSError:
            pass
        try:
            self._proc.wait(WRITER_TIMEOUT)
        except subprocess.TimeoutExpired:
            self._kill()
        self._out.close()

    def _request(self, request: dict) -> None:
        self._send((json.dumps(request) + "\n").encode())
        self._answer()

    def _send(self, data: bytes) -> None:
        view = memoryview(data)
        deadline = time.monotonic() + WRITER_TIMEOUT
        ready = select.poll()  # not select.select: the service may hold more than 1024 descriptors
        ready.register(self._in, select.POLLOUT)
        while view:
            left = deadline - time.monotonic()
            if left <= 0 or not ready.poll(left * 1000):
                self._kill()
                raise RefusedFile(
                    f"the outputs folder {self.path}: its writer took more than {WRITER_TIMEOUT:.0f} s"
                )
            try:
                view = view[os.write(self._in, view) :]
            except BlockingIOError:
                continue
            except OSError as exc:
                self._kill()
                raise RefusedFile(
                    f"the outputs folder {self.path}: its writer ended ({exc.strerror})"
                ) from None

    def _answer(self) -> dict:
        ready = select.poll()
        ready.register(self._out.fileno(), select.POLLIN)
        if not ready.poll(WRITER_TIMEOUT * 1000):
            self._kill()
            raise RefusedFile(
                f"the outputs folder {self.path}: its writer took more than {WRITER_TIMEOUT:.0f} s"
            )
        line = self._out.readline(1 << 16)  # its answers are whole lines
        try:
            answer = json.loads(line)
        except ValueError:
            self._kill()
            raise RefusedFile(f"the outputs folder {self.path}: its writer ended") from None
        if "refused" in answer:
            raise RefusedFile(f"the outputs folder {self.path}: {answer['refused']}")
        return answer

    def _kill(self) -> None:
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            self._proc.wait(5)  # one stuck in a stalled disk's call ends when the call does
        except subprocess.TimeoutExpired:
            pass
