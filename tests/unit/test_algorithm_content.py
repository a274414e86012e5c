"""The content identity of an algorithm folder (``ma_jupyter/algorithm_content.py``), rule by
rule, on real files: a folder and its snapshot share a digest, every change the job would see
makes a new one, links are recorded as links and never followed."""

from __future__ import annotations

import os
import threading
import time

import pytest

from ma_jupyter import algorithm_content
from ma_jupyter.algorithm_content import digest
from ma_jupyter.client.snapshot import copy_folder


@pytest.fixture
def algo(tmp_path, monkeypatch):
    monkeypatch.setenv("MA_JUPYTER_HOME", str(tmp_path / "home"))
    folder = tmp_path / "mnist"
    (folder / "pkg").mkdir(parents=True)
    (folder / "train.py").write_text("print('train')\n")
    (folder / "pkg" / "model.py").write_text("W = 1\n")
    run = folder / "run.sh"
    run.write_text("#!/bin/sh\npython train.py\n")
    run.chmod(0o700)
    return folder


def test_a_folder_and_its_snapshot_have_one_digest(algo, tmp_path):
    (algo / "data").symlink_to("/srv/shared/data")  # a link the copy keeps as a link
    for ignored in (".git", "__pycache__", "node_modules"):  # never shipped, never digested
        (algo / ignored).mkdir()
        (algo / ignored / "x").write_text(ignored)
    (algo / "pkg" / "model.cpython-311.pyc").write_bytes(b"\0compiled")
    snapshot = tmp_path / "snapshot"
    copy_folder(algo, snapshot)  # modes widened to every account, x kept where the owner had it
    assert not (snapshot / ".git").exists()
    found = digest(algo)
    assert found is not None and found.startswith("sha256:") and len(found) == 7 + 64
    assert digest(snapshot) == found
    # what the copy leaves out changes nothing either
    (algo / ".git" / "HEAD").write_text("ref: refs/heads/other\n")
    assert digest(algo) == found


def test_every_change_a_job_would_see_makes_a_new_digest(algo):
    seen = {digest(algo)}

    def changed() -> bool:
        new = digest(algo)
        assert new is not None
        fresh = new not in seen
        seen.add(new)
        return fresh

    (algo / "train.py").write_text("print('train twice')\n")
    assert changed()  # an edit
    (algo / "pkg" / "model.py").rename(algo / "pkg" / "model2.py")
    assert changed()  # a rename (same contents, another path)
    (algo / "pkg" / "model2.py").chmod(0o755)
    assert changed()  # executable now
    (algo / "notes.txt").write_text("")
    assert changed()  # an empty file is a file
    # what no job sees: other mode bits, times, an empty folder
    before = digest(algo)
    (algo / "notes.txt").chmod(0o600)
    os.utime(algo / "train.py", (1, 1))
    (algo / "empty").mkdir()
    assert digest(algo) == before


def test_a_link_is_digested_as_a_link_never_followed(algo, tmp_path):
    outside = tmp_path / "secret.txt"
    outside.write_text("print('train')\n")  # the same bytes as train.py
    (algo / "copy.py").symlink_to(outside)
    linked = digest(algo)
    # the link's target may change: the job's folder did not
    outside.write_text("something else entirely\n")
    assert digest(algo) == linked
    # a link to another target is another content
    (algo / "copy.py").unlink()
    (algo / "copy.py").symlink_to(tmp_path / "elsewhere.txt")
    assert digest(algo) != linked
    # the regular file with the target's bytes is not the link
    (algo / "copy.py").unlink()
    (algo / "copy.py").write_text("print('train')\n")
    assert digest(algo) != linked
    # a link to a folder is not entered: what the folder holds does not count
    (algo / "copy.py").unlink()
    elsewhere = tmp_path / "big"
    elsewhere.mkdir()
    (algo / "linked-folder").symlink_to(elsewhere)
    with_link = digest(algo)
    (elsewhere / "huge.bin").write_bytes(b"x" * 4096)
    assert digest(algo) == with_link


def test_a_fifo_is_recorded_by_its_kind_and_never_opened(algo):
    os.mkfifo(algo / "pipe")
    result: list[str | None] = []
    reader = threading.Thread(target=lambda: result.append(digest(algo)), daemon=True)
    reader.start()
    reader.join(60)
    assert not reader.is_alive(), "the digest waited on a FIFO"
    assert result[0] is not None
    (algo / "pipe").unlink()
    assert digest(algo) != result[0]  # it was recorded


def test_no_digest_when_the_content_cannot_be_told_whole(algo, tmp_path, monkeypatch):
    assert digest(tmp_path / "missing") is None
    assert digest(algo / "train.py") is None  # not a folder
    monkeypatch.setattr(algorithm_content, "MAX_FILES", 3)
    assert digest(algo) is not None  # train.py, run.sh, pkg/model.py
    (algo / "extra.py").write_text("x = 1\n")
    assert digest(algo) is None  # one more than it reads
    monkeypatch.setattr(algorithm_content, "MAX_FILES", 100)
    monkeypatch.setattr(algorithm_content, "MAX_BYTES", 10)
    assert digest(algo) is None  # more bytes than it reads


def test_the_top_may_be_a_link_to_the_folder(algo, tmp_path):
    link = tmp_path / "latest"
    link.symlink_to(algo)  # a --code-dir given through a link is the folder it names
    assert digest(link) == digest(algo)


def test_a_files_hash_is_remembered_until_it_changes(algo, monkeypatch):
    monkeypatch.setattr(algorithm_content, "_remembered", type(algorithm_content._remembered)())
    first = digest(algo)  # every file was written just now: none is remembered (rule 5)
    assert len(algorithm_content._remembered) == 0
    monkeypatch.setattr(algorithm_content, "RACY_SECONDS", -1.0)  # as if written long ago
    assert digest(algo) == first
    assert len(algorithm_content._remembered) == 3
    assert digest(algo) == first  # from what was remembered
    (algo / "pkg" / "model.py").write_text("W = 22\n")  # another size, times and change time
    changed = digest(algo)
    assert changed != first and len(algorithm_content._remembered) == 4
    monkeypatch.setattr(algorithm_content, "REMEMBERED", 2)
    (algo / "pkg" / "model.py").write_text("W = 333\n")
    assert digest(algo) not in (first, changed)
    assert len(algorithm_content._remembered) == 2  # the least recently used forgotten


def test_a_folder_past_the_bounds_is_told_by_its_sizes_without_reading_it(algo, monkeypatch):
    with open(algo / "data.bin", "wb") as sparse:  # a data file far past the bound, holding nothing
        sparse.truncate(algorithm_content.MAX_BYTES + 1)

    def never(*_args):
        raise AssertionError("a file was read")

    monkeypatch.setattr(algorithm_content, "_file_hash", never)
    assert digest(algo) is None


def test_the_jobs_table_keeps_each_folder_with_its_content():
    from ma_jupyter.models import JobSpec
    from ma_jupyter.service import algorithm_folders

    one, two = "sha256:" + "1" * 64, "sha256:" + "2" * 64
    spec = JobSpec(
        name="sweep",
        type="batch",
        tasks=[
            {"algorithm": "/a/mnist/", "command": "python t.py", "algorithm_digest": one},
            {"algorithm": "/a/bert", "command": "python t.py"},  # content not known
            {"algorithm": "/a/mnist", "command": "python u.py", "algorithm_digest": one},
        ],
    )
    value = algorithm_folders.column(spec)
    assert value == f"\n/a/mnist\n{one}\n/a/bert\n"
    assert algorithm_folders.split(value) == [("/a/mnist", one), ("/a/bert", None)]
    shipped = JobSpec(
        name="t",
        command="python t.py",
        algorithm="/h/snapshots/t-1",
        algorithm_origin="/a/mnist",
        algorithm_digest=two,
    )
    assert algorithm_folders.split(algorithm_folders.column(shipped)) == [("/a/mnist", two)]
    with pytest.raises(ValueError):
        JobSpec(name="t", command="python t.py", algorithm="/a", algorithm_digest="md5:1234")


NOBODY = algorithm_content.Account(65534, 65534)  # the job's account, another than the service's


def test_no_digest_where_the_jobs_account_cannot_read_an_entry(algo):
    """The service reads with its own rights (root): a folder with an entry the job's account
    cannot read has no digest, else its changes would tell of that file (rule 4)."""
    assert digest(algo, NOBODY) is None  # run.sh is 0700, root's
    (algo / "run.sh").chmod(0o755)
    readable = digest(algo, NOBODY)
    assert readable is not None and readable == digest(algo)
    secret = algo / "pkg" / "secret.py"
    secret.write_text("TOKEN = 'only root reads this'\n")
    secret.chmod(0o600)  # root's, unreadable by the job's account
    assert digest(algo, NOBODY) is None
    assert digest(algo) is not None  # the service runs the job as itself: nothing is checked
    os.chown(secret, 0, NOBODY.gid)
    secret.chmod(0o640)  # readable through the job's group
    assert digest(algo, NOBODY) is not None
    os.chown(secret, NOBODY.uid, 0)
    secret.chmod(0o044)  # its owner's bits decide for its owner, as the kernel does
    assert digest(algo, NOBODY) is None
    secret.chmod(0o400)
    assert digest(algo, NOBODY) is not None
    (algo / "pkg").chmod(0o750)  # a folder the job's account cannot list nor enter
    assert digest(algo, NOBODY) is None
    (algo / "pkg").chmod(0o755)
    assert digest(algo, NOBODY) is not None


def test_reading_is_bounded_by_its_budget_remembered_files_cost_nothing(algo, monkeypatch):
    monkeypatch.setattr(algorithm_content, "_remembered", type(algorithm_content._remembered)())
    monkeypatch.setattr(algorithm_content, "RACY_SECONDS", -1.0)  # as if written long ago
    whole = digest(algo)
    assert algorithm_content.digest_bounded(algo, None, algorithm_content.ReadBudget(0)) == (whole, False)
    (algo / "train.py").write_text("print('edited')\n" * 100)  # 1,600 bytes not remembered
    budget = algorithm_content.ReadBudget(1000)
    assert algorithm_content.digest_bounded(algo, None, budget) == (None, True)
    budget = algorithm_content.ReadBudget(2000)
    found = algorithm_content.digest_bounded(algo, None, budget)
    assert found == (digest(algo), False) and found[0] != whole
    assert budget.left == 2000 - 1600


def _spec(folder):
    from ma_jupyter.models import JobSpec

    return JobSpec(name="job", command="python train.py", algorithm=str(folder))


def test_the_start_reads_a_bounded_amount_again_else_the_content_is_unknown(algo, monkeypatch):
    """At a job's first start (under the supervisor's lock) a folder used as is is read again,
    at most the read limit of files changed since the submit (service/algorithms.py rule 5)."""
    from ma_jupyter.service import algorithms

    monkeypatch.setattr(algorithm_content, "RACY_SECONDS", -1.0)  # as if written long ago
    submitted = algorithms.identified(_spec(algo))
    at_submit = submitted.algorithm_digest
    started = algorithms.at_start(submitted, read_limit=0)  # unchanged: nothing to read
    assert (started.spec.algorithm_digest, started.changed, started.unread) == (at_submit, [], [])
    (algo / "train.py").write_text("print('edited while queued')\n")
    started = algorithms.at_start(submitted, read_limit=1 << 20)
    assert started.spec.algorithm_digest == digest(algo) != at_submit
    assert (started.changed, started.unread) == ([str(algo)], [])
    (algo / "data.bin").write_bytes(b"\0" * 4096)  # more to read again than the limit
    started = algorithms.at_start(submitted, read_limit=1000)
    assert (started.spec.algorithm_digest, started.changed, started.unread) == (None, [], [str(algo)])


def test_an_unchanged_2000_file_folder_costs_a_walk_at_the_start(tmp_path, monkeypatch):
    """The time the start holds the supervisor's lock for an unchanged folder of 2,000 files
    (printed); it reads no file again (a read limit of 0 still gives its digest)."""
    from ma_jupyter.service import algorithms

    monkeypatch.setenv("MA_JUPYTER_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(algorithm_content, "RACY_SECONDS", -1.0)  # as if written long ago
    folder = tmp_path / "big"
    for package in range(20):
        (folder / f"pkg{package}").mkdir(parents=True)
        for module in range(100):
            (folder / f"pkg{package}" / f"m{module}.py").write_text(f"X = {package * 100 + module}\n" * 20)
    submitted = algorithms.identified(_spec(folder))
    assert submitted.algorithm_digest is not None
    took = []
    for _ in range(5):
        started_at = time.perf_counter()
        started = algorithms.at_start(submitted, read_limit=0)
        took.append(time.perf_counter() - started_at)
        assert started.spec.algorithm_digest == submitted.algorithm_digest and not started.unread
    print(
        f"at_start, unchanged 2,000-file folder: median {sorted(took)[2] * 1e3:.1f} ms, max {max(took) * 1e3:.1f} ms"
    )
