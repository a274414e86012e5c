"""Latency and throughput of the job path, each measured side by side with a baseline in the same run.

Run: ``.venv/bin/python bench/run.py`` (``--reps N``, ``--lines N``).  It starts a job service on a
temporary ``MA_JUPYTER_HOME`` and stops it at the end.

(a) submit -> started: from calling ``Client.submit`` to the job's first act (it prints
    ``time.time()``), against a bare ``subprocess.Popen`` of the same command.
(b) print -> seen: a job prints a timestamp every 50 ms; a ``logs(follow=True)`` client and a
    reader polling the log file directly (every 5 ms) both note when each line arrives.
(c) follow throughput: lines per second read by ``logs(follow=True)`` from a log being written as
    fast as the job can (against a reader following the file directly, polling every 1 ms), and
    from the finished log (against reading the file line by line; also shown: the client limited
    to the service path, and a whole-file read for scale).

(b') partial line -> seen: a job redraws one line with ``\r`` every 50 ms and never ends it (a
    progress bar); the front ends' follower (``JobFollower``) and a reader polling the log file
    directly (every 5 ms) both note when each state arrives.
(d) submit -> started with a working copy: the same first act from ``python start.py`` in an
    algorithm folder of 50 small files, which each node copies before it starts, against the job
    of (a) without an algorithm (run alternately).

Medians over the repetitions; ratios are client / baseline (a, b, d) or client / file (c).
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

PY = sys.executable
TARGETS = {"submit_to_started": 0.15, "print_to_seen": 0.1, "throughput_ratio": 0.5, "partial_to_seen": 0.05}


def command(code: str) -> str:
    return f"{PY} -c {shlex.quote(textwrap.dedent(code))}"


STARTED_CODE = "import time; print(repr(time.time()), flush=True)"


def bench_submit_to_started(client, reps: int) -> dict:
    """(a): seconds from submit to the job's first act, and from Popen to the same command's."""
    job_times, popen_times = [], []
    argv = shlex.split(command(STARTED_CODE))
    for i in range(reps):
        t0 = time.time()
        job = client.submit(name=f"bench-start-{i}", command=command(STARTED_CODE))
        first = next(iter(job.logs(follow=True)))
        job_times.append(float(first) - t0)
        job.wait(timeout=60)
        job.delete()

        t0 = time.time()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        line = proc.stdout.readline()
        popen_times.append(float(line) - t0)
        proc.wait()
    return _pair("submit -> started", job_times, popen_times, "s")


def bench_started_with_copy(client, algo: Path, reps: int) -> dict:
    """(d): submit -> started when the node first copies an algorithm folder, against none."""
    (algo / "pkg").mkdir(parents=True, exist_ok=True)
    (algo / "start.py").write_text(STARTED_CODE + "\n")
    for i in range(49):
        (algo / "pkg" / f"mod{i}.py").write_text(f"VALUE = {i}\n" * 40)
    copied, bare = [], []
    for i in range(reps):
        for spec, times in (
            ({"command": f"{PY} start.py", "algorithm": str(algo)}, copied),
            ({"command": command(STARTED_CODE)}, bare),
        ):
            t0 = time.time()
            job = client.submit(name=f"bench-copy-{i}", **spec)
            times.append(float(next(iter(job.logs(follow=True)))) - t0)
            job.wait(timeout=60)
            job.delete()
    return _pair("submit -> started, code copied", copied, bare, "s")


def _follow_file(path: Path, stop: threading.Event, arrivals: list[tuple[float, str]], interval: float):
    """A reader polling ``path`` directly: notes each complete line's arrival time."""
    while not path.exists() and not stop.is_set():
        time.sleep(interval)
    pending = b""
    with open(path, "rb") as fh:
        while True:
            data = fh.read()
            if data:
                now = time.time()
                pending += data
                *lines, pending = pending.split(b"\n")
                arrivals.extend((now, line.decode()) for line in lines)
            elif stop.is_set():
                return
            else:
                time.sleep(interval)


def bench_print_to_seen(client, home: Path, reps: int) -> dict:
    """(b): seconds from a print in the job to the line reaching a follower."""
    code = """
        import time
        time.sleep(0.3)
        for i in range(20):
            print(repr(time.time()), flush=True)
            time.sleep(0.05)
    """
    client_lat, file_lat = [], []
    for i in range(reps):
        job = client.submit(name=f"bench-seen-{i}", command=command(code))
        log_path = home / "jobs" / job.id / "logs" / "worker-0.log"
        stop = threading.Event()
        direct: list[tuple[float, str]] = []
        reader = threading.Thread(target=_follow_file, args=(log_path, stop, direct, 0.005), daemon=True)
        reader.start()
        for line in job.logs(follow=True):
            client_lat.append(time.time() - float(line))
        stop.set()
        reader.join(10)
        file_lat.extend(now - float(line) for now, line in direct)
        job.wait(timeout=60)
        job.delete()
    return _pair("print -> seen", client_lat, file_lat, "s")


def _follow_file_redraws(
    path: Path, stop: threading.Event, arrivals: list[tuple[float, str]], interval: float
):
    """A reader polling ``path`` directly: notes the arrival of each state of a line redrawn with
    ``\r`` (the text after the last ``\r`` of what came, as a terminal would show it)."""
    while not path.exists() and not stop.is_set():
        time.sleep(interval)
    with open(path, "rb") as fh:
        while True:
            data = fh.read()
            if data:
                now = time.time()
                last = data.rsplit(b"\r", 1)[-1].strip()
                if last:
                    arrivals.append((now, last.decode()))
            elif stop.is_set():
                return
            else:
                time.sleep(interval)


def bench_partial_to_seen(client, home: Path, reps: int) -> dict:
    """(b'): seconds from a job redrawing its line (``\r``, no newline: a progress bar) to the
    state reaching the front ends' follower (:class:`JobFollower`, as ``submit --follow``,
    ``%%ma_train`` and ``%ma_logs --follow`` use it), against a reader polling the file."""
    from ma_jupyter.client.logs import JobFollower

    code = """
        import sys, time
        time.sleep(0.3)
        for i in range(20):
            sys.stdout.write("\\r" + repr(time.time()))
            sys.stdout.flush()
            time.sleep(0.05)
        print(flush=True)
    """
    client_lat, file_lat = [], []
    for i in range(reps):
        job = client.submit(name=f"bench-partial-{i}", command=command(code))
        log_path = home / "jobs" / job.id / "logs" / "worker-0.log"
        stop = threading.Event()
        direct: list[tuple[float, str]] = []
        reader = threading.Thread(
            target=_follow_file_redraws, args=(log_path, stop, direct, 0.005), daemon=True
        )
        reader.start()
        for _, partials in JobFollower(client, job.info).updates():
            now = time.time()
            for text in partials.values():
                state = text.rsplit("\r", 1)[-1].strip()
                if state:
                    client_lat.append(now - float(state))
        stop.set()
        reader.join(10)
        file_lat.extend(now - float(state) for now, state in direct)
        job.wait(timeout=60)
        job.delete()
    return _pair("partial line -> seen", client_lat, file_lat, "s")


def bench_throughput(client, home: Path, reps: int, lines: int) -> list[dict]:
    """(c): lines/s through ``logs(follow=True)`` against reading the log file directly."""
    code = f"""
        import sys
        w = sys.stdout.write
        for i in range({lines}):
            w(f"{{i:08d}} the quick brown fox jumps over the lazy dog\\n")
    """
    live_client, live_file, done_client, done_service, done_lines, done_bulk = [], [], [], [], [], []
    for i in range(reps):
        job = client.submit(name=f"bench-tput-{i}", command=command(code))
        log_path = home / "jobs" / job.id / "logs" / "worker-0.log"
        # live: both readers follow while the job writes; lines/s from the same start to each one's last line
        stop = threading.Event()
        direct: list[tuple[float, str]] = []
        reader = threading.Thread(target=_follow_file, args=(log_path, stop, direct, 0.001), daemon=True)
        t0 = time.time()
        reader.start()
        count = sum(1 for _ in job.logs(follow=True))
        client_done = time.time()
        stop.set()
        reader.join(30)
        assert count == lines == len(direct), (count, len(direct))
        live_client.append(count / (client_done - t0))
        live_file.append(len(direct) / (direct[-1][0] - t0))
        # finished: the whole log once more through the client (file fast path, then service only),
        # and straight from the file, line by line and in one piece
        done_client.append(_rate(_follow_lines, job))
        client.local_logs = False
        done_service.append(_rate(_follow_lines, job))
        client.local_logs = True
        done_lines.append(_rate(_read_lines, log_path))
        done_bulk.append(_rate(_read_whole, log_path))
        job.delete()
    return [
        _pair("follow, live log", live_client, live_file, "lines/s"),
        _pair("follow, finished log", done_client, done_lines, "lines/s"),
        _pair("  same, service path only", done_service, done_lines, "lines/s"),
        _pair("  same, vs whole-file read", done_client, done_bulk, "lines/s"),
    ]


def _follow_lines(job) -> int:
    return sum(1 for _ in job.logs(follow=True))


def _read_whole(path: Path) -> int:
    return len(path.read_bytes().decode().split("\n")[:-1])


def _read_lines(path: Path) -> int:
    with open(path, encoding="utf-8", errors="replace") as fh:
        return sum(1 for line in fh if line.rstrip("\n") is not None)


def _rate(count_lines, arg) -> float:
    t0 = time.perf_counter()
    count = count_lines(arg)
    return count / (time.perf_counter() - t0)


def _pair(what: str, ours: list[float], baseline: list[float], unit: str) -> dict:
    a, b = statistics.median(ours), statistics.median(baseline)
    return {
        "what": what,
        "ours": a,
        "baseline": b,
        "ratio": a / b if b else float("nan"),
        "unit": unit,
        "n": len(ours),
    }


def _fmt(value: float, unit: str) -> str:
    return f"{value * 1000:.1f} ms" if unit == "s" else f"{value:,.0f} {unit}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=7, help="repetitions per measurement (default 7)")
    parser.add_argument("--lines", type=int, default=200_000, help="lines for the throughput job")
    parser.add_argument(
        "--latency-only",
        action="store_true",
        help="only (b) and (b'): print -> seen, whole and partial lines",
    )
    args = parser.parse_args(argv)

    with (
        tempfile.TemporaryDirectory(prefix="ma-bench-") as tmp,
        tempfile.TemporaryDirectory(prefix="ma-bench-code-") as code,
    ):
        home = Path(tmp)
        # jobs may mount the benchmark's own algorithm folder, nothing else
        (home / "cluster.toml").write_text(f'[mounts]\nallowed_roots = ["{code}"]\n')
        os.environ["MA_JUPYTER_HOME"] = str(home)
        from ma_jupyter.client import Client

        client = Client()
        try:
            client.connect()
            warm = client.submit(name="warm-up", command=command(STARTED_CODE))
            warm.wait(timeout=60)
            if args.latency_only:
                results = [
                    bench_print_to_seen(client, home, args.reps),
                    bench_partial_to_seen(client, home, args.reps),
                ]
                for r in results:
                    print(
                        f"{r['what']:34} {_fmt(r['ours'], r['unit']):>16} {_fmt(r['baseline'], r['unit']):>16} {r['ratio']:7.2f}  {r['n']}"
                    )
                return 0
            results = [
                bench_submit_to_started(client, args.reps),
                bench_print_to_seen(client, home, max(3, args.reps // 2)),
                *bench_throughput(client, home, max(3, args.reps), args.lines),
                bench_started_with_copy(client, Path(code) / "algo", args.reps),
                bench_partial_to_seen(client, home, max(3, args.reps // 2)),
            ]
        finally:
            client.shutdown_service()

    print(f"{'measure':34} {'ma_jupyter':>16} {'baseline':>16} {'ratio':>7}  n")
    for r in results:
        print(
            f"{r['what']:34} {_fmt(r['ours'], r['unit']):>16} {_fmt(r['baseline'], r['unit']):>16} {r['ratio']:7.2f}  {r['n']}"
        )
    started, seen = results[0]["ours"], results[1]["ours"]
    tput = results[3]["ratio"]  # finished log, client vs the file read line by line
    print()
    print(
        f"submit -> started {started * 1000:.0f} ms (target < {TARGETS['submit_to_started'] * 1000:.0f} ms): "
        f"{'ok' if started < TARGETS['submit_to_started'] else 'MISSED'}"
    )
    print(
        f"print -> seen {seen * 1000:.0f} ms (target < {TARGETS['print_to_seen'] * 1000:.0f} ms): "
        f"{'ok' if seen < TARGETS['print_to_seen'] else 'MISSED'}"
    )
    print(
        f"follow throughput {tput:.2f} x a direct read (target >= {TARGETS['throughput_ratio']}): "
        f"{'ok' if tput >= TARGETS['throughput_ratio'] else 'MISSED'}"
    )
    partial = results[-1]["ours"]
    print(
        f"partial line -> seen {partial * 1000:.0f} ms (target <= {TARGETS['partial_to_seen'] * 1000:.0f} ms): "
        f"{'ok' if partial <= TARGETS['partial_to_seen'] else 'MISSED'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
