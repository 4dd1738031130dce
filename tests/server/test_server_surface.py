"""What vLLM clients expect beyond the two generation routes: /ping, /version, /tokenize, /detokenize,
`--api-key` on /v1/*, `--chat-template`, and `serve MODEL`. The real default model on CPU, served over HTTP
on 127.0.0.1 with an API key and a chat template of its own."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

import graphpool
from graphpool import LLM, SamplingParams
from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.server.chat_options import ChatOptions
from graphpool.server.chat_template import load_chat_template
from graphpool.server.main import serve_in_thread

KEY = "sk-graphpool-test"
MAX_MODEL_LEN = 256
N = 8
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{{ lead if lead is defined else 'The answer is' }}"
    "{% endif %}"
)
CHAT = [{"role": "user", "content": "What is 2 + 2?"}]
PROMPT = "The capital of France is"


@dataclass
class Served:
    base_url: str
    model: str
    vocab: int
    prompt_ids: list[int]
    chat_ids: list[int]  # CHAT through TEMPLATE, with the generation prompt
    default_chat_ids: list[int]  # CHAT through the model's own template
    chat_greedy: str  # greedy reply to chat_ids

    def client(self, key: str = KEY) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base_url}/v1", api_key=key, max_retries=0)

    def post(self, path: str, body: dict, **kw) -> httpx.Response:
        return httpx.post(f"{self.base_url}{path}", json=body, timeout=120, **kw)


@pytest.fixture(scope="module")
def served(default_model) -> Iterator[Served]:
    config = EngineConfig(device="cpu", max_model_len=MAX_MODEL_LEN, max_num_seqs=8, num_kv_blocks=64)
    llm = LLM.from_engine(LLMEngine(config, loaded=default_model))
    tok = llm.tokenizer
    chat_ids = tok.apply_chat_template(CHAT, chat_template=TEMPLATE)
    greedy = llm.generate(chat_ids, SamplingParams(temperature=0, max_tokens=N), use_tqdm=False)[0].text
    with serve_in_thread(llm.engine, api_keys=[KEY, "second-key"], chat=ChatOptions(TEMPLATE)) as (url, _):
        yield Served(url, llm.engine.model_name, tok.vocab_size, tok.encode(PROMPT), chat_ids,
                     tok.apply_chat_template(CHAT), greedy)


def error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    return r.json()["error"]


# ---- /ping, /version, /tokenize, /detokenize ----
def test_ping_and_version(served: Served) -> None:
    assert httpx.get(f"{served.base_url}/ping").status_code == 200
    assert httpx.post(f"{served.base_url}/ping").status_code == 200
    assert httpx.get(f"{served.base_url}/version").json() == {"version": graphpool.__version__}


def test_tokenize_a_prompt_as_the_engine_does(served: Served) -> None:
    body = served.post("/tokenize", {"prompt": PROMPT}).json()
    assert body == {"count": len(served.prompt_ids), "max_model_len": MAX_MODEL_LEN,
                    "tokens": served.prompt_ids, "token_strs": None}
    strs = served.post("/tokenize", {"prompt": PROMPT, "return_token_strs": True}).json()["token_strs"]
    assert len(strs) == len(served.prompt_ids) and "".join(strs).replace("Ġ", " ") == PROMPT


def test_tokenize_messages_uses_the_servers_chat_template(served: Served) -> None:
    body = served.post("/tokenize", {"messages": CHAT, "model": served.model}).json()
    assert body["tokens"] == served.chat_ids and body["count"] == len(served.chat_ids)
    assert served.chat_ids != served.default_chat_ids  # the override is what was used
    bare = served.post("/tokenize", {"messages": CHAT, "add_generation_prompt": False}).json()["tokens"]
    assert served.chat_ids[:len(bare)] == bare and len(bare) < len(served.chat_ids)
    e = error(served.post("/tokenize", {"messages": CHAT, "chat_template": "{{ 1 }}"}), 400)
    assert e["param"] == "chat_template"


def test_detokenize_round_trips_and_refuses_ids_outside_the_vocabulary(served: Served) -> None:
    assert served.post("/detokenize", {"tokens": served.prompt_ids}).json() == {"prompt": PROMPT}
    for bad in ([served.vocab], [-1], [1, 2, served.vocab + 7]):
        e = error(served.post("/detokenize", {"tokens": bad}), 400)
        assert e["param"] == "tokens" and "vocabulary" in e["message"]
    assert error(served.post("/detokenize", {"tokens": ["a"]}), 400)["param"] == "tokens[0]"
    assert error(served.post("/tokenize", {"prompt": "x", "model": "other"}), 400)["code"] == "model_not_found"
    surrogate = httpx.post(f"{served.base_url}/tokenize", content=b'{"prompt": "a\\ud800b"}', timeout=60)
    assert error(surrogate, 400)["param"] == "prompt"


# ---- --api-key ----
def test_v1_routes_need_one_of_the_keys(served: Served) -> None:
    assert [m.id for m in served.client().models.list().data] == [served.model]
    out = served.client("second-key").completions.create(model=served.model, prompt=PROMPT, max_tokens=2)
    assert out.usage.completion_tokens == 2
    with pytest.raises(openai.AuthenticationError) as info:
        served.client("wrong").completions.create(model=served.model, prompt=PROMPT, max_tokens=2)
    assert info.value.status_code == 401 and info.value.code == "invalid_api_key"
    for headers in ({}, {"Authorization": KEY}, {"Authorization": f"Basic {KEY}"}):
        r = httpx.get(f"{served.base_url}/v1/models", headers=headers)
        assert error(r, 401)["code"] == "invalid_api_key"
    r = httpx.get(f"{served.base_url}/v1/models", headers={"Authorization": f"bearer {KEY}"})
    assert r.status_code == 200


def test_health_ping_metrics_and_tokenize_stay_open(served: Served) -> None:
    for path in ("/health", "/ping", "/metrics", "/version"):
        assert httpx.get(f"{served.base_url}{path}").status_code == 200, path
    assert served.post("/tokenize", {"prompt": PROMPT}).status_code == 200
    assert httpx.get(f"{served.base_url}/v1/models").status_code == 401  # no key: this test's own refusal
    metrics = httpx.get(f"{served.base_url}/metrics").text
    assert 'status="401"' in metrics  # refusals are counted like the other refusals


def test_streamed_chat_with_the_key_and_the_template(served: Served) -> None:
    client = served.client()
    out = client.chat.completions.create(model=served.model, messages=CHAT, max_tokens=N, temperature=0)
    assert out.choices[0].message.content == served.chat_greedy
    assert out.usage.prompt_tokens == len(served.chat_ids)
    stream = client.chat.completions.create(model=served.model, messages=CHAT, max_tokens=N, temperature=0,
                                            stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == served.chat_greedy


def test_chat_template_kwargs_and_a_continued_final_message(served: Served) -> None:
    client = served.client()
    lead = served.post("/tokenize", {"messages": CHAT, "chat_template_kwargs": {"lead": "Paris is"}}).json()["tokens"]
    assert served.post("/detokenize", {"tokens": lead}).json()["prompt"].endswith("assistant\nParis is")
    out = client.chat.completions.create(model=served.model, messages=CHAT, max_tokens=N, temperature=0,
                                         extra_body={"chat_template_kwargs": {"lead": "Paris is"}})
    plain = client.completions.create(model=served.model, prompt=lead, max_tokens=N, temperature=0)
    assert out.usage.prompt_tokens == len(lead) and out.choices[0].message.content == plain.choices[0].text
    # the template's own generation prompt ends in "The answer is": continuing that message is the same prompt
    opened = [*CHAT, {"role": "assistant", "content": "The answer is"}]
    fields = {"add_generation_prompt": False, "continue_final_message": True}
    assert served.post("/tokenize", {"messages": opened, **fields}).json()["tokens"] == served.chat_ids
    out = client.chat.completions.create(model=served.model, messages=opened, max_tokens=N, temperature=0,
                                         extra_body=fields)
    assert out.usage.prompt_tokens == len(served.chat_ids) and out.choices[0].message.content == served.chat_greedy
    for body, param, says in (
        ({"chat_template_kwargs": {"enable_thinking": False}}, "chat_template_kwargs", "does not read 'enable_thinking'"),
        ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs", "set by the server"),
        ({"continue_final_message": True}, "continue_final_message", "add_generation_prompt false"),
        ({"add_generation_prompt": "no"}, "add_generation_prompt", "boolean"),
    ):
        for path in ("/v1/chat/completions", "/tokenize"):
            e = error(served.post(path, {"messages": opened, **body}, headers={"Authorization": f"Bearer {KEY}"}), 400)
            assert e["param"] == param and says in e["message"], (path, e)


def test_the_responses_api_answers_as_the_chat_endpoint(served: Served) -> None:
    client = served.client()
    r = client.responses.create(model=served.model, input=CHAT[0]["content"], temperature=0, max_output_tokens=N)
    assert r.output_text == served.chat_greedy and r.usage.input_tokens == len(served.chat_ids)
    # the same prompt again: its full blocks come from the prefix cache, and usage says how many tokens
    full_blocks = (len(served.chat_ids) - 1) // 16 * 16
    again = client.responses.create(model=served.model, input=CHAT[0]["content"], temperature=0, max_output_tokens=N)
    assert again.usage.input_tokens_details.cached_tokens == full_blocks > 0
    chat = client.chat.completions.create(model=served.model, messages=CHAT, temperature=0, max_tokens=N)
    assert chat.usage.prompt_tokens_details.cached_tokens == full_blocks
    with client.responses.stream(model=served.model, input=CHAT, temperature=0, max_output_tokens=N) as stream:
        assert stream.get_final_response().output_text == served.chat_greedy


def test_the_messages_api_answers_as_the_chat_endpoint(served: Served) -> None:
    import anthropic

    client = anthropic.Anthropic(base_url=served.base_url, api_key=KEY, max_retries=0)
    greedy = {"temperature": 0}  # NOTE: this SDK's create() takes sampling fields only through extra_body
    m = client.messages.create(model=served.model, max_tokens=N, messages=CHAT, extra_body=greedy)
    assert m.content[0].text == served.chat_greedy and m.stop_reason in ("max_tokens", "end_turn")
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == len(served.chat_ids)
    last = served.chat_greedy.strip()[-1]  # the greedy answer's last character ends it as a stop sequence
    stopped = client.messages.create(model=served.model, max_tokens=N, messages=CHAT, stop_sequences=[last],
                                     extra_body=greedy)
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", last)
    assert stopped.content[0].text == served.chat_greedy[:served.chat_greedy.index(last)]


# ---- command line ----
def test_serve_takes_the_model_as_a_positional_or_as_model() -> None:
    from graphpool.cli import build_parser, main
    from graphpool.server.main import resolve_api_args

    for argv in (["serve", "random:tiny"], ["serve", "--model", "random:tiny"],
                 ["serve", "random:tiny", "--model", "random:tiny"]):
        args = build_parser().parse_args(argv)
        resolve_api_args(args)
        assert args.model == "random:tiny", argv
    assert main(["serve", "random:a", "--model", "random:b", "--port", "1"]) == 2


def test_serve_refuses_a_chat_template_that_is_neither_a_file_nor_jinja(capsys, tmp_path: Path) -> None:
    from graphpool.cli import main

    assert main(["serve", "--chat-template", str(tmp_path / "missing.jinja"), "--port", "1"]) == 2
    assert "is no file" in capsys.readouterr().err
    assert main(["serve", "--chat-template", "{% if %}", "--port", "1"]) == 2
    assert "does not parse" in capsys.readouterr().err
    path = tmp_path / "t.jinja"
    path.write_text(TEMPLATE, encoding="utf-8")
    assert load_chat_template(str(path)) == TEMPLATE == load_chat_template(TEMPLATE)


def test_default_chat_template_kwargs_render_every_chat_unless_it_sets_them(default_model, capsys) -> None:
    from graphpool.server.main import build_parser
    from graphpool.server.prompts import PromptBuilder
    from graphpool.server.protocol import ChatCompletionRequest

    tok = default_model[2]
    builder = PromptBuilder(tok, MAX_MODEL_LEN, ["m"], ChatOptions(TEMPLATE, template_kwargs={"lead": "Paris is"}))
    (inp,), _ = builder.chat(ChatCompletionRequest(messages=CHAT))
    assert tok.decode(inp.prompt, skip_special_tokens=False).endswith("assistant\nParis is")
    (own,), _ = builder.chat(ChatCompletionRequest(messages=CHAT, chat_template_kwargs={"lead": "Rome is"}))
    assert tok.decode(own.prompt, skip_special_tokens=False).endswith("assistant\nRome is")
    with pytest.raises(ValueError, match=r"^--default-chat-template-kwargs: this model's chat template does not read"):
        PromptBuilder(tok, MAX_MODEL_LEN, ["m"], ChatOptions(template_kwargs={"enable_thinking": False}))
    args = build_parser().parse_args(["serve", "--default-chat-template-kwargs", '{"enable_thinking": false}'])
    assert args.default_chat_template_kwargs == {"enable_thinking": False}
    for bad in ("{oops", "[1]"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["serve", "--default-chat-template-kwargs", bad])
    assert "--default-chat-template-kwargs" in capsys.readouterr().err
