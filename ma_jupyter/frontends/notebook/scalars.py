"""A job's TensorBoard scalars drawn as one PNG, for ``%ma_tensorboard --inline`` and the monitor.

Reads the event files under the job's outputs folder with TensorBoard's own event reader and
plots every scalar tag (one panel per tag, one line per run) with matplotlib's Agg backend, so
the picture is a plain ``image/png`` output that a saved notebook keeps.
"""

from __future__ import annotations

import io
import math
import sys
import types
from pathlib import Path

from ...errors import InvalidSpec


def _prefer_tensorflow_stub() -> None:
    """Let TensorBoard read local event files with its TensorFlow stub.

    With TensorFlow installed, TensorBoard's reader imports it first, which costs seconds in
    the kernel; its stub reads local files just as well.  TensorBoard picks the stub when a
    module ``tensorboard.compat.notf`` exists, so one is registered, unless TensorFlow is
    already imported (then it is free to use).
    """
    if "tensorflow" in sys.modules or "tensorboard.compat.notf" in sys.modules:
        return
    sys.modules["tensorboard.compat.notf"] = types.ModuleType("tensorboard.compat.notf")


def read_scalars(logdir: str | Path) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """``{tag: {run: [(step, value), ...]}}`` for every scalar under ``logdir`` (runs = sub-folders)."""
    _prefer_tensorflow_stub()
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    multiplexer = EventMultiplexer(size_guidance={"scalars": 0})
    multiplexer.AddRunsFromDirectory(str(logdir))
    multiplexer.Reload()
    found: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for run, tags in sorted(multiplexer.Runs().items()):
        for tag in tags.get("scalars", []):
            points = [(e.step, e.value) for e in multiplexer.Scalars(run, tag)]
            found.setdefault(tag, {})[run] = points
    return found


def scalars_png(logdir: str | Path, *, title: str = "", width: float = 10.0) -> bytes:
    """A PNG plotting every scalar tag found under ``logdir``.

    Raises:
        InvalidSpec: the folder does not exist or holds no scalars yet.
    """
    if not Path(logdir).is_dir():
        raise InvalidSpec(f"{logdir} does not exist: the job has written no outputs yet")
    scalars = read_scalars(logdir)
    if not scalars:
        raise InvalidSpec(f"no TensorBoard scalars under {logdir} yet: the job writes none, or not yet")
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    tags = sorted(scalars)
    cols = min(3, len(tags))
    rows = math.ceil(len(tags) / cols)
    fig = Figure(figsize=(width, 3.2 * rows))
    for i, tag in enumerate(tags):
        ax = fig.add_subplot(rows, cols, i + 1)
        for run, points in sorted(scalars[tag].items()):
            steps, values = zip(*points, strict=True) if points else ((), ())
            ax.plot(steps, values, marker="." if len(points) < 30 else None, label=run or ".")
        ax.set_title(tag)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if len(scalars[tag]) > 1:
            ax.legend(fontsize="small")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    return buf.getvalue()
