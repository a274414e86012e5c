"""Cards on a Ray cluster are the ones Ray assigns: a job node never takes a card that other Ray
work on the same node holds, whatever index the scheduler counted."""

from __future__ import annotations

import pytest

from ma_jupyter.client import Client
from ma_jupyter.models import JobStatus
from tests.fixtures.real_jobs import events_text, node_logs

pytestmark = pytest.mark.ray

NPU_1 = """
[[spec]]
name = "npu.1"
cpus = 0.5
memory_gb = 0.2
accelerators = 1
accelerator_type = "npu"
"""


def test_a_job_node_gets_the_card_ray_assigned_not_one_other_work_holds(request, ray_home, ray_driver):
    toml = ray_home / "cluster.toml"
    toml.write_text(NPU_1 + toml.read_text())
    request.getfixturevalue("ray_service")
    ray = ray_driver
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node_id = next(n["NodeID"] for n in ray.nodes() if n["Alive"])

    @ray.remote(num_cpus=0, resources={"NPU": 1})
    class Holder:
        def cards(self) -> list[int]:
            return [int(i) for i in ray.get_runtime_context().get_accelerator_ids()["NPU"]]

    holder = Holder.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote()
    try:
        (held,) = ray.get(holder.cards.remote(), timeout=60)
        client = Client(autostart=False)
        handle = client.submit(
            name="npu",
            specs=["npu.1"],
            node_name=f"ray-{node_id[:8]}",
            # it outlives a few node inspections (every second): the emulated card (a Ray
            # resource without a device node) must not be taken for one that disappeared
            command="python -c \"import os, time; print('CARDS', os.environ['ASCEND_VISIBLE_DEVICES'], "
            'flush=True); time.sleep(4)"',
        )
        job = handle.wait(timeout=180, check=False)
        assert job.status is JobStatus.succeeded, node_logs(client, job.id) + events_text(client, job.id)
        log = client.read_log(job.id, node="worker-0").data
        # Ray gave the other user of the node one card; the job has the other one
        assert f"CARDS {1 - held}" in log, log
    finally:
        ray.kill(holder)
