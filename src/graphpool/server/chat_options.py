"""How the server renders and reads chats, set once at start-up: `--chat-template`, `--tool-call-parser`,
`--reasoning-parser` and `--default-chat-template-kwargs`."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ChatOptions:
    """`chat_template`: a Jinja source in place of the model's own (None: the model's); `tool_call_parser` and
    `reasoning_parser`: the formats a reply is read in (`auto`: from the template and the vocabulary);
    `template_kwargs`: template variables every chat gets unless its own `chat_template_kwargs` sets them."""

    chat_template: str | None = None
    tool_call_parser: str = "auto"
    reasoning_parser: str = "auto"
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)


DEFAULT_CHAT = ChatOptions()  # the model's own template, formats found from it


def template_kwargs_arg(text: str) -> dict[str, Any]:
    """A `--*chat-template-kwargs` flag's value: a JSON object of template variables (else argparse's exit 2)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object of template variables, got {text!r}")
    return value
