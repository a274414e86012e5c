"""The README's shell and Python examples, pasted as written into a fresh folder: as root, and
as a user without privileges in a folder of their own outside the project.

Each ```bash block that runs ``ma-jupyter`` and each ```python block that uses the Client runs
in order in one new folder, with a fresh ``MA_JUPYTER_HOME`` and the project's virtual
environment first on ``PATH`` (as after ``source .venv/bin/activate``); the package is this
checkout's.  As the user (``nobody``, its ``HOME`` a fresh folder it owns), every block runs
through ``setpriv`` with that user's ids, so the service the first command starts runs as that
user too.  The README's own notebook example ("In a notebook") runs in IPython here, from a
folder the user may mount from and from one outside every root; the notebooks under
``notebooks/`` run in tests/examples/test_notebooks.py.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(900)

REPO = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"^```(bash|python)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def readme_examples() -> list[tuple[str, str]]:
    """(language, code) of the README blocks a user pastes into a shell or a Python prompt."""
    found = []
    for language, code in BLOCK.findall((REPO / "README.md").read_text()):
        if language == "bash" and "ma-jupyter " in code:
            found.append((language, code))
        elif language == "python" and "from ma_jupyter import Client" in code:
            found.append((language, code))
    return found


def test_the_readme_has_examples_to_run():
    kinds = [language for language, _ in readme_examples()]
    assert "bash" in kinds and "python" in kinds


def _run_every_example(
    folder: Path, home: Path, *, as_user: list[str], env: dict[str, str], venv_bin: Path
) -> None:
    """Run the README's blocks in ``folder`` on the service of ``home`` with the virtual
    environment ``venv_bin`` first on PATH; ``as_user`` is the argv prefix that drops to the
    user (empty: root); the service is stopped at the end."""
    env = {
        **env,
        "MA_JUPYTER_HOME": str(home),
        "PATH": str(venv_bin) + os.pathsep + env.get("PATH", os.defpath),
        # this checkout's package, as the project's own `.venv` gives it to its user
        "PYTHONPATH": str(REPO),
    }
    try:
        for language, code in readme_examples():
            argv = (
                ["bash", "-euo", "pipefail", "-c", code]
                if language == "bash"
                else [str(venv_bin / "python"), "-c", code]
            )
            done = subprocess.run(
                [*as_user, *argv], cwd=folder, env=env, capture_output=True, text=True, timeout=300
            )
            assert done.returncode == 0, f"{language} example failed:\n{code}\n{done.stdout}\n{done.stderr}"
            if "--name hello" in code:
                assert "hello" in done.stdout.splitlines()
            if "--name ranks" in code:
                # --follow prints every node's lines, each prefixed with its node
                lines = done.stdout.splitlines()
                # (and the rank splitter's [rank r] within each node's log)
                for node, rank in (("worker-0", 0), ("worker-1", 1)):
                    assert f"[{node}] [rank {rank}] rank {rank} of 2" in lines, done.stdout
                # `logs --node` one node's, as it printed them
                assert "[rank 1] rank 1 of 2" in lines, done.stdout
                assert "deleted ranks" in done.stdout
    finally:
        subprocess.run(
            [*as_user, "ma-jupyter", "service", "stop"], cwd=folder, env=env, capture_output=True, timeout=60
        )


def test_every_readme_example_works_as_pasted(tmp_path):
    folder = tmp_path / "fresh"
    folder.mkdir()
    venv_bin = Path(sys.executable).parent
    _run_every_example(folder, tmp_path / "home", as_user=[], env=dict(os.environ), venv_bin=venv_bin)


def _user_venv(folder: Path, as_user: list[str]) -> Path:
    """A virtual environment the user made (``python3 -m venv``, as after their own
    ``./dev setup``) on the system's Python, holding the project environment's packages (hard
    links: that environment's interpreter may lie where the user cannot go, and a job's sandbox
    shows only the service's own environment), with the ``ma-jupyter`` command; its ``bin``."""
    subprocess.run(
        [*as_user, "/usr/bin/python3", "-m", "venv", "--without-pip", str(folder)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    python = folder / "bin" / "python"
    version = subprocess.run(
        [str(python), "-c", "import sys; print(f'python{sys.version_info[0]}.{sys.version_info[1]}')"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    project_packages = Path(sys.executable).parent.parent / "lib" / version / "site-packages"
    if not project_packages.is_dir():
        pytest.skip(f"the system's {version} is not the project environment's Python")
    packages = folder / "lib" / version / "site-packages"
    linked = subprocess.run(
        ["cp", "-al", f"{project_packages}/.", str(packages)], capture_output=True, text=True, timeout=600
    )
    if linked.returncode != 0:  # /tmp on another file system than the project's environment
        pytest.skip(f"cannot hard-link the project's packages for the user: {linked.stderr.strip()}")
    command = folder / "bin" / "ma-jupyter"
    command.write_text(
        f"#!{python}\nimport sys\nfrom ma_jupyter.frontends.cli import main\nsys.exit(main())\n"
    )
    command.chmod(0o755)
    return folder / "bin"


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another user needs root")
def test_every_readme_example_works_as_a_user_in_a_folder_of_their_own():
    """As ``nobody``: its own HOME and ``MA_JUPYTER_HOME``, a fresh folder outside the project,
    the service it starts running as that user."""
    user = pwd.getpwnam("nobody")
    # under /tmp itself: pytest's own temporary folders are root's alone (mode 0700)
    root = Path(tempfile.mkdtemp(prefix="ma-readme-user-", dir="/tmp"))
    try:
        root.chmod(0o755)
        home = root / "home"
        folder = home / "fresh"
        folder.mkdir(parents=True)
        for path in (home, folder):
            os.chown(path, user.pw_uid, user.pw_gid)
        as_user = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups", "--"]
        env = {
            "HOME": str(home),
            "USER": user.pw_name,
            "LOGNAME": user.pw_name,
            "PATH": os.environ.get("PATH", os.defpath),
            "LANG": "C.UTF-8",
        }
        if not Path("/usr/bin/python3").exists():
            pytest.skip("no system Python for the user's own virtual environment")
        venv_bin = _user_venv(home / ".venv", as_user)
        _run_every_example(folder, home / ".ma-jupyter", as_user=as_user, env=env, venv_bin=venv_bin)
        # the service (and the jobs it ran) wrote the user's home as that user
        owners = {p.lstat().st_uid for p in (home / ".ma-jupyter").rglob("*")}
        assert owners == {user.pw_uid}, f"owners of the files in the user's MA_JUPYTER_HOME: {owners}"
    finally:
        shutil.rmtree(root, ignore_errors=True)


def readme_notebook_cells() -> list[str]:
    """The README's notebook example ("In a notebook"): its cells, in order."""
    return [
        code
        for language, code in BLOCK.findall((REPO / "README.md").read_text())
        if language == "python" and ("%load_ext ma_jupyter" in code or code.startswith("%%ma_train"))
    ]


def _run_notebook_cells(folder: Path) -> subprocess.CompletedProcess:
    """The README's notebook cells run in order in one IPython kernel-like shell in ``folder``."""
    runner = (
        "import json, os\n"
        "ip = get_ipython()\n"
        "for cell in json.loads(os.environ['CELLS']):\n"
        "    if not ip.run_cell(cell).success:\n"
        "        raise SystemExit(1)\n"
        "print('CELLS OK')\n"
    )
    import json

    env = {**os.environ, "CELLS": json.dumps(readme_notebook_cells()), "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "IPython", "--no-banner", "-c", runner],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_readme_notebook_example_works_as_pasted(ma_client, ma_home, tmp_path):
    """Pasted into a fresh folder the user may mount from, the example runs its job to the end
    (it makes its ./data); pasted into a folder outside every root, it is refused with the exact
    allowed_roots line, and with that line in cluster.toml it runs there too."""
    assert len(readme_notebook_cells()) == 2
    ma_client.connect()  # the service is already running, started from elsewhere
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    ran = _run_notebook_cells(fresh)
    assert "CELLS OK" in ran.stdout and "digits" in ran.stdout, ran.stdout + ran.stderr
    assert (fresh / "data").is_dir() and (fresh / "outputs").is_dir()

    outside = Path(tempfile.mkdtemp(prefix="ma-readme-notebook-", dir="/var/tmp"))
    try:
        refused = _run_notebook_cells(outside)
        assert "CELLS OK" not in refused.stdout
        line = re.search(r"allowed_roots = \[.*?\]", refused.stdout + refused.stderr)
        assert line and str(outside) in line.group(0), refused.stdout + refused.stderr
        cluster = ma_home / "cluster.toml"
        cluster.write_text(re.sub(r"(?m)^allowed_roots = .*$", lambda _: line.group(0), cluster.read_text()))
        again = _run_notebook_cells(outside)
        assert "CELLS OK" in again.stdout, again.stdout + again.stderr
    finally:
        shutil.rmtree(outside, ignore_errors=True)
