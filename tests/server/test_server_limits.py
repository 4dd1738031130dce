"""Requests that must not hurt the server: bodies past the size limit (413), JSON nested past the parser's
depth, prompts too long to tokenize, fields the server cannot honour, tool-call history; and a context
length past the model's own. The real default model on CPU, served over HTTP on 127.0.0.1."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.model.config import ModelConfig
from graphpool.model.llama import LlamaModel
from graphpool.server.main import serve_in_thread

LIMIT = 64 * 1024
MAX_MODEL_LEN = 128


@pytest.fixture(scope="module")
def base_url(default_model) -> Iterator[str]:
    config = EngineConfig(device="cpu", max_model_len=MAX_MODEL_LEN, max_num_seqs=4, num_kv_blocks=32)
    engine = LLMEngine(config, loaded=default_model)
    with serve_in_thread(engine, max_request_bytes=LIMIT) as (url, _):
        yield url


def post(base_url: str, body: bytes | dict, path: str = "/v1/completions", **kw) -> httpx.Response:
    if isinstance(body, dict):
        return httpx.post(f"{base_url}{path}", json=body, timeout=120, **kw)
    return httpx.post(f"{base_url}{path}", content=body, timeout=120,
                      headers={"Content-Type": "application/json"}, **kw)


def error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    return r.json()["error"]


def test_a_body_past_the_limit_is_a_413_declared_or_streamed(base_url: str) -> None:
    big = b'{"prompt": "' + b"a" * (2 * LIMIT) + b'"}'
    assert "at most 65536" in error(post(base_url, big), 413)["message"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit holds while the body streams in
        yield big[: LIMIT // 2]
        yield big[LIMIT // 2:]

    assert error(post(base_url, chunks()), 413)["code"] == "request_too_large"  # type: ignore[arg-type]
    assert httpx.get(f"{base_url}/health", timeout=30).status_code == 200


def test_json_nested_too_deeply_is_a_400_body(base_url: str) -> None:
    assert "nested too deeply" in error(post(base_url, b"[" * 50_000), 400)["message"]
    deep = b'{"prompt": "hi", "user": ' + b'{"a": ' * 5000 + b"1" + b"}" * 5000 + b"}"
    error(post(base_url, deep), 400)


def test_a_prompt_too_long_for_any_tokenization_is_refused_untokenized(base_url: str) -> None:
    e = error(post(base_url, {"prompt": "word " * 12_000, "max_tokens": 1}), 400)
    assert e["param"] == "prompt" and "characters" in e["message"]
    chat = {"messages": [{"role": "user", "content": "word " * 12_000}], "max_tokens": 1}
    assert error(post(base_url, chat, "/v1/chat/completions"), 400)["param"] == "messages"
    # a long prompt that could fit is tokenized and then refused by its token count
    e = error(post(base_url, {"prompt": "word " * 200, "max_tokens": 1}), 400)
    assert e["code"] == "context_length_exceeded"


@pytest.mark.parametrize(("field", "value"), [
    ("use_beam_search", True), ("length_penalty", 0.5),
    ("guided_whitespace_pattern", " "), ("spaces_between_special_tokens", False),
])
def test_a_field_the_server_cannot_honour_is_refused_by_name(base_url: str, field: str, value: object) -> None:
    e = error(post(base_url, {"prompt": "Hi", "max_tokens": 1, field: value}), 400)
    assert e["param"] == field and "not supported" in e["message"]


def test_a_harmless_value_of_an_unhonoured_field_is_accepted(base_url: str) -> None:
    r = post(base_url, {"prompt": "Hi", "max_tokens": 2, "temperature": 0, "min_p": 0.0,
                        "skip_special_tokens": True, "metadata": {"x": "y"}})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] >= 1


def test_strict_types_stop_count_and_malformed_tool_history_are_refused(base_url: str) -> None:
    assert error(post(base_url, {"prompt": "Hi", "stream": "yes"}), 400)["param"] == "stream"
    assert error(post(base_url, {"prompt": "Hi", "stop": ["a", "b", "c", "d", "e"]}), 400)["param"] == "stop"
    messages = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "1", "type": "function", "function": {"name": "w", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "2", "content": "sunny"},
    ]
    e = error(post(base_url, {"messages": messages}, "/v1/chat/completions"), 400)
    assert e["param"] == "messages[2].tool_call_id" and "answers no tool call" in e["message"]


def test_max_model_len_past_the_models_context_is_refused_before_allocating() -> None:
    config = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=4,
                         num_kv_heads=2, head_dim=8, max_position_embeddings=512)
    with pytest.raises(ValueError, match="past this model's context of 512"):
        LlamaModel(config, max_positions=99_999_999)
    assert LlamaModel(config, max_positions=512).max_positions == 512


@pytest.mark.parametrize(("path", "field", "value"), [
    ("/v1/completions", "max_token", 2),  # a typo of max_tokens
    ("/v1/completions", "typical_p", 0.5),  # another server's sampler knob
    ("/v1/completions", "max_completion_tokens", 2),  # chat's field
    ("/v1/completions", "tools", [{"type": "function", "function": {"name": "f"}}]),
    ("/v1/chat/completions", "echo", True),  # completions' fields
    ("/v1/chat/completions", "best_of", 3),
    ("/v1/chat/completions", "reasoning_effort", "high"),
])
def test_an_unknown_field_is_refused_by_name(base_url: str, path: str, field: str, value: object) -> None:
    body: dict = {"max_tokens": 1, field: value}
    body.update({"prompt": "Hi"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "Hi"}]})
    e = error(post(base_url, body, path), 400)
    assert e["param"] == field and "unknown field" in e["message"]


def test_null_unknown_fields_and_bookkeeping_fields_are_accepted(base_url: str) -> None:
    r = post(base_url, {"prompt": "Hi", "max_tokens": 1, "typical_p": None, "store": False, "service_tier": "auto",
                        "priority": 0})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(("field", "value"), [("max_tokens", "3"), ("temperature", True), ("n", 2.0), ("top_k", 1e20)])
def test_values_of_the_wrong_json_type_are_not_coerced(base_url: str, field: str, value: object) -> None:
    assert error(post(base_url, {"prompt": "Hi", "max_tokens": 1, field: value}), 400)["param"] == field


def test_stream_options_need_a_stream_and_continuous_usage_needs_include_usage(base_url: str) -> None:
    body = {"prompt": "Hi", "max_tokens": 1, "stream_options": {"include_usage": True}}
    assert error(post(base_url, body), 400)["param"] == "stream_options"
    for option in ("continuous_usage_stats", "include_obfuscation"):
        body = {**body, "stream": True, "stream_options": {option: True}}
        assert error(post(base_url, body), 400)["param"] == f"stream_options.{option}"
    body["stream_options"] = {"include_usage": True, "include_obfuscation": False}
    assert post(base_url, body).status_code == 200


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_continuous_usage_stats_put_the_usage_so_far_in_every_chunk(base_url: str, path: str) -> None:
    body = {"max_tokens": 5, "n": 2, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    body |= {"messages": [{"role": "user", "content": "Hi"}]} if "chat" in path else {"prompt": "Hi"}
    with httpx.stream("POST", f"{base_url}{path}", json=body, timeout=120) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    usages = [c["usage"] for c in chunks]
    assert all(u is not None for u in usages) and len({u["prompt_tokens"] for u in usages}) == 1
    done = [u["completion_tokens"] for u in usages]
    assert done == sorted(done) and done[0] == (0 if "chat" in path else 1) and done[-1] == 10  # chat: role chunks first
    assert all(u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"] for u in usages)


def test_a_huge_integer_literal_and_echoed_ids_past_any_vocabulary_are_400s(base_url: str) -> None:
    with httpx.Client(base_url=base_url, timeout=120) as client:  # NOTE: one connection: it must survive
        body = b'{"prompt": "hi", "max_tokens": ' + b"9" * 4301 + b"}"
        r = client.post("/v1/completions", content=body, headers={"Content-Type": "application/json"})
        assert error(r, 400)["message"].startswith("Invalid JSON body")
        for ids in ([-1], [2**32]):
            r = client.post("/v1/completions", json={"prompt": ids, "echo": True, "max_tokens": 1})
            assert error(r, 400)["param"] == "prompt"
        assert client.get("/health").status_code == 200


def _text(base_url: str, **fields: object) -> str:
    r = post(base_url, {"prompt": "The capital of France is", "max_tokens": 4, **fields})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def test_sampling_values_at_float32s_edges_mean_what_they_say(base_url: str) -> None:
    """A temperature under 1e-5 is greedy (divided by it, logits overflow to NaN draws), a top_p under
    float32's smallest value keeps the top token, a top_k past int64 keeps the vocabulary (it once killed
    the engine loop); a repetition penalty that would overflow the logits is refused."""
    greedy = _text(base_url, temperature=0)
    assert _text(base_url, temperature=1e-39, seed=1) == greedy
    assert _text(base_url, temperature=1.0, top_p=1e-46, seed=1) == greedy
    assert _text(base_url, temperature=0, top_k=2**63) == greedy
    assert len(_text(base_url, temperature=1.0, top_k=2**64, seed=1)) > 0
    e = error(post(base_url, {"prompt": "Hi", "max_tokens": 1, "repetition_penalty": 1e-300}), 400)
    assert e["param"] == "repetition_penalty"
    assert httpx.get(f"{base_url}/health", timeout=30).status_code == 200


def _refused_400(base_url: str) -> float:
    text = httpx.get(f"{base_url}/metrics", timeout=30).text
    line = next((ln for ln in text.splitlines() if ln.startswith('graphpool_requests_refused_total{status="400"}')),
                None)
    return float(line.split()[-1]) if line else 0.0


def test_a_client_gone_while_sending_its_body_is_a_quiet_400(base_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """Counted as a refused request, with no traceback in the log (the server did nothing wrong)."""
    import socket
    import time
    from urllib.parse import urlparse

    before = _refused_400(base_url)
    url = urlparse(base_url)
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"")
    deadline = time.monotonic() + 60  # NOTE: only ends a hang; the count moves as soon as the server notices
    while _refused_400(base_url) == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _refused_400(base_url) == before + 1
    assert not [r for r in caplog.records if r.levelno >= 40 and "ClientDisconnect" in (r.exc_text or r.getMessage())]
    assert httpx.get(f"{base_url}/health", timeout=30).status_code == 200
