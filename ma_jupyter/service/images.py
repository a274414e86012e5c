"""Registered images: named Python environments with a scope, a card type and a visibility.

Seed 002 picks a job's image from the platform's image management, where "the image's scope
must include task-style training" and "the image's card type must match the node spec".  Here
an image is a Python environment on the machine (``--image`` names an interpreter, a virtualenv
folder or ``conda:ENV``, as before); a registered image gives one a name, with:

1. **scopes**: what it may be used for, ``training`` (jobs) and ``devenv`` (dev environments);
2. **card type**: ``cpu`` (specs without cards) or the cards it is built for (``gpu``, ``mlu``,
   ``npu``, as the cluster's specs name their ``accelerator_type``);
3. **visibility**: ``private`` (its owner's jobs only) or ``public`` (everyone's).  Only admins
   register public images: a public image's interpreter runs in every user's job that names
   it, so it must be the platform's, never one user's environment offered to the others.

A job names one with ``image: {"name": NAME}`` (``--image NAME``: a bare name that is no path
in the current folder).  At each submit and dry run (:func:`resolve`), in this order:

4. an unknown name is refused, saying what ``--image`` takes;
5. another user's private image is refused (naming its owner), whoever asks, admins too: the
   job would run its owner's environment;
6. the job's use must be in the image's scopes (``devenv`` for a dev environment, ``training``
   for any other job), else refused naming both;
7. every spec the job lists must have the image's card type, else refused naming the image's
   card type and the spec's;
8. the image's environment is copied into the job's spec beside the name (a value sent is
   replaced): the job runs the environment as it was registered when it was accepted, and its
   clone, which names the image again, the image as it is then.

Names are unique in the service; an image is removed by its owner or an admin (jobs that named
it keep their copy of its environment).  At most :data:`MAX_IMAGES` private images are
registered by non-admins' registrations, at most :data:`MAX_IMAGES_PER_USER` by one user; an
admin's registration meets the per-user cap only (users filling the service never keep the
platform's public images out).  The table
``registered_images`` lives in the store's database and is written through ``Store.writing``.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

from sqlalchemy import Column, Float, MetaData, String, Table, Text, func, select
from sqlalchemy.exc import IntegrityError

from .. import config
from ..errors import Conflict, Forbidden, InvalidSpec, LimitReached, NotFound
from ..models import Image, JobSpec, RegisteredImage, Spec
from .store import Store
from .users import Caller

#: the most images the service keeps (every user's together), and one user registers
MAX_IMAGES = 1000
MAX_IMAGES_PER_USER = 100

_metadata = MetaData()
images_table = Table(
    "registered_images",
    _metadata,
    Column("name", String, primary_key=True),
    Column("owner", String, nullable=False),
    Column("visibility", String, nullable=False),
    Column("created", Float, nullable=False),
    Column("image", Text, nullable=False),  # the RegisteredImage as JSON
)


def card_type_of(spec: Spec) -> str:
    """Rule 2's card type of a spec: ``cpu`` for one without cards, else its accelerator type."""
    return "cpu" if spec.accelerator_type == "none" or not spec.accelerators else spec.accelerator_type


class Images:
    """The registered images (the module's rules), in the store's database."""

    def __init__(self, store: Store):
        self.store = store
        self._made = False
        self._making = threading.Lock()

    def _table(self) -> None:
        """Create the table at first use (an older database lacks it), once: two first
        requests at once must not both try."""
        with self._making:
            if not self._made:
                images_table.create(self.store.engine, checkfirst=True)
                self._made = True

    def register(self, caller: Caller, image: RegisteredImage) -> RegisteredImage:
        """Register ``image`` as ``caller``'s (rule 3: public only for admins).

        Raises:
            Forbidden: a non-admin registers a public image.
            Conflict: the name is taken.
            LimitReached: the caller has :data:`MAX_IMAGES_PER_USER`, or a non-admin finds
                :data:`MAX_IMAGES` private images registered.
        """
        if image.visibility == "public" and not caller.admin:
            raise Forbidden(
                "only admins register public images (its interpreter would run in every user's jobs "
                "that name it): register it private (the default), or ask an admin"
            )
        self._table()
        now = time.time()
        image = image.model_copy(
            update={"owner": caller.name, "created_at": datetime.fromtimestamp(now, UTC)}
        )
        count = select(func.count()).select_from(images_table)
        try:
            with self.store.writing() as conn:
                if (
                    conn.execute(count.where(images_table.c.owner == caller.name)).scalar_one()
                    >= MAX_IMAGES_PER_USER
                ):
                    raise LimitReached(
                        f"{caller.name} has {MAX_IMAGES_PER_USER} registered images, the most one user "
                        "registers: remove unused ones (ma-jupyter images rm NAME)",
                        field="images",
                    )
                # the service-wide cap counts users' (private) images and binds non-admins only:
                # a few users filling it must not keep admins from registering the platform's
                # public images (an admin's are bounded by the per-user cap)
                if (
                    not caller.admin
                    and conn.execute(count.where(images_table.c.visibility == "private")).scalar_one()
                    >= MAX_IMAGES
                ):
                    raise LimitReached(
                        f"the service keeps at most {MAX_IMAGES} registered images: remove unused ones "
                        "(ma-jupyter images rm NAME)",
                        field="images",
                    )
                conn.execute(
                    images_table.insert().values(
                        name=image.name,
                        owner=caller.name,
                        visibility=image.visibility,
                        created=now,
                        image=image.model_dump_json(),
                    )
                )
        except IntegrityError:
            raise Conflict(
                f"an image named {image.name!r} is registered already: choose another name "
                "(ma-jupyter images list shows those you may use)"
            ) from None
        return image

    def get(self, name: str) -> RegisteredImage | None:
        """The image called ``name``, whoever may use it; None: none."""
        self._table()
        with self.store.engine.connect() as conn:
            data = conn.execute(select(images_table.c.image).where(images_table.c.name == name)).scalar()
        return None if data is None else RegisteredImage.model_validate_json(data)

    def visible(self, caller: Caller) -> list[RegisteredImage]:
        """The images ``caller`` may use (public ones and their own; admins see every one), by name."""
        self._table()
        query = select(images_table.c.image).order_by(images_table.c.name)
        if not caller.admin:
            query = query.where(
                (images_table.c.visibility == "public") | (images_table.c.owner == caller.name)
            )
        with self.store.engine.connect() as conn:
            return [RegisteredImage.model_validate_json(row[0]) for row in conn.execute(query).all()]

    def describe(self, name: str) -> str:
        """A dry run's note on the registered image ``name`` a job passed rules 4 to 7 with."""
        image = self.get(name)
        if image is None:
            return f"image {name}: no longer registered"
        env = image.environment
        runs = env.python or env.venv or f"conda env {env.conda_env}"
        return (
            f"image {name}: {runs}, {image.owner}'s {image.visibility} image for {image.card_type} "
            f"specs and {', '.join(image.scopes)} (its scope and card type fit this job)"
        )

    def remove(self, caller: Caller, name: str) -> None:
        """Remove image ``name`` (its owner or an admin).

        Raises:
            NotFound: no such image the caller may see.
            Forbidden: another user's public image, for a non-admin.
        """
        image = self.get(name)
        if image is None or (
            image.visibility == "private" and image.owner != caller.name and not caller.admin
        ):
            raise NotFound(
                f"no registered image {name!r}: ma-jupyter images list shows yours and the public ones"
            )
        if image.owner != caller.name and not caller.admin:
            raise Forbidden(f"image {name!r} is {image.owner}'s: only they or an admin remove it")
        with self.store.writing() as conn:
            conn.execute(images_table.delete().where(images_table.c.name == name))

    def resolve(self, spec: JobSpec, cluster: config.Cluster) -> JobSpec:
        """Rules 4 to 8 for the job ``spec`` of its ``creator``: the spec with the image's
        environment filled in (unchanged when it names no registered image).

        Raises:
            InvalidSpec: rules 4, 6 and 7, naming the field ``image``.
            Forbidden: rule 5.
        """
        name = spec.image.name
        if name is None:
            return spec
        image = self.get(name)
        if image is None:
            raise InvalidSpec(
                f"no registered image {name!r}: ma-jupyter images list shows those you may use; --image "
                "also takes an interpreter path, a virtualenv folder or conda:ENV",
                field="image",
            )
        if image.visibility == "private" and image.owner != spec.creator:
            raise Forbidden(
                f"image {name!r} is a private image of {image.owner}: only their jobs use it; ask them "
                "to have an admin register it public, or register an image of your own"
            )
        use = "devenv" if spec.devenv_of is not None else "training"
        if use not in image.scopes:
            what = "dev environments" if use == "devenv" else "training jobs"
            raise InvalidSpec(
                f"image {name!r} may be used for {', '.join(image.scopes)}, not for {what} (its scope "
                f"must include {use}): choose an image whose scopes include {use}",
                field="image",
            )
        known = {s.name: s for s in cluster.specs}
        for spec_name in spec.specs:
            node_spec = known.get(spec_name)
            if node_spec is None:
                continue  # the scheduler's check names the unknown spec
            cards = card_type_of(node_spec)
            if cards != image.card_type:
                has = "no cards" if cards == "cpu" else f"{node_spec.accelerators} {cards} card(s)"
                raise InvalidSpec(
                    f"image {name!r} is built for {image.card_type} specs, and spec {spec_name} has {has} "
                    f"(card type {cards}): the image's card type must match the spec; choose a "
                    f"{image.card_type} spec, or an image whose card type is {cards}",
                    field="image",
                )
        environment = Image(name=name, **image.environment.model_dump(exclude={"name"}))
        return spec.model_copy(update={"image": environment})
