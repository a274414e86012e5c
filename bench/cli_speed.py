"""How long a CLI call and a notebook's first submit take, each next to a baseline in the same run.

Run: ``.venv/bin/python bench/cli_speed.py`` (``--reps N``, default 9; ``--jobs N``, default 20).
It starts a job service on a temporary ``MA_JUPYTER_HOME``, submits ``--jobs`` short jobs and
waits for their end, then times, alternating with ``python -c pass`` (the baseline: an
interpreter's start and exit on the same machine at the same moment):

(a) ``ma-jupyter jobs``, ``get JOB``, ``logs JOB`` (a finished job) and ``submit`` without
    ``--follow``: the wall time of the whole process, as the ``ma-jupyter`` console script runs
    it (``from ma_jupyter.frontends.cli import main``);
(b) ``%%ma_train --no-follow``'s first submit in a fresh interpreter with IPython and the
    extension loaded (a fresh kernel): from the cell's start to its end (the submit's answer).

Medians over the repetitions; the target is ``ours - baseline`` (the CLI's own cost) within
0.1 s for (a) and the cell within 0.3 s for (b).  Also printed: the CPU time of each CLI call.
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
t0 = time.perf_counter()
result = shell.run_cell("%%ma_train --no-follow --name first-cell\\nprint('hi')\\n", silent=True)
elapsed = time.perf_counter() - t0
assert result.success, result.error_in_exec
print(repr(elapsed))
"""


def _timed(argv: list[str], env: dict) -> tuple[float, float, subprocess.CompletedProcess]:
    """Wall and CPU (user + system of the child) seconds of one process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
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
        help="the checkout whose CLI is timed (default this one: "
        "another one, e.g. before a change, against the same service and baseline)",
    )
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="ma-bench-cli-") as tmp:
        home = Path(tmp)
        os.environ["MA_JUPYTER_HOME"] = str(home)
        # as installed: the bytecode cache is written (and the first call below warms it)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPATH"] = str(args.tree.resolve())
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
            }
            rows = []
            for cli_args in commands.values():  # warm-up: bytecode and the disk cache
                _timed([PY, *CLI, *cli_args], env)
            for what, cli_args in commands.items():
                ours, cpus, base = [], [], []
                for _ in range(args.reps):
                    wall, cpu, done = _timed([PY, *CLI, *cli_args], env)
                    assert done.returncode == 0, done.stderr
                    ours.append(wall)
                    cpus.append(cpu)
                    base.append(_timed([PY, "-c", "pass"], env)[0])
                rows.append((what, statistics.median(ours), statistics.median(base), statistics.median(cpus)))
            cells, cell_base = [], []
            for _ in range(max(3, args.reps // 3)):
                done = subprocess.run(
                    [PY, "-c", FIRST_CELL], env=env, capture_output=True, text=True, timeout=120
                )
                assert done.returncode == 0, done.stderr
                cells.append(float(done.stdout.strip().splitlines()[-1]))
                cell_base.append(_timed([PY, "-c", "pass"], env)[0])
            for handle in client.jobs(status=["running", "queued"], limit=500):
                handle.stop()
        finally:
            client.shutdown_service()

    print(f"{'measure':28} {'ma_jupyter':>12} {'python -c pass':>15} {'own cost':>10} {'cpu':>9}")
    for what, ours, base, cpu in rows:
        own = ours - base
        verdict = "ok" if own <= TARGETS["cli"] else "MISSED"
        print(
            f"{what:28} {ours * 1000:9.0f} ms {base * 1000:12.0f} ms {own * 1000:7.0f} ms {cpu * 1000:6.0f} ms  {verdict}"
        )
    cell = statistics.median(cells)
    print(
        f"{'%%ma_train first submit':28} {cell * 1000:9.0f} ms {statistics.median(cell_base) * 1000:12.0f} ms"
        f" {'':>10} {'':>9}  {'ok' if cell <= TARGETS['first_cell'] else 'MISSED'} (target {TARGETS['first_cell'] * 1000:.0f} ms)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
