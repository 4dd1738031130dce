"""A chat's rendering options (vLLM's `chat_template_kwargs`, `add_generation_prompt`, `continue_final_message`):
template variables reach the template, and only those it reads are taken; a continued final message is the
rendering cut after its text. Both tokenizers (transformers', and the cached one over `tokenizers` + jinja2) alike."""

from __future__ import annotations

import re

import pytest

from graphpool.model.chat_render import ChatRequestError, template_variables
from graphpool.model.gguf_loader import default_gguf_path, gguf_tokenizer_metadata, open_gguf
from graphpool.model.tokenizer import Tokenizer, tokenizer_from_gguf_metadata
from graphpool.model.tokenizer_backend import BackendTokenizer

# Qwen3's shape: content trimmed, a thinking switch read only with the generation prompt, a date of the caller's
THINKING = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | trim }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and not enable_thinking %}"
    "<think>\n\n</think>\n\n{% endif %}{% endif %}{% if date_string %}[{{ date_string }}]{% endif %}"
)
CHAT = [{"role": "user", "content": "What is 2 + 2?"}]
OPEN = [*CHAT, {"role": "assistant", "content": "The answer is   "}]  # trailing spaces the template trims


@pytest.fixture(scope="module", params=["transformers", "backend"])
def tok(request: pytest.FixtureRequest) -> Tokenizer:
    path = default_gguf_path()
    converted = tokenizer_from_gguf_metadata(gguf_tokenizer_metadata(open_gguf(path)), path, (2,))
    return converted if request.param == "transformers" else BackendTokenizer.from_hf(converted.hf, (2,))


def test_the_variables_a_template_reads_leave_out_the_renderers_own() -> None:
    assert template_variables(THINKING) == {"enable_thinking", "date_string"}
    assert template_variables("{% for x in range(2) %}{{ bos_token }}{{ namespace }}{{ x }}{% endfor %}") == set()


def test_template_variables_reach_the_template(tok: Tokenizer) -> None:
    plain = tok.render_chat(CHAT, THINKING)
    assert plain.endswith("<|im_start|>assistant\n")
    off = tok.render_chat(CHAT, THINKING, template_vars={"enable_thinking": False, "date_string": "5 Dec"})
    assert off == plain + "<think>\n\n</think>\n\n[5 Dec]"
    assert tok.render_chat(CHAT, THINKING, template_vars={"enable_thinking": True}) == plain
    ids = tok.apply_chat_template(CHAT, THINKING, template_vars={"enable_thinking": False})
    assert tok.decode(ids, skip_special_tokens=False) == plain + "<think>\n\n</think>\n\n"


@pytest.mark.parametrize(("variables", "says"), [
    ({"enable_thinkng": False}, "does not read 'enable_thinkng' (the variables it reads: date_string, enable_thinking)"),
    ({"messages": []}, "'messages' is set by the server"),
    ({"add_generation_prompt": False}, "'add_generation_prompt' is set by the server"),
    ({"bos_token": "x"}, "'bos_token' is set by the server"),
])
def test_variables_the_template_cannot_take_are_refused(tok: Tokenizer, variables: dict, says: str) -> None:
    with pytest.raises(ChatRequestError, match=re.escape(says)) as info:
        tok.render_chat(CHAT, THINKING, template_vars=variables)
    assert info.value.field == "chat_template_kwargs"


def test_a_continued_final_message_is_the_rendering_cut_after_its_text(tok: Tokenizer) -> None:
    closed = tok.render_chat(OPEN, THINKING, add_generation_prompt=False)
    assert closed.endswith("The answer is<|im_end|>\n")
    cont = tok.render_chat(OPEN, THINKING, add_generation_prompt=False, continue_final_message=True)
    assert cont == closed[:-len("<|im_end|>\n")]
    # the model's own template, the default model's: its text as written
    own = tok.render_chat([*CHAT, {"role": "assistant", "content": "Four"}], add_generation_prompt=False,
                          continue_final_message=True)
    assert own.endswith("<|im_start|>assistant\nFour")
    ids = tok.apply_chat_template(OPEN, THINKING, add_generation_prompt=False, continue_final_message=True)
    assert tok.decode(ids, skip_special_tokens=False) == cont


@pytest.mark.parametrize(("chat", "generation_prompt", "template", "says"), [
    (OPEN, True, THINKING, "needs add_generation_prompt false"),
    ([*CHAT, {"role": "assistant", "content": "  "}], False, THINKING, "a final message with text"),
    (OPEN, False, "{% for m in messages %}{{ m.content | upper }}{% endfor %}", "does not render the final message"),
])
def test_a_final_message_that_cannot_be_continued_is_refused(tok: Tokenizer, chat: list, generation_prompt: bool,
                                                              template: str, says: str) -> None:
    with pytest.raises(ChatRequestError, match=says) as info:
        tok.render_chat(chat, template, add_generation_prompt=generation_prompt, continue_final_message=True)
    assert info.value.field == "continue_final_message"
