"""The local backend: each node of a job is a sandboxed process tree on this machine.

Import-free on purpose: ``python -m ma_jupyter.backends.local.rsh_agent`` runs inside a node
under the job's own interpreter, which may lack everything but the standard library.
"""

from __future__ import annotations


def __getattr__(name: str) -> object:
    if name == "LocalBackend":
        from .backend import LocalBackend

        return LocalBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
