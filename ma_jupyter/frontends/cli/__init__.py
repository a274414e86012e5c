"""``ma-jupyter``: the job service from the command line.

Commands: ``service start|stop|status``, ``submit [options] -- COMMAND...``, ``clone JOB
[options]``, ``jobs``, ``get``, ``logs``, ``events``, ``wait``, ``stop``, ``delete``, ``update``,
``devenv``, ``export``, ``algorithms``, ``specs``, ``nodes``, ``cluster``, ``tensorboard``, ``shell JOB [--node N] [-- CMD]``, ``cache``, ``data list|rm``, ``whoami``, ``users
list|add|remove|token``.  A JOB argument is a job id or the exact name of a single job.

``export JOB --format k8s`` prints what the job would be on a Kubernetes cluster (YAML for
``kubectl apply -f``); ``submit --dry-run --format k8s ...`` does the same for a job not
submitted.

Every command acts as the user of ``$MA_JUPYTER_TOKEN``, else as the service owner (whose token
is in the service's runtime file).

Exit codes: 0 success; ``wait`` and ``submit --wait`` exit 1 unless the job succeeded; a user
error prints one line ``error: <message>`` to stderr and exits 2; an interrupt exits 130; any
other failure (a file the command cannot read, a broken connection, a bug) prints one line
``error: <what>: <message>`` and exits 1, never a traceback (``MA_JUPYTER_DEBUG=1`` shows it).
``delete A B C`` deletes each job it can, says on stderr why any other was not (one line per
job, then ``error: N of M jobs not deleted``) and then exits 2.  ``shell`` exits with the
status of the node's shell (or of its command), as ``ssh`` does.

Everything a command prints goes through :class:`~ma_jupyter.frontends.render.TerminalSafe`
(stdout and stderr): a job's logs, names, reasons, commands and events never drive the
reader's terminal; their control characters are shown (``^[``, ``\\x9b``: see
:func:`~ma_jupyter.frontends.render.terminal_text`), SGR colours kept on a terminal only.
The debug terminal (``shell``) is the one raw path: it is a terminal session by request.

The package holds one module per group of commands (``jobs``, ``logs``, ``submit``,
``devtools``, ``cluster``, ``account``, ``service``), the parser (``parser``) and what they print
alike (``output``); a call imports the module of the command it runs only (:data:`COMMANDS`).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from importlib import import_module

from ...errors import InvalidSpec, MaJupyterError
from .. import options, render
from .output import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, err
from .parser import build_cli

__all__ = [
    "COMMANDS",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "build_cli",
    "main",
    "parse_command_line",
]

#: each sub-command -> the module of this package that runs it (its ``COMMANDS[name]``)
COMMANDS = {
    "service": "service",
    "submit": "submit",
    "clone": "submit",
    "whoami": "account",
    "users": "account",
    "notify": "account",
    "images": "account",
    "jobs": "jobs",
    "get": "jobs",
    "logs": "logs",
    "events": "jobs",
    "top": "jobs",
    "wait": "jobs",
    "stop": "jobs",
    "delete": "jobs",
    "update": "jobs",
    "devenv": "devtools",
    "export": "devtools",
    "tensorboard": "devtools",
    "shell": "devtools",
    "algorithms": "account",
    "specs": "cluster",
    "nodes": "cluster",
    "cluster": "cluster",
    "cache": "account",
    "data": "account",
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``ma-jupyter`` command; returns the exit code (see the module docstring)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    stdout, stderr = sys.stdout, sys.stderr
    # every print of this command, job-made text included, is shown without driving the terminal
    sys.stdout, sys.stderr = render.TerminalSafe(stdout), render.TerminalSafe(stderr)
    try:
        return _command(argv)
    finally:
        sys.stdout, sys.stderr = stdout, stderr


def parse_command_line(argv: list[str]) -> argparse.Namespace:
    """The parsed command line; everything after the first ``--`` is the run command.

    argparse alone fills a sub-command's ``command`` (``nargs="*"``) with nothing as soon as it
    meets the positional before it (``clone JOB``, ``shell JOB``), and then refuses the words
    after ``--`` when options came between (``clone JOB --name X -- python t.py``).  So the
    words after ``--`` are set aside first and become ``command`` of a sub-command that has
    one; for any other the whole line is parsed as it is (and ``--`` refused as usual).
    """
    # the first word is the sub-command unless it is an option (--help, --version, a mistake)
    parser = build_cli(argv[0] if argv and not argv[0].startswith("-") else None)
    if "--" in argv:
        cut = argv.index("--")
        args = parser.parse_args(argv[:cut])
        if hasattr(args, "command"):
            args.command = argv[cut + 1 :]
            return args
    return parser.parse_args(argv)


def _command(argv: list[str]) -> int:
    try:
        try:
            args = parse_command_line(argv)
        except InvalidSpec as exc:
            if argv[:1] == ["submit"] and "--" not in argv and "unrecognized arguments" in exc.message:
                raise InvalidSpec(
                    f"{exc.message}; put the command after `--`: ma-jupyter submit [options] -- python train.py --lr 1"
                ) from None
            raise
        return _run_command(args)
    except options.OptionsExit as exc:
        return exc.status
    except MaJupyterError as exc:
        err(f"error: {render.one_line(exc.message)}")
        return EXIT_USAGE
    except TimeoutError as exc:
        err(f"error: {exc}")
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # `ma-jupyter logs JOB | head`: the reader left; nothing more to say
        getattr(sys.stderr, "stream", sys.stderr).close()
        return EXIT_OK
    except Exception as exc:  # noqa: BLE001 - a command line answers in one line, whatever failed
        if os.environ.get("MA_JUPYTER_DEBUG") == "1":
            raise
        err(
            f"error: {type(exc).__name__}: {render.one_line(str(exc)) or 'no message'} (MA_JUPYTER_DEBUG=1 shows where)"
        )
        return EXIT_FAILED


def _run_command(args: argparse.Namespace) -> int:
    """Run the parsed command: its module is imported now, the other groups' never."""
    return import_module(f"{__name__}.{COMMANDS[args.cmd]}").COMMANDS[args.cmd](args)
