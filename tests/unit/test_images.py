"""The registered images' rules as the service keeps them (service/images.py), on a real store."""

from __future__ import annotations

import sys

import pytest

from ma_jupyter import config
from ma_jupyter.errors import Forbidden, InvalidSpec, LimitReached
from ma_jupyter.models import JobSpec, RegisteredImage
from ma_jupyter.service import images
from ma_jupyter.service.store import Store
from ma_jupyter.service.users import Caller

ALICE, ADMIN = Caller("alice"), Caller("root", admin=True)


def test_caps_owners_and_what_the_spec_gets(tmp_path, monkeypatch):
    registry = images.Images(Store(tmp_path / "jobs.db"))
    monkeypatch.setattr(images, "MAX_IMAGES_PER_USER", 2)
    for name in ("a1", "a2"):
        registry.register(ALICE, RegisteredImage(name=name, environment={"python": sys.executable}))
    with pytest.raises(LimitReached, match="alice has 2 registered images, the most one user registers"):
        registry.register(ALICE, RegisteredImage(name="a3", environment={"python": sys.executable}))
    registry.register(ADMIN, RegisteredImage(name="r1", environment={"venv": "/opt/venv"}, scopes=["devenv"]))
    cluster = config.Cluster()

    # an admin's job does not run alice's private environment either
    with pytest.raises(Forbidden, match="a private image of alice"):
        registry.resolve(JobSpec(name="j", command="true", creator="root", image={"name": "a1"}), cluster)
    # outside its scopes: named with the use
    with pytest.raises(InvalidSpec, match="may be used for devenv, not for training jobs"):
        registry.resolve(JobSpec(name="j", command="true", creator="root", image={"name": "r1"}), cluster)
    # the environment as registered replaces what was sent beside the name
    sent = JobSpec(name="j", command="true", creator="alice", image={"name": "a1", "python": "/elsewhere"})
    assert registry.resolve(sent, cluster).image.model_dump(exclude_none=True) == {
        "name": "a1",
        "python": sys.executable,
    }
    assert [i.name for i in registry.visible(ALICE)] == ["a1", "a2"]  # r1 is the admin's, private
    assert [i.name for i in registry.visible(ADMIN)] == ["a1", "a2", "r1"]


def test_users_filling_the_service_never_keep_an_admin_from_registering(tmp_path, monkeypatch):
    """The hostile users: a few accounts registering their most each fill :data:`MAX_IMAGES`;
    the platform's public images (an admin's) must still be registered, the users' next one not."""
    registry = images.Images(Store(tmp_path / "jobs.db"))
    monkeypatch.setattr(images, "MAX_IMAGES", 2)
    for user in ("alice", "bob"):
        registry.register(
            Caller(user), RegisteredImage(name=f"{user}-1", environment={"python": sys.executable})
        )
    with pytest.raises(LimitReached, match="the service keeps at most 2 registered images"):
        registry.register(Caller("carol"), RegisteredImage(name="c1", environment={"python": sys.executable}))
    public = RegisteredImage(name="platform", environment={"python": sys.executable}, visibility="public")
    assert registry.register(ADMIN, public).owner == "root"
