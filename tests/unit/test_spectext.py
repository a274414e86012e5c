"""The text formats of tasks, images and mounts (ma_jupyter/spectext.py): each line a front end
writes reads back as the same field, and the create form gets the same patterns."""

from __future__ import annotations

import re

import pytest

from ma_jupyter import spectext, tsgen
from ma_jupyter.frontends import options
from ma_jupyter.frontends.notebook.widgets import form


def test_a_task_line_reads_back():
    assert spectext.split_task("./algo::python train.py --lr 1") == ("./algo", "python train.py --lr 1")
    assert spectext.split_task(" :: python t.py") == (None, "python t.py")
    assert spectext.split_task("python t.py") is None  # a bare command: the front end decides
    for algorithm, command in (("/a/b", "python x.py"), (None, "bash -c 'a::b'")):
        assert spectext.split_task(spectext.task_text(algorithm, command)) == (algorithm, command)


def test_an_image_text_reads_back(tmp_path):
    venv = tmp_path / "venv"
    venv.mkdir()
    is_dir = lambda p: p == str(venv)  # noqa: E731
    for image in (
        {"conda_env": "torch"},
        {"venv": str(venv)},
        {"python": "/usr/bin/python3"},
        {"name": "cuda-py"},
    ):
        assert spectext.image_from_text(spectext.image_text(image), is_dir) == image
    assert spectext.image_from_text("  ", is_dir) == {}
    assert form.image_from_text(str(venv)) == {"venv": str(venv)}  # the form asks the disk


@pytest.mark.parametrize(
    ("mount", "dataset"),
    [
        ({"name": "mnist", "path": "/data/mnist"}, True),
        (
            {
                "name": "mnist",
                "path": "/data/mnist",
                "source": "favorite",
                "version": "v2",
                "read_only": False,
            },
            True,
        ),
        ({"name": "bert", "path": "/models/bert", "source": "pretrained"}, False),
    ],
)
def test_a_mount_line_reads_back(mount, dataset):
    line = spectext.mount_text(mount, dataset=dataset)
    match = spectext.split_mount(line)
    assert match is not None and match["name"] == mount["name"]
    assert (match["source"], match["version"]) == (mount.get("source"), mount.get("version"))
    assert line.endswith(spectext.READ_WRITE) == (mount.get("read_only") is False)


def test_the_cli_options_read_the_same_lines(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    line = spectext.mount_text(
        {"name": "mnist", "path": str(data), "source": "favorite", "version": "v2", "read_only": False},
        dataset=True,
    )
    task = spectext.task_text(str(tmp_path), "python t.py")
    args = options.parse_args(
        options.build_parser("t"), ["--dataset", line, "--task", task, "--image", "conda:torch"]
    )
    spec = options.spec_from_args(args)
    assert spec["datasets"] == [
        {"name": "mnist", "path": str(data), "read_only": False, "source": "favorite", "version": "v2"}
    ]
    assert spec["tasks"] == [{"command": "python t.py", "algorithm": str(tmp_path)}]
    assert spec["image"] == {"conda_env": "torch"}


def test_the_create_form_gets_the_same_formats():
    text = tsgen.generate()
    assert f"export const TASK_SEPARATOR = {spectext.TASK_SEPARATOR!r};".replace("'", '"') in text
    assert 'export const CONDA_PREFIX = "conda:";' in text
    js = re.search(r'export const MOUNT_LINE = new RegExp\("(.*)"\);', text)[1]
    # the same expression, with JavaScript's spelling of named groups
    assert js.replace("(?<", "(?P<") == spectext.MOUNT_LINE.pattern
    with pytest.raises(ValueError, match="back-reference"):
        tsgen.js_pattern(re.compile(r"(?P<a>x)(?P=a)"))
