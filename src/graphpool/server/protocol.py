"""OpenAI request models (pydantic) and the OpenAI-style error body.

Fields the engine cannot honour are refused with a 400 instead of being silently ignored; fields that do
not change the output (``user``, ``metadata``, ...) are accepted and ignored.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool


class APIError(Exception):
    """An error that the server answers with an OpenAI-style body."""

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        status_code: int = 400,
        type: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.status_code = status_code
        self.type = type

    def body(self) -> dict[str, Any]:
        return error_body(self.message, param=self.param, code=self.code, type=self.type)


def error_body(
    message: str, *, param: str | None = None, code: str | None = None, type: str = "invalid_request_error"
) -> dict[str, Any]:
    # NOTE: a message may quote the request; a lone surrogate in it would break the response's UTF-8.
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class StreamOptions(BaseModel):
    """Other options land in ``model_extra``, refused by name (`refuse_unhonoured`, STREAM_OPTIONS_UNHONOURED)."""

    model_config = ConfigDict(extra="allow", strict=True)
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: every chunk carries the usage so far (with include_usage)


# Fields of OpenAI's API or vLLM's extensions that change the output and that this server does not honour,
# each with the value that changes nothing (sent with that value, the field is accepted).
UNHONOURED_FIELDS: dict[str, Any] = {
    "spaces_between_special_tokens": True, "guided_whitespace_pattern": None,
    "use_beam_search": False,
    "length_penalty": 1.0,
    "logits_processors": None, "functions": None, "function_call": None,
    "prediction": None, "audio": None, "modalities": None, "chat_template": None,
}
# stream_options this server does not honour: OpenAI's random padding in every chunk
STREAM_OPTIONS_UNHONOURED: dict[str, Any] = {"include_obfuscation": False}
# Fields that change nothing in the output (bookkeeping, caching and scheduling hints): accepted and not used.
IGNORED_FIELDS = frozenset({"store", "metadata", "service_tier", "priority", "request_id", "prompt_cache_key",
                            "safety_identifier"})


def refuse_unhonoured(extra: dict[str, Any] | None, unhonoured: dict[str, Any] = UNHONOURED_FIELDS,
                      prefix: str = "") -> None:
    """A 400 naming the first field of a request's `extra` fields (those its model does not declare) that this
    server would not honour: one that `unhonoured` lists, sent with a value that would change the output, or
    any other but `IGNORED_FIELDS` (a typo, another server's knob) sent with a value other than null. `prefix`:
    the path of the object they sit in (`stream_options.`)."""
    for name, value in (extra or {}).items():
        param = f"{prefix}{name}"
        if name in unhonoured:
            if value != unhonoured[name]:
                raise APIError(f"{param} is not supported by this server", param=param)
        elif name not in IGNORED_FIELDS and value is not None:
            raise APIError(f"unknown field {param!r} for this endpoint: this server would not use it", param=param)


MAX_STOP_SEQUENCES = 4  # OpenAI's limit
MAX_N = 128  # OpenAI's limit on choices per request
# NOTE: a 128k-token context as text or as token ids fits well inside the default body limit.
DEFAULT_MAX_REQUEST_BYTES = 4 * 2**20


class _SamplingFields(BaseModel):
    """Fields shared by both endpoints; ranges follow OpenAI's documented limits. Other fields are kept in
    ``model_extra`` and refused by name (`refuse_unhonoured`)."""

    # NOTE: strict: "3" is not 3, nor true 1 (as OpenAI's API answers them: a 400)
    model_config = ConfigDict(extra="allow", strict=True)

    model: str | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    n: int | None = Field(default=None, ge=1, le=MAX_N)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None  # token ids as strings, as OpenAI's API sends them
    user: str | None = None
    # Extensions (vLLM spells them the same way).
    repetition_penalty: float | None = Field(default=None, gt=0.0)
    top_k: int | None = Field(default=None, ge=-1)
    ignore_eos: StrictBool = False
    stop_token_ids: list[int] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    truncate_prompt_tokens: int | None = None  # only the prompt's last k tokens (-1: what leaves room for the output)
    min_tokens: int | None = Field(default=None, ge=0)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    include_stop_str_in_output: StrictBool = False
    skip_special_tokens: StrictBool = True
    prompt_logprobs: int | None = None  # the prompt tokens' logprobs with this many top tokens (server/logprobs.py)
    return_tokens_as_token_ids: StrictBool = False  # logprobs name tokens `token_id:<id>` (server/logprobs.py)
    # Structured output (server/structured.py): OpenAI's response_format, or one of vLLM's guided fields.
    response_format: dict[str, Any] | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    structured_outputs: dict[str, Any] | None = None


class CompletionRequest(_SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16
    echo: StrictBool = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None


# OpenAI's rule for function names (tools[i].function.name, tool_choice, tool_calls in the history).
FUNCTION_NAME_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=FUNCTION_NAME_PATTERN)
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON Schema of the arguments object
    strict: StrictBool | None = None


class FunctionTool(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    function: FunctionDefinition


class CalledFunction(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=FUNCTION_NAME_PATTERN)
    arguments: str  # JSON text of an object, as OpenAI sends it


class MessageToolCall(BaseModel):
    """A call an earlier assistant turn made (a message's `tool_calls[j]`)."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1)
    type: Literal["function"]
    function: CalledFunction


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None  # assistant messages only
    tool_call_id: str | None = None  # tool messages only
    reasoning: str | None = None  # an earlier reply's reasoning (vLLM's name; `reasoning_content` before it)
    reasoning_content: str | None = None


class ChatRenderFields(BaseModel):
    """How a conversation is rendered (vLLM's fields; model/chat_render.py checks them against the template):
    the assistant's turn opened after it, or its final message left open to continue, and more template
    variables (`{"enable_thinking": false}`)."""

    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False
    chat_template_kwargs: dict[str, Any] | None = None


class ChatCompletionRequest(_SamplingFields, ChatRenderFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Any = None  # checked by server/tools.py: a string or a named function, with its own 400s
    parallel_tool_calls: StrictBool | None = None
    include_reasoning: StrictBool = True  # vLLM's: false leaves `reasoning` out (server/reasoning.py)
