"""The periodic node checks look at each Ray node's own disk (issue 28, item 3) and network
(issue 37, item 5).

On ``test_ray_lost_host.py``'s two hosts, B's job folders lie on a disk of B's own (a tmpfs of
its mount namespace), which this machine cannot see: the check is asked of B's agent.  B's disk
shrunk under ``[limits] node_disk_free_mb`` marks B faulty, idle, with a reason naming the disk
as B sees it, while A passes; grown again, B is back in placement.  B's machine dropping its
overlays' frames marks B faulty the same way, naming the network.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from ma_jupyter.client import Client
from tests.helpers import wait_for
from tests.ray.two_hosts import B

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]


def _resize_b_disk(two_hosts, size: str) -> None:  # noqa: F811
    subprocess.run(
        ["nsenter", f"--target={two_hosts.holder.pid}", "--mount",
         "mount", "-o", f"remount,size={size}", two_hosts.private],
        check=True,
    )  # fmt: skip


def test_an_idle_ray_node_with_a_low_disk_is_marked_faulty_and_back_once_it_passes(
    two_hosts,  # noqa: F811
    service_on,  # noqa: F811
    ma_home,
):
    _resize_b_disk(two_hosts, "64m")
    try:
        toml = ma_home / "cluster.toml"
        toml.write_text(toml.read_text() + "[limits]\nnode_disk_free_mb = 100\n")
        service_on(two_hosts.private)  # job folders on B lie on B's own disk
        client = Client(autostart=False)
        b = two_hosts.b_name()

        def status(name: str) -> tuple[str, str]:
            node = next(n for n in client.nodes() if n.name == name)
            return node.status, node.health

        wait_for(lambda: status(b)[0] == "faulty", timeout=120, interval=0.5)
        health = status(b)[1]
        assert "job folders' disk" in health and two_hosts.private in health, health
        assert "node_disk_free_mb = 100" in health, health
        assert float(health.split(" has ")[1].split(" MB")[0]) <= 64, health  # B's disk, not this one's
        others = [n for n in client.nodes() if n.name != b]
        assert len(others) == 1 and others[0].status != "faulty", others  # A's disk is this machine's
        _resize_b_disk(two_hosts, "1g")
        wait_for(lambda: status(b)[0] != "faulty", timeout=120, interval=0.5)
    finally:
        _resize_b_disk(two_hosts, "50%")


def _nft_on_b(two_hosts, *args: str) -> None:  # noqa: F811
    subprocess.run(["nsenter", f"--target={two_hosts.holder.pid}", "--net", "nft", *args], check=True)


@pytest.mark.skipif(not shutil.which("nft"), reason="needs nftables' nft (./dev setup installs it)")
def test_a_ray_node_whose_overlay_frames_are_dropped_is_marked_faulty_and_back_once_they_pass(
    two_hosts,  # noqa: F811
    service_on,  # noqa: F811
):
    """Seed 002's inspection of the network, on Ray: B's machine drops the UDP its overlays'
    frames travel in (a firewall rule of B's own network), so no attempt's overlay reaches a node
    on B.  B's agent, probing its machine's end of an overlay, fails twice in a row: B is marked
    faulty, idle, with the reason; A, whose network is untouched, passes.  The rule removed, B
    is back in placement."""
    service_on(None)
    client = Client(autostart=False)
    b = two_hosts.b_name()

    def status(name: str) -> tuple[str, str]:
        node = next(n for n in client.nodes() if n.name == name)
        return node.status, node.health

    table = f"ma_netcheck_{os.getpid()}"
    _nft_on_b(two_hosts, "add", "table", "inet", table)
    try:
        _nft_on_b(two_hosts, "add", "chain", "inet", table, "input", "{ type filter hook input priority 0; }")
        _nft_on_b(
            two_hosts,
            "add",
            "rule",
            "inet",
            table,
            "input",
            "ip",
            "daddr",
            B,
            "meta",
            "l4proto",
            "udp",
            "drop",
        )
        wait_for(lambda: status(b)[0] == "faulty", timeout=180, interval=0.5)
        health = status(b)[1]
        assert health.startswith("network check: "), health
        assert "does not reach its peer" in health and f"UDP through {B}" in health, health
        others = [n for n in client.nodes() if n.name != b]
        assert len(others) == 1 and others[0].status != "faulty", others
    finally:
        _nft_on_b(two_hosts, "delete", "table", "inet", table)
    wait_for(lambda: status(b)[0] != "faulty", timeout=180, interval=0.5)
