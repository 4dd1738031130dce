"""OpenAI's Responses API (`POST /v1/responses`) through the official `openai` client, on the scripted engine (a
reply written a few characters a step): output items (reasoning, message, function calls) collected and streamed,
the stream's events in order with the SDK's own accumulator, input items into the conversation, and refusals by
name. The real default model's greedy answer equals the chat endpoint's (test_server_surface.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import openai
import pytest
from test_reasoning import ThinkScriptEngine, ThinkTokenizer
from test_server_tools_scripted import WEATHER

from graphpool.server.chat_options import ChatOptions
from graphpool.server.main import serve_in_thread

TOOL = {"type": "function", "name": WEATHER["function"]["name"], "parameters": WEATHER["function"]["parameters"]}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@dataclass
class Served:
    url: str
    engine: ThinkScriptEngine
    client: openai.OpenAI


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    engine = ThinkScriptEngine(tokenizer=ThinkTokenizer())
    with serve_in_thread(engine, chat=ChatOptions(tool_call_parser="hermes", reasoning_parser="qwen3")) as (url, _):
        yield Served(url, engine, openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0))


def _say(text: str) -> str:
    return f"SAY:{text}"


def test_a_text_answer_collected_and_streamed(served: Served) -> None:
    r = served.client.responses.create(model="scripted", input=_say("Paris is the capital."))
    assert r.status == "completed" and r.output_text == "Paris is the capital." and r.id.startswith("resp_")
    assert [item.type for item in r.output] == ["message"] and r.output[0].status == "completed"
    assert r.usage.output_tokens == len("Paris is the capital.") and r.usage.input_tokens > 0
    with served.client.responses.stream(model="scripted", input=_say("Paris is the capital.")) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_response()
    assert final.output_text == "Paris is the capital." and final.output[0].id != r.output[0].id
    assert events[:2] == ["response.created", "response.in_progress"] and events[-1] == "response.completed"
    assert events.count("response.output_text.delta") == -(-len("Paris is the capital.") // 3)  # one a step
    raw = list(served.client.responses.create(model="scripted", input=_say("abc"), stream=True))
    assert [e.sequence_number for e in raw] == list(range(len(raw)))


def test_max_output_tokens_makes_an_incomplete_response(served: Served) -> None:
    r = served.client.responses.create(model="scripted", input=_say("A long answer."), max_output_tokens=5)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    chat = served.client.chat.completions.create(model="scripted", max_tokens=5,
                                                 messages=[{"role": "user", "content": _say("A long answer.")}])
    assert r.output_text == chat.choices[0].message.content and r.output[0].status == "incomplete"
    with served.client.responses.stream(model="scripted", input=_say("A long answer."), max_output_tokens=5) as s:
        assert [e.type for e in s][-1] == "response.incomplete"


def test_reasoning_and_function_calls_become_their_items(served: Served) -> None:
    text = _say(f"{{think}}Weather needs a call.{{/think}}\n\n{CALL}")
    r = served.client.responses.create(model="scripted", input=text, tools=[TOOL])
    assert [item.type for item in r.output] == ["reasoning", "function_call"]
    assert r.output[0].content[0].text == "Weather needs a call."
    call = r.output[1]
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Paris"})
    assert call.call_id.startswith("call_") and r.output_text == ""
    with served.client.responses.stream(model="scripted", input=text, tools=[TOOL]) as stream:
        final = stream.get_final_response()
    assert [item.type for item in final.output] == ["reasoning", "function_call"]
    assert final.output[1].arguments == call.arguments
    plain = served.client.responses.create(model="scripted", input=_say("{think}Easy.{/think}Four."))
    assert [item.type for item in plain.output] == ["reasoning", "message"] and plain.output_text == "Four."


def test_input_items_make_the_conversation(served: Served) -> None:
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "call"}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"role": "user", "content": _say("Sunny.")},
    ]
    r = served.client.responses.create(model="scripted", input=items, instructions="Be brief.", tools=[TOOL])
    assert r.output_text == "Sunny." and r.instructions == "Be brief."
    prompt = served.engine.prompts_seen[-1]
    assert prompt.startswith("<system>Be brief.") and "<user>Weather in Paris?<assistant>" in prompt
    assert '"arguments": {"city": "Paris"}' in prompt and "sunny" in prompt  # the call and its result, in turn


@pytest.mark.parametrize(("body", "param"), [
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0]"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "name": "bad name"}]}, "tools[0].name"),
    ({"reasoning": {"effort": "high"}}, "reasoning.effort"),
    ({"text": {"format": {"type": "xml"}}}, "text.format.type"),
    ({"include": ["reasoning.encrypted_content"]}, "include"),
    ({"truncation": "auto"}, "truncation"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"temperature": 3}, "temperature"),
    ({"seed": 1}, "seed"),
])
def test_what_cannot_be_honoured_is_refused_by_name(served: Served, body: dict, param: str) -> None:
    r = httpx.post(f"{served.url}/v1/responses", json={"model": "scripted", "input": "hi", **body}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    ok = httpx.post(f"{served.url}/v1/responses", timeout=30,
                    json={"input": _say("ok"), "store": False, "metadata": {"a": "b"}, "reasoning": {"effort": None}})
    assert ok.status_code == 200 and ok.json()["output"][0]["content"][0]["text"] == "ok"
