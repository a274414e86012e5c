"""Clone names, and what the client ships as a job's algorithm when the spec names none."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from ma_jupyter import workspace
from ma_jupyter.client.snapshot import (
    SHIP_LIMIT,
    is_snapshot,
    modelarts_code_folder,
    names_local_file,
    ship_working_folder,
)
from ma_jupyter.errors import InvalidSpec
from ma_jupyter.models import JobSpec, clone_name
from ma_jupyter.service import algorithm_folders


@pytest.mark.parametrize(
    ("name", "clone"),
    [
        ("x", "x-copy"),
        ("x-copy", "x-copy-2"),
        ("x-copy-2", "x-copy-3"),
        ("copy", "copy-copy"),
        ("a" * 63, "a" * 58 + "-copy"),
    ],
)
def test_clone_names_count_up_instead_of_piling_up(name, clone):
    assert clone_name(name) == clone


@pytest.fixture
def project(tmp_path, monkeypatch):
    folder = tmp_path / "project"
    (folder / "pkg").mkdir(parents=True)
    (folder / "train.py").write_text("print('trained')\n")
    (folder / "pkg" / "__init__.py").write_text("")
    (folder / ".git").mkdir()
    (folder / ".git" / "HEAD").write_text("ref\n")
    (folder / "__pycache__").mkdir()
    (folder / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"x")
    monkeypatch.setenv("MA_JUPYTER_HOME", str(tmp_path / "home"))
    return folder


@pytest.mark.parametrize(
    ("command", "named"),
    [
        ("python train.py --lr 0.1", True),
        (["python", "train.py"], True),
        ("python -m pkg.train", True),
        # a shell's -c script is read for the files it names (the README's way to pipe)
        ("bash -c 'python train.py | tee log.txt'", True),
        ("sh -ec 'cd . && python -m pkg.train > out.txt'", True),
        ("bash --norc -c 'python train.py'", True),
        ("bash -c 'echo train.py'", True),
        ("bash -c 'python missing.py | tee x'", False),
        ("bash -c 'python \"unclosed'", False),
        ("bash -c", False),
        ("bash -c 'cd pkg && ls'", True),
        ("bash -c 'cd /tmp && ls'", False),
        ("bash -c 'cd .. && ls'", False),
        ("bash train.py", True),
        ("python -c 'print(1)'", False),
        ("python missing.py", False),
        ("python ../project/train.py", True),
        ("python /etc/hostname", False),
        ("python -m json.tool", False),
        ("", False),
    ],
)
def test_a_command_names_a_local_file(project, command, named):
    assert names_local_file(command, project) is named


def _tree_hash(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        digest.update(str(path.relative_to(folder)).encode())
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


def test_the_current_folder_is_shipped_as_a_copy_without_caches(project):
    before = _tree_hash(project)
    body = {"name": "t", "command": "python train.py"}
    note = ship_working_folder(body, project)
    shipped = Path(body["algorithm"])
    assert note and str(project) in note and "read-only copy" in note
    assert is_snapshot(shipped) and shipped != project
    assert (shipped / "train.py").read_text() == "print('trained')\n"
    assert (shipped / "pkg" / "__init__.py").exists()
    assert not (shipped / ".git").exists() and not (shipped / "__pycache__").exists()
    assert _tree_hash(project) == before  # the user's folder is untouched
    assert body["algorithm_origin"] == str(project.resolve())  # where the copy came from


def test_code_writable_mounts_the_folder_itself_instead_of_a_copy(project):
    body = {"name": "t", "command": "bash -c 'python train.py | tee log'", "algorithm_read_only": False}
    note = ship_working_folder(body, project)
    assert body["algorithm"] == str(project.resolve()) and not is_snapshot(body["algorithm"])
    assert note and "itself" in note and "writable (--code-writable)" in note
    assert not (project.parent / "home" / "snapshots").exists()  # nothing copied


def test_nothing_is_shipped_when_the_spec_names_an_algorithm_or_no_local_file(project):
    body = {"name": "t", "command": "python train.py", "algorithm": "/somewhere"}
    assert ship_working_folder(body, project) is None and body["algorithm"] == "/somewhere"
    body = {"name": "t", "command": "python -c 'print(1)'"}
    assert ship_working_folder(body, project) is None and "algorithm" not in body


def test_a_folder_over_the_limit_is_refused_with_what_to_do(project):
    with open(project / "big.bin", "wb") as fh:
        fh.truncate(SHIP_LIMIT + 1)  # sparse: no disk used
    body = {"name": "t", "command": "python train.py"}
    with pytest.raises(InvalidSpec, match="pass --code-dir") as caught:
        ship_working_folder(body, project)
    assert caught.value.field == "algorithm" and "algorithm" not in body
    assert not os.path.exists(project.parent / "home" / "snapshots") or not any(
        (project.parent / "home" / "snapshots").iterdir()
    )


def test_a_modelarts_command_ships_the_folder_it_names(project):
    """``python /home/ma-user/modelarts/user-job-dir/<folder>/train.py`` means the current
    folder when it has that name, else its subfolder of that name."""
    root = "/home/ma-user/modelarts/user-job-dir"
    assert modelarts_code_folder(f"python {root}/project/train.py", project) == project.resolve()
    assert modelarts_code_folder(f"bash -c 'python {root}/pkg/x.py | tee l'", project) == project / "pkg"
    assert modelarts_code_folder(f"python {root}/missing/train.py", project) is None
    assert modelarts_code_folder("python train.py", project) is None
    body = {"name": "t", "command": f"python {root}/pkg/run.py", "convention": "modelarts"}
    note = ship_working_folder(body, project)
    assert note and str(project / "pkg") in note
    assert body["algorithm_origin"] == str((project / "pkg").resolve())
    assert (Path(body["algorithm"]) / "__init__.py").exists()
    # only under the ModelArts convention: the platform's own layout has no such path
    assert ship_working_folder({"name": "t", "command": f"python {root}/pkg/run.py"}, project) is None


def test_a_snapshot_is_known_by_the_folder_it_came_from():
    snapshot = "/home/u/.ma_jupyter/snapshots/t-20260101-000000-abcdef"
    spec = JobSpec(name="t", command="python train.py", algorithm=snapshot, algorithm_origin="/home/u/mnist/")
    assert algorithm_folders.folders(spec) == ["/home/u/mnist"]  # searched by the user's folder
    layout = "/home/ma-user/modelarts/user-job-dir/mnist"
    assert workspace.modelarts_code_dir(snapshot, workspace.origin_of(spec)) == layout
    assert workspace.origin_of(spec, "/other/task-folder") is None  # a batch task's own folder
    plain = JobSpec(name="t", command="python train.py", algorithm="/home/u/bert")
    assert algorithm_folders.folders(plain) == ["/home/u/bert"] and workspace.origin_of(plain) is None
