"""PyTorch mode planner: the seed's variables and the launcher wrapping rules."""

from __future__ import annotations

from ma_jupyter.commands import expand_argv, parse_command
from ma_jupyter.models import JobSpec
from ma_jupyter.modes import plan_job

from .placements import SPECS, card_spec, placement_for

SEED_TORCHRUN = (
    "torchrun --nnodes ${WORLD_SIZE} --nproc_per_node ${SLOTS} --node_rank ${RANK} "
    "--master_addr ${MASTER_ADDR} --master_port ${MASTER_PORT} /workspace/algorithm/train.py"
)


def _job(command: str, nodes: int = 2, **extra) -> JobSpec:
    return JobSpec(name="ddp", mode="pytorch", nodes=nodes, command=command, **extra)


def test_every_node_gets_the_seed_variables_2_nodes_4_cards():
    spec = _job("python /workspace/algorithm/train.py")
    plans = plan_job(spec, placement_for(spec, card_spec(4)))
    assert [p.name for p in plans] == ["worker-0", "worker-1"]
    for index, node in enumerate(plans):
        assert node.env["MASTER_ADDR"] == "127.0.1.1"
        assert node.env["MASTER_PORT"] == "20010"
        assert node.env["WORLD_SIZE"] == "2"
        assert node.env["RANK"] == str(index)
        assert node.env["SLOTS"] == "4"
        assert node.primary


def test_launchers_find_nodes_rank_and_rendezvous_in_the_environment():
    spec = _job("torchrun train.py")
    plans = plan_job(spec, placement_for(spec, card_spec(4), job_id="job-7"))
    for index, node in enumerate(plans):
        # Lightning, accelerate's notebook_launcher: the node's index
        assert node.env["NODE_RANK"] == node.env["GROUP_RANK"] == str(index)
        # torchrun's defaults for its own options (PET_<OPTION>)
        assert {k: v for k, v in node.env.items() if k.startswith("PET_")} == {
            "PET_NNODES": "2",
            "PET_NPROC_PER_NODE": "4",
            "PET_NODE_RANK": str(index),
            "PET_MASTER_ADDR": "127.0.1.1",
            "PET_MASTER_PORT": "20010",
            "PET_RDZV_BACKEND": "static",
            "PET_RDZV_ID": "job-7",
        }
    # a bare torchrun is a launcher: it runs as written and reads the variables itself
    assert plans[1].argv == ["torchrun", "train.py"]
    # the DeepSpeed mode and the ModelArts convention keep them too
    for extra in ({"mode": "pytorch-deepspeed"}, {"convention": "modelarts"}):
        spec = JobSpec.model_validate({**_job("python train.py").model_dump(), **extra})
        assert plan_job(spec, placement_for(spec, card_spec(4)))[1].env["PET_NODE_RANK"] == "1"


def test_the_job_env_is_kept_apart_from_the_platforms_for_expansion():
    spec = _job("python train.py", env={"DATA": "${MA_WORKSPACE}/d", "RANK": "9", "OUT": "$DATA/o"})
    node = plan_job(spec, placement_for(spec))[1]
    # RANK is the platform's: the job's value is overridden and never expanded
    assert node.env["RANK"] == "1"
    assert node.job_env == ("DATA", "OUT")
    assert node.env["DATA"] == "${MA_WORKSPACE}/d"  # expanded by the backend, which knows the node


def test_cpu_spec_has_one_slot():
    spec = _job("python train.py", specs=["cpu.small"])
    plans = plan_job(spec, placement_for(spec, SPECS["cpu.small"]))
    assert {p.env["SLOTS"] for p in plans} == {"1"}
    assert "--nproc_per_node=1" in plans[0].argv


def test_python_command_is_wrapped_in_the_static_launcher():
    spec = _job("python /workspace/algorithm/train.py --epochs 5")
    plans = plan_job(spec, placement_for(spec, card_spec(4)))
    for index, node in enumerate(plans):
        assert node.argv == [
            "python",
            "-m",
            "ma_jupyter.nodeside.torch_run",
            "--nnodes=2",
            "--nproc_per_node=4",
            f"--node_rank={index}",
            "--master_addr=127.0.1.1",
            "--master_port=20010",
            "--rdzv_backend=static",
            "--max_restarts=0",
            "-m",
            "ma_jupyter.nodeside.rank_log",
            "--rank-var=RANK",
            "python",
            "/workspace/algorithm/train.py",
            "--epochs",
            "5",
        ]
        assert node.rank_logs


def test_python3_with_interpreter_flags_is_passed_to_each_rank_verbatim():
    spec = _job("python3 -u -X dev train.py")
    node = plan_job(spec, placement_for(spec))[0]
    assert node.argv[:3] == ["python", "-m", "ma_jupyter.nodeside.torch_run"]
    assert node.argv[node.argv.index("--rank-var=RANK") + 1 :] == ["python3", "-u", "-X", "dev", "train.py"]


def test_the_seeds_torchrun_command_runs_as_written_and_expands_from_the_node_env():
    spec = _job(SEED_TORCHRUN)
    plans = plan_job(spec, placement_for(spec, card_spec(4)))
    assert plans[1].argv == parse_command(SEED_TORCHRUN)
    assert not plans[1].rank_logs
    assert expand_argv(plans[1].argv, plans[1].env) == [
        "torchrun",
        "--nnodes",
        "2",
        "--nproc_per_node",
        "4",
        "--node_rank",
        "1",
        "--master_addr",
        "127.0.1.1",
        "--master_port",
        "20010",
        "/workspace/algorithm/train.py",
    ]


def test_launcher_modules_and_non_python_commands_are_untouched():
    for command in (
        "python -m torch.distributed.launch --nproc_per_node=4 train.py",
        "python3 -m torch.distributed.run --nnodes=2 train.py",
        "bash -c 'python train.py && python eval.py'",
        "/opt/run.sh --fast",
    ):
        spec = _job(command)
        for node in plan_job(spec, placement_for(spec)):
            assert node.argv == parse_command(command), command
            assert node.env["RANK"] == str(node.task.index)


def test_modelarts_convention_appends_init_method_rank_and_world_size():
    spec = _job("python train.py --epochs 5", convention="modelarts")
    plans = plan_job(spec, placement_for(spec, card_spec(4)))
    assert plans[1].argv == [
        "python",
        "train.py",
        "--epochs",
        "5",
        "--init_method",
        "tcp://127.0.1.1:20010",
        "--rank",
        "1",
        "--world_size",
        "2",
    ]
    single = _job("python train.py", nodes=1, convention="modelarts")
    assert plan_job(single, placement_for(single))[0].argv == [
        "python",
        "train.py",
        "--init_method",
        "tcp://127.0.1.1:20010",
    ]


def test_modelarts_conda_env_rule_for_custom_images():
    spec = _job(
        "python train.py",
        nodes=1,
        convention="modelarts",
        env={"ANACONDA_DIR": "/home/ma-user/anaconda3", "DEFAULT_CONDA_ENV_NAME": "python-3.7.10"},
    )
    node = plan_job(spec, placement_for(spec))[0]
    assert node.argv[0] == "/home/ma-user/anaconda3/envs/python-3.7.10/bin/python"
    assert node.env["LD_LIBRARY_PATH"] == "/home/ma-user/anaconda3/envs/python-3.7.10/lib"
    # without the convention the command is the platform's
    plain = _job("python train.py", nodes=1, env=dict(spec.env))
    assert plan_job(plain, placement_for(plain))[0].argv[:3] == [
        "python",
        "-m",
        "ma_jupyter.nodeside.torch_run",
    ]


def test_job_env_is_kept_but_cannot_override_the_mode_variables():
    spec = _job("python train.py", env={"EPOCHS": "3", "RANK": "7"})
    plans = plan_job(spec, placement_for(spec))
    assert plans[1].env["EPOCHS"] == "3"
    assert plans[1].env["RANK"] == "1"
    assert plans[1].env["MA_NUM_NODES"] == "2"
    assert plans[1].env["MA_TASK_NAME"] == "worker"


def test_omp_threads_are_the_specs_cores_shared_by_the_nodes_processes():
    spec = _job("python train.py")
    eight_cores = SPECS["gpu.emu-2"].model_copy(update={"name": "gpu.emu-4", "accelerators": 4, "cpus": 8})
    assert {p.env["OMP_NUM_THREADS"] for p in plan_job(spec, placement_for(spec, eight_cores))} == {"2"}
    one_core = SPECS["cpu.small"].model_copy(update={"cpus": 1})
    assert plan_job(spec, placement_for(spec, one_core))[0].env["OMP_NUM_THREADS"] == "1"
    half_core = SPECS["cpu.small"].model_copy(update={"cpus": 0.5})
    assert plan_job(spec, placement_for(spec, half_core))[0].env["OMP_NUM_THREADS"] == "1"
    # the job's own value wins
    mine = _job("python train.py", env={"OMP_NUM_THREADS": "6"})
    assert plan_job(mine, placement_for(mine, one_core))[0].env["OMP_NUM_THREADS"] == "6"


def test_a_launcher_made_single_node_is_refused_on_several_nodes_and_kept_on_one():
    import pytest

    from ma_jupyter.errors import InvalidSpec

    for command, option in [
        ("torchrun --standalone --nproc_per_node=2 train.py", "--standalone"),
        ("torchrun --nnodes 1 --nproc_per_node 2 train.py", "--nnodes 1"),
        ("torchrun --nnodes=1 train.py", "--nnodes 1"),
        ("torchrun --nnodes=1:1 train.py", "--nnodes 1:1"),
        ("python -u -m torch.distributed.run --standalone train.py", "--standalone"),
    ]:
        spec = _job(command)
        with pytest.raises(InvalidSpec) as refused:
            plan_job(spec, placement_for(spec, card_spec(2)))
        assert refused.value.field == "command"
        message = refused.value.message
        assert option in message and "PET_NNODES=2" in message, message
        assert f"Drop {option.split()[0]}" in message and "--nodes 1" in message, message
        # one node: the launcher's own one-node job is what the user asked for
        single = _job(command, nodes=1)
        assert plan_job(single, placement_for(single, card_spec(2)))
    # the script's own --standalone, a node count from the platform, or an elastic range: kept
    for command in (
        "torchrun train.py --standalone",
        "torchrun --nnodes ${WORLD_SIZE} train.py --nnodes 1",
        "torchrun --nnodes=1:2 train.py",
        "python train.py --standalone",
    ):
        spec = _job(command)
        assert len(plan_job(spec, placement_for(spec, card_spec(2)))) == 2, command


def test_only_the_words_python_and_python3_are_wrapped_as_the_seed_says():
    # seed 002: a command that does not start with python or python3 is left alone
    for command in ("python train.py", "python3 -u train.py --lr 1"):
        spec = _job(command)
        node = plan_job(spec, placement_for(spec, card_spec(2)))[0]
        assert node.argv[:3] == ["python", "-m", "ma_jupyter.nodeside.torch_run"] and node.rank_logs
    for command in ("/usr/bin/python3 train.py", "python3.11 train.py", "/opt/conda/bin/python train.py"):
        spec = _job(command)
        for node in plan_job(spec, placement_for(spec, card_spec(2))):
            assert node.argv == parse_command(command) and not node.rank_logs
            assert node.notes == ["command runs as written (does not start with python or python3)"]
            # the node still has the seed's variables, for the user's own launcher
            assert node.env["WORLD_SIZE"] == "2" and node.env["SLOTS"] == "2"
