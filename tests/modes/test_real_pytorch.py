"""The PyTorch mode with real torch: gloo DDP through the job service, the local backend and bubblewrap."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from ma_jupyter.models import JobStatus
from tests.fixtures.real_jobs import algorithm, events_text, job_processes, node_logs, run_job

from ..helpers import wait_for, writable_dir

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = [pytest.mark.torch]

DDP = """
import json, os
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(1234 + rank)  # different starting points: DDP must sync them
model = DDP(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(5):
    x = torch.randn(8, 4) + rank
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
params = [p.detach().flatten().tolist() for p in model.parameters()]
info = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "SLOTS")}
info.update(params=params, hostname=os.uname().nodename, world=world)
with open(f"/workspace/outputs/rank-{rank}.json", "w") as fh:
    json.dump(info, fh)
print(f"rank {rank}/{world} done loss={loss.item():.4f}", flush=True)
# Leave without gloo's teardown: it aborts now and then at exit ("terminate called without an
# active exception"), under a bare torchrun too; these tests are about training, not teardown.
os._exit(0)
"""

SEED_TORCHRUN = (
    "torchrun --nnodes ${WORLD_SIZE} --nproc_per_node ${SLOTS} --node_rank ${RANK} "
    "--master_addr ${MASTER_ADDR} --master_port ${MASTER_PORT} /workspace/algorithm/ddp.py"
)


def _results(outputs, count):
    return [json.loads((outputs / f"rank-{r}.json").read_text()) for r in range(count)]


def test_wrapped_python_command_2_nodes_ranks_end_with_identical_parameters(ma_module_home_client, tmp_path):
    outputs = tmp_path / "out"
    writable_dir(outputs)
    job, seconds, logs = run_job(
        ma_module_home_client,
        name="ddp-2x1",
        mode="pytorch",
        nodes=2,
        specs=["cpu.small"],
        algorithm=str(algorithm(tmp_path / "algo", ddp=DDP)),
        outputs=str(outputs),
        command="python /workspace/algorithm/ddp.py",
    )
    print(f"pytorch 2x1 wrapped: {seconds:.1f} s")
    assert job.status is JobStatus.succeeded, logs + events_text(ma_module_home_client, job.id)
    results = _results(outputs, 2)
    assert results[0]["params"] == results[1]["params"]
    assert [r["hostname"] for r in results] == ["worker-0", "worker-1"]
    assert {r["world"] for r in results} == {2}
    # per-rank logs exist (global rank numbering) and the node log carries the prefixed lines
    streams = {(s.node, s.rank) for s in ma_module_home_client.log_streams(job.id)}
    assert {("worker-0", 0), ("worker-1", 1)} <= streams
    assert {n.name: n.ranks for n in ma_module_home_client.get(job.id).nodes} == {
        "worker-0": [0],
        "worker-1": [1],
    }
    rank1 = ma_module_home_client.read_log(job.id, node="worker-1", rank=1).data
    assert "rank 1/2 done" in rank1
    assert "[rank 0] rank 0/2 done" in logs
    # the ranks formed a process group: no not-distributed alert
    assert [e.reason for e in ma_module_home_client.events(job.id) if e.alert] == []


# What Lightning's Trainer() with its defaults or a script that finds too few GPUs does: trains
# (here: computes) on each node alone and succeeds, never joining the job's process group.
ALONE = """
import torch
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(5):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print(f"trained alone, loss={loss.item():.4f}", flush=True)
"""


def test_a_2_node_job_whose_ranks_never_join_a_process_group_succeeds_with_an_alert(
    ma_module_home_client, tmp_path
):
    """As a user submits it: ``ma-jupyter submit --follow`` prints the alert before the end."""
    algo = algorithm(tmp_path / "algo", alone=ALONE)
    started = time.monotonic()
    argv = ["submit", "--name", "alone-2x1", "--mode", "pytorch", "--nodes", "2", "--spec", "cpu.small"]
    argv += ["--code-dir", str(algo), "--follow", "--", "python", "/workspace/algorithm/alone.py"]
    cli = subprocess.run(
        [sys.executable, "-m", "ma_jupyter.frontends.cli", *argv],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": ROOT},
        capture_output=True,
        text=True,
        timeout=240,
    )
    print(f"pytorch 2x1 without a process group, submit --follow: {time.monotonic() - started:.1f} s")
    job = ma_module_home_client.get(re.search(r"submitted (\S+) ", cli.stderr).group(1))
    assert job.status is JobStatus.succeeded, (
        cli.stdout + cli.stderr + events_text(ma_module_home_client, job.id)
    )
    assert cli.returncode == 0, cli.stderr
    # the follower prints every node's lines, each with its node
    for node in ("worker-0", "worker-1"):
        assert re.search(rf"^\[{node}\] (\[rank \d\] )?trained alone", cli.stdout, re.MULTILINE), cli.stdout
    assert "ALERT (worker-0): not distributed: no rank of the 2 nodes joined a process group" in cli.stderr
    alerts = [e for e in ma_module_home_client.events(job.id) if e.alert]
    assert len(alerts) == 1, events_text(ma_module_home_client, job.id)
    assert alerts[0].node == "worker-0"
    assert alerts[0].reason.startswith("not distributed: no rank of the 2 nodes joined a process group")
    # recorded before the end, so a follower that sees the job end also sees the alert
    events = ma_module_home_client.events(job.id)
    assert events.index(alerts[0]) < [e.status for e in events].index(JobStatus.succeeded)
    logs = node_logs(ma_module_home_client, job.id)
    assert logs.count("trained alone") == 2, logs
    # the other commands that wait for the end say it too; a plain read of the log does not
    for command, alerted in (["wait"], True), (["logs", "--follow"], True), (["logs"], False):
        later = subprocess.run(
            [sys.executable, "-m", "ma_jupyter.frontends.cli", command[0], job.id, *command[1:]],
            env={**os.environ, "PYTHONPATH": ROOT},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert later.returncode == 0, later.stderr
        assert ("ALERT (worker-0): not distributed" in later.stderr) is alerted, (command, later.stderr)


def test_the_seeds_torchrun_command_on_2_nodes_with_2_cards_has_world_size_4(ma_module_home_client, tmp_path):
    outputs = tmp_path / "out"
    writable_dir(outputs)
    job, seconds, logs = run_job(
        ma_module_home_client,
        name="torchrun-2x2",
        mode="pytorch",
        nodes=2,
        specs=["gpu.emu-2"],
        algorithm=str(algorithm(tmp_path / "algo", ddp=DDP)),
        outputs=str(outputs),
        command=SEED_TORCHRUN,
    )
    print(f"pytorch seed torchrun 2x2: {seconds:.1f} s")
    assert job.status is JobStatus.succeeded, logs + events_text(ma_module_home_client, job.id)
    results = _results(outputs, 4)
    assert {r["world"] for r in results} == {4}
    assert all(r["params"] == results[0]["params"] for r in results)
    assert [r["hostname"] for r in results] == ["worker-0", "worker-0", "worker-1", "worker-1"]
    assert {r["SLOTS"] for r in results} == {"2"}


# Two ranks of one node: rank 0 prints half a line, rank 1 a whole line meanwhile, then rank 0
# ends its line; each step waits for the previous one in the other rank's own log file.
HALF_LINES = """
import os, pathlib, sys, time
rank = int(os.environ["RANK"])
folder = pathlib.Path(os.environ["MA_RANK_LOG_DIR"])
def wait(name, text):
    path = folder / name
    while not path.exists() or text not in path.read_text():
        time.sleep(0.005)
for step in range(10):
    if rank == 0:
        sys.stdout.write(f"r0-{step}-start "); sys.stdout.flush()
        wait("rank-1.log", f"r1-{step}-whole")
        sys.stdout.write(f"r0-{step}-end\\n"); sys.stdout.flush()
    else:
        wait("rank-0.log", f"r0-{step}-start")
        sys.stdout.write(f"r1-{step}-whole\\n"); sys.stdout.flush()
"""


def test_two_ranks_of_one_node_printing_half_lines_never_share_a_line_of_its_log(
    ma_module_home_client, tmp_path
):
    job, seconds, logs = run_job(
        ma_module_home_client,
        name="half-lines",
        mode="pytorch",
        nodes=1,
        specs=["gpu.emu-2"],
        algorithm=str(algorithm(tmp_path / "algo", half=HALF_LINES)),
        command="python /workspace/algorithm/half.py",
    )
    assert job.status is JobStatus.succeeded, logs + events_text(ma_module_home_client, job.id)
    node_log = ma_module_home_client.read_log(job.id, node="worker-0", limit=1 << 20).data
    words = {"0": [], "1": []}
    for line in node_log.splitlines():
        if not line.startswith("[rank "):
            continue  # torchrun's own lines
        rank = line[6]
        assert line.startswith(f"[rank {rank}] r{rank}-"), line
        assert all(w.startswith(f"r{rank}-") for w in line[9:].split()), line
        words[rank] += line[9:].split()
    assert words["1"] == [f"r1-{s}-whole" for s in range(10)]
    assert words["0"] == [w for s in range(10) for w in (f"r0-{s}-start", f"r0-{s}-end")]


FAIL = """
import os, sys, time
import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == 3:
    print("rank 3 gives up", flush=True)
    sys.exit(3)
time.sleep(600)  # the others would run on: only the failure can end this job quickly
"""


def test_one_rank_exiting_3_ends_a_2x2_job_in_error_with_no_process_left(ma_module_home_client, tmp_path):
    job, seconds, logs = run_job(
        ma_module_home_client,
        timeout=120,
        name="fail-2x2",
        mode="pytorch",
        nodes=2,
        specs=["gpu.emu-2"],
        algorithm=str(algorithm(tmp_path / "algo", fail=FAIL)),
        command="python /workspace/algorithm/fail.py",
    )
    print(f"pytorch 2x2 one rank exits 3 -> error: {seconds:.1f} s")
    assert job.status is JobStatus.error, logs
    assert "rank 3 gives up" in ma_module_home_client.read_log(job.id, node="worker-1", rank=3).data
    # the error names the rank that failed first, not the ranks torchrun stopped afterwards
    assert "rank 3 exited with code 3" in events_text(ma_module_home_client, job.id)
    wait_for(lambda: not job_processes(job.id), timeout=30)


# A launcher in Lightning's manner (``_SubprocessScriptLauncher`` with ``LightningEnvironment``):
# started once per node, it reads only NODE_RANK, WORLD_SIZE (nodes), MASTER_ADDR and MASTER_PORT
# from the environment, starts one process per device itself and numbers them node by node.
LIGHTNING_LAUNCHER = """#!/usr/bin/env python
import os, subprocess, sys

devices = int(sys.argv[1])
env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK")}
env["NUM_NODES"] = os.environ["WORLD_SIZE"]
env["DEVICES"] = str(devices)
children = [
    subprocess.Popen([sys.executable, *sys.argv[2:]], env={**env, "LOCAL_RANK": str(local)})
    for local in range(devices)
]
sys.exit(max(child.wait() for child in children))
"""

LIGHTNING_WORKER = """
import json, os, socket
import torch
import torch.distributed as dist

devices, nodes = int(os.environ["DEVICES"]), int(os.environ["NUM_NODES"])
rank = int(os.environ["NODE_RANK"]) * devices + int(os.environ["LOCAL_RANK"])
world = nodes * devices
address = f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
dist.init_process_group("gloo", init_method=address, rank=rank, world_size=world)
value = torch.tensor([float(rank + 1)])
dist.all_reduce(value)
result = {"rank": rank, "world": world, "sum": value.item(), "host": socket.gethostname()}
# RESULTS comes from --env RESULTS=${MA_WORKSPACE}/outputs/... expanded on each node
with open(os.path.join(os.environ["RESULTS"], f"rank-{rank}.json"), "w") as fh:
    json.dump(result, fh)
print(f"rank {rank}/{world} sum={value.item()}", flush=True)
os._exit(0)  # the result is written: never depend on gloo's teardown (it may abort at exit)
"""


def test_a_lightning_style_launcher_finds_node_rank_and_master_in_the_environment(
    ma_module_home_client, tmp_path
):
    outputs = tmp_path / "out"
    writable_dir(outputs)
    algo = algorithm(tmp_path / "algo", worker=LIGHTNING_WORKER)
    launcher = algo / "launch"
    launcher.write_text(LIGHTNING_LAUNCHER)
    launcher.chmod(0o755)
    for node in ("worker-0", "worker-1"):
        writable_dir(outputs / f"by-{node}")
    job, seconds, logs = run_job(
        ma_module_home_client,
        name="lightning-2x2",
        mode="pytorch",
        nodes=2,
        specs=["cpu.small"],
        algorithm=str(algo),
        outputs=str(outputs),
        # not `python ...`: the platform starts no launcher, the job's own launcher runs as written
        command="/workspace/algorithm/launch 2 /workspace/algorithm/worker.py",
        env={"RESULTS": "${MA_WORKSPACE}/outputs/by-${HOSTNAME}"},
    )
    print(f"pytorch lightning-style launcher 2 nodes x 2 processes: {seconds:.1f} s")
    assert job.status is JobStatus.succeeded, logs + events_text(ma_module_home_client, job.id)
    found = {
        node: sorted(json.loads(p.read_text())["rank"] for p in (outputs / f"by-{node}").glob("rank-*.json"))
        for node in ("worker-0", "worker-1")
    }
    # ranks numbered node by node from NODE_RANK, each written where its node's ${HOSTNAME} said
    assert found == {"worker-0": [0, 1], "worker-1": [2, 3]}
    result = json.loads((outputs / "by-worker-1" / "rank-3.json").read_text())
    assert (result["world"], result["sum"], result["host"]) == (4, 10.0, "worker-1")


PET_ONLY = """
import json, os, socket
import torch
import torch.distributed as dist

dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_*: from torchrun, per process
value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
result = {"world": dist.get_world_size(), "sum": value.item(), "host": socket.gethostname()}
result["group_rank"] = os.environ["GROUP_RANK"]
with open(f"/workspace/outputs/rank-{dist.get_rank()}.json", "w") as fh:
    json.dump(result, fh)
os._exit(0)  # the result is written: never depend on gloo's teardown (it may abort at exit)
"""


def test_a_bare_torchrun_reads_nodes_rank_and_rendezvous_from_pet_variables(ma_module_home_client, tmp_path):
    outputs = tmp_path / "out"
    writable_dir(outputs)
    job, seconds, logs = run_job(
        ma_module_home_client,
        name="bare-torchrun",
        mode="pytorch",
        nodes=2,
        specs=["gpu.emu-2"],
        algorithm=str(algorithm(tmp_path / "algo", pet=PET_ONLY)),
        outputs=str(outputs),
        command="torchrun /workspace/algorithm/pet.py",
    )
    print(f"pytorch bare torchrun 2 nodes x 2 cards: {seconds:.1f} s")
    assert job.status is JobStatus.succeeded, logs + events_text(ma_module_home_client, job.id)
    # without PET_*, each torchrun would run alone: 1 process, world 1, on its own node
    results = [json.loads((outputs / f"rank-{r}.json").read_text()) for r in range(4)]
    assert {(r["world"], r["sum"]) for r in results} == {(4, 10.0)}
    assert [(r["host"], r["group_rank"]) for r in results] == [
        ("worker-0", "0"),
        ("worker-0", "0"),
        ("worker-1", "1"),
        ("worker-1", "1"),
    ]


# The launch style of pytorch/examples' distributed scripts: a GPU check before anything else,
# which prints and exits 0 where the GPUs are missing (this machine has none).
GPU_CHECKED = """
import sys
import torch

min_gpus = 2
if torch.cuda.device_count() < min_gpus:
    print(f"Unable to locate sufficient {min_gpus} gpus to run this example. Exiting.", flush=True)
    sys.exit()
import torch.distributed as dist
dist.init_process_group("nccl")
"""


def test_an_example_that_exits_for_want_of_gpus_on_2_nodes_gets_the_alert(ma_module_home_client, tmp_path):
    job, _seconds, logs = run_job(
        ma_module_home_client,
        name="gpu-checked",
        mode="pytorch",
        nodes=2,
        specs=["cpu.small"],
        algorithm=str(algorithm(tmp_path / "algo", example=GPU_CHECKED)),
        command="python /workspace/algorithm/example.py",
    )
    assert job.status is JobStatus.succeeded, logs + events_text(ma_module_home_client, job.id)
    assert logs.count("Unable to locate sufficient 2 gpus") == 2, logs
    alerts = [e.reason for e in ma_module_home_client.events(job.id) if e.alert]
    assert [a.split(",")[0] for a in alerts] == [
        "not distributed: no rank of the 2 nodes joined a process group"
    ]


# The DDP tutorial series' script shape: init_process_group from the environment torchrun sets,
# a collective, one line per rank.
RANKS_JOINED = """
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
print(f"rank {rank} of {world} joined, sum {total.item():.0f}", flush=True)
dist.destroy_process_group()
"""


def _rank_line(output: str, node: str, rank: int) -> bool:
    """Whether ``output`` has rank ``rank``'s line prefixed with its node (the rank splitter may
    add ``[rank r]`` after it)."""
    pattern = rf"^\[{node}\] (\[rank {rank}\] )?rank {rank} of 2 joined, sum 3$"
    return re.search(pattern, output, re.MULTILINE) is not None


def test_submit_follow_and_ma_train_show_both_nodes_of_a_torchrun_job(
    ma_module_home_client, ma_module_shell, tmp_path
):
    """Issue 27, item 1, with the tutorial's own launch (``torchrun script.py`` on each node):
    the followers print every node's lines, each with its node, the launcher's lines too."""
    from tests.magic_shell import Run

    algo = algorithm(tmp_path / "algo", ddp=RANKS_JOINED)
    argv = ["submit", "--name", "ddp-follow", "--mode", "pytorch", "--nodes", "2", "--spec", "cpu.small"]
    argv += ["--code-dir", str(algo), "--follow", "--", "torchrun", "/workspace/algorithm/ddp.py"]
    started = time.monotonic()
    cli = subprocess.run(
        [sys.executable, "-m", "ma_jupyter.frontends.cli", *argv],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": ROOT},
        capture_output=True,
        text=True,
        timeout=300,
    )
    print(f"pytorch torchrun 2x1, submit --follow: {time.monotonic() - started:.1f} s")
    assert cli.returncode == 0, cli.stdout + cli.stderr
    assert _rank_line(cli.stdout, "worker-0", 0) and _rank_line(cli.stdout, "worker-1", 1), cli.stdout
    # every log line names its node (the launcher's and torchrun's own too); then the CLI's end line
    *log, end = cli.stdout.splitlines()
    assert all(re.match(r"\[worker-[01]\] ", line) for line in log), cli.stdout
    assert end.startswith("ddp-follow-") and "succeeded" in end

    started = time.monotonic()
    run = Run(
        ma_module_shell,
        "%%ma_train --name ddp-cell --mode pytorch --nodes 2 --spec cpu.small\n" + RANKS_JOINED,
    )
    print(f"pytorch 2x1, %%ma_train: {time.monotonic() - started:.1f} s")
    assert run.error is None, run.stdout + run.stderr
    text = run.job_text()
    assert _rank_line(text, "worker-0", 0) and _rank_line(text, "worker-1", 1), text
