"""The access rules as pure decisions: the matrix, the priority rules, and whom the Jupyter
server extension acts as."""

from __future__ import annotations

import pytest

from ma_jupyter.errors import BackendUnavailable, Forbidden, InvalidSpec, NotFound
from ma_jupyter.frontends.serverext import Upstream, forwarded_user
from ma_jupyter.models import Access, Job, JobSpec, Priority
from ma_jupyter.service import access
from ma_jupyter.service.access import Op
from ma_jupyter.service.users import Caller

ALICE, BOB, ADMIN = Caller("alice"), Caller("bob"), Caller("root", admin=True)


def job(access_value: str, creator: str | None = "alice") -> Job:
    return Job(id="j-1", spec=JobSpec(name="j", command="true", access=access_value, creator=creator))


@pytest.mark.parametrize("op", list(Op))
def test_the_matrix(op):
    for who in (ALICE, ADMIN):  # the creator and admins may do everything
        for value in ("rw", "ro", "none"):
            assert access.check(job(value), who, op).id == "j-1"
    if op is Op.shell:  # a debug terminal: its owner's or an admin's, whatever the access
        with pytest.raises(Forbidden, match="ask its owner to open a debug terminal on it"):
            access.check(job("rw"), BOB, op)
    else:
        assert access.check(job("rw"), BOB, op).id == "j-1"
    if op in (Op.view, Op.tensorboard):
        assert access.check(job("ro"), BOB, op).id == "j-1"
    else:
        with pytest.raises(Forbidden, match="belongs to alice .* ask its owner"):
            access.check(job("ro"), BOB, op)
    with pytest.raises(NotFound):
        access.check(job("none"), BOB, op)
    assert access.check(job("none", creator=None), BOB, op).id == "j-1"  # the service's own


def test_priorities_and_the_cap():
    access.check_priority(ADMIN, Priority.very_urgent)
    access.check_priority(BOB, Priority.urgent)
    with pytest.raises(Forbidden, match="only admins may choose very-urgent"):
        access.check_priority(BOB, Priority.very_urgent)
    rules = access.Rules(urgent_quota=2, source="/x/cluster.toml")
    access.check_urgent_quota(BOB, "bob", 1, rules)
    access.check_urgent_quota(ADMIN, "bob", 5, rules)
    with pytest.raises(
        Forbidden, match=r"the cap is 2 per user \(\[users\] urgent_quota in /x/cluster.toml\)"
    ):
        access.check_urgent_quota(BOB, "bob", 2, rules)


def test_new_jobs_belong_to_the_caller_and_are_private_with_sharing_off():
    spec = JobSpec(name="j", command="true", access="rw", creator="mallory")
    assert access.new_job_spec(spec, BOB, access.Rules()).creator == "bob"
    private = access.new_job_spec(spec, BOB, access.Rules(sharing=False))
    assert private.creator == "bob" and private.access.value == "none"


def test_rules_come_from_cluster_toml_and_bad_values_are_refused(tmp_path):
    path = tmp_path / "cluster.toml"
    assert access.load_rules(path) == access.Rules(source=str(path))
    path.write_text("[users]\nsharing = false\nurgent_quota = 5\n")
    assert access.load_rules(path) == access.Rules(sharing=False, urgent_quota=5, source=str(path))
    path.write_text("[users]\nurgent_quota = -1\n")
    with pytest.raises(InvalidSpec, match="urgent_quota must be a whole number"):
        access.load_rules(path)
    path.write_text('[users]\nsharing = "no"\n')
    with pytest.raises(InvalidSpec, match="sharing must be true or false"):
        access.load_rules(path)


def test_whom_the_server_extension_acts_as():
    assert forwarded_user("a1b2", None) is None  # no JupyterHub: the service owner
    assert forwarded_user("alice", "alice") is None  # the hub user owning this server: the owner
    assert forwarded_user("bob", "alice") == "bob"  # another hub user: forwarded by name
    upstream = Upstream("http://127.0.0.1:1", {"Authorization": "Bearer owner"}, "proxy")
    assert upstream.headers(None) == {"Authorization": "Bearer owner"}
    assert upstream.headers("bob") == {"Authorization": "Bearer proxy", "X-MA-Forwarded-User": "bob"}
    with pytest.raises(BackendUnavailable, match="no proxy token"):
        Upstream("http://127.0.0.1:1", {}, None).headers("bob")


def test_others_access_stays_within_what_the_resources_allow(tmp_path):
    """Rule 3 (the seed): a job's others' access is no more than its datasets', models' and
    volumes' folders give other users."""
    private, shared, open_ = (tmp_path / n for n in ("private", "shared", "open"))
    for folder, mode in ((private, 0o700), (shared, 0o755), (open_, 0o777)):
        folder.mkdir()
        folder.chmod(mode)  # chmod: the mode is exact whatever the umask
    assert [access.resource_access(str(f)) for f in (private, shared, open_)] == [
        Access.none,
        Access.ro,
        Access.rw,
    ]
    assert access.resource_access(str(tmp_path / "missing")) is None

    def submit(access_: str, **mounts) -> JobSpec:
        spec = JobSpec(name="j", command="python x.py", access=access_, **mounts)
        access.check_resource_access(spec)
        return spec

    with pytest.raises(InvalidSpec, match=r"others' access ro is more than dataset d allows") as refused:
        submit("ro", datasets=[{"name": "d", "path": str(private)}])
    assert refused.value.field == "access"
    assert "(mode 700) gives other users none access" in str(refused.value)
    assert "--access none" in str(refused.value) and f"chmod o+rx {private}" in str(refused.value)
    with pytest.raises(InvalidSpec, match=f"more than volume v allows.*chmod o\\+w {shared}"):
        submit("rw", volumes=[{"name": "v", "path": str(shared)}])
    assert submit("none", models=[{"name": "m", "path": str(private)}]).access is Access.none
    assert submit("ro", datasets=[{"name": "d", "path": str(shared)}]).access is Access.ro
    assert submit("rw", volumes=[{"name": "v", "path": str(open_)}]).access is Access.rw


def test_others_access_stays_within_the_code_and_outputs_folders_the_user_gave(tmp_path, monkeypatch):
    """Rule 3 for the algorithm and the outputs: the code is judged by the folder it was shipped
    from, never by the platform's snapshot; read-only code caps only who may read it, the
    outputs folder by its own mode."""
    monkeypatch.setenv("MA_JUPYTER_HOME", str(tmp_path / "home"))
    snapshot = tmp_path / "home" / "snapshots" / "job-1"
    private, shared, open_ = (tmp_path / n for n in ("private", "shared", "open"))
    for folder, mode in ((snapshot, 0o755), (private, 0o700), (shared, 0o755), (open_, 0o777)):
        folder.mkdir(parents=True)
        folder.chmod(mode)

    def submit(access_: str, **fields) -> JobSpec:
        command = None if fields.get("type") == "batch" else "python x.py"
        spec = JobSpec(name="j", command=command, access=access_, **fields)
        access.check_resource_access(spec)
        return spec

    # shipped from a private folder: its snapshot (0755) does not open it to others
    with pytest.raises(
        InvalidSpec, match=r"others' access ro is more than algorithm folder allows"
    ) as refused:
        submit("ro", algorithm=str(snapshot), algorithm_origin=str(private))
    assert refused.value.field == "access" and f"{private} (mode 700)" in str(refused.value)
    assert "--access none" in str(refused.value)
    # a cell's snapshot with no folder of the user's caps nothing; a read-only 0755 folder allows rw
    assert submit("rw", algorithm=str(snapshot)).access is Access.rw
    assert submit("rw", algorithm=str(snapshot), algorithm_origin=str(shared)).access is Access.rw
    # a folder used as is, a batch task's, and code mounted writable (as a volume: rw needs o+w)
    with pytest.raises(InvalidSpec, match=f"algorithm folder allows: {private}"):
        submit("ro", algorithm=str(private))
    with pytest.raises(InvalidSpec, match=f"algorithm of task 1 allows: {private}"):
        submit(
            "ro",
            type="batch",
            tasks=[
                {"command": "true", "algorithm": str(shared)},
                {"command": "true", "algorithm": str(private)},
            ],
        )
    with pytest.raises(InvalidSpec, match=f"more than algorithm folder allows.*chmod o\\+w {shared}"):
        submit("rw", algorithm=str(shared), algorithm_read_only=False)
    # the outputs folder by its own mode
    with pytest.raises(InvalidSpec, match=f"others' access ro is more than outputs folder allows: {private}"):
        submit("ro", outputs=str(private))
    with pytest.raises(InvalidSpec, match=f"more than outputs folder allows.*chmod o\\+w {shared}"):
        submit("rw", outputs=str(shared))
    assert submit("rw", outputs=str(open_), algorithm=str(shared)).access is Access.rw
    assert submit("none", outputs=str(private), algorithm=str(private)).access is Access.none


def test_a_spec_naming_no_access_gets_the_default_capped_by_its_folders_never_refused(tmp_path):
    """Rule 3 for the default: a job shipped from a private folder (or mounting one) becomes
    private; a job that names its access keeps the refusal above."""
    private, shared = tmp_path / "private", tmp_path / "shared"
    for folder, mode in ((private, 0o700), (shared, 0o755)):
        folder.mkdir()
        folder.chmod(mode)
    caller = Caller(name="alice", admin=False)
    rules = access.Rules()

    def stored(**fields) -> JobSpec:
        return access.new_job_spec(JobSpec(name="j", command="python x.py", **fields), caller, rules)

    assert stored(algorithm=str(shared)).access is Access.ro
    assert stored(algorithm=str(private)).access is Access.none
    assert stored(datasets=[{"name": "d", "path": str(private)}]).access is Access.none
    assert stored(outputs=str(private)).access is Access.none
    access.check_resource_access(stored(algorithm=str(private)))  # the capped default passes
    # named, it is the user's choice: kept, and refused by the check
    named = stored(algorithm=str(private), access="ro")
    assert named.access is Access.ro
    with pytest.raises(InvalidSpec, match="others' access ro is more than algorithm folder allows"):
        access.check_resource_access(named)


def test_a_link_in_the_snapshots_folder_is_judged_by_the_folder_it_points_to(tmp_path, monkeypatch):
    """The hostile user: the client writes snapshots as the user, so a user can put a link in
    ``<home>/snapshots`` to a private folder and name it as the algorithm: the mount rules resolve it and mount the private folder, so rule 3 must
    judge that folder too, not wave it through as one of the platform's snapshots."""
    home = tmp_path / "home"
    monkeypatch.setenv("MA_JUPYTER_HOME", str(home))
    (home / "snapshots").mkdir(parents=True)
    private, code = tmp_path / "private", tmp_path / "private" / "code"
    code.mkdir(parents=True)
    private.chmod(0o700)
    code.chmod(0o700)
    (home / "snapshots" / "job-1").symlink_to(code)
    for algorithm in (home / "snapshots" / "job-1",):
        spec = JobSpec(name="j", command="python x.py", access="ro", algorithm=str(algorithm))
        with pytest.raises(InvalidSpec, match=r"others' access ro is more than algorithm folder allows"):
            access.check_resource_access(spec)
        spec = JobSpec(
            name="j", type="batch", access="ro", tasks=[{"command": "true", "algorithm": str(algorithm)}]
        )
        with pytest.raises(InvalidSpec, match=r"more than algorithm of task 0 allows"):
            access.check_resource_access(spec)


def test_a_writable_folder_the_platform_creates_caps_as_it_will_be_made(tmp_path):
    """The hostile user: an outputs folder or a volume that does not exist yet escaped rule 3
    (nothing to look at), yet the platform makes it at launch with mode 0755, which others may
    not write: rw is refused, saying how to open it; ro stays allowed."""
    missing = tmp_path / "new-outputs"
    for fields, kind in (
        ({"outputs": str(missing)}, "outputs folder"),
        ({"volumes": [{"name": "v", "path": str(missing)}]}, "volume v"),
    ):
        spec = JobSpec(name="j", command="python x.py", access="rw", **fields)
        with pytest.raises(InvalidSpec, match=f"others' access rw is more than {kind} allows") as refused:
            access.check_resource_access(spec)
        assert f"mkdir -m 777 {missing}" in str(refused.value) and "--access ro" in str(refused.value)
        access.check_resource_access(spec.model_copy(update={"access": Access.ro}))
    assert not missing.exists()
