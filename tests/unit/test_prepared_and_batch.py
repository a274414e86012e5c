"""The prepared-data key (what makes two source states the same) and the batch end rule."""

from __future__ import annotations

import os
import pwd

from ma_jupyter.errors import RefusedFile
from ma_jupyter.models import Job, JobSpec, JobStatus, NodeRun
from ma_jupyter.nodehost import datacopy
from ma_jupyter.service import policies
from ma_jupyter.untrusted import DatasetWalk, open_dataset


def _touch_same(path, text):
    st = path.stat()
    path.write_text(text)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size, same mtime


def _digest(path, limit=datacopy.CONTENT_HASH_LIMIT) -> tuple[str, int, int]:
    fd = open_dataset(path)
    try:
        walk = DatasetWalk(str(path), limit).run(fd)
    finally:
        os.close(fd)
    return walk.digest(), walk.bytes, walk.files


def test_small_trees_are_keyed_by_content_large_ones_by_metadata(tmp_path):
    data = tmp_path / "d"
    data.mkdir()
    (data / "a.txt").write_text("one")
    key, size, files = _digest(data)
    assert (size, files) == (3, 1)
    assert _digest(data)[0] == key  # stable
    _touch_same(data / "a.txt", "two")
    small = _digest(data)[0]
    assert small != key  # contents read: an edit within one mtime tick is seen
    large = _digest(data, limit=0)[0]
    _touch_same(data / "a.txt", "six")
    assert _digest(data, limit=0)[0] == large  # metadata only
    (data / "b.txt").write_text("new")
    assert _digest(data, limit=0)[0] != large  # a file added is a new state
    changed = _digest(data, limit=0)[0]
    (data / "b.txt").chmod(0o755)
    assert _digest(data, limit=0)[0] != changed  # so is a change of its permissions
    other = tmp_path / "e"
    os.rename(data, other)
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in other.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
        (copy / f.name).chmod(f.stat().st_mode)
        os.utime(copy / f.name, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns))
    # the same files at another path are another source: never shared across paths
    assert _digest(copy)[0] == _digest(other)[0]
    assert datacopy.look(str(copy), None)[0] != datacopy.look(str(other), None)[0]
    # nor across accounts: a copy holds what its account could read
    nobody = pwd.getpwnam("nobody")
    account = datacopy.Account(nobody.pw_uid, nobody.pw_gid)
    assert datacopy.look(str(other), account)[0] != datacopy.look(str(other), None)[0]
    # a copy's state is its source's: the next look at an unchanged source finds it
    made = datacopy.copy(str(other), None, tmp_path / "into")
    assert made == datacopy.look(str(other), None)
    assert sorted(p.name for p in (tmp_path / "into" / "data").iterdir()) == ["a.txt", "b.txt"]


def _batch(**extra) -> Job:
    spec = JobSpec(name="s", type="batch", tasks=[{"command": "true"}] * 3, **extra)
    return Job(id="j", spec=spec, status=JobStatus.running)


def _run(i, state, code=None) -> NodeRun:
    return NodeRun(name=f"task-{i}", index=i, state=state, exit_code=code)


def test_batch_waits_for_every_task_and_names_the_failed_ones():
    job = _batch()
    why = lambda r: f"node {r.name} exited with code {r.exit_code}"  # noqa: E731
    assert (
        policies.on_batch(job, [_run(0, "exited", 1), _run(1, "running"), _run(2, "exited", 0)], why) is None
    )
    end = policies.on_batch(job, [_run(0, "exited", 1), _run(1, "lost"), _run(2, "exited", 0)], why)
    assert end.status is JobStatus.error and end.exit_code == 1 and end.failed.name == "task-0"
    assert (
        end.reason() == "2 of 3 task(s) failed (task-0, task-1); 1 succeeded: node task-0 exited with code 1"
    )
    ok = policies.on_batch(job, [_run(i, "exited", 0) for i in range(3)], why)
    assert ok.status is JobStatus.succeeded
    again = policies.on_batch(_batch(fault_restart={"max_restarts": 1}), [_run(0, "exited", 3)], why)
    assert again.requeue and again.status is JobStatus.queued


def test_task_states_follow_the_nodes():
    job = _batch().model_copy(update={"nodes": [_run(0, "exited", 0), _run(1, "stopped")]})
    job = Job.model_validate(job.model_dump())
    assert [(t.name, t.status, t.outputs) for t in job.tasks] == [
        ("task-0", "succeeded", "s-0"),
        ("task-1", "stopped", "s-1"),
        ("task-2", "queued", "s-2"),
    ]
    assert Job(id="r", spec=JobSpec(name="r", command="true")).tasks == []


def test_a_dataset_the_account_cannot_read_is_refused_though_the_service_could(tmp_path):
    nobody = pwd.getpwnam("nobody")
    account = datacopy.Account(nobody.pw_uid, nobody.pw_gid)
    data = tmp_path / "private"  # tmp_path's parents are the service's own (0700): never walked
    data.mkdir()
    (data / "a.txt").write_text("root only")
    data.chmod(0o700)
    assert datacopy.look(str(data), None)[1:] == (9, 1)  # the service's account reads it
    try:
        datacopy.look(str(data), account)
    except RefusedFile as exc:
        assert f"{data} cannot be read by the account the job runs as" in exc.message
    else:
        raise AssertionError("nobody read a folder only root may read")
    data.chmod(0o755)
    (data / "a.txt").chmod(0o600)
    try:
        datacopy.copy(str(data), account, tmp_path / "into")
    except RefusedFile as exc:
        assert f"{data}/a.txt cannot be read by the account the job runs as" in exc.message
    else:
        raise AssertionError("nobody copied a file only root may read")
    assert not (tmp_path / "into").exists()  # nothing half made


def test_a_dataset_holding_a_chain_too_deep_is_refused_clearly(tmp_path):
    """The dataset walk recurses a few calls a level: a 1,100-deep chain (made relative to a
    descriptor, as a user could) ended it with RecursionError, a traceback as the job's reason;
    it is refused naming the bound, and a copy of it leaves nothing."""
    import os

    import pytest

    from ma_jupyter.errors import RefusedFile
    from ma_jupyter.foldersize import remove_tree
    from ma_jupyter.untrusted import DATASET_DEPTH, DatasetWalk

    data = tmp_path / "data"
    data.mkdir()
    fd = os.open(data, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(1100):
        os.mkdir("d", dir_fd=fd)
        below = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = below
    os.close(fd)
    into = tmp_path / "into"
    into.mkdir()
    src = os.open(data, os.O_RDONLY | os.O_DIRECTORY)
    dest = os.open(into, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(RefusedFile, match=f"more than {DATASET_DEPTH} deep"):
            DatasetWalk(str(data), 0).run(src)
        with pytest.raises(RefusedFile, match=f"more than {DATASET_DEPTH} deep"):
            DatasetWalk(str(data), 0).run(src, dest)
    finally:
        os.close(src)
        os.close(dest)
        assert remove_tree(data).complete and remove_tree(into).complete
