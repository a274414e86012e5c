"""ssh between a job's nodes, as Kubeflow's MPI operator and ModelArts give it: what a mode adds
to each node's plan when its backend runs OpenSSH in the nodes (``RemoteShell.sshd``).

Every node of the job gets (pure: the keys are made inside the nodes, see
:mod:`ma_jupyter.nodeside.ssh_node`):

1. ``SSHD_PORT`` (seed 003): the port every node's sshd listens on, one number for the whole
   job, each node on its own address: worker-0's last reserved port, which the backend reserved
   on every address; a dry run reserves none and shows :data:`PORT_AT_LAUNCH` instead (its
   ``ssh_config`` says so in a comment where the ``Port`` line goes);
2. ``/etc/ssh/ssh_config``, the node's own client configuration: that port, the attempt's key
   and host key (``~/.ssh``), no password or host-key prompt, so ``ssh worker-1 hostname`` (the
   names of the hostfiles and ``/etc/hosts``) works as written, and so do mpirun's ``-mca
   plm_rsh_args "-p ${SSHD_PORT}"`` and DeepSpeed's pdsh;
3. its command behind ``python -m ma_jupyter.nodeside.ssh_node --listen <its address>``: the
   node's sshd starts first; a node that launches the others (``launcher=True``) waits until
   every peer's sshd answers before its command runs; a node without a command runs sshd only
   (it waits for the launcher, as a real cluster's nodes do, and is not primary).
"""

from __future__ import annotations

from .base import NodePlan, Placement, TaskSlot

SSH_CONFIG = "/etc/ssh/ssh_config"
SSH_NODE_MODULE = "ma_jupyter.nodeside.ssh_node"
#: where ssh_node keeps the node's keys (the account's ``~/.ssh``; mirrored from ssh_node)
KEY_DIR = "/tmp/.ssh"
#: the alias of the host key every node of an attempt shows (mirrored from ssh_node)
HOST_KEY_ALIAS = "ma_jupyter-job-node"
#: what a dry run shows for SSHD_PORT: no port is reserved before the launch
PORT_AT_LAUNCH = "<reserved at launch>"


def sshd_port(placement: Placement) -> int:
    """Rule 1: the job's SSHD_PORT (worker-0's last reserved port; 0 when none is reserved)."""
    workers = placement.workers
    return workers[0].ports[-1] if workers and workers[0].ports else 0


def client_config(port: int) -> str:
    """Rule 2: the node's ``/etc/ssh/ssh_config``."""
    return "\n".join(
        [
            "# ssh between the nodes of this job (ma_jupyter): the attempt's key, one host key",
            "Host *",
            f"    Port {port}" if port else f"    # Port {PORT_AT_LAUNCH} (the job's SSHD_PORT)",
            f"    IdentityFile {KEY_DIR}/id_ed25519",
            "    IdentitiesOnly yes",
            f"    UserKnownHostsFile {KEY_DIR}/known_hosts",
            "    GlobalKnownHostsFile /dev/null",
            f"    HostKeyAlias {HOST_KEY_ALIAS}",
            "    StrictHostKeyChecking yes",
            "    CheckHostIP no",
            "    UpdateHostKeys no",
            "    BatchMode yes",
            "    PasswordAuthentication no",
            "    ConnectTimeout 60",
            "    LogLevel ERROR",
            "",
        ]
    )


def node_argv(task: TaskSlot, command: list[str], peers: list[TaskSlot] | None = None) -> list[str]:
    """Rule 3: ``command`` behind the node's sshd (``peers``: wait for theirs first)."""
    argv = ["python", "-m", SSH_NODE_MODULE, "--listen", task.address]
    if peers:
        argv += ["--wait", ",".join(p.hostname for p in peers)]
    return argv + (["--", *command] if command else [])


def add_ssh(plans: list[NodePlan], placement: Placement, launcher: NodePlan | None = None) -> None:
    """Give every node of ``plans`` its sshd, SSHD_PORT and client configuration (rules 1-3);
    ``launcher`` waits for every other node's sshd before its command runs."""
    port = sshd_port(placement)
    for node in plans:
        peers = [p.task for p in plans if p is not node] if node is launcher else None
        node.argv = node_argv(node.task, node.argv, peers)
        node.env["SSHD_PORT"] = str(port) if port else PORT_AT_LAUNCH
        node.files[SSH_CONFIG] = client_config(port)
        node.notes.append(f"sshd on {node.task.address}:{port or PORT_AT_LAUNCH} (the job's key only)")
