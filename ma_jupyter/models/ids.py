"""The shapes of a job's id and a node's name, and the check a front end makes of an id or a
node it did not get from the service (a notebook's output) before it acts on it."""

from __future__ import annotations

import re

#: A job's id as the service makes it (the name's start, ``-`` and random hex: letters, digits,
#: ``_ -``) and a node's name (``ROLE-INDEX``: ``worker-0``, ``ps-1``, ``task-3``): what a front end
#: checks an id or node it did not get from the service against (a notebook's output) before it
#: acts on it. No space, no control character, no leading ``-``.
JOB_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
NODE_NAME_PATTERN = r"^[a-z]+-[0-9]{1,6}$"


def check_node_target(job_id: object, node: object) -> tuple[str, str]:
    """``(job_id, node)`` when both are strings of :data:`JOB_ID_PATTERN` and
    :data:`NODE_NAME_PATTERN` (the whole string: no trailing newline either).

    Raises:
        InvalidSpec: naming the field (``job`` or ``node``), the value as Python writes it
            (control characters escaped) and the shape expected.
    """
    from ..errors import InvalidSpec

    if not isinstance(job_id, str) or not re.fullmatch(JOB_ID_PATTERN, job_id):
        raise InvalidSpec(
            f"not a job id: {job_id!r}: a job id is 1 to 128 letters, digits, '_', '.' or '-', "
            "starting with a letter or digit (as `ma-jupyter jobs` shows it)",
            field="job",
        )
    if not isinstance(node, str) or not re.fullmatch(NODE_NAME_PATTERN, node):
        raise InvalidSpec(
            f"not a node name: {node!r}: a node is ROLE-INDEX, e.g. worker-0, ps-1, task-3 "
            "(as `ma-jupyter get JOB` lists them)",
            field="node",
        )
    return job_id, node
