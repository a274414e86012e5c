"""The job service stays cheap to start (tests and the client's autostart start it by the
hundred): what its start imports leaves out the modules only some requests need, and where the
environment turns bytecode files off it writes its package's compiled modules, so the next start
reads them instead of compiling every module from source (``service/__main__.py``).
bench/service_start.py measures whole starts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ma_jupyter.service.__main__ import keep_compiled

ROOT = Path(__file__).resolve().parents[2]

# A fresh interpreter: this test process has long imported everything.  What the service's
# start imports: ``main`` and ``_serve`` (the app with its routes, the store, the supervisor, the
# local backend), and what uvicorn loads for its protocols.
PROBE = """
import json, sys
import uvicorn
from ma_jupyter.service import __main__
from ma_jupyter.service.app import create_app
from ma_jupyter.service.scheduler import Scheduler
from ma_jupyter.service.store import Store
from ma_jupyter.service.supervisor import Supervisor
from ma_jupyter.service.tensorboard import TensorBoardManager
from ma_jupyter.service.users import Directory, new_token
from ma_jupyter.backends.local import LocalBackend
import uvicorn.protocols.http.auto, uvicorn.protocols.websockets.auto
print(json.dumps(sorted(sys.modules)))
"""

#: what no request needs before its first use: the TensorBoard probe's HTTP client, the
#: exporters (and their YAML)
NOT_AT_START = ("requests", "urllib3", "yaml", "ma_jupyter.export")


def test_the_service_start_imports_no_module_only_some_requests_need():
    done = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    modules = json.loads(done.stdout)
    assert "ma_jupyter.service.api.export" in modules  # the probe imported the routes
    loaded = [m for m in modules if any(m == n or m.startswith(n + ".") for n in NOT_AT_START)]
    assert loaded == []


def test_compiled_modules_are_written_only_where_the_environment_turns_writing_them_off(
    tmp_path, monkeypatch
):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    sources = [package / "__init__.py", package / "sub" / "mod.py"]
    for source in sources:
        source.write_text("VALUE = 1\n")
    compiled = [source.parent / "__pycache__" for source in sources]

    monkeypatch.setattr(sys, "dont_write_bytecode", False)  # imports write their own
    keep_compiled(package)
    assert not any(folder.exists() for folder in compiled)

    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    keep_compiled(package)
    for folder, source in zip(compiled, sources, strict=True):
        assert [p.name.split(".")[0] for p in folder.iterdir()] == [source.stem]
