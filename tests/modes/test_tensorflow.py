"""TensorFlow mode planner: TF_CONFIG in the seed's shapes and which tasks are primary."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from ma_jupyter.models import JobSpec
from ma_jupyter.modes import plan_job

from .placements import placement_for


def _tf(**fields) -> JobSpec:
    return JobSpec(name="tf", mode="tensorflow", command="python train.py --epochs 5", **fields)


def _configs(plans) -> dict[str, dict]:
    return {p.name: json.loads(p.env["TF_CONFIG"]) for p in plans}


def test_ps_worker_tf_config_per_task():
    spec = _tf(nodes=2, ps=1)
    plans = plan_job(spec, placement_for(spec))
    assert [p.name for p in plans] == ["ps-0", "worker-0", "worker-1"]
    cluster = {"ps": ["127.0.1.1:20010"], "worker": ["127.0.1.2:20020", "127.0.1.3:20030"]}
    assert _configs(plans) == {
        "ps-0": {"cluster": cluster, "task": {"type": "ps", "index": 0}, "environment": "cloud"},
        "worker-0": {"cluster": cluster, "task": {"type": "worker", "index": 0}, "environment": "cloud"},
        "worker-1": {"cluster": cluster, "task": {"type": "worker", "index": 1}, "environment": "cloud"},
    }
    # parameter servers never exit by themselves: the job follows the workers
    assert [p.primary for p in plans] == [False, True, True]
    assert all(p.argv == ["python", "train.py", "--epochs", "5"] for p in plans)


def test_allreduce_tf_config_has_workers_only():
    spec = _tf(nodes=2)
    plans = plan_job(spec, placement_for(spec))
    assert [p.name for p in plans] == ["worker-0", "worker-1"]
    assert json.loads(plans[1].env["TF_CONFIG"]) == {
        "cluster": {"worker": ["127.0.1.1:20010", "127.0.1.2:20020"]},
        "task": {"type": "worker", "index": 1},
        "environment": "cloud",
    }
    assert all(p.primary for p in plans)


def test_chief_with_parameter_servers_is_the_only_primary_task():
    spec = _tf(nodes=2, ps=2, chief=True)
    plans = plan_job(spec, placement_for(spec))
    assert [p.name for p in plans] == ["ps-0", "ps-1", "chief-0", "worker-0", "worker-1"]
    config = _configs(plans)["chief-0"]
    assert config == {
        "cluster": {
            "chief": ["127.0.1.3:20030"],
            "ps": ["127.0.1.1:20010", "127.0.1.2:20020"],
            "worker": ["127.0.1.4:20040", "127.0.1.5:20050"],
        },
        "task": {"type": "chief", "index": 0},
        "environment": "cloud",
    }
    assert {p.name: p.primary for p in plans} == {
        "ps-0": False,
        "ps-1": False,
        "chief-0": True,
        "worker-0": False,
        "worker-1": False,
    }


def test_chief_without_parameter_servers_trains_with_the_workers():
    spec = _tf(nodes=2, chief=True)
    plans = plan_job(spec, placement_for(spec))
    assert [p.name for p in plans] == ["chief-0", "worker-0", "worker-1"]
    assert all(p.primary for p in plans)
    assert _configs(plans)["worker-1"]["cluster"] == {
        "chief": ["127.0.1.1:20010"],
        "worker": ["127.0.1.2:20020", "127.0.1.3:20030"],
    }


def test_modelarts_convention_arguments_and_variables():
    # seed 001/004: on two nodes, one ps per worker (1:1) without asking for any
    spec = _tf(nodes=2, convention="modelarts")
    plans = plan_job(spec, placement_for(spec))
    assert [p.name for p in plans] == ["ps-0", "ps-1", "worker-0", "worker-1"]
    worker = plans[3]
    ps_hosts = "127.0.1.1:20010,127.0.1.2:20020"
    worker_hosts = "127.0.1.3:20030,127.0.1.4:20040"
    assert worker.env["VC_TASK_INDEX"] == "1"
    assert worker.env["TF_PS_HOSTS"] == ps_hosts
    assert worker.env["TF_WORKER_HOSTS"] == worker_hosts
    assert worker.env["MA_TASK_NAME"] == "worker"
    assert worker.argv == [
        "python",
        "train.py",
        "--epochs",
        "5",
        "--task_index",
        "1",
        "--ps_hosts",
        ps_hosts,
        "--worker_hosts",
        worker_hosts,
        "--job_name",
        "worker",
    ]
    assert plans[0].argv[-2:] == ["--job_name", "ps"]
    assert plans[0].env["MA_TASK_NAME"] == "ps"


def test_modelarts_single_node_runs_the_command_as_written():
    # seed 001: a single-node job is `python <boot file> <args>` only: no ps, nothing appended
    spec = _tf(convention="modelarts")
    (plan,) = plan_job(spec, placement_for(spec))
    assert plan.name == "worker-0"
    assert plan.argv == ["python", "train.py", "--epochs", "5"]


def test_modelarts_ps_count_other_than_the_layout_is_refused():
    for nodes, ps in ((2, 1), (1, 1), (3, 2)):
        with pytest.raises(ValidationError) as info:
            _tf(nodes=nodes, ps=ps, convention="modelarts")
        message = str(info.value)
        assert f"ps={ps}" in message and "beside each worker" in message, message
    assert _tf(nodes=3, ps=3, convention="modelarts").ps == 3  # the layout's own count is accepted


def test_single_core_tasks_get_two_inter_op_threads():
    spec = _tf(nodes=2, ps=1, chief=True)
    placement = placement_for(spec)
    pinned = placement.__class__(
        job_id=placement.job_id,
        spec=placement.spec,
        tasks=tuple(t.__class__(**{**t.__dict__, "cpus": (0,)}) for t in placement.tasks),
    )
    assert {p.env["TF_NUM_INTEROP_THREADS"] for p in plan_job(spec, pinned)} == {"2"}
    # unpinned tasks keep TensorFlow's own choice, and the job's setting wins
    assert all("TF_NUM_INTEROP_THREADS" not in p.env for p in plan_job(spec, placement))
    own = _tf(nodes=2, ps=1, chief=True, env={"TF_NUM_INTEROP_THREADS": "8"})
    assert {p.env["TF_NUM_INTEROP_THREADS"] for p in plan_job(own, pinned)} == {"8"}


def test_a_parameter_server_names_its_own_spec():
    from ma_jupyter.service.scheduler import PS_SPEC

    spec = _tf(nodes=1, ps=1)
    ps, worker = plan_job(spec, placement_for(spec))
    # the ps runs with the scheduler's parameter-server spec, the worker with the job's
    assert ps.env["MA_SPEC"] == PS_SPEC.name == "cpu.ps"
    assert worker.env["MA_SPEC"] == "cpu.small"


def test_only_a_modelarts_job_of_several_nodes_splits_its_nodes_with_parameter_servers():
    """The limits shown and exported for a job follow the scheduler's split: a single-node job of
    the ModelArts layout runs its worker alone with the whole node."""
    from ma_jupyter.modes.base import splits_nodes

    def spec(nodes, convention="modelarts"):
        return JobSpec(
            name="tf", mode="tensorflow", nodes=nodes, convention=convention, command="python t.py"
        )

    assert splits_nodes(spec(2)) and not splits_nodes(spec(1))
    assert not splits_nodes(spec(2, convention="platform"))
