"""Structured output over HTTP through the official `openai` client, on the real default model (CPU):
`response_format` json_object / json_schema, vLLM's `guided_json`, `guided_regex`, `guided_choice`,
`guided_grammar` and `structured_outputs`, greedy and sampled, with n > 1 and streamed; invalid specs and
conflicting constraints are 400s naming the field, and the server keeps serving."""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.server.main import serve_in_thread

# NOTE: looked up, not imported: xgrammar takes ~1 s to import, at collection in every xdist worker
pytestmark = pytest.mark.skipif(importlib.util.find_spec("xgrammar") is None, reason="xgrammar is not installed")
jsonschema = pytest.importorskip("jsonschema")

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "pets": {"type": "array", "items": {"type": "string", "enum": ["cat", "dog"]}, "maxItems": 2},
    },
    "required": ["name", "age", "pets"],
}
MESSAGES = [{"role": "user", "content": "Give me a person with a name, age and city as JSON."}]
PROMPT = "Here is a JSON object with a name and an age:"
REGEX = r"[0-9]{3}-[a-z]{2,4}"
CHOICES = ["Paris", "London", "Rome"]


@pytest.fixture(scope="module")
def served(default_model) -> Iterator[tuple[openai.OpenAI, str]]:
    config = EngineConfig(device="cpu", max_model_len=256, max_num_seqs=8, num_kv_blocks=96)
    engine = LLMEngine(config, loaded=default_model)
    with serve_in_thread(engine) as (url, _):
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0), engine.model_name


def _texts(r: Any, chat: bool, stream: bool) -> tuple[list[str], list[str | None]]:
    """Each choice's whole text and finish reason, from a response or a stream."""
    if not stream:
        return ([c.message.content if chat else c.text for c in r.choices], [c.finish_reason for c in r.choices])
    texts: dict[int, str] = {}
    reasons: dict[int, str | None] = {}
    for chunk in r:
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + ((c.delta.content or "") if chat else c.text)
            reasons[c.index] = c.finish_reason or reasons.get(c.index)
    return [texts[i] for i in sorted(texts)], [reasons[i] for i in sorted(reasons)]


def _chat(served: tuple[openai.OpenAI, str], stream: bool = False, max_tokens: int = 96,
          **kw: Any) -> tuple[list[str], list[Any]]:
    client, model = served
    r = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=max_tokens, stream=stream, **kw)
    return _texts(r, True, stream)


def _complete(served: tuple[openai.OpenAI, str], stream: bool = False, max_tokens: int = 96,
              **kw: Any) -> tuple[list[str], list[Any]]:
    client, model = served
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=max_tokens, stream=stream, **kw)
    return _texts(r, False, stream)


def test_json_object_parses_greedy_plain_and_streamed(served) -> None:
    plain, reasons = _chat(served, temperature=0, response_format={"type": "json_object"})
    assert reasons == ["stop"] and isinstance(json.loads(plain[0]), dict)
    streamed, reasons = _chat(served, stream=True, temperature=0, response_format={"type": "json_object"})
    assert streamed == plain and reasons == ["stop"]


@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_validates_greedy_and_sampled_with_n(served, stream: bool) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
    # NOTE: streamed, the sampled choices only: greedy n > 1 adds nothing a stream's chunks do not already carry
    for temperature in (0.8,) if stream else (0, 0.8):
        texts, reasons = _chat(served, stream=stream, temperature=temperature, seed=5, n=3, response_format=fmt)
        assert reasons == ["stop"] * 3
        for text in texts:
            jsonschema.validate(json.loads(text), SCHEMA)
        if temperature == 0:
            assert len(set(texts)) == 1  # greedy choices are equal
    # the same constraint on completions, as vLLM's guided_json (a schema object, or streamed its JSON text)
    for spec in (json.dumps(SCHEMA),) if stream else (SCHEMA,):
        texts, reasons = _complete(served, stream=stream, temperature=0.8, seed=2, n=2,
                                   extra_body={"guided_json": spec})
        assert reasons == ["stop"] * 2
        for text in texts:
            jsonschema.validate(json.loads(text), SCHEMA)


@pytest.mark.parametrize("stream", [False, True])
def test_regex_choice_and_grammar_outputs_match(served, stream: bool) -> None:
    cases: list[tuple[dict[str, Any], Any]] = [
        ({"guided_regex": REGEX}, lambda t: re.fullmatch(REGEX, t)),
        ({"structured_outputs": {"regex": REGEX}}, lambda t: re.fullmatch(REGEX, t)),
        ({"guided_choice": CHOICES}, lambda t: t in CHOICES),
        ({"structured_outputs": {"choice": CHOICES}}, lambda t: t in CHOICES),
        ({"guided_grammar": 'root ::= ("yes" | "no") "!"'}, lambda t: t in ("yes!", "no!")),
        ({"structured_outputs": {"grammar": 'root ::= "a" [0-9]'}}, lambda t: re.fullmatch("a[0-9]", t)),
        ({"structured_outputs": {"json": SCHEMA}}, lambda t: jsonschema.validate(json.loads(t), SCHEMA) is None),
    ]
    for i, (extra, ok) in enumerate(cases):
        # NOTE: streamed, each case on one endpoint, in turn: every case and endpoint is still streamed
        for call in ((_chat, _complete)[i % 2],) if stream else (_chat, _complete):
            texts, reasons = call(served, stream=stream, temperature=0.8, seed=1, n=2, extra_body=extra)
            assert reasons == ["stop", "stop"], (extra, texts)
            assert all(ok(t) for t in texts), (extra, texts)


def test_completions_take_response_format_and_json_object_flag(served) -> None:
    texts, reasons = _complete(served, temperature=0, extra_body={"structured_outputs": {"json_object": True}})
    assert reasons == ["stop"] and isinstance(json.loads(texts[0]), dict)
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}
    texts, reasons = _complete(served, temperature=0, extra_body={"response_format": fmt})
    assert reasons == ["stop"]
    jsonschema.validate(json.loads(texts[0]), SCHEMA)
    # "text" is no constraint: the output equals an unconstrained request's
    free = _complete(served, max_tokens=16, temperature=0)
    assert _complete(served, max_tokens=16, temperature=0, extra_body={"response_format": {"type": "text"}}) == free
    text = _chat(served, max_tokens=16, temperature=0, response_format={"type": "text"})
    assert text == _chat(served, max_tokens=16, temperature=0)


def _refused(served: tuple[openai.OpenAI, str], chat: bool, **extra: Any) -> dict[str, Any]:
    client, model = served
    with pytest.raises(openai.BadRequestError) as e:
        if chat:
            client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=4, extra_body=extra)
        else:
            client.completions.create(model=model, prompt=PROMPT, max_tokens=4, extra_body=extra)
    assert e.value.status_code == 400
    return e.value.body  # type: ignore[return-value]


BAD = [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "foo"}}}},
     "response_format", "foo"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format", "schema"),
    ({"response_format": {"type": "xml"}}, "response_format", "xml"),
    ({"guided_json": {"properties": {"a": {"$ref": "#/nowhere"}}}}, "guided_json", "does not compile"),
    ({"guided_json": "{not json"}, "guided_json", "not valid JSON"),
    ({"guided_regex": "(abc"}, "guided_regex", "parenthesis"),
    ({"guided_choice": []}, "guided_choice", "non-empty"),
    ({"guided_choice": ["a", 1]}, "guided_choice[1]", "valid string"),
    ({"guided_grammar": "root ::= "}, "guided_grammar", "EBNF"),
    ({"guided_grammar": "\U0001f600" * 10}, "guided_grammar", "does not compile"),  # an error message cut in a character
    ({"structured_outputs": {"regex": "a{3,1}"}}, "structured_outputs", "bound"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs", "one constraint"),
    ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs", "structural_tag"),
    ({"structured_outputs": {"whitespace_pattern": " "}}, "structured_outputs", "whitespace_pattern"),
    ({"guided_regex": "a", "guided_choice": ["b"]}, "guided_choice", "one output constraint"),
    ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex", "one output constraint"),
    ({"guided_regex": "a+", "ignore_eos": True}, "ignore_eos", "guided"),
    ({"guided_regex": "a+", "min_tokens": 2}, "min_tokens", "guided"),
    ({"guided_whitespace_pattern": " "}, "guided_whitespace_pattern", "not supported"),
]


@pytest.mark.parametrize(("extra", "param", "words"), BAD)
def test_invalid_specs_are_400s_naming_the_field(served, extra: dict[str, Any], param: str, words: str) -> None:
    for chat in (True, False):
        body = _refused(served, chat, **extra)
        assert body["param"] == param and words in body["message"], body


def test_the_server_keeps_serving_after_refusals(served) -> None:
    _refused(served, True, guided_regex="(")
    texts, reasons = _chat(served, temperature=0, extra_body={"guided_choice": CHOICES})
    assert reasons == ["stop"] and texts[0] in CHOICES
