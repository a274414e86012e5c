"""Every example notebook runs headless with papermill against a real job service.

Each notebook executes in a fresh kernel in a working folder of its own, on a temporary
``MA_JUPYTER_HOME`` the module's notebooks share (its service started once);
the saved notebook must contain the job's log lines and its final status (the live log display
is kept as text), and ``failing_job.ipynb`` must make papermill raise.  The distributed-mode
notebooks belong to the modes' own tests (``ray_cluster.ipynb`` to ``tests/ray``) and are left out
here.
"""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest

from tests.fixtures.notebooks import NOTEBOOKS, REPO, output_text

pytestmark = [pytest.mark.notebook, pytest.mark.timeout(600)]

# run by the modes' tests, ray_cluster by tests/ray (it needs a private network namespace) and
# gpu_quickstart by tests/gpu (it needs a card)
MODE_NOTEBOOKS = {"pytorch_ddp", "tensorflow_distributed", "mpi_allreduce", "ray_cluster", "gpu_quickstart"}

# What each notebook's saved outputs must show (log lines of its jobs and their final status).
EXPECTED = {
    "quickstart": [
        "epoch 1/3",
        "epoch 3/3",
        "training done",
        "saved checkpoint",
        "scoring: 100%",  # tqdm's bar, redrawn with carriage returns, kept in its final state
        ": succeeded",
        "checkpoint accuracy",
    ],
    "mounts_outputs": [
        "dataset rows: 2",
        "write to /workspace/dataset/private/table: refused",
        "write to /workspace/model/private/base: refused",
        "write to /workspace/volume/cache: allowed",
        "write to /workspace/outputs: allowed",
        ": succeeded",
    ],
    "tensorboard": ["lr-0.1: 20 steps", "lr-0.3: 20 steps", ": succeeded", "runs: ['lr-0.1', 'lr-0.3']"],
    "job_management": ["cpu.small", "final status: stopped", "tick 0", "deleted", "JobHandle"],
    "widgets_panel": ["ready to submit", "succeeded", "hello from the form 2"],
}
PARAMETERS = {"quickstart": {"epochs": 3}}
FAILING = {"failing_job"}


def notebooks() -> list[Path]:
    return sorted(p for p in NOTEBOOKS.glob("*.ipynb") if p.stem not in MODE_NOTEBOOKS)


def outputs_of(nb, mime: str) -> list:
    return [
        out["data"][mime]
        for cell in nb.cells
        for out in cell.get("outputs", [])
        if mime in out.get("data", {})
    ]


def test_every_example_notebook_is_covered():
    names = {p.stem for p in notebooks()}
    assert {"quickstart", "failing_job"} <= names
    assert set(EXPECTED) <= names, "a notebook this test knows is missing"
    for path in notebooks():
        nb = nbformat.read(path, as_version=4)
        tags = [c.metadata.get("tags", []) for c in nb.cells if c.cell_type == "code"]
        assert any("parameters" in t for t in tags), f"{path.name} needs a cell tagged 'parameters'"
        assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), (
            f"{path.name}: clear outputs"
        )


@pytest.mark.parametrize("path", [p for p in notebooks() if p.stem not in FAILING], ids=lambda p: p.stem)
def test_notebook_runs_and_keeps_job_logs(ma_module_papermill, path):
    nb = ma_module_papermill(path, **PARAMETERS.get(path.stem, {}))
    text = output_text(nb)
    # a notebook added later without its own entry must at least run a job to success
    for expected in EXPECTED.get(path.stem, [": succeeded"]):
        assert expected in text, f"{path.name}: {expected!r} missing from the saved outputs:\n{text[-4000:]}"
    if path.stem in ("quickstart", "tensorboard"):
        assert outputs_of(nb, "image/png"), "the inline TensorBoard plot is kept as a PNG"
    if path.stem == "quickstart":
        # the bar's earlier frames were overwritten by later ones, as in a terminal
        assert "scoring:   0%" not in text and "\r" not in text
        # the live log was saved as one final display, tagged with its job id
        metas = [
            out.get("metadata", {}).get("ma_jupyter")
            for cell in nb.cells
            for out in cell.get("outputs", [])
            if out.get("metadata", {}).get("ma_jupyter")
        ]
        assert metas and metas[-1]["job_id"]


def test_failing_notebook_makes_papermill_raise(ma_module_papermill):
    from papermill.exceptions import PapermillExecutionError

    with pytest.raises(PapermillExecutionError) as info:
        ma_module_papermill(NOTEBOOKS / "failing_job.ipynb")
    assert info.value.ename == "JobFailed"
    assert "something went wrong" in info.value.evalue
    text = output_text(ma_module_papermill.output)
    assert "ended error" in text and "loading data" in text
    assert "not reached" not in text


# A notebook whose job waits, after its first lines, for a file the test creates once it has
# seen those lines in papermill's log: the job can only end if the lines arrived while it ran.
GATED_NOTEBOOK = [
    "%load_ext ma_jupyter",
    "%%ma_train --name gated --dataset gate={gate}\n"
    "import os, sys, time\n"
    "print('epoch 1 of 2', flush=True)\n"
    "for i in range(1, 401):\n"
    "    sys.stderr.write(f'\\rtraining {i:3d}/400 |' + '#' * (i // 20) + ' ' * (20 - i // 20) + '|')\n"
    "    sys.stderr.flush()\n"
    "sys.stderr.write(' loss=0.0123\\n')\n"
    "print('waiting for the gate', flush=True)\n"
    "deadline = time.monotonic() + 300\n"
    "while not os.path.exists('/workspace/dataset/private/gate/open'):\n"
    "    if time.monotonic() > deadline:\n"
    "        sys.exit('the gate never opened: the log did not reach papermill while the job ran')\n"
    "    time.sleep(0.05)\n"
    "print('epoch 2 of 2: done', flush=True)\n",
]


def test_papermill_log_output_shows_the_jobs_lines_while_it_runs(ma_home, tmp_path):
    import subprocess
    import sys
    import threading

    from tests.helpers import BAR_FINAL

    gate = tmp_path / "gate"
    gate.mkdir()
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in GATED_NOTEBOOK]
    nb.cells[1].source = nb.cells[1].source.replace("{gate}", str(gate))
    source, out = tmp_path / "gated.ipynb", tmp_path / "gated.out.ipynb"
    nbformat.write(nb, source)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "IPYTHONDIR": str(tmp_path / "ipython"),
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "papermill",
            "--log-output",
            "--no-progress-bar",
            "-k",
            "python3",
            str(source),
            str(out),
        ],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen: list[str] = []

    def read() -> None:
        for line in proc.stdout:
            seen.append(line)
            if "waiting for the gate" in line:
                (gate / "open").write_text("go")  # the job may finish now

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert proc.wait(timeout=400) == 0, "".join(seen)
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(timeout=10)
    log = "".join(seen)
    # the lines reached papermill's log in order, the bar as its final state
    order = [log.index(text) for text in ("epoch 1 of 2", BAR_FINAL, "waiting for the gate", "epoch 2 of 2")]
    assert order == sorted(order), log
    assert "\r" not in log
    assert "gated" in log and ": succeeded" in log
    # the saved notebook keeps each line once (printed), and the display keeps status and offsets
    saved = nbformat.read(out, as_version=4)
    text = output_text(saved)
    for line in ("epoch 1 of 2", BAR_FINAL, "waiting for the gate", "epoch 2 of 2: done"):
        assert text.count(line) == 1, text
    displays = [o for o in saved.cells[1].outputs if o.get("metadata", {}).get("ma_jupyter")]
    assert len(displays) == 1
    assert displays[0]["metadata"]["ma_jupyter"]["offsets"]["worker-0"] > 0
    assert ": succeeded" in displays[0]["data"]["text/plain"]
    assert "log lines printed above" in displays[0]["data"]["text/plain"]
    # ... and comes last (before the cell's value), under the lines it counts; the final status
    # is said once
    shown = [o for o in saved.cells[1].outputs if o.output_type != "execute_result"]
    assert shown[-1] == displays[0], shown
    assert output_text(saved).count(": succeeded") == 1, output_text(saved)
