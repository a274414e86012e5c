"""Job actions from the command line and the REST API, against a real service: deleting several
jobs, the ``bash -c`` hint run as suggested, the devenv route's access, and searching by
algorithm folder and favourite algorithms (kept per user)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

from ma_jupyter.commands import parse_command, shell_wrapper
from ma_jupyter.models import Job

PY = sys.executable


def test_the_bash_c_hint_for_an_argv_with_a_quoted_operator_works_as_suggested(
    ma_module_cli, ma_module_service, tmp_path
):
    # The user's shell hands `&&` over as a word of its own: the joined command quotes it, and the
    # leading assignment makes the service refuse the command with the hint.
    argv = [
        "GREETING=hi",
        PY,
        "-c",
        "import os; print('first', os.environ['GREETING'])",
        "&&",
        PY,
        "-c",
        "print('second')",
    ]
    refused = ma_module_cli("submit", "--", *argv)
    assert refused.returncode == 2
    hint = refused.stderr.split("wrap it in a shell yourself: ", 1)[1].strip()
    assert hint.startswith("bash -c ") and "'&&'" not in hint
    # run as suggested: typed after `ma-jupyter submit --wait --follow --` in a real shell
    env = {**os.environ, "MA_JUPYTER_HOME": str(ma_module_service.home)}
    cli = shlex.join([PY, "-m", "ma_jupyter.frontends.cli"])
    ran = subprocess.run(
        ["bash", "-c", f"{cli} submit --name hinted --follow -- {hint}"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines()[:2] == ["first hi", "second"], ran.stdout


def test_the_hint_quotes_what_the_users_shell_would_change():
    for command in ("python a.py && echo $HOME", 'echo "a b" | tee x', "a `b` ; c", "x=1 python a.py"):
        wrapped = shell_wrapper(command)
        argv = shlex.split(wrapped)  # what the user's shell hands over (it expands nothing)
        assert argv[:2] == ["bash", "-c"] and argv[2] == command, wrapped
        assert parse_command(shlex.join(argv)) == argv  # and the platform accepts it


def test_delete_several_deletes_what_it_can_and_reports_the_rest(ma_module_cli):
    ids = []
    for name in ("d1", "d2"):
        out = ma_module_cli("submit", "--wait", "--json", "--name", name, "--", PY, "-c", "pass")
        assert out.returncode == 0, out.stderr
        ids.append(Job.model_validate_json(out.stdout).id)
    live = Job.model_validate_json(
        ma_module_cli(
            "submit",
            "--json",
            "--name",
            "live",
            "--grace",
            "1",
            "--",
            PY,
            "-c",
            "import time; time.sleep(600)",
        ).stdout
    )
    result = ma_module_cli("delete", ids[0], live.id, "no-such-job", "d2")
    assert result.returncode == 2
    assert result.stdout.splitlines() == [f"deleted {ids[0]}", f"deleted {ids[1]} (d2)"]
    errors = result.stderr.splitlines()
    assert errors[0].startswith(f"{live.id}: not deleted: ") and "stop it first" in errors[0]
    assert errors[1].startswith("no-such-job: not deleted: no job")
    assert errors[2] == "error: 2 of 4 jobs not deleted"
    # the module's service is shared: this test's own jobs, by id
    listed = {j["id"] for j in json.loads(ma_module_cli("jobs", "--json").stdout)["items"]}
    assert live.id in listed and not listed & set(ids)
    assert ma_module_cli("delete", live.id, "--force").returncode == 0


def test_devenv_route_needs_view_access_and_answers_a_notebook(ma_module_service, tmp_path):
    owner = ma_module_service.session()
    job = owner.post(
        f"{ma_module_service.api}/jobs",
        json={
            "name": "shared",
            "command": f"{PY} -c pass",
            "access": "ro",
            "secret_env": {"KEY": "hidden-value"},
        },
        timeout=30,
    ).json()
    private = owner.post(
        f"{ma_module_service.api}/jobs",
        json={"name": "mine", "command": f"{PY} -c pass", "access": "none"},
        timeout=30,
    ).json()
    bob = ma_module_service.user_session("bob")
    reply = bob.get(f"{ma_module_service.api}/jobs/{job['id']}/devenv", timeout=30)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["name"] == "shared-devenv.ipynb" and body["notebook"]["nbformat"] == 4
    assert "hidden-value" not in reply.text and "SECRET_KEY" in reply.text
    assert bob.get(f"{ma_module_service.api}/jobs/{private['id']}/devenv", timeout=30).status_code == 404
    assert owner.get(f"{ma_module_service.api}/jobs/nope/devenv", timeout=30).status_code == 404


def test_search_by_algorithm_and_favourites_per_user(ma_service, tmp_path):
    api = ma_service.api
    alice, bob = ma_service.user_session("alice"), ma_service.user_session("bob")
    folders = {}
    for name in ("mnist", "bert"):
        folders[name] = tmp_path / "algos" / name
        folders[name].mkdir(parents=True)
    made = {}
    for name, session in (("mnist", alice), ("bert", alice), ("bert-bob", bob)):
        folder = folders[name.split("-")[0]]
        reply = session.post(
            f"{api}/jobs",
            json={"name": name, "algorithm": str(folder), "command": f"{PY} -c pass"},
            timeout=30,
        )
        assert reply.status_code == 201, reply.text
        made[name] = reply.json()["id"]
    tasks = [{"algorithm": str(folders["mnist"]) + "/", "command": f"{PY} -c pass"}]
    batch = alice.post(
        f"{api}/jobs", json={"name": "sweep", "type": "batch", "tasks": tasks}, timeout=30
    ).json()

    def ids(session, **params) -> set[str]:
        reply = session.get(f"{api}/jobs", params=params, timeout=30)
        assert reply.status_code == 200, reply.text
        return {j["id"] for j in reply.json()["items"]}

    # one folder, written any way that names it (a trailing slash, a ..), batch tasks included
    assert ids(alice, algorithm=str(folders["mnist"])) == {made["mnist"], batch["id"]}
    assert ids(alice, algorithm=f"{folders['bert']}/../mnist/") == {made["mnist"], batch["id"]}
    assert ids(alice, algorithm=str(folders["bert"])) == {made["bert"], made["bert-bob"]}
    assert ids(alice, algorithm=str(tmp_path / "algos")) == set()  # a folder, never a prefix
    bad = alice.get(f"{api}/jobs", params={"algorithm": "relative/folder"}, timeout=30)
    assert bad.status_code == 400 and "absolute path" in bad.json()["message"]

    # favourites are each user's own
    assert ids(alice, favourites="true") == set()
    marked = alice.post(f"{api}/algorithms/favourites", json={"path": f"{folders['bert']}/"}, timeout=30)
    assert marked.status_code == 201
    assert {k: v for k, v in marked.json().items() if k != "versions"} == {
        "path": str(folders["bert"]),
        "favourite": True,
        "jobs": 1,
    }
    assert ids(alice, favourites="true") == {made["bert"], made["bert-bob"]}
    assert ids(alice, favourites="true", creator="alice") == {made["bert"]}
    assert ids(alice, favourites="true", algorithm=str(folders["mnist"])) == set()
    assert ids(bob, favourites="true") == set()

    def without_versions(found: list[dict]) -> list[dict]:
        return [{k: v for k, v in a.items() if k != "versions"} for a in found]

    listed = alice.get(f"{api}/algorithms", timeout=30).json()
    assert without_versions(listed) == [
        {"path": str(folders["bert"]), "favourite": True, "jobs": 1},
        {"path": str(folders["mnist"]), "favourite": False, "jobs": 2},
    ]
    # the two empty folders hold one content: each folder's jobs ran one version of it
    assert [[v["jobs"] for v in a["versions"]] for a in listed] == [[1], [2]]
    assert listed[0]["versions"][0]["digest"] == listed[1]["versions"][0]["digest"]
    assert without_versions(bob.get(f"{api}/algorithms", timeout=30).json()) == [
        {"path": str(folders["bert"]), "favourite": False, "jobs": 1}
    ]
    gone = alice.delete(f"{api}/algorithms/favourites", params={"path": str(folders["bert"])}, timeout=30)
    assert gone.status_code == 204
    again = alice.delete(f"{api}/algorithms/favourites", params={"path": str(folders["bert"])}, timeout=30)
    assert again.status_code == 404 and "not one of your favourite" in again.json()["message"]
    # the filters are in the published schema
    schema = alice.get(f"{api}/openapi.json", timeout=30).json()
    params = {p["name"] for p in schema["paths"]["/api/v1/jobs"]["get"]["parameters"]}
    assert {"algorithm", "favourites", "creator", "outputs"} <= params


def test_cli_algorithms_and_jobs_filters(ma_cli, tmp_path):
    algo = tmp_path / "algo"
    algo.mkdir()
    (algo / "train.py").write_text("print('trained')\n")
    out = ma_cli("submit", "--wait", "--name", "fromfolder", "--code-dir", "algo", "--", "python", "train.py")
    assert out.returncode == 0, out.stderr
    assert ma_cli("submit", "--wait", "--name", "other", "--", PY, "-c", "pass").returncode == 0
    listed = ma_cli("jobs", "--algorithm", "algo")  # relative to the current folder
    assert "fromfolder" in listed.stdout and "other" not in listed.stdout
    assert ma_cli("algorithms", "favourite", "algo").stdout.strip() == f"favourite: {algo}"
    table = ma_cli("algorithms").stdout.splitlines()
    assert table[0].split() == ["FOLDER", "FAVOURITE", "YOUR", "JOBS", "VERSIONS"]
    assert table[1].split() == [str(algo), "yes", "1", "1"]
    favourites = ma_cli("jobs", "--favourites")
    assert "fromfolder" in favourites.stdout and "other" not in favourites.stdout
    assert ma_cli("algorithms", "unfavourite", "algo").returncode == 0
    assert "fromfolder" not in ma_cli("jobs", "--favourites").stdout
    refused = ma_cli("algorithms", "favourite")
    assert refused.returncode == 2 and "give the folder" in refused.stderr


def test_jobs_shipped_from_one_folder_are_found_by_it_and_the_modelarts_path_ships_it(
    ma_module_cli, tmp_path
):
    """Every job shipped from one folder is one algorithm (each ran its own snapshot), and a
    ModelArts-style command naming user-job-dir/<folder> ships that folder and runs there."""
    folder = tmp_path  # the folder the user works in (ma_module_cli runs there)
    (folder / "train.py").write_text("import os\nprint('ran in', os.getcwd())\n")
    for name in ("first", "second"):
        out = ma_module_cli("submit", "--wait", "--name", name, "--", "python", "train.py")
        assert out.returncode == 0, out.stderr + out.stdout
    code_dir = f"/home/ma-user/modelarts/user-job-dir/{folder.name}"
    modelarts = ma_module_cli(
        "submit",
        "--follow",
        "--name",
        "ma",
        "--convention",
        "modelarts",
        "--",
        "python",
        f"{code_dir}/train.py",
    )
    assert modelarts.returncode == 0, modelarts.stderr + modelarts.stdout
    assert f"ran in {code_dir}" in modelarts.stdout  # named as the user knows it, not the snapshot
    assert f"shipped {folder}" in modelarts.stderr
    listed = ma_module_cli("jobs", "--algorithm", ".").stdout
    assert all(name in listed for name in ("first", "second", "ma")), listed
    table = ma_module_cli("algorithms").stdout.splitlines()
    # not a favourite (blank); one version: the folder did not change between the three
    assert [str(folder), "3", "1"] in [row.split() for row in table[1:]], table


def test_a_database_from_before_the_algorithm_filter_gets_its_jobs_folders(tmp_path):
    from sqlalchemy import text

    from ma_jupyter.models import Event, JobSpec, JobStatus
    from ma_jupyter.service.store import Store

    store = Store(tmp_path / "jobs.db")
    spec = JobSpec(name="old", command="python x.py", algorithm="/data/algos/old/")
    store.insert(Job(id="old-1", spec=spec), Event(job_id="old-1", status=JobStatus.queued, reason="queued"))
    with store.engine.begin() as conn:  # the schema before the column existed (version 4)
        conn.execute(text("ALTER TABLE jobs DROP COLUMN algorithms"))
        conn.execute(text("PRAGMA user_version = 4"))
    store.engine.dispose()
    reopened = Store(tmp_path / "jobs.db")
    assert [j.id for j in reopened.list(algorithms_in=["/data/algos/old"])[0]] == ["old-1"]
    assert reopened.list(algorithms_in=["/data/algos"])[1] == 0
