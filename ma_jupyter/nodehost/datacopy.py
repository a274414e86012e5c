"""Data preparation's look at and copy of a dataset, made with the job's account.

A dataset may hold what a job wrote (a FIFO, a setuid file, a symlink to the service's
secrets), so the service neither reads nor copies it with its own rights.  For each dataset:

1. the service (root) opens the dataset's root with :func:`ma_jupyter.untrusted.open_dataset`
   (a FIFO, socket or device is refused there, never opened to block), as bubblewrap would
   bind it for the job, then reads back the path the kernel gives the folder or file *opened*
   (``/proc/self/fd/N``) and checks that one: it must be the resolved path the caller named
   (a folder on the way swapped for a symlink since is refused) and pass the job's mount rules
   (the caller's ``check``, :meth:`.HostPolicy.check_source`: never the service's home, never a
   system folder, inside the allowed roots), whatever was checked on the path before;
2. a copy process, ``python -m ma_jupyter.nodehost.datacopy``, gets that descriptor (and,
   for a copy, a folder's), drops to the job's account (no supplementary groups) before it
   reads anything, opens the root again with that account's rights (a root it may not read
   is refused, as its bind mount would be; the open goes through ``/proc/self/fd``, which
   checks the root's own permissions and not its parents', as bubblewrap's bind, made by root,
   does not either: which folders may be reached at all is rule 1's check), and walks the dataset with :class:`ma_jupyter.untrusted.DatasetWalk`: it
   sees only what the job's account may read below the root, and every file it writes is the
   account's, without setuid, setgid or sticky bits;
3. it prints one JSON line: the dataset's digest, size and file count (or what it refused);
4. a copy goes to ``into/data``: ``into`` is made for the account, given back to the service
   (``fchown``, mode 0700) once the copy process has ended, so nothing of the account can
   change what the service then moves into place; a failed or cancelled copy is removed.

The key of a dataset's state covers its resolved path, the account and the digest: a copy
made with one account's rights is shared only with jobs that run as that account.

Both the local and the Ray backend use this module on the service's machine.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import BackendUnavailable, Cancelled, RefusedFile
from ..foldersize import remove_tree
from ..untrusted import DatasetWalk, open_dataset

#: trees up to this size are keyed by their contents too (see ``service/prepared.py``)
CONTENT_HASH_LIMIT = 64 << 20
#: how often a copy in progress checks whether it was cancelled
CANCEL_POLL = 0.1


@dataclass(frozen=True)
class Account:
    """The account a copy runs as (uid, gid); None in :func:`look` / :func:`copy`: the service's."""

    uid: int
    gid: int


#: the mount rules checked on the root opened (rule 1): raises when the job may not mount it
Check = Callable[[str], None]


def look(source: str, account: Account | None, check: Check | None = None) -> tuple[str, int, int]:
    """The state of the dataset at the resolved path ``source`` (rules 1-3), read as ``account``:
    the store key of this state (see the module docstring), its bytes and its files.

    Raises:
        FileNotFoundError: the dataset is gone.
        RefusedFile: it holds a FIFO, socket or device (the message names it), or something
            the account may not read, or its path now leads elsewhere than ``source``.
        InvalidSpec: ``check`` refused the root opened.
    """
    return _run(source, account, None, None, check)


def copy(
    source: str,
    account: Account | None,
    into: Path,
    cancel: threading.Event | None = None,
    check: Check | None = None,
) -> tuple[str, int, int]:
    """Copy the dataset at the resolved path ``source`` to ``into/data`` as ``account`` (rules
    1-4); the state of what was copied (as :func:`look`).  ``into`` must not exist; on any failure it is removed.

    Raises:
        RefusedFile, InvalidSpec: as :func:`look`.
        Cancelled: ``cancel`` was set before the copy ended.
        OSError: ENOSPC or EDQUOT, the disk ``into`` is on is full (``filename``: ``into``).
    """
    os.mkdir(into, 0o700)
    try:
        into_fd = os.open(into, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            if account is not None:
                os.fchown(into_fd, account.uid, account.gid)
            state = _run(source, account, into_fd, cancel, check, into)
            # the account's processes can no longer rename or replace what is in it
            os.fchown(into_fd, os.geteuid(), os.getegid())
            os.fchmod(into_fd, 0o700)
            kind = os.stat("data", dir_fd=into_fd, follow_symlinks=False).st_mode
            if not (stat.S_ISDIR(kind) or stat.S_ISREG(kind)):
                raise RefusedFile(f"the copy of {source} is not a folder or a file: submit again")
            return state
        finally:
            os.close(into_fd)
    except BaseException:
        remove_tree(into)  # any depth, no link followed
        raise


def _run(
    source: str,
    account: Account | None,
    into_fd: int | None,
    cancel: threading.Event | None,
    check: Check | None,
    into: Path | None = None,
) -> tuple[str, int, int]:
    src_fd = open_dataset(source)
    try:
        _check_opened(src_fd, source, check)
        argv = [sys.executable, "-m", __name__, str(src_fd), str(-1 if into_fd is None else into_fd), source]
        if account is not None:
            argv += [str(account.uid), str(account.gid)]
        package_root = str(Path(__file__).resolve().parents[2])  # <root>/ma_jupyter/nodehost/datacopy.py
        env = {"PATH": os.defpath, "PYTHONPATH": package_root, "PYTHONDONTWRITEBYTECODE": "1"}
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=[src_fd] + ([] if into_fd is None else [into_fd]),
                env=env,
                cwd="/",
                start_new_session=True,
            )
        except OSError as exc:
            raise BackendUnavailable(f"cannot start the data preparation copy: {exc}") from exc
    finally:
        os.close(src_fd)
    while True:
        try:
            out, err = proc.communicate(timeout=CANCEL_POLL)
            break
        except subprocess.TimeoutExpired:
            if cancel is not None and cancel.is_set():
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
                break
    if cancel is not None and cancel.is_set():  # also when it ended meanwhile: nothing is kept
        raise Cancelled(f"the copy of {source} was cancelled")
    try:
        answer = json.loads(out.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        answer = {"error": err.decode(errors="replace").strip()[-2000:] or f"exit status {proc.returncode}"}
    if "refused" in answer:
        raise RefusedFile(answer["refused"])
    if "full" in answer:  # the disk the copy goes to: the supervisor holds the job until there is space
        raise OSError(int(answer["full"]), os.strerror(int(answer["full"])), str(into or source))
    if "error" in answer:
        raise RefusedFile(f"data preparation could not copy {source}: {answer['error']}")
    digest = hashlib.sha256(f"{source}\0{account}\0{answer['digest']}".encode("utf-8", "surrogateescape"))
    return digest.hexdigest()[:32], int(answer["bytes"]), int(answer["files"])


def _check_opened(fd: int, source: str, check: Check | None) -> None:
    """Rule 1's check of the root opened: the job's mount rules on the path the kernel names it
    by, and that path is ``source``.  A folder on the way to ``source`` that a job replaced by a
    symlink after the supervisor's check (to another job's outputs, the service's home) is
    caught here, where what is read is decided."""
    opened = os.readlink(f"/proc/self/fd/{fd}")
    if check is not None:
        check(opened)
    if opened != source:
        raise RefusedFile(
            f"the dataset {source} now leads to {opened}: a folder on its path was replaced while "
            "its data was being prepared; submit again once the path is stable"
        )


def main(argv: list[str]) -> int:
    """The copy process (rules 2 and 3): ``SRC_FD INTO_FD SHOWN [UID GID]`` (INTO_FD -1: look only)."""
    src_fd, into_fd, shown = int(argv[0]), int(argv[1]), argv[2]
    if len(argv) > 3:  # the job's account, before anything of the dataset is read
        uid, gid = int(argv[3]), int(argv[4])
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
    os.umask(0o077)  # the walk sets each copied entry's own mode
    try:
        # opened again with the account's own rights: the root must be readable to it too, as
        # through the bind mount the job would otherwise get (the service's descriptor is not)
        mine = os.open(f"/proc/self/fd/{src_fd}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except PermissionError:
        refused = f"{shown} cannot be read by the account the job runs as: make it readable to that account"
        print(json.dumps({"refused": refused}), flush=True)
        return 2
    os.close(src_fd)
    try:
        walk = DatasetWalk(shown, CONTENT_HASH_LIMIT).run(mine, None if into_fd < 0 else into_fd)
    except RefusedFile as exc:
        print(json.dumps({"refused": str(exc)}), flush=True)
        return 2
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            print(json.dumps({"full": exc.errno}), flush=True)
            return 1
        where = f" ({exc.filename})" if exc.filename else ""
        print(json.dumps({"error": f"{exc.strerror or exc}{where}"}), flush=True)
        return 1
    print(json.dumps({"digest": walk.digest(), "bytes": walk.bytes, "files": walk.files}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
