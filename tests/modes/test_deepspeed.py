"""PyTorch-DeepSpeed mode planner: the PyTorch variables plus /job/hostfile."""

from __future__ import annotations

from ma_jupyter.commands import parse_command
from ma_jupyter.models import JobSpec
from ma_jupyter.modes import plan_job

from .placements import SPECS, card_spec, placement_for


def test_hostfile_of_2_nodes_4_cards_is_the_seeds():
    spec = JobSpec(name="ds", mode="pytorch-deepspeed", nodes=2, command="deepspeed train.py --deepspeed")
    plans = plan_job(spec, placement_for(spec, card_spec(4)))
    for index, node in enumerate(plans):
        assert node.files == {"/job/hostfile": "worker-0 slots=4\nworker-1 slots=4\n"}
        assert node.env["MASTER_ADDR"] == "127.0.1.1"
        assert node.env["MASTER_PORT"] == "20010"
        assert node.env["WORLD_SIZE"] == "2"
        assert node.env["RANK"] == str(index)
        assert node.env["SLOTS"] == "4"
        assert node.argv == parse_command("deepspeed train.py --deepspeed")


def test_cpu_spec_hostfile_has_one_slot_and_python_is_wrapped():
    spec = JobSpec(name="ds", mode="pytorch-deepspeed", nodes=3, command="python train.py")
    plans = plan_job(spec, placement_for(spec, SPECS["cpu.small"]))
    assert plans[2].files["/job/hostfile"] == "worker-0 slots=1\nworker-1 slots=1\nworker-2 slots=1\n"
    assert plans[2].argv[:3] == ["python", "-m", "ma_jupyter.nodeside.torch_run"]
    assert "--node_rank=2" in plans[2].argv
