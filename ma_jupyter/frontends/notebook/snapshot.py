"""The notebook's code snapshot: the cell body (and a copy of ``--code-dir``) in a fresh folder
(:mod:`ma_jupyter.client.snapshot`), so later edits never change a submitted job."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from IPython.core.error import UsageError

from ...client.snapshot import copy_folder, new_snapshot


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
    folder = new_snapshot(name)
    if code_dir:
        copy_folder(Path(code_dir), folder)
    else:
        folder.mkdir()
    if body:
        (folder / f"{name}.py").write_text(body if body.endswith("\n") else body + "\n")
    return folder


def default_name() -> str:
    return "nb-" + datetime.now().strftime("%m%d-%H%M%S")
