"""A development environment from a job: its notebook's code cell, run, submits the same job.

The notebook comes from the real service (``GET /jobs/{id}/devenv``); its cells run in the
in-process IPython shell against that service, and the job they submit is compared with the
original field by field (all but the name's creation fields: creator, and the algorithm, a
fresh snapshot of the same code).
"""

from __future__ import annotations

import json

import pytest

from ma_jupyter.frontends.notebook import session
from ma_jupyter.models import JobSpec
from tests.helpers import writable_dir
from tests.magic_shell import Run

pytestmark = pytest.mark.timeout(300)

#: fields a resubmitted job may differ in: who made it, and its algorithm folder (a fresh copy,
#: which records the folder it was copied from)
CREATION = {"creator", "algorithm", "algorithm_origin"}


def _same_job(original: JobSpec, again: JobSpec) -> None:
    assert again.model_dump(mode="json", exclude=CREATION) == original.model_dump(
        mode="json", exclude=CREATION
    )
    # the copy is found under the folder the original ran (its own, or the one it came from)
    if again.algorithm_origin:
        assert again.algorithm_origin in (original.algorithm, original.algorithm_origin)


def _cells(notebook: dict) -> dict[str, dict]:
    return {cell["id"]: cell for cell in notebook["cells"]}


def _run_cells(shell, notebook: dict, **secrets: str) -> Run:
    """Run the setup cell (then set the secrets' values, as papermill's parameters would) and
    the job's cell; the Run of the job's cell."""
    cells = _cells(notebook)
    setup = Run(shell, cells["setup"]["source"])
    assert setup.error is None, setup.stdout + setup.stderr
    shell.user_ns.update(secrets)
    return Run(shell, cells["train"]["source"])


def test_a_cell_job_comes_back_as_its_cell_with_every_option(ma_module_shell, tmp_path):
    data, volume, outputs = tmp_path / "data", tmp_path / "vol", tmp_path / "out"
    for folder in (data, volume, outputs):
        writable_dir(folder)
    ma_module_shell.user_ns.update(
        data=str(data), volume=str(volume), outputs=str(outputs), literal="${GREETING}-{x}-$HOME"
    )
    body = (
        "import os\n"
        "print('greeting', os.environ['GREETING'], '{braces}', '$dollar', flush=True)\n"
        "print('secret length:', len(os.environ['TOKEN']), flush=True)\n"
    )
    first = Run(
        ma_module_shell,
        "%%ma_train --name devcell --spec cpu.small --priority urgent --access rw --duration 2h "
        "--restart 2 --grace 7 --dataset d={data} --volume v={volume} --output {outputs} --data-preparation "
        "--env GREETING=hello --env LITERAL={literal} --secret-env 'TOKEN=s3cret words' "
        "--on-start 'echo starting' --out original\n" + body,
    )
    assert first.error is None, first.stdout + first.stderr
    original = ma_module_shell.user_ns["original"].refresh()
    assert original.spec.env["LITERAL"] == "${GREETING}-{x}-$HOME"
    client = session.get_client()
    made = client.devenv(original.id)
    assert made["name"] == "devcell-devenv.ipynb"
    notebook = made["notebook"]
    assert notebook["nbformat"] == 4
    cells = _cells(notebook)
    assert [c["cell_type"] for c in notebook["cells"]] == ["markdown", "code", "code"]
    assert "devcell" in cells["job"]["source"] and original.id in cells["job"]["source"]
    # secrets are never shown: a variable to fill in, with a comment saying so
    assert "s3cret" not in json.dumps(notebook)
    assert 'SECRET_TOKEN = ""  # fill in' in cells["setup"]["source"]
    assert cells["setup"]["metadata"]["tags"] == ["parameters"]
    train = cells["train"]["source"]
    assert train.startswith("%%ma_train ") and train.endswith(body.rstrip("\n"))
    assert "--code-dir" not in train  # the cell's own snapshot: the body is the code

    again = _run_cells(ma_module_shell, notebook, SECRET_TOKEN="s3cret words")
    assert again.error is None, again.stdout + again.stderr
    text = again.job_text()
    assert "greeting hello {braces} $dollar" in text and "secret length: 12" in text
    jobs = [h.info for h in client.jobs(name="devcell")]
    assert len(jobs) == 2
    resubmitted = next(j for j in jobs if j.id != original.id)
    _same_job(original.spec, resubmitted.spec)
    with (
        open(f"{resubmitted.spec.algorithm}/devcell.py") as new,
        open(f"{original.spec.algorithm}/devcell.py") as old,
    ):
        assert new.read() == old.read()


def test_a_command_job_comes_back_with_its_folder_and_command(ma_module_shell, tmp_path):
    code = tmp_path / "algo"
    code.mkdir()
    (code / "train.py").write_text(
        "import os, sys\nprint('args', sys.argv[1:], os.environ['RANK'], flush=True)\n"
    )
    client = session.get_client()
    original = client.submit(
        {
            "name": "devcmd",
            "mode": "pytorch",
            "nodes": 2,
            "specs": ["cpu.small"],
            "algorithm": str(code),
            "command": "python train.py --port ${MASTER_PORT} --tag '{a b}'",
            "checkpoint_resume": {"max_resumes": 2, "elastic_min_nodes": 1, "perf_threshold": 1.5},
            "grace_period": 12,
            "env": {"PATH_EXTRA": "$HOME/bin"},
        }
    ).wait(timeout=240)
    assert original.status.value == "succeeded", original.reason
    notebook = client.devenv(original.id)["notebook"]
    train = _cells(notebook)["train"]["source"]
    assert train.startswith("%ma_train ") and "\n" not in train
    ma_module_shell.user_ns["MASTER_PORT"] = "not-this"  # IPython must not expand the job's own variables
    again = _run_cells(ma_module_shell, notebook)
    assert again.error is None, again.stdout + again.stderr
    resubmitted = next(h.info for h in client.jobs(name="devcmd") if h.id != original.id)
    # --grace sets both grace periods: the checkpoint's is kept, the note says so
    assert resubmitted.spec.checkpoint_resume.grace_period == original.spec.checkpoint_resume.grace_period
    _same_job(
        original.spec.model_copy(update={"grace_period": original.spec.checkpoint_resume.grace_period}),
        resubmitted.spec,
    )
    assert "grace period" in _cells(notebook)["job"]["source"]
    final = client.job(resubmitted.id).wait(timeout=240)
    assert final.status.value == "succeeded", final.reason
    assert "--tag', '{a b}'" in "".join(client.job(resubmitted.id).logs())


def test_a_batch_job_comes_back_as_its_tasks(ma_module_shell, tmp_path):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "task.py").write_text(f"print('task {name}', flush=True)\n")
    client = session.get_client()
    tasks = [{"algorithm": str(tmp_path / n), "command": "python task.py"} for n in ("a", "b")]
    original = client.submit({"name": "devbatch", "type": "batch", "tasks": tasks}).info
    notebook = client.devenv(original.id)["notebook"]
    again = _run_cells(ma_module_shell, notebook)
    assert again.error is None, again.stdout + again.stderr
    resubmitted = next(h.info for h in client.jobs(name="devbatch") if h.id != original.id)
    _same_job(original.spec, resubmitted.spec)


def test_devenv_magic_writes_the_notebook_and_links_it(ma_module_shell, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = Run(ma_module_shell, "%%ma_train --name linked --out job\nprint('x')\n")
    assert first.error is None, first.stdout + first.stderr
    job_id = ma_module_shell.user_ns["job"].id
    made = Run(ma_module_shell, f"%ma_devenv {job_id}")
    assert made.error is None, made.stdout + made.stderr
    path = tmp_path / "linked-devenv.ipynb"
    assert made.result.result == str(path)
    assert json.loads(path.read_text())["cells"][2]["source"].startswith("%%ma_train --name linked")
    assert "linked-devenv.ipynb" in "".join(str(o.data) for o in made.outputs)
    second = Run(ma_module_shell, f"%ma_devenv {job_id}")  # never overwrites
    assert second.result.result == str(tmp_path / "linked-devenv-2.ipynb")
    refused = Run(ma_module_shell, "%ma_devenv no-such-job")
    assert refused.error is not None and "no job" in refused.stdout + refused.stderr


def test_a_cell_job_with_a_code_dir_keeps_its_folder(ma_module_shell, tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "helper.py").write_text("WORD = 'from the helper'\n")
    ma_module_shell.user_ns["code_dir"] = str(code)
    first = Run(
        ma_module_shell,
        "%%ma_train --name withhelper --code-dir {code_dir} --out original\nimport helper\nprint(helper.WORD)\n",
    )
    assert first.error is None, first.stdout + first.stderr
    original = ma_module_shell.user_ns["original"].info
    client = session.get_client()
    train = _cells(client.devenv(original.id)["notebook"])["train"]["source"]
    # the snapshot holds more than the cell: it is the code folder of the new job too
    assert f"--code-dir {original.spec.algorithm}" in train and train.endswith("print(helper.WORD)")
    again = _run_cells(ma_module_shell, client.devenv(original.id)["notebook"])
    assert again.error is None, again.stdout + again.stderr
    assert "from the helper" in again.job_text()
    resubmitted = next(h.info for h in client.jobs(name="withhelper") if h.id != original.id)
    _same_job(original.spec, resubmitted.spec)
