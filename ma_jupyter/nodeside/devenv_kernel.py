"""A dev environment's command: ``python -m ma_jupyter.nodeside.devenv_kernel`` (standard
library only), run inside the node's sandbox by the job's own interpreter.

The node shows its kernel folder, ``<job folder>/nodes/<node>/kernel`` on the host, writable at
:data:`KERNEL_VIEW`; nothing else of the node reaches the Jupyter server (the node has its own
network namespace).  The kernel bridge (:mod:`ma_jupyter.client.kernel_bridge`) writes the
kernel's connection file there once the job runs, and relays Jupyter's TCP ports to the
kernel's ZMQ ``ipc://`` sockets in the same folder: itself where the folder is on its machine,
through the relay of the Ray node's agent on Ray (:mod:`ma_jupyter.backends.ray.kernel_relay`).

Contract, in order:

1. without ``ipykernel`` importable by this interpreter: one line saying so and what to install,
   exit 3 (the job fails with that line in its reason);
2. wait for :data:`CONNECTION_FILE` (written whole by the bridge: made under a temporary name,
   then linked to its own), at most :data:`ATTACH_TIMEOUT` seconds: a dev environment made
   before its notebook opens waits for it, and one nobody opens ends (exit 0, saying so) instead
   of holding its node and cards for ever;
3. exec ``ipykernel_launcher -f <connection file>``: the kernel binds ``ipc://<KERNEL_VIEW>/k-<N>``
   and runs until Jupyter shuts it down (then the job ends) or the job is stopped.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time

#: where a dev environment's node sees its kernel folder
KERNEL_VIEW = "/run/ma_jupyter/kernel"
#: the kernel folder's name in the node's folder of the job (host side)
KERNEL_FOLDER = "kernel"
#: the connection file the bridge writes into the kernel folder
CONNECTION_FILE = "connection.json"
#: the socket path prefix, relative to the kernel folder: sockets are ``k-1`` ... ``k-5``
SOCKET_PREFIX = "k"
#: the five channels' socket numbers (``k-<N>``) in the connection file
CHANNEL_PORTS = {"shell_port": 1, "iopub_port": 2, "stdin_port": 3, "control_port": 4, "hb_port": 5}

#: seconds a dev environment waits for its first notebook before it ends (rule 2)
ATTACH_TIMEOUT = 3600

NO_IPYKERNEL = 3
#: what the line saying so holds (the backend makes it the failed job's reason)
NO_IPYKERNEL_SAYS = "has no ipykernel, which a dev environment's kernel runs on"


def main() -> int:
    folder = os.environ.get("MA_DEVENV_KERNEL_DIR", KERNEL_VIEW)
    if importlib.util.find_spec("ipykernel") is None:
        print(
            f"this job's interpreter ({sys.executable}) {NO_IPYKERNEL_SAYS}: install it in the job's image (e.g. `{sys.executable} -m pip install ipykernel`), "
            "then create the dev environment again",
            file=sys.stderr,
            flush=True,
        )
        return NO_IPYKERNEL
    path = os.path.join(folder, CONNECTION_FILE)
    print(f"dev environment: waiting for a notebook to attach ({path})", flush=True)
    deadline = time.monotonic() + ATTACH_TIMEOUT
    while not os.path.exists(path):
        if time.monotonic() > deadline:  # rule 2: what it holds is freed for others
            print(
                f"dev environment: no notebook attached within {ATTACH_TIMEOUT // 60} minutes: ending it to "
                "free its node (opening a notebook with its kernel starts a new one)",
                flush=True,
            )
            return 0
        time.sleep(0.1)
    print("dev environment: a notebook attached, starting the kernel", flush=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", path]
    os.execv(sys.executable, argv)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
