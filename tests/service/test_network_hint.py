"""A job that reaches for the internet it does not have (issue 39, item 5): its failure gets one
event saying the job's network is limited and what to do, beside the tracebacks; a job failing
for another reason gets none."""

from __future__ import annotations

import shlex
import shutil
import sys

import pytest

from ma_jupyter.models import JobStatus
from ma_jupyter.service.supervisor.watching import network_hint

pytestmark = pytest.mark.timeout(300)

#: what a download does first: resolve the host's name (as requests/urllib3 do)
RESOLVE = "import socket; socket.getaddrinfo('pypi.org', 443)"


def _limited(events) -> list:
    return [e for e in events if e.reason.startswith("the job's network is limited")]


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="the job's own network needs bubblewrap")
def test_a_job_failing_on_name_resolution_gets_one_network_event(ma_client):
    offline = ma_client.submit(name="download", command=f"{sys.executable} -c {shlex.quote(RESOLVE)}")
    final = offline.wait(timeout=120, check=False)
    assert final.status is JobStatus.error, final.reason
    hints = _limited(offline.events())
    assert len(hints) == 1, [e.reason for e in offline.events()]
    assert hints[0].alert and hints[0].node == "worker-0"
    assert "--dataset NAME=FOLDER" in hints[0].reason and "docs/network.md" in hints[0].reason
    # and how an admin opens the way: the setting, its file, the form of an entry
    assert "[network] egress" in hints[0].reason and "cluster.toml" in hints[0].reason

    other = ma_client.submit(
        name="plain", command=f"{sys.executable} -c {shlex.quote('raise SystemExit(4)')}"
    )
    assert other.wait(timeout=120, check=False).status is JobStatus.error
    assert _limited(other.events()) == []


@pytest.mark.parametrize(
    "line",
    [
        "urllib3.exceptions.NameResolutionError: <urllib3.connection.HTTPSConnection object>: Failed to resolve",
        "socket.gaierror: [Errno -3] Temporary failure in name resolution",
        "ConnectionRefusedError: [Errno 111] Connection refused",
        "OSError: [Errno 101] Network is unreachable",
    ],
)
def test_the_network_failures_a_download_shows_are_recognised(line):
    assert network_hint(f"node worker-0 exited with code 1\nlast log lines:\n{line}").startswith(
        "the job's network is limited"
    )


def test_the_hint_says_how_an_admin_opens_the_network():
    hint = network_hint("last log lines:\nConnectionRefusedError: [Errno 111] Connection refused")
    assert hint is not None
    assert '[network] egress = ["pypi.mirror.local:3128"]' in hint and "cluster.toml" in hint


def test_other_failures_get_no_network_hint():
    assert network_hint("node worker-0 exited with code 1\nlast log lines:\nKeyError: 'RANK'") is None
