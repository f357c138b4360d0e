"""Lease validity from the holder's own monotonic clock (docs/guarantees.md G7), shared by the
sync and async guards.

A holder that sent the first attempt of an acquire or keepalive at ``t0`` (``time.monotonic()``)
and got ``expires_in_ms`` back may act until::

    t0 + (expires_in_ms - 1) * (1 - 2 * clock_rate_error)

and, with a max hold, never past ``t_acquire + (max_hold_ms - 1) * (1 - 2 * clock_rate_error)``.
Once that instant passes, or the server says ``LEASE_LOST``, the session is lost for good: a
late keepalive never revives it.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from typing import Any, Callable

from .errors import ClaimLost

#: How long before its G7 deadline a guard whose renewals keep failing declares itself lost
#: (at most; never more than a tenth of the TTL), so that the report comes before the deadline.
REPORT_MARGIN_MAX = 0.25
KEEPALIVE_RETRY_INITIAL = 0.05
KEEPALIVE_TIMEOUT_MIN = 0.2

EXPIRED = "expired: no keepalive succeeded before the local G7 deadline"
MAX_HOLD = "max hold reached"
ENDED = "session ended"


def valid_until(sent_at: float, expires_in_ms: int, rate_error: float) -> float:
    """G7: the last instant (``time.monotonic()`` seconds) the holder may act."""
    return sent_at + max(expires_in_ms - 1, 0) / 1000.0 * (1.0 - 2.0 * rate_error)


LostCallback = Callable[[str], Any]


class Watch:
    """One thing that is lost once: a lease guard or a task claim. Its report (callback and
    event) happens exactly once, whichever thread notices first."""

    def __init__(self, on_lost: LostCallback | None, max_hold_until: float | None) -> None:
        self.on_lost = on_lost
        self.max_hold_until = max_hold_until
        self.reason: str | None = None
        self.retired = False  # released or settled: no report any more
        self.lock = threading.Lock()
        self.notify: Callable[[], None] = lambda: None

    def report(self, reason: str) -> bool:
        with self.lock:
            if self.reason is not None or self.retired:
                return False
            self.reason = reason
        self.notify()
        if self.on_lost is not None:
            try:
                self.on_lost(reason)
            except Exception:  # a callback's failure must not stop the renewals
                pass
        return True


_LIVE: "weakref.WeakSet[SessionState]" = weakref.WeakSet()


class SessionState:
    """A session's G7 deadline, its loss, and the watches (guards, claims) that live on it."""

    def __init__(
        self,
        session_id: str,
        holder: str,
        ttl: float,
        owned: bool,
        until: float,
        rate_error: float,
    ) -> None:
        self.id = session_id
        self.holder = holder
        self.ttl = ttl
        self.owned = owned
        self.rate_error = rate_error
        self.valid_until = until
        self.lost: str | None = None
        self.watches: list[Watch] = []
        self.lock = threading.Lock()
        self.pid = os.getpid()
        self.margin = min(REPORT_MARGIN_MAX, ttl / 10.0)
        _LIVE.add(self)

    # -- the clock -----------------------------------------------------------------------

    def lost_reason(self) -> str | None:
        now = time.monotonic()
        with self.lock:
            if self.lost is None and now >= self.valid_until:
                self.lost = EXPIRED
        if self.lost is not None:
            self._report_all(self.lost)
        return self.lost

    def record_renewal(self, sent_at: float, expires_in_ms: int) -> None:
        until = valid_until(sent_at, expires_in_ms, self.rate_error)
        now = time.monotonic()
        with self.lock:
            if self.lost is not None:
                return
            if now >= self.valid_until:
                self.lost = EXPIRED
            else:
                self.valid_until = max(self.valid_until, until)
        if self.lost is not None:
            self._report_all(self.lost)

    def mark_lost(self, reason: str) -> None:
        with self.lock:
            if self.lost is None:
                self.lost = reason
            reason = self.lost
        self._report_all(reason)

    def _report_all(self, reason: str) -> None:
        for watch in list(self.watches):
            watch.report(reason)

    # -- the reporter --------------------------------------------------------------------

    def check_reports(self) -> None:
        """Declares lost what is within the report margin of its deadline (a watch's own max
        hold first: a new lease's first deadline is capped by it, and that is the cause)."""
        now = time.monotonic()
        for watch in list(self.watches):
            if watch.max_hold_until is not None and now >= watch.max_hold_until - self.margin:
                watch.report(MAX_HOLD)
        with self.lock:
            if self.lost is None and now >= self.valid_until - self.margin:
                self.lost = EXPIRED
            lost = self.lost
        if lost is not None:
            self._report_all(lost)

    def next_report_at(self) -> float:
        at = self.valid_until - self.margin
        for watch in self.watches:
            if watch.max_hold_until is not None and watch.reason is None and not watch.retired:
                at = min(at, watch.max_hold_until - self.margin)
        return at

    def keepalive_timeout(self, client_timeout: float) -> float:
        return min(client_timeout, max(self.ttl / 4.0, KEEPALIVE_TIMEOUT_MIN))

    def watch_reason(self, watch: Watch) -> str | None:
        """A watch's loss: its own max hold first, then its session's."""
        if watch.reason is not None:
            return watch.reason
        now = time.monotonic()
        if watch.max_hold_until is not None and now >= watch.max_hold_until:
            watch.report(MAX_HOLD)
            return watch.reason
        return self.lost_reason()

    def ensure_valid(self, watch: Watch, what: str) -> None:
        reason = self.watch_reason(watch)
        if reason is not None:
            raise ClaimLost(f"{what} is lost: {reason}")


def _after_fork_in_child() -> None:
    # The keepalive threads do not exist in a child: its copies of the guards stop being
    # renewed here (they turn invalid at their own deadline) and never release on exit.
    for state in list(_LIVE):
        state.lock = threading.Lock()
        for watch in state.watches:
            watch.lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class GuardView:
    """What a lease guard shows, sync or async: its grant, fence and G7 validity."""

    _state: SessionState | None
    _watch: Watch | None
    _grant: dict[str, Any]
    _what: str

    @property
    def grant(self) -> dict[str, Any]:
        """The raw grant (the lease object plus ``session_id``)."""
        return dict(self._grant)

    @property
    def fence(self) -> int:
        fence = self._grant.get("fence")
        if not isinstance(fence, int):
            raise ClaimLost(f"{self._what} is not held")
        return fence

    @property
    def resource(self) -> str:
        return str(self._grant.get("resource", ""))

    @property
    def mode(self) -> str:
        return str(self._grant.get("mode", "exclusive"))

    @property
    def holder(self) -> str:
        return str(self._grant.get("holder", ""))

    @property
    def session_id(self) -> str:
        if self._state is None:
            raise ClaimLost(f"{self._what} is not held")
        return self._state.id

    @property
    def valid_until(self) -> float:
        """The G7 deadline, in ``time.monotonic()`` seconds (0.0 when not held)."""
        if self._state is None or self._watch is None:
            return 0.0
        until = self._state.valid_until
        if self._watch.max_hold_until is not None:
            until = min(until, self._watch.max_hold_until)
        return until

    def lost_reason(self) -> str | None:
        """Why the holder may no longer act (None while it may)."""
        if self._state is None or self._watch is None:
            return "not held"
        return self._state.watch_reason(self._watch)

    def is_valid(self) -> bool:
        """Whether the holder may still act (G7, from ``time.monotonic()`` alone)."""
        return self.lost_reason() is None

    def ensure_valid(self) -> None:
        """Raises :class:`ClaimLost` unless :meth:`is_valid`."""
        if self._state is None or self._watch is None:
            raise ClaimLost(f"{self._what} is not held")
        self._state.ensure_valid(self._watch, self._what)
