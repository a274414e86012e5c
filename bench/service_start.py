"""How long the job service takes to start, next to a floor measured in the same run.

Run: ``.venv/bin/python bench/service_start.py`` (``--reps N``, default 10; ``--compare PATH``
times another checkout too, e.g. the tree before a change, alternating with this one start by
start).  Each repetition starts ``python -m ma_jupyter.service`` on a fresh temporary
``MA_JUPYTER_HOME`` (as the tests' fixtures and the client's autostart do) and measures:

(a) wall time from the process's start to its runtime file ``service.json`` naming it, and to
    its first answer on ``GET /api/v1/health`` (ready);
(b) the service's own CPU time (user + system, its reaped children included, from
    ``/proc/<pid>/stat``) at the moment it is ready: on a loaded machine the honest figure, since
    wall time mostly measures the other processes;
(c) with ``--life``, the CPU of the service's process tree (the service, its fork server and
    whatever they started, each with its reaped children) over ``IDLE_SECONDS`` seconds of idling
    with no job, and for one one-node ``true`` job from its submit until it is recorded
    succeeded (the first node: the sandbox probes, the fork server's start, the node).

Each tree's first start is not counted (it writes the package's compiled modules where the
environment turns bytecode files off, as the tests' first start does; it is given up to 60 s).
The floor, alternating with the starts: ``python -c "import fastapi, uvicorn"`` (the web stack
any FastAPI service imports) and ``python -c pass``, their wall and CPU times
(``getrusage(RUSAGE_CHILDREN)``).  Medians over the repetitions, and the service's figures as
ratios of the floor's.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
TICK = os.sysconf("SC_CLK_TCK")
#: seconds of idling measured by ``--life`` (c)
IDLE_SECONDS = 10.0
FLOORS = {"python -c pass": "pass", "import fastapi, uvicorn": "import fastapi, uvicorn"}


def _cpu_of(pid: int) -> float:
    """User + system seconds of ``pid`` and of its children it has reaped."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # after the command's closing parenthesis: state is field 3, utime 14 ... cstime 17
    return sum(int(v) for v in fields[11:15]) / TICK


def _tree_cpu(pid: int) -> float:
    """User + system seconds of ``pid`` and of every live descendant, each with the children
    it has reaped (a node runner the fork server reaped counts in the server's)."""
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        try:
            total += _cpu_of(current)
            for task in os.listdir(f"/proc/{current}/task"):
                todo += [int(c) for c in Path(f"/proc/{current}/task/{task}/children").read_text().split()]
        except (OSError, ValueError):
            pass  # ended meanwhile: its parent reaped it (and counts it) or will
    return total


def _call(data: dict, method: str, path: str, body: dict | None = None) -> dict:
    request = urllib.request.Request(
        data["url"] + "/api/v1" + path,
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {data['token']}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as reply:
        return json.loads(reply.read())


def life_once(pid: int, data: dict) -> dict[str, float]:
    """(c): the process tree's CPU over ``IDLE_SECONDS`` idle, then for one ``true`` job."""
    time.sleep(1.0)  # what the start left running (its compile thread) is not the idle loop's
    before = _tree_cpu(pid)
    time.sleep(IDLE_SECONDS)
    idle = _tree_cpu(pid) - before
    before = _tree_cpu(pid)
    job = _call(data, "POST", "/jobs", {"name": "bench-true", "command": "true"})
    deadline = time.monotonic() + 120
    while _call(data, "GET", f"/jobs/{job['id']}")["status"] != "succeeded":
        if time.monotonic() > deadline:
            raise RuntimeError("the job did not succeed in 120 s")
        time.sleep(0.05)
    return {"idle": idle, "job": _tree_cpu(pid) - before}


def _all_compiled(tree: Path) -> bool:
    """Whether every module of the tree's package has its compiled file next to it."""
    sources = (tree / "ma_jupyter").rglob("*.py")
    return all(Path(importlib.util.cache_from_source(str(source))).exists() for source in sources)


def start_once(
    tree: Path, timeout: float = 120.0, linger: float = 0.0, life: bool = False
) -> dict[str, float]:
    """One service start on a fresh home: seconds to the runtime file, to ready, and CPU.

    ``linger``: seconds at most it keeps running after it is ready while the package's compiled
    modules are still being written (a first start where the environment turns bytecode files
    off, see ``keep_compiled``)."""
    home = Path(tempfile.mkdtemp(prefix="ma-start-"))
    env = {**os.environ, "MA_JUPYTER_HOME": str(home), "PYTHONPATH": str(tree)}
    runtime = home / "service.json"
    t0 = time.perf_counter()
    # run in the home, not a checkout: ``-m`` puts the current folder first on sys.path
    proc = subprocess.Popen(
        [PY, "-m", "ma_jupyter.service"],
        env=env,
        cwd=home,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        data, t_file = None, 0.0
        deadline = t0 + timeout
        while time.perf_counter() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"the service exited with {proc.returncode}")
            if data is None:
                try:
                    data = json.loads(runtime.read_text())
                    t_file = time.perf_counter() - t0
                except (OSError, ValueError):
                    time.sleep(0.005)
                    continue
            request = urllib.request.Request(
                data["url"] + "/api/v1/health", headers={"Authorization": f"Bearer {data['token']}"}
            )
            try:
                with urllib.request.urlopen(request, timeout=timeout) as reply:
                    reply.read()
                break
            except OSError:
                time.sleep(0.005)
        else:
            raise RuntimeError("the service did not answer")
        t_ready = time.perf_counter() - t0
        cpu = _cpu_of(proc.pid)
        until = time.perf_counter() + linger
        while time.perf_counter() < until and not _all_compiled(tree):
            time.sleep(0.2)
        lived = life_once(proc.pid, data) if life else {}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(home, ignore_errors=True)
    return {"file": t_file, "ready": t_ready, "cpu": cpu, **lived}


def floor_once(code: str, tree: Path) -> dict[str, float]:
    """Wall and CPU seconds of ``python -c CODE``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(
        [PY, "-c", code], check=True, cwd=tempfile.gettempdir(), env={**os.environ, "PYTHONPATH": str(tree)}
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"ready": wall, "cpu": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=10, help="repetitions (default 10)")
    parser.add_argument("--compare", type=Path, help="another checkout to time in the same run")
    parser.add_argument(
        "--life",
        action="store_true",
        help=f"also {IDLE_SECONDS:.0f} s idle and one `true` job, per start (c)",
    )
    args = parser.parse_args(argv)

    trees = {"this tree": REPO}
    if args.compare:
        trees["compared"] = args.compare.resolve()
    for tree in trees.values():  # a first start, as the tests' first (it writes the bytecode)
        start_once(tree, linger=60.0)
    results: dict[str, list[dict[str, float]]] = {name: [] for name in [*trees, *FLOORS]}
    for _ in range(args.reps):
        for name, tree in trees.items():
            results[name].append(start_once(tree, life=args.life))
        for name, code in FLOORS.items():
            results[name].append(floor_once(code, REPO))

    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in results[name])

    print(f"load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} cores, {args.reps} repetitions, medians")
    print(f"{'':28} {'CPU s':>7} {'wall s':>7} {'file s':>7} {'CPU/floor':>10} {'wall/floor':>11}")
    floor = "import fastapi, uvicorn"
    for name in results:
        file = f"{med(name, 'file'):7.3f}" if name in trees else f"{'':7}"
        print(
            f"{name:28} {med(name, 'cpu'):7.3f} {med(name, 'ready'):7.3f} {file}"
            f" {med(name, 'cpu') / med(floor, 'cpu'):10.2f} {med(name, 'ready') / med(floor, 'ready'):11.2f}"
        )
    if args.life:
        print(f"\nprocess tree CPU, medians: {IDLE_SECONDS:.0f} s idle, and one one-node `true` job")
        for name in trees:
            print(
                f"{name:28} idle {med(name, 'idle') * 1000:6.0f} ms   job {med(name, 'job') * 1000:6.0f} ms"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
