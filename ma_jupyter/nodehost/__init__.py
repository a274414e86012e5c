"""The machinery that hosts one node of a job on one machine, run by both backends.

The node's view (what it sees where) and the bubblewrap argv that makes it, its launches, its
working copy, the mounts and the host's policy over them, images, caches, the node runner and its
fork server, the agents a node's processes talk to, and the readers of what a node wrote.  The
local backend (``backends/local/``) runs it on this machine; the Ray backend runs it on each Ray
node.  Code that runs *inside* a node, under the job's interpreter, is ``nodeside/``.

Import-free on purpose: ``python -m ma_jupyter.nodehost.rsh_agent`` runs inside a node under the
job's own interpreter, which may lack everything but the standard library.
"""
