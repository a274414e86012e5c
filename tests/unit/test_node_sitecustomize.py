"""The node's ``sitecustomize`` (``nodeside/node_sitecustomize.py``, linked into the folder on
every node's PYTHONPATH) in real interpreters laid out as a node lays them out: JAX finds the
node's process count and id by itself, nothing of JAX is imported before the program asks, and
an image's own ``sitecustomize`` still runs.  The 2-node ``jax.distributed.initialize()`` itself
runs in ``tests/modes/test_real_distributed.py``."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ma_jupyter.nodehost.view import PACKAGE_DIR, SITECUSTOMIZE

#: what the program sees of the hook before and after it imports JAX's cluster detection
DETECT = r"""
import json, os, sys
seen = {"jax imported at start": "jax" in sys.modules, "site": sys.modules["sitecustomize"].__file__}
from jax._src import clusters

def detect():
    return list(clusters.ClusterEnv.auto_detect_unset_distributed_params(None, None, None, None, None, 300))

seen["cluster names"] = [c.name for c in clusters.ClusterEnv._cluster_types]
seen["node"] = detect()
os.environ["JAX_COORDINATOR_PORT"] = "4321"
seen["port override"] = detect()
del os.environ["JAX_COORDINATOR_PORT"]
os.environ["LOCAL_WORLD_SIZE"] = "2"  # torchrun started 2 ranks here: not one process per node
seen["two ranks on the node"] = detect()
os.environ["LOCAL_WORLD_SIZE"] = "1"
os.environ["OMPI_COMM_WORLD_LOCAL_SIZE"] = "2"  # Open MPI 5's mpirun: no variable JAX knows
seen["two mpirun ranks on the node"] = detect()
del os.environ["OMPI_COMM_WORLD_LOCAL_SIZE"]
os.environ["JAX_PROCESS_ID"] = "2"  # not below the count
seen["id out of range"] = detect()
os.environ["JAX_PROCESS_ID"] = "1"
os.environ["OMPI_COMM_WORLD_SIZE"] = "4"  # under mpirun Open MPI's answer stays first
os.environ["OMPI_COMM_WORLD_RANK"] = "3"
os.environ["OMPI_MCA_orte_hnp_uri"] = "1.0;tcp://10.254.0.1:5000"
os.environ["OMPI_COMM_WORLD_LOCAL_RANK"] = "1"
seen["under mpirun"] = detect()
print(json.dumps(seen))
"""


def _helpers(tmp_path: Path) -> Path:
    """The node's helpers folder as bubblewrap lays it out (``bwrap._helpers_args``)."""
    folder = tmp_path / "helpers"
    folder.mkdir()
    (folder / "ma_jupyter").symlink_to(PACKAGE_DIR)
    (folder / "sitecustomize.py").symlink_to(SITECUSTOMIZE)
    return folder


def _python(code: str, pythonpath: list[Path], **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "OMPI_", "SLURM_", "PYTHON"))}
    clean.pop("LOCAL_WORLD_SIZE", None)
    clean["PYTHONPATH"] = os.pathsep.join(map(str, pythonpath))
    return subprocess.run(
        [sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True, timeout=120
    )


@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="needs JAX (the frameworks extra)")
def test_jax_detects_the_nodes_process_count_and_id_where_the_platform_set_them(tmp_path):
    done = _python(
        DETECT,
        [_helpers(tmp_path)],
        JAX_COORDINATOR_ADDRESS="10.254.0.1:1234",
        JAX_NUM_PROCESSES="2",
        JAX_PROCESS_ID="1",
        JAX_PLATFORMS="cpu",
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["jax imported at start"] is False
    assert seen["cluster names"][-1] == "ma_jupyter"  # after JAX's own (rule 3)
    assert seen["node"] == ["10.254.0.1:1234", 2, 1, None]
    assert seen["port override"] == ["10.254.0.1:4321", 2, 1, None]
    assert seen["two ranks on the node"] == [None, None, None, None]  # nothing detected: JAX asks
    assert seen["two mpirun ranks on the node"] == [None, None, None, None]
    assert seen["id out of range"] == [None, None, None, None]
    assert seen["under mpirun"][1:3] == [4, 3]


def test_without_the_platforms_variables_nothing_is_installed_and_the_images_sitecustomize_runs(tmp_path):
    image = tmp_path / "image-site"
    image.mkdir()
    (image / "sitecustomize.py").write_text("import builtins\nbuiltins.IMAGE_HOOK_RAN = True\n")
    probe = (
        "import builtins, json, sys; print(json.dumps({'image hook': getattr(builtins, 'IMAGE_HOOK_RAN', False),"
        " 'site': sys.modules['sitecustomize'].__file__, 'finders': [type(f).__name__ for f in sys.meta_path],"
        " 'package imported': 'ma_jupyter' in sys.modules}))"
    )
    helpers = _helpers(tmp_path)
    plain = json.loads(_python(probe, [helpers, image]).stdout)
    assert plain == {
        "image hook": True,  # rule 2: the image's own still runs, under its name
        "site": str(image / "sitecustomize.py"),
        "finders": plain["finders"],
        "package imported": False,
    }
    assert "_Finder" not in plain["finders"]
    with_jax_vars = json.loads(
        _python(probe, [helpers, image], JAX_NUM_PROCESSES="2", JAX_PROCESS_ID="0").stdout
    )
    assert with_jax_vars["image hook"] is True and with_jax_vars["finders"][0] == "_Finder"
