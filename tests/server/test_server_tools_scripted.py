"""Tool calls end to end through the server and the official `openai` client, on a scripted engine that writes
exactly the text a test asks for (after the last `SAY:` of the prompt), a few characters a step, so each
format's parse, the streamed `delta.tool_calls` and the finish reasons are deterministic."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import openai
import pytest
import torch

from char_tokenizer import CharTokenizer
from graphpool.engine.outputs import EngineStats, RequestOutput
from graphpool.engine.sampling_params import SamplingParams
from graphpool.server.chat_options import ChatOptions
from graphpool.server.main import serve_in_thread
from graphpool.server.tool_parsers import PARSERS

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
PER_STEP = 3  # characters a step: markers straddle steps


@dataclass
class ScriptEngine:
    model_name: str = "scripted"
    max_model_len: int = 100_000
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    tokenizer: CharTokenizer = field(default_factory=CharTokenizer)
    requests: dict[str, tuple[list[int], SamplingParams, str, int]] = field(default_factory=dict)
    params_seen: list[SamplingParams] = field(default_factory=list)
    prompts_seen: list[str] = field(default_factory=list)
    last_step: Any = None

    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams) -> None:
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        text = self.tokenizer.decode(ids)
        script = text.rsplit("SAY:", 1)[-1].removesuffix("<assistant>") if "SAY:" in text else "ok"
        self.requests[request_id] = (ids, params, script, 0)
        self.params_seen.append(params)
        self.prompts_seen.append(text)

    def abort_request(self, request_id: str) -> None:
        self.requests.pop(request_id, None)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def step(self) -> list[RequestOutput]:
        outs = []
        for rid, (ids, params, script, done) in list(self.requests.items()):
            new = script[done:done + PER_STEP]
            end = done + len(new)
            length = end >= params.max_tokens
            finished = end >= len(script) or length
            reason = ("length" if length and end < len(script) else "stop") if finished else None
            outs.append(RequestOutput(rid, ids, self.tokenizer.encode(script[:end]), self.tokenizer.encode(new),
                                      script[:end], new, finished, reason))
            if finished:
                del self.requests[rid]
            else:
                self.requests[rid] = (ids, params, script, end)
        return outs

    def stats(self) -> EngineStats:
        return EngineStats(len(self.requests), 0, 10, 10, 0, 0, 0)

    def graph_stats(self) -> None:
        return None


@dataclass
class Served:
    engine: ScriptEngine
    client: openai.OpenAI


@pytest.fixture(scope="module", params=["hermes", "llama3_json", "mistral", "qwen3_coder"])
def served(request: pytest.FixtureRequest) -> Iterator[Served]:
    engine = ScriptEngine()
    with serve_in_thread(engine, chat=ChatOptions(tool_call_parser=request.param)) as (url, _):
        yield Served(engine, openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0))


def calls_text(parser: str, calls: list[tuple[str, dict]], before: str = "") -> str:
    if parser == "hermes":
        body = "".join(f'<tool_call>\n{json.dumps({"name": n, "arguments": a})}\n</tool_call>\n' for n, a in calls)
    elif parser == "llama3_json":
        body = "; ".join(json.dumps({"name": n, "parameters": a}) for n, a in calls)
        body = f"<|python_tag|>{body}" if before else body
    elif parser == "mistral":
        body = "[TOOL_CALLS]" + json.dumps([{"name": n, "arguments": a} for n, a in calls])
    else:
        body = "\n".join(PARSERS[parser]().write_call(n, a) for n, a in calls)
    return f"{before} {body}" if before else body


CALLS = [("get_weather", {"city": "Paris"}), ("get_time", {})]


@pytest.mark.parametrize("before", ["", "Let me check."])
def test_a_tool_call_answer_has_the_calls_content_and_finish_reason(served: Served, request: pytest.FixtureRequest,
                                                                    before: str) -> None:
    parser = request.node.callspec.params["served"]
    script = calls_text(parser, CALLS, before)
    r = served.client.chat.completions.create(
        model="scripted", messages=[{"role": "user", "content": f"SAY:{script}"}], tools=[WEATHER, TIME])
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == (before or None)
    got = [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls]
    assert got == CALLS
    assert all(c.id.startswith("call_") and c.type == "function" for c in choice.message.tool_calls)
    assert len({c.id for c in choice.message.tool_calls}) == 2
    assert served.engine.params_seen[-1].skip_special_tokens is (parser != "mistral")

    streamed = served.client.chat.completions.create(
        model="scripted", messages=[{"role": "user", "content": f"SAY:{script}"}], tools=[WEATHER, TIME],
        stream=True)
    content, deltas, finish = "", [], None
    for chunk in streamed:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        deltas += delta.tool_calls or []
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and content.strip() == before
    assert [(d.index, d.function.name, json.loads(d.function.arguments)) for d in deltas] == \
        [(i, n, a) for i, (n, a) in enumerate(CALLS)]
    assert all(d.id.startswith("call_") and d.type == "function" for d in deltas)


def test_the_stream_accumulates_as_the_openai_helper_expects(served: Served, request: pytest.FixtureRequest) -> None:
    parser = request.node.callspec.params["served"]
    script = calls_text(parser, CALLS)
    with served.client.beta.chat.completions.stream(
            model="scripted", messages=[{"role": "user", "content": f"SAY:{script}"}], tools=[WEATHER, TIME]) as s:
        final = s.get_final_completion()
    calls = final.choices[0].message.tool_calls
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == CALLS
    assert final.choices[0].finish_reason == "tool_calls"


def test_no_tools_none_and_plain_answers_are_not_parsed(served: Served, request: pytest.FixtureRequest) -> None:
    parser = request.node.callspec.params["served"]
    script = calls_text(parser, CALLS[:1])
    messages = [{"role": "user", "content": f"SAY:{script}"}]
    for extra in ({}, {"tools": [WEATHER], "tool_choice": "none"}):
        r = served.client.chat.completions.create(model="scripted", messages=messages, **extra)
        assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason == "stop"
        assert r.choices[0].message.content == script
    assert "get_weather" not in served.engine.prompts_seen[-1].split("SAY:")[0]  # none: no tools in the prompt
    plain = served.client.chat.completions.create(
        model="scripted", messages=[{"role": "user", "content": "SAY:Sunny, 21 degrees."}], tools=[WEATHER],
        stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in plain if c.choices)
    assert text == "Sunny, 21 degrees."


def test_parallel_calls_off_keeps_the_first_and_n_choices_parse_alike(served: Served,
                                                                     request: pytest.FixtureRequest) -> None:
    parser = request.node.callspec.params["served"]
    script = calls_text(parser, CALLS)
    r = served.client.chat.completions.create(
        model="scripted", messages=[{"role": "user", "content": f"SAY:{script}"}], tools=[WEATHER, TIME],
        parallel_tool_calls=False, n=2)
    assert len(r.choices) == 2
    for choice in r.choices:
        assert [c.function.name for c in choice.message.tool_calls] == ["get_weather"]
    ids = {c.id for choice in r.choices for c in choice.message.tool_calls}
    assert len(ids) == 2


def test_a_call_cut_by_max_tokens_is_content_with_finish_length(served: Served,
                                                               request: pytest.FixtureRequest) -> None:
    parser = request.node.callspec.params["served"]
    script = calls_text(parser, CALLS[:1])
    r = served.client.chat.completions.create(
        model="scripted", messages=[{"role": "user", "content": f"SAY:{script}"}], tools=[WEATHER], max_tokens=12)
    assert r.choices[0].finish_reason == "length" and r.choices[0].message.tool_calls is None
    assert r.choices[0].message.content == script[:12].strip()


def test_tool_history_reaches_the_prompt_in_the_parsers_format(served: Served,
                                                               request: pytest.FixtureRequest) -> None:
    parser = request.node.callspec.params["served"]
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris and the time?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_a1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"id": "call_b2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_a1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_b2", "content": "noon"},
        {"role": "user", "content": "SAY:Sunny at noon."},
    ]
    r = served.client.chat.completions.create(model="scripted", messages=messages, tools=[WEATHER, TIME])
    assert r.choices[0].message.content == "Sunny at noon." and r.choices[0].finish_reason == "stop"
    prompt = served.engine.prompts_seen[-1]
    # the fallback: tools in the system turn after its own text, the calls as the model writes them, results
    # as one user turn
    assert prompt.startswith("<system>Be brief.\n\n") and json.dumps(WEATHER) in prompt
    fmt = PARSERS[parser]()
    assert f'{fmt.write_call("get_weather", {"city": "Paris"})}\n{fmt.write_call("get_time", {})}' in prompt
    assert "<user><tool_response>\nsunny\n</tool_response>\n<tool_response>\nnoon\n</tool_response><user>SAY:" \
        in prompt


def test_the_answers_message_goes_back_into_the_history(served: Served, request: pytest.FixtureRequest) -> None:
    parser = request.node.callspec.params["served"]
    asked = {"role": "user", "content": f"SAY:{calls_text(parser, CALLS[:1])}"}
    first = served.client.chat.completions.create(model="scripted", messages=[asked], tools=[WEATHER])
    answer = first.choices[0].message  # as clients append it: the SDK's own message object
    result = {"role": "tool", "tool_call_id": answer.tool_calls[0].id, "content": "sunny"}
    r = served.client.chat.completions.create(
        model="scripted", messages=[asked, answer, result, {"role": "user", "content": "SAY:Sunny."}],
        tools=[WEATHER])
    assert r.choices[0].message.content == "Sunny." and r.choices[0].finish_reason == "stop"
    assert "<tool_response>\nsunny\n</tool_response>" in served.engine.prompts_seen[-1]


def test_an_unknown_parser_is_refused_before_serving() -> None:
    from graphpool.server.main import build_parser

    with pytest.raises(ValueError, match="unknown parser 'qwen'"), serve_in_thread(
            ScriptEngine(), chat=ChatOptions(tool_call_parser="qwen")):
        pass
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["--tool-call-parser", "qwen"])
    assert info.value.code == 2
    assert build_parser().parse_args(["--tool-call-parser", "mistral"]).tool_call_parser == "mistral"


def test_strict_tools_need_a_format_with_json_arguments(served: Served, request: pytest.FixtureRequest) -> None:
    strict = {"type": "function", "function": {**WEATHER["function"], "strict": True}}
    with pytest.raises(openai.BadRequestError) as info:
        served.client.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "SAY:x"}],
                                              tools=[strict])
    body = info.value.body
    assert isinstance(body, dict) and body["param"] == "tools"
    # the scripted engine compiles no grammars: the formats that take strict tools stop there
    says = "not supported with the qwen3_coder" if request.node.callspec.params["served"] == "qwen3_coder" else \
        "no grammar support"
    assert says in body["message"]
