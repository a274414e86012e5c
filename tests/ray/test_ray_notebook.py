"""``notebooks/ray_cluster.ipynb`` runs headless with papermill: it starts its own Ray cluster, points a
job service at it and runs a 2-node DDP job with one job node on each Ray node."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import nbformat
import pytest

from tests.fixtures.notebooks import output_text

pytestmark = [pytest.mark.ray, pytest.mark.notebook, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]


def test_the_ray_notebook_runs_a_two_node_job_on_the_cluster_it_starts(tmp_path, monkeypatch):
    import papermill

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    work = tmp_path / "work"
    work.mkdir()
    out = tmp_path / "ray_cluster.out.ipynb"
    ray_tmp = tempfile.mkdtemp(prefix="ma-nb-ray-")  # short: Ray's socket paths are limited
    try:
        papermill.execute_notebook(
            str(REPO / "notebooks" / "ray_cluster.ipynb"),
            str(out),
            parameters={"workdir": str(work), "ray_tmp": ray_tmp},
            kernel_name="python3",
            cwd=str(work),
            progress_bar=False,
            execution_timeout=400,
        )
    finally:
        text = output_text(nbformat.read(out, as_version=4)) if out.exists() else ""
        shutil.rmtree(ray_tmp, ignore_errors=True)
    for expected in (
        "Ray cluster at 127.0.0.1:",
        "2/2 nodes (ray-",
        "rank 1 of 2 done",
        "status: succeeded",
        "ranks agree: True",
        "job nodes on distinct Ray nodes: True",
        "cluster shut down",
    ):
        assert expected in text, f"{expected!r} missing from the saved outputs:\n{text[-4000:]}"
