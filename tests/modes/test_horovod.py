"""Horovod (MPI) mode planner: hostfiles, variables, the seed's mpirun prefix, waiting nodes."""

from __future__ import annotations

from dataclasses import replace

from ma_jupyter.commands import expand_argv, parse_command
from ma_jupyter.models import JobSpec
from ma_jupyter.modes import plan_job
from ma_jupyter.nodehost import network

from .placements import SPECS, card_spec, placement_for

#: worker-0's step that writes $TUNE_ENV_FILE before the command
HEAD = ["python", "-m", "ma_jupyter.nodeside.mpi_head", "--"]
#: seed 002's prefix for 2 nodes x 4 cards, word for word but for the two dashes Open MPI 5 needs
#: and ``--stdin none`` after it (each shown in the dry run's notes)
SEED_PREFIX = (
    "mpirun --allow-run-as-root -np 8 --bind-to none --map-by slot "
    "-x NCCL_DEBUG=INFO -x LD_LIBRARY_PATH -x PATH -mca pml ob1 -mca btl ^openib --stdin none"
).split()


def _mpi(command: str = "python /workspace/algorithm/train.py", nodes: int = 2, **fields) -> JobSpec:
    return JobSpec(name="hvd", mode="horovod", nodes=nodes, command=command, **fields)


def test_hostfiles_and_variables_2_nodes_4_cards():
    spec = _mpi()
    plans = plan_job(spec, placement_for(spec, card_spec(4)))
    for node in plans:
        assert node.files == {
            "/etc/mpi/hostfile": "worker-0 slots=4\nworker-1 slots=4\n",
            "/etc/mpi/mpich_hostfile": "worker-0:4\nworker-1:4\n",
        }
        assert node.env["OMPI_MCA_orte_default_hostfile"] == "/etc/mpi/hostfile"
        assert node.env["PRTE_MCA_prte_default_hostfile"] == "/etc/mpi/hostfile"
        assert node.env["HYDRA_HOST_FILE"] == "/etc/mpi/mpich_hostfile"
        # the node's interface as the network code names it (the seed's eth0): these
        # placements share the host's loopback (LocalBackend.remote_shell)
        assert node.env["HYDRA_IFACE"] == network.SHARED_INTERFACE
        assert node.env["OMPI_MCA_plm_rsh_agent"] == "python -m ma_jupyter.nodehost.rsh_agent"
        assert node.env["PRTE_MCA_plm_ssh_agent"] == "python -m ma_jupyter.nodehost.rsh_agent"
        assert node.env["SLOTS"] == "4"
        # seed 003: cards x nodes processes; seed 004's MY_MPI_SLOTS defaults to MA_NUM_GPUS
        assert node.env["OPENMPI_NP"] == "8" and node.env["MA_NUM_GPUS"] == "4"
        assert node.env["OPENMPI_HOST_FILE_PATH"] == "/etc/mpi/hostfile"


def test_command_without_mpirun_gets_the_seed_prefix_on_worker_0():
    spec = _mpi()
    head, other = plan_job(spec, placement_for(spec, card_spec(4)))
    assert head.argv == [
        *HEAD,
        *SEED_PREFIX,
        "python",
        "-m",
        "ma_jupyter.nodeside.rank_log",
        "--rank-var=OMPI_COMM_WORLD_RANK",
        "python",
        "/workspace/algorithm/train.py",
    ]
    assert head.primary and head.rank_logs
    assert other.argv == [
        "python",
        "-m",
        "ma_jupyter.nodehost.rsh_agent",
        "--serve",
        "--job",
        "job-1",
        "--host",
        "worker-1",
    ]
    assert not other.primary


def test_command_with_mpirun_is_left_alone():
    command = (
        "mpirun -np 16 -bind-to none -map-by slot -x NCCL_DEBUG=INFO -x LD_LIBRARY_PATH -x PATH "
        "-x NCCL_SOCKET_IFNAME=^lo,docker0 -mca pml ob1 -mca btl ^openib -mca btl_tcp_if_exclude lo,docker0 "
        "python /workspace/algorithm/train.py"
    )
    for text in (command, 'bash -c "mpirun -np 2 python train.py"', "/usr/local/bin/mpirun -np 2 hostname"):
        spec = _mpi(text)
        head = plan_job(spec, placement_for(spec, card_spec(4)))[0]
        assert head.argv == [*HEAD, *parse_command(text)]
        assert not head.rank_logs


def test_cpu_spec_counts_one_process_per_node():
    spec = _mpi(nodes=3)
    plans = plan_job(spec, placement_for(spec, SPECS["cpu.small"]))
    assert plans[0].argv[plans[0].argv.index("-np") + 1] == "3"
    assert plans[0].files["/etc/mpi/hostfile"] == "worker-0 slots=1\nworker-1 slots=1\nworker-2 slots=1\n"
    assert [p.primary for p in plans] == [True, False, False]


def test_modelarts_convention_forwards_the_platform_variables():
    spec = _mpi(
        convention="modelarts",
        env={
            "MA_OUTPUT": "/x",
            "S3_BUCKET": "b",
            "SCC_TOKEN": "t",
            "CRED_FILE": "c",
            "OTHER": "no",
            "VC_WORKER_HOSTS": "w",
            # seed 003's grep -v '=$': an empty variable is not forwarded
            "MA_EMPTY": "",
            "SHARED_NONE": "",
        },
    )
    head = plan_job(spec, placement_for(spec, card_spec(4)))[0]
    forwarded = [head.argv[i + 1] for i, a in enumerate(head.argv) if a == "-x"]
    assert forwarded[:3] == ["NCCL_DEBUG=INFO", "LD_LIBRARY_PATH", "PATH"]
    assert set(forwarded[3:]) == {
        "CRED_FILE",
        "MA_JOB_ID",
        "MA_JOB_NAME",
        "MA_NUM_HOSTS",
        "MA_NUM_NODES",
        "MA_VJ_NAME",
        "MA_OUTPUT",
        "MA_SPEC",
        "MA_TASK_INDEX",
        "MA_TASK_NAME",
        "S3_BUCKET",
        "SCC_TOKEN",
        "VC_WORKER_HOSTS",
    }
    # an addition to seed 002's prefix: shown in the dry run with its reason
    assert any(
        n.startswith("-x CRED_FILE -x MA_JOB_ID") and "worker-0's values, as seed 003's -tune" in n
        for n in head.notes
    ), head.notes


def _forwarded(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == "-x"]


def test_ld_library_path_is_always_forwarded_as_the_seed_writes_it():
    spec = _mpi()
    head = plan_job(spec, placement_for(spec, card_spec(4)))[0]
    assert _forwarded(head.argv) == ["NCCL_DEBUG=INFO", "LD_LIBRARY_PATH", "PATH"]
    # the ModelArts conda rule sets it too
    spec = _mpi(convention="modelarts", env={"ANACONDA_DIR": "/opt/conda", "DEFAULT_CONDA_ENV_NAME": "t"})
    head = plan_job(spec, placement_for(spec, card_spec(4)))[0]
    assert head.env["LD_LIBRARY_PATH"] == "/opt/conda/envs/t/lib"


def test_cpu_spec_hostfile_slots_are_one_whatever_the_cores():
    spec = _mpi(nodes=2)
    placement = placement_for(spec, SPECS["cpu.medium"])
    placement = replace(placement, tasks=tuple(replace(t, cpus=(0, 1)) for t in placement.tasks))
    head, other = plan_job(spec, placement)
    # seed 002: "slots is the card count of the spec; 1 for a CPU spec", beside SLOTS=1
    assert head.files["/etc/mpi/hostfile"] == "worker-0 slots=1\nworker-1 slots=1\n"
    assert head.files["/etc/mpi/mpich_hostfile"] == "worker-0:1\nworker-1:1\n"
    argv = head.argv
    assert argv[argv.index("-np") + 1] == "2" and argv[argv.index("--map-by") + 1] == "slot"
    assert head.env["SLOTS"] == "1" and head.env["OPENMPI_NP"] == "2"
    # cards above the cores: one slot per card
    spec = _mpi(nodes=2)
    placement = placement_for(spec, card_spec(4))
    placement = replace(placement, tasks=tuple(replace(t, cpus=(0,)) for t in placement.tasks))
    assert plan_job(spec, placement)[0].files["/etc/mpi/hostfile"] == "worker-0 slots=4\nworker-1 slots=4\n"


def test_seed_003_and_004_variables_on_every_node():
    spec = _mpi(nodes=3)
    plans = plan_job(spec, placement_for(spec, card_spec(2)))
    for node in plans:
        env = node.env
        assert env["OPENMPI_BIND_ARGS"] == "--bind-to none --map-by slot"
        assert env["OPENMPI_X_ARGS"] == (
            "-x LD_LIBRARY_PATH -x HOROVOD_MPI_THREADS_DISABLE=1 -x NCCL_DEBUG=INFO "
            "-x NCCL_SOCKET_IFNAME=lo -x NCCL_SOCKET_FAMILY=AF_INET -x NCCL_IB_DISABLE=0"
        )
        assert env["OPENMPI_MCA_ARGS"] == "-mca pml ob1 -mca btl ^openib -mca plm_rsh_no_tree_spawn true"
        assert env["OPENMPI_EXTRA_ARGS"] == ""
        assert env["TUNE_ENV_FILE"] == "/tmp/env_for_user_process"
        assert env["OPENMPI_NP"] == "6" and env["OPENMPI_HOST_FILE_PATH"] == "/etc/mpi/hostfile"
        # seed 004's run_mpi.sh: MA_NUM_HOSTS, MA_VJ_NAME, and its ${VC_TASK_INDEX:-${VK_TASK_INDEX}}
        assert env["MA_NUM_HOSTS"] == "3" and env["MA_VJ_NAME"] == "job-1"
        assert env["VC_TASK_INDEX"] == env["VK_TASK_INDEX"] == env["MA_TASK_INDEX"] == str(node.task.index)
    # only worker-0 runs the step that writes the file (the others wait for mpirun)
    assert plans[0].argv[:4] == HEAD and all(p.argv[:4] != HEAD for p in plans[1:])
    # a job's own value of an argument variable wins: they are the seed's defaults
    spec = _mpi(env={"OPENMPI_EXTRA_ARGS": "--oversubscribe", "OPENMPI_BIND_ARGS": "--bind-to core"})
    head = plan_job(spec, placement_for(spec, card_spec(2)))[0]
    assert (
        head.env["OPENMPI_EXTRA_ARGS"] == "--oversubscribe"
        and head.env["OPENMPI_BIND_ARGS"] == "--bind-to core"
    )
    assert "OPENMPI_EXTRA_ARGS" in head.job_env


def test_each_difference_from_the_seed_prefix_is_noted_with_its_reason():
    spec = _mpi()
    notes = " | ".join(plan_job(spec, placement_for(spec, card_spec(4)))[0].notes)
    assert "two dashes: this Open MPI 5 refuses the seed's -bind-to" in notes
    assert "--stdin none added: Open MPI 5" in notes
    assert "--oversubscribe" not in notes and "NCCL_DEBUG" not in notes


def test_a_backend_without_a_remote_shell_cannot_plan_mpi_jobs():
    import pytest

    from ma_jupyter.errors import InvalidSpec

    spec = _mpi()
    with pytest.raises(InvalidSpec, match="no remote shell for MPI") as refused:
        plan_job(spec, replace(placement_for(spec, card_spec(4)), remote_shell=None))
    assert refused.value.field == "mode"


def test_a_jobs_own_nccl_debug_is_forwarded_instead_of_the_seeds_info():
    spec = _mpi(env={"NCCL_DEBUG": "WARN"})
    head = plan_job(spec, placement_for(spec, card_spec(4)))[0]
    assert (
        _forwarded(head.argv) == ["NCCL_DEBUG", "LD_LIBRARY_PATH", "PATH"]
        and head.env["NCCL_DEBUG"] == "WARN"
    )
    assert any("the job's own NCCL_DEBUG" in n for n in head.notes)


def test_hostfile_slots_are_the_cards_where_the_spec_has_cards():
    spec = _mpi(nodes=2)
    placement = placement_for(spec, card_spec(2))
    placement = replace(placement, tasks=tuple(replace(t, cpus=(0, 1, 2, 3)) for t in placement.tasks))
    head = plan_job(spec, placement)[0]
    assert head.files["/etc/mpi/hostfile"] == "worker-0 slots=2\nworker-1 slots=2\n"
    assert head.env["OPENMPI_NP"] == "4"


def test_a_cpu_job_has_no_card_count():
    spec = _mpi(nodes=2)
    head = plan_job(spec, placement_for(spec, SPECS["cpu.medium"]))[0]
    assert "MA_NUM_GPUS" not in head.env and head.env["OPENMPI_NP"] == "2"


def test_a_bash_c_command_behind_worker_0s_step_is_left_to_its_shell():
    command = 'bash -c "X=1; mpirun -np ${OPENMPI_NP} -tune ${TUNE_ENV_FILE} echo $X"'
    spec = _mpi(command)
    head = plan_job(spec, placement_for(spec, card_spec(2)))[0]
    # the platform expands nothing in the shell's script, even behind its own step
    assert expand_argv(head.argv, head.env) == [*HEAD, *parse_command(command)]


#: seed 003's launch command, pasted as its page prints it: one option per line, the argument
#: variables unquoted (each several words, OPENMPI_EXTRA_ARGS empty)
SEED_003_PASTED = """mpirun \\
-np ${OPENMPI_NP} \\
-hostfile ${OPENMPI_HOST_FILE_PATH} \\
-mca plm_rsh_args "-p ${SSHD_PORT}" \\
-tune ${TUNE_ENV_FILE} \\
${OPENMPI_BIND_ARGS} \\
${OPENMPI_X_ARGS} \\
${OPENMPI_MCA_ARGS} \\
${OPENMPI_EXTRA_ARGS} \\
python /workspace/algorithm/train.py --epochs 2"""


def test_seed_003s_command_pasted_as_written_gives_mpirun_each_word():
    spec = _mpi(SEED_003_PASTED, env={"OPENMPI_EXTRA_ARGS": "--oversubscribe"})
    head = plan_job(spec, placement_for(spec, card_spec(2)))[0]
    argv = expand_argv(head.argv, head.env)
    assert argv == [
        *HEAD,
        *"mpirun -np 4 -hostfile /etc/mpi/hostfile -mca plm_rsh_args".split(),
        f"-p {head.env.get('SSHD_PORT', '')}",
        *"-tune /tmp/env_for_user_process --bind-to none --map-by slot".split(),
        *head.env["OPENMPI_X_ARGS"].split(),
        *"-mca pml ob1 -mca btl ^openib -mca plm_rsh_no_tree_spawn true".split(),
        "--oversubscribe",
        *"python /workspace/algorithm/train.py --epochs 2".split(),
    ]
    assert any("OPENMPI_BIND_ARGS, OPENMPI_X_ARGS" in n and "as seed 003's shell" in n for n in head.notes)
    # the seed's empty OPENMPI_EXTRA_ARGS is no word at all, as in its shell
    spec = _mpi(SEED_003_PASTED)
    argv = plan_job(spec, placement_for(spec, card_spec(2)))[0].argv
    assert "" not in argv and "${OPENMPI_EXTRA_ARGS}" not in argv
    assert argv[argv.index("true") + 1 :] == "python /workspace/algorithm/train.py --epochs 2".split()
    # a secret value is never written into the argv a dry run shows: it stays one reference
    spec = _mpi(SEED_003_PASTED, secret_env={"OPENMPI_EXTRA_ARGS": "--mca x y"})
    assert "${OPENMPI_EXTRA_ARGS}" in plan_job(spec, placement_for(spec, card_spec(2)))[0].argv
    # inside bash -c its shell splits them: left alone
    text = 'bash -c "mpirun ${OPENMPI_BIND_ARGS} python t.py"'
    spec = _mpi(text)
    assert plan_job(spec, placement_for(spec, card_spec(2)))[0].argv == [*HEAD, *parse_command(text)]
