"""A completion or chat request's own fields: checked (what the server cannot honour is refused by name) and
turned into the engine's SamplingParams once the prompt's length is known; every failure an APIError."""

from __future__ import annotations

from graphpool.engine.generation_defaults import SamplingDefaults
from graphpool.engine.guided import GuidedDecoding
from graphpool.engine.sampling_params import InvalidParam, SamplingParams, check_text, check_truncate
from graphpool.server.logprobs import prompt_ask
from graphpool.server.protocol import (
    MAX_STOP_SEQUENCES,
    STREAM_OPTIONS_UNHONOURED,
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    refuse_unhonoured,
)

Request = CompletionRequest | ChatCompletionRequest


def check_fields(req: Request) -> None:
    """The fields that need no prompt: refused when the server would not honour them."""
    refuse_unhonoured(req.model_extra)
    try:
        check_truncate(req.truncate_prompt_tokens)
    except InvalidParam as e:
        raise APIError(str(e), param=e.param) from None
    if req.stream_options is not None:
        if not req.stream:
            raise APIError("stream_options needs stream: true", param="stream_options")
        refuse_unhonoured(req.stream_options.model_extra, STREAM_OPTIONS_UNHONOURED, prefix="stream_options.")
        if req.stream_options.continuous_usage_stats and not req.stream_options.include_usage:
            raise APIError("stream_options.continuous_usage_stats needs include_usage: true",
                           param="stream_options.continuous_usage_stats")
    prompt_ask(req)  # NOTE: checked before any tokenizing
    if isinstance(req.stop, list) and len(req.stop) > MAX_STOP_SEQUENCES:
        raise APIError(f"stop takes at most {MAX_STOP_SEQUENCES} sequences, got {len(req.stop)}", param="stop")


def sampling_params(
    req: Request,
    num_prompt_tokens: int,
    max_tokens: int,
    guided: GuidedDecoding | None,
    defaults: SamplingDefaults,
    max_model_len: int,
    prompt_param: str = "prompt",
) -> SamplingParams:
    """The request's SamplingParams for a prompt of `num_prompt_tokens` (the context checked first); fields the
    request leaves unset take `defaults`."""
    chat = isinstance(req, ChatCompletionRequest)
    name = "max_completion_tokens" if chat and req.max_completion_tokens is not None else "max_tokens"
    prompt_param = "messages" if chat else prompt_param
    if num_prompt_tokens == 0:
        raise APIError("prompt must not be empty", param=prompt_param)
    if max_tokens < 1:
        raise APIError(f"{name} must be at least 1, got {max_tokens}", param=name)
    if num_prompt_tokens > max_model_len:
        raise APIError(
            f"The prompt has {num_prompt_tokens} tokens, more than this model's maximum context "
            f"length of {max_model_len} tokens",
            param=prompt_param,
            code="context_length_exceeded",
        )
    if num_prompt_tokens + max_tokens > max_model_len:
        raise APIError(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{num_prompt_tokens + max_tokens} tokens ({num_prompt_tokens} in the prompt, {max_tokens} "
            f"in the completion). Please reduce the prompt or {name}.",
            param=name,
            code="context_length_exceeded",
        )
    stop = [req.stop] if isinstance(req.stop, str) else (req.stop or None)
    for s in stop or ():
        check_text_param(s, "stop")
    try:
        # NOTE: top_k -1 is vLLM's "off", as explicit as any other value
        sampling = defaults.resolve(temperature=req.temperature, top_p=req.top_p, min_p=req.min_p,
                                    top_k=None if req.top_k is None else max(req.top_k, 0),
                                    repetition_penalty=req.repetition_penalty)
        return SamplingParams(
            **sampling,
            max_tokens=max_tokens,
            seed=req.seed,
            stop=stop,
            stop_token_ids=req.stop_token_ids or None,
            ignore_eos=req.ignore_eos,
            presence_penalty=req.presence_penalty or 0.0,
            frequency_penalty=req.frequency_penalty or 0.0,
            min_tokens=req.min_tokens or 0,
            include_stop_str_in_output=req.include_stop_str_in_output,
            skip_special_tokens=req.skip_special_tokens,
            logprobs=_engine_logprobs(req),
            prompt_logprobs=prompt_ask(req).engine_k,
            guided=guided,
            logit_bias=_logit_bias(req.logit_bias),
            allowed_token_ids=req.allowed_token_ids,
            truncate_prompt_tokens=req.truncate_prompt_tokens,
            bad_words=req.bad_words,
        )
    except InvalidParam as e:
        raise APIError(str(e), param=e.param) from None


def check_text_param(text: str, param: str) -> None:
    """Text the tokenizer can take (valid Unicode), or a 400 naming `param`."""
    try:
        check_text(text, param)
    except InvalidParam as e:
        raise APIError(str(e), param=e.param) from None


def _engine_logprobs(req: Request) -> int | None:
    """SamplingParams.logprobs: how many top logprobs per token, None for none at all."""
    if isinstance(req, CompletionRequest):
        return req.logprobs
    return (req.top_logprobs or 0) if req.logprobs else None


def _logit_bias(bias: dict[str, float] | None) -> dict[int, float] | None:
    """OpenAI's logit_bias (token ids as strings) with int keys."""
    if not bias:
        return None
    bad = next((k for k in bias if not (k.isascii() and k.isdigit() and len(k) <= 12)), None)
    if bad is not None:
        raise APIError(f"logit_bias keys must be token ids (decimal digits), got {bad!r}", param="logit_bias")
    return {int(k): v for k, v in bias.items()}
