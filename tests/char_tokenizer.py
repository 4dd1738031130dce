"""A tokenizer for scripted servers: one token a character (its code point), a chat template of role tags."""

from __future__ import annotations

from typing import Any


class CharTokenizer:
    eos_token_ids = ()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids)

    def apply_chat_template(self, messages: list[dict[str, Any]], **_: object) -> list[int]:
        return self.encode("".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>")
