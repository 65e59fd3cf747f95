"""A declared `json_schema` reward's schema (`jobs.spec.rewards`), checked at submit: valid under its metaschema,
and free of what could stall or reach out while scoring (an unbounded `pattern`, a `$ref` outside the schema).

    schema_text, problem = checked_schema({"type": "object", "required": ["answer"]})   # (JSON text, None)
"""

from __future__ import annotations

import json
from typing import Any


def checked_schema(raw: Any) -> tuple[str | None, tuple[str, str] | None]:
    """A JSON Schema (a mapping, or its JSON text) checked against its metaschema; kept as JSON text."""
    import jsonschema

    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            return None, (f"is not JSON ({exc})", 'write a JSON Schema, e.g. {type: object, required: ["answer"]}')
    if not isinstance(raw, (dict, bool)):
        return None, ("is not a JSON Schema (a mapping)", 'write e.g. {type: object, required: ["answer"]}')
    try:
        jsonschema.validators.validator_for(raw).check_schema(raw)
    except jsonschema.SchemaError as exc:
        return None, (f"is not a valid JSON Schema ({exc.message})", "fix the schema (https://json-schema.org)")
    found = _unsafe_keyword(raw)
    if found is not None:
        return None, found
    return json.dumps(raw, sort_keys=True), None


def _unsafe_keyword(schema: Any) -> tuple[str, str] | None:
    """(problem, fix) for a schema keyword that could stall or reach out while scoring: `pattern` and
    `patternProperties` (jsonschema runs them with `re`, which has no time bound) and a `$ref` outside the
    schema (it would be fetched)."""
    if isinstance(schema, list):
        return next((p for p in map(_unsafe_keyword, schema) if p is not None), None)
    if not isinstance(schema, dict):
        return None
    for key, value in schema.items():
        if (key == "pattern" and isinstance(value, str)) or (key == "patternProperties" and isinstance(value, dict)):
            return (
                f"uses `{key}`, whose regular expressions jsonschema runs without a time bound",
                "check the pattern with a regex reward (it runs under a time bound) and drop it from the schema",
            )
        if key == "$ref" and isinstance(value, str) and not value.startswith("#"):
            return f"refers to `{value}` outside the schema", "inline the referenced schema (use #/$defs/...)"
        found = _unsafe_keyword(value)
        if found is not None:
            return found
    return None
