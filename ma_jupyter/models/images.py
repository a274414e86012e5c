"""Registered images (``POST /images``): a name for a Python environment, what it may be
used for, the cards it is built for and who may use it."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field, model_validator

from .common import NAME_PATTERN, Short, Strict
from .spec import Image

#: what a registered image may be used for (seed 002: "the image's scope must include
#: task-style training"): ``training`` jobs, ``devenv`` dev environments
ImageScope = Literal["training", "devenv"]
#: the cards a registered image is built for (seed 002: "the image's card type must match the
#: node spec"): ``cpu`` matches a spec without cards, the others a spec's ``accelerator_type``
ImageCardType = Literal["cpu", "gpu", "mlu", "npu"]


class RegisteredImage(Strict):
    """An image registered with the service (``POST /images``), as ModelArts' image management
    keeps one: a name for a Python environment, what it may be used for, the cards it is built
    for and who may use it."""

    name: str = Field(pattern=NAME_PATTERN, description="What --image names it by: unique in the service.")
    environment: Image = Field(description="The environment: one of python, venv or conda_env (never name).")
    card_type: ImageCardType = Field(
        default="cpu", description="cpu, gpu, mlu or npu: the only specs it runs on are of this type."
    )
    scopes: list[ImageScope] = Field(
        default=["training", "devenv"],
        min_length=1,
        max_length=2,
        description="training (jobs), devenv (dev environments): what it may be used for.",
    )
    visibility: Literal["public", "private"] = Field(
        default="private",
        description="private: its owner's jobs only; public: everyone's (registered by admins only).",
    )
    description: str = Field(default="", max_length=500)
    owner: Short | None = Field(default=None, description="Set by the service: who registered it.")
    created_at: datetime | None = Field(default=None, description="Set by the service.")

    @model_validator(mode="after")
    def _an_environment(self) -> RegisteredImage:
        env = self.environment
        if env.name is not None or not (env.python or env.venv or env.conda_env):
            raise ValueError("environment: give one of python, venv or conda_env (not another image's name)")
        if len(set(self.scopes)) != len(self.scopes):
            raise ValueError("scopes: each scope may be listed once")
        return self
