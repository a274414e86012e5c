"""A job node's outputs brought back to the service's machine while it runs and at its end, for
a Ray node whose job folder this machine does not see (no shared disk): TensorBoard, the Outputs
tab and the uploads of outputs in object storage (``service/storage.py``) read the outputs
folder of the service's job folder (``config.outputs_folder``), which only this copy fills.

Rules:

1. Only the job's own outputs folder (no ``outputs`` host path named: the default folder, or
   the local folder of outputs in object storage) is brought back; a named host path must be on
   storage every Ray node and this machine share (``docs/ray.md``).
2. While a node runs, every :data:`PULL_EVERY` seconds, its agent lists the regular files of the
   node's outputs folder on its machine (:func:`listing`: the one bounded walk, no link
   followed) and each file whose size or modification time changed since the last copy is read
   through the agent in pieces of :data:`CHUNK` bytes (:func:`read_piece`: opened by the
   untrusted-file rules) into a new file beside its place here, renamed over it once whole: a
   reader never sees half a file, and nothing below the service's folder is followed (every
   folder is opened without following links, from the job folder down).
3. Once the node has ended (its end seen by the backend, or its stop returned), one last copy
   is made; only then does the backend report the node's end (``poll``), so the service records
   it, and uploads outputs in object storage (its final upload), after everything the node
   wrote is here.  That last copy waits at most :data:`FINAL_WAIT` seconds.
4. A file the job removed stays here (as an upload keeps an object); a name that is not a plain
   relative path is skipped.
"""

from __future__ import annotations

import logging
import os
import secrets
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ... import foldersize, untrusted
from ...errors import FolderRefused, RefusedFile

log = logging.getLogger("ma_jupyter.ray")

#: seconds between two copies of a running node's changed outputs
PULL_EVERY = 1.0
#: bytes of one read through the agent
CHUNK = 8 << 20
#: seconds the last copy of a node's outputs may take before its end is reported anyway
FINAL_WAIT = 600.0
#: files of one node's outputs folder listed at most
MAX_FILES = 100_000

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


# ---------------------------------------------------------------- the agent's side


def listing(outputs: str) -> dict[str, tuple[int, int]]:
    """Rule 2 on the Ray node: the regular files below ``outputs`` (relative path -> (size,
    mtime ns)); empty when it does not exist.

    Raises:
        RefusedFile: more than :data:`MAX_FILES` files, or the walk's own bounds.
    """
    found: dict[str, tuple[int, int]] = {}
    if not os.path.isdir(outputs):
        return found
    try:
        for path, _fd, entries in foldersize.walk([outputs], follow_top=False, max_entries=MAX_FILES * 2):
            below = "" if path == "." else path[2:] + "/"
            for name, st in entries:
                # a file with a second name could be one of this machine's own files: it is
                # never read (the untrusted-file rules refuse it too)
                if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
                    found[below + name] = (st.st_size, st.st_mtime_ns)
                    if len(found) > MAX_FILES:
                        raise RefusedFile(f"the outputs folder holds more than {MAX_FILES} files")
    except FolderRefused as exc:
        raise RefusedFile(f"the outputs folder cannot be listed: {exc}") from None
    return found


def read_piece(outputs: str, relative: str, offset: int, limit: int) -> bytes:
    """At most ``min(limit, CHUNK)`` bytes of ``outputs/relative`` from ``offset``, opened by
    the untrusted-file rules (b"" once gone or refused: the next listing says what is there)."""
    try:
        fd = untrusted.open_file(Path(outputs), relative)
    except (OSError, RefusedFile):
        return b""
    try:
        data, _ = untrusted.pread_range(fd, offset, min(limit, CHUNK))
        return data
    finally:
        os.close(fd)


# -------------------------------------------------------------- the service's side


def plain(relative: str) -> bool:
    """Rule 4: whether ``relative`` is a plain relative path (no empty, ``.`` or ``..`` part)."""
    parts = relative.split("/")
    return bool(relative) and "\0" not in relative and all(p not in ("", ".", "..") for p in parts)


class _Node:
    def __init__(self, agent: Any, outputs: str, here: Path, trusted: Path):
        self.agent = agent
        self.outputs = outputs  # the node's outputs folder on its Ray node
        self.here = here  # the outputs folder on this machine
        self.trusted = trusted  # the job folder here, which no job writes
        self.copied: dict[str, tuple[int, int]] = {}
        self.ended = threading.Event()  # rule 3: the node's end was seen
        self.done = threading.Event()  # rule 3: the last copy was made (or gave up)
        self.since = 0.0  # monotonic time its end was first seen
        self.refused: set[str] = set()  # files whose place here was refused (said once)


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

    def watch(self, key: tuple[str, int, str], agent: Any, outputs: str, here: Path, trusted: Path) -> None:
        """Bring ``outputs`` of the node ``key`` (job, attempt, node) back to ``here`` while it
        runs (once per node of an attempt)."""
        with self._lock:
            if key in self._nodes:
                return
            node = self._nodes[key] = _Node(agent, outputs, here, trusted)
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
            while True:
                last = node.ended.is_set()
                try:
                    self._copy(node)
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
            node.done.set()
            wake = self._wake()
            if wake is not None:
                wake()

    def _copy(self, node: _Node) -> None:
        """One round of rule 2."""
        found = self._get(node.agent.outputs_listing.remote(node.outputs))
        for relative, seen in sorted(found.items()):
            seen = (int(seen[0]), int(seen[1]))
            if node.copied.get(relative) == seen or not plain(relative):
                continue
            try:
                if self._one(node, relative, seen[0]):
                    node.copied[relative] = seen
            except (RefusedFile, OSError) as exc:  # this file's place here: the others still come
                if relative not in node.refused:
                    node.refused.add(relative)
                    log.warning("the outputs file %s is not copied back to %s: %s", relative, node.here, exc)

    def _one(self, node: _Node, relative: str, size: int) -> bool:
        """The file ``relative`` (``size`` bytes when listed) copied in place, whole or not at all;
        whether it was (not: it shrank or went meanwhile, and the next round looks again)."""
        parent, name = os.path.split(relative)
        folder = node.here / parent if parent else node.here
        untrusted.make_dirs(folder, trusted=node.trusted, owner="the outputs copied back")
        dir_fd = _open_below(node.trusted, folder)
        temp = f".{name[:200]}.{secrets.token_hex(4)}.part"
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
                    os.write(fd, data)
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
    fd = os.open(trusted, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in folder.relative_to(trusted).parts:
            try:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                raise RefusedFile(f"{folder}: {part} is not a folder ({exc.strerror})") from None
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise
