"""From an OpenAI request to the engine's inputs: prompts, token counts and SamplingParams (or an APIError)."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import jinja2

from graphpool.engine.admission import truncate_prompt
from graphpool.engine.generation_defaults import SamplingDefaults
from graphpool.engine.guided import GuidedDecoding
from graphpool.engine.sampling_params import InvalidParam, SamplingParams, child_seed
from graphpool.model.chat_render import ChatRequestError, check_template_vars
from graphpool.server.chat_options import DEFAULT_CHAT, ChatOptions
from graphpool.server.logprobs import check_logprobs
from graphpool.server.protocol import (
    APIError,
    ChatCompletionRequest,
    ChatMessage,
    ChatRenderFields,
    CompletionRequest,
    FunctionTool,
)
from graphpool.server.reasoning import ReasoningPlan, reasoning_format
from graphpool.server.request_fields import check_fields, check_text_param, sampling_params
from graphpool.server.structured import guided_decoding
from graphpool.server.tool_parsers import ToolParser
from graphpool.server.tool_prompt import fallback_messages, history_messages, tool_setup
from graphpool.server.tools import ToolPlan, forced_call_guided, plan_tools, strict_calls_guided

if TYPE_CHECKING:
    from graphpool.engine.grammar import Grammars


@dataclass(frozen=True)
class ChatPlan:
    """How a chat request's replies are read: tool calls, and reasoning apart (None: all content)."""

    tools: ToolPlan
    reasoning: ReasoningPlan | None


@dataclass(frozen=True)
class EngineInput:
    prompt: list[int]  # what engine.add_request gets
    prompt_text: str  # for echo (completions only)
    num_prompt_tokens: int
    params: SamplingParams


class PromptBuilder:
    """Checks a request against the model (name, context length) and builds the engine's input."""

    def __init__(self, tokenizer: Any, max_model_len: int, served_model_names: list[str],
                 chat: ChatOptions = DEFAULT_CHAT, grammars: Grammars | None = None,
                 defaults: SamplingDefaults | None = None) -> None:
        """A ValueError for options the model cannot take (a parser without its markers, default template
        variables its template does not read)."""
        self.tokenizer = tokenizer
        self.defaults = defaults or SamplingDefaults()  # for fields a request leaves unset (the model's, or ours)
        self.max_model_len = max_model_len
        self.served_model_names = served_model_names
        self.chat_template = chat.chat_template  # --chat-template's source; None: the model's own
        self.grammars = grammars  # the engine's compiled-grammar cache; None: output constraints are refused
        tools = tool_setup(tokenizer, chat.chat_template, chat.tool_call_parser)
        self.parser: ToolParser = tools.parser
        self.template_reads_tools, self.keep_special_tokens = tools.template_reads_tools, tools.keep_special_tokens
        self.reasoning = reasoning_format(tokenizer, chat.chat_template, chat.reasoning_parser)
        self.template_kwargs = dict(chat.template_kwargs)
        if self.template_kwargs:
            source = self.need_tokenizer().chat_template_source(chat.chat_template)
            try:
                check_template_vars(source or "", self.template_kwargs)
            except ChatRequestError as e:
                raise ValueError(f"--default-chat-template-kwargs: {str(e).removeprefix('chat_template_kwargs: ')}"
                                 ) from None

    # ---- per endpoint ----
    def completion(self, req: CompletionRequest) -> list[EngineInput]:
        """`n` inputs per prompt (`prompt` may be a list of strings or of token-id lists), in choice order."""
        self.check_model(req.model)
        check_fields(req)
        check_logprobs(req.logprobs, "logprobs")
        if req.best_of is not None and req.best_of != (req.n or 1):
            raise APIError(f"best_of must equal n (got best_of={req.best_of}, n={req.n or 1}): this server returns "
                           "every sequence it generates and does not rank them", param="best_of")
        if req.suffix:
            raise APIError("suffix is not supported by this server", param="suffix")
        prompts = _prompts(req.prompt)
        max_tokens = 16 if req.max_tokens is None else req.max_tokens
        guided = self.guided(req)
        inputs = []
        for i, prompt in enumerate(prompts):
            param = "prompt" if len(prompts) == 1 else f"prompt[{i}]"
            if isinstance(prompt, str):
                ids = self.encode(prompt, param=param)
                text = prompt
            else:
                ids = prompt
                text = self._echo_text(prompt, param) if req.echo else ""
            kept = truncate_prompt(ids, req.truncate_prompt_tokens, self.max_model_len, max_tokens)
            if len(kept) < len(ids):  # NOTE: an echo gives the prompt the model saw
                ids, text = kept, (self._echo_text(kept, param) if req.echo else "")
            params = sampling_params(req, len(ids), max_tokens, guided, self.defaults, self.max_model_len, param)
            # NOTE: token ids, tokenized exactly as engine.encode does (the tokenizer's default special tokens).
            inputs += fan_out(EngineInput(prompt=ids, prompt_text=text, num_prompt_tokens=len(ids), params=params),
                              req.n or 1)
        return inputs

    def chat(self, req: ChatCompletionRequest) -> tuple[list[EngineInput], ChatPlan]:
        """`n` inputs of the conversation, one per choice, and the plan their replies are read with."""
        self.check_model(req.model)
        check_fields(req)
        check_logprobs(req.top_logprobs, "top_logprobs")
        if req.top_logprobs and not req.logprobs:
            raise APIError("top_logprobs needs logprobs: true", param="top_logprobs")
        plan = plan_tools(req.tools, req.tool_choice, req.parallel_tool_calls, self.parser)
        guided = self.guided(req)
        if plan.strict:
            if not plan.parser.supports_strict:
                raise APIError(f"tools with strict: true are not supported with the {plan.parser.name} tool-call "
                               "format (its arguments are not one JSON object to constrain)", param="tools")
            if guided is not None:
                raise APIError("tools with strict: true take no other output constraint (they constrain the calls "
                               "the model makes)", param="tools")
            guided = self._compiled(strict_calls_guided(plan), "tools")
        if plan.mode == "forced":
            if guided is not None:
                raise APIError("a tool_choice that forces a call takes no other output constraint",
                               param="tool_choice")
            try:
                guided = self._compiled(forced_call_guided(plan), "tool_choice")
            except APIError:
                self._compile_each_tool(req.tools)  # NOTE: names the tool whose parameters do not compile
                raise
        ids = self.render_chat(self.chat_messages(req.messages, req.tools), req, tools=plan.prompt_tools)
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        ids = truncate_prompt(ids, req.truncate_prompt_tokens, self.max_model_len, max_tokens or 1)
        if max_tokens is None:  # NOTE: OpenAI's chat default: as many tokens as the context leaves
            max_tokens = max(self.max_model_len - len(ids), 1)
        params = sampling_params(req, len(ids), max_tokens, guided, self.defaults, self.max_model_len)
        reasoning = self._reasoning(req, ids, guided)
        marked = reasoning is not None and self.reasoning is not None and self.reasoning.keep_special_tokens
        if (plan.mode != "none" and self.keep_special_tokens) or marked:
            params = replace(params, skip_special_tokens=False)  # a call or reasoning marker is a special token
        inp = EngineInput(prompt=ids, prompt_text="", num_prompt_tokens=len(ids), params=params)
        return fan_out(inp, req.n or 1), ChatPlan(plan, reasoning)

    def _reasoning(self, req: ChatCompletionRequest, ids: list[int],
                   guided: GuidedDecoding | None) -> ReasoningPlan | None:
        """How the reply's reasoning is told apart: none without a reasoning format, nor under an output
        constraint that holds from the reply's first token (the reply is all content; strict tools' does not)."""
        if self.reasoning is None:
            if not req.include_reasoning:
                raise APIError("include_reasoning: this server tells no reasoning apart from the answer "
                               "(--reasoning-parser)", param="include_reasoning")
            return None
        if guided is not None and guided.kind != "structural_tag":  # NOTE: strict tools leave free text free
            return None
        return self.reasoning.plan(ids, req.include_reasoning)

    # ---- pieces ----
    def guided(self, req: CompletionRequest | ChatCompletionRequest) -> GuidedDecoding | None:
        """The request's output constraint, compiled (and cached) now, before the request is admitted."""
        found = guided_decoding(req)
        return None if found is None else self._compiled(*found)

    def _compiled(self, guided: GuidedDecoding, param: str) -> GuidedDecoding:
        if self.grammars is None:
            raise APIError(f"{param}: this server's engine has no grammar support", param=param)
        try:
            self.grammars.compile(guided)
        except InvalidParam as e:
            raise APIError(f"{param}: {e}", param=param) from None
        return guided

    def _compile_each_tool(self, tools: list[FunctionTool] | None) -> None:
        for i, tool in enumerate(tools or ()):
            if tool.function.parameters is not None:
                spec = json.dumps(tool.function.parameters)
                self._compiled(GuidedDecoding(kind="json_schema", spec=spec), f"tools[{i}].function.parameters")

    def chat_messages(self, messages: list[ChatMessage],
                      tools: list[FunctionTool] | None = None) -> list[dict[str, Any]]:
        """The messages as the chat template takes them (text, valid Unicode, not too long; tool-call history
        checked), with `tools` counted in the length."""
        texts = [message_text(m, i) for i, m in enumerate(messages)]
        for i, text in enumerate(texts):
            check_text_param(text, f"messages[{i}].content")
            for j, call in enumerate(messages[i].tool_calls or ()):
                check_text_param(call.function.arguments, f"messages[{i}].tool_calls[{j}].function.arguments")
            for name in ("reasoning", "reasoning_content"):
                if getattr(messages[i], name) is not None:
                    check_text_param(getattr(messages[i], name), f"messages[{i}].{name}")
        tools_text = json.dumps([t.model_dump(exclude_none=True) for t in tools or ()], ensure_ascii=False)
        check_text_param(tools_text, "tools")
        args = sum(len(c.function.arguments) for m in messages for c in m.tool_calls or ())
        args += sum(len(m.reasoning or m.reasoning_content or "") for m in messages)
        self.check_text_length(sum(map(len, texts)) + args + len(tools_text), "messages")
        return history_messages(messages, texts, self.parser)

    def check_model(self, model: str | None) -> None:
        if model is not None and model not in self.served_model_names:
            raise APIError(
                f"The model `{model}` does not exist; this server serves {self.served_model_names}",
                param="model",
                code="model_not_found",
            )

    # ---- tokenizer ----
    def need_tokenizer(self, param: str = "prompt") -> Any:
        if self.tokenizer is None:
            raise APIError(
                "this model has no tokenizer: send the prompt as a list of token ids", param=param
            )
        return self.tokenizer

    def encode(self, text: str, add_special_tokens: bool = True, param: str = "prompt") -> list[int]:
        """`text` as token ids (checked: valid Unicode, not too long for any tokenization)."""
        check_text_param(text, param)
        tok = self.need_tokenizer()
        self.check_text_length(len(text), param)
        return list(tok.encode(text, add_special_tokens=add_special_tokens))

    def check_text_length(self, num_chars: int, param: str) -> None:
        """Refuses, without tokenizing, a text too long to fit max_model_len tokens whatever it says: a huge
        prompt costs no tokenizer time (the bound has a factor of 2 for normalizers that merge characters)."""
        most = 2 * self.max_model_len * getattr(self.tokenizer, "max_token_chars", 1 << 20)
        if num_chars > most:
            raise APIError(
                f"the prompt has {num_chars} characters, more than any prompt of max_model_len="
                f"{self.max_model_len} tokens can have: shorten it", param=param,
            )

    def _decode(self, ids: list[int]) -> str:
        return self.need_tokenizer().decode(ids) if self.tokenizer is not None else ""

    def _echo_text(self, ids: list[int], param: str) -> str:
        try:
            return self._decode(ids)
        except (OverflowError, TypeError) as e:  # NOTE: an id the tokenizer cannot hold (negative, past 2**32)
            raise APIError(f"prompt token ids must be ints in the vocabulary ({e})", param=param) from None

    def render_chat(self, messages: list[dict[str, Any]], fields: ChatRenderFields, add_special_tokens: bool = False,
                    tools: list[dict[str, Any]] | None = None) -> list[int]:
        """The conversation through the chat template (--chat-template's, else the model's), as LLM.chat does,
        rendered as the request's `fields` ask; `tools` through the template, or the fallback system prompt when
        the template reads no tools."""
        tok = self.need_tokenizer()
        extra: dict[str, Any] = {}
        if self.template_reads_tools:
            extra = {"tools": tools} if tools else {}
        else:
            messages = fallback_messages(messages, tools, self.parser)
        template_vars = {**self.template_kwargs, **(fields.chat_template_kwargs or {})}
        try:
            return list(tok.apply_chat_template(
                messages, chat_template=self.chat_template, add_generation_prompt=fields.add_generation_prompt,
                add_special_tokens=add_special_tokens, template_vars=template_vars,
                continue_final_message=fields.continue_final_message, **extra))
        except ChatRequestError as e:
            raise APIError(str(e), param=e.field) from None
        except (ValueError, jinja2.TemplateError) as e:
            raise APIError(f"cannot apply the chat template: {e}", param="messages") from None


def _prompts(prompt: str | list[str] | list[int] | list[list[int]]) -> list[str | list[int]]:
    """A completion's prompts: a string, a token-id list, or a non-empty list of either (one choice each)."""
    if isinstance(prompt, str):
        if not prompt:
            raise APIError("prompt must not be empty", param="prompt")
        return [prompt]
    if len(prompt) == 0:
        raise APIError("prompt must not be empty", param="prompt")
    if all(isinstance(t, int) for t in prompt):
        return [list(prompt)]  # type: ignore[arg-type]
    items: list[str | list[int]] = [p if isinstance(p, str) else list(p) for p in prompt]  # type: ignore[union-attr]
    for i, p in enumerate(items):
        if len(p) == 0:
            raise APIError(f"prompt[{i}] must not be empty", param=f"prompt[{i}]")
    return items


def fan_out(inp: EngineInput, n: int) -> list[EngineInput]:
    """`n` copies of a prompt's input, one per choice; with a seed, choice i draws from `child_seed(seed, i)`."""
    if n == 1:
        return [inp]
    seed = inp.params.seed
    return [inp if seed is None else replace(inp, params=replace(inp.params, seed=child_seed(seed, i)))
            for i in range(n)]


def message_text(m: ChatMessage, index: int) -> str:
    """A message's content as text (text parts joined; none: empty)."""
    if m.content is None:
        content = ""
    elif isinstance(m.content, str):
        content = m.content
    else:
        parts = []
        for part in m.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise APIError(
                    f"messages[{index}].content: only text parts are supported, got type {part.get('type')!r}",
                    param=f"messages[{index}].content",
                )
            parts.append(part["text"])
        content = "".join(parts)
    return content
