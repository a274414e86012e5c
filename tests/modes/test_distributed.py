"""The distributed mode's planner, the variables any framework reads, threads sized by processes."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from ma_jupyter.models import JobSpec
from ma_jupyter.modes import plan_job

from .placements import SPECS, placement_for


def _job(command: str, mode: str = "distributed", nodes: int = 2, **extra) -> JobSpec:
    return JobSpec(name="dist", mode=mode, nodes=nodes, command=command, **extra)


def test_every_node_gets_the_variables_and_the_command_runs_as_written():
    spec = _job("python /workspace/algorithm/train_jax.py --steps 3")
    plans = plan_job(spec, placement_for(spec, SPECS["cpu.medium"]))
    assert [p.name for p in plans] == ["worker-0", "worker-1"]
    for index, node in enumerate(plans):
        assert node.argv == ["python", "/workspace/algorithm/train_jax.py", "--steps", "3"]
        assert not node.needs_modules  # nothing of torch is asked of the image
        assert node.env["MASTER_ADDR"] == "127.0.1.1"
        assert node.env["MASTER_PORT"] == "20010"
        assert (node.env["WORLD_SIZE"], node.env["RANK"], node.env["NODE_RANK"]) == (
            "2",
            str(index),
            str(index),
        )
        # JAX's coordinator is worker-0's second port: the first is MASTER_PORT (torch's store)
        assert node.env["JAX_COORDINATOR_ADDRESS"] == "127.0.1.1:20011"
        assert (node.env["JAX_NUM_PROCESSES"], node.env["JAX_PROCESS_ID"]) == ("2", str(index))
        assert node.env["MA_MASTER_PORTS"] == "20010,20011"
    assert [p.env["MA_PORTS"] for p in plans] == ["20010,20011", "20020,20021"]
    assert "starts no launcher" in " ".join(plans[0].notes)


def test_the_pytorch_mode_names_the_same_ports_and_says_why_it_wraps():
    spec = _job("python train.py", mode="pytorch")
    node = plan_job(spec, placement_for(spec))[1]
    assert node.argv[:3] == ["python", "-m", "ma_jupyter.nodeside.torch_run"]
    assert node.needs_modules == ("torch",)
    assert node.env["JAX_COORDINATOR_ADDRESS"] == "127.0.1.1:20011"
    assert node.env["MA_PORTS"] == "20020,20021"
    assert any("--mode distributed" in note for note in node.notes)


def test_the_single_mode_refuses_two_nodes_and_names_the_distributed_mode():
    with pytest.raises(ValidationError, match="mode=distributed"):
        JobSpec(name="one", mode="single", nodes=2, command="python train.py")


def test_torchs_one_node_launcher_on_two_nodes_is_refused_here_too_and_allowed_on_one():
    """The distributed mode sets torchrun's PET_NNODES as the pytorch mode does: `torchrun
    --standalone` on 2 nodes would make each node a one-node job waiting for the other forever."""
    from ma_jupyter.errors import InvalidSpec

    for command, option in [
        ("torchrun --standalone --nproc_per_node=2 train.py", "--standalone"),
        ("torchrun --nnodes=1 train.py", "--nnodes 1"),
    ]:
        spec = _job(command)
        with pytest.raises(InvalidSpec) as refused:
            plan_job(spec, placement_for(spec, SPECS["cpu.medium"]))
        assert refused.value.field == "command"
        assert option in refused.value.message and "PET_NNODES=2" in refused.value.message
        one = _job(command, nodes=1)
        assert len(plan_job(one, placement_for(one, SPECS["cpu.medium"]))) == 1
    # a bare torchrun joins the job, and a script's own --standalone is its own
    for command in ("torchrun --nproc_per_node=2 train.py", "python train.py --standalone"):
        spec = _job(command)
        assert len(plan_job(spec, placement_for(spec, SPECS["cpu.medium"]))) == 2, command


@pytest.mark.parametrize(
    ("command", "threads"),
    [
        ("torchrun --nproc_per_node=2 train.py", "1"),  # cpu.medium: 2 cores / 2 ranks
        ("torchrun --nproc-per-node 1 train.py", "2"),
        ("python -m torch.distributed.run --nproc_per_node 2 train.py", "1"),
        ("torchrun train.py", "2"),  # PET_NPROC_PER_NODE: the node's slots, 1 on a CPU spec
        ("mpirun -np 4 python train.py", "1"),  # 4 ranks on 2 nodes
        ("mpirun -npernode 1 python train.py", "2"),
        ("python train.py", "2"),
    ],
)
def test_thread_counts_are_the_nodes_cores_shared_by_the_ranks_its_launcher_starts(command, threads):
    spec = _job(command)
    env = plan_job(spec, placement_for(spec, SPECS["cpu.medium"]))[0].env
    assert (env["OMP_NUM_THREADS"], env["MKL_NUM_THREADS"], env["OPENBLAS_NUM_THREADS"]) == (threads,) * 3


def test_a_launchers_count_given_as_a_variable_is_read_expanded():
    spec = _job("torchrun --nproc_per_node ${PROCS} train.py", env={"PROCS": "2"})
    assert plan_job(spec, placement_for(spec, SPECS["cpu.medium"]))[0].env["OMP_NUM_THREADS"] == "1"


def test_the_jobs_own_thread_count_wins_and_sizes_mkl_and_openblas_too():
    spec = _job("torchrun --nproc_per_node=2 train.py", env={"OMP_NUM_THREADS": "3"})
    env = plan_job(spec, placement_for(spec, SPECS["cpu.medium"]))[0].env
    assert (env["OMP_NUM_THREADS"], env["MKL_NUM_THREADS"], env["OPENBLAS_NUM_THREADS"]) == ("3", "3", "3")


def test_the_platforms_rendezvous_variables_win_over_the_jobs_env_and_the_plan_says_so():
    spec = _job("python train.py", env={"RANK": "7", "MASTER_PORT": "1", "HOME": "/workspace/outputs"})
    node = plan_job(spec, placement_for(spec))[1]
    assert (node.env["RANK"], node.env["MASTER_PORT"]) == ("1", "20010")
    assert "HOME" in node.job_env and "RANK" not in node.job_env
    assert "--env MASTER_PORT, RANK not applied" in " ".join(node.notes)


def test_the_mindspore_mode_on_a_cpu_spec_gets_the_dynamic_cluster_variables():
    spec = _job("python train.py", mode="mindspore-ascend")
    plans = plan_job(spec, placement_for(spec, SPECS["cpu.small"]))
    for index, node in enumerate(plans):
        assert node.env["MS_ROLE"] == "MS_WORKER"
        assert (node.env["MS_SCHED_HOST"], node.env["MS_SCHED_PORT"]) == ("127.0.1.1", "20011")
        assert (node.env["MS_WORKER_NUM"], node.env["MS_NODE_ID"]) == ("2", str(index))
    # on cards the rank table is how MindSpore finds its peers
    carded = plan_job(spec, placement_for(spec, SPECS["npu.emu-2"]))
    assert "MS_ROLE" not in carded[0].env


def test_the_shared_options_parser_takes_the_distributed_mode():
    from ma_jupyter.frontends import options

    parser = options.build_parser()
    spec = options.spec_from_args(
        options.parse_args(parser, "--mode distributed --nodes 2"), command="python t.py"
    )
    assert JobSpec.model_validate({"name": "d", **spec}).mode.value == "distributed"


def _documented_env_rule() -> tuple[str, set[str]]:
    """docs/variables.md's *What a job's `--env` may override*: its first half's text (the
    platform's wins) and the names its second half gives the job."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "variables.md").read_text()
    section = text.split("## What a job's `--env` may override", 1)[1].split("\n## ", 1)[0]
    platform, job = section.split("2. **The job's wins**", 1)
    return platform, set(re.findall(r"`([A-Z][A-Z0-9_]*)`", job))


@pytest.mark.parametrize(
    ("mode", "extra"),
    [
        ("distributed", {}),
        ("pytorch", {}),
        ("pytorch-deepspeed", {}),
        ("tensorflow", {"ps": 1}),
        ("horovod", {}),
        ("mindspore-ascend", {}),
    ],
)
def test_the_env_rule_of_docs_variables_md_is_the_planners(mode, extra):
    """Every variable a mode sets keeps the platform's value against the job's `--env`, but
    those docs/variables.md gives the job, whose value applies in every mode."""
    platform_text, job_names = _documented_env_rule()
    plain = _job("python train.py", mode=mode, **extra)
    set_by_mode = {name for node in plan_job(plain, placement_for(plain)) for name in node.env}
    given = dict.fromkeys(set_by_mode | job_names, "from-job")
    spec = _job("python train.py", mode=mode, env=given, **extra)
    for node in plan_job(spec, placement_for(spec)):
        for name in job_names:
            assert node.env[name] == "from-job", (mode, node.name, name)
        for name in set_by_mode - job_names:
            assert node.env[name] != "from-job", (
                f"{mode}: the job's {name} applied, docs say the platform's wins"
            )
    # the first half names no variable the job's value wins for
    assert not {n for n in job_names if f"`{n}`" in platform_text}
