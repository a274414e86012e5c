"""The quickstart's training cell run twice into the same outputs folder (issue 39, item 5, as a
second ``./dev quickstart`` does): TensorBoard and the inline plot see two runs, one per job, each
its own line from step 1, not one line zigzagging back."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ma_jupyter.frontends.notebook.scalars import read_scalars

pytestmark = pytest.mark.timeout(600)

QUICKSTART = Path(__file__).resolve().parents[2] / "notebooks" / "quickstart.ipynb"


def _training_cell() -> str:
    """The body of the quickstart's ``%%ma_train`` cell that runs (not the dry run)."""
    cells = json.loads(QUICKSTART.read_text())["cells"]
    source = next(
        "".join(c["source"])
        for c in cells
        if "".join(c["source"]).startswith("%%ma_train") and "--dry-run" not in "".join(c["source"])
    )
    return source.split("\n", 1)[1]


def test_two_runs_of_the_quickstart_cell_are_two_tensorboard_runs(ma_client, tmp_path):
    from sklearn.datasets import load_digits

    data = tmp_path / "digits"
    data.mkdir()
    digits = load_digits()
    np.savez(data / "digits.npz", X=digits.data, y=digits.target)
    algorithm = tmp_path / "algorithm"
    algorithm.mkdir()
    (algorithm / "digits.py").write_text(_training_cell())
    outputs = tmp_path / "outputs"
    jobs = [
        ma_client.submit(
            name="digits",
            algorithm=str(algorithm),
            command="python digits.py",
            datasets=[{"name": "digits", "path": str(data)}],
            outputs=str(outputs),
            env={"EPOCHS": "2"},
        ).wait(timeout=240)
        for _ in range(2)
    ]
    runs = read_scalars(outputs)["loss"]
    assert sorted(runs) == sorted(f"tb/{job.id}" for job in jobs), runs
    assert all([step for step, _ in points] == [1, 2] for points in runs.values()), runs
