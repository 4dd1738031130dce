"""Chat templates rendered by graphpool's renderer (model/chat_render.py) and by transformers' apply_chat_template,
compared: every `*.jinja` of a folder, three conversations (plain, multi-turn with a system prompt, a tool call
and its result), with and without tools, with and without the generation prompt.

    .venv/bin/python scripts/chat_template_parity.py FOLDER

The special tokens are the default model's. Prints one line per template and exits 1 on any difference; a
template that raises in both counts as equal.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from graphpool.model.tokenizer_cache import PROBE_TOOLS as TOOLS

CHATS = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Weather in Paris?"}],
    [{"role": "user", "content": "Weather in Paris?"},
     {"role": "assistant", "content": "", "tool_calls": [
         {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
     {"role": "tool", "content": "sunny"}],
]


def _outcome(render: Callable[..., str], *args: Any, **kwargs: Any) -> str:
    import jinja2

    try:
        return render(*args, **kwargs)
    except (ValueError, TypeError, jinja2.TemplateError) as e:
        return f"raises {type(e).__name__}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    args = parser.parse_args()
    from graphpool.model.gguf_loader import default_gguf_path, gguf_tokenizer_metadata, open_gguf
    from graphpool.model.tokenizer import tokenizer_from_gguf_metadata
    from graphpool.model.tokenizer_backend import BackendTokenizer

    path = default_gguf_path()
    reference = tokenizer_from_gguf_metadata(gguf_tokenizer_metadata(open_gguf(path)), path, ())
    ours = BackendTokenizer.from_hf(reference.hf, reference.eos_token_ids)
    files = sorted(args.folder.glob("*.jinja"))
    differing = 0
    for file in files:
        template = file.read_text()
        cases = [(chat, tools, prompt) for chat in CHATS for tools in (None, TOOLS) for prompt in (True, False)]
        diffs = sum(
            _outcome(reference.hf.apply_chat_template, chat, chat_template=template, tokenize=False,
                     add_generation_prompt=prompt, tools=tools)
            != _outcome(ours.render_chat, chat, template, add_generation_prompt=prompt, tools=tools)
            for chat, tools, prompt in cases
        )
        differing += diffs
        print(f"{file.name}: {len(cases) - diffs}/{len(cases)} equal")
    print(f"{len(files)} templates, {differing} renders differ")
    return 1 if differing or not files else 0


if __name__ == "__main__":
    sys.exit(main())
