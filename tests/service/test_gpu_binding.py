"""Which card device nodes a job's sandbox gets, on a real service whose machine has fake cards.

The service runs in a private mount namespace whose ``/dev`` holds two fake NVIDIA cards
(``/dev/nvidia0``, ``/dev/nvidia1`` and the driver's control nodes, made with ``/dev/null``'s
numbers: tests/fakes/fake_dev.py) and answers NVML through a fake ``pynvml``.  Each job's node
prints what its own ``/dev`` shows and which of those nodes it can open, as the job's account
would look for cards to use (and for others' cards to steal).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from ma_jupyter.nodehost import network
from tests import fakes
from tests.fixtures.service_api import full_log, submit, wait_status
from tests.fixtures.service_process import start_service, stop_services
from tests.helpers import wait_for

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("bwrap") or not shutil.which("unshare"),
    reason="fake device nodes need root, bubblewrap and unshare",
)

PY = sys.executable
CONTROL = ["nvidia-caps", "nvidia-uvm", "nvidia-uvm-tools", "nvidiactl"]
PROBE = """\
import json, os, sys, time
nodes = sorted(d for d in os.listdir("/dev") if d.startswith("nvidia"))
opened = []
for name in nodes:
    path = "/dev/" + name
    if os.path.isdir(path):
        continue
    try:
        os.close(os.open(path, os.O_RDWR))
        opened.append(name)
    except OSError:
        pass
# a hostile job looks for the other cards of the machine too, and tries to make their nodes
others = [i for i in range(4) if os.path.exists(f"/dev/nvidia{i}")]
try:
    os.mknod("/dev/nvidia9", 0o20666, os.makedev(195, 9))  # NVIDIA's major
    made = True
except OSError:
    made = False
print("PROBE " + json.dumps({
    "nodes": nodes, "opened": opened, "others": others, "uid": os.getuid(), "made": made,
    "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"), "indices": os.environ.get("MA_CARD_INDICES"),
    "order": os.environ.get("CUDA_DEVICE_ORDER"),
}), flush=True)
if sys.argv[1:] == ["hold"]:
    time.sleep(600)
"""

CLUSTER = """
[[spec]]
name = "cpu.small"
cpus = 1
memory_gb = 1

[[spec]]
name = "gpu.1"
cpus = 1
memory_gb = 1
accelerators = 1
accelerator_type = "gpu"

[[spec]]
name = "gpu.2"
cpus = 1
memory_gb = 1
accelerators = 2
accelerator_type = "gpu"

[[node]]
name = "box"
cpus = 4
memory_gb = 4
accelerators = 2
accelerator_type = "gpu"
"""


@pytest.fixture
def gpu_service(ma_home, tmp_path):
    """A service on a machine with two fake cards (their nodes in its private /dev)."""
    (ma_home / "cluster.toml").write_text((ma_home / "cluster.toml").read_text() + CLUSTER)
    state = fakes.write_state(tmp_path / "gpus.json", 2, util=37, used_mb=1234)
    wrap = ["unshare", "--mount", "--propagation", "private", PY, str(fakes.FAKE_DEV), "2", "--"]
    env = {
        "MA_JUPYTER_CARDS": "",  # this service's machine has (fake) cards
        fakes.STATE_ENV: str(state),
        "PYTHONPATH": os.pathsep.join([str(fakes.NVML_DIR), os.environ.get("PYTHONPATH", "")]),
    }
    services = [start_service(ma_home, wrap=wrap, env=env)]
    services[0].state = state  # type: ignore[attr-defined]
    yield services[0]
    stop_services(services)


def _algorithm(tmp_path):
    algo = tmp_path / "algo"
    algo.mkdir(exist_ok=True)
    (algo / "probe.py").write_text(PROBE)
    return str(algo)


def probe(svc, job_id) -> dict:
    def found():
        for line in full_log(svc, job_id).splitlines():
            if line.startswith("PROBE "):
                return json.loads(line[6:])
        return None

    return wait_for(found, timeout=90, interval=0.2)


def test_the_cluster_shows_the_real_cards(gpu_service):
    nodes = gpu_service.session().get(f"{gpu_service.api}/nodes", timeout=10).json()
    box = next(n for n in nodes if n["name"] == "box")
    # emulated was not set in cluster.toml: this machine shows /dev/nvidia*, so they are real
    assert box["emulated"] is False and box["accelerators"] == 2


def test_each_job_sees_exactly_its_own_cards(gpu_service, tmp_path):
    algo = _algorithm(tmp_path)
    hold = f"{PY} probe.py hold"
    a = submit(gpu_service, name="a", command=hold, specs=["gpu.1"], algorithm=algo)["id"]
    b = submit(gpu_service, name="b", command=hold, specs=["gpu.1"], algorithm=algo)["id"]
    cpu = submit(gpu_service, name="cpu", command=f"{PY} probe.py", specs=["cpu.small"], algorithm=algo)["id"]
    seen = {job: probe(gpu_service, job) for job in (a, b, cpu)}
    # both one-card jobs run at once, on different cards, each opening only its own
    assert wait_status(gpu_service, a, {"running"}) and wait_status(gpu_service, b, {"running"})
    cards = set()
    for job in (a, b):
        got = seen[job]
        card = int(got["indices"])
        cards.add(card)
        assert got["nodes"] == sorted([f"nvidia{card}", *CONTROL])
        assert got["opened"] == sorted([f"nvidia{card}", "nvidia-uvm", "nvidia-uvm-tools", "nvidiactl"])
        assert got["others"] == [card] and got["made"] is False
        # CUDA numbers the one card it can open 0, in nvidia-smi's order
        assert got["cuda"] == "0" and got["order"] == "PCI_BUS_ID"
        assert got["uid"] != 0
    assert cards == {0, 1}
    # a job of a CPU spec sees no card at all
    assert seen[cpu]["nodes"] == [] and seen[cpu]["cuda"] is None
    # every card is held: a third one-card job waits
    c = submit(gpu_service, name="c", command=hold, specs=["gpu.1"], algorithm=algo)["id"]
    assert wait_status(gpu_service, c, {"queued"})["status"] == "queued"


def test_a_two_card_job_gets_both_and_the_dry_run_names_them(gpu_service, tmp_path):
    algo = _algorithm(tmp_path)
    plan = gpu_service.session().post(
        f"{gpu_service.api}/plan",
        json={"name": "p", "command": f"{PY} probe.py", "specs": ["gpu.2"], "algorithm": algo},
        timeout=10,
    )
    assert plan.status_code == 200, plan.text
    node = plan.json()["nodes"][0]
    assert node["devices"] == [0, 1]
    assert node["device_nodes"][:2] == ["/dev/nvidia0", "/dev/nvidia1"]
    assert set(node["device_nodes"]) == {"/dev/nvidia0", "/dev/nvidia1", *(f"/dev/{n}" for n in CONTROL)}
    assert node["env"]["MA_NUM_GPUS"] == "2" and node["env"]["NCCL_SOCKET_IFNAME"] == (
        "ma0" if network.namespaces_supported() else "lo"
    )
    assert "NCCL_DEBUG" not in node["env"]
    # compiled kernels live in the user's persistent cache, so a second run does not compile again
    for name in ("CUDA_CACHE_PATH", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"):
        assert node["env"][name].startswith("/tmp/.cache/"), name
    job = submit(gpu_service, name="both", command=f"{PY} probe.py", specs=["gpu.2"], algorithm=algo)["id"]
    got = probe(gpu_service, job)
    assert got["nodes"] == sorted(["nvidia0", "nvidia1", *CONTROL])
    assert got["cuda"] == "0,1" and got["indices"] == "0,1"
    assert wait_status(gpu_service, job, {"succeeded"})["status"] == "succeeded"


def test_a_gpu_spec_no_node_can_hold_is_refused_naming_the_cards(gpu_service, tmp_path):
    reply = gpu_service.session().post(
        f"{gpu_service.api}/jobs",
        json={"name": "x", "command": "true", "specs": ["gpu.2"], "nodes": 2, "mode": "pytorch"},
        timeout=10,
    )
    assert reply.status_code in (400, 422), reply.text
    text = reply.text
    assert "needs 4 real gpu cards and the machine has 2" in text and "gpu.1, gpu.2" in text


def _events(svc, job_id) -> list[str]:
    return [e["reason"] for e in svc.session().get(f"{svc.api}/jobs/{job_id}/events", timeout=10).json()]


def _box(svc) -> dict:
    return next(n for n in svc.session().get(f"{svc.api}/nodes", timeout=10).json() if n["name"] == "box")


def test_a_card_that_fails_marks_its_node_faulty(gpu_service, tmp_path):
    algo = _algorithm(tmp_path)
    job = submit(gpu_service, name="a", command=f"{PY} probe.py hold", specs=["gpu.1"], algorithm=algo)["id"]
    card = int(probe(gpu_service, job)["indices"])
    # the driver loses the card (NVML answers "GPU is lost" for it)
    fakes.write_state(gpu_service.state, 2, failed=[card])
    box = wait_for(lambda: (b := _box(gpu_service))["status"] == "faulty" and b, timeout=60)
    assert f"card {card} fails" in box["health"] and "GPU is lost" in box["health"]
    assert any(f"node box is faulty: NVIDIA card {card} fails" in e for e in _events(gpu_service, job))
    # the job on the faulty node is ended (no fault restart), naming the node
    assert wait_status(gpu_service, job, {"failed", "error"}, timeout=90)

    # back in placement; then the card's device node disappears under a running job
    fakes.write_state(gpu_service.state, 2)
    undrain = gpu_service.session().post(f"{gpu_service.api}/nodes/box/undrain", timeout=10)
    assert undrain.status_code == 200, undrain.text
    job = submit(gpu_service, name="b", command=f"{PY} probe.py hold", specs=["gpu.1"], algorithm=algo)["id"]
    card = int(probe(gpu_service, job)["indices"])
    nsenter = ["nsenter", "--target", str(gpu_service.proc.pid), "--mount", "rm", f"/dev/nvidia{card}"]
    subprocess.run(nsenter, check=True)
    box = wait_for(lambda: (b := _box(gpu_service))["status"] == "faulty" and b, timeout=60)
    assert f"/dev/nvidia{card} is gone" in box["health"]
    assert any(f"/dev/nvidia{card} is gone" in e for e in _events(gpu_service, job))


def test_top_shows_the_cards_use_and_the_nodes_card_memory(gpu_service, tmp_path, ma_home):
    fakes.write_state(gpu_service.state, 2, util=37, process_match="probe.py", process_mb=1234)
    algo = _algorithm(tmp_path)
    job = submit(gpu_service, name="a", command=f"{PY} probe.py hold", specs=["gpu.1"], algorithm=algo)["id"]
    probe(gpu_service, job)

    def sampled():
        usage = gpu_service.session().get(f"{gpu_service.api}/jobs/{job}/resources", timeout=10).json()
        return next((s for s in usage["samples"] if s["card_percent"] is not None), None)

    sample = wait_for(sampled, timeout=60, interval=0.5)
    assert sample["card_percent"] == 37.0
    # the driver lists the node's probe process (and its python -c parent, the rank splitter's
    # child, whichever hold it): at least its own 1234 MiB, all of them the node's processes
    assert sample["card_memory_mb"] >= 1234 and sample["card_memory_mb"] % 1234 == 0
    env = {**os.environ, "MA_JUPYTER_HOME": str(ma_home), "MA_JUPYTER_URL": gpu_service.url}
    env["MA_JUPYTER_TOKEN"] = gpu_service.token
    top = subprocess.run(
        [PY, "-m", "ma_jupyter.frontends.cli", "top", job],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert top.returncode == 0, top.stderr
    header, row = top.stdout.splitlines()[0], top.stdout.splitlines()[-1]
    assert "CARD% NOW" in header and "CARD MB NOW" in header
    assert "37" in row.split()
    # the cluster view: cards in use, with their use
    cluster = subprocess.run(
        [PY, "-m", "ma_jupyter.frontends.cli", "cluster"], env=env, capture_output=True, text=True, timeout=60
    )
    assert cluster.returncode == 0, cluster.stderr
    box = next(line for line in cluster.stdout.splitlines() if line.startswith("box"))
    assert "1/2 (37%)" in box and "(emulated)" not in box


@pytest.fixture
def default_gpu_service(ma_home, tmp_path):
    """A service on the default cluster (no [[spec]]/[[node]]) of a machine with four fake cards,
    detected through the fake nvidia-smi (no NVML module there)."""
    state = fakes.write_state(tmp_path / "gpus.json", 4)
    wrap = ["unshare", "--mount", "--propagation", "private", PY, str(fakes.FAKE_DEV), "4", "--"]
    env = {
        "MA_JUPYTER_CARDS": "",
        fakes.STATE_ENV: str(state),
        "PATH": f"{fakes.BIN_DIR}:{os.environ['PATH']}",
    }
    services = [start_service(ma_home, wrap=wrap, env=env)]
    yield services[0]
    stop_services(services)


def test_the_default_cluster_is_built_from_the_cards_and_its_nodes_split_them(default_gpu_service, tmp_path):
    svc = default_gpu_service
    specs = {s["name"]: s for s in svc.session().get(f"{svc.api}/specs", timeout=10).json()}
    assert {"gpu.1", "gpu.2", "gpu.4"} <= set(specs) and "gpu.emu-2" not in specs
    assert specs["gpu.4"]["driver_versions"] == [fakes.DRIVER] and specs["gpu.4"]["emulated"] is False
    nodes = svc.session().get(f"{svc.api}/nodes", timeout=10).json()
    assert len(nodes) == 4
    assert all(n["devices"] == [0, 1, 2, 3] and n["accelerator_model"] == fakes.MODEL for n in nodes)
    algo = _algorithm(tmp_path)
    # two nodes of two cards each on four cards: each node gets its own two
    job = submit(
        svc,
        name="split",
        mode="tensorflow",
        nodes=2,
        command=f"{PY} probe.py",
        specs=["gpu.2"],
        algorithm=algo,
    )["id"]
    seen = []
    for node in ("worker-0", "worker-1"):

        def found(node=node):
            for line in full_log(svc, job, node).splitlines():
                if line.startswith("PROBE "):
                    return json.loads(line[6:])
            return None

        seen.append(wait_for(found, timeout=90, interval=0.2))
    cards = [sorted(int(i) for i in got["indices"].split(",")) for got in seen]
    assert sorted(c for pair in cards for c in pair) == [0, 1, 2, 3]
    for got, pair in zip(seen, cards, strict=True):
        assert got["nodes"] == sorted([*(f"nvidia{c}" for c in pair), *CONTROL])
        assert got["cuda"] == "0,1"
    # more cards than the machine has, on the nodes asked: refused naming what it offers
    reply = svc.session().post(
        f"{svc.api}/jobs",
        json={"name": "x", "command": "true", "specs": ["gpu.4"], "nodes": 2, "mode": "tensorflow"},
        timeout=10,
    )
    assert reply.status_code in (400, 422) and "needs 8 real gpu cards and the machine has 4" in reply.text
