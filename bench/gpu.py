"""The same training script bare and as a job, side by side on the same card.

Run on a machine with an NVIDIA card and torch with CUDA, as root (so jobs run in the bubblewrap
sandbox as the job account, as users' jobs do):
``python bench/gpu.py`` (``--reps N`` pairs, default 5; ``--steps N`` training steps, default 400).
It starts a job service on a temporary ``MA_JUPYTER_HOME`` whose default cluster is built from the
machine's cards, and stops it at the end.

The workload (the issue's): a small ConvNet, ``--steps`` bf16 steps (``torch.autocast``) of 256
random images 64x64, after 10 warm-up steps; it prints its images/s over the timed steps.

Each repetition runs, alternately first and second, so drift (clocks, the card's temperature)
lands on both sides:

* **bare**: ``subprocess.Popen`` of ``python train.py`` with ``CUDA_VISIBLE_DEVICES`` set to the
  card the job used (the wall time is Popen -> exit);
* **job**: ``Client.submit`` of the same command on ``gpu.1`` (the wall time is submit -> the
  job's end as the client sees it: ``wait`` returning).

The job's ``~/.cache`` (CUDA's kernel cache, Triton's, inductor's) is the user's persistent
cache, so from the second repetition on its compiled kernels are kept, like the bare runs' own
``~/.nv`` cache; the first pair is reported apart (cold) and left out of the medians.

Printed: medians of images/s (job / bare: target >= 0.99) and of wall time (job - bare: target
<= 0.5 s), and where the job's extra wall time goes, from the job's events and the first line its
command printed (submit -> started -> first line -> end).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

PY = sys.executable
TARGETS = {"throughput_ratio": 0.99, "extra_wall_s": 0.5}

TRAIN = """\
import json, os, sys, time
print("START " + repr(time.time()), flush=True)
import torch
from torch import nn

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
print("READY " + repr(time.time()), flush=True)
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
                             "card": torch.cuda.get_device_name(0),
                             "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}), flush=True)
"""


def parse(text: str) -> dict:
    """The RESULT, START and READY lines of the script's output."""
    out: dict = {}
    for line in text.splitlines():
        if line.startswith("RESULT "):
            out.update(json.loads(line[7:]))
        elif line.startswith(("START ", "READY ")):
            key, _, value = line.partition(" ")
            out[key.lower()] = float(value)
    if "images_per_s" not in out:
        raise RuntimeError(f"the script printed no result:\n{text[-3000:]}")
    return out


def run_bare(algo: Path, steps: int, card: str) -> dict:
    """The script as a plain process on ``card``: its result and Popen -> exit seconds."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": card, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    t0 = time.time()
    done = subprocess.run(
        [PY, str(algo / "train.py"), str(steps)],
        env=env,
        capture_output=True,
        text=True,
        cwd=algo,
        check=False,
    )
    wall = time.time() - t0
    if done.returncode != 0:
        raise RuntimeError(f"the bare run failed:\n{done.stderr[-3000:]}")
    return {**parse(done.stdout), "wall": wall, "t0": t0}


def run_job(client, algo: Path, steps: int, index: int) -> dict:
    """The script as a job on gpu.1: its result, submit -> end seconds, and the job's card."""
    t0 = time.time()
    job = client.submit(
        name=f"bench-gpu-{index}", command=f"python train.py {steps}", specs=["gpu.1"], algorithm=str(algo)
    )
    final = job.wait(timeout=600)
    wall = time.time() - t0
    log = "\n".join(job.logs())  # lines, without their newlines
    if final.status.value != "succeeded":
        raise RuntimeError(f"job {job.id} ended {final.status.value}:\n{log[-3000:]}")
    result = parse(log)
    started = final.started_at.timestamp() if final.started_at else None
    ended = final.finished_at.timestamp() if final.finished_at else None
    job.delete()
    return {**result, "wall": wall, "t0": t0, "started": started, "ended": ended}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=400)
    args = parser.parse_args()

    from ma_jupyter import accelerators

    cards = accelerators.detect("gpu")
    if not cards:
        print("no NVIDIA card on this machine (nvidia-smi lists none): nothing to measure", file=sys.stderr)
        return 2
    print(f"card: {cards[0].model}, driver {cards[0].driver_version}, {len(cards)} on this machine")

    with tempfile.TemporaryDirectory(prefix="ma-bench-gpu-") as tmp:
        home, algo = Path(tmp) / "home", Path(tmp) / "algo"
        home.mkdir()
        algo.mkdir(mode=0o755)
        (algo / "train.py").write_text(TRAIN)
        os.chmod(tmp, 0o755)  # the job account reads the algorithm folder
        (home / "cluster.toml").write_text(f'[mounts]\nallowed_roots = ["{tmp}"]\n')
        os.environ["MA_JUPYTER_HOME"] = str(home)
        from ma_jupyter.client import Client

        client = Client()  # starts the service on this home
        try:
            pairs = []
            for i in range(args.reps + 1):  # the first pair is the cold one
                job_first = i % 2 == 0
                job = bare = None
                for side in ("job", "bare") if job_first else ("bare", "job"):
                    if side == "job":
                        job = run_job(client, algo, args.steps, i)
                    else:
                        # the machine's first card: the one an idle machine gives a gpu.1 job
                        bare = run_bare(algo, args.steps, str(cards[0].index))
                pairs.append((job, bare))
                print(
                    f"{'cold' if i == 0 else f'pair {i}'}: job {job['images_per_s']:.0f} images/s in {job['wall']:.2f} s, "
                    f"bare {bare['images_per_s']:.0f} images/s in {bare['wall']:.2f} s"
                )
        finally:
            client.shutdown_service()

    warm = pairs[1:] or pairs
    ratio = statistics.median(j["images_per_s"] / b["images_per_s"] for j, b in warm)
    extra = statistics.median(j["wall"] - b["wall"] for j, b in warm)
    # where the job's extra wall time goes: submit -> its command's first line, and its first
    # line -> the model on the card (imports, CUDA's start), against the bare run's
    to_start = statistics.median(j["start"] - j["t0"] for j, _ in warm)
    bare_to_start = statistics.median(b["start"] - b["t0"] for _, b in warm)
    to_ready = statistics.median(j["ready"] - j["start"] for j, _ in warm)
    seen = [j["t0"] + j["wall"] - j["ended"] for j, _ in warm if j["ended"]]
    end_seen = statistics.median(seen) if seen else float("nan")
    bare_to_ready = statistics.median(b["ready"] - b["start"] for _, b in warm)
    print()
    print(f"throughput job/bare: {ratio:.3f} (target >= {TARGETS['throughput_ratio']})")
    print(f"wall time job - bare: {extra:+.2f} s (target <= {TARGETS['extra_wall_s']} s)")
    print(f"  submit -> first line: {to_start:.2f} s (bare Popen -> first line {bare_to_start:.2f} s)")
    print(f"  first line -> model on the card: {to_ready:.2f} s (bare {bare_to_ready:.2f} s)")
    print(f"  the job's end (service) -> wait returning: {end_seen:.2f} s")
    print(f"  cold pair: job {pairs[0][0]['wall']:.2f} s, bare {pairs[0][1]['wall']:.2f} s")
    ok = ratio >= TARGETS["throughput_ratio"] and extra <= TARGETS["extra_wall_s"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
