"""The content identity of an algorithm folder (``ma_jupyter/algorithm_content.py``), rule by
rule, on real files: a folder and its snapshot share a digest, every change the job would see
makes a new one, links are recorded as links and never followed."""

from __future__ import annotations

import os
import threading

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
