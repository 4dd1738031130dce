"""The guided-decoding cases the engine tests share (CPU and GPU): one constraint of each kind, and the check
that an output follows its constraint."""

from __future__ import annotations

import json
import re

from graphpool.engine.guided import GuidedDecoding

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "enum": ["Paris", "London", "Rome"]},
    },
    "required": ["name", "age", "city"],
}
REGEX = r"[0-9]{3}-[a-z]{2,4}"
CHOICES = ["Paris", "London", "Rome"]
GRAMMAR = 'root ::= ("yes" | "no") ", " ("sure" | "never")'
GUIDES = [GuidedDecoding("json_schema", json.dumps(SCHEMA)), GuidedDecoding("regex", REGEX),
          GuidedDecoding("choice", json.dumps(CHOICES)), GuidedDecoding("grammar", GRAMMAR)]


def check(guided: GuidedDecoding, text: str) -> None:
    """`text` follows `guided` (jsonschema validates the schema's outputs)."""
    import jsonschema

    if guided.kind == "json_schema":
        jsonschema.validate(json.loads(text), json.loads(guided.spec))
    elif guided.kind == "json_object":
        assert isinstance(json.loads(text), dict), text
    elif guided.kind == "regex":
        assert re.fullmatch(guided.spec, text), text
    elif guided.kind == "choice":
        assert text in guided.choices, text
    else:
        assert re.fullmatch(r"(yes|no), (sure|never)", text), text
