"""The OpenAPI document the service publishes (``GET /api/v1/openapi.json``, behind the token).

The request bodies taken as a dict (to answer the typed 400 of :func:`~ma_jupyter.models.parse_spec`)
are published with the schema they are validated against, so a fuzzer's schema-valid body
reaches the rules the schema cannot say (cross-field ones), which answer a 400 naming them.
"""

from __future__ import annotations

from fastapi import FastAPI

from ...models import JobSpec, Priority

#: ``openapi_extra`` of the routes whose body is a :class:`JobSpec` taken as a dict
SPEC_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/In_JobSpec"}}},
    }
}
#: ``openapi_extra`` of ``PATCH /jobs/{job_id}``
UPDATE_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "priority": {"anyOf": [{"enum": [p.value for p in Priority]}, {"type": "null"}]},
                        "duration": {
                            "anyOf": [
                                {"type": "number", "exclusiveMinimum": 0},
                                {"type": "string", "maxLength": 40},
                                {"type": "null"},
                            ]
                        },
                    },
                }
            }
        },
    }
}


def published_schema(app: FastAPI) -> dict:
    """The OpenAPI document of ``app`` with :class:`JobSpec`'s input schema (as ``In_<Model>``
    components) under the bodies :data:`SPEC_BODY` names; built once per app."""
    if app.openapi_schema is None:
        schema = app.openapi()
        spec = JobSpec.model_json_schema(mode="validation", ref_template="#/components/schemas/In_{model}")
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for name, definition in spec.pop("$defs", {}).items():
            components[f"In_{name}"] = definition
        components["In_JobSpec"] = spec
    return app.openapi_schema
