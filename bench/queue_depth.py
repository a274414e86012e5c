"""The queue at depth: what thousands of queued jobs cost the job service.

Run: ``.venv/bin/python bench/queue_depth.py`` (``--depths 1000,10000``, ``--clients 4``, ``--idle 10``).
It makes a temporary ``MA_JUPYTER_HOME`` with a one-node cluster, starts a job service there
(loopback only), keeps a blocker job running that fills the node, and queues small jobs behind
it up to each depth.  The head of the queue is the next blocker (urgent), so the queue never
drains.  At each depth it measures:

* submit p50, first 100 -> last 100: one client submitting in sequence, for the first 100 jobs
  of the queue and for the last 100 before the depth (the jobs between come from ``--clients``
  concurrent clients); the ratio is last / first.
* list 50: ``GET /jobs`` pages of 50 (newest first; queued only; queued at offset depth / 2),
  the slowest of their medians over 20 reads.
* idle CPU: the service process's CPU time over ``--idle`` seconds while nothing starts, in %
  of one core.
* scheduling pass: with the service stopped, a supervisor made on the same home as the service
  makes it (queue index rebuilt from the store, running jobs re-attached) runs 51 admission
  passes (nothing can start): the median and max of the last 50, and the first (which records
  on the head of each shape that it waits: a write to the store each); and how long making the
  supervisor took.
* restart: from starting the service to its runtime file naming it, and every queued job still
  queued afterwards.
* head start: from ``POST /jobs/{blocker}/stop`` until a status long-poll sees the head running,
  and between the blocker's ``stopped`` event and the head's ``running`` event (service clock).

At the end the node is marked down (so the queued jobs never start), the blocker is stopped and
the service too.
"""

from __future__ import annotations

import sys
from pathlib import Path

# This file shares its name with the standard library's queue module, which the thread pool
# imports: run as a script, its own folder must not be on the import path.
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
REPO = HERE.parent
sys.path.insert(0, str(REPO))

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402
from datetime import datetime  # noqa: E402

import psutil  # noqa: E402
import requests  # noqa: E402

PY = sys.executable
TARGETS = {"pass_ms": 10.0, "list_ms": 100.0, "submit_ratio": 2.0, "idle_cpu": 5.0, "head_s": 1.0}

CLUSTER = """
[[spec]]
name = "cpu.full"
cpus = 4
memory_gb = 4

[[spec]]
name = "cpu.small"
cpus = 1
memory_gb = 1

[[node]]
name = "n1"
cpus = 4
memory_gb = 4
{status}

# one user fills the queue: past the default per-user bound (2000 queued jobs)
[limits]
max_queued_jobs_per_user = 1000000
"""
BLOCKER = {
    "name": "blocker",
    "command": f'{PY} -c "import time; time.sleep(3600)"',
    "specs": ["cpu.full"],
    "priority": "urgent",
    "grace_period": 1,
}
SMALL = {"name": "small", "command": f"{PY} -c pass", "specs": ["cpu.small"]}


class Service:
    """A job service process on ``home``, and HTTP sessions to it."""

    def __init__(self, home: Path):
        self.home = home
        self.proc: subprocess.Popen | None = None
        self.url = self.token = ""
        self._local = threading.local()

    def start(self, timeout: float = 120.0) -> float:
        """Start it; the seconds until its runtime file names it."""
        runtime = self.home / "service.json"
        log = open(self.home / "service.log", "ab")
        env = {**os.environ, "MA_JUPYTER_HOME": str(self.home), "PYTHONPATH": str(REPO)}
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(
            [PY, "-m", "ma_jupyter.service"], env=env, stdout=log, stderr=log, start_new_session=True
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the service exited: {(self.home / 'service.log').read_text()[-2000:]}")
            try:
                data = json.loads(runtime.read_text())
                if data["pid"] == self.proc.pid:
                    self.url, self.token = data["url"], data["token"]
                    self._local = threading.local()
                    return time.perf_counter() - t0
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.01)
        raise RuntimeError("the service did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(30)

    @property
    def session(self) -> requests.Session:
        """One keep-alive session per thread."""
        s = getattr(self._local, "session", None)
        if s is None:
            s = self._local.session = requests.Session()
            s.headers["Authorization"] = f"Bearer {self.token}"
        return s

    def call(self, method: str, path: str, **kwargs) -> dict | list:
        r = self.session.request(method, f"{self.url}/api/v1{path}", timeout=60, **kwargs)
        r.raise_for_status()
        return r.json() if r.content else {}

    def submit(self, body: dict) -> tuple[float, dict]:
        """Submit as the client does (with an idempotency key); (seconds, job)."""
        t0 = time.perf_counter()
        job = self.call("POST", "/jobs", json=body, headers={"Idempotency-Key": uuid.uuid4().hex})
        return time.perf_counter() - t0, job

    def wait_change(self, job_id: str, since: str) -> dict:
        while True:
            job = self.call("GET", f"/jobs/{job_id}/status", params={"since": since, "wait": 30})
            if job["status"] != since:
                return job

    def queued(self) -> int:
        return self.call("GET", "/jobs", params={"status": "queued", "limit": 1})["total"]


def fill(svc: Service, count: int, clients: int) -> float:
    """Submit ``count`` small jobs from ``clients`` concurrent clients; jobs per second."""
    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        for done, _ in enumerate(pool.map(lambda _: svc.submit(SMALL), range(count)), 1):
            if done % 1000 == 0:
                print(f"  ... {done} of {count} submitted", file=sys.stderr)
    return count / (time.perf_counter() - t0)


def list_times(svc: Service, depth: int) -> dict[str, float]:
    """Median seconds of 20 reads of each kind of page of 50."""
    pages = {
        "newest": {"limit": 50},
        "queued": {"status": "queued", "limit": 50},
        "deep": {"status": "queued", "limit": 50, "offset": depth // 2},
    }
    out = {}
    for what, params in pages.items():
        times = []
        for _ in range(20):
            t0 = time.perf_counter()
            page = svc.call("GET", "/jobs", params=params)
            times.append(time.perf_counter() - t0)
            assert len(page["items"]) == 50
        out[what] = statistics.median(times)
    return out


def idle_cpu(svc: Service, seconds: float) -> float:
    """% of one core the service used over ``seconds`` with nothing to start."""
    proc = psutil.Process(svc.proc.pid)
    time.sleep(1.0)  # let the last request's work settle
    before, t0 = proc.cpu_times(), time.perf_counter()
    time.sleep(seconds)
    after, t1 = proc.cpu_times(), time.perf_counter()
    used = (after.user - before.user) + (after.system - before.system)
    return 100.0 * used / (t1 - t0)


def scheduling_passes(home: Path, passes: int = 51) -> dict[str, float]:
    """With the service stopped: make a supervisor as the service does and time its passes."""
    from ma_jupyter import config
    from ma_jupyter.backends.local import LocalBackend
    from ma_jupyter.service.scheduler import Scheduler
    from ma_jupyter.service.store import Store
    from ma_jupyter.service.supervisor import Supervisor

    os.environ["MA_JUPYTER_HOME"] = str(home)
    t0 = time.perf_counter()
    sup = Supervisor(Store(config.db_path()), Scheduler(config.load_cluster()), LocalBackend())
    made = time.perf_counter() - t0
    sup.recover()  # re-attach to the blocker: its node stays taken
    times = []
    for _ in range(passes):
        t0 = time.perf_counter()
        started = sup.admit()
        times.append(time.perf_counter() - t0)
        assert started == 0, "a job started: the blocker should fill the node"
    sup.store.engine.dispose()
    first, rest = times[0], times[1:]
    return {
        "median": statistics.median(rest),
        "max": max(rest),
        "first": first,
        "made": made,
        "index": len(sup.queue),
    }


def event_time(svc: Service, job_id: str, status: str, first: bool) -> datetime:
    events = [e for e in svc.call("GET", f"/jobs/{job_id}/events") if e["status"] == status]
    return datetime.fromisoformat((events[0] if first else events[-1])["time"])


def head_start(svc: Service, blocker: str, head: str) -> tuple[float, float]:
    """Seconds from the blocker's stop request to the head running (client), and from the
    blocker's stopped event to the head's running event (service)."""
    t0 = time.perf_counter()
    svc.call("POST", f"/jobs/{blocker}/stop")
    job = svc.wait_change(head, "queued")
    client = time.perf_counter() - t0
    assert job["status"] == "running", job
    service = event_time(svc, head, "running", True) - event_time(svc, blocker, "stopped", False)
    return client, service.total_seconds()


def p50_ms(times: list[float]) -> float:
    return 1000 * statistics.median(times)


def run(home: Path, depths: list[int], clients: int, idle: float) -> list[dict]:
    (home / "cluster.toml").write_text(CLUSTER.format(status=""))
    svc = Service(home)
    svc.start()
    rows = []
    blocker = None
    try:
        blocker = svc.submit(BLOCKER)[1]["id"]
        svc.wait_change(blocker, "queued")
        head = svc.submit(BLOCKER)[1]["id"]  # the head of the queue: the next blocker
        first = [svc.submit(SMALL)[0] for _ in range(100)]
        queued = 101
        for depth in depths:
            rate = fill(svc, depth - 100 - queued, clients)
            last = [svc.submit(SMALL)[0] for _ in range(100)]
            queued = depth
            assert svc.queued() == depth
            lists = list_times(svc, depth)
            cpu = idle_cpu(svc, idle)
            svc.stop()
            passes = scheduling_passes(home)
            restart = svc.start()
            assert svc.queued() == depth == passes["index"], "a queued job was lost"
            to_head, events = head_start(svc, blocker, head)
            blocker, head = head, svc.submit(BLOCKER)[1]["id"]  # the queue keeps its depth
            rows.append(
                {
                    "depth": depth,
                    "pass_ms": 1000 * passes["median"],
                    "pass_max_ms": 1000 * passes["max"],
                    "pass_first_ms": 1000 * passes["first"],
                    "made_s": passes["made"],
                    "list_ms": {k: 1000 * v for k, v in lists.items()},
                    "submit_first_ms": p50_ms(first),
                    "submit_last_ms": p50_ms(last),
                    "fill_per_s": rate,
                    "idle_cpu": cpu,
                    "restart_s": restart,
                    "head_s": to_head,
                    "head_events_s": events,
                }
            )
            print(f"depth {depth}: {json.dumps(rows[-1])}", file=sys.stderr)
    except BaseException:
        log = home / "service.log"
        if log.exists():
            print("service log (end):\n" + log.read_text()[-3000:], file=sys.stderr)
        raise
    finally:
        clean_up(svc, home, blocker)
    return rows


def clean_up(svc: Service, home: Path, blocker: str | None) -> None:
    """Stop the blocker without letting a queued job start: the node goes down first."""
    svc.stop()
    (home / "cluster.toml").write_text(CLUSTER.format(status='status = "down"'))
    svc.start()
    if blocker is not None:
        svc.call("POST", f"/jobs/{blocker}/stop")
        svc.wait_change(blocker, "running")
    svc.stop()


def report(rows: list[dict], clients: int, idle: float) -> None:
    t = TARGETS
    print(
        f"\nqueue at depth (one node, a blocker running; {clients} concurrent clients fill the middle; "
        f"idle CPU over {idle:g} s)\n"
    )
    header = [
        "queued",
        f"pass (≤ {t['pass_ms']:g} ms)",
        f"list 50 (≤ {t['list_ms']:g} ms)",
        f"submit p50 first → last (≤ {t['submit_ratio']:g}×)",
        f"idle CPU (≤ {t['idle_cpu']:g} %)",
        f"blocker stop → head running (≤ {t['head_s']:g} s)",
        "restart",
    ]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for r in rows:
        lists = r["list_ms"]
        ratio = r["submit_last_ms"] / r["submit_first_ms"]
        cells = [
            f"{r['depth']:,}",
            f"{r['pass_ms']:.2f} ms (max {r['pass_max_ms']:.2f}; first {r['pass_first_ms']:.1f})",
            f"{max(lists.values()):.1f} ms (newest {lists['newest']:.1f}, queued {lists['queued']:.1f}, "
            f"offset {r['depth'] // 2:,} {lists['deep']:.1f})",
            f"{r['submit_first_ms']:.1f} → {r['submit_last_ms']:.1f} ms ({ratio:.2f}×)",
            f"{r['idle_cpu']:.1f} %",
            f"{r['head_s'] * 1000:.0f} ms ({r['head_events_s'] * 1000:.0f} ms between the events)",
            f"{r['restart_s']:.2f} s (supervisor made in {r['made_s']:.2f} s)",
        ]
        print("| " + " | ".join(cells) + " |")
    print()
    for r in rows:
        ok = {
            "pass": r["pass_max_ms"] <= t["pass_ms"],
            "list": max(r["list_ms"].values()) <= t["list_ms"],
            "submit": r["submit_last_ms"] <= t["submit_ratio"] * r["submit_first_ms"],
            "idle": r["idle_cpu"] <= t["idle_cpu"],
            "head": r["head_s"] <= t["head_s"],
        }
        missed = [k for k, v in ok.items() if not v]
        fill = f"filled at {r['fill_per_s']:.0f} jobs/s"
        print(
            f"{r['depth']:,} queued: "
            + ("every target met" if not missed else f"missed: {', '.join(missed)}"),
            fill,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--depths", default="1000,10000", help="queue depths, ascending (default 1000,10000)")
    parser.add_argument(
        "--clients", type=int, default=4, help="concurrent clients filling the queue (default 4)"
    )
    parser.add_argument(
        "--idle", type=float, default=10.0, help="seconds of idle CPU measurement (default 10)"
    )
    args = parser.parse_args(argv)
    depths = sorted(int(d) for d in args.depths.split(","))
    if depths[0] < 300:
        parser.error("each depth must be at least 300 (100 first, 100 last submits and the head)")
    with tempfile.TemporaryDirectory(prefix="ma-bench-queue-") as tmp:
        rows = run(Path(tmp), depths, args.clients, args.idle)
    report(rows, args.clients, args.idle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
