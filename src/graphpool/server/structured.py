"""Structured output: a request's `response_format` or vLLM's guided fields -> one `GuidedDecoding` (or a 400
naming the field)."""

from __future__ import annotations

import json
from typing import Any

from graphpool.engine.guided import GuidedDecoding
from graphpool.server.protocol import APIError, ChatCompletionRequest, CompletionRequest

# vLLM's structured_outputs keys: the constraints (one at most), and options with the values honoured here
_SO_CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object")
# NOTE: JSON is always generated without free whitespace and, with a schema, without properties it does not list
_SO_OPTIONS: dict[str, tuple[Any, ...]] = {
    "disable_fallback": (None, True, False), "disable_any_whitespace": (None, True, False),
    "disable_additional_properties": (None, True, False), "whitespace_pattern": (None,), "structural_tag": (None,),
}
_RESPONSE_FORMATS = ("text", "json_object", "json_schema")


def guided_decoding(req: CompletionRequest | ChatCompletionRequest) -> tuple[GuidedDecoding, str] | None:
    """The request's constraint and the field it came from, or None; more than one is a 400."""
    found: list[tuple[GuidedDecoding, str]] = []
    if req.response_format is not None:
        found += _response_format(req.response_format)
    if req.guided_json is not None:
        found.append((_schema(req.guided_json, "guided_json"), "guided_json"))
    if req.guided_regex is not None:
        found.append((_make("regex", req.guided_regex, "guided_regex"), "guided_regex"))
    if req.guided_choice is not None:
        found.append((_choice(req.guided_choice, "guided_choice"), "guided_choice"))
    if req.guided_grammar is not None:
        found.append((_make("grammar", req.guided_grammar, "guided_grammar"), "guided_grammar"))
    if req.structured_outputs is not None:
        found += _structured_outputs(req.structured_outputs)
    if len(found) > 1:
        names = [name for _, name in found]
        raise APIError(f"a request takes one output constraint, got {len(found)}: {', '.join(names)}",
                       param=names[1])
    return found[0] if found else None


def _response_format(value: dict[str, Any]) -> list[tuple[GuidedDecoding, str]]:
    kind = value.get("type")
    if kind not in _RESPONSE_FORMATS:
        raise APIError(f"response_format.type must be one of {list(_RESPONSE_FORMATS)}, got {kind!r}",
                       param="response_format")
    if kind == "text":
        return []
    if kind == "json_object":
        return [(GuidedDecoding("json_object"), "response_format")]
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise APIError("response_format.json_schema must be an object with the schema under 'schema'",
                       param="response_format")
    for key, types in (("name", str), ("description", str), ("strict", bool)):
        if spec.get(key) is not None and not isinstance(spec[key], types):
            raise APIError(f"response_format.json_schema.{key} must be a {types.__name__}", param="response_format")
    if "schema" not in spec:
        raise APIError("response_format.json_schema.schema is missing", param="response_format")
    return [(_schema(spec["schema"], "response_format"), "response_format")]


def _structured_outputs(value: dict[str, Any]) -> list[tuple[GuidedDecoding, str]]:
    param = "structured_outputs"
    for key, item in value.items():
        if key in _SO_OPTIONS and item not in _SO_OPTIONS[key]:
            raise APIError(f"structured_outputs.{key}={item!r} is not supported by this server", param=param)
        if key not in _SO_OPTIONS and key not in _SO_CONSTRAINTS:
            raise APIError(f"structured_outputs.{key} is not supported by this server", param=param)
    given = [k for k in _SO_CONSTRAINTS if value.get(k) not in (None, False)]
    if len(given) > 1:
        raise APIError(f"structured_outputs takes one constraint, got {given}", param=param)
    if not given:
        return []
    key = given[0]
    item = value[key]
    if key == "json":
        return [(_schema(item, param), param)]
    if key == "choice":
        return [(_choice(item, param), param)]
    if key == "json_object":
        if item is not True:
            raise APIError("structured_outputs.json_object must be true", param=param)
        return [(GuidedDecoding("json_object"), param)]
    if not isinstance(item, str):
        raise APIError(f"structured_outputs.{key} must be a string", param=param)
    return [(_make("regex" if key == "regex" else "grammar", item, param), param)]


def _schema(schema: Any, param: str) -> GuidedDecoding:
    """A JSON schema given as an object or as JSON text."""
    if isinstance(schema, str):
        return _make("json_schema", schema, param)
    if not isinstance(schema, dict):
        raise APIError(f"{param}: the JSON schema must be an object, got {type(schema).__name__}", param=param)
    return _make("json_schema", json.dumps(schema, ensure_ascii=False), param)


def _choice(choices: Any, param: str) -> GuidedDecoding:
    if not isinstance(choices, list):
        raise APIError(f"{param}: the choices must be a list of strings", param=param)
    return _make("choice", json.dumps(choices, ensure_ascii=False), param)


def _make(kind: str, spec: str, param: str) -> GuidedDecoding:
    try:
        return GuidedDecoding(kind, spec)  # type: ignore[arg-type]
    except ValueError as e:
        raise APIError(f"{param}: {e}", param=param) from None
