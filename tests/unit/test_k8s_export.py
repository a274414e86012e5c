"""The Kubernetes export (``ma_jupyter/export/k8s.py``): every document validates strictly against
the schemas of a current Kubernetes (``kubernetes-validate``, offline), and each pod, rendered
the way kubelet renders it for its index, runs what the mode planners plan for that node."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from ma_jupyter.commands import expand_argv, expand_env
from ma_jupyter.config import Cluster
from ma_jupyter.errors import InvalidSpec
from ma_jupyter.export import check_format, k8s, render
from ma_jupyter.models import JobSpec
from ma_jupyter.modes import plan_job
from ma_jupyter.service.scheduler import Scheduler

#: a Kubernetes release kubernetes-validate ships schemas for
K8S_VERSION = "1.35.0"
DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
SCHEDULER = Scheduler(Cluster())


def export(data: dict, *, job_id: str | None = "job-1", outputs: str = "/srv/jobs/job-1/outputs", **kw):
    """The export of a spec as parsed YAML documents, each validated strictly."""
    spec = JobSpec.model_validate(data)
    flavor = SCHEDULER.cluster.spec(spec.specs[0])
    text = render(
        "k8s",
        spec,
        job_id=job_id,
        flavor_of=lambda role: SCHEDULER.task_flavor(flavor, role),
        outputs=outputs,
        **kw,
    )
    docs = list(yaml.safe_load_all(text))
    for doc in docs:
        assert kubernetes_validate.validate(doc, K8S_VERSION, strict=True) == "1.35"
    assert text.startswith("# Kubernetes export of ma_jupyter job ")
    return docs


def jobs(docs: list[dict]) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == "Job"}


def container(job: dict) -> dict:
    (main,) = job["spec"]["template"]["spec"]["containers"]
    return main


def kubelet_expand(text: str, env: dict[str, str]) -> str:
    """kubelet's ``$(VAR)`` expansion (``third_party/forked/golang/expansion``): ``$$`` is ``$``,
    ``$(NAME)`` a defined variable's value, anything else stays as written."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                end = text.find(")", i + 2)
                if end >= 0:
                    name = text[i + 2 : end]
                    out.append(env.get(name, f"$({name})"))
                    i = end + 1
                    continue
                out.append("$(")
                i += 2
                continue
            out.append("$" + nxt)
            i += 2
            continue
        out.append(text[i])
        i += 1
    return "".join(out)


def pod(job: dict, index: int) -> tuple[dict[str, str], list[str], str]:
    """The env, command and hostname of pod ``index`` of a Job, as Kubernetes makes them: the
    Job controller's hostname and index annotation, kubelet's expansion in order."""
    template = job["spec"]["template"]["spec"]
    annotations = {"batch.kubernetes.io/job-completion-index": str(index)}
    env: dict[str, str] = {}
    for entry in container(job)["env"]:
        if "valueFrom" in entry:
            path = entry["valueFrom"]["fieldRef"]["fieldPath"]
            key = re.fullmatch(r"metadata\.annotations\['(.+)'\]", path).group(1)
            env[entry["name"]] = annotations[key]
        else:
            env[entry["name"]] = kubelet_expand(entry["value"], env)
    command = [kubelet_expand(arg, env) for arg in container(job)["command"]]
    indexed = job["spec"].get("completionMode") == "Indexed"
    hostname = f"{job['metadata']['name']}-{index}" if indexed else template["hostname"]
    return env, command, f"{hostname}.{template['subdomain']}"


def planned(data: dict, job_id: str = "job-1") -> dict[str, object]:
    """What the mode planners give each node of the export's placement, by node name."""
    spec = JobSpec.model_validate(data)
    flavor = SCHEDULER.cluster.spec(spec.specs[0])
    roles = {f"-{r}-{i}" for r, i in k8s.task_roles(spec)}
    base = k8s.base_name(spec.name, max(len(s) for s in roles))
    placement = k8s.placement(spec, job_id, base, lambda role: SCHEDULER.task_flavor(flavor, role))
    return {p.name: p for p in plan_job(spec, placement)}


def check_pods_match_plans(data: dict, docs: list[dict]) -> None:
    """Every pod, rendered for its index, has its node's planned variables and command, with
    the job's ``${VAR}`` expanded as every backend expands them (``commands.expand_env``)."""
    plans = planned(data)
    seen = set()
    for job in jobs(docs).values():
        role = job["metadata"]["labels"]["ma-jupyter/role"]
        for index in range(job["spec"]["completions"]):
            env, command, host = pod(job, index)
            node = f"{role}-{env['MA_TASK_INDEX']}"
            plan = plans[node]
            platform = {k: v for k, v in plan.env.items() if k not in plan.job_env}
            expected = {**platform, **expand_env({k: plan.env[k] for k in plan.job_env}, platform)}
            assert {k: env[k] for k in plan.env} == expected, node
            assert command == expand_argv(plan.argv, env), node
            assert host == plan.task.hostname, node  # the name peers are given is the pod's
            seen.add(node)
    assert seen == set(plans)


PYTORCH = {
    "name": "ddp",
    "mode": "pytorch",
    "nodes": 2,
    "specs": ["cpu.medium"],
    "command": "python train.py",
}
TF_PS = {
    "name": "tfps",
    "mode": "tensorflow",
    "nodes": 2,
    "ps": 1,
    "specs": ["gpu.emu-2"],
    "command": "python t.py",
}


def test_pytorch_two_nodes_is_one_indexed_job_with_a_headless_service():
    docs = export(PYTORCH)
    assert [(d["kind"], d["metadata"]["name"]) for d in docs] == [
        ("PriorityClass", "ma-jupyter-normal"),
        ("ConfigMap", "ddp-nodeside"),
        ("Service", "ddp"),
        ("Job", "ddp-worker"),
    ]
    service = docs[2]["spec"]
    assert service["clusterIP"] == "None" and service["publishNotReadyAddresses"] is True
    job = jobs(docs)["ddp-worker"]
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 2, 2)
    template = spec["template"]
    assert template["spec"]["subdomain"] == "ddp"
    assert service["selector"].items() <= template["metadata"]["labels"].items()
    env0, command0, host0 = pod(job, 0)
    env1, command1, host1 = pod(job, 1)
    assert (env0["RANK"], env1["RANK"]) == ("0", "1")
    assert (env0["NODE_RANK"], env1["PET_NODE_RANK"], env1["MA_TASK_INDEX"]) == ("0", "1", "1")
    # MASTER_ADDR is worker-0's name in the headless Service, the same on every pod
    assert env0["MASTER_ADDR"] == env1["MASTER_ADDR"] == host0 == "ddp-worker-0.ddp"
    assert host1 == "ddp-worker-1.ddp"
    assert env1["MASTER_PORT"] == "29500" and env1["WORLD_SIZE"] == "2" and env1["MA_JOB_ID"] == "job-1"
    assert "--node_rank=1" in command1 and "--node_rank=0" in command0
    assert "--master_addr=ddp-worker-0.ddp" in command1
    # cpu.medium: 2 cores, 4 GB, as requests and limits
    resources = container(job)["resources"]
    assert resources["requests"] == resources["limits"] == {"cpu": "2", "memory": "4Gi"}
    assert container(job)["workingDir"] == "/workspace"
    check_pods_match_plans(PYTORCH, docs)


def test_tensorflow_ps_job_has_a_job_per_role_and_tf_config_with_the_pod_names():
    docs = export(TF_PS)
    assert list(jobs(docs)) == ["tfps-ps", "tfps-worker"]
    ps, worker = jobs(docs)["tfps-ps"], jobs(docs)["tfps-worker"]
    assert ps["spec"]["completions"] == 1 and worker["spec"]["completions"] == 2
    hosts = {
        role: [pod(job, i)[2] for i in range(job["spec"]["completions"])]
        for role, job in (("ps", ps), ("worker", worker))
    }
    for role, job in (("ps", ps), ("worker", worker)):
        for index in range(job["spec"]["completions"]):
            config = json.loads(pod(job, index)[0]["TF_CONFIG"])
            assert config["task"] == {"type": role, "index": index}  # a JSON number
            assert config["cluster"] == {
                "ps": [f"{h}:29500" for h in hosts["ps"]],
                "worker": [f"{h}:29500" for h in hosts["worker"]],
            }
    assert hosts == {"ps": ["tfps-ps-0.tfps"], "worker": ["tfps-worker-0.tfps", "tfps-worker-1.tfps"]}
    # the parameter server takes cpu.ps; the workers the job's spec with its 2 cards
    assert container(ps)["resources"]["limits"] == {"cpu": "1", "memory": "1Gi"}
    assert container(worker)["resources"]["limits"] == {"cpu": "1", "memory": "2Gi", "nvidia.com/gpu": "2"}
    assert ps["metadata"]["annotations"]["ma-jupyter/primary"] == "false"
    assert worker["metadata"]["annotations"]["ma-jupyter/primary"] == "true"
    assert not any(d["metadata"]["name"].endswith("-nodeside") for d in docs)  # nothing to ship
    check_pods_match_plans(TF_PS, docs)


def test_tensorflow_allreduce_with_chief():
    data = {"name": "tfc", "mode": "tensorflow", "nodes": 2, "chief": True, "command": "python t.py"}
    docs = export(data)
    assert list(jobs(docs)) == ["tfc-chief", "tfc-worker"]
    check_pods_match_plans(data, docs)


def test_single_job_with_mounts_read_only_where_the_spec_says(tmp_path):
    data = {
        "name": "train",
        "command": "python train.py",
        "algorithm": "/home/u/code",
        "algorithm_read_only": False,
        "outputs": "/home/u/out",
        "datasets": [
            {"name": "mnist", "path": "/data/mnist", "version": "v1"},
            {"name": "scratch", "path": "/data/scratch", "read_only": False, "source": "favorite"},
        ],
        "models": [{"name": "bert", "path": "/models/bert", "source": "pretrained"}],
        "annotations": [{"name": "labels", "path": "/data/labels.json"}],
        "volumes": [{"name": "cache", "path": "/home/u/cache"}],
    }
    docs = export(data)
    job = jobs(docs)["train-worker"]
    main = container(job)
    mounts = {m["mountPath"]: m for m in main["volumeMounts"]}
    read_only = {path: m.get("readOnly") for path, m in mounts.items() if path.startswith("/workspace")}
    assert read_only == {
        "/workspace/algorithm": False,
        "/workspace/anno_dataset/labels/annotation": True,
        "/workspace/dataset/private/mnist/v1": True,
        "/workspace/dataset/favorite/scratch": False,
        "/workspace/model/pretrained/bert": True,
        "/workspace/outputs": False,
        "/workspace/volume/cache": False,
    }
    assert main["workingDir"] == "/workspace/algorithm"
    volumes = {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}
    claims = {
        mounts_path: volumes[m["name"]]["persistentVolumeClaim"]
        for mounts_path, m in mounts.items()
        if mounts_path.startswith("/workspace")
    }
    assert claims["/workspace/dataset/private/mnist/v1"] == {
        "claimName": "dataset-private-mnist-v1",
        "readOnly": True,
    }
    assert claims["/workspace/outputs"] == {"claimName": "train-outputs", "readOnly": False}
    assert claims["/workspace/algorithm"]["claimName"] == "train-algorithm"
    stands_for = json.loads(job["metadata"]["annotations"]["ma-jupyter/claims"])
    assert stands_for["dataset-private-mnist-v1"] == "/data/mnist"
    assert stands_for["annotation-labels"] == "/data/labels.json"
    # one machine's cluster: the host folders themselves
    docs = export(data, mounts_as="hostpath")
    job = jobs(docs)["train-worker"]
    by_name = {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}
    host = {m["mountPath"]: by_name[m["name"]].get("hostPath") for m in container(job)["volumeMounts"]}
    assert host["/workspace/algorithm"] == {"path": "/home/u/code", "type": "Directory"}
    assert host["/workspace/outputs"] == {"path": "/home/u/out", "type": "DirectoryOrCreate"}
    assert host["/workspace/dataset/private/mnist/v1"] == {"path": "/data/mnist"}
    # the rank-log folder the platform guarantees
    assert by_name["rank-logs"] == {"name": "rank-logs", "emptyDir": {}}
    env, command, _ = pod(job, 0)
    assert env["MA_RANK_LOG_DIR"] == "/job/logs" and command == ["python", "train.py"]


def test_outputs_the_platform_made_for_the_job_are_its_host_folder():
    docs = export({"name": "x", "command": "python a.py"}, mounts_as="hostpath", outputs="/h/jobs/j/outputs")
    job = jobs(docs)["x-worker"]
    (outputs,) = [v for v in job["spec"]["template"]["spec"]["volumes"] if v["name"].endswith("outputs")]
    assert outputs["hostPath"]["path"] == "/h/jobs/j/outputs"


def test_restarts_duration_grace_and_lifecycle():
    base = {"name": "life", "command": "python a.py"}
    job = jobs(export(base))["life-worker"]
    assert job["spec"]["backoffLimit"] == 0 and "activeDeadlineSeconds" not in job["spec"]
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    data = {
        **base,
        "fault_restart": {"max_restarts": 4},
        "duration": "1h30m",
        "grace_period": 12.5,
        "lifecycle": {"on_start": "python prep.py --job ${MA_JOB_ID}", "on_stop": "python save.py"},
    }
    job = jobs(export(data))["life-worker"]
    pod_spec = job["spec"]["template"]["spec"]
    assert job["spec"]["backoffLimit"] == 4 and job["spec"]["activeDeadlineSeconds"] == 5400
    assert pod_spec["terminationGracePeriodSeconds"] == 13
    (init,) = pod_spec["initContainers"]
    assert (
        init["command"] == ["python", "prep.py", "--job", "$(MA_JOB_ID)"]
        and init["env"] == container(job)["env"]
    )
    assert container(job)["lifecycle"]["preStop"]["exec"]["command"] == ["python", "save.py"]
    resumed = {**base, "checkpoint_resume": {"max_resumes": 2, "grace_period": 60}}
    job = jobs(export(resumed))["life-worker"]
    assert (
        job["spec"]["backoffLimit"] == 2
        and job["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 60
    )


def test_job_variables_and_command_references_become_kubelets_syntax():
    data = {
        **PYTORCH,
        "command": "torchrun --nnodes ${WORLD_SIZE} --node_rank ${RANK} --master_addr $MASTER_ADDR train.py --tag a$-b",
        "env": {
            "ENDPOINT": "${MASTER_ADDR}:${MASTER_PORT}",
            "LABEL": "run-$ENDPOINT",
            "PRICE": "$(5) and $$",
        },
    }
    docs = export(data)
    job = jobs(docs)["ddp-worker"]
    names = [e["name"] for e in container(job)["env"]]
    assert names[0] == "MA_TASK_INDEX" and names[-3:] == ["ENDPOINT", "LABEL", "PRICE"]
    env, command, _ = pod(job, 1)
    assert env["ENDPOINT"] == "ddp-worker-0.ddp:29500"
    assert env["LABEL"] == "run-ddp-worker-0.ddp:29500"
    assert env["PRICE"] == "$(5) and $$"  # kept as written: kubelet sees doubled dollars
    assert command[:7] == [
        "torchrun",
        "--nnodes",
        "2",
        "--node_rank",
        "1",
        "--master_addr",
        "ddp-worker-0.ddp",
    ]
    assert command[-1] == "a$-b"
    check_pods_match_plans(data, docs)


def test_a_shell_command_is_left_to_the_shell():
    data = {"name": "sh", "command": "bash -c 'echo $(hostname) ${RANK:-none} $$'"}
    job = jobs(export(data))["sh-worker"]
    _, command, _ = pod(job, 0)
    assert command == ["bash", "-c", "echo $(hostname) ${RANK:-none} $$"]


def test_a_variable_the_manifest_cannot_define_is_refused():
    with pytest.raises(InvalidSpec, match=r"env PATH refers to \$\{PATH\}.*give the value in full") as err:
        export({"name": "p", "command": "python a.py", "env": {"PATH": "/opt/conda/bin:$PATH"}})
    assert err.value.field == "env"
    with pytest.raises(InvalidSpec, match=r"the command refers to \$\{HOME\}"):
        export({"name": "p", "command": "python ${HOME}/a.py"})


def test_nodes_that_differ_beyond_their_index_get_a_job_each():
    batch = {
        "name": "sweep",
        "type": "batch",
        "algorithm": "/code",
        "outputs": "/out",
        "tasks": [{"command": "python a.py --lr 1"}, {"command": "python b.py", "algorithm": "/code-b"}],
    }
    docs = export(batch)
    assert list(jobs(docs)) == ["sweep-task-0", "sweep-task-1"]
    for index, job in enumerate(jobs(docs).values()):
        assert "completionMode" not in job["spec"] and job["spec"]["completions"] == 1
        assert job["spec"]["template"]["spec"]["hostname"] == f"sweep-task-{index}"
        (outputs,) = [m for m in container(job)["volumeMounts"] if m["mountPath"] == "/workspace/outputs"]
        assert outputs["subPath"] == f"sweep-{index}"
    claims = [
        v["persistentVolumeClaim"]["claimName"]
        for v in jobs(docs)["sweep-task-1"]["spec"]["template"]["spec"]["volumes"]
        if "persistentVolumeClaim" in v
    ]
    assert claims[0] == "sweep-task-1-algorithm"
    check_pods_match_plans(batch, docs)
    mindspore = {
        "name": "ms",
        "mode": "mindspore-ascend",
        "nodes": 2,
        "specs": ["npu.emu-2"],
        "command": "python m.py",
    }
    docs = export(mindspore)
    assert list(jobs(docs)) == ["ms-worker-0", "ms-worker-1"]
    assert container(jobs(docs)["ms-worker-0"])["resources"]["limits"]["huawei.com/Ascend910"] == "2"
    check_pods_match_plans(mindspore, docs)


def test_mode_files_are_a_config_map_mounted_at_their_paths():
    data = {"name": "ds", "mode": "pytorch-deepspeed", "nodes": 2, "command": "python t.py"}
    docs = export(data)
    (files,) = [d for d in docs if d["metadata"]["name"] == "ds-files"]
    job = jobs(docs)["ds-worker"]
    (mount,) = [m for m in container(job)["volumeMounts"] if m["mountPath"] == "/job/hostfile"]
    assert mount["readOnly"] is True
    assert files["data"][mount["subPath"]] == "ds-worker-0.ds slots=1\nds-worker-1.ds slots=1\n"


def test_the_shipped_helpers_run_in_a_bare_python(tmp_path):
    """The node-side ConfigMap, laid out as the pod sees it, runs the rank-log helper without
    this checkout or an installed ma_jupyter."""
    docs = export(PYTORCH)
    helpers = docs[1]
    job = jobs(docs)["ddp-worker"]
    (volume,) = [v for v in job["spec"]["template"]["spec"]["volumes"] if v["name"] == "nodeside"]
    root = tmp_path / "opt"
    for item in volume["configMap"]["items"]:
        path = root / item["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(helpers["data"][item["key"]])
    logs = tmp_path / "logs"
    logs.mkdir()
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(root), "MA_RANK_LOG_DIR": str(logs), "RANK": "1"}
    code = "import ma_jupyter.nodeside.rank_log as m; print(m.__file__)"
    run = subprocess.run(
        [sys.executable, "-m", "ma_jupyter.nodeside.rank_log", "--rank-var=RANK", sys.executable, "-c", code],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout == f"[rank 1] {root}/ma_jupyter/nodeside/rank_log.py\n"
    assert (logs / "rank-1.log").read_text() == f"{root}/ma_jupyter/nodeside/rank_log.py\n"
    path_entry = {e["name"]: e.get("value") for e in container(job)["env"]}["PYTHONPATH"]
    assert path_entry == k8s.NODESIDE_ROOT


def test_names_are_dns_labels():
    long_name = "My_Very.Long-Experiment_" + "x" * 39
    docs = export({"name": long_name, "mode": "pytorch", "nodes": 12, "command": "python a.py"})
    for doc in docs:
        if doc["kind"] in ("Service", "Job"):
            assert DNS_LABEL.match(doc["metadata"]["name"]), doc["metadata"]["name"]
    job = next(iter(jobs(docs).values()))
    assert DNS_LABEL.match(pod(job, 11)[2].split(".")[0])
    (service,) = [d for d in docs if d["kind"] == "Service"]
    assert service["metadata"]["name"].startswith("my-very-long-experiment-x")
    docs = export({"name": "9lives", "command": "python a.py"})
    assert [d["metadata"]["name"] for d in docs if d["kind"] == "Service"] == ["ma-9lives"]


def test_refusals_name_what_to_do():
    with pytest.raises(InvalidSpec, match="horovod mode cannot be exported.*remote shell") as err:
        export({"name": "h", "mode": "horovod", "nodes": 2, "command": "python a.py"})
    assert err.value.field == "mode"
    with pytest.raises(InvalidSpec, match="unknown export format 'helm': choose one of k8s") as err:
        check_format("helm")
    assert err.value.field == "format"
    with pytest.raises(InvalidSpec, match="choose pvc .* or hostpath"):
        export(PYTORCH, mounts_as="nfs")
    with pytest.raises(InvalidSpec, match="is not a container image name"):
        export(PYTORCH, image="bad image\n")


def test_image_default_and_choice():
    assert container(jobs(export(PYTORCH))["ddp-worker"])["image"] == k8s.MODE_IMAGES[k8s.Mode.pytorch]
    assert (
        container(jobs(export({"name": "s", "command": "python a.py"}))["s-worker"])["image"]
        == k8s.DEFAULT_IMAGE
    )
    chosen = jobs(export(PYTORCH, image="registry.local/team/torch:2.5@sha256:abc"))["ddp-worker"]
    assert container(chosen)["image"] == "registry.local/team/torch:2.5@sha256:abc"


def test_a_job_not_submitted_uses_its_base_name_as_id():
    job = jobs(export(PYTORCH, job_id=None))["ddp-worker"]
    assert pod(job, 0)[0]["MA_JOB_ID"] == "ddp"


def test_yaml_has_no_aliases_and_keeps_sources_readable():
    spec = JobSpec.model_validate({**PYTORCH, "lifecycle": {"on_start": "python prep.py"}})
    flavor = SCHEDULER.cluster.spec("cpu.medium")
    text = render("k8s", spec, job_id="j", flavor_of=lambda role: flavor, outputs="/o")
    assert "&id" not in text and "*id" not in text
    assert "  ma_jupyter.nodeside.rank_log.py: |" in text  # a source file as a block, line by line
    assert Path(k8s.__file__).name == "k8s.py"


def test_priority_node_choice_and_who_are_exported():
    docs = export(
        {
            "name": "urgent",
            "command": "python a.py",
            "priority": "urgent",
            "node_name": "gpu-node-3",
            "access": "none",
            "creator": "alice",
        }
    )
    (priority,) = [d for d in docs if d["kind"] == "PriorityClass"]
    assert docs[0] is priority  # cluster-wide, applied before the pods that name it
    assert priority["metadata"]["name"] == "ma-jupyter-urgent"
    assert priority["value"] > k8s.PRIORITY_VALUES[k8s.Priority.normal]
    assert priority["preemptionPolicy"] == "Never"
    job = jobs(docs)["urgent-worker"]
    template = job["spec"]["template"]["spec"]
    assert template["priorityClassName"] == "ma-jupyter-urgent"
    assert template["nodeSelector"] == {"kubernetes.io/hostname": "gpu-node-3"}
    annotations = job["metadata"]["annotations"]
    assert annotations["ma-jupyter/creator"] == "alice"
    assert annotations["ma-jupyter/access"] == "none"
    pooled = jobs(
        export({"name": "p", "command": "python a.py", "pool": "pool-a", "priority": "very-urgent"})
    )["p-worker"]["spec"]["template"]["spec"]
    assert pooled["nodeSelector"] == {k8s.POOL_LABEL: "pool-a"}
    assert pooled["priorityClassName"] == "ma-jupyter-very-urgent"
    plain = jobs(export({"name": "n", "command": "python a.py"}))["n-worker"]["spec"]["template"]["spec"]
    assert "nodeSelector" not in plain and plain["priorityClassName"] == "ma-jupyter-normal"


def test_data_preparation_copies_each_dataset_to_the_node_before_the_command(tmp_path):
    data = {
        "name": "prep",
        "command": "python a.py",
        "data_preparation": True,
        "datasets": [{"name": "mnist", "path": "/data/mnist"}, {"name": "coco", "path": "/data/coco"}],
        "lifecycle": {"on_start": "python setup.py"},
    }
    job = jobs(export(data))["prep-worker"]
    template = job["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in template["volumes"]}
    init = template["initContainers"]
    # the copies first, then the user's on_start, which may read the prepared data
    assert [c["name"] for c in init] == ["prepare-0", "prepare-1", "on-start"]
    mounts = {m["mountPath"]: m for m in container(job)["volumeMounts"]}
    for target in ("/workspace/dataset/private/mnist", "/workspace/dataset/private/coco"):
        # the job reads the node's copy (an emptyDir), read-only; the source is not mounted in it
        assert mounts[target]["readOnly"] is True
        assert volumes[mounts[target]["name"]] == {"name": mounts[target]["name"], "emptyDir": {}}
    prepare = init[0]
    source, copy = prepare["volumeMounts"]
    assert source["readOnly"] is True and "persistentVolumeClaim" in volumes[source["name"]]
    assert volumes[copy["name"]] == {"name": copy["name"], "emptyDir": {}}
    assert prepare["command"][:2] == ["cp", "-a"]
    # the argv does what it says: the folder's whole content, hidden files too
    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "sub").mkdir(parents=True)
    (src / ".hidden").write_text("h")
    (src / "sub" / "x.bin").write_text("x")
    dst.mkdir()
    argv = [prepare["command"][0], prepare["command"][1], f"{src}/.", str(dst)]
    subprocess.run(argv, check=True)
    assert (dst / ".hidden").read_text() == "h" and (dst / "sub" / "x.bin").read_text() == "x"
    assert prepare["command"][2] == f"{source['mountPath']}/." and prepare["command"][3] == copy["mountPath"]
    # without preparation the dataset is the claim itself
    plain = jobs(export({**data, "data_preparation": False}))["prep-worker"]
    plain_mounts = {m["mountPath"]: m for m in container(plain)["volumeMounts"]}
    assert plain_mounts["/workspace/dataset/private/mnist"]["name"].startswith("ws-")
    assert [c["name"] for c in plain["spec"]["template"]["spec"]["initContainers"]] == ["on-start"]
