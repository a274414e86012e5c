"""The cluster view (``GET /api/v1/cluster``, ``ma-jupyter cluster``): nodes with the cards real
jobs hold in the ``card(virtual):job`` notation, how many more of each spec the scheduler would
start, the queue by priority, card demand per board model, the spec and model filters, and
another user's jobs masked."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.fixtures.service_api import submit, wait_status
from tests.fixtures.service_process import REPO

PY = sys.executable
SLEEP = f'{PY} -c "import time; time.sleep(600)"'

CLUSTER = """
[[spec]]
name = "cpu.small"
cpus = 1
memory_gb = 1

[[spec]]
name = "gpu.a"
cpus = 1
memory_gb = 1
accelerators = 1
accelerator_type = "gpu"
accelerator_model = "A100"
emulated = true

[[spec]]
name = "mlu.x"
cpus = 1
memory_gb = 1
accelerators = 2
accelerator_type = "mlu"
emulated = true

[[node]]
name = "g1"
cpus = 4
memory_gb = 8
accelerators = 2
accelerator_type = "gpu"
accelerator_model = "A100"

[[node]]
name = "m1"
cpus = 4
memory_gb = 8
accelerators = 4
accelerator_type = "mlu"
accelerator_model = "MLU370"
"""


@pytest.fixture
def cards_home(ma_home):
    """A home whose cluster has one A100 node and one MLU370 node (set before the service starts)."""
    path = ma_home / "cluster.toml"
    path.write_text(path.read_text() + CLUSTER)
    return ma_home


def cluster(svc, session=None, **params):
    reply = (session or svc.session()).get(f"{svc.api}/cluster", params=params, timeout=30)
    assert reply.status_code == 200, reply.text
    return reply.json()


def rooms(view) -> dict[str, int]:
    return {room["spec"]["name"]: room["can_start"] for room in view["specs"]}


def by_node(view) -> dict[str, dict]:
    return {entry["node"]["name"]: entry for entry in view["nodes"]}


def test_running_jobs_fill_cards_and_the_queue_shows_demand_per_model(cards_home, ma_service):
    svc = ma_service
    empty = cluster(svc)
    assert empty["models"] == ["A100", "MLU370"]
    # the scheduler's own placement: 2 single-card jobs on g1's 2 cards, 2 two-card ones on m1,
    # 8 one-core CPU jobs on the two 4-core nodes
    assert rooms(empty) == {"cpu.small": 8, "gpu.a": 2, "mlu.x": 2}
    assert by_node(empty)["g1"]["cards"] == [] and by_node(empty)["g1"]["fits"]

    first = submit(svc, name="train-a", command=SLEEP, specs=["gpu.a"], grace_period=1)
    wait_status(svc, first["id"], {"running"})
    view = cluster(svc)
    g1 = by_node(view)["g1"]
    assert g1["cards"] == ["0(0):train-a"]
    assert g1["jobs"] == [first["id"]]
    assert rooms(view) == {"cpu.small": 7, "gpu.a": 1, "mlu.x": 2}

    second = submit(svc, name="train-b", command=SLEEP, specs=["gpu.a"], grace_period=1)
    wait_status(svc, second["id"], {"running"})
    waiting = submit(svc, name="waits", command=SLEEP, specs=["gpu.a"], grace_period=1)
    urgent = submit(svc, name="hurry", command=SLEEP, specs=["gpu.a"], priority="urgent", grace_period=1)
    view = cluster(svc, spec=["gpu.a"])
    assert sorted(by_node(view)["g1"]["cards"]) == ["0(0):train-a", "1(0):train-b"]
    assert not by_node(view)["g1"]["fits"]  # the seed's "tight": no gpu.a fits there now
    assert rooms(view) == {"gpu.a": 0}
    assert list(by_node(view)) == ["g1"]  # only the nodes gpu.a fits on
    assert [(q["name"], q["priority"]) for q in view["queue"]] == [("hurry", "urgent"), ("waits", "normal")]
    assert [q["job_id"] for q in view["queue"]] == [urgent["id"], waiting["id"]]
    assert view["demand"] == {"A100": 2}

    # the board model filter: nodes and specs of that model only
    mlu = cluster(svc, model=["MLU370"])
    assert list(by_node(mlu)) == ["m1"] and list(rooms(mlu)) == ["mlu.x"]

    # another user sees that cards are taken, not by which jobs (access none)
    private = submit(svc, name="secret-run", command=SLEEP, specs=["mlu.x"], access="none", grace_period=1)
    wait_status(svc, private["id"], {"running"})
    other = cluster(svc, svc.user_session("bob"), model=["MLU370"])
    assert by_node(other)["m1"]["cards"] == ["0(0):(another user's job)", "1(0):(another user's job)"]
    assert by_node(other)["m1"]["jobs"] == []
    assert by_node(cluster(svc, model=["MLU370"]))["m1"]["cards"] == ["0(0):secret-run", "1(0):secret-run"]

    # the command line shows the same view as text
    env = {**os.environ, "MA_JUPYTER_HOME": str(cards_home), "PYTHONPATH": REPO}
    out = subprocess.run(
        [PY, "-m", "ma_jupyter.frontends.cli", "cluster", "--spec", "gpu.a"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "0(0):train-a" in out.stdout and "tight" in out.stdout
    assert "queued card demand: A100: 2" in out.stdout
    assert "hurry" in out.stdout.split("waits")[0]  # the urgent job is listed first


def test_unknown_filters_are_refused_with_what_to_choose(cards_home, ma_service):
    s = ma_service.session()
    bad_model = s.get(f"{ma_service.api}/cluster", params={"model": "H100"}, timeout=30)
    assert 400 <= bad_model.status_code < 500
    assert "A100" in bad_model.text and "MLU370" in bad_model.text
    bad_spec = s.get(f"{ma_service.api}/cluster", params={"spec": "gpu.zzz"}, timeout=30)
    assert 400 <= bad_spec.status_code < 500
    assert "gpu.a" in bad_spec.text
