"""How a command line is classified inside a node (standard library only)."""

from __future__ import annotations


def program(argv: list[str]) -> str:
    """The executable's base name (``/usr/bin/python3`` -> ``python3``)."""
    return argv[0].rsplit("/", 1)[-1] if argv else ""


def is_python(argv: list[str]) -> bool:
    """Whether the command starts with a Python interpreter (``python``, ``python3``, ``python3.11``,
    or a path ending in one of them).  Without :mod:`re`: the rank log splitter imports this
    before it starts each rank's command."""
    name = program(argv)
    if not name.startswith("python"):
        return False
    version = name[len("python") :]
    if not version:
        return True
    major, dot, minor = version.partition(".")
    return _digits(major) and (not dot or _digits(minor))


def _digits(text: str) -> bool:
    return text.isascii() and text.isdigit()
