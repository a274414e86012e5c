"""IPython magics: ``%%ma_train`` turns a cell into a training job; line magics manage jobs.

``%%ma_train [options]`` snapshots the cell body as ``/workspace/algorithm/<name>.py`` (plus a
copy of ``--code-dir`` when given), submits the job with the options of ``ma-jupyter submit``
(one parser: :mod:`ma_jupyter.frontends.options`), follows its logs live in the cell and returns a
:class:`~ma_jupyter.client.JobHandle`.  The line magics ``%ma_jobs``, ``%ma_logs``,
``%ma_events``, ``%ma_top``, ``%ma_stop``, ``%ma_delete``, ``%ma_update``, ``%ma_clone``, ``%ma_devenv``, ``%ma_algorithms``, ``%ma_specs``, ``%ma_cluster``,
``%ma_tensorboard``, ``%ma_shell`` and ``%ma_attach`` each take ``--help``.

Bad arguments become one ``UsageError`` line, and the typed errors of :mod:`ma_jupyter.errors`
print as one line too (a custom exception handler registered by :func:`register`), while the
cell still counts as failed, so papermill stops on them.

This module is the registry: :class:`MaJupyterMagics` names each magic and the function that
runs it, one module per group of commands:

=================  ==========================================================
``submit``         ``%%ma_train``, ``%ma_clone``: submit, then follow
``follow``         ``%ma_logs``, ``%ma_events``, ``%ma_attach``; the live follow
``jobs``           ``%ma_jobs``, ``%ma_algorithms``, ``%ma_top``
``actions``        ``%ma_stop``, ``%ma_delete``, ``%ma_update``
``cluster``        ``%ma_specs``, ``%ma_cluster``
``tensorboard``    ``%ma_tensorboard``
``devenv``         ``%ma_devenv``, ``%ma_shell``
``parsing``        the arguments every magic parses (no magic of its own)
=================  ==========================================================

Each command is a function ``(magics, line[, cell])`` whose docstring is the magic's help;
the registry's class binds it as a method, so ``magics.shell`` is the IPython shell.

Light imports only: `%load_ext ma_jupyter` must not load the client, pydantic or requests (the
models, the session and the renderers all do), so each magic imports what it needs when it first
runs; the modules' tops hold the standard library, IPython and the errors.
"""

from __future__ import annotations

from typing import Any

from IPython.core.magic import Magics, line_cell_magic, line_magic, magics_class

from ....errors import MaJupyterError
from . import actions, cluster, devenv, follow, jobs, submit, tensorboard
from .devenv import SHELL_MIME

__all__ = ["SHELL_MIME", "MaJupyterMagics", "register"]


@magics_class
class MaJupyterMagics(Magics):
    """``%%ma_train`` and the ``%ma_*`` line magics."""

    ma_train = line_cell_magic(submit.ma_train)
    ma_clone = line_magic(submit.ma_clone)

    ma_jobs = line_magic(jobs.ma_jobs)
    ma_algorithms = line_magic(jobs.ma_algorithms)
    ma_top = line_magic(jobs.ma_top)

    ma_specs = line_magic(cluster.ma_specs)
    ma_cluster = line_magic(cluster.ma_cluster)

    ma_logs = line_magic(follow.ma_logs)
    ma_events = line_magic(follow.ma_events)
    ma_attach = line_magic(follow.ma_attach)

    ma_stop = line_magic(actions.ma_stop)
    ma_delete = line_magic(actions.ma_delete)
    ma_update = line_magic(actions.ma_update)

    ma_devenv = line_magic(devenv.ma_devenv)
    ma_shell = line_magic(devenv.ma_shell)

    ma_tensorboard = line_magic(tensorboard.ma_tensorboard)


def _typed_error_handler(shell, etype, value, tb, tb_offset=None):
    """Show a typed error as its message (``InvalidSpec: message``) instead of a traceback.

    IPython discards what a custom handler returns when the error comes from running code, so
    the handler shows it itself; in a kernel this is an ``error`` output (ename, evalue), which
    is what papermill and nbclient look for.
    """
    stb = [f"{etype.__name__}: {value}"]
    shell._showtraceback(etype, value, stb)
    return stb


def register(shell: Any) -> None:
    """Register the magics and the one-line display of typed errors on ``shell``."""
    shell.register_magics(MaJupyterMagics)
    shell.set_custom_exc((MaJupyterError,), _typed_error_handler)
