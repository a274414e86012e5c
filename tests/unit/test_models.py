"""The job model's validation rules and the run-command rules of the platform."""

from __future__ import annotations

import pytest

from ma_jupyter.commands import expand_argv, expand_env, parse_command
from ma_jupyter.errors import InvalidSpec
from ma_jupyter.models import TRANSITIONS, JobSpec, JobStatus, Mode, json_schemas, parse_duration, parse_spec


@pytest.mark.parametrize(
    "command, hint",
    [
        ("KEY=VALUE python3 train.py", "must start with an executable"),
        ("CUDA_VISIBLE_DEVICES=0 python train.py", "must start with an executable"),
        ("python3 train.py && python3 evaluate.py", "'&&'"),
        ("python3 train.py; python3 evaluate.py", "';'"),
        ("python3 train.py | tee log.txt", "'|'"),
        ("python3 train.py > out.txt", "'>'"),
        ("python3 train.py || true", "'||'"),
        ("python3 train.py &", "'&'"),
        ("python3 $(which train.py)", "command substitution"),
    ],
)
def test_seed_counter_examples_are_refused_with_the_bash_c_hint(command, hint):
    with pytest.raises(InvalidSpec) as err:
        parse_command(command)
    assert hint in err.value.message
    # double quotes when the user's shell would change nothing inside them, else single quotes
    assert ("bash -c '" if "$" in command else 'bash -c "') in err.value.message
    with pytest.raises(InvalidSpec):
        JobSpec(name="j", command=command)


@pytest.mark.parametrize(
    "command, argv",
    [
        (
            'bash -c "KEY=VALUE python3 train.py && python3 evaluate.py"',
            ["bash", "-c", "KEY=VALUE python3 train.py && python3 evaluate.py"],
        ),
        (
            "python /workspace/algorithm/train.py --lr 0.1",
            ["python", "/workspace/algorithm/train.py", "--lr", "0.1"],
        ),
        ("python -c 'print(1); print(2)'", ["python", "-c", "print(1); print(2)"]),
        ("echo 'a && b'", ["echo", "a && b"]),
    ],
)
def test_accepted_commands_become_argv(command, argv):
    assert parse_command(command) == argv


def test_empty_and_unbalanced_commands_are_refused():
    with pytest.raises(InvalidSpec, match="empty"):
        parse_command("   ")
    with pytest.raises(InvalidSpec, match="quotes"):
        parse_command("python 'x.py")


def test_seed_torchrun_example_expands_without_a_shell():
    argv = parse_command(
        "torchrun --nnodes ${WORLD_SIZE} --nproc_per_node ${SLOTS} --node_rank ${RANK} "
        "--master_addr ${MASTER_ADDR} --master_port ${MASTER_PORT} /workspace/algorithm/train.py"
    )
    env = {"WORLD_SIZE": "2", "SLOTS": "4", "RANK": "1", "MASTER_ADDR": "worker-0", "MASTER_PORT": "2222"}
    assert expand_argv(argv, env) == [
        "torchrun",
        "--nnodes",
        "2",
        "--nproc_per_node",
        "4",
        "--node_rank",
        "1",
        "--master_addr",
        "worker-0",
        "--master_port",
        "2222",
        "/workspace/algorithm/train.py",
    ]
    # bash expands its own script: left alone
    assert expand_argv(["bash", "-c", "echo $RANK"], env) == ["bash", "-c", "echo $RANK"]


def test_unknown_fields_are_rejected_with_a_readable_message():
    with pytest.raises(InvalidSpec, match="nodez: unknown field"):
        parse_spec({"name": "j", "command": "python x.py", "nodez": 2})


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"node_name": "node-0", "pool": "p"}, "node_name cannot be combined"),
        ({"node_name": "node-0", "driver_version": "535"}, "node_name cannot be combined"),
        (
            {"fault_restart": {"max_restarts": 2}, "checkpoint_resume": {"max_resumes": 2}},
            "exclude each other",
        ),
        ({"mode": "pytorch", "ps": 1, "nodes": 2}, "tensorflow mode only"),
        ({"mode": "single", "nodes": 2}, "single mode runs on one node"),
        ({"specs": []}, "at least 1"),
        ({"specs": ["cpu.small", "cpu.small"]}, "listed once"),
        ({"duration": "soon"}, "not a duration"),
        (
            {"datasets": [{"name": "d", "path": "/x", "read_only": False}], "data_preparation": True},
            "read-only",
        ),
        (
            {"checkpoint_resume": {"elastic_min_nodes": 3}, "mode": "pytorch", "nodes": 2},
            "cannot exceed nodes",
        ),
        ({"checkpoint_resume": {"allow_scale_up": True}}, "allow_scale_up .* needs elastic_min_nodes"),
    ],
)
def test_cross_field_rules(fields, message):
    with pytest.raises(InvalidSpec, match=message):
        parse_spec({"name": "j", "command": "python x.py", **fields})


def test_batch_jobs_take_tasks_not_a_command():
    with pytest.raises(InvalidSpec, match="at least one task"):
        parse_spec({"name": "b", "type": "batch"})
    spec = parse_spec({"name": "b", "type": "batch", "tasks": [{"command": "python a.py"}]})
    assert spec.tasks[0].command == "python a.py"
    with pytest.raises(InvalidSpec, match="must start with an executable"):
        parse_spec({"name": "b", "type": "batch", "tasks": [{"command": "A=1 python a.py"}]})
    with pytest.raises(InvalidSpec, match="one node in the single mode"):
        parse_spec(
            {
                "name": "b",
                "type": "batch",
                "mode": "pytorch",
                "nodes": 2,
                "tasks": [{"command": "python a.py"}],
            }
        )


def test_durations():
    assert parse_duration("90") == 90
    assert parse_duration("1d2h3m4s") == 86400 + 7200 + 180 + 4
    assert parse_duration(None) is None
    with pytest.raises(ValueError):
        parse_duration("-5")


def test_statuses_and_their_transition_table():
    assert {s.value for s in JobStatus} == {"queued", "running", "error", "stopped", "expired", "succeeded"}
    assert [s for s in JobStatus if s.is_terminal()] == [
        JobStatus.error,
        JobStatus.stopped,
        JobStatus.expired,
        JobStatus.succeeded,
    ]
    assert JobStatus.running.can_become(JobStatus.expired)
    assert not JobStatus.succeeded.can_become(JobStatus.running)
    assert all(not TRANSITIONS[s] for s in JobStatus if s.is_terminal())


def test_every_mode_of_the_seed_exists_and_schemas_export():
    assert {m.value for m in Mode} == {
        "single",
        "distributed",  # the variables of every node, the command as written (any framework)
        "pytorch",
        "pytorch-deepspeed",
        "tensorflow",
        "horovod",
        "mindspore-ascend",
    }
    schemas = json_schemas()
    assert schemas["JobSpec"]["additionalProperties"] is False
    assert "command" in schemas["JobSpec"]["properties"]


def test_env_values_expand_in_order_from_the_platform_and_earlier_values():
    base = {"PATH": "/venv/bin:/usr/bin", "MA_WORKSPACE": "/workspace", "RANK": "1"}
    values = {
        "PATH": "/opt/tool/bin:$PATH",  # its own name: the platform's value
        "DATA": "${MA_WORKSPACE}/dataset",
        "OUT": "$DATA/rank-${RANK}",  # an earlier value, already expanded
        "EARLY": "${LATE}x",  # a later one is not defined yet
        "LATE": "y",
        "MISSING": "[$NOPE]",
        "LITERAL": "cost $5, a$ and $-",
        "AGAIN": "$WITH_DOLLAR",
    }
    out = expand_env(values, {**base, "WITH_DOLLAR": "$RANK"})
    assert list(out) == list(values)
    assert out["PATH"] == "/opt/tool/bin:/venv/bin:/usr/bin"
    assert out["DATA"] == "/workspace/dataset"
    assert out["OUT"] == "/workspace/dataset/rank-1"
    assert out["EARLY"] == "x"
    assert out["MISSING"] == "[]"  # as in the command: an unknown name expands to nothing
    assert out["LITERAL"] == "cost $5, a$ and $-"
    assert out["AGAIN"] == "$RANK"  # one pass: what a value brings in is not expanded again
    assert expand_argv(["echo", "[$NOPE]"], {}) == ["echo", "[]"]


def test_the_log_a_reader_gets_by_default_is_the_chiefs_even_before_the_launch():
    from ma_jupyter.models import Job, NodeRun

    chief = JobSpec(name="c", command="python x.py", mode=Mode.tensorflow, chief=True, nodes=2, ps=1)
    assert Job(id="j", spec=chief).log_node == "chief-0"  # queued: no node launched yet
    launched = [
        NodeRun(name="ps-0", role="ps", primary=False),
        NodeRun(name="chief-0", role="chief"),
        NodeRun(name="worker-0", primary=False),
    ]
    assert Job(id="j", spec=chief, nodes=launched).log_node == "chief-0"
    plain = JobSpec(name="p", command="python x.py", mode=Mode.tensorflow, nodes=2)
    assert Job(id="j", spec=plain).log_node == "worker-0"
