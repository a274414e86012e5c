"""The remote shells a machine's nodes offer MPI (:class:`~ma_jupyter.modes.base.RemoteShell`).

Which one a placement gets is its backend's choice (the local backend's ``bind``, the Ray
backend's overlay plan): these are the four there are, by what the nodes' network is and
whether OpenSSH's server runs in them.
"""

from __future__ import annotations

from ..modes.base import RemoteShell
from . import network as network_ns
from . import rsh_agent

#: OpenSSH's server, as the nodes run it (:mod:`ma_jupyter.nodeside.ssh_node`)
SSHD_PROGRAM = "/usr/sbin/sshd"

#: mpirun reaches the other simulated nodes through an agent that enters their sandboxes
AGENT = RemoteShell(
    agent="python -m ma_jupyter.nodehost.rsh_agent",
    serve=(
        "python",
        "-m",
        "ma_jupyter.nodehost.rsh_agent",
        "--serve",
        "--job",
        "{job}",
        "--host",
        "{host}",
    ),
    interface=network_ns.SHARED_INTERFACE,  # nodes sharing the host's network: its loopback
)
#: the same where each node is a machine on its job's network: the agent reaches a node's
#: server on a TCP port of its address (abstract socket names are each node's own), and
#: the node's one interface is the job network's
AGENT_ON_JOB_NETWORK = RemoteShell(
    agent=f"{AGENT.agent} --port={rsh_agent.JOB_NETWORK_PORT}",
    serve=(*AGENT.serve, "--port", str(rsh_agent.JOB_NETWORK_PORT)),
    interface=network_ns.NODE_INTERFACE,
)
#: where sshd is installed and nodes are sandboxed: OpenSSH in every node (modes/ssh.py), as
#: a real cluster's nodes have it; the agent above stays for machines without openssh-server
SSH = RemoteShell(agent="ssh", serve=(), interface=network_ns.SHARED_INTERFACE, sshd=True)
#: the same where each node is a machine on its job's network
SSH_ON_JOB_NETWORK = RemoteShell(agent="ssh", serve=(), interface=network_ns.NODE_INTERFACE, sshd=True)
