"""The ModelArts convention (seeds 000/001) on real nodes: the conda boot rule in single mode,
and the Ascend rank table at ``/user/config``."""

from __future__ import annotations

import json
import os
import sys

from tests.fixtures.service_api import full_log, submit, wait_status

SHOW = "import os, sys\nprint('python', sys.executable)\nprint('lib', os.environ.get('LD_LIBRARY_PATH'))\n"


def test_the_conda_rule_applies_in_single_mode(ma_module_service, tmp_path):
    code = tmp_path / "code"
    bin_dir = code / "conda" / "envs" / "py37" / "bin"
    bin_dir.mkdir(parents=True)
    # a conda env inside the algorithm folder whose python is the venv's (the sandbox sees both)
    os.symlink(sys.executable, bin_dir / "python")
    (code / "train.py").write_text(SHOW)
    anaconda = "/workspace/algorithm/conda"
    job = submit(
        ma_module_service,
        command="python train.py",
        algorithm=str(code),
        convention="modelarts",
        env={"ANACONDA_DIR": anaconda, "DEFAULT_CONDA_ENV_NAME": "py37"},
    )
    final = wait_status(ma_module_service, job["id"], {"succeeded", "error"})
    log = full_log(ma_module_service, job["id"])
    assert final["status"] == "succeeded", log
    assert f"python {anaconda}/envs/py37/bin/python\n" in log
    assert f"lib {anaconda}/envs/py37/lib\n" in log


WAITS_FOR_TABLE = """
import json, os, sys, time
path = os.path.join(os.environ['RANK_TABLE_FILE'], 'jobstart_hccl.json')
for _ in range(600):
    table = json.load(open(path))
    if table['status'] == 'completed':
        break
    time.sleep(0.05)
print('table', os.environ['RANK_TABLE_FILE'], os.environ['RANK_ID'], table['status'], table['group_count'])
"""


def test_a_mindspore_job_finds_its_completed_rank_table_at_user_config(ma_module_service, tmp_path):
    code = tmp_path / "ms"
    code.mkdir()
    (code / "train.py").write_text(WAITS_FOR_TABLE)
    job = submit(
        ma_module_service,
        command="python train.py",
        algorithm=str(code),
        mode="mindspore-ascend",
        nodes=2,
        specs=["npu.emu-2"],
        convention="modelarts",
    )
    final = wait_status(ma_module_service, job["id"], {"succeeded", "error"})
    logs = full_log(ma_module_service, job["id"]) + full_log(ma_module_service, job["id"], node="worker-1")
    assert final["status"] == "succeeded", logs
    seen = sorted(
        line.split("table /user/config ")[1].split()[0]
        for line in logs.splitlines()
        if "table /user/config " in line
    )
    assert seen == ["0", "1", "2", "3"] and logs.count(" completed 1") == 4, logs


LAYOUT = """
import json
import os
print('cwd', os.getcwd())
print('code', sorted(os.listdir('/home/ma-user/modelarts/user-job-dir/mycode')))
for folder in ('/home/ma-user/modelarts', '/cache', '/dev/shm'):
    with open(os.path.join(folder, 'probe'), 'w') as fh:
        fh.write('x')
    print('writable', folder)
"""


def test_a_modelarts_node_sees_the_container_layout(ma_module_service, tmp_path):
    code = tmp_path / "mycode"
    code.mkdir()
    (code / "train.py").write_text(LAYOUT)
    job = submit(ma_module_service, command="python train.py", algorithm=str(code), convention="modelarts")
    final = wait_status(ma_module_service, job["id"], {"succeeded", "error"})
    log = full_log(ma_module_service, job["id"])
    assert final["status"] == "succeeded", log
    assert "cwd /home/ma-user/modelarts/user-job-dir/mycode\n" in log
    assert "code ['train.py']\n" in log
    for folder in ("/home/ma-user/modelarts", "/cache", "/dev/shm"):
        assert f"writable {folder}\n" in log


TF_SHOW = """
import json, os, sys
own = json.loads(os.environ['TF_CONFIG'])['task']
print('task', os.environ.get('MA_TASK_NAME'), own['type'], own['index'])
print('argv', json.dumps(sys.argv[1:]))
print('hosts', os.environ.get('TF_PS_HOSTS', '-'), os.environ.get('TF_WORKER_HOSTS', '-'))
"""


def test_modelarts_tensorflow_layout_on_real_nodes(ma_module_service, tmp_path):
    """Seed 001/004: two nodes run a ps beside each worker with ports in 5000-10000 and the
    arguments appended; one node runs `python <boot file> <args>` and nothing else."""
    code = tmp_path / "tf"
    code.mkdir()
    (code / "train.py").write_text(TF_SHOW)
    common = {"command": "python train.py --epochs 5", "algorithm": str(code), "convention": "modelarts"}
    two = submit(ma_module_service, mode="tensorflow", nodes=2, **common)
    one = submit(ma_module_service, mode="tensorflow", **common)
    final = wait_status(ma_module_service, two["id"], {"succeeded", "error"})
    logs = {
        n: full_log(ma_module_service, two["id"], node=n) for n in ("ps-0", "ps-1", "worker-0", "worker-1")
    }
    assert final["status"] == "succeeded", logs
    hosts = {n["name"]: n["host"] for n in final["nodes"]}
    assert hosts["ps-0"] == hosts["worker-0"] != hosts["worker-1"] == hosts["ps-1"], hosts
    worker = logs["worker-1"]
    assert "task worker worker 1\n" in worker, worker
    ps_hosts, worker_hosts = worker.split("hosts ")[1].split()
    endpoints = ps_hosts.split(",") + worker_hosts.split(",")
    assert len(endpoints) == 4 and all(5000 <= int(e.rsplit(":", 1)[1]) <= 10000 for e in endpoints), (
        endpoints
    )
    argv = ["--epochs", "5", "--task_index", "1", "--ps_hosts", ps_hosts, "--worker_hosts", worker_hosts]
    assert f"argv {json.dumps([*argv, '--job_name', 'worker'])}\n" in worker, worker
    assert "task ps ps 0\n" in logs["ps-0"], logs["ps-0"]
    final = wait_status(ma_module_service, one["id"], {"succeeded", "error"})
    log = full_log(ma_module_service, one["id"])
    assert final["status"] == "succeeded", log
    assert [n["name"] for n in final["nodes"]] == ["worker-0"]
    assert 'argv ["--epochs", "5"]\n' in log, log
