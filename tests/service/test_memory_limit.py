"""The spec's memory per node is enforced on real processes: a node past it is killed and its
job ends in error saying which limit on which node; a job within it runs to its end."""

from __future__ import annotations

import shlex
import sys

import pytest

from tests.service.test_service import full_log, submit, wait_status

PY = sys.executable
SMALL_MEMORY = """
[[spec]]
name = "cpu.quarter"
cpus = 1
memory_gb = 0.25

[[node]]
name = "only"
cpus = 2
memory_gb = 4
"""
# 400 MiB, every page written (a zero-filled allocation would not be resident)
GREEDY = "import time; block = b'x' * (400 << 20); print('allocated', flush=True); time.sleep(30)"
# the limit counts the node's whole process tree, not just its first process
GREEDY_CHILD = f"import subprocess, sys; sys.exit(subprocess.call([sys.executable, '-c', {GREEDY!r}]))"


@pytest.fixture
def quarter(ma_home, request):
    cluster = ma_home / "cluster.toml"
    cluster.write_text(cluster.read_text() + SMALL_MEMORY)
    return request.getfixturevalue("ma_service")


@pytest.mark.parametrize("code", [GREEDY, GREEDY_CHILD], ids=["process", "child"])
def test_a_node_past_its_memory_limit_ends_the_job_in_error(quarter, code):
    job = submit(quarter, command=shlex.join([PY, "-c", code]), specs=["cpu.quarter"])
    final = wait_status(quarter, job["id"], {"error", "succeeded", "stopped"})
    assert final["status"] == "error", final
    assert "exceeded its memory limit of 0.25 GB on worker-0" in final["reason"], final["reason"]
    assert "exceeded its memory limit" in full_log(quarter, job["id"])


def test_a_job_within_its_memory_limit_succeeds(quarter):
    code = "block = b'x' * (50 << 20); print('fine', flush=True)"
    job = submit(quarter, command=shlex.join([PY, "-c", code]), specs=["cpu.quarter"])
    final = wait_status(quarter, job["id"], {"error", "succeeded", "stopped"})
    assert final["status"] == "succeeded", final["reason"]
