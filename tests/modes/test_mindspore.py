"""MindSpore-Ascend mode planner and the rank-table helpers, against seed 000's examples."""

from __future__ import annotations

import json

from ma_jupyter.models import JobSpec
from ma_jupyter.modes import plan_job
from ma_jupyter.nodeside import rank_table

from .placements import SPECS, placement_for

# Seed 000's own examples, verbatim.
SEED_TEMPLATE2 = """{ "group_count": "1", "group_list": [{ "device_count": "1", "group_name": "job-trainjob",
"instance_count": "1", "instance_list": [{ "devices": [{ "device_id": "4", "device_ip": "192.1.10.254" }],
"pod_name": "jobxxxxxxxx-job-trainjob-0", "server_id": "192.168.0.25" }] }], "status": "completed" }"""
SEED_TEMPLATE1 = """{ "server_count": "1", "server_list": [{ "device": [{ "device_id": "4", "device_ip": "192.1.10.254",
"rank_id": "0" }], "server_id": "192.168.0.25" }], "status": "completed", "version": "1.0" }"""


def test_seed_template2_converts_to_the_seeds_template1():
    assert rank_table.to_template1(json.loads(SEED_TEMPLATE2)) == json.loads(SEED_TEMPLATE1)


def _job(nodes: int = 2) -> JobSpec:
    return JobSpec(
        name="ms", mode="mindspore-ascend", nodes=nodes, specs=["npu.emu-2"], command="python boot.py"
    )


def test_rank_table_template2_for_2_nodes_2_cards():
    spec = _job()
    plans = plan_job(spec, placement_for(spec, SPECS["npu.emu-2"]))
    tables = [json.loads(p.files["/user/config/jobstart_hccl.json"]) for p in plans]
    assert tables[0] == tables[1]
    assert tables[0] == {
        "group_count": "1",
        "group_list": [
            {
                "device_count": "4",
                "group_name": "ms",
                "instance_count": "2",
                "instance_list": [
                    {
                        "devices": [
                            {"device_id": "0", "device_ip": "192.1.0.100"},
                            {"device_id": "1", "device_ip": "192.1.0.101"},
                        ],
                        "pod_name": "job-1-worker-0",
                        "server_id": "127.0.1.1",
                    },
                    {
                        "devices": [
                            {"device_id": "0", "device_ip": "192.1.1.100"},
                            {"device_id": "1", "device_ip": "192.1.1.101"},
                        ],
                        "pod_name": "job-1-worker-1",
                        "server_id": "127.0.1.2",
                    },
                ],
            }
        ],
        "status": "initializing",
    }
    converted = rank_table.to_template1({**tables[0], "status": "completed"})
    assert converted["server_count"] == "2"
    assert [d["rank_id"] for s in converted["server_list"] for d in s["device"]] == ["0", "1", "2", "3"]
    assert [s["server_id"] for s in converted["server_list"]] == ["127.0.1.1", "127.0.1.2"]


def test_each_node_runs_the_per_card_launcher():
    spec = _job()
    plans = plan_job(spec, placement_for(spec, SPECS["npu.emu-2"]))
    assert plans[1].argv == [
        "python",
        "-m",
        "ma_jupyter.nodeside.ascend_launch",
        "--slots=2",
        "--first-rank=2",
        "--rank-size=4",
        "--listen=127.0.1.2:20020",
        "--peers=127.0.1.1:20010",
        "--",
        "python",
        "boot.py",
    ]
    for node in plans:
        assert node.env["RANK_TABLE_FILE"] == "/user/config"
        assert node.env["RANK_SIZE"] == "4"
        assert node.rank_logs and node.primary


def test_physical_card_indices_are_the_device_ids():
    spec = _job(nodes=1)
    placement = placement_for(spec, SPECS["npu.emu-2"])
    task = placement.tasks[0]
    placement = placement.__class__(
        job_id="j", spec=placement.spec, tasks=(task.__class__(**{**task.__dict__, "devices": (2, 3)}),)
    )
    table = json.loads(plan_job(spec, placement)[0].files["/user/config/jobstart_hccl.json"])
    devices = table["group_list"][0]["instance_list"][0]["devices"]
    assert [d["device_id"] for d in devices] == ["2", "3"]
