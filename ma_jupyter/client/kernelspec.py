"""The kernelspec of a dev environment, installed for the caller (``ma-jupyter devenv JOB
--kernel``, ``%ma_devenv JOB --kernel``): a notebook opened with it runs its code in the job's
node, through :mod:`.kernel_bridge`.

It lies in the user's kernelspec folder (``$JUPYTER_DATA_DIR/kernels``, by default
``~/.local/share/jupyter/kernels``), named after the job and node (:func:`kernel_name`), shown
as ``ma_jupyter: <job name> (<node>)``.  Its argv is this interpreter running the bridge, so
nothing needs installing into an environment; its ``env`` names this machine's service (its
home folder, and the service's URL when one was given), never a token: the bridge finds the
token as every client of this account does.  ``interrupt_mode`` is ``message``: the bridge's
process is not the kernel's, so a signal to it would interrupt nothing.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

from jupyter_core.paths import jupyter_data_dir

from .. import config
from ..models import Job
from .http import ENV_URL


def kernel_name(job: Job, node: str) -> str:
    """``ma_jupyter-<job name>-<node>``, in the characters a kernelspec name allows."""
    raw = f"ma_jupyter-{job.name}-{node}".lower()
    return re.sub(r"[^a-z0-9._-]", "-", raw)


def install_devenv_kernel(job: Job, node: str, devenv: Job | None = None) -> tuple[str, Path]:
    """Install (or replace) the kernelspec of ``job``'s ``node`` for this account; ``devenv``: the
    dev environment already started, which the kernel attaches to while it lives.

    Returns:
        The kernelspec's name and its folder.
    """
    name = kernel_name(job, node)
    folder = Path(jupyter_data_dir()) / "kernels" / name
    folder.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "ma_jupyter.client.kernel_bridge", "--job", job.id, "--node", node]
    if devenv is not None:
        argv += ["--devenv", devenv.id]
    env = {config.ENV_HOME: str(config.home())}
    if os.environ.get(ENV_URL):
        env[ENV_URL] = os.environ[ENV_URL]
    spec = {
        "argv": [*argv, "-f", "{connection_file}"],
        "display_name": f"ma_jupyter: {job.name} ({node})",
        "language": "python",
        "interrupt_mode": "message",
        "env": env,
        "metadata": {"ma_jupyter": {"job": job.id, "node": node}},
    }
    temporary = folder / "kernel.json.tmp"
    temporary.write_text(json.dumps(spec, indent=1))
    os.replace(temporary, folder / "kernel.json")
    return name, folder
