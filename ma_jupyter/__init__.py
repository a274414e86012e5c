"""ma_jupyter: submit notebook training code as task-style training jobs.

``%load_ext ma_jupyter`` (or ``import ma_jupyter`` inside IPython) registers the magics;
:class:`Client` reaches the job service (starting it on first use).
"""

from __future__ import annotations

import importlib
import sys

# not typing's: every node runner imports this package, and typing costs 11 ms to import (type
# checkers read a module-level TYPE_CHECKING = False as true)
TYPE_CHECKING = False
if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

__version__ = "0.1.0"

# Public names loaded on first use, so that `import ma_jupyter` stays cheap.
_LAZY = {
    "Client": "ma_jupyter.client",
    "JobHandle": "ma_jupyter.client",
    "JobForm": "ma_jupyter.frontends.notebook.widgets",
    "JobMonitor": "ma_jupyter.frontends.notebook.widgets",
    "panel": "ma_jupyter.frontends.notebook.widgets",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ma_jupyter' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def load_ipython_extension(ipython: InteractiveShell) -> None:
    """Register the magics on an IPython shell (``%load_ext ma_jupyter``)."""
    from .frontends.notebook.magics import register

    register(ipython)


def _register_in_running_ipython() -> None:
    # Importing inside a kernel registers the magics too; outside IPython nothing happens, and
    # IPython is never imported just to find out.
    if "IPython" not in sys.modules:
        return
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except Exception:
        return
    if shell is not None and "ma_train" not in shell.magics_manager.magics.get("cell", {}):
        load_ipython_extension(shell)


_register_in_running_ipython()
