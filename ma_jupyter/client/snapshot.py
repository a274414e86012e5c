"""Code snapshots: a fresh copy of a job's algorithm under ``$MA_JUPYTER_HOME/snapshots``, so
later edits to a notebook or a folder never change a submitted job.

The notebook snapshots a cell body (plus ``--code-dir``); the command line ships the current
folder when the command names a file in it (``ma-jupyter submit -- python train.py``).  This
module is the only one that writes under ``snapshots/`` (the host policy lets a job mount
exactly one such folder read-only as its algorithm).
"""

from __future__ import annotations

import os
import shlex
import stat
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from .. import statehome
from ..errors import InvalidSpec

# ``ma_jupyter.algorithm_content`` (with ``shutil``) and ``ma_jupyter.foldersize`` are imported
# where a folder is measured or copied: a submit whose command names no local file (``ma-jupyter
# submit -- python -c ...``) ships nothing and does not pay for them.

#: the most a folder shipped by default may hold (bytes)
SHIP_LIMIT = 100 << 20


def snapshots_root() -> Path:
    return statehome.home() / "snapshots"


def new_snapshot(name: str) -> Path:
    """A fresh, not yet existing folder for one snapshot of job ``name``."""
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    folder = snapshots_root() / f"{name}-{stamp}-{os.urandom(3).hex()}"
    folder.parent.mkdir(parents=True, exist_ok=True)
    return folder


def is_snapshot(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is one snapshot folder (which nothing runs once its submit failed)."""
    return Path(path).parent == snapshots_root()


def folder_size(source: Path, limit: int | None = None) -> tuple[int, int]:
    """``(files, bytes)`` a copy of ``source`` would hold (what
    :func:`ma_jupyter.algorithm_content.ignore` leaves out skipped, regular files counted:
    :func:`ma_jupyter.foldersize.folder_size`); counting stops once ``limit`` bytes are passed.

    Raises:
        FolderRefused: the walk refuses the folder (a chain of folders too deep, too many
            entries; the message says which and what to remove).
    """
    from ..algorithm_content import ignore
    from ..foldersize import folder_size as measure

    found = measure([source], limit=limit, ignore=ignore)
    return found.files, found.bytes


def copy_folder(source: Path, target: Path) -> None:
    """Copy ``source`` into ``target`` (symlinks kept as links, FIFOs, sockets and devices left
    out, what :func:`ma_jupyter.algorithm_content.ignore` leaves out skipped: the copy has the
    source's digest), readable by every account: a job may run as another account than its
    submitter (``nobody`` for root's jobs), and the snapshot sits in the 0700 service home,
    which no other user can enter.  The walk is :func:`ma_jupyter.foldersize.walk` (iterative,
    bounded: a folder it refuses raises :class:`~ma_jupyter.errors.FolderRefused`)."""
    import shutil

    from ..algorithm_content import ignore
    from ..foldersize import walk

    for path, dir_fd, entries in walk([source], ignore=ignore):
        folder = os.path.normpath(os.path.join(target, path))
        os.makedirs(folder, exist_ok=True)
        os.chmod(folder, 0o755)
        for name, entry in entries:
            into = os.path.join(folder, name)
            if stat.S_ISLNK(entry.st_mode):
                os.symlink(os.readlink(name, dir_fd=dir_fd), into)
            elif stat.S_ISREG(entry.st_mode):
                mode = stat.S_IMODE(entry.st_mode) | 0o444 | (0o111 if entry.st_mode & stat.S_IXUSR else 0)
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
                with os.fdopen(fd, "rb") as src, open(into, "wb") as dst:
                    shutil.copyfileobj(src, dst)
                os.chmod(into, mode)


#: shells whose ``-c`` script is read for the files it names (``bash -c "python train.py | tee x"``)
SHELLS = ("bash", "sh", "dash", "zsh", "ksh")


def names_local_file(command: str | Sequence[str] | None, cwd: Path) -> bool:
    """Whether the command names a file of ``cwd`` by a relative path (``python train.py``,
    ``bash run.sh``, ``./train``, ``python -m pkg.train`` with ``pkg/`` here), also inside the
    script of a shell's ``-c`` (``bash -c "python train.py | tee log"``, ``sh -ec "..."``), where
    a folder of ``cwd`` the script enters counts too (``bash -c "cd src && make"``)."""
    if not command:
        return False
    try:
        argv = shlex.split(command) if isinstance(command, str) else list(command)
    except ValueError:
        return False
    root = cwd.resolve()
    script = _shell_script(argv)
    if script is not None:
        words = _script_words(script)
        # `bash -c "cd src && python train.py"`: the folder the script enters is the current one's
        entered = [words[i + 1] for i, w in enumerate(words[:-1]) if w == "cd"]
        if any(_local_folder(root, folder) for folder in entered):
            return True
        return _names_local_file(words, root)
    return _names_local_file(argv, root)


def _local_folder(root: Path, name: str) -> bool:
    """Whether the relative ``name`` is a folder below ``root``."""
    if not name or os.path.isabs(name) or "$" in name or name.startswith(("-", "~")):
        return False
    try:
        folder = (root / name).resolve()
        return folder != root and folder.is_relative_to(root) and folder.is_dir()
    except OSError:
        return False


def _shell_script(argv: list[str]) -> str | None:
    """The script of ``SHELL [options] -c SCRIPT ...`` (None: not such a command)."""
    if not argv or os.path.basename(argv[0]) not in SHELLS:
        return None
    for index, arg in enumerate(argv[1:], start=1):
        if not arg.startswith("-") or arg == "--":
            return None  # a script file (bash run.sh) or the end of the options: no -c
        if "c" in arg[1:] and not arg.startswith("--"):
            return argv[index + 1] if index + 1 < len(argv) else None
    return None


def _script_words(script: str) -> list[str]:
    """The words of a shell script, its operators (``|``, ``&&``, ``;``, ``>``...) split off;
    a script shlex cannot read (an unclosed quote) gives its blank-separated words."""
    lexer = shlex.shlex(script, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        return list(lexer)
    except ValueError:
        return script.split()


def _names_local_file(argv: list[str], root: Path) -> bool:
    after_m = False
    for arg in argv:
        if after_m:
            after_m = False
            top = arg.split(".")[0]
            if top and ((root / top).is_dir() or (root / f"{top}.py").is_file()):
                return True
            continue
        if arg == "-m":
            after_m = True
            continue
        if not arg or arg.startswith("-") or os.path.isabs(arg) or "$" in arg:
            continue
        candidate = root / arg
        try:
            if candidate.is_file() and candidate.resolve().is_relative_to(root):
                return True
        except (OSError, ValueError):
            continue
    return False


#: where the ModelArts container layout shows the code folder (seed 000: user-job-dir/<folder>)
MODELARTS_CODE_ROOT = "/home/ma-user/modelarts/user-job-dir/"


def modelarts_code_folder(command: str | Sequence[str] | None, cwd: Path) -> Path | None:
    """The local folder a ModelArts-style command means (``python
    /home/ma-user/modelarts/user-job-dir/mnist/train.py``, also inside a shell's ``-c`` script):
    the current folder when it is named ``mnist``, else its subfolder ``mnist``; None when the
    command names no such path or neither folder exists."""
    if not command:
        return None
    try:
        argv = shlex.split(command) if isinstance(command, str) else list(command)
    except ValueError:
        return None
    script = _shell_script(argv)
    words = _script_words(script) if script is not None else argv
    root = cwd.resolve()
    for word in words:
        if not word.startswith(MODELARTS_CODE_ROOT):
            continue
        name = word[len(MODELARTS_CODE_ROOT) :].split("/")[0]
        if not name or name in (".", "..") or "$" in name:
            continue
        if root.name == name:
            return root
        if (root / name).is_dir() and not (root / name).is_symlink():
            return root / name
    return None


def ship_working_folder(body: dict, cwd: Path | None = None) -> str | None:
    """Ship the current folder as the job's algorithm when the spec names none and its command
    names a file in the folder (:func:`names_local_file`), or, under the ModelArts convention,
    the folder a ``/home/ma-user/modelarts/user-job-dir/<folder>/...`` path means
    (:func:`modelarts_code_folder`): ``body["algorithm"]`` becomes a fresh snapshot (read-only at
    ``/workspace/algorithm``, the working directory; the ModelArts layout shows it at
    ``user-job-dir/<folder>``) and ``body["algorithm_origin"]`` the folder it was copied from
    (search by algorithm finds the job under it); with
    ``algorithm_read_only`` false (``--code-writable``) it is the folder itself, shown writable
    and shared by the job's nodes, as ``--code-dir . --code-writable`` would (no copy, so no
    size limit; the service's mount rules apply to it).  Returns a sentence saying so, or None
    when nothing is shipped.  Only a snapshot is the caller's to remove if the submit fails
    (:func:`is_snapshot`).

    Raises:
        InvalidSpec: the folder holds more than :data:`SHIP_LIMIT` bytes (what to do instead is
            in the message).
    """
    cwd = Path.cwd() if cwd is None else cwd
    if body.get("algorithm"):
        return None
    if body.get("convention") == "modelarts" and (named := modelarts_code_folder(body.get("command"), cwd)):
        cwd = named
    elif not names_local_file(body.get("command"), cwd):
        return None
    if body.get("algorithm_read_only") is False:
        body["algorithm"] = os.path.normpath(cwd.resolve())
        return (
            f"mounted {body['algorithm']} itself as /workspace/algorithm, writable (--code-writable): "
            "what the job writes there lands in your folder, shared by its nodes"
        )
    files, size = folder_size(cwd, SHIP_LIMIT)
    if size > SHIP_LIMIT:
        raise InvalidSpec(
            f"the command names a file in {cwd}, which is shipped to the job when no --code-dir is "
            f"given, but the folder holds more than {SHIP_LIMIT >> 20} MB: pass --code-dir with a "
            "folder holding only the code, and mount data with --dataset (or mount the folder "
            "itself with --code-writable)",
            field="algorithm",
        )
    target = new_snapshot(str(body.get("name") or "job"))
    copy_folder(cwd, target)
    body["algorithm"] = str(target)
    body["algorithm_origin"] = os.path.normpath(cwd.resolve())
    return (
        f"shipped {cwd} ({files} files, {size / (1 << 20):.1f} MB) as /workspace/algorithm, "
        "a read-only copy: later edits do not reach the job"
    )
