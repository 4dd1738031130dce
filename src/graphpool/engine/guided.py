"""Guided decoding (structured output): the constraint a request's tokens must follow.

`GuidedDecoding` only describes the constraint; `engine/grammar.py` compiles it (xgrammar) and masks each
step's logits with it. Checks here are structural (the spec's JSON shape); whether a schema, regex or grammar
compiles is known when the engine compiles it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal, get_args

GuidedKind = Literal["json_schema", "json_object", "regex", "choice", "grammar", "structural_tag"]
GUIDED_KINDS: tuple[str, ...] = get_args(GuidedKind)


@dataclass(frozen=True)
class GuidedDecoding:
    """A request's output constraint. `spec` by `kind`: `json_schema` the schema as JSON text (an object),
    `json_object` "" (any JSON object), `regex` a regular expression, `choice` a JSON list of the allowed
    strings, `grammar` an EBNF grammar whose start rule is `root`, `structural_tag` xgrammar's structural tag as
    JSON text (free text, with JSON-schema sections wherever a trigger starts one: strict tool calls). Raises
    ValueError when malformed."""

    kind: GuidedKind
    spec: str = ""

    def __post_init__(self) -> None:
        if self.kind not in GUIDED_KINDS:
            raise ValueError(f"guided decoding kind must be one of {list(GUIDED_KINDS)}, got {self.kind!r}")
        if not isinstance(self.spec, str):
            raise ValueError(f"guided decoding spec must be a str, got {type(self.spec).__name__}")
        try:
            self.spec.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"the {self.kind} spec holds a lone UTF-16 surrogate at character {e.start}: it must "
                             "be valid Unicode") from None
        if self.kind == "json_object":
            if self.spec:
                raise ValueError("a json_object constraint takes no spec (\"\"): it allows any JSON object")
            return
        if not self.spec:
            raise ValueError(f"a {self.kind} constraint needs a non-empty spec")
        if self.kind in ("json_schema", "structural_tag"):
            if not isinstance(_json(self.spec, f"the {self.kind} spec"), dict):
                raise ValueError(f"the {self.kind} spec must be a JSON object")
        elif self.kind == "choice":
            choices = _json(self.spec, "the choice spec")
            if not isinstance(choices, list) or not choices or not all(isinstance(c, str) for c in choices):
                raise ValueError(f"the choice spec must be a non-empty JSON list of strings, got {self.spec!r}")

    @property
    def choices(self) -> list[str]:
        """A `choice` constraint's strings."""
        if self.kind != "choice":
            raise ValueError(f"a {self.kind} constraint has no choices")
        return list(json.loads(self.spec))


def _json(text: str, what: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{what} is not valid JSON: {e}") from None
