"""How a command line is classified inside a node (standard library only)."""

from __future__ import annotations

import re

#: ``python``, ``python3``, ``python3.11`` (or a path ending in one of them)
_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")


def program(argv: list[str]) -> str:
    """The executable's base name (``/usr/bin/python3`` -> ``python3``)."""
    return argv[0].rsplit("/", 1)[-1] if argv else ""


def is_python(argv: list[str]) -> bool:
    """Whether the command starts with a Python interpreter (``python``, ``python3``, ``python3.11``)."""
    return bool(_PYTHON.match(program(argv)))
