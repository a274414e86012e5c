"""What to tell a notebook user whose cell cannot work as a job's script, instead of a bare
``SyntaxError`` or ``NameError`` from the job.

A ``%%ma_train`` cell body becomes a Python file that runs in a fresh process on each node, so:

* a body that is a shell command (``python train.py --lr 0.1``, ``!python x.py``,
  ``torchrun ...``) is not Python: :func:`shell_command_hint` says so before anything is
  submitted, and how to run the command (``--command``);
* a body that uses a variable of the kernel fails in the job with a ``NameError``:
  :func:`kernel_variable_hint` explains, once the job failed, how to pass the value in.

Both say something only when they are sure: the body does not compile and the line the
compiler stopped at reads as a command; the job's log ends in a ``NameError`` on a name that
the kernel has.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from typing import Any

#: programs a command line of a cell usually starts with
COMMANDS = frozenset(
    {
        "torchrun",
        "mpirun",
        "mpiexec",
        "horovodrun",
        "deepspeed",
        "accelerate",
        "bash",
        "sh",
        "pip",
        "pip3",
        "conda",
        "nvidia-smi",
        "npu-smi",
    }
)
_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_NAME_ERROR = re.compile(r"NameError: name '([A-Za-z_][A-Za-z0-9_]*)' is not defined")
#: names every IPython kernel has: never the user's own values
_KERNEL_NAMES = frozenset({"In", "Out", "get_ipython", "exit", "quit"})


def _command_words(line: str) -> list[str] | None:
    """The words of ``line`` when it reads as a shell command line, else None."""
    text = line.strip()
    if text.startswith("!"):
        text = text.lstrip("!").strip()
        shell_escape = True
    else:
        shell_escape = False
    try:
        words = shlex.split(text)
    except ValueError:
        return None
    program = next((w for w in words if not _ASSIGNMENT.match(w)), None)
    if program is None:
        return None
    name = program.rsplit("/", 1)[-1]
    if shell_escape or _PYTHON.match(name) or name in COMMANDS:
        return words
    if program.startswith("./") or name.endswith((".py", ".sh")):
        return words
    return None


def shell_command_hint(body: str, prog: str = "%%ma_train") -> str | None:
    """A one-line message when the cell body is a shell command rather than Python, else None.

    Rules, in order: the body compiles as Python: None; the line the compiler stopped at (or
    else the first line with code) does not read as a command line (``!``, an interpreter or
    launcher, ``./x``, ``x.py``): None; otherwise the message, with the command to use.
    """
    try:
        compile(body, "<cell>", "exec")
        return None
    except SyntaxError as exc:
        stopped = exc.lineno or 0
    except (ValueError, OverflowError, RecursionError):
        return None
    lines = body.splitlines()
    candidates = [lines[stopped - 1]] if 0 < stopped <= len(lines) else []
    candidates += [line for line in lines if line.strip() and not line.lstrip().startswith("#")][:1]
    for line in candidates:
        words = _command_words(line)
        if words is None:
            continue
        lead = 0
        while lead < len(words) and _ASSIGNMENT.match(words[lead]):
            lead += 1  # `LR=0.1 python train.py`: the variables become --env options
        command = shlex.join(words[lead:])
        options = "".join(f" --env {shlex.quote(w)}" for w in words[:lead])
        return (
            f"{prog}: the cell body is a shell command, not Python (`{line.strip()}`), and the body "
            f"runs as a Python file. Run the command as the job's own: `%ma_train{options} --command "
            f"{_quoted(command)}` on one line without a body (a file it names in the notebook's folder "
            "is shipped with the job; --code-dir DIR ships another folder)"
        )
    return None


def _quoted(command: str) -> str:
    """``command`` in double quotes for a magic line (IPython splits it like a shell)."""
    return '"' + command.replace("\\", "\\\\").replace('"', '\\"') + '"'


def kernel_variable_hint(log_text: str, namespace: Mapping[str, Any]) -> str | None:
    """A hint when the job's log ends in a ``NameError`` on a variable the kernel has, else None.

    Args:
        log_text: the job's last log lines.
        namespace: the kernel's variables (``shell.user_ns``).
    """
    found = _NAME_ERROR.findall(log_text)
    if not found:
        return None
    name = found[-1]
    if name.startswith("_") or name in _KERNEL_NAMES or name not in namespace:
        return None
    upper = name.upper()
    return (
        f"hint: `{name}` is a variable of this notebook's kernel, but the cell runs as its own Python "
        "process on the job's nodes and sees none of the kernel's variables. Pass the value in: "
        f"`{{{name}}}` in the magic line is replaced by its value (`%%ma_train --env {upper}={{{name}}}`, "
        f"then `os.environ['{upper}']` in the cell), or write it to a file the job reads "
        "(a --code-dir or --dataset folder), or set it in the cell itself"
    )
