"""The offline Python API: `LLM(model=...).generate(prompts, SamplingParams(...))`."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from graphpool.engine.config import DEFAULT_MODEL, EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.engine.llm_outputs import (
    CompletionOutput,
    Logprob,
    RequestOutput,
    SequenceOutput,
    prompt_logprob_dicts,
    token_texts,
)
from graphpool.engine.sampling_params import SamplingParams, check_text
from graphpool.model.chat_render import template_reads
from graphpool.pool import PoolStats

Messages = Sequence[Mapping[str, str]]
Params = SamplingParams | Sequence[SamplingParams] | None
Prompt = str | list[int] | Mapping[str, Any]  # a Mapping: vLLM's {"prompt": text} or {"prompt_token_ids": ids}

__all__ = ["LLM", "CompletionOutput", "Logprob", "RequestOutput", "SequenceOutput"]


class LLM:
    """Load a model once, then generate for batches of prompts (continuous batching inside).

    Keyword arguments are EngineConfig fields (max_graph_pool_size, graph_max_batch_size, graph_memory_budget,
    disable_cudagraph, max_model_len, num_kv_blocks, tensor_parallel_size, ...); `LLM.from_config` takes an
    EngineConfig built elsewhere (the command line's). With tensor_parallel_size > 1 use it as a context
    manager (or call `close()`) so that the other ranks' processes stop.
    """

    def __init__(self, model: str = DEFAULT_MODEL, **kwargs: Any) -> None:
        fields = EngineConfig.__dataclass_fields__
        unknown = sorted(set(kwargs) - set(fields))
        if unknown:
            raise ValueError(f"unknown LLM settings {unknown}; accepted: {sorted(f for f in fields if f != 'model')}")
        self.engine = LLMEngine(EngineConfig(model=model, **kwargs))
        self._counter = 0

    @classmethod
    def from_config(cls, config: EngineConfig) -> LLM:
        """Load the model of a validated EngineConfig (as built once from the command line's flags)."""
        return cls.from_engine(LLMEngine(config))

    @classmethod
    def from_engine(cls, engine: LLMEngine) -> LLM:
        """Wrap an engine built elsewhere (for example over an already loaded model)."""
        llm = cls.__new__(cls)
        llm.engine = engine
        llm._counter = 0
        return llm

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    def get_tokenizer(self) -> Any:
        """The model's tokenizer (vLLM's spelling of `llm.tokenizer`)."""
        return self.engine.tokenizer

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: Params = None,
        use_tqdm: bool = True,
        *,
        params: Params = None,
    ) -> list[CompletionOutput]:
        """One result per prompt, in input order. Text prompts are tokenized as the model's tokenizer does
        by default (no chat template); a list of ints is one token-id prompt; vLLM's {"prompt": text} and
        {"prompt_token_ids": ids} dicts are taken too. `sampling_params` (or `params`, graphpool's older
        name): one SamplingParams for all prompts, or a list of one per prompt; None: the defaults
        (`get_default_sampling_params()`: the model's generation_config.json's sampling fields, if any)."""
        if isinstance(prompts, (str, Mapping)) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        items: list[Any] = [_prompt_input(p) for p in prompts]  # type: ignore[union-attr]
        chosen = _one_of(sampling_params, params)
        return self._run(items, [self.engine.encode(p) for p in items], chosen, use_tqdm)

    def chat(
        self,
        messages: Messages | Sequence[Messages],
        sampling_params: Params = None,
        use_tqdm: bool = True,
        *,
        params: Params = None,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[CompletionOutput]:
        """One conversation (a list of {"role", "content"} dicts) or a list of them, through the chat template
        (`chat_template`: a Jinja source in place of the model's own) as vLLM's `LLM.chat` takes it: the
        assistant's turn opened after it (`add_generation_prompt`), or its final message left open for the model
        to continue (`continue_final_message`); `chat_template_kwargs`: more template variables
        (`{"enable_thinking": False}`), each one the template reads (else ValueError); `tools`: OpenAI function
        tools, rendered by a template that reads them (else ValueError; the text is returned as written)."""
        if self.engine.tokenizer is None:
            raise ValueError(f"model {self.engine.model_name!r} has no tokenizer, so no chat template")
        if not messages:
            raise ValueError("chat needs at least one message")
        conversations = [messages] if isinstance(messages[0], Mapping) else list(messages)
        for conversation in conversations:
            for i, message in enumerate(conversation):  # type: ignore[arg-type]
                for key, value in message.items():
                    if isinstance(value, str):
                        check_text(value, f"messages[{i}].{key}")
        tok = self.engine.tokenizer
        if tools and not template_reads(tok.chat_template_source(chat_template, tools=True), "tools"):
            raise ValueError("tools: this model's chat template does not render tools (it reads no `tools`)")
        token_ids = [tok.apply_chat_template(
            list(c), chat_template, add_generation_prompt, tools=tools or None,  # type: ignore[arg-type]
            template_vars=chat_template_kwargs, continue_final_message=continue_final_message) for c in conversations]
        texts = [self.engine.tokenizer.decode(ids, skip_special_tokens=False) for ids in token_ids]
        return self._run(texts, token_ids, _one_of(sampling_params, params), use_tqdm)

    def get_default_sampling_params(self) -> SamplingParams:
        """What `generate` and `chat` use when given no SamplingParams: graphpool's defaults, under the model's
        generation_config.json sampling fields (`generation_config="auto"`, the default)."""
        return self.engine.sampling_defaults.params()

    def graph_stats(self) -> PoolStats | None:
        return self.engine.graph_stats()

    def close(self) -> None:
        """Stops the other tensor-parallel ranks (`tensor_parallel_size` > 1; a no-op otherwise)."""
        self.engine.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, prompts: list[Any], token_ids: list[list[int]], params: Params,
             use_tqdm: bool) -> list[CompletionOutput]:
        per_prompt = _per_prompt(params, len(token_ids), self.get_default_sampling_params)
        text = token_texts(self.engine.tokenizer)
        ids: list[str] = []
        try:
            for tokens, sp in zip(token_ids, per_prompt, strict=True):
                self._counter += 1
                ids.append(f"llm-{self._counter}")
                self.engine.add_request(ids[-1], tokens, sp)
        except ValueError:
            for rid in ids:
                self.engine.abort_request(rid)
            raise
        index = {rid: i for i, rid in enumerate(ids)}
        results: list[CompletionOutput | None] = [None] * len(ids)
        bar = _progress(len(ids), use_tqdm)
        tokens, start = 0, time.perf_counter()
        shown = start
        try:
            remaining = len(ids)
            while remaining:
                if not self.engine.has_unfinished_requests():
                    raise RuntimeError("the engine has no unfinished requests, but some results are missing")
                outputs = self.engine.step()
                if bar is not None:
                    tokens += sum(len(o.new_token_ids) for o in outputs)
                    now = time.perf_counter()
                    if now - shown > 0.2:
                        bar.set_postfix_str(f"{tokens} tokens, {tokens / (now - start):.1f} tok/s", refresh=True)
                        shown = now
                for out in outputs:
                    if out.finished and out.request_id in index:
                        i = index[out.request_id]
                        k = per_prompt[i].prompt_logprobs
                        prompt_lps = None if k is None or out.prompt_logprobs is None else prompt_logprob_dicts(
                            out.prompt_logprobs, k, text)
                        results[i] = CompletionOutput(prompts[i], out.prompt_token_ids, out.text, out.token_ids,
                                                      out.finish_reason, out.request_id, out.logprobs, prompt_lps,
                                                      out.num_cached_tokens, out.stop_reason)
                        remaining -= 1
                        if bar is not None:
                            bar.update(1)
        finally:
            if bar is not None:
                bar.close()
            for rid, r in zip(ids, results, strict=True):
                if r is None:
                    self.engine.abort_request(rid)
        return results  # type: ignore[return-value]


def _progress(total: int, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="generating", unit="req", dynamic_ncols=True)


def _one_of(sampling_params: Params, params: Params) -> Params:
    if sampling_params is not None and params is not None:
        raise ValueError("give the sampling parameters once, as sampling_params or as params")
    return sampling_params if sampling_params is not None else params


def _per_prompt(params: Params, n: int, defaults: Callable[[], SamplingParams]) -> list[SamplingParams]:
    """One SamplingParams per prompt: the defaults, one for all, or a list of exactly one each."""
    if params is None:
        return [defaults()] * n
    if isinstance(params, SamplingParams):
        return [params] * n
    listed = list(params)
    if len(listed) != n:
        raise ValueError(f"sampling_params holds {len(listed)} SamplingParams for {n} prompts: give one, or one "
                         "per prompt")
    bad = [type(p).__name__ for p in listed if not isinstance(p, SamplingParams)]
    if bad:
        raise ValueError(f"sampling_params must hold SamplingParams, got {bad[0]}")
    return listed


def _prompt_input(prompt: Any) -> str | list[int]:
    """vLLM's prompt dicts to what the engine takes (a text or token ids); other prompts as they are."""
    if not isinstance(prompt, Mapping):
        return prompt  # type: ignore[no-any-return]
    keys = set(prompt)
    if keys == {"prompt"}:
        return prompt["prompt"]  # type: ignore[no-any-return]
    if keys == {"prompt_token_ids"}:
        return list(prompt["prompt_token_ids"])
    raise ValueError(f"a prompt dict takes 'prompt' or 'prompt_token_ids' (one of them), got keys {sorted(keys)}")
