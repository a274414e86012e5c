"""A job must not reach the host: real jobs against a real service, run by this (root) test.

Each test is one escape a job could once make (a job's env running the host's launcher, mounts
of any host folder, jobs running as root, a NUL byte in an env value): it now fails with a clear
error, leaves no file on the host, and creates no job.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile

import pytest

from ma_jupyter.errors import InvalidSpec
from ma_jupyter.models import JobStatus

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="the escapes are those of a service running as root"),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap"),
]

PY = sys.executable
NOBODY = pwd.getpwnam("nobody")

PRELOAD_SOURCE = r"""
#include <stdio.h>
#include <unistd.h>
#include <string.h>
/* Records every process that loads it: uid and program name. */
__attribute__((constructor)) static void record(void) {
    char name[256] = {0};
    FILE *comm = fopen("/proc/self/comm", "r");
    if (comm) { if (fgets(name, sizeof name, comm)) name[strcspn(name, "\n")] = 0; fclose(comm); }
    FILE *out = fopen(LOG_PATH, "a");
    if (out) { fprintf(out, "%d %s\n", (int)getuid(), name); fclose(out); }
}
"""


def _job_ids(client) -> list[str]:
    """The ids of every job ``client`` sees: the tests on the module's service compare them
    before and after a refused submit (no job made)."""
    return [j.id for j in client.jobs(limit=500)]


def _world_writable(path) -> None:
    path.mkdir(exist_ok=True)
    path.chmod(0o1777)


def test_job_env_never_reaches_the_hosts_launcher(ma_module_client, ma_module_service, tmp_path):
    """``--env PATH=<dir with a fake bwrap>`` and ``--env LD_PRELOAD=<lib>`` apply to the job's
    own command only, as the job's account: no host-side program runs the user's code."""
    evil = tmp_path / "evil"
    evil.mkdir()
    ran = tmp_path / "records"
    _world_writable(ran)
    for program in ("bwrap", "setpriv", "env", "python", "python3"):
        fake = evil / program
        fake.write_text(f"#!/bin/sh\nid -u > {ran}/fake-{program}-ran\nexit 0\n")
        fake.chmod(0o755)
    # The library records each process that loads it: on the host (a launcher of the platform)
    # and inside the sandbox (where the host path does not exist; the job's outputs do).
    source = tmp_path / "record.c"
    source.write_text(PRELOAD_SOURCE.replace("LOG_PATH", "path"))
    source.write_text(
        PRELOAD_SOURCE.replace(
            'FILE *out = fopen(LOG_PATH, "a");',
            f'FILE *out = fopen("{ran}/loaded", "a"); if (!out) out = fopen("/workspace/outputs/loaded", "a");',
        )
    )
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(evil / "record.so"), str(source)], check=True)
    in_view = "/workspace/dataset/private/lib/record.so"

    job = ma_module_client.submit(
        name="env-escape",
        command=f"{PY} -c \"import os; print('uid', os.getuid())\"",
        datasets=[{"name": "lib", "path": str(evil)}],
        env={"PATH": f"{evil}:/usr/bin:/bin", "LD_PRELOAD": f"{evil}/record.so:{in_view}"},
    )
    final = job.wait(timeout=60)
    assert final.status is JobStatus.succeeded, list(job.logs())
    assert f"uid {NOBODY.pw_uid}" in list(job.logs())
    # no fake program ran and no host-side process loaded the library...
    assert sorted(p.name for p in ran.iterdir()) == []
    # ...while the job's own command did, as the job's account (so the variables did apply)
    loaded = (ma_module_service.home / "jobs" / job.id / "outputs" / "loaded").read_text().splitlines()
    assert loaded and all(line.split()[0] == str(NOBODY.pw_uid) for line in loaded), loaded
    assert not any(line.split()[1] in ("bwrap", "setpriv", "env") for line in loaded), loaded


@pytest.mark.parametrize(
    ("kind", "path", "says"),
    [
        ("volume", "/", "system folder"),
        ("dataset", "/proc", "system folder /proc"),
        ("dataset", "/etc", "system folder /etc"),
        ("dataset", "/dev/shm", "system folder /dev"),
        ("volume", "/root", "contains /root"),
        ("dataset", "HOME", "job service's home"),
        ("dataset", "JOBS", "job service's home"),
        ("dataset", "OUTSIDE", "outside the folders jobs may mount"),
        ("dataset", "LINK_TO_ETC", "system folder /etc"),
    ],
)
def test_mount_sources_outside_the_allowed_roots_are_refused(
    ma_module_client, ma_module_service, tmp_path, kind, path, says
):
    """No job may mount a host folder outside the admin's roots, nor a system folder, the
    service's home or another job's folder, even through a symlink inside an allowed root.
    (One service for every case: each checks that it made no job.)"""
    ma_client, ma_home = ma_module_client, ma_module_service.home
    # a folder of this test's own outside the allowed roots (the test's tmp_path is inside them)
    outside = tempfile.mkdtemp(prefix="ma-jupyter-outside-", dir="/var/tmp")
    (tmp_path / "link").symlink_to("/etc")
    source = {
        "HOME": str(ma_home),
        "JOBS": str(ma_home / "jobs"),
        "OUTSIDE": outside,
        "LINK_TO_ETC": str(tmp_path / "link"),
    }.get(path, path)
    (ma_home / "jobs").mkdir(exist_ok=True)
    mount = {"name": "x", "path": source}
    jobs_before = _job_ids(ma_client)
    with pytest.raises(InvalidSpec) as refused:
        ma_client.submit(
            name="mount-escape",
            command="touch /workspace/volume/x/pwned /workspace/dataset/private/x/pwned",
            **{f"{kind}s": [mount]},
        )
    assert says in str(refused.value)
    if path == "OUTSIDE":
        # the refusal names the roots that are allowed and the setting that adds one
        allowed = str(ma_module_service.allowed_root)
        assert allowed in str(refused.value) and "[mounts] allowed_roots" in str(refused.value)
    assert _job_ids(ma_client) == jobs_before
    assert not os.path.exists(os.path.join(source, "pwned"))
    os.rmdir(outside)


def test_default_roots_are_the_users_home_and_the_project_folder(ma_home, tmp_path, monkeypatch):
    """Without ``[mounts] allowed_roots`` a job may mount from the user's home and the folder the
    service was started for, and nothing else."""
    from ma_jupyter.config import ENV_PROJECT_DIR
    from ma_jupyter.nodehost.host_policy import load_policy

    (ma_home / "cluster.toml").write_text("")
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    monkeypatch.setenv(ENV_PROJECT_DIR, str(project))
    policy = load_policy()
    assert policy.roots_for("root") == ["/root", str(project)]
    policy.check_source(str(project / "data"), "dataset d", "datasets", "root")
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(InvalidSpec, match=r"outside the folders jobs may mount \(/root, "):
        policy.check_source(str(tmp_path / "elsewhere"), "dataset d", "datasets", "root")
    # a user's home is theirs: another account's home is not among root's roots
    assert policy.roots_for("daemon") == ["/usr/sbin", str(project)]


def test_jobs_of_root_run_as_the_job_account_and_own_what_they_write(ma_module_client, tmp_path):
    """A root service runs root's jobs as the unprivileged job account: what they write through
    a writable mount is that account's, and a root-owned folder is not theirs to write."""
    outputs = tmp_path / "new-outputs"  # does not exist yet: made for the job, owned by its account
    job = ma_module_client.submit(
        name="whoami",
        outputs=str(outputs),
        command=(
            f"{PY} -c \"import os; print('ids', os.getuid(), os.getgid(), os.getgroups()); "
            "open('/workspace/outputs/result.txt', 'w').write('x')\""
        ),
    )
    final = job.wait(timeout=60)
    assert final.status is JobStatus.succeeded, list(job.logs())
    assert f"ids {NOBODY.pw_uid} {NOBODY.pw_gid} []" in list(job.logs())
    assert (outputs / "result.txt").stat().st_uid == NOBODY.pw_uid
    assert outputs.stat().st_uid == NOBODY.pw_uid

    root_owned = tmp_path / "root-owned"
    jobs_before = _job_ids(ma_module_client)
    root_owned.mkdir(mode=0o755)
    with pytest.raises(InvalidSpec, match=r"not writable by nobody .*chown"):
        ma_module_client.submit(name="no-write", outputs=str(root_owned), command="true")
    assert job.id in jobs_before
    assert _job_ids(ma_module_client) == jobs_before  # the refused one made no job
    assert list(root_owned.iterdir()) == []


def test_a_user_with_an_account_runs_as_that_account(ma_module_service):
    """The submitting user's own Unix account (here ``daemon``) is the one its jobs run as."""
    daemon = pwd.getpwnam("daemon")
    session = ma_module_service.user_session("daemon")
    reply = session.post(
        f"{ma_module_service.api}/jobs",
        json={"name": "as-daemon", "command": f"{PY} -c \"import os; print('uid', os.getuid())\""},
        timeout=30,
    )
    assert reply.status_code == 201, reply.text
    job_id = reply.json()["id"]
    from tests.helpers import wait_for

    wait_for(
        lambda: (
            session.get(f"{ma_module_service.api}/jobs/{job_id}", timeout=5).json()["status"] == "succeeded"
        ),
        timeout=60,
    )
    text = session.get(f"{ma_module_service.api}/jobs/{job_id}/logs/read", timeout=5).json()["data"]
    assert f"uid {daemon.pw_uid}" in text


def test_root_runs_as_root_only_when_an_admin_allows_it(ma_client, ma_home, tmp_path):
    (ma_home / "cluster.toml").write_text(
        f'[mounts]\nallowed_roots = ["{tmp_path}"]\n[users]\nallow_root = ["root"]\n'
    )
    job = ma_client.submit(name="as-root", command=f"{PY} -c \"import os; print('uid', os.getuid())\"")
    assert job.wait(timeout=60).status is JobStatus.succeeded
    assert "uid 0" in list(job.logs())


def test_an_env_value_with_a_nul_byte_is_refused_at_submit(ma_module_service):
    session = ma_module_service.session()
    jobs_before = [j["id"] for j in session.get(f"{ma_module_service.api}/jobs", timeout=5).json()["items"]]
    reply = session.post(
        f"{ma_module_service.api}/jobs",
        json={"name": "nul", "command": "true", "env": {"A": "x\u0000y"}},
        timeout=30,
    )
    assert reply.status_code == 400, reply.text
    assert "NUL byte" in reply.json()["message"]
    jobs_after = [j["id"] for j in session.get(f"{ma_module_service.api}/jobs", timeout=5).json()["items"]]
    assert jobs_after == jobs_before  # no job made


def test_without_a_sandbox_a_root_service_refuses_to_run_jobs_as_root(ma_client, monkeypatch):
    """The symlink mode cannot switch accounts: rather than run root's job as root, the job
    ends in error saying how to fix it."""
    monkeypatch.setenv("MA_JUPYTER_SANDBOX", "none")  # the autostarted service inherits it
    job = ma_client.submit(name="no-sandbox", command="true")
    final = job.wait(timeout=60, check=False)
    assert final.status is JobStatus.error
    assert "install bubblewrap" in final.reason and "allow_root" in final.reason


def test_a_mount_below_a_writable_mount_is_refused(ma_module_client, tmp_path):
    """A job could swap a folder inside its writable outputs for a symlink before a later bind
    follows it (an on_start phase, or a node that started first): such specs are refused."""
    outputs = tmp_path / "out"
    (outputs / "v").mkdir(parents=True)
    for folder in (outputs, outputs / "v"):
        folder.chmod(0o777)
    jobs_before = _job_ids(ma_module_client)
    with pytest.raises(InvalidSpec, match="could redirect it before it is mounted"):
        ma_module_client.submit(
            name="nested",
            outputs=str(outputs),
            volumes=[{"name": "v", "path": str(outputs / "v")}],
            command="true",
        )
    assert _job_ids(ma_module_client) == jobs_before  # no job made


def test_a_jobs_variables_are_not_on_any_command_line(ma_module_client, ma_module_service):
    """Other users of the host read every process's command line: the job's variables are
    handed to bubblewrap in a memory file, never as its arguments."""
    secret = f"hunter2-{os.getpid()}"
    job = ma_module_client.submit(
        name="secret-env",
        env={"API_KEY": secret},
        command=f"{PY} -c \"import os, time; print('have', len(os.environ['API_KEY'])); time.sleep(30)\"",
    )
    from tests.helpers import wait_for

    wait_for(lambda: any("have" in line for line in job.logs()), timeout=60)
    shown = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    if secret.encode() in fh.read():
                        shown.append(pid)
            except OSError:
                continue
    job.stop()
    assert shown == [], f"processes {shown} show the job's variable on their command line"
    assert [line for line in job.logs() if line.startswith("have")] == [f"have {len(secret)}"]
    runner_spec = next((ma_module_service.home / "jobs" / job.id / "nodes").glob("*/node-run.json"))
    assert runner_spec.stat().st_mode & 0o077 == 0


def test_the_snapshot_exception_is_for_a_read_only_algorithm_only(ma_home):
    from ma_jupyter.nodehost.host_policy import load_policy

    snapshot = ma_home / "snapshots" / "train-1"
    snapshot.mkdir(parents=True)
    policy = load_policy()
    policy.check_source(str(snapshot), "algorithm", "algorithm", "root", snapshot_ok=True)
    with pytest.raises(InvalidSpec, match="job service's home"):
        policy.check_source(str(snapshot), "dataset d", "datasets", "root")


def test_a_venvs_own_pyvenv_cfg_never_widens_what_the_sandbox_shows(ma_home, tmp_path):
    """The base installation of a venv is where its interpreter resolves to; the ``home`` its
    (user-written) pyvenv.cfg names is not bound."""
    from ma_jupyter.models import Image
    from ma_jupyter.nodehost.image import resolve_image

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(os.path.realpath(sys.executable))
    (venv / "pyvenv.cfg").write_text("home = /var/lib/dpkg/info\n")
    roots = resolve_image(Image(venv=str(venv))).roots
    assert not any(r == "/var/lib/dpkg" or r.startswith("/var/lib") for r in roots), roots


CGROUP_SPY = r"""
import os, sys
other, seen, found = sys.argv[1], 0, []
for top, dirs, files in os.walk("/sys/fs/cgroup"):
    for name in dirs + files:
        seen += 1
        if other in name or other in top:
            found.append(os.path.join(top, name))
    if seen > 100000:  # bounded: a host's hierarchies hold far fewer
        break
print("entries", seen, "found", len(found), found[:3], flush=True)
for limit in ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory.max"):
    if os.path.exists(limit):
        print("limit", open(limit).read().strip(), flush=True)
"""


def test_a_job_sees_only_its_own_cgroup(ma_module_client, tmp_path):
    """``/sys/fs/cgroup`` inside a job lists no other job's cgroup (its id, its memory use),
    even of an ``--access none`` job running beside it; the job's own memory limit stays
    readable where its node has a cgroup."""
    from ma_jupyter.nodehost import cgroup
    from tests.helpers import wait_for

    hidden = ma_module_client.submit(
        name="hidden",
        access="none",
        command=f"{PY} -c \"import time; print('up', flush=True); time.sleep(600)\"",
    )
    wait_for(lambda: any("up" in line for line in hidden.logs()), timeout=60)
    algo = tmp_path / "spy"
    algo.mkdir()
    (algo / "spy.py").write_text(CGROUP_SPY)
    spy = ma_module_client.submit(name="spy", algorithm=str(algo), command=f"{PY} spy.py {hidden.id}")
    spy.wait(timeout=120)
    hidden.stop()
    lines = list(spy.logs())
    said = next(line for line in lines if line.startswith("entries"))
    assert " found 0 " in said, said
    where, _ = cgroup.detect()
    if where is not None:  # the node's own cgroup: its limit, not the host's
        limit = next(line for line in lines if line.startswith("limit"))
        assert 0 < int(limit.split()[1]) < 1 << 40, limit
