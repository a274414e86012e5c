"""The Kubernetes export end to end: ``ma-jupyter export`` and ``submit --dry-run --format k8s``
as real subprocesses against a real service, and the REST routes under the access rules.
Every document that comes back validates strictly against a current Kubernetes' schemas."""

from __future__ import annotations

import json
import sys

import kubernetes_validate
import yaml

from ma_jupyter.models import Job

PY = sys.executable
K8S_VERSION = "1.35.0"


def validated(text: str) -> list[dict]:
    docs = list(yaml.safe_load_all(text))
    assert docs
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    return docs


def job_docs(docs: list[dict]) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == "Job"}


def env_of(job: dict) -> dict[str, str]:
    (main,) = job["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value") for e in main["env"]}


def job_count(svc) -> int:
    """How many jobs the module's service holds (the tests share it: each compares its own before and after)."""
    return svc.session().get(f"{svc.api}/jobs", timeout=10).json()["total"]


def test_dry_run_export_of_a_pytorch_job_submits_nothing(ma_module_cli, ma_module_service, tmp_path):
    jobs_before = job_count(ma_module_service)
    (tmp_path / "train.py").write_text("print('hi')\n")
    data = tmp_path / "data"
    data.mkdir()
    out = ma_module_cli(
        "submit",
        "--dry-run",
        "--format",
        "k8s",
        "--name",
        "ddp",
        "--mode",
        "pytorch",
        "--nodes",
        "2",
        "--spec",
        "cpu.medium",
        "--dataset",
        f"mnist={data}",
        "--",
        "python",
        "train.py",
    )
    assert out.returncode == 0, out.stderr
    docs = validated(out.stdout)
    assert [(d["kind"], d["metadata"]["name"]) for d in docs] == [
        ("PriorityClass", "ma-jupyter-normal"),
        ("ConfigMap", "ddp-nodeside"),
        ("Service", "ddp"),
        ("Job", "ddp-worker"),
    ]
    worker = job_docs(docs)["ddp-worker"]
    assert worker["spec"]["completionMode"] == "Indexed" and worker["spec"]["completions"] == 2
    env = env_of(worker)
    assert env["MASTER_ADDR"] == "ddp-worker-0.ddp" and env["RANK"] == "$(MA_TASK_INDEX)"
    # the command names train.py of this folder: it is the job's /workspace/algorithm, as a
    # submit would ship it, and the claim standing for it says so
    claims = json.loads(worker["metadata"]["annotations"]["ma-jupyter/claims"])
    assert claims["ddp-algorithm"] == str(tmp_path) and claims["dataset-private-mnist"] == str(data)
    (main,) = worker["spec"]["template"]["spec"]["containers"]
    assert main["workingDir"] == "/workspace/algorithm"
    assert {
        m["mountPath"]: m["readOnly"] for m in main["volumeMounts"] if m["mountPath"].startswith("/workspace")
    } == {
        "/workspace/algorithm": True,
        "/workspace/dataset/private/mnist": True,
        "/workspace/outputs": False,
    }
    assert job_count(ma_module_service) == jobs_before  # the dry run submitted nothing


def test_export_of_a_submitted_job_and_a_bad_format(ma_module_cli):
    done = ma_module_cli("submit", "--wait", "--json", "--name", "tiny", "--", PY, "-c", "print(1)")
    assert done.returncode == 0, done.stderr
    job = Job.model_validate_json(done.stdout)
    out = ma_module_cli(
        "export", job.id, "--format", "k8s", "--mounts-as", "hostpath", "--container-image", "python:3.12"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(
        f"# Kubernetes export of ma_jupyter job {job.id} (single mode, spec cpu.small)"
    )
    docs = validated(out.stdout)
    worker = job_docs(docs)["tiny-worker"]
    assert env_of(worker)["MA_JOB_ID"] == job.id
    pod = worker["spec"]["template"]["spec"]
    assert pod["containers"][0]["command"] == [PY, "-c", "print(1)"]
    assert pod["containers"][0]["image"] == "python:3.12"
    (outputs,) = [v for v in pod["volumes"] if v["name"].endswith("-outputs")]
    assert outputs["hostPath"]["path"] == job.outputs_folder
    # JOB may be the job's name; --format defaults to k8s
    assert (
        ma_module_cli("export", "tiny").stdout.split("\n", 1)[1]
        == ma_module_cli("export", job.id).stdout.split("\n", 1)[1]
    )
    bad = ma_module_cli("export", job.id, "--format", "helm")
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr == "error: unknown export format 'helm': choose one of k8s (e.g. --format k8s)\n"
    bad = ma_module_cli("submit", "--dry-run", "--format", "yaml", "--", PY, "-c", "pass")
    assert bad.returncode == 2 and "unknown export format 'yaml'" in bad.stderr


def test_format_without_dry_run_is_refused(ma_module_cli, ma_module_service):
    jobs_before = job_count(ma_module_service)
    out = ma_module_cli("submit", "--format", "k8s", "--", PY, "-c", "pass")
    assert out.returncode == 2
    assert "add --dry-run" in out.stderr and "ma-jupyter export JOB --format k8s" in out.stderr
    out = ma_module_cli("submit", "--dry-run", "--mounts-as", "hostpath", "--", PY, "-c", "pass")
    assert out.returncode == 2 and "add --dry-run --format k8s" in out.stderr
    assert job_count(ma_module_service) == jobs_before  # neither was submitted


def test_export_routes_follow_the_access_rules(ma_module_service):
    bob, alice = ma_module_service.user_session("bob"), ma_module_service.user_session("alice")
    api = ma_module_service.api
    # what alice sees of the module's other tests' jobs (the owner's, readable by default)
    seen_before = {
        j["id"] for j in alice.get(f"{api}/jobs", params={"limit": 500}, timeout=10).json()["items"]
    }
    ids = {}
    for access in ("none", "ro"):
        body = {"name": f"tf-{access}", "mode": "tensorflow", "nodes": 2, "ps": 1, "access": access}
        body["command"] = f"{PY} -c pass"
        reply = bob.post(f"{api}/jobs", json=body, timeout=10)
        assert reply.status_code == 201, reply.text
        ids[access] = reply.json()["id"]
    hidden = alice.get(f"{api}/jobs/{ids['none']}/export", params={"format": "k8s"}, timeout=10)
    assert hidden.status_code == 404 and hidden.json()["error"] == "not_found"
    shared = alice.get(f"{api}/jobs/{ids['ro']}/export", params={"format": "k8s"}, timeout=10)
    assert shared.status_code == 200 and shared.headers["content-type"].startswith("application/yaml")
    docs = validated(shared.text)
    assert list(job_docs(docs)) == ["tf-ro-ps", "tf-ro-worker"]
    tf_config = json.loads(env_of(job_docs(docs)["tf-ro-ps"])["TF_CONFIG"])
    assert tf_config["cluster"] == {
        "ps": ["tf-ro-ps-0.tf-ro:29500"],
        "worker": ["tf-ro-worker-0.tf-ro:29500", "tf-ro-worker-1.tf-ro:29500"],
    }
    own = bob.get(f"{api}/jobs/{ids['none']}/export", timeout=10)
    assert own.status_code == 200
    bad = bob.get(f"{api}/jobs/{ids['ro']}/export", params={"format": "helm"}, timeout=10)
    assert bad.status_code == 400 and bad.json()["field"] == "format"
    bad = bob.get(f"{api}/jobs/{ids['ro']}/export", params={"mounts_as": "nfs"}, timeout=10)
    assert bad.status_code == 400 and bad.json()["field"] == "mounts_as"
    # a spec not submitted: the edge rules of a dry run
    spec = {"name": "single", "command": "python a.py", "env": {"GREETING": "hi ${MA_JOB_NAME}"}}
    reply = alice.post(f"{api}/export", params={"format": "k8s"}, json=spec, timeout=10)
    assert reply.status_code == 200
    assert env_of(job_docs(validated(reply.text))["single-worker"])["GREETING"] == "hi $(MA_JOB_NAME)"
    refused = alice.post(f"{api}/export", json={**spec, "priority": "very-urgent"}, timeout=10)
    assert refused.status_code == 403
    refused = alice.post(f"{api}/export", json={**spec, "mode": "horovod", "nodes": 2}, timeout=10)
    assert refused.status_code == 400 and "remote shell" in refused.json()["message"]
    refused = alice.post(f"{api}/export", json={**spec, "specs": ["gpu.huge"]}, timeout=10)
    assert refused.status_code == 400 and "unknown spec 'gpu.huge'" in refused.json()["message"]
    listing = alice.get(f"{api}/jobs", params={"limit": 500}, timeout=10).json()
    seen = {j["id"] for j in listing["items"]}
    assert seen - seen_before == {ids["ro"]}  # bob's ro job only: exports made no job
