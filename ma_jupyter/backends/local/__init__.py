"""The local backend: each node of a job is a sandboxed process tree on this machine.

Import-free on purpose (the backend is loaded on first use of :class:`LocalBackend`): the
service's start and the other backends pay nothing for it until then.
"""

from __future__ import annotations


def __getattr__(name: str) -> object:
    if name == "LocalBackend":
        from .backend import LocalBackend

        return LocalBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
