"""The attempt a job's placement becomes: what the backend dry-runs, launches, polls and stops.

Rules:

1. The nodes run the job's spec with its secret values in (read from the store at this moment
   only: the stored spec has ``***``) and, for a data-preparation job, each dataset's path
   replaced by its link to the prepared copy (:func:`..preparation.prepared_path`), and so is
   every dataset's and model's ``s3://`` or ``obs://`` path (downloaded there first); the
   storage credentials are not the node's (only with ``storage_env``, as secret variables).
2. A dry attempt (``dry``) runs the spec as given (masked secrets, the datasets' own sources)
   in the placeholder job folder: what a preflight and the data-preparation check dry-run.
3. A restarted batch job runs again only the tasks that did not succeed.
4. Every node of a resumed or restarted attempt is told so in its environment
   (:func:`..policies.attempt_env`), so the training code can load its checkpoint.
"""

from __future__ import annotations

from ... import config
from ...backends.base import Attempt
from ...jobdir import PLACEHOLDER
from ...models import Job, JobSpec, is_object_uri
from ...modes import plan_job
from ...modes.base import Placement
from .. import policies
from ..preparation import prepared_path
from ..store import Store


def effective_spec(store: Store, job: Job) -> JobSpec:
    """Rule 1: the spec the nodes run with.

    The model only allows data preparation when every dataset is read-only.
    """
    spec = job.spec
    if spec.secret_env:  # the values, read at launch only (the stored spec has ***)
        spec = spec.model_copy(update={"secret_env": store.secrets(job.id)})
    if spec.storage_credentials:  # never the node's: only its data steps read them (storage.py)
        secret_env = dict(spec.secret_env)
        if spec.storage_env:  # the user asked: the job's own environment gets them too
            secret_env.update(store.storage_secrets(job.id))
        spec = spec.model_copy(update={"secret_env": secret_env, "storage_credentials": {}})
    if not spec.prepares_data():
        return spec
    datasets = [
        d.model_copy(update={"path": str(prepared_path(job.id, d))})
        if spec.data_preparation or is_object_uri(d.path)
        else d
        for d in spec.datasets
    ]
    models = [
        m.model_copy(update={"path": str(prepared_path(job.id, m, "model-"))}) if is_object_uri(m.path) else m
        for m in spec.models
    ]
    return spec.model_copy(update={"datasets": datasets, "models": models})


def attempt_for(store: Store, job: Job, placement: Placement, *, dry: bool = False) -> Attempt:
    """The attempt of ``job`` on ``placement`` (rules 1 to 4)."""
    spec = job.spec if dry else effective_spec(store, job)
    plans = plan_job(spec, placement)
    if spec.type.value == "batch" and job.attempt:  # rule 3
        done = {r.name for r in job.nodes if r.state == "exited" and r.exit_code == 0}
        plans = [p for p in plans if p.name not in done]
    for node in plans:  # rule 4
        node.env.update(policies.attempt_env(job))
    return Attempt(
        job_id=job.id,
        spec=spec,
        number=job.attempt,
        job_dir=(PLACEHOLDER if dry else config.jobdir(job.id)).root,
        plans=tuple(plans),
    )
