"""What the other APIs' translations into a chat request share (the Responses API, Anthropic's Messages API):
their text content joined, their fields copied under chat's names, and a refused chat field named back as they
spell it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from graphpool.server.protocol import APIError


def joined_text(content: Any, param: str, kinds: tuple[str, ...]) -> str:
    """A content as text: a string, or parts of the `kinds` types joined (any other part is a 400)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise APIError(f"{param} must be a string or a list of text parts", param=param)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in kinds or not isinstance(part.get("text"), str):
            raise APIError(f"{param}[{j}]: only text parts are supported here, got type {kind!r}",
                           param=f"{param}[{j}]")
        texts.append(part["text"])
    return "".join(texts)


def copied(req: Any, names: Mapping[str, str]) -> dict[str, Any]:
    """The request's fields that are set, under chat's names (`names`: chat's name -> the request's)."""
    return {ours: getattr(req, theirs) for ours, theirs in names.items() if getattr(req, theirs) is not None}


def named_back(param: str | None, renames: Mapping[str, str], conversation: str) -> str | None:
    """A chat field's name as the other API spells it: `renames` (chat's -> its) of a field and what follows,
    `conversation` for anything in chat's messages (they are not its items one for one), a tool's field
    without chat's `.function`."""
    if param is None:
        return None
    if param.startswith("messages"):
        return conversation
    for chat, ours in renames.items():
        if param.startswith(chat):
            return ours + param[len(chat):]
    return param.replace(".function.", ".", 1) if param.startswith("tools[") else param
