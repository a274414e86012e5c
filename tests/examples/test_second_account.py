"""Another Unix account of the machine uses the owner's service (issue 39, item 5): it installs
with ``./dev user-setup`` (a virtual environment of its own, on a Python it can run, the package
installed from a private copy: nothing written into the project), then uses the CLI and the
notebook magic with the token an admin gave it, shipping code from its own home.

The account ``ma-second`` is made when absent (``useradd``, a home under ``/home``); each run works
in a fresh folder of that home, removed at the end.  To stay cheap the account's pip installs the
package alone (``--no-deps``) and its environment borrows the project environment's other packages
through a ``.pth`` line, as if pip had fetched them.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="switching to another account needs root"),
    pytest.mark.timeout(600),
]

REPO = Path(__file__).resolve().parents[2]
ACCOUNT = "ma-second"


def _account() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(ACCOUNT)
    except KeyError:
        made = subprocess.run(["useradd", "-m", "-s", "/bin/bash", ACCOUNT], capture_output=True, text=True)
        if made.returncode != 0:
            pytest.skip(f"cannot add the account {ACCOUNT}: {made.stderr.strip()}")
        return pwd.getpwnam(ACCOUNT)


def test_a_second_account_installs_and_uses_the_shared_service(ma_client, ma_home):
    if not Path("/usr/bin/python3").exists() or shutil.which("setpriv") is None:
        pytest.skip("needs the system's Python and setpriv")
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    system = subprocess.run(
        ["/usr/bin/python3", "-c", "import sys; print(f'python{sys.version_info[0]}.{sys.version_info[1]}')"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    if system != version:
        pytest.skip(f"the system's {system} is not the project environment's {version}")
    user = _account()
    token = ma_client.add_user(ACCOUNT).token
    folder = Path(tempfile.mkdtemp(prefix="ma-second-", dir=user.pw_dir))
    try:
        os.chown(folder, user.pw_uid, user.pw_gid)
        as_user = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups", "--"]
        env = {
            "HOME": str(folder),
            "USER": ACCOUNT,
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "MA_VENV": str(folder / "venv"),
            "MA_PIP_OPTIONS": "--no-deps",
        }
        setup = subprocess.run(
            [*as_user, str(REPO / "dev"), "user-setup"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=400,
        )
        assert setup.returncode == 0, setup.stdout + setup.stderr
        # nothing of the account's install landed in the project folder
        assert (
            subprocess.run(
                ["find", str(REPO), "-uid", str(user.pw_uid)], capture_output=True, text=True
            ).stdout.split()
            == []
        )
        venv = folder / "venv"
        packages = venv / "lib" / version / "site-packages"
        assert (packages / "ma_jupyter" / "__init__.py").exists(), "installed, not linked to the project"
        (packages / "zz-project-packages.pth").write_text(
            str(Path(sys.executable).parent.parent / "lib" / version / "site-packages") + "\n"
        )
        env = {
            "HOME": str(folder),
            "USER": ACCOUNT,
            "PATH": f"{venv}/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "MA_JUPYTER_URL": ma_client.url,
            "MA_JUPYTER_TOKEN": token,
        }

        def run(*argv: str, cwd: Path = folder) -> subprocess.CompletedProcess:
            return subprocess.run(
                [*as_user, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
            )

        imported = run("python", "-c", "import ma_jupyter; print(ma_jupyter.__file__)")
        assert imported.stdout.strip().startswith(str(packages)), imported.stdout + imported.stderr
        assert run("ma-jupyter", "whoami").stdout.split()[0] == ACCOUNT
        project = folder / "project"
        project.mkdir()
        (project / "train.py").write_text("print('trained by the second account')\n")
        os.chown(project, user.pw_uid, user.pw_gid)
        os.chown(project / "train.py", user.pw_uid, user.pw_gid)
        submitted = run(
            "ma-jupyter", "submit", "--name", "second", "--follow", "--", "python", "train.py", cwd=project
        )
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        assert "trained by the second account" in submitted.stdout
        assert f"shipped {project}" in submitted.stderr
        # the notebook magic, in the account's own IPython
        cell = (
            "ip = get_ipython(); ip.run_line_magic('load_ext', 'ma_jupyter'); "
            "ip.run_cell_magic('ma_train', '--name from-notebook', \"print('cell ran as a job')\")"
        )
        notebook = run("python", "-m", "IPython", "--no-banner", "-c", cell, cwd=project)
        assert "cell ran as a job" in notebook.stdout, notebook.stdout + notebook.stderr
        mine = {j.name: j.info for j in ma_client.jobs(limit=50)}
        assert (
            mine["second"].status.value == "succeeded" and mine["from-notebook"].status.value == "succeeded"
        )
        assert mine["second"].spec.creator == ACCOUNT
    finally:
        shutil.rmtree(folder, ignore_errors=True)
