"""The ModelArts convention (seeds 000/001) on real nodes: the conda boot rule in single mode,
and the Ascend rank table at ``/user/config``."""

from __future__ import annotations

import os
import sys

from tests.fixtures.service_api import full_log, submit, wait_status

SHOW = "import os, sys\nprint('python', sys.executable)\nprint('lib', os.environ.get('LD_LIBRARY_PATH'))\n"


def test_the_conda_rule_applies_in_single_mode(ma_service, tmp_path):
    code = tmp_path / "code"
    bin_dir = code / "conda" / "envs" / "py37" / "bin"
    bin_dir.mkdir(parents=True)
    # a conda env inside the algorithm folder whose python is the venv's (the sandbox sees both)
    os.symlink(sys.executable, bin_dir / "python")
    (code / "train.py").write_text(SHOW)
    anaconda = "/workspace/algorithm/conda"
    job = submit(
        ma_service,
        command="python train.py",
        algorithm=str(code),
        convention="modelarts",
        env={"ANACONDA_DIR": anaconda, "DEFAULT_CONDA_ENV_NAME": "py37"},
    )
    final = wait_status(ma_service, job["id"], {"succeeded", "error"})
    log = full_log(ma_service, job["id"])
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


def test_a_mindspore_job_finds_its_completed_rank_table_at_user_config(ma_service, tmp_path):
    code = tmp_path / "ms"
    code.mkdir()
    (code / "train.py").write_text(WAITS_FOR_TABLE)
    job = submit(
        ma_service,
        command="python train.py",
        algorithm=str(code),
        mode="mindspore-ascend",
        nodes=2,
        specs=["npu.emu-2"],
        convention="modelarts",
    )
    final = wait_status(ma_service, job["id"], {"succeeded", "error"})
    logs = full_log(ma_service, job["id"]) + full_log(ma_service, job["id"], node="worker-1")
    assert final["status"] == "succeeded", logs
    seen = sorted(
        line.split("table /user/config ")[1].split()[0]
        for line in logs.splitlines()
        if "table /user/config " in line
    )
    assert seen == ["0", "1", "2", "3"] and logs.count(" completed 1") == 4, logs


LAYOUT = """
import os
print('cwd', os.getcwd())
print('code', sorted(os.listdir('/home/ma-user/modelarts/user-job-dir/mycode')))
for folder in ('/home/ma-user/modelarts', '/cache', '/dev/shm'):
    with open(os.path.join(folder, 'probe'), 'w') as fh:
        fh.write('x')
    print('writable', folder)
"""


def test_a_modelarts_node_sees_the_container_layout(ma_service, tmp_path):
    code = tmp_path / "mycode"
    code.mkdir()
    (code / "train.py").write_text(LAYOUT)
    job = submit(ma_service, command="python train.py", algorithm=str(code), convention="modelarts")
    final = wait_status(ma_service, job["id"], {"succeeded", "error"})
    log = full_log(ma_service, job["id"])
    assert final["status"] == "succeeded", log
    assert "cwd /home/ma-user/modelarts/user-job-dir/mycode\n" in log
    assert "code ['train.py']\n" in log
    for folder in ("/home/ma-user/modelarts", "/cache", "/dev/shm"):
        assert f"writable {folder}\n" in log
