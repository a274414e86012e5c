"""Registered images (seed 002's 镜像: "the image's scope must include task-style training", "the
image's card type must match the node spec"), on one real service: REST, the CLI, the dry run
and one real job.  The default cluster's ``gpu.emu-2`` is a spec with (emulated) GPU cards."""

from __future__ import annotations

import json
import sys

from tests.fixtures.service_api import wait_status

PY = sys.executable


def test_registered_images_obey_their_card_type_scope_and_owner(ma_module_service, ma_module_cli):
    svc = ma_module_service
    alice, bob = svc.user_session("img-alice"), svc.user_session("img-bob")
    api = svc.api

    def image(name: str, **fields) -> dict:
        return {"name": name, "environment": {"python": PY}, **fields}

    # only admins register public images (its interpreter would run in everyone's jobs)
    refused = alice.post(f"{api}/images", json=image("alice-public", visibility="public"), timeout=30)
    assert refused.status_code == 403 and "only admins register public images" in refused.text
    mine = alice.post(f"{api}/images", json=image("alice-cpu", scopes=["training"]), timeout=30)
    assert mine.status_code == 201, mine.text
    assert mine.json()["owner"] == "img-alice" and mine.json()["visibility"] == "private"
    taken = bob.post(f"{api}/images", json=image("alice-cpu"), timeout=30)
    assert taken.status_code == 409 and "is registered already" in taken.text
    bad = alice.post(f"{api}/images", json={"name": "x", "environment": {"name": "alice-cpu"}}, timeout=30)
    assert bad.status_code in (400, 422) and "environment" in bad.text, bad.text

    # the CLI: the owner (an admin) registers a public GPU image; everyone sees it, not alice's
    added = ma_module_cli("images", "add", "owner-gpu", PY, "--card-type", "gpu", "--public", "--json")
    assert added.returncode == 0, added.stderr
    assert json.loads(added.stdout)["card_type"] == "gpu"
    names = [i["name"] for i in bob.get(f"{api}/images", timeout=30).json()]
    assert "owner-gpu" in names and "alice-cpu" not in names
    listing = ma_module_cli("images", "list")
    assert listing.returncode == 0 and "owner-gpu" in listing.stdout and "alice-cpu" in listing.stdout

    def plan(session, name: str, **fields):
        body = {"name": "img", "command": f"{PY} -c pass", "image": {"name": name}, **fields}
        return session.post(f"{api}/plan", json=body, timeout=60)

    # the card type must match every spec the job lists: refused naming both
    cpu_on_gpu = plan(alice, "alice-cpu", specs=["gpu.emu-2"])
    assert cpu_on_gpu.status_code == 400, cpu_on_gpu.text
    assert "image 'alice-cpu' is built for cpu specs, and spec gpu.emu-2 has 2 gpu card(s)" in cpu_on_gpu.text
    gpu_on_cpu = ma_module_cli("submit", "--dry-run", "--image", "owner-gpu", "--", PY, "-c", "pass")
    assert gpu_on_cpu.returncode != 0
    assert "image 'owner-gpu' is built for gpu specs, and spec cpu.small has no cards" in gpu_on_cpu.stderr
    fits = plan(alice, "owner-gpu", specs=["gpu.emu-2"])
    assert fits.status_code == 200, fits.text
    assert fits.json()["nodes"][0]["image"]["python"] == PY
    assert f"image owner-gpu: {PY}, " in " ".join(fits.json()["notes"]), fits.json()["notes"]
    # another user's private image is refused, naming its owner; an unknown one says what --image takes
    stolen = plan(bob, "alice-cpu")
    assert stolen.status_code == 403 and "a private image of img-alice" in stolen.text, stolen.text
    unknown = plan(alice, "no-such-image")
    assert unknown.status_code == 400 and "no registered image 'no-such-image'" in unknown.text
    # --image keeps taking an interpreter path
    path = ma_module_cli("submit", "--dry-run", "--image", PY, "--", PY, "-c", "pass")
    assert path.returncode == 0, path.stderr

    # a job of alice's image runs it; the service wrote its environment beside the name
    reply = alice.post(
        f"{api}/jobs",
        json={
            "name": "img-job",
            "command": f"{PY} -c 'import sys; print(sys.executable)'",
            "image": {"name": "alice-cpu"},
        },
        timeout=60,
    )
    assert reply.status_code == 201, reply.text
    job = wait_status(svc, reply.json()["id"], {"succeeded", "error"}, timeout=120)
    assert job["status"] == "succeeded", job["reason"]
    assert job["spec"]["image"] == {"python": PY, "venv": None, "conda_env": None, "name": "alice-cpu"}
    # its scope is training only: no dev environment of that job
    devenv = alice.post(f"{api}/jobs/{job['id']}/devenv", json={}, timeout=60)
    assert devenv.status_code == 400, devenv.text
    assert "may be used for training, not for dev environments" in devenv.text

    # removed by its owner only (bob does not even see it); then it is gone for new jobs
    assert bob.delete(f"{api}/images/alice-cpu", timeout=30).status_code == 404
    assert alice.delete(f"{api}/images/alice-cpu", timeout=30).status_code == 204
    assert plan(alice, "alice-cpu").status_code == 400
