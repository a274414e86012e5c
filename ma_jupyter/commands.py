"""Run-command rules and shell-free expansion.

The platform runs a job's command as an argv list, never through a shell.  Following the
platform's rules, a command must start with an executable: ``KEY=VALUE python3 train.py`` is
refused, and so is anything that needs a shell to mean what it says (``a && b``, ``a; b``,
pipes, redirections, ``$(...)``).  Both are accepted when the user wraps them in
``bash -c "..."`` themselves, because then bash is the executable and the rest is its argument.

``${VAR}`` and ``$VAR`` in a command are expanded from the node's environment without a
shell, so the platform's own example
``torchrun --nnodes ${WORLD_SIZE} ... --master_port ${MASTER_PORT} train.py`` runs as written.
The job's own variables (``--env``) are expanded the same way (:func:`expand_env`).  Both share
one rule for a name that is not set: it expands to the empty string, as in a shell.  There is no
escape for a literal ``$NAME``: ``$`` followed by anything but a letter, ``_`` or ``{`` stays as
written (``$5``, ``a$``, ``$-``).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable

from .errors import InvalidSpec
from .workspace_paths import ALGORITHM_VIEW

_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_WHITESPACE = re.compile(r"[ \t\r\n]+")
_PLAIN = re.compile(r"[^ \t\r\n'\"\\();<>|&]+")
_OPERATOR = re.compile(r"[();<>|&]+")
_IN_DOUBLE = re.compile(r'[^"\\]*(?:\\.[^"\\]*)*', re.DOTALL)
_DOUBLE_ESCAPE = re.compile(r'\\([\\"])|\\\n')
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")


#: a whole word that is one shell operator in quotes (``'&&'``): how ``shlex.join`` writes an
#: argv's ``&&`` (``ma-jupyter submit -- a '&&' b``), meant for a shell once the user wraps it
_QUOTED_OPERATOR = re.compile(r"""(?<!\S)(['"])(&&|\|\||;|\||&|>>?|<|2>&1|2>>?|&>)\1(?!\S)""")
#: what a double-quoted word still lets the user's own shell change
_DOUBLE_QUOTE_ACTIVE = re.compile(r'["\\$`!]')


def shell_wrapper(command: str) -> str:
    """The ``bash -c ...`` command that runs ``command`` as a shell line, quoted so that typing it
    (after ``ma-jupyter submit --``, or as ``--command`` text) hands bash exactly that line.

    1. A whole word that is a quoted shell operator (``'&&'``, ``';'``, ``'|'``) becomes the
       operator: that is how an argv's ``&&`` reads once joined, and a shell line is what the
       user asked for by wrapping it.
    2. The line goes in double quotes when nothing in it is special there (``"``, ``\\``,
       ``$``, backquote, ``!``), else in single quotes (``shlex.quote``), so the user's own
       shell expands nothing: ``${VAR}`` reaches the job's bash, which expands it on the node.
    """
    line = _QUOTED_OPERATOR.sub(lambda m: m.group(2), command.strip())
    if not _DOUBLE_QUOTE_ACTIVE.search(line):
        return f'bash -c "{line}"'
    return f"bash -c {shlex.quote(line)}"


def _wrap_hint(command: str) -> str:
    return f"wrap it in a shell yourself: {shell_wrapper(command)}"


def is_shell_wrapper(argv: list[str]) -> bool:
    """``bash -c "..."`` (or ``sh -c``): the user asked for a shell on purpose."""
    return len(argv) >= 3 and argv[0].rsplit("/", 1)[-1] in {"bash", "sh", "zsh", "dash"} and argv[1] == "-c"


#: the platform's steps that run inside a node before the job's command and then become it
#: (``python -m <module> [its options] -- CMD...``: the horovod mode's worker-0, and each node's
#: sshd where the nodes reach each other over ssh, ``ssh_node --listen ADDRESS [--wait HOSTS]``):
#: the ``bash -c`` rule of :func:`expand_argv` looks at CMD behind them
EXEC_STEPS = ("ma_jupyter.nodeside.mpi_head", "ma_jupyter.nodeside.ssh_node")


def behind_exec_step(argv: list[str]) -> list[str]:
    """The job's command behind the :data:`EXEC_STEPS` in front of it (``ssh_node``'s, then
    ``mpi_head``'s), ``argv`` itself without one.  A step's own options come before its ``--``:
    the platform writes them (an address, host names), never a ``--``."""
    while len(argv) > 4 and argv[1] == "-m" and argv[2] in EXEC_STEPS and "--" in argv[3:]:
        argv = argv[argv.index("--", 3) + 1 :]
    return argv


def split_command(text: str) -> tuple[list[str], list[str]]:
    """Split ``text`` like ``shlex.split`` (POSIX, no comments) in one linear pass, and like a
    shell, not ``shlex``, remove a line continuation (a backslash ending a line, outside single
    quotes), so a command written over several lines reads as one.

    ``shlex`` builds each token a character at a time (quadratic in a token's length: a 1 MB
    command took minutes); this scanner takes whole runs of characters with regular
    expressions instead.

    Returns:
        (argv, operators): the arguments with quoting removed, and every run of shell
        punctuation (``&&``, ``;``, ``|``, ``>``...) found outside quotes and escapes, in order.

    Raises:
        ValueError: an unclosed quote or a trailing backslash.
    """
    argv: list[str] = []
    operators: list[str] = []
    pieces: list[str] = []
    started = False  # a token is open (it may be empty: '' is an argument)
    i, end = 0, len(text)
    while i < end:
        char = text[i]
        if char in " \t\r\n":
            if started:
                argv.append("".join(pieces))
                pieces, started = [], False
            i = _WHITESPACE.match(text, i).end()
            continue
        if text.startswith("\\\n", i):
            # a line continuation, as a shell reads it: the backslash and the line break are
            # removed (a command copied as the seeds print it, one option per line)
            i += 2
            continue
        started = True
        if char == "'":
            close = text.find("'", i + 1)
            if close < 0:
                raise ValueError("No closing quotation")
            pieces.append(text[i + 1 : close])
            i = close + 1
        elif char == '"':
            inner = _IN_DOUBLE.match(text, i + 1)
            if inner.end() >= end or text[inner.end()] != '"':
                raise ValueError("No closing quotation")
            # inside double quotes a backslash escapes only \ and " (and a line break: a line
            # continuation, removed); elsewhere it stays
            pieces.append(_DOUBLE_ESCAPE.sub(lambda m: m.group(1) or "", inner.group()))
            i = inner.end() + 1
        elif char == "\\":
            if i + 1 >= end:
                raise ValueError("No escaped character")
            pieces.append(text[i + 1])
            i += 2
        elif char in "();<>|&":
            run = _OPERATOR.match(text, i).group()
            operators.append(run)
            pieces.append(run)
            i += len(run)
        else:
            run = _PLAIN.match(text, i).group()
            pieces.append(run)
            i += len(run)
    if started:
        argv.append("".join(pieces))
    return argv, operators


def parse_command(command: str, *, field: str = "command") -> list[str]:
    """Check a run command against the platform's rules and split it into argv.

    Args:
        command: the command as the user typed it.
        field: the job field it came from, named in the error.

    Returns:
        The argv list (shell quoting removed; ``${VAR}`` left for :func:`expand_argv`).

    Raises:
        InvalidSpec: the command is empty, unbalanced, starts with ``KEY=VALUE``, or needs a
            shell (``&&``, ``;``, ``|``, redirections, ``$(...)``) without ``bash -c``.  The
            message says how to fix it.
    """
    text = (command or "").strip()
    if not text:
        raise InvalidSpec(
            f"{field} is empty: give the command that starts training, e.g. python {ALGORITHM_VIEW}/train.py",
            field=field,
        )
    try:
        argv, operators = split_command(text)
    except ValueError as exc:
        raise InvalidSpec(f"{field} cannot be parsed ({exc}): check its quotes", field=field) from exc
    if not argv:
        raise InvalidSpec(f"{field} is empty", field=field)
    if _ASSIGNMENT.match(argv[0]):
        raise InvalidSpec(
            f"{field} must start with an executable, not the variable assignment {argv[0]!r}: "
            f"set variables with --env KEY=VALUE, or {_wrap_hint(text)}",
            field=field,
        )
    if is_shell_wrapper(argv):
        return argv
    for token in argv:
        if "$(" in token or "`" in token:
            raise InvalidSpec(
                f"{field} uses command substitution, which needs a shell: {_wrap_hint(text)}", field=field
            )
    if operators:
        raise InvalidSpec(
            f"{field} holds more than one statement or a shell operator ({operators[0]!r}); the platform runs "
            f"commands without a shell, so {_wrap_hint(text)}",
            field=field,
        )
    return argv


def substitute(text: str, reference: Callable[[str], str], literal: Callable[[str], str] = str) -> str:
    """``text`` rewritten in one pass: each ``${VAR}`` or ``$VAR`` becomes ``reference(VAR)``
    and each run of text between references becomes ``literal(run)``.

    The one reader of the variable syntax: :func:`expand` fills references in, the Kubernetes
    export rewrites them into the manifest's own ``$(VAR)`` syntax.
    """
    out: list[str] = []
    last = 0
    for match in _VAR.finditer(text):
        if match.start() > last:
            out.append(literal(text[last : match.start()]))
        out.append(reference(match.group(1) or match.group(2)))
        last = match.end()
    if last < len(text):
        out.append(literal(text[last:]))
    return "".join(out)


def expand(text: str, env: dict[str, str]) -> str:
    """``text`` with each ``${VAR}`` and ``$VAR`` replaced by its value in ``env`` (the empty
    string when ``env`` lacks it), in one pass: what a value brings in is not expanded again."""
    return _VAR.sub(lambda m: env.get(m.group(1) or m.group(2), ""), text)


def expand_argv(argv: list[str], env: dict[str, str]) -> list[str]:
    """Expand ``${VAR}`` and ``$VAR`` in each argument from ``env``, without a shell.

    The arguments of ``bash -c`` are left alone (also behind one of :data:`EXEC_STEPS`): that
    shell expands them itself.  An unknown variable expands to the empty string, as a shell
    would.
    """
    if is_shell_wrapper(behind_exec_step(argv)):
        return list(argv)
    return [expand(arg, env) for arg in argv]


def expand_env(values: dict[str, str], base: dict[str, str]) -> dict[str, str]:
    """The job's own variables with ``${VAR}`` and ``$VAR`` expanded, without a shell.

    Deterministic, like a shell reading ``export`` lines from top to bottom:

    1. The variables are expanded in the order given (the order of the ``--env`` options, or of
       the spec's ``env`` object).
    2. A reference takes the value of a variable given earlier in ``values`` (already expanded),
       else the value in ``base`` (the node's variables the platform sets: ``PATH``, ``HOME``,
       ``HOSTNAME``, ``MASTER_ADDR``, ``MA_JOB_ID``...).
    3. A name found in neither expands to the empty string, as in the command
       (:func:`expand_argv`): a variable the job gives later is not defined yet.
    4. A value referring to its own name gets the earlier value: ``PATH=/opt/bin:$PATH`` puts
       ``/opt/bin`` before the platform's ``PATH``.
    5. One pass: the text a reference brings in is never expanded again.

    Returns:
        The same names in the same order, with their expanded values.
    """
    seen = dict(base)
    out: dict[str, str] = {}
    for name, value in values.items():
        out[name] = seen[name] = expand(value, seen)
    return out
