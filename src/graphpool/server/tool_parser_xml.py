"""Qwen3-Coder's XML tool calls (`qwen3_coder`): each call a `<tool_call>` block holding `<function=NAME>` and one
`<parameter=KEY>` element a parameter, its value written as text:

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

A value becomes the JSON type its tool's schema gives the parameter (a `string` stays text, so "75001" is not a
number); a parameter the schema does not type is JSON when it reads as JSON, else text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from graphpool.server.tool_parser_base import TaggedCallParser, ToolCall, ToolParser, make_call

_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)


class Qwen3CoderParser(TaggedCallParser):
    name = "qwen3_coder"
    supports_strict = False  # the arguments are XML elements, not the JSON object a structural tag constrains
    template_signs = ("<function=",)

    def __init__(self, types: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        self.types = types or {}  # function name -> parameter name -> its schema

    def for_tools(self, tools: Sequence[dict[str, Any]]) -> ToolParser:
        fns = [t["function"] for t in tools]
        return Qwen3CoderParser({f["name"]: (f.get("parameters") or {}).get("properties") or {} for f in fns})

    def block_call(self, body: str) -> ToolCall | None:
        found = _FUNCTION.search(body)
        if found is None or body[:found.start()].strip() or body[found.end():].strip():
            return None
        name = found.group(1).strip()
        schema = self.types.get(name, {})
        arguments = {key.strip(): _value(raw, schema.get(key.strip())) for key, raw in _PARAMETER.findall(found.group(2))}
        return make_call(name, arguments)

    def instructions(self) -> str:
        return ("To call a function, answer with one <tool_call></tool_call> block per call, naming the function and "
                "giving each argument as its own element:\n<tool_call>\n<function=<function-name>>\n"
                "<parameter=<argument-name>>\n<value>\n</parameter>\n</function>\n</tool_call>\n"
                "Each result comes back inside <tool_response></tool_response>.")

    def write_call(self, name: str, arguments: dict[str, Any]) -> str:
        params = "".join(f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}\n"
                         "</parameter>\n" for k, v in arguments.items())
        return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def _value(raw: str, schema: Any) -> Any:
    """A parameter's text (one newline around it dropped) as its schema's type."""
    text = raw.removeprefix("\n").removesuffix("\n")
    kind = schema.get("type") if isinstance(schema, Mapping) else None
    if kind == "string":
        return text
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return text
    if kind == "integer" and isinstance(value, float) and value.is_integer():
        return int(value)
    return value
