"""The magics' arguments: a parser that never ends the kernel, the job and job-options parsers.

Every magic parses its line here: a bad argument is one ``UsageError`` line naming the magic and
its ``--help``; ``--help`` prints and the magic returns None.  ``%%ma_train`` and ``%ma_clone``
share the job options of ``ma-jupyter submit`` (:mod:`ma_jupyter.frontends.options`) plus the
options only a notebook has.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import TYPE_CHECKING

from IPython.core.error import UsageError

# Light imports only (see the package's docstring): the standard library, IPython and the errors.
from ....errors import HelpShown, MaJupyterError, OptionsExit
from ....workspace_paths import script_command

if TYPE_CHECKING:
    from ....client import Client, JobHandle


class MagicParser(argparse.ArgumentParser):
    """An argparse parser that never exits the kernel: errors become one UsageError line."""

    def error(self, message: str):  # noqa: D401 - argparse hook
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")

    def exit(self, status: int = 0, message: str | None = None):
        if message:
            print(message, file=sys.stderr if status else sys.stdout, end="")
        raise HelpShown()


def parse(parser: argparse.ArgumentParser, line: str) -> argparse.Namespace | None:
    """Parse a magic's line; None when ``--help`` was shown."""
    try:
        argv = shlex.split(line)
    except ValueError as exc:
        raise UsageError(f"{parser.prog}: {exc} (check the quotes)") from None
    try:
        return parser.parse_args(argv)
    except HelpShown:
        return None
    except SystemExit as exc:
        # a parser built elsewhere may still exit on --help or errors: never let it end the kernel
        if exc.code in (0, None):
            return None
        raise UsageError(f"{parser.prog}: invalid arguments (see {parser.prog} --help)") from None


def job_parser(prog: str, description: str, *, job: str = "one", **kw) -> MagicParser:
    """A magic's parser whose first argument names jobs: ``one``, ``many`` or ``optional``
    (anything else: none)."""
    parser = MagicParser(prog=prog, description=description, **kw)
    if job == "one":
        parser.add_argument("job", help="job id (or the exact name of a single job)")
    elif job == "many":
        parser.add_argument("job", nargs="+", help="job ids or names")
    elif job == "optional":
        parser.add_argument("job", nargs="?", help="job id or name")
    return parser


#: where a NotFound tells the user to look for their jobs
JOBS_HINT = "`%ma_jobs`"


def resolve_job(client: Client, ref: str) -> JobHandle:
    """The job ``ref`` names (see :func:`ma_jupyter.client.resolve.resolve_job`)."""
    from ....client.resolve import resolve_job as resolve

    return resolve(client, ref, hint=JOBS_HINT)


def spec_parser(prog: str, *, clone: bool = False) -> argparse.ArgumentParser:
    """The shared job-options parser plus the options only a notebook has."""
    from ... import options
    from .. import live

    parser = options.build_parser(prog)
    group = parser.add_argument_group("notebook")
    if clone:
        group.add_argument("job", help="id (or name) of the job to clone")
    group.add_argument(
        "--command",
        default=None,
        help=f"run command (default: {script_command('<name>')} for the cell body; "
        "for a clone, the cloned job's)",
    )
    group.add_argument("--out", metavar="VAR", help="also bind the JobHandle to this variable")
    group.add_argument(
        "--no-follow", action="store_true", help="return at once instead of following the logs"
    )
    group.add_argument(
        "--follow-node",
        metavar="NODE",
        help="follow only this node's log (worker-1, ps-0...); default every node's, each line "
        "prefixed with [node] when the job has several",
    )
    group.add_argument(
        "--stop-on-interrupt",
        action="store_true",
        help="interrupting the kernel stops the job (default: only detach from it)",
    )
    group.add_argument(
        "--lines",
        type=int,
        default=live.DEFAULT_MAX_LINES,
        metavar="N",
        help=f"newest log lines the cell keeps (default {live.DEFAULT_MAX_LINES})",
    )
    return parser


def parse_spec_line(parser: argparse.ArgumentParser, line: str) -> argparse.Namespace | None:
    """Parse a line of job options; None when ``--help`` was shown, a bad option one UsageError."""
    try:
        return parse(parser, line)
    except OptionsExit:
        return None  # --help was printed
    except MaJupyterError as exc:
        raise UsageError(f"{parser.prog}: {exc.message}") from None
