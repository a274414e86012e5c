"""Object storage at the edge: the options and the model take s3:// and obs:// paths as they are,
the submitter's credentials are found the AWS tools' way (variables, else a profile of ~/.aws)
and travel only with a spec that names object storage; ``[storage]`` is checked."""

from __future__ import annotations

import pytest

from ma_jupyter import config
from ma_jupyter.client.spec import spec_body, storage_credentials
from ma_jupyter.errors import InvalidSpec
from ma_jupyter.frontends import options
from ma_jupyter.models import parse_spec
from ma_jupyter.objectstore import ObjectURI

AWS = {"AWS_ACCESS_KEY_ID": "AKID", "AWS_SECRET_ACCESS_KEY": "sk", "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}


def test_options_take_object_storage_uris_as_they_are():
    parser = options.build_parser()
    args = options.parse_args(
        parser, "--dataset d=s3://bkt/train --model m=obs://models/bert --output s3://bkt/out --storage-env"
    )
    spec = options.spec_from_args(args, command="python train.py")
    assert spec["datasets"] == [{"name": "d", "path": "s3://bkt/train", "read_only": True}]
    assert spec["models"] == [{"name": "m", "path": "obs://models/bert"}]
    assert spec["outputs"] == "s3://bkt/out" and spec["storage_env"] is True
    with pytest.raises(InvalidSpec, match="read-only"):
        parse_spec(
            {
                "name": "x",
                "command": "true",
                "datasets": [{"name": "d", "path": "s3://b/p", "read_only": False}],
            }
        )
    with pytest.raises(InvalidSpec, match="s3://BUCKET/PREFIX"):
        ObjectURI.parse("s3:///nobucket")


def test_credentials_from_the_variables_else_a_profile(tmp_path, monkeypatch):
    assert storage_credentials({**AWS, "AWS_REGION": "eu-west-1", "HOME": "/x"}) == {
        **AWS,
        "AWS_REGION": "eu-west-1",
    }
    (tmp_path / "credentials").write_text(
        "[team]\naws_access_key_id = PROFKEY\naws_secret_access_key = profsecret\n"
    )
    (tmp_path / "config").write_text(
        "[profile team]\nregion = cn-north-4\nendpoint_url = https://obs.example\n"
    )
    env = {
        "AWS_PROFILE": "team",
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "credentials"),
        "AWS_CONFIG_FILE": str(tmp_path / "config"),
    }
    assert storage_credentials(env) == {
        "AWS_ACCESS_KEY_ID": "PROFKEY",
        "AWS_SECRET_ACCESS_KEY": "profsecret",
        "AWS_REGION": "cn-north-4",
        "AWS_ENDPOINT_URL": "https://obs.example",
    }
    with pytest.raises(InvalidSpec, match="AWS_PROFILE=other"):
        storage_credentials({**env, "AWS_PROFILE": "other"})

    # a spec naming object storage takes them along; one that names none never does
    for name, value in AWS.items():
        monkeypatch.setenv(name, value)
    body = spec_body(None, {"name": "j", "command": "true", "datasets": [{"name": "d", "path": "s3://b/p"}]})
    assert body["storage_credentials"] == AWS
    body = spec_body(None, {"name": "j", "command": "true", "outputs": str(tmp_path)})
    assert "storage_credentials" not in body


def test_storage_table_is_checked(tmp_path):
    path = tmp_path / "cluster.toml"
    path.write_text('[storage]\nobs_endpoint = "https://obs.cn-north-4.example"\nupload_interval = 5\n')
    assert config.load_storage(path) == config.StorageConfig("https://obs.cn-north-4.example", 5.0)
    path.write_text('[storage]\nobs_endpont = "https://x"\n')
    with pytest.raises(InvalidSpec, match="obs_endpoint, upload_interval and allow_endpoints"):
        config.load_storage(path)
    path.write_text('[storage]\nobs_endpoint = "obs.example"\n')
    with pytest.raises(InvalidSpec, match="http"):
        config.load_storage(path)


def test_the_lab_proxy_adds_the_servers_credentials_to_an_object_storage_spec(monkeypatch):
    import json

    from ma_jupyter.client.spec import with_storage_credentials

    for name, value in AWS.items():
        monkeypatch.setenv(name, value)
    named = json.dumps({"name": "j", "datasets": [{"name": "d", "path": "s3://b/p"}]}).encode()
    assert json.loads(with_storage_credentials(named))["storage_credentials"] == AWS
    local = json.dumps({"name": "j", "datasets": [{"name": "d", "path": "/data"}]}).encode()
    assert with_storage_credentials(local) == local
    assert with_storage_credentials(b"not json") == b"not json"


def test_a_cloned_spec_with_masked_credentials_takes_the_submitters_own(monkeypatch):
    """A job's spec as the service shows it has its credentials masked: cloning it (with AWS_*
    set) sends the submitter's own, never the masks; without any, the masks are dropped."""
    cloned = {
        "name": "j",
        "command": "true",
        "datasets": [{"name": "d", "path": "s3://b/p"}],
        "storage_credentials": dict.fromkeys(AWS, "***"),
    }
    for name, value in AWS.items():
        monkeypatch.setenv(name, value)
    assert spec_body(None, cloned)["storage_credentials"] == AWS
    assert spec_body(None, cloned, validate=False)["storage_credentials"] == AWS
    for name in AWS:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", "/nonexistent")
    assert "***" not in str(spec_body(None, cloned, validate=False))
    assert "***" not in str(spec_body(None, cloned))


def test_an_endpoints_error_body_never_reaches_the_answer():
    """A hostile endpoint's response body (which it chose) is never echoed: the reason is the
    error's kind, its HTTP status and S3's error code."""
    from ma_jupyter.objectstore import _reason

    text = (
        "Generic S3 error: Client error with status 403 Forbidden: <?xml?><Error><Code>AccessDenied"
        "</Code><Message>ami-id: ami-0123 instance-secret</Message></Error>"
    )
    assert _reason(RuntimeError(text)) == "RuntimeError, HTTP 403, AccessDenied"
    assert "instance-secret" not in _reason(RuntimeError(text))


def test_a_wrong_storage_table_never_raises_into_a_jobs_watch(tmp_path, monkeypatch):
    """An administrator's typo in ``[storage]``: each running job's watch goes on (the uploads
    keep their interval) instead of raising at every look."""
    from types import SimpleNamespace

    from ma_jupyter.service.storage import Uploads

    monkeypatch.setenv("MA_JUPYTER_HOME", str(tmp_path))
    (tmp_path / "cluster.toml").write_text("[storage]\nupload_intervall = 5\n")
    uploads = Uploads(lambda job_id: {})
    job = SimpleNamespace(id="j", spec=SimpleNamespace(outputs="s3://b/out"))
    for _ in range(3):
        uploads.due(job)  # the first look only starts the clock: no upload, no error
    assert "j" not in uploads._busy


def test_a_client_is_reused_only_with_the_same_bucket_endpoint_and_credentials():
    """objectstore rule 5: calls with the same credentials share one client, and a client made
    with one user's credentials never serves another's (a changed secret alone is another)."""
    from ma_jupyter import objectstore

    uri = ObjectURI.parse("s3://reuse-bkt/p")
    first = objectstore._store(uri, AWS, AWS["AWS_ENDPOINT_URL"], 30.0)
    assert (
        objectstore._store(ObjectURI.parse("s3://reuse-bkt/q"), dict(AWS), AWS["AWS_ENDPOINT_URL"], 30.0)
        is first
    )
    for bucket, credentials, endpoint in (
        ("other-bkt", AWS, AWS["AWS_ENDPOINT_URL"]),
        ("reuse-bkt", {**AWS, "AWS_SECRET_ACCESS_KEY": "another"}, AWS["AWS_ENDPOINT_URL"]),
        ("reuse-bkt", {**AWS, "AWS_ACCESS_KEY_ID": "AKID2"}, AWS["AWS_ENDPOINT_URL"]),
        ("reuse-bkt", AWS, "http://127.0.0.1:10"),
    ):
        assert (
            objectstore._store(ObjectURI.parse(f"s3://{bucket}/p"), credentials, endpoint, 30.0) is not first
        )
    assert len(objectstore._stores) <= objectstore.KEPT_STORES


def test_download_progress_is_told_at_most_every_interval_and_its_last_line_always():
    from ma_jupyter import objectstore
    from ma_jupyter.backends.ray import objects

    now = [100.0]
    said: list[str] = []
    lines = objectstore.ProgressLines(
        "datasets d", ObjectURI.parse("s3://bkt/p"), said.append, every=2.0, clock=lambda: now[0]
    )
    state = objectstore.Progress(objects=6, bytes=6_000_000)
    for done in range(1, 6):  # an object every 0.5 s: one line in the 2 s, not five
        now[0] += 0.5
        state.done_objects, state.done_bytes = done, done * 1_000_000
        lines(state)
    assert len(said) == 1 and "4.0 of 6.0 MB, 4 of 6 objects" in said[0], said
    now[0] += 0.1
    state.done_objects, state.done_bytes = 6, 6_000_000
    lines(state)  # the last object: told at once
    assert len(said) == 2 and "6 of 6 objects" in said[1] and "MB/s" in said[1], said

    # a Ray node's agent keeps a job's lines for the service, bounded, each handed over once
    for i in range(objects.MAX_PROGRESS_LINES + 8):
        objects._keep("job-progress", f"line {i}")
    kept = objects.progress("job-progress")
    assert len(kept) == objects.MAX_PROGRESS_LINES and kept[-1] == f"line {objects.MAX_PROGRESS_LINES + 7}"
    assert objects.progress("job-progress") == []
