"""``python -I -S exec_env.py ENV_FILE -- COMMAND...``: run COMMAND with exactly the variables
in ENV_FILE (``K=V`` entries separated by NUL bytes), like ``env -i K=V... COMMAND``.

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


def main(argv: list[str]) -> int:
    """Replace this process with the command; 127 if it cannot be found, 126 if not run."""
    if len(argv) < 3 or argv[1] != "--":
        print("usage: exec_env.py ENV_FILE -- COMMAND...", file=sys.stderr)
        return 2
    with open(argv[0], "rb") as fh:
        entries = [e for e in fh.read().split(b"\0") if e]
    env = {}
    for entry in entries:
        key, _, value = entry.partition(b"=")
        env[os.fsdecode(key)] = os.fsdecode(value)
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
