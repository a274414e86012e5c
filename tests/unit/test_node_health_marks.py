"""The node health marks (service/health.py) and the cluster file's pools and inspection limits."""

from __future__ import annotations

import pytest

from ma_jupyter.config import Cluster, Limits, load_cluster
from ma_jupyter.errors import InvalidSpec
from ma_jupyter.models import Node
from ma_jupyter.service.health import NodeHealth


def test_marks_persist_keep_their_first_reason_and_clear(tmp_path):
    path = tmp_path / "node_health.json"
    health = NodeHealth(path)
    statuses = health.statuses  # the scheduler holds this very object
    assert health.mark("n1", "drained", "drained by admin: disk")
    assert not health.mark("n1", "faulty", "no heartbeat")  # the first reason stays
    assert health.mark("n2", "faulty", "no heartbeat for 12 s")
    assert statuses == {"n1": "drained", "n2": "faulty"}
    assert oct(path.stat().st_mode & 0o777) == "0o600"

    again = NodeHealth(path)  # a restarted service keeps them
    assert again.statuses == {"n1": "drained", "n2": "faulty"}
    assert again.snapshot()["n1"].reason == "drained by admin: disk"
    views = again.annotate([Node(name="n1", cpus=1, memory_gb=1), Node(name="n3", cpus=1, memory_gb=1)])
    assert [v.health for v in views] == ["drained by admin: disk", ""]
    assert again.clear("n1").status == "drained" and again.clear("n1") is None
    assert NodeHealth(path).statuses == {"n2": "faulty"}


def test_an_unreadable_marks_file_is_ignored(tmp_path):
    path = tmp_path / "node_health.json"
    path.write_text("{not json")
    assert NodeHealth(path).statuses == {}


def test_the_cluster_file_defines_pools_and_the_inspection_limits(tmp_path):
    path = tmp_path / "cluster.toml"
    path.write_text(
        '[[pool]]\nname = "mine"\ndedicated = true\n\n[[pool]]\nname = "shared"\n\n'
        "[limits]\nheartbeat_timeout = 4\nelastic_scale_up_interval = 60\n"
    )
    cluster = load_cluster(path)
    assert cluster.pools == {"mine": True, "shared": False}
    assert (cluster.limits.heartbeat_timeout, cluster.limits.elastic_scale_up_interval) == (4, 60)
    assert Cluster().pools == {"default": True}  # this machine's cluster: one dedicated pool
    path.write_text('[[node]]\nname = "a"\ncpus = 2\nmemory_gb = 2\n')  # no [[pool]] tables
    plain = load_cluster(path)
    assert plain.pools == {"default": True} and plain.nodes[0].pools == ["default"]
    for bad in ("[[pool]]\ndedicated = true\n", '[[pool]]\nname = "p"\ndedicated = "yes"\n', "pool = 3\n"):
        path.write_text(bad)
        with pytest.raises(InvalidSpec, match=r"\[\[pool\]\]"):
            load_cluster(path)


def test_the_cluster_file_sets_the_node_and_disk_limits(tmp_path):
    path = tmp_path / "cluster.toml"
    assert (Limits().max_node_processes, Limits().max_log_mb, Limits().disk_reserve_mb) == (4096, 1024, 256)
    path.write_text("[limits]\nmax_node_processes = 64\nmax_log_mb = 2.5\ndisk_reserve_mb = 16\n")
    limits = load_cluster(path).limits
    assert (limits.max_node_processes, limits.max_log_mb, limits.disk_reserve_mb) == (64, 2.5, 16)
    for bad in ("max_node_processes = 1.5", "max_log_mb = 0", "disk_reserve_mb = -1", 'max_log_mb = "1G"'):
        path.write_text(f"[limits]\n{bad}\n")
        with pytest.raises(InvalidSpec, match=rf"\[limits\] {bad.split()[0]} must be a positive number"):
            load_cluster(path)
    # the hang watch: 30 minutes unless set, a fraction for seconds, 0 turns it off
    assert Limits().hang_minutes == 30
    for value, expected in (("0.05", 0.05), ("0", 0), ("120", 120)):
        path.write_text(f"[limits]\nhang_minutes = {value}\n")
        assert load_cluster(path).limits.hang_minutes == expected
    for bad in ("-1", "true", '"30m"'):
        path.write_text(f"[limits]\nhang_minutes = {bad}\n")
        with pytest.raises(
            InvalidSpec, match=r"\[limits\] hang_minutes must be a positive number \(or 0 to turn it off\)"
        ):
            load_cluster(path)


def test_a_checks_mark_clears_when_it_passes_while_drains_and_heartbeat_faults_stay(tmp_path):
    path = tmp_path / "node_health.json"
    health = NodeHealth(path)
    assert health.mark("n1", "faulty", "the job folders' disk is nearly full", source="check")
    assert health.mark("n2", "faulty", "no node runner there has beaten", source="heartbeat")
    assert health.mark("n3", "drained", "drained by admin")
    assert NodeHealth(path).snapshot()["n1"].source == "check"  # kept across a restart
    assert health.clear_checked("n2") is None and health.clear_checked("n3") is None
    assert health.clear_checked("n1").reason == "the job folders' disk is nearly full"
    assert health.statuses == {"n2": "faulty", "n3": "drained"}
    # an admin's drain replaces a check's mark (the node stays out once it passes), not the reverse
    assert health.mark("n4", "faulty", "card 0 is gone", source="check")
    assert health.mark("n4", "drained", "drained by admin: repair")
    assert not health.mark("n4", "faulty", "card 0 is gone", source="check")
    assert health.clear_checked("n4") is None and health.statuses["n4"] == "drained"
    # a file written before marks had a source: kept like a drain
    path.write_text('{"n5": {"status": "faulty", "reason": "old"}}')
    old = NodeHealth(path)
    assert old.snapshot()["n5"].source == "" and old.clear_checked("n5") is None


def test_the_cluster_file_sets_the_node_disk_check_and_the_notify_command(tmp_path):
    from ma_jupyter.config import load_notify

    path = tmp_path / "cluster.toml"
    assert Limits().node_disk_free_mb == 4
    path.write_text('[limits]\nnode_disk_free_mb = 512\n\n[notify]\ncommand = "/usr/bin/tee -a /tmp/x"\n')
    assert load_cluster(path).limits.node_disk_free_mb == 512
    assert load_notify(path) == "/usr/bin/tee -a /tmp/x"
    path.write_text("[limits]\nnode_disk_free_mb = 0\n")
    with pytest.raises(InvalidSpec, match="node_disk_free_mb must be a positive number"):
        load_cluster(path)
    path.write_text("[limits]\nnode_disk_free_mb = 1\n")  # (a bad table refuses the whole file)
    assert load_notify(path) is None  # no [notify]: nothing is told
    for bad in (
        '[notify]\ncommand = ""\n',
        "[notify]\ncommand = 3\n",
        '[notify]\ncmd = "x"\n',
        "notify = 1\n",
    ):
        path.write_text(bad)
        with pytest.raises(InvalidSpec, match=r"\[notify\] takes command"):
            load_notify(path)
    path.write_text('[notify]\ncommand = "notify \'unclosed"\n')
    with pytest.raises(InvalidSpec, match="cannot be split into words"):
        load_notify(path)


def test_a_disk_mark_only_holds_new_work_and_any_other_mark_replaces_it(tmp_path):
    health = NodeHealth(tmp_path / "node_health.json")
    assert health.mark("n1", "faulty", "the job folders' disk is nearly full", source="disk")
    assert health.snapshot()["n1"].only_new_work
    assert not health.mark("n1", "faulty", "still full", source="disk")  # the first reason stays
    assert health.mark("n1", "faulty", "card 0 is gone", source="check")  # a fault moves jobs
    assert not health.snapshot()["n1"].only_new_work
    assert health.mark("n2", "faulty", "the job folders' disk is nearly full", source="disk")
    assert health.clear_checked("n2").source == "disk"  # space returned
    assert health.mark("n3", "faulty", "the job folders' disk is nearly full", source="disk")
    assert health.mark("n3", "drained", "drained by admin", source="admin")
