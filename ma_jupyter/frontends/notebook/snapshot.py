"""Snapshots of a job's algorithm: the cell body (and a copy of ``--code-dir``) in a fresh folder
under ``$MA_JUPYTER_HOME/snapshots``, so later edits never change a submitted job."""

from __future__ import annotations

import os
import shutil
from datetime import UTC, datetime
from pathlib import Path

from IPython.core.error import UsageError

from ... import config

SNAPSHOT_IGNORE = shutil.ignore_patterns(".git", "__pycache__", ".ipynb_checkpoints", "*.pyc")


def _snapshot_dir(name: str) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    folder = config.home() / "snapshots" / f"{name}-{stamp}-{os.urandom(3).hex()}"
    folder.parent.mkdir(parents=True, exist_ok=True)
    return folder


def snapshot_algorithm(name: str, body: str | None, code_dir: str | None) -> Path:
    """A fresh folder holding the job's algorithm: a copy of ``code_dir`` plus ``<name>.py``.

    The copy makes the job independent of later edits to the notebook or the folder.

    Raises:
        UsageError: ``code_dir`` is not a folder, or nothing to run was given.
    """
    if code_dir and not Path(code_dir).is_dir():
        raise UsageError(f"--code-dir {code_dir}: not a folder")
    if not body and not code_dir:
        raise UsageError(
            "%%ma_train needs a cell body (the training script), or use %ma_train --code-dir FOLDER --command ..."
        )
    folder = _snapshot_dir(name)
    if code_dir:
        shutil.copytree(code_dir, folder, ignore=SNAPSHOT_IGNORE, symlinks=True)
    else:
        folder.mkdir()
    if body:
        (folder / f"{name}.py").write_text(body if body.endswith("\n") else body + "\n")
    return folder


def default_name() -> str:
    return "nb-" + datetime.now().strftime("%m%d-%H%M%S")
