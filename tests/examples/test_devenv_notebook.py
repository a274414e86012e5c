"""``ma-jupyter devenv JOB`` writes a notebook that papermill runs, headless, into the same job."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest

from ma_jupyter.client import Client
from tests.fixtures.notebooks import REPO, output_text

pytestmark = [pytest.mark.notebook, pytest.mark.timeout(600)]
SECRET = "an-unguessable-value"
SECRET_DIGEST = hashlib.sha256(SECRET.encode()).hexdigest()[:12]


def test_papermill_runs_the_devenv_notebook_of_a_job_into_a_job_that_succeeds(
    ma_papermill, ma_home, tmp_path
):
    code = tmp_path / "algo"
    code.mkdir()
    (code / "fit.py").write_text(
        "import hashlib, os\n"
        "digest = hashlib.sha256(os.environ['TOKEN'].encode()).hexdigest()[:12]\n"
        f"assert digest == {SECRET_DIGEST!r}, 'the secret did not arrive'\n"
        "print('fit with', os.environ['LR'], flush=True)\n"
    )
    client = Client()
    spec = {
        "name": "fit",
        "algorithm": str(code),
        "command": "python /workspace/algorithm/fit.py",
        "env": {"LR": "0.5"},
        "secret_env": {"TOKEN": SECRET},
        "duration": 3600,
    }
    original = client.submit(spec).wait(timeout=300)
    assert original.status.value == "succeeded", original.reason
    target = tmp_path / "fit-devenv.ipynb"
    env = {**os.environ, "MA_JUPYTER_HOME": str(ma_home), "PYTHONPATH": str(REPO)}
    written = subprocess.run(
        [sys.executable, "-m", "ma_jupyter.frontends.cli", "devenv", original.id, "-o", str(target)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert written.returncode == 0, written.stderr
    assert f"wrote {target}" in written.stdout
    again = subprocess.run(
        [sys.executable, "-m", "ma_jupyter.frontends.cli", "devenv", original.id, "-o", str(target)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 2 and "exists" in again.stderr  # never overwritten
    assert SECRET not in target.read_text()

    nb = ma_papermill(target, SECRET_TOKEN=SECRET)
    text = output_text(nb)
    assert "fit with 0.5" in text and ": succeeded" in text, text[-3000:]
    jobs = [h.info for h in client.jobs(name="fit")]
    assert len(jobs) == 2
    resubmitted = next(j for j in jobs if j.id != original.id)
    assert resubmitted.status.value == "succeeded"
    # the same job but its algorithm: a fresh copy, which records the folder it came from
    created = {"algorithm", "algorithm_origin", "creator"}
    assert resubmitted.spec.model_dump(exclude=created) == original.spec.model_dump(exclude=created)
    assert resubmitted.spec.algorithm_origin == original.spec.algorithm
