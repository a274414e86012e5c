"""The host paths a job names, looked for on the Ray node that is to run it, before anything
starts there: a dataset, model, annotation set, volume or outputs folder given as a host path,
and the image's interpreter, must exist at the same path on every Ray node (shared storage, or
copies put there by the admin).  A Ray node that lacks one refuses the launch, naming itself
and each path it lacks, instead of a node failing later inside its sandbox.

The algorithm folder is shipped (never looked for), a job's own folders (its outputs default,
data preparation's links, made by the agent) are below its job folder, and a mount the node
creates itself (``create``) is made there.
"""

from __future__ import annotations

import os

from ...errors import InvalidSpec
from ...models import NodeLaunch

#: mounts of host paths the job names (the others are the platform's own)
NAMED_KINDS = ("dataset", "model", "annotation", "volume", "outputs")


def missing(launches: list[NodeLaunch], job_dir: str) -> list[str]:
    """What of ``launches``' named host paths this machine lacks, one line each."""
    lines: list[str] = []
    below = job_dir.rstrip("/") + "/"
    for launch in launches:
        for mount in launch.mounts:
            if mount.kind not in NAMED_KINDS or mount.create or mount.source.startswith(below):
                continue
            if not os.path.exists(mount.source):
                lines.append(f"{mount.kind} {mount.source} (shown at {mount.target})")
        python = launch.image.python if launch.image is not None else ""
        if python and not os.path.exists(python):
            lines.append(f"the image's interpreter {python}")
    return list(dict.fromkeys(lines))


def check(launches: list[NodeLaunch], job_dir: str, node: str) -> None:
    """Refuse the launch where this machine lacks a named host path.

    Raises:
        InvalidSpec: naming the Ray node ``node`` and every path it lacks.
    """
    lacking = missing(launches, job_dir)
    if lacking:
        raise InvalidSpec(
            f"Ray node {node} has no {'; no '.join(lacking)}: every Ray node must have each host path a "
            "job names at the same path (shared storage), or name the data in object storage (s3://)"
        )
