"""The ``claims`` tool decorator's core: run a tool under a lease, and turn every way the claim
can fail into a one-line result for the model (docs/agents.md: the model only ever sees
"granted" or "denied: ..."; fail closed)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Mapping, Protocol, Sequence, TypeVar

from .errors import (
    BatonError,
    LeaseHeld,
    NoLeader,
    OutcomeUnknown,
    PermissionDenied,
    ProtocolError,
    TLSError,
    Unauthenticated,
    Unavailable,
)


class Held(Protocol):
    def lost_reason(self) -> str | None: ...


G = TypeVar("G", bound=Held)


@dataclass(frozen=True)
class ClaimSpec:
    resource_of: Callable[..., str]
    ttl: float
    mode: str
    wait: float | None
    reason: str | None


def claim_failure(resource: str, error: BaseException) -> str:
    """The tool result for a claim that could not be made or checked."""
    tail = "; the tool did not run"
    if isinstance(error, LeaseHeld):
        return error.denial(resource)
    if isinstance(error, (Unauthenticated, PermissionDenied)):
        return f"error: could not claim {resource}: Baton refused the token ({error}){tail}"
    if isinstance(error, TLSError):
        return f"error: could not claim {resource}: TLS is misconfigured ({error}){tail}"
    if isinstance(error, ProtocolError):
        return f"error: could not claim {resource}: Baton's answer was malformed ({error}){tail}"
    if isinstance(error, (Unavailable, NoLeader, OutcomeUnknown)) or (
        isinstance(error, BatonError) and error.is_indeterminate
    ):
        return (
            f"error: could not claim {resource}: Baton is unreachable or did not answer in "
            f"time ({error}){tail}"
        )
    if isinstance(error, BatonError):
        return f"error: could not claim {resource}: {error}{tail}"
    return f"error: could not claim {resource}: {type(error).__name__}: {error}{tail}"


def _resource(spec: ClaimSpec, tool: Callable[..., Any], args: Sequence[Any],
              kwargs: Mapping[str, Any]) -> str:
    """The path the tool's arguments name; raises ValueError with the result text."""
    name = getattr(tool, "__name__", "the tool")
    try:
        resource = spec.resource_of(*args, **kwargs)
    except Exception as error:
        raise ValueError(
            f"error: cannot tell which path {name} works on ({type(error).__name__}: {error}); "
            "the tool did not run"
        ) from None
    if not isinstance(resource, str) or not resource:
        raise ValueError(
            f"error: {name} names no path to claim ({resource!r}); the tool did not run"
        )
    return resource


def _lost_text(resource: str, reason: str) -> str:
    return (
        f"error: the claim on {resource} was lost while the tool ran ({reason}); another "
        "agent may hold it now: check its state before going on"
    )


def run_claimed_sync(
    open_claim: Callable[[ClaimSpec, str], Any],
    spec: ClaimSpec,
    tool: Callable[..., Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
) -> Any:
    try:
        resource = _resource(spec, tool, args, kwargs)
    except ValueError as refusal:
        return str(refusal)
    try:
        guard = open_claim(spec, resource)
    except Exception as error:
        return claim_failure(resource, error)
    lost: str | None = None
    try:
        lost = guard.lost_reason()
        if lost is not None:
            return _lost_text(resource, lost)
        result = tool(*args, **kwargs)
        lost = guard.lost_reason()
    finally:
        try:
            guard.release()
        except Exception:
            pass  # the lease lapses with its TTL
    if lost is not None:
        return _lost_text(resource, lost)
    return result


async def run_claimed_async(
    open_claim: Callable[[ClaimSpec, str], Awaitable[G]],
    release: Callable[[G], Awaitable[None]],
    spec: ClaimSpec,
    tool: Callable[..., Awaitable[Any]],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
) -> Any:
    try:
        resource = _resource(spec, tool, args, kwargs)
    except ValueError as refusal:
        return str(refusal)
    try:
        guard = await open_claim(spec, resource)
    except Exception as error:
        return claim_failure(resource, error)
    lost: str | None = None
    try:
        lost = guard.lost_reason()
        if lost is not None:
            return _lost_text(resource, lost)
        result = await tool(*args, **kwargs)
        lost = guard.lost_reason()
    finally:
        try:
            await release(guard)
        except Exception:
            pass
    if lost is not None:
        return _lost_text(resource, lost)
    return result
