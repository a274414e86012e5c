"""The README's notebook example from a folder outside the user's home and the project (issue
39, item 5): the refusal names the exact ``allowed_roots`` line, and that line, pasted into
``cluster.toml``, lets the job mount both its ``./data`` and ``./outputs`` while the default roots
stay."""

from __future__ import annotations

import re
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from ma_jupyter.errors import InvalidSpec
from ma_jupyter.models import JobStatus

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def notebook_folder():
    """A notebook's folder outside the user's home, the project and the test's allowed tmp_path."""
    folder = Path(tempfile.mkdtemp(prefix="ma-notebook-", dir="/var/tmp"))
    (folder / "data").mkdir()
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_the_refusal_gives_the_line_that_allows_the_notebooks_folder(ma_client, ma_home, notebook_folder):
    spec = {
        "name": "digits",
        "command": f"{sys.executable} -c pass",
        "datasets": [{"name": "digits", "path": str(notebook_folder / "data")}],
        "outputs": str(notebook_folder / "outputs"),
    }
    with pytest.raises(InvalidSpec) as refused:
        ma_client.submit(**spec)
    message = str(refused.value)
    assert (
        "the account that started the service is one" in message and str(ma_home / "cluster.toml") in message
    )
    line = re.search(r"allowed_roots = \[.*\]$", message).group(0)
    assert str(notebook_folder) in line
    cluster = ma_home / "cluster.toml"
    cluster.write_text(re.sub(r"(?m)^allowed_roots = .*$", lambda _: line, cluster.read_text()))
    job = ma_client.submit(**spec)
    assert job.wait(timeout=120).status is JobStatus.succeeded
    assert (notebook_folder / "outputs").is_dir()


def test_allowed_roots_add_to_the_users_home_and_the_project(ma_home, tmp_path, monkeypatch):
    from ma_jupyter.config import ENV_PROJECT_DIR
    from ma_jupyter.nodehost.host_policy import load_policy

    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.setenv(ENV_PROJECT_DIR, str(project))
    (ma_home / "cluster.toml").write_text(f'[mounts]\nallowed_roots = ["{tmp_path / "data"}"]\n')
    assert load_policy().roots_for("root") == ["/root", str(project), str(tmp_path / "data")]
