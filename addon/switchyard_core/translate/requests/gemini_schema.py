"""Gemini's own schema dialect (`parameters`, `responseSchema`: OpenAPI 3.0's
subset, types in capitals, `nullable`) as the JSON Schema the other APIs take
(docs/translation.md, "Requests")."""

from __future__ import annotations

from typing import Any

# the dialect's fields, under both spellings, as JSON Schema names them
_RENAMED = {"any_of": "anyOf", "max_items": "maxItems", "min_items": "minItems", "max_length": "maxLength",
            "min_length": "minLength", "max_properties": "maxProperties", "min_properties": "minProperties"}
_DROPPED = {"propertyOrdering", "property_ordering", "nullable", "example"}


def json_schema(schema: Any) -> Any:
    if isinstance(schema, list):
        return [json_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _DROPPED:
            continue
        key = _RENAMED.get(str(key), str(key))
        if key == "type" and isinstance(value, str):
            out["type"] = value.lower()
        elif key == "properties" and isinstance(value, dict):
            out["properties"] = {name: json_schema(s) for name, s in value.items()}
        elif key in ("items", "anyOf"):
            out[key] = json_schema(value)
        else:
            out[key] = value
    if schema.get("nullable") is True and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    return out
