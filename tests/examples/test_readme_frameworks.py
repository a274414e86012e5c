"""The README's framework sections under *Distributed modes* (JAX, MindSpore's `msrun`, XGBoost,
Ray inside a job), pasted as a user would: the section's ```python block saved under the name
its text gives (`train_jax.py`...), then its ```console command run by bash in that folder, as
written, on a fresh service the command starts (``MA_JUPYTER_HOME``); what the section says it
prints is in the output.

The images the sections name as ``~/venvs/<name>`` are this machine's: ``HOME`` is a folder
whose ``venvs/mindspore`` and ``venvs/xgb`` are links to the images ``./dev setup`` makes
(``.venv/images/mindspore``, ``.venv/images/xgboost``; ``MA_MINDSPORE_IMAGE`` and
``MA_XGBOOST_IMAGE`` name others).  A section whose image is missing is skipped, saying how to
make it.  tests/examples/test_readme.py runs the README's other blocks (```bash and the Client's
```python); these are ```console blocks, which it leaves alone.

*Ray inside a job* (marker ``ray_in_job``; issue 38: a Ray cluster started inside a 2-node job,
each node's raylet registered at its own address, which the printed list names): `ray start
--head` on worker-0, `ray start --address` on worker-1, as on two machines.  Ray 2.60's raylet
aborts when its dashboard agent has not written its port files 15 s after its start (a fixed
wait), so the head needs its agent's `import ray` to be quick: `./dev setup` drops jsonschema's
rfc3987-syntax, which cost 1.8 s of CPU in each of the six helpers the head starts at once (with
it, the head failed in a 1-core node at load 12).  On a machine loaded far beyond its cores
(load 20-30 on 2 cores) `ray start` itself gives up, as the section says.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
IMAGES = REPO / ".venv" / "images"
#: the image each section's command names as ``~/venvs/<name>``, where this machine keeps it
SECTION_IMAGES = {
    "mindspore": Path(os.environ.get("MA_MINDSPORE_IMAGE", IMAGES / "mindspore")),
    "xgb": Path(os.environ.get("MA_XGBOOST_IMAGE", IMAGES / "xgboost")),
}


def readme_section(title: str) -> tuple[str, str, str, list[str]]:
    """The section ``### <title>`` of the README: the file name its ```python block is saved
    under, that block, its ```console command, and the lines it says the command prints (each
    backquoted text after "prints" that holds no "...")."""
    text = (REPO / "README.md").read_text()
    start = text.index(f"\n### {title}\n")
    end = min(i for i in (text.find("\n## ", start + 1), text.find("\n### ", start + 1)) if i > 0)
    section = text[start:end]
    found = re.search(r"`([\w.-]+\.py)`:\s*\n\n```python\n(.*?)^```", section, re.MULTILINE | re.DOTALL)
    assert found, f"the README's {title} section has no `<file>.py`: and python block"
    command = re.search(r"^```console\n(.*?)^```", section, re.MULTILINE | re.DOTALL)
    assert command and "ma-jupyter submit" in command.group(1), title
    after = section[command.end() :]
    prints = re.split(r"\.\s", after[after.index("prints") :], maxsplit=1)[0]  # that sentence
    expected = [line for line in re.findall(r"`([^`]+)`", prints) if "..." not in line]
    assert expected, f"the README's {title} section says nothing it prints"
    return found.group(1), found.group(2), command.group(1), expected


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    ("title", "image"),
    [
        ("JAX", None),
        ("XGBoost", "xgb"),
        ("MindSpore (`msrun`)", "mindspore"),
        pytest.param("Ray inside a job", None, marks=pytest.mark.ray_in_job),
    ],
)
def test_a_frameworks_readme_section_works_as_pasted(ma_home, tmp_path, title, image):
    name, code, command, expected = readme_section(title)
    if image is not None and not (SECTION_IMAGES[image] / "bin" / "python").exists():
        pytest.skip(f"needs the {image} image at {SECTION_IMAGES[image]} (./dev setup makes it)")
    if title == "JAX" and subprocess.run([sys.executable, "-c", "import jax"]).returncode:
        pytest.skip("needs JAX in the project's environment (./dev setup: the frameworks extra)")
    if title == "Ray inside a job" and importlib.util.find_spec("ray") is None:
        pytest.skip("needs Ray in the project's environment (./dev setup: the ray extra)")
    home = tmp_path / "user"
    (home / "venvs").mkdir(parents=True)
    for venv, path in SECTION_IMAGES.items():
        (home / "venvs" / venv).symlink_to(path.resolve())
    folder = tmp_path / "work"
    folder.mkdir()
    (folder / name).write_text(code)
    env = {
        **os.environ,
        "HOME": str(home),
        "MA_JUPYTER_HOME": str(ma_home),
        # the project's environment first, as after `source .venv/bin/activate`, with this
        # checkout's package
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', os.defpath)}",
        "PYTHONPATH": str(REPO),
    }
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", command],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=840,
    )
    assert done.returncode == 0, f"{command}\n{done.stdout[-6000:]}\n{done.stderr[-3000:]}"
    for line in expected:
        assert line in done.stdout, (line, done.stdout[-6000:])
