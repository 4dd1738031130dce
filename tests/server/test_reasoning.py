"""Reasoning told apart from the answer (`--reasoning-parser`): the split of a reply into `reasoning` and content,
streamed in any chunking equal to collected, and end to end through the server and the `openai` client on the
scripted engine (a reply written a few characters a step, so markers straddle steps)."""

from __future__ import annotations

import gc
import random
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from test_server_tools_scripted import WEATHER, ScriptEngine

from char_tokenizer import CharTokenizer
from graphpool.server.chat_options import ChatOptions
from graphpool.server.main import serve_in_thread
from graphpool.server.prompts import PromptBuilder
from graphpool.server.protocol import ChatCompletionRequest
from graphpool.server.reasoning import ReasoningPlan, reasoning_format

MARKERS = {"<think>": "\ue000", "</think>": "\ue001"}  # each marker one token, as in Qwen3's vocabulary


class ThinkTokenizer(CharTokenizer):
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        for marker, char in MARKERS.items():
            text = text.replace(marker, char)
        return super().encode(text)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        text = super().decode(ids)
        for marker, char in MARKERS.items():
            text = text.replace(char, marker)
        return text


class ThinkScriptEngine(ScriptEngine):
    """Writes `{think}` / `{/think}` of its script as the markers, so a prompt's own markers are what it says."""

    def add_request(self, request_id: str, prompt: str | list[int], params: Any) -> None:
        super().add_request(request_id, prompt, params)
        ids, params, script, done = self.requests[request_id]
        script = script.replace("{think}", "<think>").replace("{/think}", "</think>")
        self.requests[request_id] = (ids, params, script, done)


# (reply, whether the prompt opened a <think>) -> (reasoning, content)
CASES = [
    (("\nThe user greets.\n</think>\n\nHello!", True), ("The user greets.", "Hello!")),
    (("<think>\nHmm, 2 + 2.\nIt is 4.\n</think>\n\nFour.", False), ("Hmm, 2 + 2.\nIt is 4.", "Four.")),
    (("<think>\nStill thinking when cut", False), ("Still thinking when cut", "")),
    (("  Plain answer, no reasoning <think> inside.", False), (None, "  Plain answer, no reasoning <think> inside.")),
    (("<think>\n\n</think>\n\nOK", False), (None, "OK")),
    (("<think>\nthe prompt opened one already</think>Yes", True), ("the prompt opened one already", "Yes")),
    (("<thi", False), (None, "<thi")),
    (("a </thin", True), ("a </thin", "")),
    (("x</think>", True), ("x", "")),
]


@pytest.mark.parametrize(("case", "expected"), CASES)
def test_a_reply_splits_alike_in_any_chunking(case: tuple[str, bool], expected: tuple[str | None, str]) -> None:
    text, opened = case
    plan = ReasoningPlan(opened, include=True)
    assert plan.split(text) == expected
    rng = random.Random(0)
    for chunking in ("chars", "random", "random", "random"):
        stream, reasoning, content, at = plan.stream(), "", "", 0
        while at < len(text):
            step = 1 if chunking == "chars" else rng.randint(1, 6)
            r, c = stream.feed(text[at:at + step])
            reasoning, content, at = reasoning + r, content + c, at + step
        r, c = stream.finish()
        assert (reasoning + r or None, content + c) == expected, chunking


def test_the_format_is_found_or_refused_by_the_vocabulary() -> None:
    class Templated(ThinkTokenizer):
        def __init__(self, source: str) -> None:
            self.source = source

        def chat_template_source(self, chat_template: str | None = None, tools: bool = False) -> str:
            return chat_template or self.source

    fmt = reasoning_format(Templated("{{ '<think>\\n' }}"), None, "auto")
    assert fmt is not None and not fmt.keep_special_tokens
    assert reasoning_format(Templated("{{ messages }}"), None, "auto") is None
    assert reasoning_format(Templated("{{ messages }}"), "<think>", "auto") is not None  # --chat-template's
    assert reasoning_format(Templated("<think>"), None, "none") is None
    assert reasoning_format(CharTokenizer(), None, "auto") is None  # no marker tokens
    with pytest.raises(ValueError, match="no <think> and </think> tokens"):
        reasoning_format(CharTokenizer(), None, "qwen3")
    with pytest.raises(ValueError, match="unknown parser"):
        reasoning_format(ThinkTokenizer(), None, "r1")
    assert fmt.plan(ThinkTokenizer().encode("a<think>b</think>c<think>"), True).opened
    assert not fmt.plan(ThinkTokenizer().encode("<think>b</think>c"), True).opened


def test_an_output_constraint_leaves_the_reply_all_content() -> None:
    class Grammars:
        def compile(self, guided: Any) -> None:
            pass

    builder = PromptBuilder(ThinkTokenizer(), 1000, ["m"], ChatOptions(reasoning_parser="qwen3"), grammars=Grammars())
    messages = [{"role": "user", "content": "<think>hi"}]
    _, plan = builder.chat(ChatCompletionRequest(messages=messages))
    assert plan.reasoning == ReasoningPlan(True, True)
    _, plan = builder.chat(ChatCompletionRequest(messages=messages, response_format={"type": "json_object"}))
    assert plan.reasoning is None


@pytest.fixture(scope="module")
def client() -> Iterator[openai.OpenAI]:
    engine = ThinkScriptEngine(tokenizer=ThinkTokenizer())
    with serve_in_thread(engine, chat=ChatOptions(reasoning_parser="qwen3")) as (url, _):
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)


def _streamed(client: openai.OpenAI, **kw: Any) -> tuple[str, str, list[Any], str | None]:
    reasoning, content, calls, finish = "", "", [], None
    for chunk in client.chat.completions.create(model="scripted", stream=True, **kw):
        delta = chunk.choices[0].delta
        reasoning += getattr(delta, "reasoning", None) or ""
        content += delta.content or ""
        calls += delta.tool_calls or []
        finish = chunk.choices[0].finish_reason or finish
    return reasoning, content, calls, finish


@pytest.mark.parametrize(("user", "reasoning", "content"), [
    ("<think>SAY:\nThe user wants 4.\n{/think}\n\nFour.", "The user wants 4.", "Four."),  # the prompt opened it
    ("SAY:{think}Adding.{/think}Four.", "Adding.", "Four."),  # the reply opens it
    ("<think></think>SAY:Four.", None, "Four."),  # the prompt closed it: thinking off
    ("<think>SAY:cut short", "cut short", None),  # ended before its answer
])
def test_reasoning_and_content_collected_and_streamed(client: openai.OpenAI, user: str, reasoning: str | None,
                                                      content: str | None) -> None:
    messages = [{"role": "user", "content": user}]
    message = client.chat.completions.create(model="scripted", messages=messages).choices[0].message
    assert (getattr(message, "reasoning", None), message.content) == (reasoning, content)
    assert _streamed(client, messages=messages)[:2] == (reasoning or "", content or "")
    hidden = client.chat.completions.create(model="scripted", messages=messages,
                                            extra_body={"include_reasoning": False}).choices[0].message
    assert getattr(hidden, "reasoning", None) is None and hidden.content == content
    assert _streamed(client, messages=messages, extra_body={"include_reasoning": False})[:2] == ("", content or "")


def test_tool_calls_are_read_from_the_answer_after_the_reasoning(client: openai.OpenAI) -> None:
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    messages = [{"role": "user", "content": f"SAY:{{think}}I need the weather.{{/think}}\n\n{call}"}]
    r = client.chat.completions.create(model="scripted", messages=messages, tools=[WEATHER])
    message = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and message.content is None
    assert message.reasoning == "I need the weather."  # type: ignore[attr-defined]
    assert [c.function.name for c in message.tool_calls] == ["get_weather"]
    reasoning, content, calls, finish = _streamed(client, messages=messages, tools=[WEATHER])
    assert (reasoning, content.strip(), finish) == ("I need the weather.", "", "tool_calls")
    assert [c.function.name for c in calls] == ["get_weather"]


def test_earlier_reasoning_reaches_the_template_and_bad_uses_are_refused(client: openai.OpenAI) -> None:
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello", "reasoning": "greet"},
               {"role": "user", "content": "SAY:ok"}]
    assert client.chat.completions.create(model="scripted", messages=history).choices[0].message.content == "ok"
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "x",
                                                                    "reasoning": "no"}])  # type: ignore[misc]
    assert info.value.body["param"] == "messages[0].reasoning"  # type: ignore[index]


def test_a_server_without_reasoning_refuses_include_reasoning_false() -> None:
    with serve_in_thread(ScriptEngine(), chat=ChatOptions(reasoning_parser="none")) as (url, _):
        c = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
        message = c.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "SAY:<think>a"}])
        assert message.choices[0].message.content == "<think>a"
        with pytest.raises(openai.BadRequestError) as info:
            c.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "x"}],
                                      extra_body={"include_reasoning": False})
        assert info.value.body["param"] == "include_reasoning"  # type: ignore[index]


def test_serve_refuses_a_named_parser_the_model_cannot_read(capsys: pytest.CaptureFixture[str]) -> None:
    from graphpool.cli import main

    argv = ["serve", "random:smollm2-135m?layers=1", "--device", "cpu", "--max-model-len", "64", "--port", "0"]
    assert main([*argv, "--reasoning-parser", "qwen3"]) == 2
    assert "--reasoning-parser qwen3: this model has no tokenizer" in capsys.readouterr().err
    assert gc.get_freeze_count() == 0 and gc.isenabled()  # the start-up heap left as it was
