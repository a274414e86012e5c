"""The platform on a real NVIDIA card (issue: real accelerators, item 8).

Each test runs a real job service on the default cluster, which is built from this machine's
cards (no ``[[spec]]``/``[[node]]`` in its ``cluster.toml``), as root, so jobs run in the
bubblewrap sandbox as the unprivileged job account (``nobody``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ma_jupyter import accelerators, config
from tests.fixtures.gpu_cards import CARDS, torch_cuda
from tests.fixtures.notebooks import output_text
from tests.fixtures.service_api import full_log, submit, wait_status
from tests.fixtures.service_process import start_service, stop_services
from tests.helpers import wait_for

PY = sys.executable
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
needs_torch = pytest.mark.skipif(not CARDS or not torch_cuda(), reason="torch with CUDA is not installed")

TRAIN = """\
import json, os, sys, time
import torch
from torch import nn

print("uid", os.getuid(), "cards visible", torch.cuda.device_count(),
      "CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"),
      "machine", os.environ.get("MA_CARD_INDICES"), flush=True)
device = torch.device("cuda")
model = nn.Sequential(
    nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
    nn.Flatten(), nn.Linear(128, 10),
).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
x = torch.randn(256, 3, 64, 64, device=device)
y = torch.randint(0, 10, (256,), device=device)
steps = int(sys.argv[1])
for step in range(steps + 10):
    if step == 10:
        torch.cuda.synchronize()
        start = time.perf_counter()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
torch.cuda.synchronize()
print("RESULT " + json.dumps({"images_per_s": steps * 256 / (time.perf_counter() - start),
                             "card": torch.cuda.get_device_name(0)}), flush=True)
"""

DDP = """\
import os
import torch
import torch.distributed as dist

local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
dist.init_process_group("nccl")
value = torch.ones(1, device="cuda") * (dist.get_rank() + 1)
dist.all_reduce(value)
world = dist.get_world_size()
print(f"rank {dist.get_rank()}/{world} local {local} sum {int(value.item())} of {world * (world + 1) // 2} "
      f"on {torch.cuda.get_device_name(local)}", flush=True)
dist.destroy_process_group()
"""

NO_CARD = """\
import os
nodes = sorted(d for d in os.listdir("/dev") if d.startswith("nvidia"))
try:
    import torch
    cuda = torch.cuda.is_available()
except ImportError:
    cuda = None
print("NOCARD", nodes, cuda, os.environ.get("CUDA_VISIBLE_DEVICES"), flush=True)
"""


@pytest.fixture
def service(ma_home, tmp_path):
    """A service on the default cluster (this machine's cards), with the scripts in an algorithm folder."""
    svc = start_service(ma_home)
    algo = tmp_path / "algo"
    algo.mkdir()
    for name, text in (("train.py", TRAIN), ("ddp.py", DDP), ("nocard.py", NO_CARD)):
        (algo / name).write_text(text)
    svc.algorithm = str(algo)  # type: ignore[attr-defined]
    yield svc
    stop_services([svc])


def _result(svc, job_id, node="worker-0") -> dict:
    for line in full_log(svc, job_id, node).splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise AssertionError(full_log(svc, job_id, node)[-3000:])


def test_detection_matches_nvidia_smi():
    accelerators.forget()
    assert accelerators.detect("gpu") == CARDS
    specs = [s for s in config.default_specs() if s.accelerators]
    assert [s.name for s in specs] == [f"gpu.{k}" for k in config.card_counts(len(CARDS))]
    assert all(s.driver_versions == [CARDS[0].driver_version] and not s.emulated for s in specs)
    for node in config.default_nodes():
        assert node.emulated is False
        assert node.devices == [c.index for c in CARDS]
        assert node.accelerator_model == CARDS[0].model and node.driver_version == CARDS[0].driver_version


@needs_torch
def test_a_one_card_training_job_runs_as_nobody_in_the_sandbox(service):
    job = submit(
        service, name="train", command=f"{PY} train.py 200", specs=["gpu.1"], algorithm=service.algorithm
    )
    done = wait_status(service, job["id"], {"succeeded", "failed", "error"}, timeout=300)
    log = full_log(service, job["id"])
    assert done["status"] == "succeeded", log[-3000:]
    assert "uid 0 " not in log and "cards visible 1 CUDA_VISIBLE_DEVICES 0" in log, log[-3000:]
    assert _result(service, job["id"])["images_per_s"] > 0


@needs_torch
def test_ddp_with_nccl_over_all_the_cards(service):
    count = len(CARDS)
    job = submit(
        service,
        name="ddp",
        mode="pytorch",
        command="python ddp.py",  # the word python: the platform wraps it in torchrun (seed 002)
        specs=[f"gpu.{count}"],
        algorithm=service.algorithm,
    )
    done = wait_status(service, job["id"], {"succeeded", "failed", "error"}, timeout=300)
    log = full_log(service, job["id"])
    assert done["status"] == "succeeded", log[-3000:]
    total = count * (count + 1) // 2
    for rank in range(count):
        assert f"rank {rank}/{count} local {rank} sum {total} of {total}" in log, log[-3000:]


@needs_torch
def test_top_shows_the_cards_use_and_memory(service, ma_home):
    pytest.importorskip("pynvml", reason="card use is read through NVML (pip install nvidia-ml-py)")
    job = submit(
        service, name="busy", command=f"{PY} train.py 6000", specs=["gpu.1"], algorithm=service.algorithm
    )
    job_id = job["id"]

    def busy():
        usage = service.session().get(f"{service.api}/jobs/{job_id}/resources", timeout=10).json()
        return next(
            (s for s in usage["samples"] if (s["card_percent"] or 0) > 0 and (s["card_memory_mb"] or 0) > 0),
            None,
        )

    sample = wait_for(busy, timeout=120, interval=0.5)
    assert sample["card_percent"] > 0 and sample["card_memory_mb"] > 100
    env = {
        **os.environ,
        "MA_JUPYTER_HOME": str(ma_home),
        "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    top = subprocess.run(
        [PY, "-m", "ma_jupyter.frontends.cli", "top", job_id], env=env, capture_output=True, text=True
    )
    assert top.returncode == 0 and "CARD% NOW" in top.stdout, top.stderr
    print(top.stdout)  # the figures, kept in the test's output for bench/README.md
    service.session().post(f"{service.api}/jobs/{job_id}/stop", timeout=10)


@needs_torch
def test_gpu_quickstart_notebook_runs_under_papermill(ma_papermill):  # noqa: F811
    notebook = os.path.join(REPO, "notebooks", "gpu_quickstart.ipynb")
    text = output_text(ma_papermill(Path(notebook), steps=100))
    for expected in ("cards visible: 1", "images/s", "training done", ": succeeded", "card% now"):
        assert expected in text, f"{expected!r} missing from the saved outputs:\n{text[-4000:]}"


def test_a_cpu_job_sees_no_card(service):
    job = submit(
        service, name="cpu", command=f"{PY} nocard.py", specs=["cpu.small"], algorithm=service.algorithm
    )
    done = wait_status(service, job["id"], {"succeeded", "failed", "error"}, timeout=120)
    log = full_log(service, job["id"])
    assert done["status"] == "succeeded", log[-3000:]
    line = next(line for line in log.splitlines() if line.startswith("NOCARD"))
    assert line.startswith("NOCARD [] ") and line.endswith(" None"), line
    assert " True " not in line, line
