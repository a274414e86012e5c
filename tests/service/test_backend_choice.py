"""Choosing the backend: ``--backend``/``--ray-address`` and ``[backend]`` of cluster.toml, with one
clear line when the choice cannot run here."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ma_jupyter import config
from ma_jupyter.client import Client
from ma_jupyter.errors import BackendUnavailable, InvalidSpec

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def no_ray(tmp_path, monkeypatch):
    """A ``ray`` that cannot be imported, first on the path of every process started from here."""
    fake = tmp_path / "no-ray" / "ray"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named ray')\n")
    path = os.pathsep.join([str(fake.parent), ROOT, os.environ.get("PYTHONPATH", "")])
    monkeypatch.setenv("PYTHONPATH", path)
    return path


def _service(home, *args):
    return subprocess.run(
        [sys.executable, "-m", "ma_jupyter.service", *args],
        env={**os.environ, "MA_JUPYTER_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_ray_backend_without_ray_names_the_extra_to_install(ma_home, no_ray):
    run = _service(ma_home, "--backend", "ray", "--ray-address", "127.0.0.1:6379")
    assert run.returncode == 2
    assert "pip install ma_jupyter[ray]" in run.stderr
    assert not (ma_home / "service.json").exists()


def test_an_autostarted_service_follows_cluster_toml_and_says_why_it_cannot_start(ma_home, no_ray):
    toml = ma_home / "cluster.toml"
    toml.write_text(toml.read_text() + '[backend]\nkind = "ray"\naddress = "127.0.0.1:6379"\n')
    with pytest.raises(BackendUnavailable) as caught:
        Client().connect()
    assert "pip install ma_jupyter[ray]" in caught.value.message


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ('kind = "ray"\n', "needs the cluster's address"),
        ('kind = "cloud"\n', "unknown backend 'cloud'"),
        ('kind = "ray"\naddress = "x:1"\nnode_root = "relative"\n', "node_root must be an absolute path"),
        (
            'kind = "ray"\naddress = "x:1"\nnetwork = "open"\n',
            "unknown network 'open': choose one of auto, fence",
        ),
    ],
)
def test_a_bad_backend_table_stops_the_service_with_one_line(ma_home, table, says):
    toml = ma_home / "cluster.toml"
    toml.write_text(toml.read_text() + "[backend]\n" + table)
    with pytest.raises(InvalidSpec, match=says):
        config.load_backend(toml)
    run = _service(ma_home)
    assert run.returncode == 2 and says in run.stderr


def test_local_stays_the_default(ma_home):
    assert config.load_backend() == config.BackendConfig(kind="local", network="auto")
    run = _service(ma_home, "--backend", "ray")
    assert run.returncode == 2 and "needs the cluster's address" in run.stderr
