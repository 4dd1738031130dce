"""Tool-call parsing on canned model outputs of each format, the stream that sends calls as they complete, the
tool plan's checks and the JSON schema a forced call must follow (no model, no server)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from graphpool.model.chat_render import template_reads
from graphpool.server.protocol import APIError, FunctionTool
from graphpool.server.tool_parsers import (
    HermesParser,
    Llama3JsonParser,
    MistralParser,
    Qwen3CoderParser,
    ToolCall,
    ToolParser,
    choose_parser,
)
from graphpool.server.tool_stream import ToolCallStream, message
from graphpool.server.tools import (
    ToolPlan,
    forced_call_guided,
    forced_call_schema,
    parse_forced,
    plan_tools,
)

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time"}}
PARIS = ToolCall("get_weather", json.dumps({"city": "Paris", "days": 2}))
UTC = ToolCall("get_time", "{}")

# (parser, canned output, content outside the calls, calls)
CANNED: list[tuple[ToolParser, str, str, tuple[ToolCall, ...]]] = [
    (HermesParser(), 'I will look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}'
     '\n</tool_call>\n<tool_call>{"name": "get_time", "arguments": {}}</tool_call>', "I will look.", (PARIS, UTC)),
    (HermesParser(), '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n',
     "", (PARIS,)),  # stopped before the closing tag
    (HermesParser(), '<tool_call>{"name": "get_time"}</tool_call> done', "done", (UTC,)),
    (HermesParser(), 'Plain answer, no call.', "Plain answer, no call.", ()),
    (Llama3JsonParser(), '{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}', "", (PARIS,)),
    (Llama3JsonParser(), '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}; '
     '{"name": "get_time", "parameters": {}}', "", (PARIS, UTC)),
    (Llama3JsonParser(), 'Let me see. <|python_tag|>{"name": "get_time", "arguments": {}}', "Let me see.", (UTC,)),
    (Llama3JsonParser(), 'The JSON {"name": 1} is an answer.', 'The JSON {"name": 1} is an answer.', ()),
    (MistralParser(), '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}, '
     '{"name": "get_time", "arguments": {}}]', "", (PARIS, UTC)),
    (MistralParser(), 'Sure. [TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 2}[TOOL_CALLS]get_time[ARGS]{}',
     "Sure.", (PARIS, UTC)),
    (Qwen3CoderParser(), "I will look.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
     "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n</function>\n"
     "</tool_call>", "I will look.", (PARIS, UTC)),
    (Qwen3CoderParser(), "<tool_call>\n<function=get_time>\n</function>\n", "", (UTC,)),  # stopped before its end tag
    (Qwen3CoderParser(), "No call: <function=x> alone.", "No call: <function=x> alone.", ()),
]


@pytest.mark.parametrize(("parser", "text", "content", "calls"), CANNED)
def test_each_format_parses_into_calls_and_content(parser: ToolParser, text: str, content: str,
                                                    calls: tuple[ToolCall, ...]) -> None:
    parsed = parser.parse(text)
    assert parsed.calls == calls
    assert parsed.content.strip() == content
    for call in parsed.calls:
        assert isinstance(json.loads(call.arguments), dict)


@pytest.mark.parametrize("parser", [HermesParser(), Llama3JsonParser(), MistralParser(), Qwen3CoderParser()])
def test_malformed_calls_stay_content(parser: ToolParser) -> None:
    bad = {"hermes": '<tool_call>{"name": "get_weather", "arguments": {"city": </tool_call>',
           "llama3_json": '{"name": "get_weather", "parameters": [1, 2]}',
           "mistral": '[TOOL_CALLS][{"name": "get_weather", "arguments": "not json"}]',
           "qwen3_coder": "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis"}[parser.name]
    parsed = parser.parse(bad)
    assert parsed.calls == () and parsed.content == bad


@pytest.mark.parametrize(("parser", "text", "content", "calls"), CANNED)
@pytest.mark.parametrize("piece", [1, 3, 7])
def test_a_stream_sends_the_same_calls_and_content_as_the_collected_answer(
        parser: ToolParser, text: str, content: str, calls: tuple[ToolCall, ...], piece: int) -> None:
    stream = ToolCallStream(ToolPlan((WEATHER, TIME), "auto", parser))
    sent, got, seen_marker = "", [], False
    for i in range(0, len(text), piece):
        delta = stream.feed(text[i:i + piece])
        sent += delta.content
        got += delta.calls
        seen_marker = seen_marker or any(m in sent for m in parser.markers)
    last = stream.finish()
    sent += last.content
    got += last.calls
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in got] == [(c.name, c.arguments) for c in calls]
    assert [c["index"] for c in got] == list(range(len(calls)))
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in got)
    assert len({c["id"] for c in got}) == len(got)
    assert sent.strip() == content or (not calls and sent == text)
    if calls:  # no marker ever reaches the client as content
        assert not seen_marker


def test_a_call_goes_out_as_soon_as_its_text_is_complete() -> None:
    stream = ToolCallStream(ToolPlan((WEATHER, TIME), "auto", HermesParser()))
    first = '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    assert stream.feed("Hi <tool_").content == "Hi "  # "<tool_" may begin the marker: held back
    assert stream.feed(first[len("<tool_"):-1]).calls == []
    assert [c["function"]["name"] for c in stream.feed(first[-1:]).calls] == ["get_time"]
    assert stream.feed('\n<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}').calls == []
    done = stream.finish()  # the last call lacks its end tag: complete once the answer is
    assert [(c["index"], c["function"]["name"]) for c in done.calls] == [(1, "get_weather")]


def test_collected_message_shape() -> None:
    plan = ToolPlan((WEATHER, TIME), "auto", HermesParser())
    body = message(plan, CANNED[0][1])
    assert body["content"] == "I will look."
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in body["tool_calls"]] == \
        [(PARIS.name, PARIS.arguments), (UTC.name, UTC.arguments)]
    only_calls = message(plan, CANNED[1][1])
    assert only_calls["content"] is None and len(only_calls["tool_calls"]) == 1
    assert "tool_calls" not in message(plan, "no call")
    single = message(ToolPlan((WEATHER, TIME), "auto", HermesParser(), parallel=False), CANNED[0][1])
    assert [c["function"]["name"] for c in single["tool_calls"]] == ["get_weather"]
    none = message(ToolPlan((WEATHER,), "none", HermesParser()), CANNED[0][1])
    assert none == {"role": "assistant", "content": CANNED[0][1]}


def test_qwen3_coder_values_take_their_parameters_types() -> None:
    schema = {"type": "object", "properties": {"zip": {"type": "string"}, "n": {"type": "integer"},
                                               "ok": {"type": "boolean"}, "tags": {"type": "array"}}}
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    bound = Qwen3CoderParser().for_tools([tool])
    text = Qwen3CoderParser().write_call("f", {"zip": "75001", "n": 3, "ok": True, "tags": ["a", "b"], "x": "1"})
    assert json.loads(bound.parse(text).calls[0].arguments) == {"zip": "75001", "n": 3, "ok": True,
                                                                 "tags": ["a", "b"], "x": 1}  # untyped: JSON if it is
    assert json.loads(Qwen3CoderParser().parse(text).calls[0].arguments)["zip"] == 75001  # unbound: no types
    plan = plan_tools([FunctionTool.model_validate(tool)], "auto", None, Qwen3CoderParser())
    assert json.loads(plan.result(text).calls[0].arguments)["zip"] == "75001"  # the plan binds its tools
    assert choose_parser("auto", "{{ '<tool_call>\\n<function=' }}{{ tools }}", [], True).name == "qwen3_coder"


def test_mistral_history_ids_become_nine_alphanumerics_consistently() -> None:
    parser = MistralParser()
    mapped = parser.history_call_id("call_0123456789abcdef")
    assert len(mapped) == 9 and mapped.isalnum() and mapped == parser.history_call_id("call_0123456789abcdef")
    assert mapped != parser.history_call_id("call_other") and parser.history_call_id("abcDEF123") == "abcDEF123"
    assert HermesParser().history_call_id("call_x") == "call_x"


# ---- the plan: tools, tool_choice, parallel_tool_calls ----
def tools(*specs: dict) -> list[FunctionTool]:
    return [FunctionTool.model_validate(s) for s in specs]


def refused(param: str, *args: object) -> APIError:
    with pytest.raises(APIError) as info:
        plan_tools(*args)  # type: ignore[arg-type]
    assert info.value.param == param, info.value.message
    return info.value


def test_tool_choice_modes() -> None:
    h = HermesParser()
    assert plan_tools(tools(WEATHER), None, None, h).mode == "auto"
    assert plan_tools(None, None, None, h).mode == "none"
    assert plan_tools(None, "none", None, h).mode == "none"
    assert plan_tools(tools(WEATHER), "none", None, h).prompt_tools is None
    assert plan_tools(tools(WEATHER), "auto", None, h).prompt_tools == [WEATHER]
    named = plan_tools(tools(WEATHER, TIME), {"type": "function", "function": {"name": "get_time"}}, False, h)
    assert (named.mode, named.named, named.parallel) == ("forced", "get_time", False)
    assert plan_tools(tools(WEATHER), "required", None, h).named is None


def test_bad_tools_and_tool_choice_are_refused_by_name() -> None:
    h = HermesParser()
    assert "needs tools" in refused("tool_choice", None, "auto", None, h).message
    assert "not in tools" in refused("tool_choice", tools(WEATHER), {"type": "function",
                                     "function": {"name": "nope"}}, None, h).message
    refused("tool_choice", tools(WEATHER), "sometimes", None, h)
    refused("tool_choice", tools(WEATHER), {"type": "function"}, None, h)
    refused("tools", [], None, None, h)
    refused("tools[1].function.name", tools(WEATHER, WEATHER), None, None, h)
    refused("tools[0].function.parameters", tools({"type": "function", "function": {
        "name": "f", "parameters": {"type": "array"}}}), None, None, h)


def test_a_forced_call_is_a_json_schema_constraint_of_its_schema() -> None:
    plan = plan_tools(tools(WEATHER, TIME), "required", None, HermesParser())
    guided = forced_call_guided(plan)
    assert guided.kind == "json_schema" and json.loads(guided.spec) == forced_call_schema(plan)


def test_the_forced_call_schema_accepts_exactly_the_calls_and_parses_back() -> None:
    h = HermesParser()
    required = plan_tools(tools(WEATHER, TIME), "required", None, h)
    schema = forced_call_schema(required)
    jsonschema.Draft202012Validator.check_schema(schema)
    good = [{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}, {"name": "get_time", "parameters": {}}]
    jsonschema.validate(good, schema)
    for bad in ([], [{"name": "get_weather", "parameters": {"days": 2}}], [{"name": "other", "parameters": {}}],
                {"name": "get_time", "parameters": {}}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    assert parse_forced(json.dumps(good), required).calls == (PARIS, UTC)
    single = plan_tools(tools(WEATHER, TIME), "required", False, h)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(good, forced_call_schema(single))
    named = plan_tools(tools(WEATHER, TIME), {"type": "function", "function": {"name": "get_weather"}}, None, h)
    assert forced_call_schema(named) == WEATHER["function"]["parameters"]
    assert named.result('{"city": "Paris", "days": 2}').calls == (PARIS,)
    cut = '{"city": "Par'
    assert named.result(cut).calls == () and named.result(cut).content == cut  # a length cut is no call
    no_params = plan_tools(tools(TIME), {"type": "function", "function": {"name": "get_time"}}, None, h)
    assert forced_call_schema(no_params) == {"type": "object", "properties": {}}
    stream = ToolCallStream(required)
    assert not stream.feed(json.dumps(good)[:20]) and not stream.feed(json.dumps(good)[20:])
    assert [c["function"]["name"] for c in stream.finish().calls] == ["get_weather", "get_time"]


# ---- which parser a model gets ----
QWEN_LIKE = ("{% if tools %}<|im_start|>system\n<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>"
             "<|im_end|>\n{% endif %}{% for m in messages %}{% if m.tool_calls %}{% for c in m.tool_calls %}"
             "<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}{% endif %}{{ m.content }}{% endfor %}")
MISTRAL_LIKE = "{% if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}[TOOL_CALLS]"
LLAMA_LIKE = "{% if tools %}{{ tools | tojson }}{% endif %}{% for m in messages %}{% if m.role == 'ipython' %}{% endif %}{% endfor %}"
PLAIN = "{% for m in messages %}{{ m.content }}{% endfor %}"


@pytest.mark.parametrize(("template", "vocab", "expected"), [
    (QWEN_LIKE, ["<tool_call>"], "hermes"), (MISTRAL_LIKE, ["[TOOL_CALLS]"], "mistral"),
    (LLAMA_LIKE, ["<|python_tag|>"], "llama3_json"), (PLAIN, ["[TOOL_CALLS]"], "hermes"),
    ("{{ tools }}", ["<|python_tag|>"], "llama3_json"), (None, [], "hermes"),
])
def test_auto_picks_the_templates_format(template: str | None, vocab: list[str], expected: str) -> None:
    reads = template_reads(template, "tools")
    assert reads == (template is not None and template != PLAIN)
    assert choose_parser("auto", template, vocab, reads).name == expected
    assert choose_parser("mistral", template, vocab, reads).name == "mistral"


def test_an_unknown_parser_name_is_an_error_naming_the_choices() -> None:
    with pytest.raises(ValueError, match=r"unknown parser 'qwen'.*hermes"):
        choose_parser("qwen", None, [], False)


class MarkerTokenizer:
    """A vocabulary of characters plus `<tool_call>` as one token, special (dropped by skip_special_tokens)
    or not."""

    def __init__(self, special: bool, template: str) -> None:
        self.special, self.template = special, template

    def chat_template_source(self, chat_template: str | None = None, tools: bool = False) -> str:
        return chat_template or self.template

    def has_token(self, text: str) -> bool:
        return text == "<tool_call>"

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [0] if text == "<tool_call>" else [ord(c) for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join("" if i == 0 and skip_special_tokens and self.special else
                       "<tool_call>" if i == 0 else chr(i) for i in ids)


def test_a_marker_that_is_a_special_token_keeps_special_tokens_in_the_text() -> None:
    from graphpool.server.tool_prompt import tool_setup

    for special in (True, False):
        setup = tool_setup(MarkerTokenizer(special, QWEN_LIKE), None, "auto")
        assert (setup.parser.name, setup.template_reads_tools, setup.keep_special_tokens) == ("hermes", True, special)
    plain = tool_setup(MarkerTokenizer(True, PLAIN), None, "auto")
    assert not plain.template_reads_tools and plain.keep_special_tokens  # the vocabulary's marker still counts
    assert tool_setup(MarkerTokenizer(False, PLAIN), MISTRAL_LIKE, "auto").parser.name == "mistral"
