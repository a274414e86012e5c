"""How a job's resource samples are shown: ``ma-jupyter top JOB`` and ``%ma_top JOB``.

The text form is one row per node: CPU and memory now (the newest sample), their mean and peak
over the samples kept, and the node's limit from the spec it runs with.  The picture
(``%ma_top --inline``) is a PNG of CPU and memory per node over time, drawn with matplotlib.
"""

from __future__ import annotations

import io

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
            ]
        )
    return out


def note(usage: ResourceUsage) -> str:
    """One line under the table when there is nothing to show yet."""
    if usage.samples:
        return ""
    return (
        f"no samples of {usage.job_id} yet (the service samples running jobs every "
        f"{usage.interval:g} s; a backend that cannot sample, such as Ray, keeps none)"
    )


def png(usage: ResourceUsage) -> bytes:
    """CPU % and memory MB per node over time (seconds since the first sample), as a PNG."""
    import matplotlib

    matplotlib.use("Agg")  # no display: the picture goes to a notebook or a file
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4.5), dpi=100)
    cpu_ax, mem_ax = fig.subplots(2, 1, sharex=True)
    start = usage.samples[0].t if usage.samples else 0.0
    for name in dict.fromkeys(s.node for s in usage.samples):
        mine = [s for s in usage.samples if s.node == name]
        xs = [s.t - start for s in mine]
        cpu_ax.plot(xs, [s.cpu_percent for s in mine], label=name)
        mem_ax.plot(xs, [s.memory_mb for s in mine], label=name)
    cpu_ax.set_ylabel("CPU %")
    mem_ax.set_ylabel("memory MB")
    mem_ax.set_xlabel("seconds since the first sample")
    cpu_ax.set_title(f"{usage.job_id}: resource use")
    if usage.samples:
        cpu_ax.legend(loc="upper left", fontsize="small")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()
