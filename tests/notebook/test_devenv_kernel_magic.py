"""``%ma_devenv JOB --kernel [--node N]``: the job's own environment from a notebook cell.

The magic starts the dev environment through the real service and installs its kernelspec (the
kernel itself, run by Jupyter, is tested in ``tests/service/test_devenv_kernel.py``).
"""

from __future__ import annotations

import json

import pytest

from ma_jupyter.frontends.notebook import session
from tests.magic_shell import Run, one_line_error

pytestmark = pytest.mark.timeout(300)


def test_the_magic_starts_node_1s_environment_and_installs_its_kernel(ma_shell, tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "jupyter"))
    client = session.get_client()
    source = client.submit(
        name="magicjob", mode="pytorch", nodes=2, command="sleep 600", env={"K": "secret:v"}
    )
    run = Run(ma_shell, f"devenv = %ma_devenv {source.id} --kernel --node 1")
    assert run.error is None, run.stdout + run.stderr
    made = ma_shell.user_ns["devenv"]
    origin = made.info.spec.devenv_of
    assert origin.job_id == source.id and origin.node == "worker-1" and origin.variables["RANK"] == "1"
    assert "ma_jupyter: magicjob (worker-1)" in run.stdout
    spec = json.loads(
        (
            tmp_path / "jupyter" / "kernels" / f"ma_jupyter-{source.id}-worker-1".lower() / "kernel.json"
        ).read_text()
    )
    assert spec["argv"][1:3] == ["-m", "ma_jupyter.client.kernel_bridge"] and made.id in spec["argv"]
    made.stop()


def test_node_without_kernel_is_refused_with_the_fix(ma_shell):
    run = Run(ma_shell, "%ma_devenv somejob --node 1")
    assert "add --kernel" in one_line_error(run)
