"""ssh between a job's nodes, planned (modes/ssh.py) and the node side's formats (nodeside/ssh_node.py):
what every node of an MPI or DeepSpeed job gets where its backend runs OpenSSH in the nodes."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import replace

import pytest

from ma_jupyter.backends.local import LocalBackend
from ma_jupyter.commands import expand_argv, parse_command
from ma_jupyter.models import JobSpec
from ma_jupyter.modes import plan_job
from ma_jupyter.nodehost.view import sshd_nsswitch_conf, sshd_passwd
from ma_jupyter.nodeside import ssh_node

from .placements import card_spec, placement_for

SSH_NODE = ["python", "-m", "ma_jupyter.nodeside.ssh_node"]


def _ssh_placement(spec: JobSpec, flavor=None):
    return replace(placement_for(spec, flavor), remote_shell=LocalBackend.ssh_shell)


def test_an_mpi_job_runs_sshd_on_every_node_and_mpirun_waits_for_the_others():
    spec = JobSpec(name="hvd", mode="horovod", nodes=3, command="python /workspace/algorithm/train.py")
    plans = plan_job(spec, _ssh_placement(spec, card_spec(2)))
    head, *others = plans
    # one SSHD_PORT for the job (worker-0's last reserved port), each node on its own address
    assert {p.env["SSHD_PORT"] for p in plans} == {"20011"}
    assert head.argv[:7] == [*SSH_NODE, "--listen", "127.0.1.1", "--wait", "worker-1,worker-2"]
    # then worker-0's MPI head step (its tune file), then mpirun
    assert head.argv[7:13] == ["--", "python", "-m", "ma_jupyter.nodeside.mpi_head", "--", "mpirun"]
    assert head.primary
    for k, node in enumerate(others, start=2):
        assert node.argv == [*SSH_NODE, "--listen", f"127.0.1.{k}"] and not node.primary
    for node in plans:
        config = node.files["/etc/ssh/ssh_config"]
        assert "Port 20011" in config and "BatchMode yes" in config and "StrictHostKeyChecking yes" in config
        assert node.env["OMPI_MCA_plm_rsh_agent"] == node.env["PRTE_MCA_plm_ssh_agent"] == "ssh"
        assert node.files["/etc/mpi/hostfile"] == "worker-0 slots=2\nworker-1 slots=2\nworker-2 slots=2\n"


def test_a_plain_deepspeed_command_runs_on_node_0_only_and_reaches_the_others_over_ssh():
    command = "deepspeed /workspace/algorithm/train.py --deepspeed --deepspeed_config ds.json"
    spec = JobSpec(name="ds", mode="pytorch-deepspeed", nodes=2, command=command)
    head, other = plan_job(spec, _ssh_placement(spec))
    assert head.argv == [*SSH_NODE, "--listen", "127.0.1.1", "--wait", "worker-1", "--", *command.split()]
    assert head.primary and not other.primary
    assert other.argv == [*SSH_NODE, "--listen", "127.0.1.2"]
    for node in (head, other):
        assert node.files["/job/hostfile"] == "worker-0 slots=1\nworker-1 slots=1\n"
        assert node.env["SSHD_PORT"] == "20011" and "/etc/ssh/ssh_config" in node.files
    # --no_ssh: every node starts its own processes, each still reachable over ssh
    own = spec.model_copy(update={"command": command.replace("deepspeed ", "deepspeed --no_ssh ", 1)})
    plans = plan_job(own, _ssh_placement(own))
    assert all(p.primary and p.argv[-len(command.split()) - 1 :][0] == "deepspeed" for p in plans)
    assert [p.argv[:5] for p in plans] == [
        [*SSH_NODE, "--listen", "127.0.1.1"],
        [*SSH_NODE, "--listen", "127.0.1.2"],
    ]
    # without sshd in the nodes (the agent, or the Ray backend) nothing changes
    plain = plan_job(spec, placement_for(spec))
    assert all(p.argv == command.split() and "SSHD_PORT" not in p.env for p in plain)


def test_the_node_account_gets_a_login_shell_and_a_shadow_sshd_can_use():
    host = "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    assert (
        sshd_passwd(host, 65534)
        == "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/tmp:/bin/sh\n"
    )
    text = "passwd: files systemd\nshadow:         files systemd\nhosts: files\n"
    assert sshd_nsswitch_conf(text) == "passwd: files systemd\nhosts: files\nshadow: files\n"


@pytest.mark.skipif(not shutil.which("ssh-keygen"), reason="needs OpenSSH's ssh-keygen")
def test_the_attempt_keys_are_openssh_ed25519_keys_made_from_the_attempt_secret(tmp_path):
    seed = ssh_node.derive_seed("secret-of-attempt-1", "user")
    public = ssh_node.ed25519_public(seed)
    key = tmp_path / "id"
    key.write_text(ssh_node.private_file(seed, public, "c"))
    os.chmod(key, 0o600)
    derived = subprocess.run(["ssh-keygen", "-y", "-f", str(key)], capture_output=True, text=True, timeout=30)
    assert derived.stdout.split()[:2] == ssh_node.public_line(public).split()
    # another attempt, another key; the host key differs from the user key
    assert ssh_node.derive_seed("secret-of-attempt-2", "user") != seed
    assert ssh_node.derive_seed("secret-of-attempt-1", "host") != seed


def test_a_dry_run_shows_the_sshd_port_as_reserved_at_launch_not_0():
    spec = JobSpec(name="hvd", mode="horovod", nodes=2, command="python /workspace/algorithm/train.py")
    placement = _ssh_placement(spec, card_spec(2))
    dry = replace(placement, tasks=tuple(replace(t, ports=(0, 0)) for t in placement.tasks))
    for node in plan_job(spec, dry):
        assert node.env["SSHD_PORT"] == "<reserved at launch>"
        config = node.files["/etc/ssh/ssh_config"]
        assert "Port 0" not in config and "# Port <reserved at launch>" in config
        assert not any(":0 " in note for note in node.notes), node.notes


def test_a_bash_c_script_behind_the_nodes_sshd_is_left_to_its_shell():
    """The ``bash -c`` rule (commands.expand_argv) holds behind each node's sshd step too: the
    platform expands nothing in the script, whose shell expands its own variables (``$f``)."""
    script = 'for f in *; do echo "$f" ${OPENMPI_NP}; done; mpirun -np ${OPENMPI_NP} hostname'
    for mode in ("horovod", "pytorch-deepspeed"):
        command = f"bash -c '{script.replace('mpirun', 'deepspeed' if mode != 'horovod' else 'mpirun')}'"
        spec = JobSpec(name="sh", mode=mode, nodes=2, command=command)
        head = plan_job(spec, _ssh_placement(spec, card_spec(2)))[0]
        assert head.argv[:3] == SSH_NODE, head.argv
        assert expand_argv(head.argv, head.env)[-3:] == parse_command(command), mode
