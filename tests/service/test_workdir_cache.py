"""A node's writable working copy and each user's persistent cache, end to end: a real service,
real node processes in bubblewrap (and in the symlink mode where it can behave the same)."""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import secrets
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from tests.fixtures.workdir import finished, job_of, log_of, submit
from tests.helpers import wait_for, writable_dir

PY = sys.executable
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.skipif(not os.path.exists("/usr/bin/bwrap"), reason="needs bubblewrap")


# ------------------------------------------------------------------------------ helpers


def events_of(svc, job_id: str) -> list[dict]:
    return svc.session().get(f"{svc.api}/jobs/{job_id}/events", timeout=10).json()


def folder_hash(folder: Path) -> str:
    """Every name, mode and byte below ``folder``: equal before and after means untouched."""
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        st = path.lstat()
        digest.update(f"{path.relative_to(folder)}\0{st.st_mode}\0".encode())
        if path.is_file() and not path.is_symlink():
            digest.update(path.read_bytes())
    return digest.hexdigest()


def algorithm(tmp_path: Path, files: dict[str, str]) -> Path:
    folder = tmp_path / "algo"
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(textwrap.dedent(text))
    return folder


# ------------------------------------------------------------------------ working copy

MNIST_STYLE = """
    import os
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(28 * 28, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    images, labels = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))
    for epoch in range(3):
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"epoch {epoch} loss {loss.item():.4f}")
    torch.save(model.state_dict(), "mnist_cnn.pt")  # relative to the working directory
    print("saved", os.path.abspath("mnist_cnn.pt"))
"""


@pytest.mark.torch
def test_mnist_style_relative_save_is_kept_with_the_outputs_and_the_code_untouched(
    ma_module_service, tmp_path
):
    import torch

    algo = algorithm(tmp_path, {"train.py": MNIST_STYLE})
    before = folder_hash(algo)
    out = writable_dir(tmp_path / "out")
    job = submit(ma_module_service, command="python train.py", algorithm=str(algo), outputs=str(out))
    final = finished(ma_module_service, job["id"])
    log = log_of(ma_module_service, job["id"])
    assert final["status"] == "succeeded", (final["reason"], log)
    assert "saved /workspace/algorithm/mnist_cnn.pt" in log
    kept = out / "workdir" / "mnist_cnn.pt"
    state = torch.load(kept)
    assert sorted(state) == ["1.bias", "1.weight"] and tuple(state["1.weight"].shape) == (10, 784)
    assert "kept 1 file(s)" in log and "/workspace/outputs/workdir" in log
    assert folder_hash(algo) == before, "the user's code folder changed"
    assert sorted(p.name for p in (out / "workdir").iterdir()) == ["mnist_cnn.pt"]  # only what it wrote


@pytest.mark.parametrize(
    "again", [{"fault_restart": {"max_restarts": 1}}, {"checkpoint_resume": {"max_resumes": 1}}]
)
def test_a_restarted_attempt_starts_from_what_the_first_wrote(ma_module_any_service, tmp_path, again):
    svc = ma_module_any_service
    algo = algorithm(
        tmp_path,
        {
            "train.py": """
                import os, sys
                if os.path.exists("marker.txt"):
                    print("attempt", os.environ["MA_ATTEMPT"], "saw:", open("marker.txt").read())
                    open("model.pt", "w").write("trained")
                    sys.exit(0)
                open("marker.txt", "w").write("written by attempt " + os.environ["MA_ATTEMPT"])
                print("first attempt fails after writing its marker", flush=True)
                sys.exit(3)
            """
        },
    )
    before = folder_hash(algo)
    out = writable_dir(tmp_path / "out")
    job = submit(
        svc,
        command="python train.py",
        algorithm=str(algo),
        outputs=str(out),
        **again,
    )
    final = finished(svc, job["id"])
    log = log_of(svc, job["id"])
    assert final["status"] == "succeeded", (final["reason"], log)
    assert final["restarts"] == 1 and final["attempt"] == 1
    assert "attempt 1 saw: written by attempt 0" in log
    # each attempt's writes are kept with the outputs, and the code folder never changed
    assert (out / "workdir" / "marker.txt").read_text() == "written by attempt 0"
    assert (out / "workdir" / "model.pt").read_text() == "trained"
    assert folder_hash(algo) == before
    assert not (algo / "marker.txt").exists()


def test_python_dash_m_runs_a_package_of_the_algorithm_folder(ma_module_any_service, tmp_path):
    svc = ma_module_any_service
    algo = algorithm(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/util.py": "def answer():\n    return 42\n",
            "pkg/train.py": """
                import os
                from pkg.util import answer
                os.makedirs("runs/exp1", exist_ok=True)  # SummaryWriter()'s ./runs, Lightning's folders
                open("runs/exp1/events.txt", "w").write(str(answer()))
                print("cwd", os.getcwd(), "answer", answer())
            """,
        },
    )
    before = folder_hash(algo)
    out = writable_dir(tmp_path / "out")
    job = submit(svc, command="python -m pkg.train", algorithm=str(algo), outputs=str(out))
    final = finished(svc, job["id"])
    log = log_of(svc, job["id"])
    assert final["status"] == "succeeded", (final["reason"], log)
    assert "answer 42" in log
    if svc.sandbox == "bubblewrap":
        assert "cwd /workspace/algorithm answer 42" in log
    assert (out / "workdir" / "runs" / "exp1" / "events.txt").read_text() == "42"
    # the bytecode Python compiled in the working copy is not something the job wrote
    assert not list((out / "workdir").rglob("__pycache__"))
    assert folder_hash(algo) == before


def test_nodes_never_share_a_working_copy(ma_module_service, tmp_path):
    algo = algorithm(
        tmp_path,
        {
            "train.py": """
                import os, socket
                others = sorted(n for n in os.listdir(".") if n.startswith("from-"))
                open("from-" + socket.gethostname(), "w").write("x")
                print("saw", others)
            """
        },
    )
    out = writable_dir(tmp_path / "out")
    job = submit(
        ma_module_service,
        command="python train.py",
        algorithm=str(algo),
        outputs=str(out),
        mode="tensorflow",
        nodes=2,
    )
    final = finished(ma_module_service, job["id"])
    assert final["status"] == "succeeded", final["reason"]
    for node in ("worker-0", "worker-1"):
        assert "saw []" in log_of(ma_module_service, job["id"], node)
        # two nodes write to one outputs folder: each keeps its files under its own name
        assert [p.name for p in (out / "workdir" / node).iterdir()] == [f"from-{node}"]


def test_a_job_without_algorithm_works_in_an_empty_writable_folder(ma_module_service, tmp_path):
    out = writable_dir(tmp_path / "out")
    script = (
        "import os; print('cwd', os.getcwd(), sorted(os.listdir('.'))); open('result.txt', 'w').write('ok')"
    )
    job = submit(ma_module_service, command=f"python -c {json.dumps(script)}", outputs=str(out))
    final = finished(ma_module_service, job["id"])
    log = log_of(ma_module_service, job["id"])
    assert final["status"] == "succeeded", (final["reason"], log)
    assert "cwd /workspace/algorithm []" in log
    assert (out / "workdir" / "result.txt").read_text() == "ok"


def test_a_write_to_a_read_only_dataset_names_the_mount_and_the_way_out(ma_module_service, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "numbers.txt").write_text("1 2 3\n")
    algo = algorithm(
        tmp_path,
        {
            "train.py": """
                nums = open("/workspace/dataset/private/numbers/numbers.txt").read().split()
                with open("/workspace/dataset/private/numbers/preprocessed.txt", "w") as fh:
                    fh.write(" ".join(nums))
            """
        },
    )
    job = submit(
        ma_module_service,
        command="python train.py",
        algorithm=str(algo),
        datasets=[{"name": "numbers", "path": str(data)}],
    )
    final = finished(ma_module_service, job["id"])
    assert final["status"] == "error"
    reason = final["reason"]  # the first line: what `ma-jupyter get` and the job list show
    assert reason.startswith("node worker-0 exited with code 1: ")
    assert (
        "/workspace/dataset/private/numbers/preprocessed.txt is in /workspace/dataset/private/numbers"
        in reason
    )
    assert "the dataset numbers, mounted read-only" in reason
    assert "/workspace/outputs" in reason and "--dataset numbers=PATH:rw" in reason
    assert (
        "Read-only file system" in events_of(ma_module_service, job["id"])[-1]["reason"]
    )  # the log lines follow
    assert not (data / "preprocessed.txt").exists()


def test_the_dry_run_shows_the_working_copy_and_the_cache_and_makes_neither(ma_service, ma_home, tmp_path):
    algo = algorithm(tmp_path, {"train.py": "print(1)\n"})
    r = ma_service.session().post(
        f"{ma_service.api}/plan",
        json={"name": "p", "command": "python train.py", "algorithm": str(algo)},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    [node] = r.json()["nodes"]
    assert node["workdir"] == "/workspace/algorithm"
    mounts = {m["kind"]: m for m in node["mounts"]}
    assert mounts["workdir"] == {
        "source": "<jobs>/<job-id>/workdir/worker-0",
        "target": "/workspace/algorithm",
        "read_only": False,
        "kind": "workdir",
        "create": True,
        "copy_of": str(algo),
    }
    assert "algorithm" not in mounts  # the user's folder is never shown writable, only copied
    assert mounts["cache"]["target"] == "/tmp/.cache"
    owner = ma_service.session().get(f"{ma_service.api}/users/me", timeout=10).json()["name"]
    assert mounts["cache"]["source"] == str(ma_home / "caches" / owner)
    assert node["env"]["XDG_CACHE_HOME"] == "/tmp/.cache"
    assert node["env"]["TORCH_EXTENSIONS_DIR"].startswith("/tmp/.cache/torch_extensions/")
    assert any(f"a writable copy of {algo}" in n for n in node["notes"])
    assert any("kept in /workspace/outputs/workdir" in n for n in node["notes"])
    assert not (ma_home / "caches").exists() and not list((ma_home / "jobs").glob("*"))


# ----------------------------------------------------------------------------- caches

CACHE_PROBE = """
    import os, sys
    cache = os.path.expanduser("~/.cache")
    probe = os.path.join(cache, "probe.txt")
    print("XDG", os.environ["XDG_CACHE_HOME"], "TORCH_EXT", os.environ["TORCH_EXTENSIONS_DIR"])
    if sys.argv[1] == "write":
        os.makedirs(os.environ["TORCH_EXTENSIONS_DIR"], exist_ok=True)
        open(probe, "w").write("warm")
    print("probe:", open(probe).read() if os.path.exists(probe) else "absent")
"""


def test_a_users_jobs_share_their_cache_and_no_one_elses(ma_module_service, tmp_path):
    algo = algorithm(tmp_path, {"probe.py": CACHE_PROBE})
    alice, bob = f"alice-{secrets.token_hex(3)}", f"bob-{secrets.token_hex(3)}"
    runs = {}
    for name, user, action in (("first", alice, "write"), ("second", alice, "read"), ("other", bob, "read")):
        job = submit(
            ma_module_service, user, name=name, command=f"python probe.py {action}", algorithm=str(algo)
        )
        final = finished(ma_module_service, job["id"])
        runs[name] = log_of(ma_module_service, job["id"])
        assert final["status"] == "succeeded", (final["reason"], runs[name])
    assert "probe: warm" in runs["first"] and "probe: warm" in runs["second"]
    assert "probe: absent" in runs["other"]
    assert "XDG /tmp/.cache TORCH_EXT /tmp/.cache/torch_extensions/" in runs["first"]
    folder = ma_module_service.home / "caches" / alice
    assert (folder / "probe.txt").read_text() == "warm"
    st = folder.stat()
    assert st.st_mode & 0o777 == 0o700
    if os.geteuid() == 0:  # a root service runs these users' jobs as nobody, who owns the cache
        nobody = pwd.getpwnam("nobody")
        assert (st.st_uid, st.st_gid) == (nobody.pw_uid, nobody.pw_gid)
        assert (folder / "probe.txt").stat().st_uid == nobody.pw_uid
    assert not (ma_module_service.home / "caches" / bob / "probe.txt").exists()


def test_the_cache_is_kept_in_the_symlink_mode_too(ma_home, ma_root_jobs, monkeypatch, request, tmp_path):
    monkeypatch.setenv("MA_JUPYTER_SANDBOX", "none")
    svc = request.getfixturevalue("ma_service")
    algo = algorithm(tmp_path, {"probe.py": CACHE_PROBE})
    logs = []
    for action in ("write", "read"):
        job = submit(svc, command=f"python probe.py {action}", algorithm=str(algo))
        final = finished(svc, job["id"])
        logs.append(log_of(svc, job["id"]))
        assert final["status"] == "succeeded", (final["reason"], logs[-1])
    assert "probe: warm" in logs[1]
    owner = svc.session().get(f"{svc.api}/users/me", timeout=10).json()["name"]
    assert (ma_home / "caches" / owner / "probe.txt").read_text() == "warm"


@pytest.fixture
def ma_cli(ma_client, ma_home, tmp_path):
    """Run ``ma-jupyter ARGS`` in a subprocess on the test's home (the caller: the service's owner)."""
    env = {
        **os.environ,
        "MA_JUPYTER_HOME": str(ma_home),
        "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }

    def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            [PY, "-m", "ma_jupyter.frontends.cli", *args],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    return run


def test_cache_command_shows_the_size_and_clears_only_when_no_job_runs(ma_cli, ma_client, tmp_path):
    from ma_jupyter.client import Client
    from ma_jupyter.errors import Forbidden
    from ma_jupyter.models import CacheInfo

    fill = "import os; d = os.path.expanduser('~/.cache/blobs'); os.makedirs(d); open(d + '/b', 'wb').write(b'x' * 250000)"
    done = ma_cli("submit", "--wait", "--name", "fill", "--", "python", "-c", fill)
    assert done.returncode == 0, done.stdout + done.stderr
    me = ma_client.whoami().name
    shown = ma_cli("cache", "--json")
    assert shown.returncode == 0, shown.stderr
    [mine] = json.loads(shown.stdout)
    assert (mine["user"], mine["bytes"], mine["files"]) == (me, 250000, 1)
    table = ma_cli("cache")
    assert me in table.stdout and "250.0 kB" in table.stdout
    # an admin (the owner) may see every user's; anybody else only their own
    assert [c["user"] for c in json.loads(ma_cli("cache", "--all", "--json").stdout)] == [me]
    other = Client(token=ma_client.add_user("someone-else").token)
    with pytest.raises(Forbidden, match="only admins may see every user's cache"):
        other.cache(every_user=True)
    folder = str(Path(mine["path"]).with_name("someone-else"))
    assert other.cache() == [CacheInfo(user="someone-else", path=folder, bytes=0, files=0)]

    running = ma_cli(
        "submit", "--name", "busy", "--json", "--", "python", "-c", "import time; time.sleep(600)"
    )
    busy = json.loads(running.stdout)["id"]
    wait_for(lambda: ma_client.get(busy).status.value == "running", timeout=60)
    refused = ma_cli("cache", "--clear")
    assert refused.returncode == 2
    assert (
        f"running and may be using the cache ({busy})" in refused.stderr
        and "ma-jupyter stop" in refused.stderr
    )
    assert json.loads(ma_cli("cache", "--json").stdout)[0]["bytes"] == 250000  # nothing removed
    assert ma_cli("stop", busy).returncode == 0
    wait_for(lambda: ma_client.get(busy).status.value == "stopped", timeout=60)

    cleared = ma_cli("cache", "--clear")
    assert cleared.returncode == 0, cleared.stderr
    assert f"cleared the cache of {me}: 250.0 kB in 1 file(s) removed" in cleared.stdout
    assert json.loads(ma_cli("cache", "--json").stdout)[0]["bytes"] == 0
    # the next job starts with an empty cache (but the empty folders of ~/.keras and the like)
    listing = "import os; print(sorted(os.path.join(d, f) for d, _, fs in os.walk(os.path.expanduser('~/.cache')) for f in fs))"
    again = ma_cli("submit", "--wait", "--follow", "--", "python", "-c", listing)
    assert again.returncode == 0 and "[]" in again.stdout, again.stdout + again.stderr


# A build the way torch's FileBaton (torch.utils.file_baton, what DeepSpeed's and torch's JIT
# extension builds use) does it: the lock file's existence is the lock, taken with O_EXCL,
# waited for by polling its existence every 0.1 s.
BATON = """
    import os, sys, time
    lock = os.path.join(os.environ["TORCH_EXTENSIONS_DIR"], "fused_adam", "lock")
    os.makedirs(os.path.dirname(lock), exist_ok=True)
    def try_acquire():  # FileBaton.try_acquire: the descriptor stays open until its release
        global held
        try:
            held = os.open(lock, os.O_CREAT | os.O_EXCL)
            return True
        except FileExistsError:
            return False
    if sys.argv[1] == "hold":  # a build killed before it releases its lock (an OOM kill)
        assert try_acquire()
        print("holding the lock", flush=True)
        time.sleep(3600)
    waited, start = False, time.monotonic()
    while not try_acquire():
        waited = True  # FileBaton.wait: no output, a sleep in the kernel
        if sys.argv[1] == "bounded" and time.monotonic() - start > 300:
            sys.exit(3)
        time.sleep(0.1)
    print("built", "after waiting" if waited else "at once", flush=True)
    os.close(held)
    os.remove(lock)
"""


def test_a_job_stuck_on_a_stale_build_lock_is_told_and_stopped_and_the_next_job_does_not_wait(
    ma_home, tmp_path
):
    """Issue 38: a build lock whose job was killed made every later job of its user wait forever
    (a job waiting behind it meanwhile, too)."""
    from tests.fixtures.service_process import start_service, stop_services

    cluster = ma_home / "cluster.toml"
    cluster.write_text(cluster.read_text() + "[limits]\nhang_minutes = 0.05\n")  # a 3 s window
    svc = start_service(ma_home)
    follower = None
    try:
        algo = algorithm(tmp_path, {"baton.py": BATON})
        run = {"command": "python baton.py", "algorithm": str(algo)}
        holder = submit(svc, name="holder", **{**run, "command": "python baton.py hold"})
        wait_for(lambda: "holding the lock" in log_of(svc, holder["id"]), timeout=120)
        # a user following the holder from a shell sees its alert while it runs, not at its end
        follower = subprocess.Popen(
            [PY, "-m", "ma_jupyter.frontends.cli", "logs", holder["id"], "--follow"],
            env={**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        followed: list[str] = []
        threading.Thread(target=lambda: followed.extend(follower.stderr), daemon=True).start()
        # a job of the same user starting while the holder runs waits for the lock: it may be held
        stuck = submit(svc, name="stuck", hang_policy="stop", **{**run, "command": "python baton.py wait"})
        final = finished(svc, stuck["id"], timeout=180)
        assert final["status"] == "error" and "looked hung" in final["reason"], final["reason"]
        alerts = [e for e in events_of(svc, stuck["id"]) if e["reason"].startswith("looks hung")]
        assert len(alerts) == 1 and alerts[0]["alert"], alerts
        # what its process is doing, from /proc/<pid>/stat and wchan: sleeping, in the kernel's sleep
        # FileBaton.wait polls with short sleeps: the look may catch it running between them
        assert "worker-0: python" in alerts[0]["reason"], alerts
        assert " sleeping" in alerts[0]["reason"] or " running" in alerts[0]["reason"], alerts
        assert "hang_minutes" in alerts[0]["reason"] and "--hang-policy stop" in alerts[0]["reason"]
        assert "built" not in log_of(svc, stuck["id"])

        # the holder, quiet all along, is told too (alert only: the default policy), and runs on
        def holder_alerts():
            return [e for e in events_of(svc, holder["id"]) if e["reason"].startswith("looks hung")]

        told = wait_for(holder_alerts, timeout=60)
        assert f"ma-jupyter stop {holder['id']}" in told[0]["reason"], told
        shown = wait_for(
            lambda: [line for line in followed if line.startswith("ALERT: looks hung")], timeout=60
        )
        assert job_of(svc, holder["id"])["status"] == "running"
        # another job waits behind the lock, its holder alive: the launch's look leaves it held
        waiter = submit(svc, name="waiter", **{**run, "command": "python baton.py bounded"})
        wait_for(lambda: job_of(svc, waiter["id"])["status"] == "running", timeout=120)
        locks = list((ma_home / "caches").glob("*/torch_extensions/*/fused_adam/lock"))
        assert len(locks) == 1, locks
        # the holder killed while holding it (an OOM kill): once its node ended, the lock no
        # process holds open any more is released, while the waiter (a job of the user) runs
        svc.session().post(f"{svc.api}/jobs/{holder['id']}/stop", timeout=10)
        assert finished(svc, holder["id"])["status"] == "stopped"
        follower.wait(timeout=60)  # the follow ends with the job, the alert said once
        assert [line for line in followed if line.startswith("ALERT")] == shown, followed
        assert len(holder_alerts()) == 1  # one quiet spell, told once, whatever the looks since
        done = finished(svc, waiter["id"], timeout=300)
        assert done["status"] == "succeeded", (done["reason"], log_of(svc, waiter["id"]))
        assert "built after waiting" in log_of(svc, waiter["id"])
    finally:
        if follower is not None and follower.poll() is None:
            follower.kill()
            follower.wait()
        stop_services([svc])
