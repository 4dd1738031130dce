"""Code ported from vLLM's offline API runs unchanged: `generate(prompts, sampling_params=...)` with one
SamplingParams or one per prompt, prompt dicts, `out.outputs[0].text / token_ids`, `llm.get_tokenizer()`;
graphpool's own names (`params=`, `out.text`) keep working. The default model on CPU."""

from __future__ import annotations

import pytest

from graphpool import LLM, SamplingParams
from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.engine.llm import RequestOutput

PROMPTS = ["The capital of France is", "Once upon a time"]


@pytest.fixture(scope="module")
def llm(default_model) -> LLM:
    config = EngineConfig(device="cpu", max_model_len=128, num_kv_blocks=32)
    return LLM.from_engine(LLMEngine(config, loaded=default_model))


def test_vllm_style_generate_matches_graphpools_own(llm: LLM) -> None:
    greedy = SamplingParams(temperature=0, max_tokens=6)
    own = llm.generate(PROMPTS, greedy, use_tqdm=False)
    ported: list[RequestOutput] = llm.generate(PROMPTS, sampling_params=greedy, use_tqdm=False)
    assert [o.outputs[0].text for o in ported] == [o.text for o in own]
    assert [o.outputs[0].token_ids for o in ported] == [o.token_ids for o in own]
    assert all(len(o.outputs) == 1 and o.outputs[0].index == 0 and o.finished for o in ported)
    assert [o.outputs[0].finish_reason for o in ported] == ["length", "length"]
    assert [o.prompt for o in ported] == PROMPTS and ported[0].request_id != ported[1].request_id
    assert llm.generate(PROMPTS, params=greedy, use_tqdm=False)[1].text == own[1].text
    tok = llm.get_tokenizer()
    assert tok is llm.tokenizer and ported[0].prompt_token_ids == tok.encode(PROMPTS[0])


def test_one_sampling_params_per_prompt_and_prompt_dicts(llm: LLM) -> None:
    short, long = SamplingParams(temperature=0, max_tokens=2), SamplingParams(temperature=0, max_tokens=5)
    outs = llm.generate(PROMPTS, [short, long], use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outs] == [2, 5]
    ids = llm.get_tokenizer().encode(PROMPTS[1])
    dicts = llm.generate([{"prompt": PROMPTS[0]}, {"prompt_token_ids": ids}], sampling_params=long, use_tqdm=False)
    assert dicts[1].outputs[0].token_ids == outs[1].token_ids
    assert dicts[0].outputs[0].token_ids[:2] == outs[0].token_ids
    assert llm.chat([{"role": "user", "content": "Hi"}], sampling_params=short, use_tqdm=False)[0].outputs[0].text


def test_mismatched_params_are_refused_before_any_request(llm: LLM) -> None:
    greedy = SamplingParams(temperature=0, max_tokens=2)
    with pytest.raises(ValueError, match="2 SamplingParams for 1 prompts"):
        llm.generate(PROMPTS[0], [greedy, greedy], use_tqdm=False)
    with pytest.raises(ValueError, match="once"):
        llm.generate(PROMPTS, greedy, params=greedy, use_tqdm=False)
    with pytest.raises(ValueError, match="'prompt' or 'prompt_token_ids'"):
        llm.generate({"text": "hi"}, use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()


def test_chat_takes_vllms_rendering_arguments(llm: LLM) -> None:
    greedy = SamplingParams(temperature=0, max_tokens=4)
    tok = llm.get_tokenizer()
    chat = [{"role": "user", "content": "Name a color."}, {"role": "assistant", "content": "My favourite is"}]
    out = llm.chat(chat, greedy, add_generation_prompt=False, continue_final_message=True, use_tqdm=False)[0]
    assert out.prompt.endswith("<|im_start|>assistant\nMy favourite is")
    assert out.outputs[0].token_ids == llm.generate(out.prompt, greedy, use_tqdm=False)[0].outputs[0].token_ids
    lead = "{% for m in messages %}{{ m.content }}\n{% endfor %}{{ lead }}"
    out = llm.chat(chat[:1], greedy, chat_template=lead, chat_template_kwargs={"lead": "Blue or"}, use_tqdm=False)[0]
    assert out.prompt == "Name a color.\nBlue or" and out.prompt_token_ids == tok.encode(out.prompt, False)
    with pytest.raises(ValueError, match="does not read 'enable_thinking'"):
        llm.chat(chat[:1], greedy, chat_template_kwargs={"enable_thinking": False}, use_tqdm=False)
    with pytest.raises(ValueError, match="add_generation_prompt false"):
        llm.chat(chat, greedy, continue_final_message=True, use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()


def test_truncate_prompt_tokens_keeps_the_prompts_last_tokens(llm: LLM) -> None:
    greedy = SamplingParams(temperature=0, max_tokens=4)
    ids = llm.get_tokenizer().encode(PROMPTS[0] + " and the capital of Spain is Madrid; the capital of Italy is")
    cut = llm.generate(ids, SamplingParams(temperature=0, max_tokens=4, truncate_prompt_tokens=5), use_tqdm=False)[0]
    assert cut.prompt_token_ids == ids[-5:]
    assert cut.outputs[0].token_ids == llm.generate(ids[-5:], greedy, use_tqdm=False)[0].outputs[0].token_ids
    long = (ids * 20)[:200]  # past max_model_len=128: refused unless truncated
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate(long, greedy, use_tqdm=False)
    fit = llm.generate(long, SamplingParams(temperature=0, max_tokens=4, truncate_prompt_tokens=-1), use_tqdm=False)[0]
    assert fit.prompt_token_ids == long[-124:] and len(fit.outputs[0].token_ids) == 4
    with pytest.raises(ValueError, match="truncate_prompt_tokens must be"):
        SamplingParams(truncate_prompt_tokens=0)


def test_chat_renders_tools_through_a_template_that_reads_them(llm: LLM) -> None:
    greedy = SamplingParams(temperature=0, max_tokens=2)
    tool = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
    template = "{{ tools | tojson }}|{% for m in messages %}{{ m.content }}{% endfor %}"
    out = llm.chat([{"role": "user", "content": "Time?"}], greedy, chat_template=template, tools=[tool],
                   use_tqdm=False)[0]
    assert out.prompt.startswith('[{"type": "function", "function": {"name": "get_time"') and out.prompt.endswith("|Time?")
    with pytest.raises(ValueError, match="does not render tools"):
        llm.chat([{"role": "user", "content": "Time?"}], greedy, tools=[tool], use_tqdm=False)
