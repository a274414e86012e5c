"""The distributed mode, thread counts and the env rule with the real launchers, through the job
service, the local backend and bubblewrap: JAX's coordinator across 2 nodes, torchrun's ranks'
threads, the pytorch mode's refusal of an image without torch."""

from __future__ import annotations

import importlib.util
import json
import os
import venv

import pytest

from ma_jupyter.errors import InvalidSpec
from ma_jupyter.frontends.render import plan_text
from ma_jupyter.models import JobStatus
from tests.fixtures.real_jobs import algorithm, events_text, run_job

from ..helpers import writable_dir

#: ``jax.distributed.initialize()`` with no argument, as on a Slurm cluster: the coordinator
#: from ``JAX_COORDINATOR_ADDRESS``, the process count and id from the node's cluster detection
#: (the node's ``sitecustomize``, ``nodeside/jax_cluster.py``); JAX itself was not imported
#: before the program imported it.
JAX_TWO_NODES = """
import json, os, sys
imported_at_start = "jax" in sys.modules
import jax
import numpy as np
from jax.experimental import multihost_utils

jax.distributed.initialize()
gathered = multihost_utils.process_allgather(np.array([jax.process_index() + 10]))
info = {
    "process": jax.process_index(),
    "count": jax.process_count(),
    "devices": len(jax.devices()),
    "gathered": gathered.ravel().tolist(),
    "home": os.environ["HOME"],
    "rank": os.environ["RANK"],
    "ports": os.environ["MA_PORTS"],
    "coordinator": os.environ["JAX_COORDINATOR_ADDRESS"],
    "imported at start": imported_at_start,
    "master": [os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"], os.environ["MA_MASTER_PORTS"]],
}
with open(f"/workspace/outputs/jax-{jax.process_index()}.json", "w") as fh:
    json.dump(info, fh)
print("jax process", jax.process_index(), "of", jax.process_count(), gathered.ravel().tolist(), flush=True)
jax.distributed.shutdown()
"""

THREADS = """
import json, os
import torch

rank = int(os.environ["RANK"])
info = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "HOME", "SLOTS")}
info.update(torch_threads=torch.get_num_threads(), world=os.environ["WORLD_SIZE"])
with open(f"/workspace/outputs/threads-{rank}.json", "w") as fh:
    json.dump(info, fh)
"""


def _jax_image() -> dict | None:
    """The image a JAX job runs with: the service's own interpreter where it has JAX (./dev setup
    installs it with the frameworks extra), else the venv ``MA_TEST_JAX_VENV`` names."""
    if importlib.util.find_spec("jax") is not None:
        return None
    if os.environ.get("MA_TEST_JAX_VENV"):
        return {"venv": os.environ["MA_TEST_JAX_VENV"]}
    pytest.skip(
        "needs JAX: pip install 'jax[cpu]' (the frameworks extra), or MA_TEST_JAX_VENV=<a venv with it>"
    )


def test_jax_initialize_joins_2_nodes_of_the_distributed_mode_on_the_jax_coordinator_port(
    ma_module_home_client, tmp_path
):
    image = _jax_image()
    outputs = writable_dir(tmp_path / "out")
    job, seconds, logs = run_job(
        ma_module_home_client,
        name="jax-2",
        mode="distributed",
        nodes=2,
        specs=["cpu.small"],
        algorithm=str(algorithm(tmp_path / "algo", train_jax=JAX_TWO_NODES)),
        outputs=str(outputs),
        command="python /workspace/algorithm/train_jax.py",
        # HOME may be the job's; RANK is the platform's (the rule of docs/variables.md)
        env={"JAX_PLATFORMS": "cpu", "HOME": "/workspace/outputs", "RANK": "9"},
        **({"image": image} if image else {}),
        timeout=300,
    )
    print(f"distributed mode, JAX 2 nodes: {seconds:.1f} s")
    assert job.status is JobStatus.succeeded, logs + events_text(ma_module_home_client, job.id)
    results = [json.loads((outputs / f"jax-{r}.json").read_text()) for r in range(2)]
    assert [(r["process"], r["count"], r["devices"]) for r in results] == [(0, 2, 2), (1, 2, 2)]
    assert {r["imported at start"] for r in results} == {False}
    for rank in (0, 1):  # each node's process once
        assert logs.count(f"jax process {rank} of 2") == 1, logs
    assert {tuple(r["gathered"]) for r in results} == {(10, 11)}  # a real exchange between the nodes
    assert [r["rank"] for r in results] == ["0", "1"]  # the job's RANK=9 is not applied
    assert {r["home"] for r in results} == {"/workspace/outputs"}  # the job's HOME is
    master_addr, master_port, master_ports = results[0]["master"]
    assert master_ports.split(",")[0] == master_port
    # JAX's coordinator listens on worker-0's second port, never on torch's store port
    assert results[0]["coordinator"] == f"{master_addr}:{master_ports.split(',')[1]}"
    assert results[0]["ports"] == master_ports and results[1]["ports"] != master_ports


@pytest.mark.torch
def test_torchrun_ranks_share_the_nodes_cores_and_the_pytorch_mode_refuses_an_image_without_torch(
    ma_module_home_client, tmp_path
):
    outputs = writable_dir(tmp_path / "out")
    code = algorithm(tmp_path / "algo", threads=THREADS)
    # an image without torch: a bare virtualenv
    bare = tmp_path / "bare-venv"
    venv.create(bare, with_pip=False)
    with pytest.raises(InvalidSpec, match="--mode distributed") as refused:
        ma_module_home_client.submit(
            name="no-torch",
            mode="pytorch",
            nodes=2,
            specs=["cpu.small"],
            image={"venv": str(bare)},
            algorithm=str(code),
            command="python /workspace/algorithm/threads.py",
        )
    assert "no torch module" in str(refused.value)
    assert not ma_module_home_client.jobs(name="no-torch")  # nothing was queued
    # with torch, the dry run shows each node's wrapped command and says why it is wrapped
    wrapped = plan_text(
        ma_module_home_client.plan(
            name="wrapped",
            mode="pytorch",
            nodes=2,
            specs=["cpu.small"],
            algorithm=str(code),
            command="python /workspace/algorithm/threads.py",
            env={"RANK": "5"},
        )
    )
    assert wrapped.count("  note:    wrapped because the pytorch mode") == 2, wrapped
    assert "--mode distributed gives the same variables" in wrapped
    assert wrapped.count("  note:    --env RANK not applied: the platform sets it") == 2
    job, seconds, logs = run_job(
        ma_module_home_client,
        name="threads",
        mode="distributed",
        specs=["cpu.medium"],  # 2 cores
        algorithm=str(code),
        outputs=str(outputs),
        command="torchrun --nproc_per_node=2 /workspace/algorithm/threads.py",
        env={"HOME": "/workspace/outputs", "SLOTS": "7"},  # the job's HOME applies, its SLOTS not
    )
    print(f"torchrun 2 ranks on cpu.medium: {seconds:.1f} s")
    assert job.status is JobStatus.succeeded, logs + events_text(ma_module_home_client, job.id)
    results = [json.loads((outputs / f"threads-{r}.json").read_text()) for r in range(2)]
    # 2 cores / 2 ranks: one thread each (SLOTS-based counting gave each rank 2)
    assert [(r["OMP_NUM_THREADS"], r["torch_threads"], r["world"]) for r in results] == [("1", 1, "2")] * 2
    assert {(r["MKL_NUM_THREADS"], r["OPENBLAS_NUM_THREADS"], r["HOME"], r["SLOTS"]) for r in results} == {
        ("1", "1", "/workspace/outputs", "1")
    }
