"""A chat request's tools and `tool_choice` as one plan: what goes into the prompt, whether and how the output
is parsed into tool calls, and, for `required` or a named function, the JSON schema the output must follow."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from graphpool.engine.guided import GuidedDecoding
from graphpool.server.protocol import APIError, FunctionTool
from graphpool.server.tool_parsers import Parsed, ToolCall, ToolParser, make_call

Mode = Literal["none", "auto", "forced"]
EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolPlan:
    tools: tuple[dict[str, Any], ...]  # as the chat template takes them: {"type": "function", "function": {...}}
    mode: Mode
    parser: ToolParser
    named: str | None = None  # forced: the function tool_choice names; None: `required`
    parallel: bool = True  # parallel_tool_calls: False keeps the first call only

    @property
    def prompt_tools(self) -> list[dict[str, Any]] | None:
        """The tools the prompt offers (none with tool_choice 'none')."""
        return list(self.tools) if self.mode != "none" and self.tools else None

    def parameters(self, name: str) -> dict[str, Any]:
        fn = next(t["function"] for t in self.tools if t["function"]["name"] == name)
        return fn.get("parameters") or EMPTY_PARAMETERS

    @property
    def strict(self) -> bool:
        """Whether a call the model chooses to make must follow its tool's schema (some tool has `strict: true`)."""
        return self.mode == "auto" and any(t["function"].get("strict") for t in self.tools)

    def result(self, text: str) -> Parsed:
        """The output as content and tool calls (`mode` 'none': all content)."""
        if self.mode == "none":
            return Parsed(text, ())
        parsed = self.parser.parse(text) if self.mode == "auto" else parse_forced(text, self)
        return Parsed(parsed.content, parsed.calls if self.parallel else parsed.calls[:1])


def plan_tools(tools: list[FunctionTool] | None, tool_choice: Any, parallel: bool | None,
               parser: ToolParser) -> ToolPlan:
    """The request's plan; a 400 naming the field for duplicate names, a `tool_choice` that is malformed, needs
    tools, or names a function not in `tools`."""
    if tools is not None and not tools:
        raise APIError("tools must not be empty: leave it out to offer no tools", param="tools")
    specs = tuple(t.model_dump(exclude_none=True) for t in tools or ())
    names: set[str] = set()
    for i, t in enumerate(tools or ()):
        if t.function.name in names:
            raise APIError(f"tools[{i}].function.name: {t.function.name!r} is offered twice",
                           param=f"tools[{i}].function.name")
        names.add(t.function.name)
        params = t.function.parameters
        if params is not None and params.get("type", "object") != "object":
            raise APIError(f"tools[{i}].function.parameters: must be a JSON Schema of type 'object'",
                           param=f"tools[{i}].function.parameters")
    mode, named = _choice(tool_choice, names)
    return ToolPlan(specs, mode, parser.for_tools(specs), named, parallel is not False)


def _choice(tool_choice: Any, names: set[str]) -> tuple[Mode, str | None]:
    if tool_choice is None:
        return ("auto" if names else "none"), None
    if tool_choice == "none":
        return "none", None
    if not names:
        raise APIError("tool_choice needs tools: give `tools` or leave tool_choice out", param="tool_choice")
    if tool_choice == "auto":
        return "auto", None
    if tool_choice == "required":
        return "forced", None
    function = tool_choice.get("function") if isinstance(tool_choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(tool_choice, dict) or tool_choice.get("type") != "function" or not isinstance(name, str):
        raise APIError('tool_choice must be "none", "auto", "required" or {"type": "function", "function": '
                       f'{{"name": ...}}}}, got {json.dumps(tool_choice)[:80]}', param="tool_choice")
    if name not in names:
        raise APIError(f"tool_choice names the function {name!r}, which is not in tools ({sorted(names)})",
                       param="tool_choice")
    return "forced", name


def forced_call_schema(plan: ToolPlan) -> dict[str, Any]:
    """The JSON schema a forced answer follows: a named function's arguments object; for `required` a list of
    at least one {"name", "parameters"} (one at most without parallel calls), each any of the tools."""
    if plan.named is not None:
        return plan.parameters(plan.named)
    variants = [{"type": "object",
                 "properties": {"name": {"type": "string", "enum": [t["function"]["name"]]},
                                "parameters": plan.parameters(t["function"]["name"])},
                 "required": ["name", "parameters"]} for t in plan.tools]
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": variants}}
    if not plan.parallel:
        schema["maxItems"] = 1
    return schema


def parse_forced(text: str, plan: ToolPlan) -> Parsed:
    """A forced answer (`forced_call_schema`'s JSON) as calls; text that is not (a length cut) stays content."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return Parsed(text, ())
    if plan.named is not None:
        call = make_call(plan.named, value)
        return Parsed("", (call,)) if call is not None else Parsed(text, ())
    items = value if isinstance(value, list) else []
    calls = [make_call(c.get("name"), c.get("parameters")) if isinstance(c, dict) else None for c in items]
    if not calls or None in calls:
        return Parsed(text, ())
    return Parsed("", tuple(c for c in calls if isinstance(c, ToolCall)))


def forced_call_guided(plan: ToolPlan) -> GuidedDecoding:
    """The output constraint that forces `plan`'s call: `forced_call_schema(plan)` as a JSON schema (the
    response side, `ToolPlan.result` -> `parse_forced`, reads such output)."""
    return GuidedDecoding(kind="json_schema", spec=json.dumps(forced_call_schema(plan)))


def strict_calls_guided(plan: ToolPlan) -> GuidedDecoding:
    """The output constraint of `auto` with strict tools: free text, where each call begins (the parser's
    trigger) written as the parser writes calls, its arguments following its tool's schema when the tool is
    strict (any object otherwise); with `parallel_tool_calls` false, nothing after the first call."""
    tags = []
    for t in plan.tools:
        fn = t["function"]
        begin, end = plan.parser.call_tag(fn["name"])
        schema = plan.parameters(fn["name"]) if fn.get("strict") else {"type": "object"}
        tags.append({"type": "tag", "begin": begin, "content": {"type": "json_schema", "json_schema": schema},
                     "end": end})
    tag = {"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": [plan.parser.call_trigger],
                                                 "tags": tags, "at_least_one": False,
                                                 "stop_after_first": not plan.parallel}}
    return GuidedDecoding(kind="structural_tag", spec=json.dumps(tag))
