"""``ma-jupyter cluster``'s node table: the seed's columns and the state of a node out of placement."""

from __future__ import annotations

from ma_jupyter.frontends.clusterview import cluster_text
from ma_jupyter.models import ClusterNode, ClusterView, Node


def _rows(text: str) -> dict[str, dict[str, str]]:
    """The node table's rows by node name, each cell under its header (cells are split on the
    two spaces the table puts between columns)."""
    import re

    lines = text.split("\n\n")[0].splitlines()
    header = lines[0]
    starts = [m.start() for m in re.finditer(r"\S+(?: \S+)*", header)]
    names = [header[s:e].strip() for s, e in zip(starts, [*starts[1:], None], strict=True)]
    rows = {}
    for line in lines[1:]:
        cells = [line[s:e].strip() for s, e in zip(starts, [*starts[1:], None], strict=True)]
        rows[cells[0]] = dict(zip(names, cells, strict=True))
    return rows


def test_nodes_show_os_kernel_driver_and_specs_and_a_drained_node_is_drained():
    gpu = Node(
        name="g1",
        status="busy",
        os="Ubuntu 22.04",
        kernel="6.8.0-45",
        cpus=16,
        cpus_used=4,
        memory_gb=64,
        accelerators=2,
        accelerator_type="gpu",
        accelerators_used=[0],
        driver_version="550.54",
        specs=["gpu.a", "cpu.small"],
    )
    drained = Node(name="c1", status="drained", os="Ubuntu 22.04", kernel="6.8.0-45", cpus=4, memory_gb=8)
    view = ClusterView(
        nodes=[
            ClusterNode(node=gpu, model="A100", cards=["0(0):train-a"], fits=True),
            # nothing fits on a drained node: it is drained, not "tight"
            ClusterNode(node=drained, model="", fits=False),
        ]
    )
    rows = _rows(cluster_text(view))
    assert rows["g1"] == {
        "NODE": "g1",
        "STATUS": "idle",
        "OS / KERNEL": "Ubuntu 22.04 / 6.8.0-45",
        "MEMORY": "0/64 GB",
        "CPUS": "4/16",
        "CARDS": "1/2",
        "MODEL": "A100",
        "DRIVER": "550.54",
        "SPECS": "gpu.a,cpu.small",
        "IN USE": "0(0):train-a",
    }
    assert rows["c1"]["STATUS"] == "drained"
    assert rows["c1"]["DRIVER"] == "-" and rows["c1"]["SPECS"] == "-"
