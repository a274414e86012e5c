"""How long a CLI call and a notebook's first submit take, each next to a baseline in the same run.

Run: ``.venv/bin/python bench/cli_speed.py`` (``--reps N``, default 9; ``--jobs N``, default 20).
It starts a job service on a temporary ``MA_JUPYTER_HOME``, submits ``--jobs`` short jobs and
waits for their end, then times, alternating with ``python -c pass`` (the baseline: an
interpreter's start and exit on the same machine at the same moment):

(a) ``ma-jupyter jobs``, ``get JOB``, ``logs JOB`` (a finished job) and ``submit`` without
    ``--follow``: the wall time of the whole process, as the ``ma-jupyter`` console script runs
    it (``from ma_jupyter.frontends.cli import main``);
(c) ``get --json``, ``jobs --json``, ``wait NAME`` (a finished job, by name), ``events`` and
    ``specs``, as (a);
(b) ``%%ma_train --no-follow``'s first submit in a fresh interpreter with IPython and the
    extension loaded (a fresh kernel): from the cell's start to its end (the submit's answer).

Medians over the repetitions; the target is ``ours - baseline`` (the CLI's own cost) within
0.1 s for (a) and (c) and the cell within 0.3 s for (b).  Also printed: the CPU time (user +
system, ``getrusage(RUSAGE_CHILDREN)``) of each CLI call and of the baseline, and the cell's
own CPU time (its process's, from its start to its end), less noisy than wall time on a loaded
machine.  ``--compare PATH`` times another checkout (e.g. the tree before a change) in the same
run, alternating with this one call by call, against the same service and baseline.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

PY = sys.executable
CLI = ["-c", "import sys; from ma_jupyter.frontends.cli import main; sys.exit(main())"]
TARGETS = {"cli": 0.1, "first_cell": 0.3}

FIRST_CELL = """
import sys, time
from IPython.core.interactiveshell import InteractiveShell
import ma_jupyter
shell = InteractiveShell.instance()
ma_jupyter.load_ipython_extension(shell)
t0, cpu0 = time.perf_counter(), time.process_time()
result = shell.run_cell("%%ma_train --no-follow --name first-cell\\nprint('hi')\\n", silent=True)
elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
assert result.success, result.error_in_exec
print(repr(elapsed), repr(cpu))
"""


def _timed(argv: list[str], env: dict) -> tuple[float, float, subprocess.CompletedProcess]:
    """Wall and CPU (user + system of the child) seconds of one process, run in the home (a
    folder without a checkout: ``python -c`` puts the current folder first on ``sys.path``,
    which would override ``PYTHONPATH``'s tree)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(
        argv, env=env, cwd=env["MA_JUPYTER_HOME"], capture_output=True, text=True, timeout=120
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=9, help="repetitions per measurement (default 9)")
    parser.add_argument("--jobs", type=int, default=20, help="jobs in the listing (default 20)")
    parser.add_argument(
        "--tree",
        type=Path,
        default=REPO,
        help="the checkout whose CLI is timed (default this one)",
    )
    parser.add_argument(
        "--compare",
        type=Path,
        help="another checkout (e.g. before a change) timed in the same run, alternating with --tree",
    )
    args = parser.parse_args(argv)
    trees = {"this": args.tree.resolve()}
    if args.compare:
        trees["compared"] = args.compare.resolve()

    with tempfile.TemporaryDirectory(prefix="ma-bench-cli-") as tmp:
        home = Path(tmp)
        os.environ["MA_JUPYTER_HOME"] = str(home)
        # as installed: the bytecode cache is written (and the first call below warms it)
        base_env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        envs = {label: {**base_env, "PYTHONPATH": str(tree)} for label, tree in trees.items()}
        from ma_jupyter.client import Client

        client = Client()
        try:
            client.connect()
            handles = [
                client.submit(name=f"bench-{i}", command=f"{PY} -c \"print('line {i}')\"")
                for i in range(args.jobs)
            ]
            for handle in handles:
                handle.wait(timeout=120)
            job = handles[-1].id
            commands = {
                "jobs": ["jobs"],
                "get": ["get", job],
                "logs (finished job)": ["logs", job],
                "submit (no --follow)": ["submit", "--name", "bench-cli", "--", PY, "-c", "pass"],
                # (c) the others that read plain JSON too
                "get --json": ["get", job, "--json"],
                "jobs --json": ["jobs", "--json"],
                "wait NAME": ["wait", f"bench-{args.jobs - 1}"],
                "events": ["events", job],
                "specs": ["specs"],
            }
            for env in envs.values():  # warm-up: bytecode and the disk cache
                for cli_args in commands.values():
                    _timed([PY, *CLI, *cli_args], env)
            rows = []  # (tree, what, wall, base wall, cpu, base cpu)
            for what, cli_args in commands.items():
                walls = {label: [] for label in envs}
                cpus = {label: [] for label in envs}
                base, base_cpu = [], []
                for _ in range(args.reps):
                    for label, env in envs.items():
                        wall, cpu, done = _timed([PY, *CLI, *cli_args], env)
                        assert done.returncode == 0, done.stderr
                        walls[label].append(wall)
                        cpus[label].append(cpu)
                    wall, cpu, _ = _timed([PY, "-c", "pass"], base_env)
                    base.append(wall)
                    base_cpu.append(cpu)
                for label in envs:
                    rows.append(
                        (
                            label,
                            what,
                            statistics.median(walls[label]),
                            statistics.median(base),
                            statistics.median(cpus[label]),
                            statistics.median(base_cpu),
                        )
                    )
            cells = {label: [] for label in envs}
            cell_cpus = {label: [] for label in envs}  # the cell's CPU time (its process's)
            cell_base = []
            for _ in range(max(3, args.reps // 3)):
                for label, env in envs.items():
                    done = subprocess.run(
                        [PY, "-c", FIRST_CELL],
                        env=env,
                        cwd=home,
                        capture_output=True,
                        text=True,
                        timeout=120,
                    )
                    assert done.returncode == 0, done.stderr
                    wall, cpu = done.stdout.strip().splitlines()[-1].split()
                    cells[label].append(float(wall))
                    cell_cpus[label].append(float(cpu))
                cell_base.append(_timed([PY, "-c", "pass"], base_env)[0])
            for handle in client.jobs(status=["running", "queued"], limit=500):
                handle.stop()
        finally:
            client.shutdown_service()

    print(
        f"{'tree':9} {'measure':24} {'ma_jupyter':>11} {'python -c pass':>15} {'own cost':>9}"
        f" {'cpu':>7} {'cpu of pass':>12} {'own cpu':>8}"
    )
    for label, what, ours, base, cpu, cpu_base in rows:
        own = ours - base
        verdict = "ok" if own <= TARGETS["cli"] else "MISSED"
        print(
            f"{label:9} {what:24} {ours * 1000:8.0f} ms {base * 1000:12.0f} ms {own * 1000:6.0f} ms"
            f" {cpu * 1000:4.0f} ms {cpu_base * 1000:9.0f} ms {(cpu - cpu_base) * 1000:5.0f} ms  {verdict}"
        )
    for label, measured in cells.items():
        cell = statistics.median(measured)
        print(
            f"{label:9} {'%%ma_train first submit':24} {cell * 1000:8.0f} ms"
            f" {statistics.median(cell_base) * 1000:12.0f} ms {'':9} {statistics.median(cell_cpus[label]) * 1000:4.0f} ms"
            f"  {'ok' if cell <= TARGETS['first_cell'] else 'MISSED'} (target {TARGETS['first_cell'] * 1000:.0f} ms)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
