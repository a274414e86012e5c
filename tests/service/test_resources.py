"""Resource sampling on real jobs: the service samples each running node's CPU and memory, keeps
the samples with the job (bounded), answers them at ``GET /jobs/{id}/resources`` with the job's
view access, shows them in ``ma-jupyter top`` and ``%ma_top``, and deletes them with the job."""

from __future__ import annotations

import shlex
import sys

import pytest

from ma_jupyter.errors import InvalidSpec, NotFound
from ma_jupyter.models import ResourceSample
from ma_jupyter.service.store import Store
from tests.helpers import wait_for
from tests.magic_shell import Run

PY = sys.executable
# burns one core and grows its memory by 20 MiB (pages written) every 0.2 s up to 200 MiB
BURN = """
import time
blocks, end = [], time.time() + 120
while time.time() < end:
    t = time.time() + 0.2
    while time.time() < t:
        pass
    if len(blocks) < 10:
        blocks.append(b'x' * (20 << 20))
"""


@pytest.fixture
def fast_sampling(ma_home):
    cluster = ma_home / "cluster.toml"
    cluster.write_text(cluster.read_text() + "[resources]\nsample_interval = 0.3\n")
    return ma_home


def _burning_job(client):
    return client.submit(name="burn", command=shlex.join([PY, "-c", BURN]), duration=300)


def _samples_when(handle, predicate, timeout=120.0):
    return wait_for(lambda: (u := handle.resources()) and predicate(u) and u, timeout=timeout, interval=0.3)


def test_a_running_job_is_sampled_and_its_samples_go_with_it(fast_sampling, ma_client, ma_cli):
    handle = _burning_job(ma_client)
    used = _samples_when(handle, lambda u: max((s.memory_mb for s in u.samples), default=0) > 150)
    assert used.interval == pytest.approx(0.3)
    assert [n.node for n in used.nodes] == ["worker-0"]
    assert used.nodes[0].cpus and used.nodes[0].memory_mb  # the limits of the spec it runs with
    mine = [s for s in used.samples if s.node == "worker-0"]
    assert len(mine) >= 3
    assert max(s.cpu_percent for s in mine) > 30, mine  # it keeps a core busy
    assert mine[-1].memory_mb > mine[0].memory_mb + 50, mine  # and its memory grew
    assert all(a.t < b.t for a, b in zip(mine, mine[1:], strict=False))
    # since: only newer samples
    later = handle.resources(since=mine[-1].t)
    assert all(s.t > mine[-1].t for s in later.samples)

    top = ma_cli("top", handle.id)
    assert top.returncode == 0, top.stderr
    header, row = top.stdout.splitlines()[:2]
    assert header.split()[:3] == ["NODE", "SAMPLES", "CPU%"]
    assert row.split()[0] == "worker-0" and int(row.split()[1]) >= 3

    # bad input is a 400 naming the parameter; an unknown job a 404
    for bad in ("-1", "nan", "inf", "soon"):
        with pytest.raises(InvalidSpec) as exc:
            ma_client._request("GET", f"/jobs/{handle.id}/resources", params={"since": bad})
        assert exc.value.field == "since", (bad, exc.value)
    with pytest.raises(NotFound):
        ma_client.resources("no-such-job")

    handle.stop()
    handle.wait(timeout=120)
    assert ma_cli("top", handle.id, "--follow").returncode == 0  # an ended job: one table, then done
    handle.delete()
    with pytest.raises(NotFound):
        ma_client.resources(handle.id)


def test_ma_top_shows_a_table_and_a_png(fast_sampling, ma_shell):
    from ma_jupyter.frontends.notebook import session

    handle = _burning_job(session.get_client())
    _samples_when(handle, lambda u: len(u.samples) >= 3)
    run = Run(ma_shell, f"%ma_top {handle.id}")
    assert run.error is None, run.stderr
    assert "worker-0" in run.text() and "cpu% now" in run.text()
    run = Run(ma_shell, f"%ma_top {handle.id} --inline")
    assert run.error is None, run.stderr
    pngs = [o.data["image/png"] for o in run.outputs if "image/png" in o.data]
    assert pngs and len(pngs[0]) > 1000
    handle.stop()


def test_old_samples_are_thinned_and_new_ones_kept(tmp_path):
    store = Store(tmp_path / "jobs.db")
    store.add_samples(
        "j", [ResourceSample(t=float(i), node="n", cpu_percent=1, memory_mb=1) for i in range(1000)]
    )
    store.thin_samples("j", "n", keep=2000)
    assert len(store.samples("j")) == 1000  # under the bound: nothing dropped
    store.thin_samples("j", "n", keep=600)
    kept = [s.t for s in store.samples("j")]
    assert len(kept) == 750
    assert kept[-500:] == [float(i) for i in range(500, 1000)]  # the newest half whole
    assert kept[:250] == [float(i) for i in range(0, 500, 2)]  # the older half every other one
    store.delete("j")
    assert store.samples("j") == []
