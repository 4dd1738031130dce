"""A model without a tokenizer (random weights, token-id prompts) still streams one chunk per token."""

from __future__ import annotations

import openai

from graphpool import LLM
from graphpool.server.main import serve_in_thread


def test_tokenless_model_streams_a_chunk_per_token() -> None:
    llm = LLM(model="random:smollm2-135m", device="cpu", max_model_len=64, num_kv_blocks=16)
    assert llm.engine.tokenizer is None
    with serve_in_thread(llm.engine) as (base_url, _):
        client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="none", max_retries=0)
        chunks = list(client.completions.create(
            model=llm.engine.model_name, prompt=[5, 17, 42, 7], max_tokens=6, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    choices = [c.choices[0] for c in chunks if c.choices]
    # one chunk per generated token, then the finish chunk; no text without a tokenizer
    assert [c.finish_reason for c in choices] == [None] * 6 + ["length"]
    assert all(c.text == "" for c in choices)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
