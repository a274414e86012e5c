"""``python -I -S exec_env.py ENV_FILE [--copy SRC DST LIMIT FD] -- COMMAND...``: run COMMAND
with exactly the variables in ENV_FILE (``K=V`` entries separated by NUL bytes), like
``env -i K=V... COMMAND``.

With ``--copy`` (a node's first phase, at its first launch), it first fills the node's working
copy DST from SRC (:func:`ma_jupyter.nodeside.workdir.copy`, at most LIMIT bytes), then writes
the time the copy was complete (nanoseconds, one line) to the descriptor FD, which the node runner
reads to record it, and closes FD; a copy that fails ends here (exit 3 over the limit, 1 else)
with a message, and COMMAND never runs.  Doing this here rather than in a phase of its own saves
a sandbox start at every node's first launch.

The node's sandbox runs it after switching to the job's account: the job's variables (its
``PATH``, an ``LD_PRELOAD``) then apply to the job's own command only, and they travel in a file
of the sandbox instead of on a command line, which every user of the host can read.  Standard
library only: it runs under the job's own interpreter.
"""

from __future__ import annotations

import os
import sys

# ``shutil`` is not imported on purpose: it costs more to import (13 ms) than this whole helper
# takes otherwise, and every node of every job runs it

#: the runner replaces this argument of a bubblewrap argv with a descriptor holding the node's
#: variables (:func:`env_file_data`), which bubblewrap shows inside the sandbox as ENV_FILE
ENV_FD = "{env-fd}"
ENV_FILE = "/run/ma_jupyter/env"
#: the runner replaces this argument with the descriptor ``--copy`` reports the copy's end on
COPY_FD = "{copy-fd}"


def env_file_data(env: dict[str, str]) -> bytes:
    """The content of ENV_FILE: ``K=V`` entries separated by NUL bytes."""
    return b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items())


def which(name: str, path: str) -> str | None:
    """The first executable file called ``name`` on ``path``, as :func:`shutil.which` finds it."""
    for folder in path.split(os.pathsep):
        candidate = os.path.join(folder, name)
        if os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
            return candidate
    return None


def _copy(src: str, dst: str, limit: str, fd: str) -> int:
    """The working copy (see the module docstring); 0 when it is complete."""
    import time

    # -I leaves this folder off sys.path: put it first (the job's folders never are) and import
    # the sibling helper; not importlib.util, whose own imports cost more (8 ms) than the copy
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import workdir

    code = workdir.main(["copy", src, dst, limit])
    if code == 0:
        os.write(int(fd), f"{time.time_ns()}\n".encode())
    os.close(int(fd))
    return code


def main(argv: list[str]) -> int:
    """Replace this process with the command; 127 if it cannot be found, 126 if not run."""
    copy = None
    if len(argv) > 6 and argv[1] == "--copy":
        copy, argv = argv[2:6], [argv[0], *argv[6:]]
    if len(argv) < 3 or argv[1] != "--":
        print("usage: exec_env.py ENV_FILE [--copy SRC DST LIMIT FD] -- COMMAND...", file=sys.stderr)
        return 2
    with open(argv[0], "rb") as fh:
        entries = [e for e in fh.read().split(b"\0") if e]
    env = {}
    for entry in entries:
        key, _, value = entry.partition(b"=")
        env[os.fsdecode(key)] = os.fsdecode(value)
    if copy is not None:
        code = _copy(*copy)
        if code != 0:
            return code
    command = argv[2:]
    program = command[0] if "/" in command[0] else which(command[0], env.get("PATH", os.defpath))
    if program is None:
        print(
            f"[ma_jupyter] cannot start {command[0]}: not found on the job's PATH",
            file=sys.stderr,
            flush=True,
        )
        return 127
    try:
        os.execve(program, command, env)
    except OSError as exc:
        print(f"[ma_jupyter] cannot start {command[0]}: {exc}", file=sys.stderr, flush=True)
        return 127 if isinstance(exc, FileNotFoundError) else 126
    return 126  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
