"""Card detection, the default cluster built from the cards, and the scheduler's card rules,
driven by a fake NVML and a fake nvidia-smi (tests/fakes): no card is needed."""

from __future__ import annotations

import os
import sys

import pytest

from ma_jupyter import accelerators, config
from ma_jupyter.config import Cluster, card_counts, load_cluster
from ma_jupyter.errors import InvalidSpec
from ma_jupyter.models import JobSpec, Node, Spec
from ma_jupyter.service.scheduler import Scheduler
from tests import fakes


@pytest.fixture
def fake_cards(tmp_path, monkeypatch):
    """Fake cards seen through ``nvidia-smi`` only (no NVML module importable); returns a
    function setting how many there are (and their state)."""
    monkeypatch.setenv("PATH", f"{fakes.BIN_DIR}:{os.environ['PATH']}")
    monkeypatch.delenv(accelerators.ENV_CARDS, raising=False)
    state = tmp_path / "gpus.json"
    monkeypatch.setenv(fakes.STATE_ENV, str(state))
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    accelerators.forget()

    def cards(count: int, **extra) -> None:
        fakes.write_state(state, count, **extra)
        accelerators.forget()

    yield cards
    accelerators.forget()


@pytest.fixture
def fake_nvml(fake_cards, monkeypatch):
    """The same fake cards, with the fake NVML module importable."""
    monkeypatch.delitem(sys.modules, "pynvml")
    monkeypatch.syspath_prepend(str(fakes.NVML_DIR))
    return fake_cards


def test_parse_nvidia_smi_skips_what_does_not_parse():
    out = "0, NVIDIA H100 80GB HBM3, 81559, 580.159.04\nNo devices were found\n1, A100, x, 1\n"
    assert accelerators.parse_nvidia_smi(out) == [
        accelerators.Card("gpu", 0, "NVIDIA H100 80GB HBM3", 81559, "580.159.04")
    ]


def test_parse_npu_smi_lists_each_card_with_the_driver_version():
    listing = (
        "        Total Count : 2\n\n        NPU ID : 0\n        Product Name : IT21PDDA01\n"
        "        NPU ID : 1\n        Product Name : IT21PDDA01\n"
    )
    cards = accelerators.parse_npu_smi(listing, "| npu-smi 23.0.rc2   Version: 23.0.rc2 |")
    assert [(c.type, c.index, c.model, c.driver_version) for c in cards] == [
        ("npu", 0, "IT21PDDA01", "23.0.rc2"),
        ("npu", 1, "IT21PDDA01", "23.0.rc2"),
    ]


def test_detection_through_nvidia_smi(fake_cards):
    fake_cards(2)
    cards = accelerators.detect("gpu")
    assert [(c.index, c.model, c.memory_mb, c.driver_version) for c in cards] == [
        (0, fakes.MODEL, 81559, fakes.DRIVER),
        (1, fakes.MODEL, 81559, fakes.DRIVER),
    ]


def test_detection_through_nvml_first(fake_nvml, monkeypatch):
    fake_nvml(3)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no nvidia-smi: NVML alone answers
    accelerators.forget()
    assert [c.index for c in accelerators.detect("gpu")] == [0, 1, 2]
    assert accelerators.sample("gpu", [0, 1]) == accelerators.CardUse(0.0, 0.0)


def test_a_card_whose_minor_number_differs_is_bound_by_its_node(fake_nvml, tmp_path, monkeypatch):
    fake_nvml(2, minors={"0": 1, "1": 0})
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidiactl"):
        (dev / name).write_text("")
    monkeypatch.setattr(accelerators, "DEV", str(dev))
    assert [c.minor for c in accelerators.detect("gpu")] == [1, 0]
    # nvidia-smi's card 0 is /dev/nvidia1
    assert accelerators.device_paths("gpu", [0]) == [str(dev / "nvidia1"), str(dev / "nvidiactl")]
    (dev / "nvidia1").unlink()
    assert accelerators.missing_cards("gpu", [0, 1]) == [0]
    assert "nvidia1 is gone" in accelerators.card_fault("gpu", 0)


def test_a_card_the_machine_never_had_is_not_said_to_have_disappeared(fake_cards, tmp_path, monkeypatch):
    # the machine shows one card; a [[node]] of cluster.toml declares two (cards 0 and 1)
    fake_cards(1)
    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "nvidia0").write_text("")
    monkeypatch.setattr(accelerators, "DEV", str(dev))
    assert accelerators.card_fault("gpu", 0) is None
    never = accelerators.card_fault("gpu", 1)
    assert "disappeared" not in never
    assert "card 1 is not on this machine" in never and "emulated = true" in never
    # a card the machine showed, then lost, did disappear
    (dev / "nvidia0").unlink()
    assert "card 0 disappeared" in accelerators.card_fault("gpu", 0)
    # also one seen only by a check (detection found none: no driver tool)
    fake_cards(0)
    (dev / "nvidia1").write_text("")
    assert accelerators.card_fault("gpu", 1) is None
    (dev / "nvidia1").unlink()
    assert "card 1 disappeared" in accelerators.card_fault("gpu", 1)


def test_no_cards_without_the_tools_or_when_turned_off(fake_cards, monkeypatch):
    fake_cards(2)
    monkeypatch.setenv(accelerators.ENV_CARDS, "none")
    assert accelerators.detect("gpu") == []
    monkeypatch.delenv(accelerators.ENV_CARDS)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    accelerators.forget()
    assert accelerators.detect("gpu") == []
    assert accelerators.detect("npu") == []
    assert accelerators.detect("tpu") == []


def test_a_failing_tool_means_no_cards(fake_cards, monkeypatch):
    monkeypatch.delenv(fakes.STATE_ENV)  # the fake then fails like nvidia-smi without a driver
    assert accelerators.detect("gpu") == []


def test_card_counts():
    assert card_counts(1) == [1]
    assert card_counts(8) == [1, 2, 4, 8]
    assert card_counts(6) == [1, 2, 4, 6]
    assert card_counts(0) == []


def test_default_cluster_from_eight_cards(fake_cards):
    fake_cards(8)
    cluster = Cluster()
    names = [s.name for s in cluster.specs]
    assert names == [
        "cpu.small",
        "cpu.medium",
        "cpu.ps",
        "cpu.node",
        "cpu.all",
        "gpu.1",
        "gpu.2",
        "gpu.4",
        "gpu.8",
    ]
    gpu8 = cluster.spec("gpu.8")
    assert gpu8.driver_versions == [fakes.DRIVER] and gpu8.accelerators == 8
    # no /dev/nvidia* here: the cards are shown as emulated
    assert gpu8.emulated and "emulated" in gpu8.description
    assert len(cluster.nodes) == config.DEFAULT_NODES
    for node in cluster.nodes:
        assert node.accelerator_model == fakes.MODEL
        assert node.devices == list(range(8))
        assert node.driver_version == fakes.DRIVER
        assert node.accelerator_memory_gb == pytest.approx(79.6, abs=0.1)
        assert node.emulated is True


def test_default_cluster_one_card_offers_gpu_1(fake_cards):
    fake_cards(1)
    assert [s.name for s in config.default_specs() if s.accelerators] == ["gpu.1"]


def test_default_cluster_without_cards_keeps_the_emulated_ones(fake_cards, monkeypatch):
    monkeypatch.setenv(accelerators.ENV_CARDS, "none")
    cluster = Cluster()
    assert {"gpu.emu-2", "npu.emu-2"} <= {s.name for s in cluster.specs}
    assert all(n.emulated is True and n.accelerators == 4 for n in cluster.nodes)


def test_cluster_file_emulated_flag(tmp_path, monkeypatch):
    monkeypatch.delenv(accelerators.ENV_CARDS, raising=False)
    monkeypatch.setattr(accelerators, "DEV", str(tmp_path / "dev"))
    (tmp_path / "dev").mkdir()
    path = tmp_path / "cluster.toml"
    path.write_text(
        '[[node]]\nname = "a"\ncpus = 4\nmemory_gb = 8\naccelerators = 1\naccelerator_type = "gpu"\n'
        '[[node]]\nname = "b"\ncpus = 4\nmemory_gb = 8\naccelerators = 1\naccelerator_type = "gpu"\n'
        "emulated = false\n"
        '[[node]]\nname = "c"\ncpus = 4\nmemory_gb = 8\n'
    )
    nodes = {n.name: n for n in load_cluster(path).nodes}
    assert nodes["a"].emulated is True  # no /dev/nvidia* on this machine
    assert nodes["b"].emulated is False  # as the file says
    assert nodes["c"].emulated is None  # no cards: nothing to decide
    (tmp_path / "dev" / "nvidia0").write_text("")
    assert {n.name: n.emulated for n in load_cluster(path).nodes}["a"] is False
    # MA_JUPYTER_CARDS=none: the machine is taken to have no cards
    monkeypatch.setenv(accelerators.ENV_CARDS, "none")
    assert {n.name: n.emulated for n in load_cluster(path).nodes}["a"] is True


def test_cluster_file_devices_must_match_the_card_count(tmp_path):
    path = tmp_path / "cluster.toml"
    path.write_text(
        '[[node]]\nname = "a"\ncpus = 4\nmemory_gb = 8\naccelerators = 2\naccelerator_type = "gpu"\n'
        "devices = [3]\n"
    )
    with pytest.raises(InvalidSpec, match="devices must list 2 distinct card indices"):
        load_cluster(path)


# ------------------------------------------------------------------------ scheduler


def _machine(cards: int, nodes: int = 4) -> Cluster:
    """Simulated nodes sharing ``cards`` real cards, with gpu.1..gpu.<cards> specs."""
    specs = [Spec(name="cpu.small", cpus=1, memory_gb=1)] + [
        Spec(name=f"gpu.{k}", cpus=1, memory_gb=1, accelerators=k, accelerator_type="gpu")
        for k in card_counts(cards)
    ]
    inventory = [
        Node(
            name=f"node-{i}",
            cpus=16,
            memory_gb=32,
            accelerators=cards,
            accelerator_type="gpu",
            accelerator_model=fakes.MODEL,
            devices=list(range(cards)),
            emulated=False,
        )
        for i in range(nodes)
    ]
    return Cluster(specs=specs, nodes=inventory)


def _job(spec: str, nodes: int = 1) -> JobSpec:
    mode = "pytorch" if nodes > 1 else "single"
    return JobSpec(name="j", command="true", specs=[spec], nodes=nodes, mode=mode)


def test_simulated_nodes_split_the_real_cards():
    scheduler = Scheduler(_machine(8))
    placed = scheduler.place("a", _job("gpu.4", nodes=2), scheduler.usage([]))
    assert placed is not None
    hosts = [t.host for t in placed.tasks]
    assert len(set(hosts)) == 2
    assert sorted(c for t in placed.tasks for c in t.devices) == list(range(8))
    assert all(t.card_type == "gpu" for t in placed.tasks)
    # every card is held: nothing more of gpu.1 fits, on any node
    use = scheduler.usage([placed])
    assert scheduler.place("b", _job("gpu.1"), use) is None
    # all eight on one node works too, once the cards are free
    assert scheduler.place("c", _job("gpu.8"), scheduler.usage([])) is not None


def test_two_one_card_jobs_get_different_cards():
    scheduler = Scheduler(_machine(2, nodes=1))
    first = scheduler.place("a", _job("gpu.1"), scheduler.usage([]))
    second = scheduler.place("b", _job("gpu.1"), scheduler.usage([first]))
    assert first.tasks[0].devices != second.tasks[0].devices
    assert scheduler.place("c", _job("gpu.1"), scheduler.usage([first, second])) is None


def test_a_cpu_job_gets_no_card():
    scheduler = Scheduler(_machine(2))
    placed = scheduler.place("a", _job("cpu.small"), scheduler.usage([]))
    assert placed.tasks[0].devices == () and placed.tasks[0].card_type == ""


def test_emulated_cards_stay_per_node():
    cluster = _machine(2)
    cluster.nodes = [n.model_copy(update={"emulated": True}) for n in cluster.nodes]
    scheduler = Scheduler(cluster)
    placed = scheduler.place("a", _job("gpu.2", nodes=3), scheduler.usage([]))
    assert placed is not None and all(t.devices == (0, 1) and t.card_type == "" for t in placed.tasks)


def test_refused_at_submit_naming_what_the_cluster_offers():
    scheduler = Scheduler(_machine(1))
    with pytest.raises(InvalidSpec) as info:
        scheduler.check(_job("gpu.1", nodes=2))
    assert "needs 2 real gpu cards and the machine has 1" in str(info.value)
    assert "gpu.1" in str(info.value) and fakes.MODEL in str(info.value)
    scheduler.check(_job("gpu.1"))  # one node of one card is fine

    cluster = _machine(1)
    cluster.specs.append(Spec(name="gpu.8", cpus=1, memory_gb=1, accelerators=8, accelerator_type="gpu"))
    with pytest.raises(InvalidSpec, match="the most any node has is 1"):
        Scheduler(cluster).check(_job("gpu.8"))

    cpu_only = Cluster(
        specs=[Spec(name="gpu.1", cpus=1, memory_gb=1, accelerators=1, accelerator_type="gpu")],
        nodes=[Node(name="n", cpus=4, memory_gb=8)],
    )
    with pytest.raises(InvalidSpec) as info:
        Scheduler(cpu_only).check(_job("gpu.1"))
    assert "no node has gpu cards" in str(info.value) and "CPU specs only" in str(info.value)


# ----------------------------------------------------------------------------- Ray


def test_ray_inventory_names_the_model_ray_reports():
    from ma_jupyter.backends.ray.inventory import inventory

    record = {
        "NodeID": "ab" * 28,
        "Alive": True,
        "Resources": {"CPU": 16.0, "memory": 64 * 2**30, "GPU": 2.0, "accelerator_type:H100": 1.0},
    }
    (node,) = inventory([record])
    assert (node.accelerators, node.accelerator_type, node.accelerator_model) == (2, "gpu", "H100")
    record["Resources"] = {"CPU": 4.0, "memory": 2**30}
    assert inventory([record])[0].accelerator_model == ""


def test_a_launch_planned_elsewhere_binds_this_machines_cards(tmp_path, monkeypatch):
    from ma_jupyter.models import NodeLaunch
    from ma_jupyter.nodehost.launch import with_machine_cards

    monkeypatch.delenv(accelerators.ENV_CARDS, raising=False)
    dev = tmp_path / "dev"
    dev.mkdir()
    monkeypatch.setattr(accelerators, "DEV", str(dev))
    env = {"CUDA_VISIBLE_DEVICES": "2,3", "ASCEND_RT_VISIBLE_DEVICES": "2,3", "MA_CARD_INDICES": "2,3"}
    launch = NodeLaunch(
        name="worker-0",
        role="worker",
        index=0,
        hostname="worker-0",
        argv=["x"],
        env=env,
        isolation="bubblewrap",
    )
    launch = launch.model_copy(update={"devices": [2, 3]})
    # a Ray node whose machine shows no card node: its cards are emulated, nothing to bind
    assert with_machine_cards(launch, "gpu", planned_elsewhere=True) == launch
    # a node the cluster says is real refuses to start without its cards' nodes
    with pytest.raises(InvalidSpec, match="card.s. 2, 3 have no device node"):
        with_machine_cards(launch, "gpu")
    for name in ("nvidia2", "nvidia3", "nvidiactl", "nvidia-uvm"):
        (dev / name).write_text("")
    bound = with_machine_cards(launch, "gpu", planned_elsewhere=True)
    assert bound.device_nodes == [str(dev / n) for n in ("nvidia2", "nvidia3", "nvidiactl", "nvidia-uvm")]
    assert bound.env["CUDA_VISIBLE_DEVICES"] == "0,1" and bound.env["MA_CARD_INDICES"] == "2,3"
    assert with_machine_cards(bound, "gpu") == bound  # planned here: nothing changes
    # one card gone since the plan: refused, whoever planned it
    (dev / "nvidia3").unlink()
    with pytest.raises(InvalidSpec, match="card.s. 3 have no device node"):
        with_machine_cards(launch, "gpu", planned_elsewhere=True)
    (dev / "nvidia3").write_text("")
    # a value the job set itself is kept; no sandbox, or no real cards: nothing changes
    own = launch.model_copy(update={"env": {**env, "CUDA_VISIBLE_DEVICES": "1"}})
    assert with_machine_cards(own, "gpu").env["CUDA_VISIBLE_DEVICES"] == "1"
    bare = launch.model_copy(update={"isolation": "symlink"})
    assert with_machine_cards(bare, "gpu") == bare
    assert with_machine_cards(launch, "") == launch


def test_ma_specs_counts_a_real_card_held_by_another_node_as_taken():
    from ma_jupyter.frontends.notebook.magics.cluster import _fits_now, _real_cards_held

    cluster = _machine(2, nodes=2)
    scheduler = Scheduler(cluster)
    placed = scheduler.place("a", _job("gpu.2"), scheduler.usage([]))
    views = scheduler.node_views(scheduler.usage([placed]))
    held = _real_cards_held(views)
    gpu1 = cluster.spec("gpu.1")
    assert held == {("gpu", 0), ("gpu", 1)}
    assert not any(_fits_now(gpu1, n, held) for n in views)
    # the scheduler's own view says the same
    assert [n.status for n in scheduler.node_views(scheduler.usage([placed]), spec="gpu.1")] == [
        "busy",
        "busy",
    ]


# -------------------------------------------------------------------------- usage


def test_top_rows_and_picture_show_the_cards_where_sampled():
    from ma_jupyter.frontends import usage
    from ma_jupyter.models import NodeLimits, ResourceSample, ResourceUsage

    samples = [
        ResourceSample(
            t=1.0 + i, node="worker-0", cpu_percent=90, memory_mb=2000, card_percent=p, card_memory_mb=m
        )
        for i, (p, m) in enumerate([(30.0, 2500.0), (80.0, 2756.0)])
    ] + [ResourceSample(t=1.5, node="worker-1", cpu_percent=10, memory_mb=100)]
    used = ResourceUsage(
        job_id="j",
        interval=2,
        nodes=[NodeLimits(node="worker-0", cards=1), NodeLimits(node="worker-1")],
        samples=samples,
    )
    header = usage.HEADERS
    rows = {r[0]: dict(zip(header, r, strict=True)) for r in usage.rows(used)}
    assert len(header) == len(usage.rows(used)[0])
    zero = rows["worker-0"]
    assert zero["CARD% NOW"] == "80" and zero["CARD MB NOW"] == "2756"
    assert usage.rows(used)[0][-3] == "80" and usage.rows(used)[0][-1] == "2756"  # the peaks
    assert rows["worker-1"]["CARD% NOW"] == "-"  # no card there
    png = usage.png(used)
    assert png.startswith(b"\x89PNG")
    no_cards = used.model_copy(update={"samples": [samples[-1]]})
    assert len(usage.png(no_cards)) < len(png)  # two charts instead of four
