"""The service's answers read as plain JSON: :class:`Plain`, a read-only view of a wire model.

A command line asks for one job or one page and prints a few fields; validating the answer
with pydantic meant importing pydantic and :mod:`ma_jupyter.models` and building the model's
validator, most of a call's time.  A client made with ``Client(plain=True)`` returns a
:class:`Plain` instead for the models of :data:`FIELDS`.

Rules:

1. The pydantic model stays the one definition: :data:`FIELDS` is derived from it
   (:func:`derive_fields`; ``python -m ma_jupyter.client.plain`` rewrites ``plain_fields.py``,
   and ``tests/unit/test_plain.py`` fails when the two differ).  A view answers exactly the
   model's field names.
2. A field's JSON value is read as the model reads it: a date-time as an aware
   :class:`~datetime.datetime`, an enumeration as its member of :mod:`ma_jupyter.wire` (the
   same objects :mod:`ma_jupyter.models` uses), a nested model as a view, a list of models as a
   list of views; anything else as it is.
3. Anything else (a method or property such as ``Job.log_node``, ``model_dump``) and a field
   the answer lacks are the model's own: the view validates its JSON with the pydantic model
   once, on first such use, and answers from it.  So a view never behaves differently from
   the model, only later.
4. The service validated what it answers; a view trusts it (a malformed answer shows when a
   field is read, or in rule 3's validation).
5. A view's JSON (:func:`as_json`) is the service's answer as it came: the service writes it
   as the model's ``model_dump(mode="json")``, so ``--json`` prints the same without pydantic.
"""

from __future__ import annotations

import types
from datetime import datetime

from .. import wire
from .plain_fields import FIELDS

TYPE_CHECKING = False  # typing's, without importing typing (a command line's call: ~5 ms)
if TYPE_CHECKING:
    from typing import Any

#: the models a plain client reads as views, and those reached from them (rule 1)
ROOTS = (
    "JobPage",
    "Job",
    "LogChunk",
    "LogStream",
    "Event",
    "User",
    "Spec",
    "Node",
    "ResourceUsage",
    "ClusterView",
)


class Plain:
    """A read-only view of one wire model's JSON (the module's rules)."""

    __slots__ = ("_name", "_data", "_read", "_model")

    def __init__(self, name: str, data: dict[str, Any]):
        if not isinstance(data, dict):
            raise TypeError(f"a {name} is a JSON object, not {type(data).__name__}")
        self._name = name
        self._data = data
        self._read: dict[str, Any] = {}
        self._model: Any = None

    def __getattr__(self, field: str) -> Any:
        if field.startswith("__"):
            raise AttributeError(field)
        kinds = FIELDS[self._name]
        if field in kinds and field in self._data:
            try:
                return self._read[field]
            except KeyError:
                value = self._read[field] = _value(kinds[field], self._data[field])
                return value
        return getattr(self.validated(), field)  # rule 3

    def validated(self) -> Any:
        """The pydantic model of this JSON (validated once, on first use)."""
        if self._model is None:
            from .. import models

            self._model = getattr(models, self._name).model_validate(self._data)
        return self._model

    def __repr__(self) -> str:
        return f"<plain {self._name} {self._data!r:.120}>"


def model_name(value: Any) -> str:
    """The wire model's name of a view or a pydantic model (``Job``, ``JobSummary``)."""
    return value._name if isinstance(value, Plain) else type(value).__name__


def as_json(value: Any) -> Any:
    """The JSON of a view (rule 5: the service's answer, not copied), of a pydantic model
    (``model_dump(mode="json")``) or of a list of either."""
    if isinstance(value, list):
        return [as_json(item) for item in value]
    if isinstance(value, Plain):
        return value._data
    return value.model_dump(mode="json")


def read(name: str, data: Any) -> Any:
    """``data`` (an answer's JSON) as a view of model ``name`` (rule 2's reading)."""
    return _value(name, data)


def _value(kind: str, value: Any) -> Any:
    if not kind or value is None:
        return value
    if kind[0] == "[":
        return [_value(kind[1:], item) for item in value]
    if kind == "datetime":
        return datetime.fromisoformat(value)
    enum = getattr(wire, kind, None)
    if enum is not None:
        return enum(value)
    return Plain(kind, value)


# ----------------------------------------------------------------- the table, from the model


def derive_fields() -> dict[str, dict[str, str]]:
    """:data:`FIELDS` as the pydantic models define it now: every field of :data:`ROOTS` and
    the models they hold, each with how its JSON is read (``""`` as it is, ``datetime``, an
    enumeration's name, a model's name, ``[`` before either for a list)."""
    import typing

    from pydantic import BaseModel

    from .. import models

    def kind(annotation: Any, todo: list[str]) -> str:
        origin, args = typing.get_origin(annotation), typing.get_args(annotation)
        if origin in (typing.Union, types.UnionType):
            inner = [a for a in args if a is not type(None)]
            kinds = {kind(a, todo) for a in inner}
            if len(kinds) != 1:
                raise TypeError(f"a plain view cannot read a union of {inner}")
            return kinds.pop()
        if origin is list:
            inner = kind(args[0], todo)
            return "[" + inner if inner else ""
        if origin is dict:
            if kind(args[1], todo):
                raise TypeError(f"a plain view cannot read a dict of {args[1]}")
            return ""
        if annotation is datetime:
            return "datetime"
        if isinstance(annotation, type) and issubclass(annotation, wire.Enum):
            if getattr(wire, annotation.__name__, None) is not annotation:
                raise TypeError(f"{annotation.__name__} is not an enumeration of ma_jupyter.wire")
            return annotation.__name__
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            todo.append(annotation.__name__)
            return annotation.__name__
        return ""

    todo, out = list(ROOTS), {}
    while todo:
        name = todo.pop(0)
        if name not in out:
            fields = getattr(models, name).model_fields
            out[name] = {field: kind(info.annotation, todo) for field, info in fields.items()}
    return {name: out[name] for name in sorted(out)}


def fields_source() -> str:
    """The text of ``plain_fields.py`` for :func:`derive_fields`."""
    lines = [
        '"""How a plain view reads the fields of each wire model: generated from ma_jupyter.models by',
        "``python -m ma_jupyter.client.plain`` (do not edit; tests/unit/test_plain.py checks it).",
        '"""',
        "",
        "FIELDS: dict[str, dict[str, str]] = {",
    ]
    for name, fields in derive_fields().items():
        lines.append(f"    {name!r}: {{")
        lines += [f"        {field!r}: {kind!r}," for field, kind in fields.items()]
        lines.append("    },")
    lines.append("}")
    return "\n".join(lines).replace("'", '"') + "\n"


if __name__ == "__main__":
    from pathlib import Path

    target = Path(__file__).with_name("plain_fields.py")
    target.write_text(fields_source())
    print(f"wrote {target}")
