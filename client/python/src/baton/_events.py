"""Server-sent events: the line parser and the resume bookkeeping shared by the sync and async
event streams (docs/api.md, "Events").

A stream delivers every event of the namespace once, in revision order: after a lost
connection it reconnects (to the next endpoint when one is down) with ``Last-Event-ID`` set to
the last revision it delivered, and drops any event at or below it. It ends with an error when
the server says the revision is older than the kept window (``NOT_FOUND``) or another definite
refusal, or when no node took it back within the client's retry budget.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ._core import Call, query_string
from .errors import BatonError, ProtocolError, error_from_problem

#: Longest silence (the server sends a comment now and then) before a stream is reopened.
STREAM_IDLE_MAX = 40.0


@dataclass
class SseMessage:
    event: str
    data: str
    id: str | None


class SseParser:
    def __init__(self) -> None:
        self.event: str | None = None
        self.data: list[str] | None = None
        self.id: str | None = None

    def line(self, line: str) -> SseMessage | None:
        line = line.rstrip("\r\n")
        if not line:
            data, event = self.data, self.event
            self.data, self.event = None, None
            if data is None:
                return None
            return SseMessage(event or "message", "\n".join(data), self.id)
        if line.startswith(":"):
            return None  # a comment: the server's keep-alive
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "event":
            self.event = value
        elif name == "data":
            self.data = (self.data or []) + [value]
        elif name == "id":
            self.id = value
        return None


class Resume:
    """Where a follow stands: what it was asked to start after, and what it delivered."""

    def __init__(self, after: int | None) -> None:
        self.start_after = after
        self.delivered = after

    def call(self) -> Call:
        headers = {"Accept": "text/event-stream"}
        if self.delivered is not None and self.delivered != self.start_after:
            headers["Last-Event-ID"] = str(self.delivered)
            path = "/v1/events"
        else:
            path = "/v1/events" + query_string({"after": self.start_after})
        return Call("GET", "/v1/events", path, headers=headers)

    def accept(self, message: SseMessage) -> dict[str, Any] | None:
        """The event a message carries, if it is new; raises the error a stream ended with."""
        if message.event in ("change", "message"):
            try:
                event = json.loads(message.data)
            except ValueError as error:
                raise ProtocolError(f"an event does not parse: {error}") from None
            revision = event.get("revision") if isinstance(event, dict) else None
            if not isinstance(revision, int):
                raise ProtocolError(f"an event without a revision: {message.data[:200]}")
            if self.delivered is not None and revision <= self.delivered:
                return None  # already delivered before a reconnection
            self.delivered = revision
            assert isinstance(event, dict)
            return event
        if message.event == "error":
            try:
                problem = json.loads(message.data)
            except ValueError:
                problem = None
            if isinstance(problem, dict):
                raise error_from_problem(200, problem)
            raise ProtocolError(f"the stream ended with an error: {message.data[:200]}")
        return None  # an event type this client does not know


def stream_error_is_final(error: BatonError) -> bool:
    """A stream error after which reopening elsewhere cannot help."""
    return error.code in {"NOT_FOUND", "INVALID_ARGUMENT", "UNAUTHENTICATED", "PERMISSION_DENIED"}
