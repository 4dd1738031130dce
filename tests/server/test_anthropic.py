"""Anthropic's Messages API (`POST /v1/messages`) through the official `anthropic` client, on the scripted engine (a
reply written a few characters a step): text, thinking and tool_use blocks collected and streamed (the SDK's own
accumulator), tool results into the conversation, `x-api-key`, and errors in Anthropic's shape. The
real default model's greedy answer equals the chat endpoint's, and a stop sequence ends it
(test_server_surface.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import httpx
import pytest
from test_reasoning import ThinkScriptEngine, ThinkTokenizer

from graphpool.server.chat_options import ChatOptions
from graphpool.server.main import serve_in_thread

if TYPE_CHECKING:  # NOTE: imported where used: 2 s at collection, in every xdist worker
    import anthropic

KEY = "sk-local"
TOOL = {"name": "get_weather", "description": "The weather in a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@dataclass
class Served:
    url: str
    engine: ThinkScriptEngine
    client: anthropic.Anthropic


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    import anthropic

    engine = ThinkScriptEngine(tokenizer=ThinkTokenizer())
    chat = ChatOptions(tool_call_parser="hermes", reasoning_parser="qwen3")
    with serve_in_thread(engine, api_keys=[KEY], chat=chat) as (url, _):
        yield Served(url, engine, anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0))


def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_a_text_answer_collected_and_streamed(served: Served) -> None:
    kw = {"model": "scripted", "max_tokens": 64, "messages": _user("SAY:Paris is the capital.")}
    m = served.client.messages.create(**kw)
    assert [(b.type, b.text) for b in m.content] == [("text", "Paris is the capital.")]
    assert m.stop_reason == "end_turn" and m.role == "assistant" and m.id.startswith("msg_")
    assert m.usage.output_tokens == len("Paris is the capital.") and m.usage.input_tokens > 0
    with served.client.messages.stream(**kw) as stream:
        texts = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(texts) == "Paris is the capital." and len(texts) > 1
    assert final.content[0].text == "Paris is the capital." and final.stop_reason == "end_turn"
    assert final.usage.output_tokens == m.usage.output_tokens


def test_a_reply_cut_by_max_tokens(served: Served) -> None:
    cut = served.client.messages.create(model="scripted", max_tokens=5, messages=_user("SAY:A long answer."))
    assert cut.stop_reason == "max_tokens" and cut.stop_sequence is None


def test_thinking_and_tool_use_become_their_blocks(served: Served) -> None:
    kw = {"model": "scripted", "max_tokens": 200, "tools": [TOOL],
          "messages": _user(f"SAY:{{think}}Weather needs a call.{{/think}}\n\n{CALL}")}
    m = served.client.messages.create(**kw)
    assert [b.type for b in m.content] == ["thinking", "tool_use"] and m.stop_reason == "tool_use"
    assert m.content[0].thinking == "Weather needs a call."
    assert (m.content[1].name, m.content[1].input) == ("get_weather", {"city": "Paris"})
    with served.client.messages.stream(**kw) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "tool_use"] and final.content[1].input == {"city": "Paris"}


def test_tool_results_and_the_system_prompt_make_the_conversation(served: Served) -> None:
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "call it", "signature": ""},
                                          {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                                     {"type": "text", "text": "SAY:Sunny."}]},
    ]
    m = served.client.messages.create(model="scripted", max_tokens=64, system="Be brief.", tools=[TOOL],
                                      messages=messages)
    assert m.content[0].text == "Sunny."
    prompt = served.engine.prompts_seen[-1]
    assert prompt.startswith("<system>Be brief.") and '"arguments": {"city": "Paris"}' in prompt
    assert prompt.index("sunny") < prompt.index("SAY:Sunny.")  # the result before the user's text


@pytest.mark.parametrize(("body", "says"), [
    ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking is not supported"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages[0].content[0]"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0]"),
    ({"tool_choice": {"type": "sometimes"}}, "tool_choice.type"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"top_k": -1}, "top_k"),
    ({"mcp_servers": [{"url": "x"}]}, "mcp_servers"),
])
def test_refusals_in_anthropics_error_shape(served: Served, body: dict, says: str) -> None:
    request = {"model": "scripted", "max_tokens": 8, "messages": _user("hi"), **body}
    r = httpx.post(f"{served.url}/v1/messages", json=request, headers={"x-api-key": KEY}, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error" and says in r.text
    import anthropic

    with pytest.raises(anthropic.BadRequestError):  # the SDK reads it as a 400 with its message
        served.client.messages.create(model="scripted", max_tokens=request["max_tokens"], messages=request["messages"],
                                      extra_body={k: v for k, v in body.items() if k not in ("max_tokens", "messages")})


def test_the_key_goes_in_x_api_key(served: Served) -> None:
    import anthropic

    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=served.url, api_key="wrong", max_retries=0).messages.create(
            model="scripted", max_tokens=8, messages=_user("SAY:x"))
    r = httpx.post(f"{served.url}/v1/messages", json={"max_tokens": 8, "messages": _user("SAY:ok")},
                   headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    assert r.status_code == 200 and json.loads(r.text)["content"][0]["text"] == "ok"
