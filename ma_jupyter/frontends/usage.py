"""How a job's resource samples are shown: ``ma-jupyter top JOB`` and ``%ma_top JOB``.

The text form is one row per node: CPU and memory now (the newest sample), their mean and peak
over the samples kept, and the node's limit from the spec it runs with; for a node with real
cards, their use now and at its peak, and the card memory its processes hold now and at its peak
(``-`` where the node has no card the driver reads).  The picture (``%ma_top --inline``) is a PNG
of CPU and memory per node over time, and of card use and card memory when a node has them,
drawn with matplotlib.
"""

from __future__ import annotations

import io

TYPE_CHECKING = False  # typing's, without importing typing (a command line's call: ~5 ms)
if TYPE_CHECKING:  # annotations only: the CLI reads answers without pydantic
    from ..models import ResourceUsage

HEADERS = [
    "NODE",
    "SAMPLES",
    "CPU% NOW",
    "MEAN",
    "PEAK",
    "CPU LIMIT",
    "MEM MB NOW",
    "MEAN",
    "PEAK",
    "MEM LIMIT",
    "CARD% NOW",
    "PEAK",
    "CARD MB NOW",
    "PEAK",
]


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def rows(usage: ResourceUsage) -> list[list[str]]:
    """One row per node (the job's nodes first, in order; then any other node sampled)."""
    names = [n.node for n in usage.nodes]
    names += sorted({s.node for s in usage.samples} - set(names))
    limits = {n.node: n for n in usage.nodes}
    out = []
    for name in names:
        mine = [s for s in usage.samples if s.node == name]
        cpu = [s.cpu_percent for s in mine]
        mem = [s.memory_mb for s in mine]
        limit = limits.get(name)
        cpu_limit = f"{limit.cpus * 100:.0f}%" if limit and limit.cpus else "-"
        mem_limit = f"{limit.memory_mb:.0f}" if limit and limit.memory_mb else "-"
        card = [s.card_percent for s in mine if s.card_percent is not None]
        card_mem = [s.card_memory_mb for s in mine if s.card_memory_mb is not None]
        out.append(
            [
                name,
                str(len(mine)),
                _num(cpu[-1] if cpu else None),
                _num(sum(cpu) / len(cpu) if cpu else None),
                _num(max(cpu) if cpu else None),
                cpu_limit,
                _num(mem[-1] if mem else None),
                _num(sum(mem) / len(mem) if mem else None),
                _num(max(mem) if mem else None),
                mem_limit,
                _num(card[-1] if card else None),
                _num(max(card) if card else None),
                _num(card_mem[-1] if card_mem else None),
                _num(max(card_mem) if card_mem else None),
            ]
        )
    return out


def note(usage: ResourceUsage, *, ended: bool = False) -> str:
    """One line under the table when there is nothing to show: not yet for a job that may still
    be sampled, none at all for one that ``ended`` (it will never have any)."""
    if usage.samples:
        return ""
    why = (
        f"the service samples running jobs every {usage.interval:g} s; "
        "a backend that cannot sample, such as Ray, keeps none"
    )
    if ended:
        return f"no samples of {usage.job_id}: it ended before the first sample was taken ({why})"
    return f"no samples of {usage.job_id} yet ({why})"


def png(usage: ResourceUsage) -> bytes:
    """CPU % and memory MB per node over time (seconds since the first sample), as a PNG."""
    import matplotlib

    matplotlib.use("Agg")  # no display: the picture goes to a notebook or a file
    from matplotlib.figure import Figure

    cards = any(s.card_percent is not None or s.card_memory_mb is not None for s in usage.samples)
    fig = Figure(figsize=(8, 7.5 if cards else 4.5), dpi=100)
    axes = fig.subplots(4 if cards else 2, 1, sharex=True)
    cpu_ax, mem_ax = axes[0], axes[1]
    start = usage.samples[0].t if usage.samples else 0.0
    for name in dict.fromkeys(s.node for s in usage.samples):
        mine = [s for s in usage.samples if s.node == name]
        xs = [s.t - start for s in mine]
        cpu_ax.plot(xs, [s.cpu_percent for s in mine], label=name)
        mem_ax.plot(xs, [s.memory_mb for s in mine], label=name)
        if cards:
            with_card = [s for s in mine if s.card_percent is not None]
            axes[2].plot([s.t - start for s in with_card], [s.card_percent for s in with_card], label=name)
            with_mem = [s for s in mine if s.card_memory_mb is not None]
            axes[3].plot([s.t - start for s in with_mem], [s.card_memory_mb for s in with_mem], label=name)
    cpu_ax.set_ylabel("CPU %")
    mem_ax.set_ylabel("memory MB")
    if cards:
        axes[2].set_ylabel("card %")
        axes[3].set_ylabel("card MB")
    axes[-1].set_xlabel("seconds since the first sample")
    cpu_ax.set_title(f"{usage.job_id}: resource use")
    if usage.samples:
        cpu_ax.legend(loc="upper left", fontsize="small")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()
