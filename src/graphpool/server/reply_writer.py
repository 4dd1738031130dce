"""A chat reply written in another API's shape (the Responses API, Anthropic's Messages API) from its parts as they
come: each method returns the stream events to send now, `finish` also the whole response."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from graphpool.engine.outputs import RequestOutput


class ReplyWriter(ABC):
    @abstractmethod
    def start(self) -> list[str]:
        """The events that open the stream."""

    @abstractmethod
    def text(self, kind: str, delta: str) -> list[str]:
        """More of the reasoning (`kind` "reasoning") or of the answer ("message")."""

    @abstractmethod
    def finish(self, last: RequestOutput, usage: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
        """The closing events and the whole response."""

    @abstractmethod
    def error(self, message: str) -> str:
        """The event that ends a stream whose engine failed."""

    @abstractmethod
    def _close(self) -> list[str]:
        """The events that close the part whose text is still coming, if any."""

    @abstractmethod
    def _call(self, call: dict[str, Any]) -> list[str]:
        """One whole tool call (a chat `tool_calls` entry) as the API writes it."""

    def calls(self, calls: list[dict[str, Any]]) -> list[str]:
        """Whole tool calls, after the part still open."""
        if not calls:
            return []
        events = self._close()
        for call in calls:
            events += self._call(call)
        return events
