"""Inside a job's environment: ``%ma_devenv`` (a notebook that submits the job again, or the
job's own sandbox as a Jupyter kernel) and ``%ma_shell`` (a terminal in a running node).
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from IPython.core.error import UsageError

from .parsing import job_parser, parse, resolve_job

if TYPE_CHECKING:
    from IPython.core.magic import Magics

    from ....client import JobHandle

#: the output JupyterLab's extension turns into a button opening the node's terminal in a tab
SHELL_MIME = "application/vnd.ma-jupyter.shell+json"


def devenv_kernel(ref: str, node: str | None) -> JobHandle:
    """``%ma_devenv JOB --kernel``: start the dev environment and install its kernelspec."""
    from ....client.kernelspec import start_devenv_kernel
    from ..session import get_client

    client = get_client()
    started = start_devenv_kernel(client, resolve_job(client, ref).id, node)
    made = started.devenv
    print(
        f"started dev environment {made.id} ({made.info.status.value}): job {started.source.id}'s "
        f"{started.node} with a Jupyter kernel; open a notebook with the kernel "
        f"'{started.display_name}' ({started.kernel_name}) to run code there; `%ma_stop {made.id}` ends it"
    )
    return made


def ma_devenv(magics: Magics, line: str):
    """Write a notebook that submits a job again, next to this one: ``%ma_devenv JOB``.

    The seed's "create a development environment from a job": its first code cell is the
    ``%%ma_train`` cell with the job's options and code (see
    :mod:`ma_jupyter.export.notebook`).  The file is ``<job name>-devenv.ipynb`` in this
    notebook's folder (``-2``, ``-3``... when taken); a link to it is shown.  Returns its path.

    ``%ma_devenv JOB --kernel [--node N]`` starts the job's own environment instead: a dev
    environment job with the sandbox of the job's node N (default its first) running a
    Jupyter kernel, and installs its kernelspec (``ma_jupyter: <job name> (<node>)``) for
    this account; a notebook opened with it runs there.  Returns the dev environment's handle.
    """
    from .. import record as notebook_record
    from ..session import get_client

    parser = job_parser("%ma_devenv", "Write a notebook that submits the job again.")
    parser.add_argument("--to", metavar="FOLDER", help="write it there (default: this notebook's folder)")
    parser.add_argument(
        "--kernel",
        action="store_true",
        help="start the job's own environment as a Jupyter kernel instead",
    )
    parser.add_argument("--node", help="with --kernel: the job's node (worker-1, or 1); default its first")
    args = parse(parser, line)
    if args is None:
        return None
    if args.kernel:
        return devenv_kernel(args.job, args.node)
    if args.node:
        raise UsageError("%ma_devenv: --node chooses the node of a dev environment's kernel: add --kernel")
    import json
    import os
    from pathlib import Path

    client = get_client()
    handle = resolve_job(client, args.job)
    made = client.devenv(handle.id)
    here = notebook_record.notebook_path()
    folder = Path(args.to) if args.to else (here.parent if here is not None else Path.cwd())
    if not folder.is_dir():
        raise UsageError(f"%ma_devenv: --to {folder}: not a folder")
    stem = Path(made["name"]).stem
    path = folder / made["name"]
    number = 1
    while path.exists():
        number += 1
        path = folder / f"{stem}-{number}.ipynb"
    path.write_text(json.dumps(made["notebook"], indent=1, ensure_ascii=False) + "\n")
    from IPython.display import FileLink, display

    try:
        shown = os.path.relpath(path)
    except ValueError:
        shown = str(path)
    print(f"wrote {path}: a notebook that submits job {handle.id} ({handle.name}) again")
    display(FileLink(shown))
    return str(path)


def ma_shell(magics: Magics, line: str):
    """A terminal inside a running node's sandbox (jobs submitted with ``--debug-terminal``).

    ``%ma_shell JOB [--node N] -- CMD ...`` runs CMD on the node's terminal and prints what
    it printed (and its exit status unless 0); ``%ma_shell JOB [--node N]`` offers the
    interactive shell: JupyterLab shows a button that opens it in a terminal tab, elsewhere
    the line to run in a terminal.
    """
    from ..session import get_client

    parser = job_parser("%ma_shell", "Open a terminal inside a running node's sandbox.")
    parser.add_argument("--node", help="node (worker-0, ps-0...); default the job's first")
    parser.add_argument("command", nargs="*", help="after --: a command to run there")
    args = parse(parser, line)
    if args is None:
        return None
    client = get_client()
    handle = resolve_job(client, args.job)
    node = args.node or (handle.info.nodes[0].name if handle.info.nodes else "worker-0")
    if args.command:
        from ....client.shell import run_command

        out, code = run_command(client.shell(handle.id, node, command=args.command), timeout=None)
        print(out, end="" if out.endswith("\n") or not out else "\n")
        if code:
            print(f"[exit status {code}]")
        return None
    from IPython.display import display

    from ....models import check_node_target

    # the bundle names what JupyterLab's button opens: only an id and a node of the wire
    # model's shapes go into it (the extension checks them again, as it does every notebook's)
    check_node_target(handle.id, node)
    command = f"ma-jupyter shell {shlex.quote(handle.id)} --node {shlex.quote(node)}"
    display(
        {
            SHELL_MIME: {"job": handle.id, "node": node},
            "text/plain": f"debug terminal of {node}: run `{command}` in a terminal",
        },
        raw=True,
    )
    return None
