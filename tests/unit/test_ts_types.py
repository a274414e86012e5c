"""The labextension's TypeScript types match the wire model they are generated from."""

from __future__ import annotations

from pathlib import Path

import pytest

from ma_jupyter import tsgen
from ma_jupyter.models import JobStatus, Mode, json_schemas

MODELS_TS = Path(__file__).resolve().parents[2] / "labextension" / "src" / "models.ts"


def test_committed_models_ts_matches_the_models():
    committed = MODELS_TS.read_text()
    assert committed == tsgen.generate(), (
        "labextension/src/models.ts is out of date: run "
        "`python -m ma_jupyter.tsgen > labextension/src/models.ts` and rebuild the labextension"
    )


def test_every_wire_model_becomes_an_interface():
    text = tsgen.generate()
    for name in json_schemas():
        assert f"export interface {name} {{" in text
    # enums become unions plus their values, in the model's order
    statuses = " | ".join(f'"{s.value}"' for s in JobStatus)
    assert f"export type JobStatus = {statuses};" in text
    assert (
        "export const MODE_VALUES: ReadonlyArray<Mode> = [" + ", ".join(f'"{m.value}"' for m in Mode) in text
    )


def test_required_and_optional_fields():
    text = tsgen.generate()
    job_spec = text.split("export interface JobSpec {", 1)[1].split("\n}", 1)[0]
    assert "\n  name: string;" in job_spec  # required: no default
    assert "\n  nodes?: number;" in job_spec  # has a default: the service fills it in
    assert "\n  env?: Record<string, string>;" in job_spec
    assert "\n  outputs?: string | null;" in job_spec
    assert "\n  datasets?: Array<DatasetMount>;" in job_spec


def test_type_mapping_of_schema_nodes():
    assert tsgen.ts_type({"anyOf": [{"type": "integer"}, {"type": "null"}]}) == "number | null"
    assert tsgen.ts_type({"type": "array", "items": {"$ref": "#/$defs/Event"}}) == "Array<Event>"
    assert (
        tsgen.ts_type({"type": "object", "additionalProperties": {"type": "boolean"}})
        == "Record<string, boolean>"
    )
    assert tsgen.ts_type({"enum": ["a", "b"], "type": "string"}) == '"a" | "b"'
    assert tsgen.ts_type({"format": "date-time", "type": "string"}) == "string"
    assert tsgen.ts_type({}) == "unknown"


def test_clashing_definitions_are_refused():
    schemas = {
        "A": {"type": "object", "properties": {}, "$defs": {"X": {"enum": ["1"], "type": "string"}}},
        "B": {"type": "object", "properties": {}, "$defs": {"X": {"enum": ["2"], "type": "string"}}},
    }
    with pytest.raises(ValueError, match="named X"):
        tsgen.generate(schemas)
