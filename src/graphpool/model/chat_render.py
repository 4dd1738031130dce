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
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

_REASONING_NAMES = ("reasoning_content", "thinking", "reasoning")


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


@functools.lru_cache(maxsize=32)
def compile_template(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


def _with_reasoning_aliases(message: Any) -> Any:
    """A message's reasoning under every name a template may read it by (`thinking`, `reasoning_content`)."""
    if not isinstance(message, Mapping):
        return message
    reasoning = next((message[k] for k in _REASONING_NAMES if message.get(k) is not None), None)
    return {"thinking": reasoning, **message, "reasoning_content": reasoning} if reasoning is not None else message


def render_chat(source: str, messages: Sequence[Any], special_tokens: Mapping[str, str], *,
                add_generation_prompt: bool, tools: list[dict[str, Any]] | None = None) -> str:
    """`messages` through the template `source`; `special_tokens` (bos_token, eos_token, ...) are its variables.
    Raises jinja2.TemplateError where the template does (its `raise_exception`) or cannot be parsed."""
    for message in messages:
        if not isinstance(message, Mapping):
            raise ValueError(f"chat messages must be objects, got {message!r}")
    return compile_template(source).render(
        **special_tokens, messages=[_with_reasoning_aliases(m) for m in messages], tools=tools, documents=None,
        add_generation_prompt=add_generation_prompt,
    )
