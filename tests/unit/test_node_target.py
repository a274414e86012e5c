"""A job id and a node name a front end did not get from the service (a notebook's output) are
checked against the wire model's patterns before anything acts on them: in Python
(:func:`ma_jupyter.models.check_node_target`, the server extension and ``%ma_shell``) and in the
browser (the same patterns as ``models.ts`` exports them, run here by Node.js)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from ma_jupyter import tsgen
from ma_jupyter.errors import InvalidSpec
from ma_jupyter.models import JOB_ID_PATTERN, NODE_NAME_PATTERN, check_node_target
from ma_jupyter.service.supervisor.actions import new_job_id

# the reproduction's id: ^U erases a line typed into a shell, \r runs what follows it
HOSTILE_JOB = "train-1\u0015touch /tmp/pwned\r"
BAD_IDS = [
    HOSTILE_JOB,
    "train-1\rtouch /tmp/pwned",
    "train-1\n",  # Python's `$` would match before this newline: the check takes the whole string
    "train-1 --node worker-0",
    "--help",
    "-rf",
    "a;touch x",
    "$(touch x)",
    "`touch x`",
    "a'b",
    "a/b",
    "../x",
    "é-1",
    "a\x00",
    "a\x1b[2J",
    "",
    "x" * 129,
]
BAD_NODES = [
    "worker-0\u0015touch x\r",
    "worker-0\n",
    "worker-0 ",
    "worker",
    "-n",
    "Worker-0",
    "w-1234567",
    "",
]
GOOD_NODES = ["worker-0", "worker-15", "ps-1", "chief-0", "task-3"]


@pytest.mark.parametrize("name", ["train", "My Job.v2", "a" * 63, "---x", "_x_", "...", "9.9"])
def test_every_id_the_service_makes_is_a_job_id(name):
    job_id = new_job_id(name)
    assert re.fullmatch(JOB_ID_PATTERN, job_id)
    assert check_node_target(job_id, "worker-0") == (job_id, "worker-0")


@pytest.mark.parametrize("job_id", BAD_IDS)
def test_a_hostile_job_id_is_refused_with_its_control_characters_escaped(job_id):
    with pytest.raises(InvalidSpec) as refused:
        check_node_target(job_id, "worker-0")
    assert refused.value.field == "job"
    assert refused.value.message.startswith(f"not a job id: {job_id!r}")
    assert not any(ord(c) < 32 for c in refused.value.message)  # safe to show anywhere


@pytest.mark.parametrize("node", BAD_NODES)
def test_a_hostile_node_name_is_refused(node):
    with pytest.raises(InvalidSpec) as refused:
        check_node_target("train-1-a1b2c3", node)
    assert refused.value.field == "node" and "ROLE-INDEX" in refused.value.message


@pytest.mark.parametrize("value", [None, 7, ["train-1"], {"id": "x"}])
def test_a_value_not_a_string_is_refused(value):
    with pytest.raises(InvalidSpec, match="not a job id"):
        check_node_target(value, "worker-0")
    with pytest.raises(InvalidSpec, match="not a node name"):
        check_node_target("train-1", value)


def test_the_browser_checks_the_same_patterns_as_the_service_side():
    """models.ts's RegExps (as tsgen exports them) accept exactly what the Python check accepts."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("Node.js is not installed")
    exported = dict(re.findall(r'export const (\w+_PATTERN) = new RegExp\((".*")\);', tsgen.generate()))
    assert set(exported) == {"JOB_ID_PATTERN", "NODE_NAME_PATTERN"}
    samples = {
        "JOB_ID_PATTERN": BAD_IDS + [new_job_id("train"), "train-1", "a", "A.b_c-9", "x" * 128],
        "NODE_NAME_PATTERN": BAD_NODES + GOOD_NODES,
    }
    script = (
        "const patterns = {"
        + ",".join(f"{name}: new RegExp({source})" for name, source in exported.items())
        + "};"
        + f"const samples = {json.dumps(samples)};"
        + "const out = {};"
        + "for (const [name, values] of Object.entries(samples)) out[name] = values.map(v => patterns[name].test(v));"
        + "process.stdout.write(JSON.stringify(out));"
    )
    in_browser = json.loads(
        subprocess.run([node, "-e", script], capture_output=True, text=True, check=True).stdout
    )
    for name, values in samples.items():
        python = [
            re.fullmatch({"JOB_ID_PATTERN": JOB_ID_PATTERN, "NODE_NAME_PATTERN": NODE_NAME_PATTERN}[name], v)
            is not None
            for v in values
        ]
        assert in_browser[name] == python, name
    assert in_browser["JOB_ID_PATTERN"][: len(BAD_IDS)] == [False] * len(BAD_IDS)
    assert in_browser["NODE_NAME_PATTERN"][len(BAD_NODES) :] == [True] * len(GOOD_NODES)
