"""A job's outputs folder carried to the Ray nodes of its next attempt: a resumed or restarted
attempt on a machine that does not share the service's outputs folder starts with what the
earlier attempts wrote (their checkpoints), not with an empty folder whose copy back
(:mod:`.outputs_return`) would then write its new files over theirs.

The service's copy of the job's own outputs folder (the default one, ``outputs/`` of its job
folder; outputs in object storage are downloaded from their prefix instead, :mod:`.objects`
rule 3) is the whole of what the job wrote: every file of every earlier attempt came back to it
before that attempt's end was recorded (:mod:`.outputs_return` rules 3 and 4).

Rules, before each attempt but the first (contract rule 30, :meth:`RayBackend.seed_outputs`),
for each Ray node of its placement, off every lock:

1. A probe says whether the Ray node's outputs folder (``node_root/<job>/outputs`` there) is
   the service's very folder (the same machine and ``node_root``, or shared storage): an empty
   file made in the service's folder, looked for through the agent, then removed; then nothing
   is copied (the node writes the service's folder itself).
2. The service lists its copy (:func:`.outputs_return.listing`: the one bounded walk, regular
   files of one name only, no link followed, at most ``outputs_return.MAX_FILES`` files, folders
   at most ``foldersize.MAX_DEPTH`` deep); the agent makes the node's outputs folder (from
   ``node_root`` down, no link followed, the outputs folder owned by the job's account) and lists it.  A file whose
   size and modification time there are the service's copy's is not sent again.
3. The bytes to send must leave ``[limits] disk_reserve_mb`` free on the Ray node's disk, with
   the other downloads running there (:func:`.objects.room`): a copy the disk could never take
   fails the attempt saying so (``InvalidSpec``), one that does not fit now keeps the job queued
   (``DiskFull``); each piece is checked again before it is written.
4. Files go in calls of at most :data:`BATCH` bytes and :data:`BATCH_FILES` pieces (a large file
   in pieces of ``outputs_return.CHUNK`` bytes, read from the service's copy by the
   untrusted-file rules: never a whole checkpoint in memory), each call within
   ``agents.CALL_TIMEOUT`` and the whole copy within :data:`SEED_TIMEOUT`.  The agent writes
   each file into a new name beside its place (created exclusively, never through a link),
   each folder on the way opened from the outputs folder down without following a link (a link
   or non-folder there refuses the file: nothing is written outside the folder), made where
   missing; once whole, the file gets the job's account as owner and the service's
   modification time, and is renamed over its place (a link of the job's there is replaced,
   never followed).  Files the node's folder holds that the service's copy does not are kept.
5. Progress (bytes, files, rate) goes to the job's events at most every :data:`PROGRESS_EVERY`
   seconds per Ray node, and one line per Ray node says what was copied; a copy that fails
   (a file refused, the agent gone, a call or the whole past its time, the job stopped) fails
   the attempt with the reason: an attempt never starts without the outputs it was to get.
6. What the node's folder holds after the copy, as its listing then says, is what the copy back
   of the attempt has already (``OutputsReturn.watch``'s ``copied``): a checkpoint sent to the
   node is not sent back.
"""

from __future__ import annotations

import os
import secrets
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ... import config, foldersize, untrusted
from ...errors import Conflict, DiskFull, MaJupyterError, RefusedFile
from ...jobdir import check_job_id
from ...models import Job, RunAs
from . import objects, outputs_return, outputs_writer

#: bytes of file content sent in one call to an agent at most
BATCH = outputs_return.CHUNK
#: pieces (files, or parts of one) sent in one call at most
BATCH_FILES = 512
#: seconds the copy to one Ray node may take in all
SEED_TIMEOUT = 3600.0
#: seconds between two progress events of one Ray node's copy
PROGRESS_EVERY = 2.0


#: one piece: (relative path, the new file's token, offset, bytes, the file's size, mtime ns)
Piece = tuple[str, str, int, bytes, int, int]


# ---------------------------------------------------------------- the agent's side


def _outputs(node_root: str, job_id: str, account: RunAs | None) -> int:
    """Rule 2 on the Ray node: a descriptor of ``node_root/<job>/outputs``, each part made
    where missing and opened without following a link: the job's folder as a launch makes it
    (the agent's, where it later writes the nodes' files), its outputs given to ``account``.

    Raises:
        RefusedFile: a part is a link or not a folder.
    """
    os.makedirs(node_root, 0o755, exist_ok=True)  # the admin's folder, as a launch makes it
    parts = (check_job_id(job_id), "outputs")
    top = os.open(node_root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    shown = f"{node_root}/{job_id}"
    return untrusted.descend(
        top, parts, lambda fd, part: _folder(fd, part, account if part == "outputs" else None, shown)
    )


def _folder(at: int, name: str, account: RunAs | None, shown: str) -> int:
    """The folder ``name`` below the descriptor ``at``, made (0755, ``account``'s) where missing,
    never through a link.

    Raises:
        RefusedFile: ``name`` is a link or not a folder.
    """
    try:
        os.mkdir(name, 0o755, dir_fd=at)
        if account is not None:
            os.chown(name, account.uid, account.gid, dir_fd=at, follow_symlinks=False)
    except FileExistsError:
        pass
    try:
        return os.open(name, untrusted.DIR_FLAGS, dir_fd=at)
    except OSError as exc:
        raise RefusedFile(
            f"the outputs folder on this Ray node: {shown}/{name} is a link or not a folder "
            f"({exc.strerror}): nothing is written through it"
        ) from None


def node_listing(node_root: str, job_id: str, account: RunAs | None) -> dict[str, tuple[int, int]]:
    """Rule 2 on the Ray node: its outputs folder made, and its files (as
    :func:`.outputs_return.listing`)."""
    os.close(_outputs(node_root, job_id, account))
    return outputs_return.listing(os.path.join(node_root, job_id, "outputs"))


def write(node_root: str, job_id: str, pieces: list[Piece], account: RunAs | None, reserve: int) -> None:
    """Rule 4 on the Ray node: each piece written into its file's new name (the first piece
    makes it), the file renamed over its place once whole.

    Raises:
        RefusedFile: a path that is not plain, too deep or too long, a link or non-folder on its
            way, a new file that is not where the last piece left it, a place that cannot be
            replaced (a folder of that name).
        DiskFull: a piece would leave less than ``reserve`` bytes free on the disk (rule 3).
    """
    top = _outputs(node_root, job_id, account)
    try:
        for relative, token, offset, data, size, mtime_ns in pieces:
            _piece(top, relative, token, offset, data, size, mtime_ns, account, reserve)
    finally:
        os.close(top)


def _piece(
    top: int,
    relative: str,
    token: str,
    offset: int,
    data: bytes,
    size: int,
    mtime_ns: int,
    account: RunAs | None,
    reserve: int,
) -> None:
    try:
        parts = outputs_writer.plain_parts(relative, foldersize.MAX_DEPTH)
    except ValueError as exc:
        raise RefusedFile(f"the outputs file {relative[:200]!r}: {exc}") from None
    if len(token) != 16 or not all(c in "0123456789abcdef" for c in token):
        raise RefusedFile(f"the outputs file {relative[:200]}: {token[:20]!r} is no token")
    folder = os.dup(top)
    try:
        for part in parts[:-1]:
            nxt = _folder(folder, part, account, "outputs")
            os.close(folder)
            folder = nxt
        name = parts[-1]
        temp = f".{os.fsdecode(os.fsencode(name)[:200])}.{token}.part"
        # never blocked on a FIFO put in the new file's place between two pieces
        flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        try:
            fd = os.open(temp, flags | (os.O_CREAT | os.O_EXCL if offset == 0 else 0), 0o600, dir_fd=folder)
        except OSError as exc:
            raise RefusedFile(
                f"the outputs file {relative}: its new file cannot be opened ({exc.strerror})"
            ) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_size != offset:
                raise RefusedFile(
                    f"the outputs file {relative}: its new file is not as the last piece left it"
                )
            if data:
                vfs = os.fstatvfs(fd)
                if vfs.f_bavail * vfs.f_frsize - len(data) < reserve:
                    raise DiskFull(
                        f"outputs: writing {relative} would leave less than the disk reserve "
                        f"({reserve >> 20} MB, [limits] disk_reserve_mb) free on this Ray node"
                    )
                view, at = memoryview(data), offset
                while view:
                    done = os.pwrite(fd, view, at)
                    view, at = view[done:], at + done
            whole = offset + len(data) >= size
            if whole:
                if account is not None:
                    os.fchown(fd, account.uid, account.gid)
                os.fchmod(fd, 0o644)
                os.utime(fd, ns=(mtime_ns, mtime_ns))
        except BaseException:
            os.close(fd)
            _drop(folder, temp)
            raise
        os.close(fd)
        if whole:
            try:
                os.rename(temp, name, src_dir_fd=folder, dst_dir_fd=folder)
            except OSError as exc:
                _drop(folder, temp)
                raise RefusedFile(
                    f"the outputs file {relative}: its place on this Ray node cannot be replaced "
                    f"({exc.strerror})"
                ) from None
    finally:
        os.close(folder)


def room(node_root: str, job_id: str, needed: int, reserve: int) -> None:
    """Rule 3 on the Ray node: ``needed`` bytes leave ``reserve`` free on the disk of its outputs
    folder, with the downloads running on this machine (:func:`.objects.room`).

    Raises:
        InvalidSpec: the disk, even empty, could not take them beside the reserve.
        DiskFull: not now.
    """
    folder = Path(node_root) / check_job_id(job_id) / "outputs"
    with objects.room(folder, "outputs", "the service's copy of the outputs folder", needed, reserve):
        pass


def _drop(folder: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=folder)
    except OSError:
        pass


# -------------------------------------------------------------- the service's side


def very_folder(here: Path, trusted: Path, looks: Callable[[str], bool]) -> bool:
    """Rule 1: whether ``looks`` (the agent's look for a name in the node's outputs folder) sees
    an empty file made in ``here`` (below ``trusted``, the service's job folder) meanwhile."""
    name = outputs_return.PROBE_PREFIX + secrets.token_hex(8)
    fd = outputs_return._open_below(trusted, here)
    try:
        os.close(
            os.open(
                name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=fd
            )
        )
        try:
            return looks(name)
        finally:
            _drop(fd, name)
    finally:
        os.close(fd)


def seed(
    get: Callable[..., Any],
    agent: Any,
    node_root: str,
    job_id: str,
    here: Path,
    trusted: Path,
    account: RunAs | None,
    reserve: int,
    cancel: threading.Event,
    say: Callable[[str], None],
    host: str,
) -> dict[str, tuple[int, int]]:
    """Rules 1 to 6 for one Ray node (``agent``, named ``host`` in lines); what its outputs folder
    holds then (rule 6; empty where nothing was copied).

    Raises:
        RefusedFile, InvalidSpec, DiskFull, Conflict, BackendUnavailable, NodeGone: the copy
            failed (the reason, naming the Ray node).
    """
    if not here.is_dir():
        return {}  # nothing was written: the first attempt's folder is empty
    node_outputs = os.path.join(node_root, job_id, "outputs")
    try:
        if very_folder(here, trusted, lambda name: bool(get(agent.outputs_seen.remote(node_outputs, name)))):
            return {}
        ours = outputs_return.listing(str(here))
        theirs = get(agent.outputs_seed_listing.remote(node_root, job_id, account))
        send = {
            r: (int(s[0]), int(s[1]))
            for r, s in sorted(ours.items())
            if outputs_return.plain(r)
            and not os.path.basename(r).startswith(outputs_return.PROBE_PREFIX)  # another node's look
            and tuple(theirs.get(r, ())) != tuple(s)
            and not _newer_there(theirs.get(r), s)
        }
        if not send:
            return _carried(ours, theirs)
        total = sum(size for size, _ in send.values())
        started = time.monotonic()
        get(agent.outputs_seed_room.remote(node_root, job_id, total, reserve))
        sent = _send(
            get, agent, node_root, job_id, here, send, account, reserve, cancel, say, host, started, total
        )
        say(
            f"outputs: {len(send)} file(s) of the service's copy ({sent / 1e6:.1f} MB) written into "
            f"the outputs folder on Ray node {host} ({time.monotonic() - started:.2f} s)"
        )
        return _carried(ours, get(agent.outputs_seed_listing.remote(node_root, job_id, account)))
    except MaJupyterError as exc:
        raise type(exc)(f"the copy of the outputs folder to Ray node {host} failed: {exc.message}") from None


def _send(
    get: Callable[..., Any],
    agent: Any,
    node_root: str,
    job_id: str,
    here: Path,
    send: dict[str, tuple[int, int]],
    account: RunAs | None,
    reserve: int,
    cancel: threading.Event,
    say: Callable[[str], None],
    host: str,
    started: float,
    total: int,
) -> int:
    """Rule 4 and 5's progress: the files ``send`` (relative -> (size, mtime ns) as listed) in
    batches; the bytes sent.

    Raises:
        RefusedFile: a file of the service's copy changed or went meanwhile.
        Conflict: the job was stopped (``cancel``), or the copy passed :data:`SEED_TIMEOUT`.
    """
    batch: list[Piece] = []
    held = 0
    sent = 0
    said = started

    def flush() -> None:
        nonlocal batch, held, said
        if cancel.is_set():
            raise Conflict(f"job {job_id} ended while its outputs were copied to its Ray nodes")
        if time.monotonic() - started > SEED_TIMEOUT:
            raise Conflict(f"the copy took more than {SEED_TIMEOUT:.0f} s")
        if batch:
            get(agent.outputs_seed_write.remote(node_root, job_id, batch, account, reserve))
        batch, held = [], 0
        now = time.monotonic()
        if now - said >= PROGRESS_EVERY:
            said = now
            rate = sent / max(now - started, 1e-6) / 1e6
            say(
                f"outputs: {sent / 1e6:.1f} of {total / 1e6:.1f} MB of the service's copy written on "
                f"Ray node {host} ({rate:.1f} MB/s)"
            )

    for relative, (size, mtime_ns) in send.items():
        token = secrets.token_hex(8)
        offset = 0
        while True:
            want = min(size - offset, BATCH - held, outputs_return.CHUNK)
            data = outputs_return.read_piece(str(here), relative, offset, want) if want else b""
            if len(data) < want:
                raise RefusedFile(
                    f"the outputs file {relative} of the service's copy changed or went meanwhile"
                )
            batch.append((relative, token, offset, data, size, mtime_ns))
            offset += len(data)
            held += len(data)
            sent += len(data)
            if held >= BATCH or len(batch) >= BATCH_FILES:
                flush()
            if offset >= size:
                break
    flush()
    return sent


class SeedsOutputs:
    """Contract rule 30 for the Ray backend (a part of :class:`.backend.RayBackend`, which gives
    it ``_agents``, its :class:`.agents.Agents`, and ``_node_root``): rules 1 to 6 for each Ray
    node of an attempt's placement, all at once, and what each node's folder then holds."""

    _agents: Any
    _node_root: Path

    def _init_seeds(self) -> None:
        self._seeds_guard = threading.Lock()
        self._seeded: dict[tuple[str, str], dict[str, tuple[int, int]]] = {}

    def seeds_outputs(self, job: Job) -> bool:
        """Whether ``job``'s next attempt is to get the service's copy of its outputs folder: not
        its first, its own outputs folder (outputs in object storage come from their prefix, a
        named host path is each Ray node's own, as the local backend's bind mount of it), and
        the service's copy holds something.  A look at one folder: cheap under the supervisor's
        lock."""
        if job.attempt == 0 or job.spec.outputs:
            return False
        try:
            with os.scandir(config.jobdir(job.id).outputs) as found:
                return next(found, None) is not None
        except OSError:
            return False

    def seed_outputs(
        self,
        job_id: str,
        hosts: list[str],
        account: RunAs | None,
        reserve: int,
        cancel: threading.Event,
        say: Callable[[str], None],
    ) -> None:
        """Rules 1 to 6 for each Ray node of ``hosts``, at once, each on a thread of its own.

        Raises:
            MaJupyterError: the first Ray node's copy that failed (its reason names the node).
        """
        root = config.jobdir(job_id).root
        results: dict[str, dict | BaseException] = {}

        def one(host: str) -> None:
            try:
                agent = self._agents.agent_of(host)
                results[host] = seed(
                    self._agents.get,
                    agent,
                    str(self._node_root),
                    job_id,
                    root / "outputs",
                    root,
                    account,
                    reserve,
                    cancel,
                    say,
                    host,
                )
            except BaseException as exc:  # noqa: BLE001 (handed to the caller below)
                results[host] = exc

        threads = [
            threading.Thread(target=one, args=(h,), name=f"ma-seed-{job_id}", daemon=True) for h in hosts
        ]
        for thread in threads:
            thread.start()
        for thread in threads:  # each bounded: its calls by CALL_TIMEOUT, the copy by SEED_TIMEOUT
            thread.join()
        for host in hosts:
            answer = results.get(host)
            if isinstance(answer, BaseException):
                raise answer
        with self._seeds_guard:
            self._seeded.update({(job_id, h): r for h, r in results.items() if isinstance(r, dict)})

    def seeded(self, job_id: str, host: str) -> dict[str, tuple[int, int]]:
        """Rule 6: what the Ray node ``host``'s outputs folder held after the job's last copy
        there (empty: none), handed over once."""
        with self._seeds_guard:
            return self._seeded.pop((job_id, host), {})


def _carried(ours: dict, theirs: dict) -> dict[str, tuple[int, int]]:
    """Rule 6: the node's files that are the service's copy's (same size and modification time):
    a file only the node holds is not among them, so it is still copied back."""
    return {r: (int(v[0]), int(v[1])) for r, v in theirs.items() if tuple(ours.get(r, ())) == tuple(v)}


def _newer_there(theirs, ours) -> bool:
    """Whether the node's file was written after the service's copy of it was made: a checkpoint
    the node wrote since its last copy back (one refused, or cut short by the node's end) is
    never replaced by the older copy; the copy back brings it."""
    return theirs is not None and int(theirs[1]) > int(ours[1])
