"""``%load_ext ma_jupyter``: what it adds to an IPython start.

``.venv/bin/python bench/load_ext.py`` (option ``--reps N``, default 10) starts N fresh
interpreters that make an IPython shell (``InteractiveShell.instance()``, what a kernel or a
terminal IPython makes) and N that also run ``%load_ext ma_jupyter`` in it, alternating, and
prints the median wall time of each and the difference (target: under 60 ms).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

BARE = "from IPython.core.interactiveshell import InteractiveShell; shell = InteractiveShell.instance()"
WITH_EXTENSION = BARE + "; shell.run_line_magic('load_ext', 'ma_jupyter')"


def _seconds(code: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    _seconds(WITH_EXTENSION)  # warm the file cache and the bytecode
    bare, loaded = [], []
    for _ in range(args.reps):
        bare.append(_seconds(BARE))
        loaded.append(_seconds(WITH_EXTENSION))
    b, w = statistics.median(bare), statistics.median(loaded)
    print(
        f"IPython start, median of {args.reps}: bare {b * 1000:.0f} ms, with %load_ext ma_jupyter {w * 1000:.0f} ms"
    )
    print(f"%load_ext ma_jupyter adds {(w - b) * 1000:.0f} ms (target < 60 ms)")


if __name__ == "__main__":
    main()
