"""`strict: true` tools: with tool_choice auto the answer is free text, and a call the model starts (the tool-call
format's trigger) must be written as the parser reads calls, its arguments following its tool's schema; xgrammar's
structural tag over the default model's tokenizer, then a strict request through the server."""

from __future__ import annotations

import json

import pytest
from test_tool_parsers import TIME, WEATHER, tools

from graphpool.engine.grammar import Grammars
from graphpool.model.gguf_loader import default_gguf_path, gguf_tokenizer_metadata, open_gguf
from graphpool.model.tokenizer import tokenizer_from_gguf_metadata
from graphpool.server.tool_parsers import PARSERS
from graphpool.server.tools import plan_tools, strict_calls_guided

STRICT = {"type": "function", "function": {**WEATHER["function"], "strict": True}}


@pytest.fixture(scope="module")
def grammars() -> Grammars:
    path = default_gguf_path()
    tok = tokenizer_from_gguf_metadata(gguf_tokenizer_metadata(open_gguf(path)), path, (2,))
    return Grammars(tok, tok.vocab_size, tok.eos_token_ids)


@pytest.mark.parametrize("parser", sorted(n for n, p in PARSERS.items() if p.supports_strict))
def test_calls_follow_the_format_and_the_strict_tools_schema(grammars: Grammars, parser: str) -> None:
    p = PARSERS[parser]()
    plan = plan_tools(tools(STRICT, TIME), "auto", None, p)
    assert plan.strict and not plan_tools(tools(WEATHER, TIME), "auto", None, p).strict
    assert not plan_tools(tools(STRICT), "none", None, p).strict

    def accepts(*texts: str, parallel: bool | None = None) -> bool:
        guide = grammars.guide(strict_calls_guided(plan_tools(tools(STRICT, TIME), "auto", parallel, p)), [2])
        return all(guide.matcher.accept_string(t) for t in texts)

    paris = p.write_call("get_weather", {"city": "Paris", "days": 2})
    assert accepts("Let me look that up. ", paris, " Done.")
    assert accepts(paris, p.write_call("get_time", {"zone": "UTC"}))  # a non-strict tool: any object
    assert not accepts(p.write_call("get_weather", {"town": "Paris"}))  # `city` is required
    assert not accepts(p.write_call("get_weather", {"city": 3}))
    assert not accepts(p.write_call("get_forecast", {}))  # not a tool
    assert not accepts(paris, p.write_call("get_time", {}), parallel=False)  # nothing after the first call
    spec = json.loads(strict_calls_guided(plan).spec)["format"]
    assert spec["triggers"] == [p.call_trigger] and [t["begin"] for t in spec["tags"]] == [
        p.call_tag("get_weather")[0], p.call_tag("get_time")[0]]
