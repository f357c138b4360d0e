"""Errors: one class per error code of docs/api.md, "Error codes", plus the client's own.

Every error answers one question first: was the request surely not applied, or is the
outcome unknown (``is_indeterminate``)? Decide on the class (or ``code``), never on
``message``.
"""

from __future__ import annotations

import math
from typing import Any, Mapping


class BatonError(Exception):
    """Base class of every error this client raises.

    ``code`` is the server's error code (``"LEASE_HELD"``, ...) or one of the client's own
    (``"UNAVAILABLE"``, ``"PROTOCOL"``, ``"TLS"``); ``status`` the HTTP status, when an answer
    came; ``is_indeterminate`` is true when the request may or may not have been applied
    (retry it with the same ``Idempotency-Key`` to learn which; the client already did, within
    its retry budget); ``problem`` the raw problem body, when there was one.
    """

    code: str = "UNKNOWN"
    default_indeterminate: bool = False

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        status: int | None = None,
        is_indeterminate: bool | None = None,
        problem: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.status = status
        self.is_indeterminate = (
            self.default_indeterminate if is_indeterminate is None else is_indeterminate
        )
        self.problem: dict[str, Any] = dict(problem) if problem is not None else {}
        raw_leader = self.problem.get("leader")
        self.leader: int | None = raw_leader if isinstance(raw_leader, int) else None
        raw_retry = self.problem.get("retry_after_ms")
        self.retry_after_ms: int | None = raw_retry if isinstance(raw_retry, int) else None

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(code={self.code!r}, message={self.message!r}, "
            f"status={self.status!r}, is_indeterminate={self.is_indeterminate!r})"
        )


class InvalidArgument(BatonError):
    """400 (405 for a wrong method): fix the request. Surely not applied."""

    code = "INVALID_ARGUMENT"


class Unauthenticated(BatonError):
    """401: no token, a malformed, unknown or revoked one. Surely not applied."""

    code = "UNAUTHENTICATED"


class PermissionDenied(BatonError):
    """403: the token's role or namespaces do not allow it. Surely not applied."""

    code = "PERMISSION_DENIED"


class NotFound(BatonError):
    """404: no such route, lease, session, key or member, or an event revision too old."""

    code = "NOT_FOUND"


class LeaseHeld(BatonError):
    """409: a live lease conflicts. ``holder``, ``resource``, ``mode``, ``fence`` and
    ``expires_in`` (seconds, float) describe it; ``held_by`` is the raw object."""

    code = "LEASE_HELD"

    def __init__(self, message: str, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        raw = self.problem.get("held_by")
        self.held_by: dict[str, Any] = dict(raw) if isinstance(raw, dict) else {}
        holder = self.held_by.get("holder")
        self.holder: str | None = holder if isinstance(holder, str) else None
        resource = self.held_by.get("resource")
        self.resource: str | None = resource if isinstance(resource, str) else None
        mode = self.held_by.get("mode")
        self.mode: str | None = mode if isinstance(mode, str) else None
        fence = self.held_by.get("fence")
        self.fence: int | None = fence if isinstance(fence, int) else None
        expires_in_ms = self.held_by.get("expires_in_ms")
        self.expires_in_ms: int | None = (
            expires_in_ms if isinstance(expires_in_ms, int) else None
        )
        self.expires_in: float | None = (
            self.expires_in_ms / 1000.0 if self.expires_in_ms is not None else None
        )
        limit = self.held_by.get("limit")
        self.limit: int | None = limit if isinstance(limit, int) else None
        holders = self.held_by.get("holders")
        self.holders: list[dict[str, Any]] = (
            [h for h in holders if isinstance(h, dict)] if isinstance(holders, list) else []
        )

    def denial(self, asked: str | None = None) -> str:
        """The one line an agent's model reads:
        ``denied: agent-b holds src/auth.rs for 38 s more``."""
        seconds = math.ceil((self.expires_in_ms or 0) / 1000)
        holder = self.holder or "another holder"
        resource = self.resource or asked or "the resource"
        if self.mode == "shared" and self.limit is not None:
            names = ", ".join(str(h.get("holder")) for h in self.holders) or holder
            total = self.held_by.get("holders_total", len(self.holders))
            text = (
                f"denied: {resource} is shared by {total} of {self.limit} holders "
                f"({names}); the first frees up in {seconds} s"
            )
        else:
            text = f"denied: {holder} holds {resource} for {seconds} s more"
            if asked is not None and resource != asked:
                text = (
                    f"denied: {holder} holds {resource} ({self.mode or 'lease'}), "
                    f"which covers {asked}, for {seconds} s more"
                )
        return text


class LeaseLost(BatonError):
    """409: the session is gone, or it does not hold the lease named: stop acting as holder."""

    code = "LEASE_LOST"


class StaleFence(BatonError):
    """409: the fence sent is not the live one; the fenced write was refused.
    ``current_fence`` is the live fence, when the resource has a live lease."""

    code = "STALE_FENCE"

    def __init__(self, message: str, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        current = self.problem.get("current_fence")
        self.current_fence: int | None = current if isinstance(current, int) else None


class PayloadTooLarge(BatonError):
    """413: the body is over 1 MiB, or a value or payload over 256 KiB."""

    code = "PAYLOAD_TOO_LARGE"


class IdempotencyKeyReused(BatonError):
    """422: the ``Idempotency-Key`` was used for a different request."""

    code = "IDEMPOTENCY_KEY_REUSED"


class ResourceExhausted(BatonError):
    """429: a count limit was reached or the node is overloaded. Surely not applied."""

    code = "RESOURCE_EXHAUSTED"


class NoLeader(BatonError):
    """503: no leader could be reached in time. Surely not applied."""

    code = "NO_LEADER"


class OutcomeUnknown(BatonError):
    """504, or a timeout or dropped connection after the request was sent: it may or may not
    have been applied."""

    code = "OUTCOME_UNKNOWN"
    default_indeterminate = True


class InternalError(BatonError):
    """500: a server fault, possibly after the write was applied: outcome unknown."""

    code = "INTERNAL"
    default_indeterminate = True


class Unavailable(BatonError):
    """No endpoint took the request (connection refused everywhere, or every endpoint said
    ``NO_LEADER``/``RESOURCE_EXHAUSTED``) within the retry budget: surely not applied."""

    code = "UNAVAILABLE"


class ProtocolError(BatonError):
    """The answer was not what the API promises (not problem+json, a body that does not
    parse, a field missing). ``is_indeterminate`` tells whether the request may have been
    applied (a 2xx or 5xx whose body could not be read)."""

    code = "PROTOCOL"


class TLSError(BatonError):
    """The TLS handshake failed: a configuration error (trust the cluster's CA with
    ``ca_file=`` or ``BATON_CA_FILE``); never retried."""

    code = "TLS"


class ClaimLost(LeaseLost):
    """A guard or task claim is no longer valid (G7 deadline passed, max hold reached, or the
    server said the session is gone); raised by the client before it sends anything. A
    :class:`LeaseLost`, so one ``except LeaseLost`` covers both."""


#: Every error code of docs/api.md, "Error codes", and its class.
ERROR_CLASSES: dict[str, type[BatonError]] = {
    "INVALID_ARGUMENT": InvalidArgument,
    "UNAUTHENTICATED": Unauthenticated,
    "PERMISSION_DENIED": PermissionDenied,
    "NOT_FOUND": NotFound,
    "LEASE_HELD": LeaseHeld,
    "LEASE_LOST": LeaseLost,
    "STALE_FENCE": StaleFence,
    "PAYLOAD_TOO_LARGE": PayloadTooLarge,
    "IDEMPOTENCY_KEY_REUSED": IdempotencyKeyReused,
    "RESOURCE_EXHAUSTED": ResourceExhausted,
    "NO_LEADER": NoLeader,
    "OUTCOME_UNKNOWN": OutcomeUnknown,
    "INTERNAL": InternalError,
}

#: Codes after which the same request may be sent again at once elsewhere (surely not applied).
RETRYABLE_CODES = frozenset({"NO_LEADER", "RESOURCE_EXHAUSTED"})
#: Codes that leave the outcome unknown.
INDETERMINATE_CODES = frozenset({"OUTCOME_UNKNOWN", "INTERNAL"})


def error_from_problem(status: int, problem: Mapping[str, Any]) -> BatonError:
    """The error for a problem+json body ``problem`` answered with ``status``.

    A code this client does not know is a plain :class:`BatonError` carrying it, read as
    "surely not applied" for a 4xx and "unknown" otherwise (docs/api.md, "Error codes").
    A problem without a string ``code`` and ``message``, or a ``LEASE_HELD`` without
    ``held_by``, is a :class:`ProtocolError`.
    """
    code = problem.get("code")
    message = problem.get("message")
    if not isinstance(code, str) or not isinstance(message, str):
        return ProtocolError(
            f"HTTP {status}: an error body without a string code and message: "
            f"{_excerpt(problem)}",
            status=status,
            is_indeterminate=not 400 <= status < 500,
        )
    cls = ERROR_CLASSES.get(code)
    if cls is None:
        return BatonError(
            message,
            code=code,
            status=status,
            is_indeterminate=not 400 <= status < 500,
            problem=problem,
        )
    if cls is LeaseHeld and not isinstance(problem.get("held_by"), dict):
        return ProtocolError(
            f"LEASE_HELD without held_by: {message}", status=status, problem=problem
        )
    return cls(message, status=status, problem=problem)


def _excerpt(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "..."
