"""``ma-jupyter`` end to end: each command is a real subprocess against a real, autostarted service."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ma_jupyter.backends.local.backend import task_address
from ma_jupyter.errors import InvalidSpec
from ma_jupyter.models import Event, Job, JobPage, JobSpec, Node, Plan, ResourceUsage, Spec, User
from tests.helpers import BAR_FINAL, CLI_HEAVY_MODULES, PROGRESS_BAR, imported_heavy, wait_for, writable_dir

PY = sys.executable
#: the checkout the tests run from, first on a subprocess's PYTHONPATH
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_submit_wait_exit_codes(ma_module_cli):
    ok = ma_module_cli("submit", "--wait", "--name", "ok", "--", PY, "-c", "print('fine')")
    assert ok.returncode == 0, ok.stderr
    assert ": succeeded (exit code 0)" in ok.stdout
    assert ok.stderr.startswith("submitted ok-")
    bad = ma_module_cli(
        "submit", "--wait", "--name", "bad", "--", PY, "-c", "import sys; print('oops'); sys.exit(4)"
    )
    assert bad.returncode == 1
    assert ": error (exit code 4)" in bad.stdout
    # wait on a finished job gives the same answer
    job_id = bad.stdout.split(":")[0]
    assert ma_module_cli("wait", job_id).returncode == 1
    assert ma_module_cli("wait", "ok").returncode == 0  # JOB may be the exact name of a single job
    # the list says why a job failed, in its last column, and nothing for a plain success
    listing = ma_module_cli("jobs").stdout.splitlines()
    assert listing[0].split()[-1] == "REASON"
    failed = next(line for line in listing if line.startswith(job_id))
    assert "code 4" in failed.split("error", 1)[1], failed
    succeeded = next(line for line in listing if " ok " in line)
    assert "exited" not in succeeded, succeeded


def test_the_quick_commands_load_nothing_heavy_while_they_run(ma_module_service, ma_module_cli, tmp_path):
    """``submit`` (without ``--follow``), ``get``, ``logs`` of a finished job and ``jobs``, each
    a whole call against the service (bench/cli_speed.py times them), and the commands that
    read plain JSON too (``--json``, ``wait`` by name, ``events``, ``specs``, ``nodes``,
    ``whoami``, ``top``, ``clone``): what they imported by their end (``-X importtime``'s list)
    holds none of tests/helpers.py's heavy modules (pydantic among them), nor a folder's copy
    for a command naming no file of the current one, nor the log follower's; and what ``--json``
    prints is the wire model's JSON, as its ``model_dump`` writes it."""
    env = {k: v for k, v in os.environ.items() if k not in ("MA_JUPYTER_TOKEN", "MA_JUPYTER_URL")}
    env |= {
        "MA_JUPYTER_HOME": str(ma_module_service.home),
        "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "PYTHONPROFILEIMPORTTIME": "1",  # each import on stderr: "import time: self | cumulative | name"
    }

    def imports_of(*args: str) -> tuple[str, list[str]]:
        done = subprocess.run(
            [PY, "-m", "ma_jupyter.frontends.cli", *args],
            env=env,
            cwd=tmp_path,  # an empty folder: a submit ships nothing from it
            capture_output=True,
            text=True,
            timeout=120,
        )
        lines = done.stderr.splitlines()
        other = [line for line in lines if not line.startswith("import time:")]
        assert done.returncode == 0, other
        return done.stdout, [line.split("|")[-1].strip() for line in lines if line.startswith("import time:")]

    # a folder's walk, copy and digest (a submit whose command names no file here ships
    # nothing); the log follower's queue (a finished job's log is read, not followed)
    quick_only = ("queue", "ma_jupyter.algorithm_content", "ma_jupyter.foldersize")
    said, modules = imports_of("submit", "--name", "quick", "--", PY, "-c", "print('quick')")
    assert said.startswith("submitted quick-"), said
    assert imported_heavy(modules, CLI_HEAVY_MODULES + quick_only) == []
    job_id = said.split()[1]
    assert ma_module_cli("wait", job_id).returncode == 0
    for args in (["get", job_id], ["logs", job_id], ["jobs"]):
        said, modules = imports_of(*args)
        assert job_id in said or said == "quick\n", (args, said)
        assert imported_heavy(modules, CLI_HEAVY_MODULES + quick_only) == [], args

    def dumped_again(model: type, text: str) -> None:
        data = json.loads(text)
        for item in data if isinstance(data, list) else [data]:
            assert model.model_validate(item).model_dump(mode="json") == item, (model, item)

    as_json = {  # each --json call -> the wire model of what it prints (a list: of each item)
        ("get", job_id, "--json"): Job,
        ("jobs", "--json"): JobPage,
        ("wait", "quick", "--json"): Job,  # by name: whoami and the listing read plain too
        ("events", job_id, "--json"): Event,
        ("specs", "--json"): Spec,
        ("nodes", "--json"): Node,
        ("whoami", "--json"): User,
        ("top", job_id, "--json"): ResourceUsage,
    }
    for args, model in as_json.items():
        said, modules = imports_of(*args)
        assert imported_heavy(modules, CLI_HEAVY_MODULES + quick_only) == [], args
        dumped_again(model, said)
    for args in (["wait", "quick"], ["events", job_id], ["specs"], ["clone", job_id, "--name", "quick-copy"]):
        said, modules = imports_of(*args)
        assert said.startswith((f"{job_id}: succeeded", "SEQ ", "NAME ", "submitted quick-copy-")), (
            args,
            said,
        )
        assert imported_heavy(modules, CLI_HEAVY_MODULES + quick_only) == [], args


def test_submit_json_and_job_commands(ma_cli):
    out = ma_cli(
        "submit",
        "--json",
        "--env",
        "GREETING=hi there",
        "--",
        PY,
        "-c",
        "import os; print(os.environ['GREETING'])",
    )
    assert out.returncode == 0, out.stderr
    job = Job.model_validate_json(out.stdout)
    assert job.spec.env == {"GREETING": "hi there"} and job.spec.name == "python"
    final = Job.model_validate_json(ma_cli("wait", job.id, "--json").stdout)
    assert final.status.value == "succeeded"
    assert ma_cli("logs", job.id).stdout == "hi there\n"
    assert ma_cli("logs", job.id, "--follow").stdout == "hi there\n"
    got = ma_cli("get", job.id)
    assert f"id:        {job.id}" in got.stdout and "status:    succeeded" in got.stdout
    assert Job.model_validate_json(ma_cli("get", job.id, "--json").stdout).id == job.id
    listing = ma_cli("jobs")
    assert listing.stdout.splitlines()[0].split()[:3] == ["ID", "NAME", "STATUS"]
    assert job.id in listing.stdout and "succeeded" in listing.stdout
    page = json.loads(ma_cli("jobs", "--json", "--status", "succeeded").stdout)
    assert page["total"] == 1 and page["items"][0]["id"] == job.id
    assert json.loads(ma_cli("jobs", "--json", "--status", "running").stdout)["total"] == 0
    events = json.loads(ma_cli("events", job.id, "--json").stdout)
    assert events[0]["status"] == "queued" and events[-1]["status"] == "succeeded"
    assert "succeeded" in ma_cli("events", job.id).stdout
    deleted = ma_cli("delete", job.id)
    assert deleted.returncode == 0 and deleted.stdout == f"deleted {job.id}\n"
    assert ma_cli("get", job.id).returncode == 2


def test_dry_run_prints_the_plan_and_creates_nothing(ma_module_cli, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    text = ma_module_cli(
        "submit",
        "--dry-run",
        "--name",
        "planned",
        "--env",
        "LR=0.1",
        "--dataset",
        "mnist=data",
        "--",
        "python",
        "train.py",
        "--lr",
        "${LR}",
    )
    assert text.returncode == 0, text.stderr
    assert "node worker-0 (worker 0" in text.stdout
    assert "  argv:    python train.py --lr '${LR}'" in text.stdout
    assert "    LR=0.1" in text.stdout
    as_json = ma_module_cli(
        "submit", "--dry-run", "--json", "--name", "planned", "--env", "LR=0.1", "--", "python", "train.py"
    )
    plan = Plan.model_validate_json(as_json.stdout)
    assert plan.nodes[0].argv == ["python", "train.py"] and plan.nodes[0].env["LR"] == "0.1"
    # the module's service is shared: count the jobs of this test's name
    assert json.loads(ma_module_cli("jobs", "--json", "--name", "planned").stdout)["total"] == 0


def test_dry_run_shows_the_launchers_variables_and_the_expanded_env(ma_module_cli, ma_module_client):
    text = ma_module_cli(
        "submit",
        "--dry-run",
        "--mode",
        "pytorch",
        "--nodes",
        "2",
        "--env",
        "OUT=${MA_WORKSPACE}/outputs/node-${NODE_RANK}",
        "--env",
        "LOG=$OUT/log",
        "--",
        "torchrun",
        "train.py",
    )
    assert text.returncode == 0, text.stderr
    worker_1 = text.stdout[text.stdout.index("node worker-1") :]
    for line in (
        "NODE_RANK=1",
        "GROUP_RANK=1",
        "PET_NNODES=2",
        "PET_NODE_RANK=1",
        "PET_NPROC_PER_NODE=1",
        f"PET_MASTER_ADDR={task_address(0)}",
        "PET_RDZV_BACKEND=static",
        "OUT=/workspace/outputs/node-1",
        "LOG=/workspace/outputs/node-1/log",
    ):
        assert f"    {line}\n" in worker_1, line

    # torchrun told to make a one-node job of its own on two nodes would wait forever: refused at
    # the submit (CLI and REST) and at the dry run (REST's POST /plan), with the fix, nothing stored
    refused = ma_module_cli(
        "submit",
        "--name",
        "alone",
        "--mode",
        "pytorch",
        "--nodes",
        "2",
        "--",
        "torchrun",
        "--standalone",
        "train.py",
    )
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    assert "--standalone on a job of 2 nodes" in refused.stderr and "--nodes 1" in refused.stderr, (
        refused.stderr
    )
    alone = JobSpec(name="alone", mode="pytorch", nodes=2, command="torchrun --nnodes=1 train.py")
    for call in (ma_module_client.submit, ma_module_client.plan):
        with pytest.raises(InvalidSpec, match="--nnodes 1 on a job of 2 nodes"):
            call(alone)
    assert ma_module_client.jobs(name="alone") == []


def test_user_errors_print_one_line_and_exit_2(ma_module_cli):
    for args, expected in [
        (["submit", "--nodes", "0", "--", "python", "x.py"], "error: argument --nodes: must be 1 or more"),
        (["submit", "--", "KEY=1", "python", "x.py"], "bash -c"),
        (["submit", "--spec", "nope", "--", "python", "x.py"], "error: unknown spec 'nope'"),
        (["submit", "--name", "x"], "give the command after `--`"),
        (["get", "no-such-job"], "error: no job has the id or name 'no-such-job'"),
        (["frobnicate"], "error: argument COMMAND: invalid choice"),
        (["logs"], "the following arguments are required: JOB"),
        (["submit", "python", "train.py", "--lr", "1"], "put the command after `--`"),
    ]:
        result = ma_module_cli(*args)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: "), result.stderr
        assert expected in result.stderr, result.stderr
        assert result.stdout == ""
    # the CLI leaves a spec's validation to the service (client/plain.py): its refusal reads as
    # the client's own check words it
    from ma_jupyter.client.spec import check
    from ma_jupyter.errors import InvalidSpec

    for args, spec in [
        (["--name", "bad name!"], {"name": "bad name!"}),
        (["--mode", "single", "--nodes", "2"], {"name": "x", "mode": "single", "nodes": 2}),
    ]:
        try:
            check({**spec, "command": "python x.py"})
        except InvalidSpec as exc:
            said = exc.message
        result = ma_module_cli("submit", *args, "--", "python", "x.py")
        assert (result.returncode, result.stderr) == (2, f"error: {said}\n")


def test_stop_a_running_job_and_follow_its_log(ma_module_cli):
    code = "import time\nprint('started', flush=True)\ntime.sleep(300)"
    out = ma_module_cli("submit", "--json", "--grace", "1", "--name", "long", "--", PY, "-c", code)
    job = Job.model_validate_json(out.stdout)
    assert ma_module_cli("wait", job.id, "--timeout", "0.5").returncode == 1
    stop = ma_module_cli("stop", job.id)
    assert stop.returncode == 0 and stop.stdout.startswith(f"stopping {job.id}")
    # a follower started now ends when the job has stopped
    follow = ma_module_cli("logs", "long", "--follow")
    assert follow.returncode == 0 and follow.stdout == "started\n"
    assert "stopped" in ma_module_cli("wait", job.id).stdout


def test_service_commands(ma_cli, ma_client):
    version = ma_cli("--version")
    assert version.returncode == 0 and version.stdout.startswith("ma-jupyter ")
    assert ma_cli("service", "status").returncode == 1
    started = ma_cli("service", "start")
    assert started.returncode == 0 and "running at http://127.0.0.1:" in started.stdout
    status = json.loads(ma_cli("service", "status", "--json").stdout)
    assert status["running"] and ma_client.service_status()["pid"] == status["pid"]
    assert ma_cli("specs").stdout.startswith("NAME")
    assert {s["name"] for s in json.loads(ma_cli("specs", "--json").stdout)} >= {"cpu.small", "cpu.medium"}
    assert json.loads(ma_cli("nodes", "--json").stdout)[0]["name"]
    stopped = ma_cli("service", "stop")
    assert stopped.returncode == 0 and f"pid {status['pid']}" in stopped.stdout
    assert ma_cli("service", "stop").stdout == "no job service was running\n"
    assert not ma_client.service_status()["running"]


def test_update_and_tensorboard_commands(ma_module_cli, ma_module_client, tmp_path):
    out = tmp_path / "out"
    writable_dir(out)
    code = "import time\nprint('up', flush=True)\ntime.sleep(300)"
    job = Job.model_validate_json(
        ma_module_cli("submit", "--json", "--grace", "1", "--output", "out", "--", PY, "-c", code).stdout
    )
    assert job.spec.outputs == str(out)  # relative to the CLI's working directory
    wait_for(
        lambda: ma_module_client.job(job.id).status.value == "running", timeout=30
    )  # duration: running jobs only
    updated = Job.model_validate_json(ma_module_cli("update", job.id, "--duration", "2h", "--json").stdout)
    assert updated.spec.duration == 7200
    bad = ma_module_cli("update", job.id)
    assert bad.returncode == 2 and "give a priority" in bad.stderr
    url = ma_module_cli("tensorboard", job.id, timeout=120)
    assert url.returncode == 0 and url.stdout.startswith("http://127.0.0.1:"), url.stderr
    stopped_tb = ma_module_cli("tensorboard", job.id, "--stop")
    assert stopped_tb.returncode == 0 and "stopped the TensorBoard" in stopped_tb.stdout
    assert ma_module_cli("stop", job.id).returncode == 0
    assert "stopped" in ma_module_cli("wait", job.id).stdout


def test_logs_of_every_node(ma_module_cli):
    out = ma_module_cli(
        "submit",
        "--json",
        "--mode",
        "pytorch",
        "--nodes",
        "2",
        "--",
        "bash",
        "-c",
        "echo rank $RANK; echo done $RANK",
    )
    assert out.returncode == 0, out.stderr
    job = Job.model_validate_json(out.stdout)
    every_line = ["[worker-0] done 0", "[worker-0] rank 0", "[worker-1] done 1", "[worker-1] rank 1"]
    # every node by default, each line labelled with its node; --all says the same
    for argv in (["--follow"], ["--all", "--follow"]):
        followed = ma_module_cli("logs", job.id, *argv)
        assert followed.returncode == 0, followed.stderr
        assert sorted(followed.stdout.splitlines()) == every_line
        # each node's lines keep their order
        assert followed.stdout.index("[worker-1] rank 1") < followed.stdout.index("[worker-1] done 1")
    assert sorted(ma_module_cli("logs", job.id).stdout.splitlines()) == every_line
    assert ma_module_cli("logs", job.id, "--all").stdout.count("\n") == 4
    # one flag narrows to a node, its lines as the node printed them
    assert ma_module_cli("logs", job.id, "--node", "worker-1").stdout == "rank 1\ndone 1\n"
    assert ma_module_cli("logs", job.id, "--node", "worker-1", "--follow").stdout == "rank 1\ndone 1\n"
    bad = ma_module_cli("logs", job.id, "--all", "--node", "worker-1")
    assert bad.returncode == 2 and "drop --node" in bad.stderr


def test_a_progress_bar_prints_its_final_state(ma_module_cli, tmp_path):
    """A tqdm-style bar (400 \\r redraws, about 14,000 characters on one line) prints as its last state."""
    (tmp_path / "bar.py").write_text(PROGRESS_BAR)
    followed = ma_module_cli("submit", "--follow", "--name", "bar", "--", "python", "bar.py")
    assert followed.returncode == 0, followed.stderr
    assert followed.stdout.splitlines()[:2] == [BAR_FINAL, "after the bar"]
    assert ma_module_cli("logs", "bar").stdout == f"{BAR_FINAL}\nafter the bar\n"
    assert (
        ma_module_cli("logs", "bar", "--all").stdout == f"[worker-0] {BAR_FINAL}\n[worker-0] after the bar\n"
    )


def test_submit_follow_shows_every_node_of_a_job_with_a_chief(ma_module_cli):
    code = "import json, os; t = json.loads(os.environ['TF_CONFIG'])['task']; print('I am', t['type'], t['index'])"
    tf = ["--mode", "tensorflow", "--chief", "--nodes", "2", "--", "python", "-c", code]
    followed = ma_module_cli("submit", "--follow", *tf)
    assert followed.returncode == 0, followed.stderr
    lines = followed.stdout.splitlines()
    assert "[chief-0] I am chief 0" in lines and "[worker-0] I am worker 0" in lines, followed.stdout
    job_id = followed.stderr.split()[1]
    assert ma_module_cli("logs", job_id, "--node", "chief-0").stdout == "I am chief 0\n"
    # --follow-node narrows to one node, without the prefix
    narrowed = ma_module_cli("submit", "--follow", "--follow-node", "chief-0", *tf)
    assert narrowed.returncode == 0, narrowed.stderr
    assert narrowed.stdout.splitlines()[0] == "I am chief 0"
    assert "worker" not in narrowed.stdout
    refused = ma_module_cli("submit", "--follow-node", "chief-0", *tf)
    assert refused.returncode == 2 and "add --follow" in refused.stderr


SINGLE_PROCESS = "import json\nprint(json.dumps({'trained': True}))\n"
READS_RANK = "import os\nprint('rank', os.environ.get('RANK'), flush=True)\n"


def test_a_single_process_script_on_two_nodes_is_warned_about_in_the_dry_run_and_the_events(
    ma_module_cli, tmp_path
):
    for folder, code in (("single", SINGLE_PROCESS), ("aware", READS_RANK)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "train.py").write_text(code)

    def submit(*args: str, folder: str = "single", nodes: str = "2", mode: str = "pytorch"):
        options = ["--code-dir", folder, "--mode", mode, "--nodes", nodes]
        return ma_module_cli("submit", *args, *options, "--", "python", "train.py")

    plan = submit("--dry-run")
    assert plan.returncode == 0, plan.stderr
    assert "note: warning: nothing in the job's code reads a variable of the distributed run" in plan.stdout
    assert "each of the 2 nodes will run its own copy" in plan.stdout
    aware = submit("--dry-run", folder="aware")
    assert aware.returncode == 0 and "warning" not in aware.stdout
    one = submit("--dry-run", nodes="1")
    assert one.returncode == 0 and "warning" not in one.stdout
    # the submitted job carries the warning in its events (tensorflow mode runs the command as written)
    for folder, warned in (("single", True), ("aware", False)):
        out = submit("--wait", folder=folder, mode="tensorflow")
        assert out.returncode == 0, out.stderr + out.stdout
        events = ma_module_cli("events", out.stdout.split(":")[0]).stdout
        assert ("each of the 2 nodes will run its own copy" in events) is warned, events


SAVES_AND_LOADS = (
    "import os, signal, sys\n"
    "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
    "print('resumed' if os.environ.get('MA_RESUME') == '1' else 'fresh')\n"
)


def test_a_resumable_job_whose_code_cannot_resume_is_told_so_by_the_dry_run_and_the_events(
    ma_module_cli, tmp_path
):
    """The readiness check no other platform has: --resume on code without a SIGTERM handler
    that never reads MA_RESUME says so before the first fault."""
    for folder, code in (("plain", SINGLE_PROCESS), ("ready", SAVES_AND_LOADS)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "train.py").write_text(code)

    def submit(*args: str, folder: str):
        return ma_module_cli(
            "submit", *args, "--code-dir", folder, "--resume", "3", "--", "python", "train.py"
        )

    plan = submit("--dry-run", folder="plain")
    assert plan.returncode == 0, plan.stderr
    assert (
        "note: warning: this job asks for 3 resumes but its code neither handles SIGTERM nor reads MA_RESUME"
        in plan.stdout
    )
    ready = submit("--dry-run", folder="ready")
    assert ready.returncode == 0 and "warning" not in ready.stdout, ready.stdout
    out = submit("--wait", folder="plain")
    assert out.returncode == 0, out.stderr + out.stdout
    events = ma_module_cli("events", out.stdout.split(":")[0]).stdout
    assert "asks for 3 resumes but its code neither handles SIGTERM" in events, events


def test_others_access_above_what_a_dataset_allows_is_refused(ma_module_cli, tmp_path):
    """Seed 002: the job's others' access may not exceed its resources' access."""
    private = tmp_path / "private-data"
    private.mkdir()
    private.chmod(0o700)
    (tmp_path / "train.py").write_text(SINGLE_PROCESS)
    dataset = ["--dataset", f"d={private}", "--", "python", "train.py"]
    refused = ma_module_cli("submit", "--dry-run", "--access", "ro", *dataset)
    assert refused.returncode != 0
    assert "others' access ro is more than dataset d allows" in refused.stderr, refused.stderr
    assert "--access none" in refused.stderr
    allowed = ma_module_cli("submit", "--dry-run", "--access", "none", *dataset)
    assert allowed.returncode == 0, allowed.stderr
    # not named, the default is lowered to what the dataset allows
    default = ma_module_cli("submit", "--dry-run", *dataset)
    assert default.returncode == 0, default.stderr


def test_submit_ships_the_current_folder_when_the_command_names_a_file_in_it(ma_cli, ma_home, tmp_path):
    """The README's first example, run in a fresh folder: `python train.py` finds its file."""
    (tmp_path / "train.py").write_text("import helper\nprint('trained with', helper.VALUE)\n")
    (tmp_path / "helper.py").write_text("VALUE = 42\n")
    os.chmod(tmp_path, 0o700)  # a private folder: the job's account still reads the shipped copy
    # others may not see a job of a folder they may not read (access rule 3): judged by the
    # folder shipped from, not by the platform's snapshot of it (0755); asked for, more is
    # refused; left to the default, the job is private
    refused = ma_cli("submit", "--dry-run", "--access", "ro", "--", "python", "train.py")
    assert refused.returncode != 0
    assert f"others' access ro is more than algorithm folder allows: {tmp_path} (mode 700)" in refused.stderr
    plan = ma_cli("submit", "--dry-run", "--", "python", "train.py")
    assert plan.returncode == 0, plan.stderr
    assert f"would ship {tmp_path}" in plan.stdout and "/workspace/algorithm" in plan.stdout
    shipped = ma_cli("submit", "--name", "first", "--follow", "--", "python", "train.py")
    assert shipped.returncode == 0, shipped.stdout + shipped.stderr
    assert "trained with 42" in shipped.stdout
    got = ma_cli("get", "first", "--json")
    assert json.loads(got.stdout)["spec"]["access"] == "none", got.stdout
    assert f"shipped {tmp_path} (2 files" in shipped.stderr
    (tmp_path / "train.py").write_text("print('edited')\n")  # later edits never reach a job
    snapshots = list((ma_home / "snapshots").iterdir())
    assert len(snapshots) == 1 and "edited" not in (snapshots[0] / "train.py").read_text()
    # the service home inside the shipped folder is never copied (its tokens, jobs, snapshots)
    assert not (snapshots[0] / ma_home.name).exists()


def test_a_failure_that_is_not_a_user_error_is_one_line_without_a_traceback(ma_module_cli, tmp_path):
    job = ma_module_cli("submit", "--wait", "--name", "one-line", "--", PY, "-c", "print('fine')")
    assert job.returncode == 0, job.stderr
    missing = tmp_path / "no-such-folder" / "devenv.ipynb"
    out = ma_module_cli("devenv", "one-line", "-o", str(missing))
    assert out.returncode == 1
    assert "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [
        f"error: FileNotFoundError: [Errno 2] No such file or directory: '{missing}' (MA_JUPYTER_DEBUG=1 shows where)"
    ]


# a TensorFlow job whose parameter server serves until stopped, as TF's ParameterServerStrategy does
PS_SERVES = (
    "import json, os, time\n"
    "if json.loads(os.environ['TF_CONFIG'])['task']['type'] == 'ps':\n"
    "    time.sleep(600)\n"
    "print('worker done', flush=True)\n"
)


def test_a_stopped_parameter_server_is_not_read_as_a_failure(ma_module_cli):
    done = ma_module_cli(
        "submit", "--wait", "--name", "ps-job", "--mode", "tensorflow", "--ps", "1", "--", PY, "-c", PS_SERVES
    )
    assert done.returncode == 0, done.stdout + done.stderr
    job_id = done.stdout.split(":")[0]
    shown = ma_module_cli("get", job_id)
    assert shown.returncode == 0, shown.stderr
    # the reason names the nodes that succeeded and why ps-0 was stopped, not "every node exited with code 0"
    assert "every node exited with code 0" not in shown.stdout, shown.stdout
    assert "every primary node (worker-0) exited with code 0; then stopped ps-0" in shown.stdout, shown.stdout
    ps = next(line for line in shown.stdout.splitlines() if line.startswith("node:      ps-0"))
    assert "stopped when the primary nodes had succeeded" in ps, ps
    # top on the finished job: it will never have samples if it had none, and never says "yet"
    top = ma_module_cli("top", job_id)
    assert top.returncode == 0, top.stderr
    assert "yet" not in top.stdout, top.stdout


def test_notify_names_your_address_for_the_admins_hook_and_keeps_what_it_is_not_told(ma_module_cli):
    """Seed 002 mails the user: ``ma-jupyter notify --address`` names where the administrator's
    ``[notify]`` command delivers your events; an option not given keeps its setting."""
    named = ma_module_cli("notify", "--address", "alice@example.org", "--json")
    assert named.returncode == 0, named.stderr
    assert json.loads(named.stdout) == {"webhook": None, "address": "alice@example.org"}
    # a loopback webhook is refused until the admin allows it: nothing changes
    refused = ma_module_cli("notify", "--webhook", "http://127.0.0.1:9/x")
    assert refused.returncode != 0 and "[notify] webhook_allow" in refused.stderr, refused.stderr
    shown = ma_module_cli("notify")
    assert shown.returncode == 0 and shown.stdout == "webhook: -\naddress: alice@example.org\n", shown.stdout
    bad = ma_module_cli("notify", "--address", "a\nb")
    assert bad.returncode != 0 and "address" in bad.stderr, bad.stderr
    # the hostile user: a C1 line break (NEL) or a Unicode line separator, which a mailer's
    # header splits on; an option for a mailer given the address as an argument (mail -S...),
    # spaces first too; each refused and the address kept
    for hostile in ("a\x85Bcc: x@y", "a\u2028Bcc: x@y", "-Sreplyto=x@y", "  -oQ/tmp/x"):
        refused = ma_module_cli("notify", f"--address={hostile}")
        assert refused.returncode != 0 and "address" in refused.stderr, (hostile, refused.stderr)
    assert "starts with '-'" in refused.stderr, refused.stderr
    assert json.loads(ma_module_cli("notify", "--json").stdout)["address"] == "alice@example.org"
    forgotten = ma_module_cli("notify", "--no-address", "--json")
    assert json.loads(forgotten.stdout) == {"webhook": None, "address": None}, forgotten.stdout
