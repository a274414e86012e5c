"""The Ray backend against Ray Jobs on the same Ray cluster, same commands, in one run.

Run: ``.venv/bin/python bench/ray_jobs.py`` (``--reps N``, default 3; ``--ddp-reps N`` for (e),
default 10).  It re-executes itself inside a private network namespace with only loopback
(``unshare --net``, so Ray binds to 127.0.0.1; it needs root or user namespaces), starts a
two-node Ray cluster (2 CPUs each, with the dashboard that serves Ray Jobs), a job service on
the Ray backend on a temporary ``MA_JUPYTER_HOME``, and measures side by side:

(a) submit -> first line seen by a follower: ``Client.submit`` + ``logs(follow=True)`` against
    ``JobSubmissionClient.submit_job`` + ``tail_job_logs``;
(b) print -> seen: a job prints ``time.time()`` every 100 ms; each follower notes when each line
    arrives (median and worst of the differences);
(c) job ends -> follow returns: from the job's last line to the end of the follow;
(d) stop -> stopped: from asking to stop a running job to its status saying stopped;
(e) a 2x1 gloo DDP job's wall time: the pytorch mode on two Ray nodes against the same script
    started by hand with torchrun on the two Ray nodes (one Ray task pinned to each node).  The
    platform's nodes run at normal priority; Ray's tasks at Ray's worker niceness (15), which
    only matters when something else competes for the cores.

The platform's follower reads through the service only (``Client(local_logs=False)``), as a
client on another machine would, so every byte comes from the Ray node's agent.  Medians over
the repetitions; ratios are platform / Ray Jobs (or / by hand), lower is better.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

PY = sys.executable
TARGETS = {"log_latency": 0.5}

FIRST = "import time; print(repr(time.time()), flush=True)"
TICKS = "import time\nfor i in range(30):\n    print(repr(time.time()), flush=True)\n    time.sleep(0.1)\n"
SLEEP = "import time\nprint('up', flush=True)\ntime.sleep(600)\n"
DDP = textwrap.dedent(
    """
    import time
    print(f"start {time.time()!r}", flush=True)
    import os, torch, torch.distributed as dist
    dist.init_process_group("gloo")
    value = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(value)
    print(f"rank {dist.get_rank()} sum {value.item()}", flush=True)
    print(f"end {time.time()!r}", flush=True)
    os._exit(0)
    """
)


def _inside() -> bool:
    return os.environ.get("MA_RAY_NETNS") == "1"


def _reexec() -> int:
    """Run this script again inside a private network namespace with only loopback up."""
    argv = ["unshare", "--net", "--", "sh", "-c", 'ip link set lo up && exec "$0" "$@"', PY, *sys.argv]
    env = {**os.environ, "MA_RAY_NETNS": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    return subprocess.call(argv, env=env)


def _py(code: str) -> str:
    """A command line running ``code`` (for Ray Jobs' shell and the platform's argv alike)."""
    import shlex

    return f"{PY} -c {shlex.quote(code)}"


# ---------------------------------------------------------------------------- Ray Jobs


async def _ray_follow(jobs, job_id: str, on_line) -> None:
    async for chunk in jobs.tail_job_logs(job_id):
        now = time.time()
        for line in chunk.splitlines():
            if on_line(line, now):
                return


def _first_into(seen: list[float]):
    """A line handler noting the arrival of the first line and ending the follow."""

    def note(_line: str, now: float) -> bool:
        seen.append(now)
        return True

    return note


def ray_jobs_runs(jobs, reps: int) -> dict:
    from ray.job_submission import JobStatus

    first, latencies, end_gaps, stops = [], [], [], []
    for _ in range(reps):
        t0 = time.time()
        job_id = jobs.submit_job(entrypoint=_py(FIRST))
        seen: list[float] = []
        asyncio.run(_ray_follow(jobs, job_id, _first_into(seen)))
        first.append(seen[0] - t0)
    for _ in range(reps):  # each run gives 30 print -> seen delays and one end -> follow returns
        job_id = jobs.submit_job(entrypoint=_py(TICKS))
        arrivals: list[tuple[float, float]] = []

        def note(line: str, now: float, arrivals=arrivals) -> bool:
            try:
                arrivals.append((float(line), now))
            except ValueError:
                pass
            return False

        asyncio.run(_ray_follow(jobs, job_id, note))
        ended = time.time()
        latencies += [now - printed for printed, now in arrivals]
        end_gaps.append(ended - arrivals[-1][0])
    for _ in range(reps):
        job_id = jobs.submit_job(entrypoint=_py(SLEEP))
        asyncio.run(_ray_follow(jobs, job_id, lambda line, now: line == "up"))
        t0 = time.time()
        jobs.stop_job(job_id)
        while jobs.get_job_status(job_id) != JobStatus.STOPPED:
            time.sleep(0.02)
        stops.append(time.time() - t0)
    return {"first": first, "latency": latencies, "end": end_gaps, "stop": stops}


# ---------------------------------------------------------------------------- platform


def platform_runs(client, algo: str, reps: int) -> dict:
    first, end_gaps, stops = [], [], []
    for i in range(reps):
        t0 = time.time()
        job = client.submit(name=f"first-{i}", command=_py(FIRST), specs=["cpu.small"])
        seen = next(iter(job.logs(follow=True)))
        first.append(time.time() - t0)
        assert float(seen) >= t0
        job.wait(timeout=120)
    latencies = []
    for i in range(reps):  # each run gives 30 print -> seen delays and one end -> follow returns
        job = client.submit(name=f"ticks-{i}", command=_py(TICKS), specs=["cpu.small"])
        arrivals = []
        for line in job.logs(follow=True):
            arrivals.append((float(line), time.time()))
        ended = time.time()
        latencies += [now - printed for printed, now in arrivals]
        end_gaps.append(ended - arrivals[-1][0])
    for i in range(reps):
        job = client.submit(name=f"sleep-{i}", command=_py(SLEEP), specs=["cpu.small"], grace_period=3)
        next(iter(job.logs(follow=True)))
        t0 = time.time()
        job.stop()
        while client.get(job.id).status.value != "stopped":
            time.sleep(0.02)
        stops.append(time.time() - t0)
    return {"first": first, "latency": latencies, "end": end_gaps, "stop": stops}


def platform_ddp(client, algo: str) -> float:
    t0 = time.time()
    job = client.submit(
        name="ddp", mode="pytorch", nodes=2, specs=["cpu.small"], algorithm=algo, command="python ddp.py"
    )
    done = job.wait(timeout=300)
    wall = time.time() - t0
    assert done.status.value == "succeeded", done.reason
    events = client.events(job.id)
    running = next(e.time for e in events if e.status.value == "running").timestamp()
    logs = [client.read_log(job.id, node=f"worker-{r}", rank=r).data for r in range(2)]
    starts = [_script_time(text, "start") for text in logs]
    ends = [_script_time(text, "end") for text in logs]
    print(
        f"  ddp on the platform: submit -> running {running - t0:.2f} s, submit -> script starts "
        f"{min(starts) - t0:.2f}/{max(starts) - t0:.2f} s, script runs {max(ends) - min(starts):.2f} s, "
        f"last script end -> succeeded {events[-1].time.timestamp() - max(ends):.2f} s, wall {wall:.2f} s",
        flush=True,
    )
    return wall


def _script_time(text: str, mark: str) -> float:
    """The time the DDP script printed with ``mark`` (``start`` or ``end``)."""
    return float(next(line.split()[1] for line in text.splitlines() if line.startswith(f"{mark} ")))


def by_hand_ddp(ray, algo: str) -> float:
    """The same script with torchrun started on each Ray node by a pinned Ray task."""
    import socket

    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

    @ray.remote(num_cpus=1)
    def run(rank: int) -> tuple[int, str]:
        argv = [PY, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1"]
        argv += ["--node_rank", str(rank), "--master_addr", "127.0.0.1", "--master_port", str(port)]
        done = subprocess.run([*argv, os.path.join(algo, "ddp.py")], capture_output=True, text=True)
        return done.returncode, done.stdout

    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]][:2]
    t0 = time.time()
    refs = [
        run.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(rank)
        for rank, node in enumerate(nodes)
    ]
    results = ray.get(refs)
    wall = time.time() - t0
    assert [code for code, _ in results] == [0, 0], results
    starts = [_script_time(out, "start") for _, out in results]
    ends = [_script_time(out, "end") for _, out in results]
    print(
        f"  ddp by hand: start -> script starts {min(starts) - t0:.2f}/{max(starts) - t0:.2f} s, "
        f"script runs {max(ends) - min(starts):.2f} s, last script end -> done {t0 + wall - max(ends):.2f} s, "
        f"wall {wall:.2f} s",
        flush=True,
    )
    return wall


# ------------------------------------------------------------------------------- main


def _start_service(home: Path) -> subprocess.Popen:
    env = {**os.environ, "MA_JUPYTER_HOME": str(home), "PYTHONPATH": str(REPO)}
    log = open(home / "service.log", "ab")
    proc = subprocess.Popen([PY, "-m", "ma_jupyter.service"], env=env, stdout=log, stderr=log)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            if json.loads((home / "service.json").read_text())["pid"] == proc.pid:
                return proc
        except (OSError, ValueError, KeyError):
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    raise RuntimeError("the service did not start: " + (home / "service.log").read_text()[-2000:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--ddp-only", action="store_true", help="only (e), the DDP wall time")
    parser.add_argument(
        "--ddp-reps",
        type=int,
        default=10,
        help="repetitions of (e) (default 10: one run swings by a second either way)",
    )
    parser.add_argument(
        "--network",
        choices=("auto", "fence"),
        default="auto",
        help="the jobs' network ([backend] network): auto, each attempt in namespaces joined by its "
        "overlay (the default), or fence",
    )
    args = parser.parse_args()
    if not _inside():
        return _reexec()
    import ray
    from ray.cluster_utils import Cluster
    from ray.job_submission import JobSubmissionClient

    folder = Path(tempfile.mkdtemp(prefix="ma-bench-ray-"))
    (folder / "ray").mkdir()
    os.environ["RAY_TMPDIR"] = str(folder)
    cluster = Cluster()
    service = None
    try:
        cluster.add_node(num_cpus=2, include_dashboard=True, dashboard_host="127.0.0.1")
        cluster.add_node(num_cpus=2)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        jobs = JobSubmissionClient(f"http://{cluster.head_node.address_info['webui_url']}")
        home = folder / "home"
        home.mkdir()
        algo = folder / "algo"
        algo.mkdir()
        (algo / "ddp.py").write_text(DDP)
        (home / "cluster.toml").write_text(
            f'[backend]\nkind = "ray"\naddress = "{cluster.address}"\nnetwork = "{args.network}"\n'
            f'[mounts]\nallowed_roots = ["{folder}"]\n'
            '[users]\nallow_root = ["root"]\n'
        )
        service = _start_service(home)
        os.environ["MA_JUPYTER_HOME"] = str(home)
        from ma_jupyter.client import Client

        client = Client(autostart=False, local_logs=False)
        ours = theirs = None
        if not args.ddp_only:
            ours = platform_runs(client, str(algo), args.reps)
            theirs = ray_jobs_runs(jobs, args.reps)
        # alternated, so a change of the machine's load during the run weighs on both alike
        ddp, hand = [], []
        for _ in range(args.ddp_reps):
            ddp.append(platform_ddp(client, str(algo)))
            hand.append(by_hand_ddp(ray, str(algo)))
    finally:
        if service is not None:
            service.send_signal(signal.SIGTERM)
            service.wait(30)
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(folder, ignore_errors=True)
    med = statistics.median
    rows = [("(e) 2x1 gloo DDP wall time (vs by hand)", med(ddp), med(hand))]
    if ours is not None and theirs is not None:
        rows[:0] = [
            ("(a) submit -> first line seen", med(ours["first"]), med(theirs["first"])),
            ("(b) print -> seen, median", med(ours["latency"]), med(theirs["latency"])),
            ("(b) print -> seen, worst", max(ours["latency"]), max(theirs["latency"])),
            ("(c) job ends -> follow returns", med(ours["end"]), med(theirs["end"])),
            ("(d) stop -> stopped", med(ours["stop"]), med(theirs["stop"])),
        ]
    print(f"{'measure':42} {'ma_jupyter':>11} {'Ray Jobs':>9} {'ratio':>6}")
    for name, a, b in rows:
        print(f"{name:42} {a:10.3f}s {b:8.3f}s {a / b:6.2f}")
    quartiles = [statistics.quantiles(runs, n=4) for runs in (ddp, hand)] if len(ddp) > 1 else []
    if quartiles:
        (a1, _, a3), (b1, _, b3) = quartiles
        print(
            f"(e) quartiles: ma_jupyter {a1:.2f}-{a3:.2f} s, by hand {b1:.2f}-{b3:.2f} s ({len(ddp)} runs each)"
        )
    if ours is not None:
        latency = med(ours["latency"])
        verdict = "meets" if latency < TARGETS["log_latency"] else "misses"
        print(f"log latency target < {TARGETS['log_latency']} s: {verdict} ({latency:.3f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
