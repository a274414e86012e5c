"""Helpers of the real-framework mode tests: run a job through the real service and client."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

from ma_jupyter.client import Client
from ma_jupyter.models import Job
from tests.helpers import writable_dir


def algorithm(folder: Path, **scripts: str) -> Path:
    """A host algorithm folder holding ``<name>.py`` for each script (dedented)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in scripts.items():
        (folder / f"{name}.py").write_text(textwrap.dedent(text))
    return folder


def writable_algorithm(folder: Path, **scripts: str) -> str:
    """:func:`algorithm` in a folder every account may write (a root service runs root's jobs as
    ``nobody``), as a string (the form a spec takes)."""
    writable_dir(folder, parents=True)
    return str(algorithm(folder, **scripts))


def node_logs(client: Client, job_id: str) -> str:
    """Every node's combined log, for assertion messages."""
    parts = []
    for stream in client.log_streams(job_id):
        if stream.rank is None:
            chunk = client.read_log(job_id, node=stream.node, limit=200_000)
            parts.append(f"----- {stream.node} -----\n{chunk.data[-6000:]}")
    return "\n".join(parts)


def run_job(client: Client, timeout: float = 180.0, **fields) -> tuple[Job, float, str]:
    """Submit a job, wait until it is terminal; returns (job, seconds from submit, all node logs)."""
    start = time.monotonic()
    handle = client.submit(**fields)
    job = handle.wait(timeout=timeout, check=False)
    elapsed = time.monotonic() - start
    return job, elapsed, node_logs(client, job.id)


def events_text(client: Client, job_id: str) -> str:
    """The job's events, one per line."""
    return "\n".join(f"{e.status.value} {e.node or ''} {e.reason}" for e in client.events(job_id))


def job_processes(job_id: str) -> list[int]:
    """Pids of live processes that belong to the job (its ``MA_JOB_ID`` is in their env)."""
    import psutil

    found = []
    for proc in psutil.process_iter():
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get("MA_JOB_ID") == job_id:
                found.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


# The parameter-server / worker script both backends run (tests/modes and tests/ray).
PS_WORKER = """
import json, os, time
import tensorflow as tf

resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
cluster = resolver.cluster_spec().as_dict()
if resolver.task_type == "ps":
    server = tf.distribute.Server(resolver.cluster_spec(), job_name="ps", task_index=resolver.task_id, protocol="grpc")
    print("ps serving", flush=True)
    server.join()  # never returns: the platform stops parameter servers
# The parameter server's eager service can crash (SIGSEGV, seen under load) when two workers
# create their contexts on it at once: each worker connects once the one before it is done.
while resolver.task_id and not os.path.exists(f"/workspace/outputs/done-{resolver.task_id - 1}"):
    time.sleep(0.05)
# this worker serves as itself and sees only the parameter servers
own = tf.train.ClusterSpec({"ps": cluster["ps"], "worker": {resolver.task_id: cluster["worker"][resolver.task_id]}})
tf.config.experimental_connect_to_cluster(own, job_name="worker", task_index=resolver.task_id)
with tf.device("/job:ps/task:0"):
    total = tf.Variable(0.0)
total.assign_add(float(resolver.task_id + 1))
print(f"worker {resolver.task_id} variable on {total.device} = {float(total.numpy())}", flush=True)
with open(f"/workspace/outputs/ps-worker-{resolver.task_id}.json", "w") as fh:
    json.dump({"device": total.device, "value": float(total.numpy())}, fh)
# Likewise a worker's eager context torn down while another still uses the server: every
# worker waits until all are done, then leaves without the teardown.
open(f"/workspace/outputs/done-{resolver.task_id}", "w").close()
while not all(os.path.exists(f"/workspace/outputs/done-{i}") for i in range(len(cluster["worker"]))):
    time.sleep(0.05)
os._exit(0)
"""


# MultiWorkerMirroredStrategy: every worker all-reduces; each writes its weights to its outputs
MWMS = """
import json, os
import tensorflow as tf

task = json.loads(os.environ["TF_CONFIG"])["task"]
strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    w = tf.Variable(tf.zeros([4, 1]), aggregation=tf.VariableAggregation.MEAN)


@tf.function
def train_step(x, y):
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((tf.matmul(x, w) - y) ** 2)
        grad = tf.distribute.get_replica_context().all_reduce("mean", tape.gradient(loss, w))
        w.assign_sub(0.1 * grad)
        return loss

    return strategy.run(step, args=(x, y))


for i in range(5):
    # every worker sees different data: only the all-reduce keeps their weights equal
    x = tf.random.stateless_normal([8, 4], seed=[i, task["index"]])
    loss = train_step(x, tf.reduce_sum(x, axis=1, keepdims=True))
weights = w.numpy().flatten().tolist()
print(f"worker {task['index']} of {strategy.num_replicas_in_sync} loss={float(loss):.4f}", flush=True)
with open(f"/workspace/outputs/mwms-{task['index']}.json", "w") as fh:
    json.dump({"weights": weights, "replicas": strategy.num_replicas_in_sync}, fh)
"""
