"""The contract suite's ``backend`` fixture: each backend of the package, built once per module.

``backend`` is parametrized ``local`` and ``ray``.  The local one runs here, in this process;
the Ray one runs inside the Ray tests' private network namespace, on the session's one Ray
cluster (``tests/fixtures/ray_netns.py``: outside it the fixture gives None, and the test's
outcome is the inner run's).  Each module gets a home of its own (``MA_JUPYTER_HOME``), whose
``jobs/`` folder holds its attempts' job folders (the Ray backend's ``node_root`` too).
"""

from __future__ import annotations

import pytest

from tests.fixtures.contract import Subject
from tests.fixtures.ray_netns import INSIDE


@pytest.fixture(scope="module", params=["local", pytest.param("ray", marks=pytest.mark.ray)])
def backend(request, tmp_path_factory):
    """A :class:`~tests.fixtures.contract.Subject`: the backend under the contract and how to
    place, launch and end attempts on it; None for ``ray`` outside the Ray namespace."""
    if request.param == "ray" and not INSIDE:
        yield None
        return
    base = tmp_path_factory.mktemp(f"contract-{request.param}")
    base.chmod(0o755)
    home = base / "home"  # beside the folders the module's jobs mount (Subject.folder)
    (home / "jobs").mkdir(parents=True)  # as a service makes it
    (home / "cluster.toml").write_text(f'[mounts]\nallowed_roots = ["{base}"]\n')
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MA_JUPYTER_HOME", str(home))
        patch.setenv("MA_JUPYTER_CARDS", "none")
        patch.delenv("MA_JUPYTER_TOKEN", raising=False)
        patch.delenv("MA_JUPYTER_URL", raising=False)
        if request.param == "local":
            subject = Subject.local(home)
        else:
            subject = Subject.ray(home, request.getfixturevalue("ray_cluster").address)
        try:
            yield subject
        finally:
            subject.close()


@pytest.fixture(autouse=True)
def backend_ended(backend):
    """After each test: what it started is stopped, what it bound released (``Subject.end``)."""
    yield
    if backend is not None:
        backend.end()
