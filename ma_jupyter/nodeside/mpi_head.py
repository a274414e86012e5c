"""worker-0's step before an MPI job's command: ``python -m ma_jupyter.nodeside.mpi_head -- CMD ...``

It runs inside the node, with the node's final environment, and then replaces itself with CMD:

1. it writes ``$TUNE_ENV_FILE`` (seed 003): one ``-x NAME=VALUE`` line per variable of this
   node whose name matches :data:`TUNE_NAMES` (seed 003's ``env | grep -E
   '^MA_|^SHARED_|^S3_|^PATH|^VC_WORKER_|^SCC|^CRED'``) and whose value is not empty (its
   ``grep -v '=$'``), sorted by name.  The lines carry seed 004's ``-x`` in front (its
   ``run_mpi.sh`` adds it with ``sed``): that is the form ``mpirun -tune FILE`` reads, and Open
   MPI 5 silently ignores a bare ``NAME=VALUE`` line.  A value with white space or a line break
   cannot be one word of that file (mpirun refuses the whole file): such a variable is left
   out, and a line on stderr names it.  The file is written only where the node has a private
   ``/tmp`` (the sandbox: ``TMPDIR`` is ``/tmp``), never into the host's shared ``/tmp``;
2. where ``LD_LIBRARY_PATH`` is not set it sets it empty (the dynamic loader ignores an empty
   one): the seed's ``-x LD_LIBRARY_PATH`` then forwards nothing instead of making Open MPI 5
   print a warning banner into the job's log.

Standard library only, and no :mod:`re`: it runs once per MPI job before mpirun starts.
"""

from __future__ import annotations

import os
import sys

#: seed 003's name prefixes (``grep -E '^MA_|^SHARED_|^S3_|^PATH|^VC_WORKER_|^SCC|^CRED'``)
TUNE_NAMES = ("MA_", "SHARED_", "S3_", "PATH", "VC_WORKER_", "SCC", "CRED")
TUNE_ENV = "TUNE_ENV_FILE"


def tune_lines(env: dict[str, str]) -> tuple[list[str], list[str]]:
    """The file's lines for ``env``, and the names left out for white space in their value."""
    lines, skipped = [], []
    for name in sorted(env):
        value = env[name]
        if not name.startswith(TUNE_NAMES) or not value:
            continue
        if any(c.isspace() for c in value):
            skipped.append(name)
            continue
        lines.append(f"-x {name}={value}\n")
    return lines, skipped


def write_tune_file(env: dict[str, str]) -> None:
    """Write ``$TUNE_ENV_FILE`` (rule 1 of the module docstring); a failure is reported, not fatal."""
    path = env.get(TUNE_ENV)
    if not path:
        return
    if env.get("TMPDIR", "/tmp") != "/tmp" and path.startswith("/tmp/"):
        print(
            f"[ma_jupyter] {TUNE_ENV} not written: this node has no private /tmp", file=sys.stderr, flush=True
        )
        return
    lines, skipped = tune_lines(env)
    for name in skipped:
        print(
            f"[ma_jupyter] {TUNE_ENV} leaves out {name}: its value has white space",
            file=sys.stderr,
            flush=True,
        )
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.writelines(lines)
    except OSError as exc:
        print(f"[ma_jupyter] cannot write {TUNE_ENV} {path}: {exc}", file=sys.stderr, flush=True)


def main(argv: list[str]) -> int:
    """Write the file, then replace this process with the command (127 if it cannot start)."""
    if len(argv) < 2 or argv[0] != "--":
        print("usage: python -m ma_jupyter.nodeside.mpi_head -- COMMAND...", file=sys.stderr)
        return 2
    command = argv[1:]
    write_tune_file(dict(os.environ))
    os.environ.setdefault("LD_LIBRARY_PATH", "")
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"[ma_jupyter] cannot start {command[0]}: {exc}", file=sys.stderr, flush=True)
        return 127 if isinstance(exc, FileNotFoundError) else 126
    return 126  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
