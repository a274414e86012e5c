"""The TensorFlow mode with real tensorflow-cpu: MWMS, PS-worker and ParameterServerStrategy through the service."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from ma_jupyter.models import JobStatus
from tests.fixtures.real_jobs import MWMS, PS_WORKER, algorithm, events_text, job_processes, run_job

from ..helpers import wait_for, writable_dir

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = [pytest.mark.tensorflow]

PS_STRATEGY = """
import json, os
import tensorflow as tf

os.environ["GRPC_FAIL_FAST"] = "use_caller"
resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
if resolver.task_type in ("worker", "ps"):
    server = tf.distribute.Server(
        resolver.cluster_spec(), job_name=resolver.task_type, task_index=resolver.task_id, protocol="grpc", start=True
    )
    print(f"{resolver.task_type} {resolver.task_id} serving", flush=True)
    server.join()
strategy = tf.distribute.ParameterServerStrategy(resolver)
coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
with strategy.scope():
    w = tf.Variable(tf.zeros([4, 1]))


@tf.function
def train_step():
    x = tf.random.normal([8, 4])
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((tf.matmul(x, w) - tf.reduce_sum(x, axis=1, keepdims=True)) ** 2)
    w.assign_sub(0.1 * tape.gradient(loss, w))
    return loss


losses = [coordinator.schedule(train_step) for _ in range(20)]
coordinator.join()
final = float(losses[-1].fetch())
print(f"chief trained: first loss {float(losses[0].fetch()):.3f} last {final:.3f} on {w.device}", flush=True)
with open("/workspace/outputs/pss.json", "w") as fh:
    json.dump({"first": float(losses[0].fetch()), "last": final, "device": w.device}, fh)
"""


def _run(client, tmp_path, name, script, **fields):
    outputs = tmp_path / "out"
    writable_dir(outputs)
    job, seconds, logs = run_job(
        client,
        timeout=240,
        name=name,
        mode="tensorflow",
        specs=["cpu.small"],
        algorithm=str(algorithm(tmp_path / "algo", train=script)),
        outputs=str(outputs),
        command="python /workspace/algorithm/train.py",
        **fields,
    )
    print(f"tensorflow {name}: {seconds:.1f} s")
    assert job.status is JobStatus.succeeded, logs + events_text(client, job.id)
    # every task started its server: the job ran distributed, and no alert says otherwise
    assert [e.reason for e in client.events(job.id) if e.alert] == [], logs
    return job, outputs


def test_two_worker_multiworker_mirrored_custom_loop_succeeds(ma_module_home_client, tmp_path):
    _job, outputs = _run(ma_module_home_client, tmp_path, "mwms", MWMS, nodes=2)
    results = [json.loads((outputs / f"mwms-{i}.json").read_text()) for i in range(2)]
    assert {r["replicas"] for r in results} == {2}
    assert results[0]["weights"] == results[1]["weights"]
    assert any(abs(v) > 0.1 for v in results[0]["weights"])  # it trained


def test_ps_worker_ends_succeeded_with_the_parameter_server_gone(ma_module_home_client, tmp_path):
    job, outputs = _run(ma_module_home_client, tmp_path, "ps-worker", PS_WORKER, nodes=2, ps=1)
    for index in range(2):
        result = json.loads((outputs / f"ps-worker-{index}.json").read_text())
        assert result == {"device": "/job:ps/replica:0/task:0/device:CPU:0", "value": float(index + 1)}
    # the parameter server never exits by itself: the supervisor stopped it
    wait_for(lambda: not job_processes(job.id), timeout=30)


def test_chief_with_parameter_server_strategy_trains(ma_module_home_client, tmp_path):
    job, outputs = _run(ma_module_home_client, tmp_path, "pss", PS_STRATEGY, nodes=2, ps=1, chief=True)
    result = json.loads((outputs / "pss.json").read_text())
    assert result["device"].startswith("/job:ps/")
    assert result["last"] < result["first"]
    wait_for(lambda: not job_processes(job.id), timeout=30)
    # the CLI's follower shows every task's own "Started server" line, each with its node
    followed = subprocess.run(
        [sys.executable, "-m", "ma_jupyter.frontends.cli", "logs", job.id, "--follow"],
        env={**os.environ, "PYTHONPATH": ROOT},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert followed.returncode == 0, followed.stderr
    for node in ("chief-0", "worker-0", "worker-1", "ps-0"):
        assert re.search(rf"^\[{node}\] .*Started server", followed.stdout, re.MULTILINE), (
            node,
            followed.stdout,
        )


# A script that ignores TF_CONFIG: each worker trains its own model and succeeds.
ALONE = """
import tensorflow as tf

w = tf.Variable(tf.zeros([4, 1]))
for i in range(5):
    x = tf.random.stateless_normal([8, 4], seed=[i, 0])
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((tf.matmul(x, w) - tf.reduce_sum(x, axis=1, keepdims=True)) ** 2)
    w.assign_sub(0.1 * tape.gradient(loss, w))
print(f"trained alone, loss={float(loss):.4f}", flush=True)
"""


def test_two_workers_that_never_build_a_strategy_succeed_with_an_alert(ma_module_home_client, tmp_path):
    job, seconds, logs = run_job(
        ma_module_home_client,
        timeout=240,
        name="tf-alone",
        mode="tensorflow",
        nodes=2,
        specs=["cpu.small"],
        algorithm=str(algorithm(tmp_path / "algo", train=ALONE)),
        command="python /workspace/algorithm/train.py",
    )
    print(f"tensorflow 2 workers without a strategy: {seconds:.1f} s")
    assert job.status is JobStatus.succeeded, logs + events_text(ma_module_home_client, job.id)
    assert logs.count("trained alone") == 2, logs
    alerts = [e.reason for e in ma_module_home_client.events(job.id) if e.alert]
    assert len(alerts) == 1, events_text(ma_module_home_client, job.id) + logs
    assert alerts[0].startswith("not distributed: none of the 2 nodes started a TensorFlow server")


def test_a_script_that_quiets_tensorflow_is_not_judged(ma_module_home_client, tmp_path):
    """With TF_CPP_MIN_LOG_LEVEL=1 TensorFlow prints only oneDNN's line (before it reads the level),
    none of its later INFO lines, and no 'Started server' even where a server starts: the logs
    cannot tell, so nothing is said."""
    job, _seconds, logs = run_job(
        ma_module_home_client,
        timeout=240,
        name="tf-quiet",
        mode="tensorflow",
        nodes=2,
        specs=["cpu.small"],
        algorithm=str(
            algorithm(
                tmp_path / "algo", train="import os\nos.environ['TF_CPP_MIN_LOG_LEVEL'] = '1'\n" + ALONE
            )
        ),
        command="python /workspace/algorithm/train.py",
    )
    assert job.status is JobStatus.succeeded, logs + events_text(ma_module_home_client, job.id)
    assert logs.count("trained alone") == 2, logs
    assert [e.reason for e in ma_module_home_client.events(job.id) if e.alert] == [], logs
