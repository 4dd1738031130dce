"""Chat templates rendered with jinja2 the way transformers renders them: a sandbox, trim_blocks and lstrip_blocks,
loop controls, a `tojson` that does not escape HTML, `raise_exception`, `strftime_now`, a `{% generation %}` block
that renders its body, the special tokens as variables, and reasoning under each of its names. A tokenizer built
without transformers renders with this (model/tokenizer_backend.py); model/tokenizer_cache.py keeps such a tokenizer
only after it rendered its probe chats exactly as transformers did."""

from __future__ import annotations

import datetime
import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

_REASONING_NAMES = ("reasoning_content", "thinking", "reasoning")
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# NOTE: the variables the renderer sets itself: a request's template variables may not replace them
RENDERER_NAMES = frozenset({"messages", "tools", "documents", "add_generation_prompt", "raise_exception",
                            "strftime_now", *SPECIAL_TOKEN_NAMES})


class ChatRequestError(ValueError):
    """A chat request's rendering options that its template cannot take; `field` names the option."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (training templates mark the assistant's tokens): its body."""

    tags: ClassVar[set[str]] = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return str(caller())


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


@functools.cache
def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


@functools.lru_cache(maxsize=32)
def compile_template(source: str) -> jinja2.Template:
    return _environment().from_string(source)


@functools.lru_cache(maxsize=32)
def _read_names(source: str) -> frozenset[str]:
    env = _environment()
    return frozenset(jinja2.meta.find_undeclared_variables(env.parse(source))) - set(env.globals)


def template_variables(source: str) -> frozenset[str]:
    """The variables a template reads that the renderer does not set: those a request may set
    (`enable_thinking`, `date_string`, ...)."""
    return _read_names(source) - RENDERER_NAMES


def template_reads(source: str | None, name: str) -> bool:
    """Whether the template reads the variable `name` (`tools`: it renders tools itself); False for no template
    or one that does not parse."""
    if not source:
        return False
    try:
        return name in _read_names(source)
    except jinja2.TemplateSyntaxError:
        return False


def check_template_vars(source: str, template_vars: Mapping[str, Any]) -> None:
    """Raises ChatRequestError for a variable the renderer sets itself or that the template never reads (it
    would change nothing: a typo, or a switch of another model's template)."""
    readable = template_variables(source)
    for name in template_vars:
        if name in RENDERER_NAMES:
            raise ChatRequestError(f"chat_template_kwargs: {name!r} is set by the server, not by the request",
                                   "chat_template_kwargs")
        if name not in readable:
            reads = ", ".join(sorted(readable)) or "none"
            raise ChatRequestError(f"chat_template_kwargs: this model's chat template does not read {name!r} "
                                   f"(the variables it reads: {reads})", "chat_template_kwargs")


def check_continuation(messages: Sequence[Any], add_generation_prompt: bool) -> str:
    """The text of the final message that `continue_final_message` leaves open (ChatRequestError if none)."""
    if add_generation_prompt:
        raise ChatRequestError("continue_final_message continues the final message: it needs "
                               "add_generation_prompt false (a new turn would start after it)",
                               "continue_final_message")
    content = messages[-1].get("content") if messages and isinstance(messages[-1], Mapping) else None
    if not isinstance(content, str) or not content.strip():
        raise ChatRequestError("continue_final_message needs a final message with text to continue",
                               "continue_final_message")
    return content


def cut_after(rendered: str, final: str) -> str:
    """The rendered chat up to the end of the final message's text (what closes its turn dropped), found as
    written or, for templates that trim content, stripped."""
    for text in (final, final.strip()):
        end = rendered.rfind(text)
        if end >= 0:
            return rendered[:end + len(text)]
    raise ChatRequestError("continue_final_message: the chat template does not render the final message's "
                           "text as given, so it cannot be continued", "continue_final_message")


def _with_reasoning_aliases(message: Any) -> Any:
    """A message's reasoning under every name a template may read it by (`thinking`, `reasoning_content`)."""
    if not isinstance(message, Mapping):
        return message
    reasoning = next((message[k] for k in _REASONING_NAMES if message.get(k) is not None), None)
    return {"thinking": reasoning, **message, "reasoning_content": reasoning} if reasoning is not None else message


def render_chat(source: str, messages: Sequence[Any], special_tokens: Mapping[str, str], *,
                add_generation_prompt: bool, tools: list[dict[str, Any]] | None = None,
                template_vars: Mapping[str, Any] | None = None) -> str:
    """`messages` through the template `source`; `special_tokens` (bos_token, eos_token, ...) and `template_vars`
    (checked by the caller: `check_template_vars`) are its variables. Raises jinja2.TemplateError where the
    template does (its `raise_exception`) or cannot be parsed."""
    for message in messages:
        if not isinstance(message, Mapping):
            raise ValueError(f"chat messages must be objects, got {message!r}")
    return compile_template(source).render(
        **(template_vars or {}), **special_tokens, messages=[_with_reasoning_aliases(m) for m in messages],
        tools=tools, documents=None, add_generation_prompt=add_generation_prompt,
    )
