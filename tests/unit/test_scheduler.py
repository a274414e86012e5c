"""Placement on the simulated cluster: spreading, specs in order, cards, ps resources, elasticity."""

from __future__ import annotations

import pytest

from ma_jupyter.backends.local import LocalBackend
from ma_jupyter.config import Cluster, default_nodes, default_specs, emulated_specs
from ma_jupyter.errors import InvalidSpec
from ma_jupyter.models import JobSpec, Node
from ma_jupyter.modes.base import Placement
from ma_jupyter.nodehost import network
from ma_jupyter.service.scheduler import Scheduler


def ma_spec(**fields):
    return JobSpec(name="j", command="python x.py", **fields)


def test_workers_spread_one_per_node_with_distinct_hosts_and_ports():
    sched = Scheduler(Cluster())
    placed = sched.place("j1", ma_spec(mode="pytorch", nodes=3), sched.usage([]))
    hosts = [t.host for t in placed.tasks]
    assert len(set(hosts)) == 3
    # the scheduler names inventory nodes only; the backend binds hostnames, addresses and ports
    assert not placed.bound and all(not t.address and not t.ports for t in placed.tasks)
    backend = LocalBackend(inventory=[n.name for n in sched.cluster.nodes])
    placement = backend.bind(placed, reserve=True)
    # OpenSSH in the nodes where sshd is installed and nodes are sandboxed, else the agent; each
    # node a machine of its own where namespaces can be made (root here)
    own = network.namespaces_supported()
    shells = (
        (LocalBackend.remote_shell_on_job_network, LocalBackend.ssh_shell_on_job_network)
        if own
        else (LocalBackend.remote_shell, LocalBackend.ssh_shell)
    )
    assert placement.bound and placement.remote_shell in shells
    assert [t.hostname for t in placement.tasks] == ["worker-0", "worker-1", "worker-2"]
    ports = [p for t in placement.tasks for p in t.ports]
    assert len(set(ports)) == len(ports) and all(ports)
    # a second bind while the first holds its ports never hands them out again; a dry run reserves none
    again = backend.bind(placed, reserve=True)
    assert set(ports).isdisjoint(p for t in again.tasks for p in t.ports)
    assert {p for t in backend.bind(placed, reserve=False).tasks for p in t.ports} == {0}
    assert Placement.from_json(placement.to_json()) == placement


def test_first_spec_that_fits_wins_and_cards_are_assigned():
    sched = Scheduler(Cluster())
    spec = ma_spec(mode="pytorch", nodes=2, specs=["npu.emu-2", "cpu.small"])
    placement = sched.place("j1", spec, sched.usage([]))
    assert placement.spec.name == "npu.emu-2"
    assert all(t.slots == 2 and len(t.devices) == 2 for t in placement.tasks)
    # the two npu nodes are now each half used; a second identical job takes the other cards
    second = sched.place("j2", spec, sched.usage([placement]))
    assert second.spec.name == "npu.emu-2"
    assert all(
        set(a.devices).isdisjoint(b.devices) for a, b in zip(placement.tasks, second.tasks, strict=True)
    )
    # a third no longer fits on npu nodes: the equivalent cpu spec is used
    third = sched.place("j3", spec, sched.usage([placement, second]))
    assert third.spec.name == "cpu.small"


def test_parameter_servers_get_small_resources_and_may_share_a_node():
    cluster = Cluster(specs=default_specs(), nodes=default_nodes(2))
    sched = Scheduler(cluster)
    placement = sched.place("j", ma_spec(mode="tensorflow", nodes=2, ps=2), sched.usage([]))
    roles = [(t.role, t.index) for t in placement.tasks]
    assert roles == [("ps", 0), ("ps", 1), ("worker", 0), ("worker", 1)]
    assert all(t.slots == 1 for t in placement.role("ps"))


def test_jobs_that_can_never_fit_are_refused_up_front():
    sched = Scheduler(Cluster(specs=default_specs(), nodes=default_nodes(2)))
    with pytest.raises(InvalidSpec, match="can ever be placed"):
        sched.check(ma_spec(mode="pytorch", nodes=3))
    with pytest.raises(InvalidSpec, match="unknown spec 'gpu.huge'"):
        sched.check(ma_spec(specs=["gpu.huge"]))
    with pytest.raises(InvalidSpec, match="unknown node"):
        sched.check(ma_spec(node_name="node-99"))
    with pytest.raises(InvalidSpec, match="can ever be placed"):
        sched.check(ma_spec(specs=["gpu.emu-2"], driver_version="999"))
    with pytest.raises(InvalidSpec, match="GPU and MLU specs only"):
        sched.check(ma_spec(driver_version="535.0"))


def test_elastic_resume_accepts_fewer_nodes_when_short():
    cluster = Cluster(specs=default_specs(), nodes=default_nodes(2))
    sched = Scheduler(cluster)
    busy = sched.place("other", ma_spec(specs=["cpu.medium"], node_name="node-1"), sched.usage([]))
    busy2 = sched.place("other2", ma_spec(specs=["cpu.medium"], node_name="node-1"), sched.usage([busy]))
    use = sched.usage([busy, busy2])
    rigid = ma_spec(mode="pytorch", nodes=2, specs=["cpu.medium"])
    assert sched.place("j", rigid, use) is None
    elastic = ma_spec(
        mode="pytorch", nodes=2, specs=["cpu.medium"], checkpoint_resume={"elastic_min_nodes": 1}
    )
    placement = sched.place("j", elastic, use)
    assert [t.host for t in placement.tasks] == ["node-0"]


def test_node_views_report_use():
    sched = Scheduler(Cluster())
    placement = sched.place("j1", ma_spec(specs=["gpu.emu-2"]), sched.usage([]))
    views = {n.name: n for n in sched.node_views(sched.usage([placement]))}
    host = placement.tasks[0].host
    assert views[host].accelerators_used == [0, 1]
    assert views[host].status == "busy"
    assert all(v.status == "idle" for k, v in views.items() if k != host)
    only_npu = sched.node_views(sched.usage([]), spec="npu.emu-2")
    assert {n.accelerator_type for n in only_npu} == {"npu"}


def test_drained_or_faulty_nodes_take_no_new_placement_but_still_count_at_submit():
    sched = Scheduler(Cluster())
    sched.unusable.update({"node-0": "drained", "node-1": "faulty"})
    placed = sched.place("j1", ma_spec(mode="pytorch", nodes=2), sched.usage([]))
    assert {t.host for t in placed.tasks} == {"node-2", "node-3"}
    assert sched.place("j2", ma_spec(mode="pytorch", nodes=3), sched.usage([])) is None
    sched.check(ma_spec(mode="pytorch", nodes=4))  # only out for now: never refused for it
    planned = sched.place_anywhere("j3", ma_spec(mode="pytorch", nodes=4))
    assert len({t.host for t in planned.tasks}) == 4  # how a job that must wait is planned
    views = {v.name: v.status for v in sched.node_views(sched.usage([]))}
    assert (views["node-0"], views["node-1"], views["node-2"]) == ("drained", "faulty", "idle")


def test_a_jobs_excluded_nodes_take_none_of_its_tasks_unless_no_other_node_could_ever():
    sched = Scheduler(Cluster(nodes=default_nodes(4)))
    spec = ma_spec(mode="pytorch", nodes=2)
    placed = sched.place("j", spec, sched.usage([]), exclude=("node-0",))
    assert "node-0" not in {t.host for t in placed.tasks}
    assert sched.place("j", ma_spec(mode="pytorch", nodes=4), sched.usage([]), exclude=("node-0",)) is None
    assert sched.exclusions("j", spec, ["node-0"]) == ("node-0",)
    # a job needing every node can never run without the one it avoids: the exclusion is lifted
    assert sched.exclusions("j", ma_spec(mode="pytorch", nodes=4), ["node-0"]) == ()
    head = sched.reserve("j", spec, [], 0.0, exclude=("node-1",))
    assert "node-1" not in {t.host for t in head.placement.tasks}


def test_checkpoint_resume_runs_in_a_dedicated_pool():
    resumable = {"checkpoint_resume": {}}
    Scheduler(Cluster()).check(ma_spec(**resumable))  # the default cluster is one dedicated pool
    Scheduler(Cluster()).check(ma_spec(pool="default", **resumable))
    shared = Scheduler(Cluster(pools={"default": False}))  # an admin made the machines shared
    with pytest.raises(InvalidSpec, match="this cluster has none") as err:
        shared.check(ma_spec(**resumable))
    assert "so drop checkpoint resume" in err.value.message
    nodes = [n.model_copy(update={"pools": ["mine"]}) for n in default_nodes()]
    sched = Scheduler(Cluster(nodes=nodes, pools={"mine": True, "shared": False}))
    for pool in (None, "shared"):
        with pytest.raises(InvalidSpec, match="dedicated resource pool") as err:
            sched.check(ma_spec(pool=pool, **resumable))
        assert err.value.field == "pool" and "--pool (mine)" in err.value.message
    sched.check(ma_spec(pool="mine", **resumable))
    sched.check(ma_spec())  # without checkpoint resume no pool is needed


def test_the_default_catalog_has_a_whole_node_and_a_whole_machine_spec_that_holds_every_nodes_memory(
    tmp_path, monkeypatch
):
    from ma_jupyter.config import load_cluster

    monkeypatch.setenv("MA_JUPYTER_HOME", str(tmp_path))  # no cluster.toml: the default cluster
    cluster = load_cluster()
    sched = Scheduler(cluster)
    specs = {s.name: s for s in cluster.specs}
    share = cluster.nodes[0].memory_gb
    assert specs["cpu.node"].memory_gb == share
    assert specs["cpu.all"].memory_gb == cluster.machine_memory_gb > share * 3
    small = sched.place("s", ma_spec(specs=["cpu.small"]), sched.usage([]))
    # the whole machine waits for the memory another node holds...
    assert sched.place("a", ma_spec(specs=["cpu.all"]), sched.usage([small])) is None
    whole = sched.place("a", ma_spec(specs=["cpu.all"]), sched.usage([]))
    assert whole is not None and whole.tasks[0].memory_gb == cluster.machine_memory_gb
    # ...and while it runs, no other node takes memory of it
    assert sched.place("s", ma_spec(specs=["cpu.small"]), sched.usage([whole])) is None
    # a cluster.toml's own nodes share nothing: the whole machine spec of the default catalog
    # fits none of them
    (tmp_path / "cluster.toml").write_text('[[node]]\nname = "n1"\ncpus = 4\nmemory_gb = 4\n')
    assert load_cluster().machine_memory_gb == 0
    with pytest.raises(InvalidSpec):
        Scheduler(load_cluster()).check(ma_spec(specs=["cpu.all"]))


def _gpu_nodes(count: int, **fields):
    """Emulated GPU nodes of 4 cores, 8 GB and 4 cards (the machine's own cards play no part)."""
    return [
        Node(
            name=f"node-{i}",
            cpus=4,
            memory_gb=8,
            accelerators=4,
            accelerator_type="gpu",
            emulated=True,
            driver_version="535.0",
            pools=["default"],
            **fields,
        )
        for i in range(count)
    ]


def test_modelarts_tensorflow_puts_a_ps_beside_each_worker_splitting_the_node():
    specs = emulated_specs()
    sched = Scheduler(Cluster(specs=specs, nodes=_gpu_nodes(3)))
    flavor = next(s for s in specs if s.name == "gpu.emu-2")
    spec = ma_spec(mode="tensorflow", nodes=2, convention="modelarts", specs=["gpu.emu-2"])
    placed = sched.place("j", spec, sched.usage([]))
    assert [(t.role, t.index) for t in placed.tasks] == [("ps", 0), ("ps", 1), ("worker", 0), ("worker", 1)]
    for ps, worker in zip(placed.role("ps"), placed.role("worker"), strict=True):
        assert ps.host == worker.host  # 1:1, on the same node
        # seed 001: the ps half the cores and memory, no card; the worker the rest and the cards
        assert (ps.cpu_request, ps.memory_gb, ps.devices) == (flavor.cpus / 2, flavor.memory_gb / 2, ())
        assert (worker.cpu_request, worker.memory_gb) == (flavor.cpus / 2, flavor.memory_gb / 2)
        assert len(worker.devices) == flavor.accelerators
    assert len({t.host for t in placed.role("worker")}) == 2
    # the node holds exactly the spec, as one worker without a ps would
    held = sched.usage([placed])
    for worker in placed.role("worker"):
        assert (held[worker.host].cpus, held[worker.host].memory_gb) == (flavor.cpus, flavor.memory_gb)
    # ports from the seed's range, 5000-10000, and the range survives the store
    assert placed.port_range == (5000, 10001)
    bound = LocalBackend(inventory=[n.name for n in sched.cluster.nodes]).bind(placed, reserve=True)
    assert all(5000 <= p <= 10000 for t in bound.tasks for p in t.ports), bound.tasks
    assert Placement.from_json(bound.to_json()) == bound
    # one node: one worker alone with the whole spec, no ps
    single = sched.place("s", spec.model_copy(update={"nodes": 1}), sched.usage([]))
    assert [(t.role, t.cpu_request) for t in single.tasks] == [("worker", flavor.cpus)]


def test_parameter_servers_obey_the_jobs_node_driver_and_pool():
    nodes = _gpu_nodes(3)
    nodes[0] = nodes[0].model_copy(update={"pools": ["other"], "driver_version": "470.0"})
    specs = emulated_specs() + default_specs()
    sched = Scheduler(Cluster(specs=specs, nodes=nodes, pools={"default": True, "other": True}))
    for choice, allowed in (
        ({"node_name": "node-2"}, {"node-2"}),
        ({"pool": "default"}, {"node-1", "node-2"}),
        ({"driver_version": "535.0", "specs": ["gpu.emu-2"]}, {"node-1", "node-2"}),
    ):
        fields = {"specs": ["cpu.small"], **choice}
        placed = sched.place("j", ma_spec(mode="tensorflow", nodes=1, ps=2, **fields), sched.usage([]))
        assert placed is not None, choice
        assert {t.host for t in placed.role("ps")} <= allowed, (choice, placed.tasks)
