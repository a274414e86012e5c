"""The runner's instructions (``nodehost/instructions.py``): a typed, versioned record whose file
refuses what it was not made for, and a runner that runs nothing from such a file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ma_jupyter.nodehost.instructions import VERSION, RunnerInstructions

ROOT = Path(__file__).resolve().parents[2]


def _record(tmp_path: Path) -> RunnerInstructions:
    return RunnerInstructions(
        node="worker-0",
        node_dir=str(tmp_path / "nodes" / "worker-0"),
        rank_log_dir=str(tmp_path / "ranks"),
        sandbox="symlink",
        argv=[sys.executable, "-c", "print('ran')"],
        env={"PATH": "/usr/bin:/bin"},
        cpus=[0],
        memory_gb=0.5,
        cgroup={"memory": "/sys/fs/cgroup/x", "name": "n"},
        deny_tcp=[[1, 2]],
        end_with={"pid": 1, "start": 1.5, "what": "the host"},
    )


def test_the_file_holds_every_field_and_the_version_and_reads_back_equal(tmp_path):
    record = _record(tmp_path)
    path = tmp_path / "node-run.json"
    path.write_text("stale")
    os.chmod(path, 0o644)  # an earlier attempt's file: written over, and made private again
    record.write(path)
    assert path.stat().st_mode & 0o777 == 0o600
    data = json.loads(path.read_text())
    assert data["version"] == VERSION
    assert set(data) == {"version", *(f for f in RunnerInstructions.__dataclass_fields__)}
    assert RunnerInstructions.read(path) == record


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"version": VERSION + 1}, f"of version {VERSION + 1}"),
        ({"version": None}, "of version None"),
        ({"sandbox_kind": "x"}, "unknown key(s) in the runner's instructions: sandbox_kind"),
        ({"argv": "python train.py"}, "argv of the runner's instructions must be list[str], not str"),
        ({"max_processes": True}, "max_processes of the runner's instructions must be int, not bool"),
        ({"memory_gb": "2"}, "memory_gb of the runner's instructions must be float | None, not str"),
    ],
)
def test_a_file_of_another_version_an_unknown_key_or_a_wrong_type_is_refused(tmp_path, change, said):
    data = {**json.loads(_record(tmp_path).to_json()), **change}
    with pytest.raises(ValueError) as caught:
        RunnerInstructions.from_json(json.dumps(data))
    assert said in str(caught.value)


def test_a_missing_key_or_no_object_is_refused(tmp_path):
    data = json.loads(_record(tmp_path).to_json())
    del data["node_dir"]
    with pytest.raises(ValueError, match="lack node_dir"):
        RunnerInstructions.from_json(json.dumps(data))
    with pytest.raises(ValueError, match="not a JSON object"):
        RunnerInstructions.from_json("[1]")
    with pytest.raises(ValueError, match="not JSON"):
        RunnerInstructions.from_json(b"{")


def test_a_runner_given_instructions_of_another_version_runs_nothing_and_says_why(tmp_path):
    """The real runner (``python -m ma_jupyter.nodehost.noderun``): the command would write a
    file; from a file of another version it never starts, and the log says why."""
    ran = tmp_path / "ran"
    record = _record(tmp_path)
    data = json.loads(record.to_json())
    data.update(version=VERSION + 1, argv=[sys.executable, "-c", f"open({str(ran)!r}, 'w')"], cgroup=None)
    path = tmp_path / "node-run.json"
    path.write_text(json.dumps(data))
    done = subprocess.run(
        [sys.executable, "-m", "ma_jupyter.nodehost.noderun", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 2
    assert f"cannot read the runner's instructions: {path}: " in done.stderr
    assert f"of version {VERSION + 1}" in done.stderr
    assert not ran.exists()


def test_the_service_still_reads_the_plain_object_an_earlier_version_gave_its_runner(tmp_path):
    """A node launched before the record had a version outlives an upgrade: the service reads
    its plain object (for the stop relay, the debug terminal, the leftover sweep); the runner
    never runs one."""
    record = json.loads(_record(tmp_path).to_json())
    del record["version"]
    record["shell_agent"] = None
    plain = json.dumps(record)
    with pytest.raises(ValueError, match="version None"):
        RunnerInstructions.from_json(plain)
    read = RunnerInstructions.from_json(plain, unversioned=True)
    assert read.shell_agent is False and read.sandbox == _record(tmp_path).sandbox
