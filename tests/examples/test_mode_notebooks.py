"""The distributed-mode notebooks run headless with papermill against a real job service."""

from __future__ import annotations

import nbformat
import pytest

from tests.fixtures.notebooks import NOTEBOOKS, output_text

pytestmark = [pytest.mark.notebook, pytest.mark.timeout(900)]

# What each notebook's saved outputs must show: its dry run, the job's own log lines, its result.
CASES = {
    "pytorch_ddp": (
        pytest.mark.torch,
        [
            "ma_jupyter.nodeside.torch_run",
            "MASTER_ADDR",
            "[rank 0] step 4 loss",
            "rank 1 of 2 on worker-1",
            "ranks agree: True",
            "status: succeeded",
        ],
    ),
    "tensorflow_distributed": (
        pytest.mark.tensorflow,
        ['"type": "ps"', "TF_CONFIG", "step 4 loss", "weights agree: True", "status: succeeded"],
    ),
    "mpi_allreduce": (
        pytest.mark.mpi,
        [
            "/etc/mpi/hostfile",
            "worker-0 slots=2",
            "mpirun",
            "allreduce sum = 10",
            "4 ranks on ['worker-0', 'worker-1']: sum 10 (expected 10)",
            "status: succeeded",
        ],
    ),
}


def test_mode_notebooks_have_parameters_and_no_outputs():
    for name in CASES:
        nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
        tags = [c.metadata.get("tags", []) for c in nb.cells if c.cell_type == "code"]
        assert any("parameters" in t for t in tags), f"{name} needs a cell tagged 'parameters'"
        assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), f"{name}: clear outputs"


@pytest.mark.parametrize(
    "name", [pytest.param(name, marks=mark) for name, (mark, _) in CASES.items()], ids=list(CASES)
)
def test_mode_notebook_runs_and_keeps_the_ranks_logs(ma_module_papermill, name, tmp_path):  # noqa: F811
    nb = ma_module_papermill(NOTEBOOKS / f"{name}.ipynb", workdir=str(tmp_path / "examples"))
    text = output_text(nb)
    for expected in CASES[name][1]:
        assert expected in text, f"{name}: {expected!r} missing from the saved outputs:\n{text[-5000:]}"
