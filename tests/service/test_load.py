"""Load on one service (issue: the service at team scale): 1000 submits from 20 concurrent
clients, then 50 concurrent followers of one chatty job.

Nothing is lost or duplicated: every submit makes exactly one job, every follower sees every
line exactly once and in order, and no request answers a server error (a 5xx raises in the
client, and each thread keeps what it raised).  Loopback only; bounded by the test's timeout.
"""

from __future__ import annotations

import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from ma_jupyter.client import Client
from ma_jupyter.models import JobStatus
from tests.helpers import wait_for

PY = sys.executable
SUBMITTERS, SUBMITS_EACH = 20, 50
FOLLOWERS = 50
LINES = 20_000
# every queued job waits for the whole of `tiny`, which the blocker holds
ON_TINY = {
    "command": f'{PY} -c "import time; time.sleep(600)"',
    "specs": ["cpu.medium"],
    "node_name": "tiny",
    "grace_period": 1,
}
# bursts of lines with pauses, so the followers catch up with the writer again and again
CHATTY = (
    f'{PY} -c "import time\nfor b in range({LINES // 1000}):\n'
    "    print('\\n'.join(f'line {b * 1000 + i}' for i in range(1000)), flush=True)\n"
    '    time.sleep(0.05)"'
)


@pytest.mark.small_cluster
@pytest.mark.timeout(900)
def test_a_thousand_submits_from_twenty_clients_then_fifty_followers(ma_client):
    blocker = ma_client.submit(name="blocker", **ON_TINY)
    assert wait_for(lambda: blocker.status is JobStatus.running, timeout=120)

    errors: list[BaseException] = []
    made: list[str] = []
    lock = threading.Lock()

    def submitter(k: int) -> None:
        client = Client()  # one client (and connection pool) per submitter, as 20 users would have
        for i in range(SUBMITS_EACH):
            try:
                job = client.submit(name=f"load-{k}-{i}", **ON_TINY)
            except BaseException as exc:
                with lock:
                    errors.append(exc)
            else:
                with lock:
                    made.append(job.id)
        client.close()

    with ThreadPoolExecutor(SUBMITTERS) as pool:
        list(pool.map(submitter, range(SUBMITTERS)))
    assert not errors, errors[:3]
    assert len(made) == len(set(made)) == SUBMITTERS * SUBMITS_EACH

    # the service holds exactly these jobs in its queue, each once, at distinct positions
    queued = []
    offset = 0
    while True:
        page = ma_client.job_page(status="queued", offset=offset, limit=200)
        queued += page.items
        offset += len(page.items)
        if not page.items:
            break
    assert sorted(j.id for j in queued) == sorted(made)
    assert sorted(j.queue_position for j in queued) == list(range(len(made)))
    assert sorted(j.spec.name for j in queued) == sorted(
        f"load-{k}-{i}" for k in range(SUBMITTERS) for i in range(SUBMITS_EACH)
    )

    # one chatty job on the other node, its log followed 50 times at once: half read the
    # file directly (the client's fast path), half only through the service's long-poll
    chatty = ma_client.submit(name="chatty", command=CHATTY, specs=["cpu.small"], node_name="big")
    seen: dict[int, list[str]] = {}

    def follower(k: int) -> None:
        client = Client(local_logs=k % 2 == 0)
        try:
            seen[k] = list(client.job(chatty.id).logs(follow=True))
        except BaseException as exc:
            with lock:
                errors.append(exc)
        finally:
            client.close()

    with ThreadPoolExecutor(FOLLOWERS) as pool:
        list(pool.map(follower, range(FOLLOWERS)))
    assert not errors, errors[:3]
    expected = [f"line {n}" for n in range(LINES)]
    assert len(seen) == FOLLOWERS
    for k, lines in seen.items():
        assert lines == expected, f"follower {k}: {len(lines)} lines, first difference at " + str(
            next(
                (n for n, (a, b) in enumerate(zip(lines, expected, strict=False)) if a != b),
                min(len(lines), LINES),
            )
        )
    assert chatty.wait(timeout=120).status is JobStatus.succeeded

    # clean up the queue (the fixture then stops the blocker and the service)
    def delete(job_id: str) -> None:
        ma_client.delete(job_id, force=True)

    with ThreadPoolExecutor(SUBMITTERS) as pool:
        list(pool.map(delete, made))
    assert ma_client.job_page(status="queued", limit=1).total == 0
