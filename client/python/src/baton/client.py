"""The synchronous client: :class:`Client`, :class:`Session`, :class:`LeaseGuard`,
:class:`TaskClaim` and :class:`EventStream`."""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence, TypeVar, cast

import httpx

from . import _routes as routes
from ._core import (
    ATTEMPTS_MAX_DEFAULT,
    CLOCK_RATE_ERROR_DEFAULT,
    REQUEST_TIMEOUT_DEFAULT,
    RETRY_BUDGET_DEFAULT,
    WAIT_MS_MAX,
    Answer,
    Call,
    Config,
    Outcome,
    Response,
    RouteState,
    Send,
    Sleep,
    TransportFailure,
    _parse_problem,
    backoff,
    expect_object,
    is_tls_failure,
    require,
    run,
    seconds_to_ms,
)
from ._events import STREAM_IDLE_MAX, Resume, SseParser, stream_error_is_final
from ._lease import (
    ENDED,
    KEEPALIVE_RETRY_INITIAL,
    GuardView,
    LostCallback,
    SessionState,
    Watch,
    valid_until,
)
from ._tools import ClaimSpec, run_claimed_async, run_claimed_sync
from .errors import (
    BatonError,
    ClaimLost,
    LeaseLost,
    NotFound,
    ProtocolError,
    StaleFence,
    TLSError,
    Unavailable,
    error_from_problem,
)

F = TypeVar("F", bound=Callable[..., Any])
TTL_DEFAULT = 30.0
DROPPED_NOTE = "the claimer let go of its claim without settling it"


def _transport_failure(error: Exception, timeout: float) -> TransportFailure:
    if isinstance(error, (httpx.ConnectError, httpx.ConnectTimeout)):
        return TransportFailure(f"cannot connect: {error}", sent=False, tls=is_tls_failure(error))
    if isinstance(error, httpx.PoolTimeout):
        return TransportFailure("no free connection in the pool", sent=False)
    if isinstance(error, httpx.TimeoutException):
        return TransportFailure(f"no answer within {timeout:.3g} s", sent=True)
    return TransportFailure(f"the request failed after it was sent: {error!r}", sent=True)


def _timeout(seconds: float) -> httpx.Timeout:
    return httpx.Timeout(seconds, connect=min(seconds, 2.0))


@dataclass
class WorkReport:
    """What :meth:`Client.work` did: tasks completed and failed, and why it stopped
    (``"queue_empty"``, ``"max_tasks"`` or ``"claim_lost"``, then with ``task_id`` and
    ``reason``)."""

    completed: int = 0
    failed: int = 0
    stopped: str = "queue_empty"
    task_id: str | None = None
    reason: str | None = None


class Client:
    """A handle on a Baton cluster.

    ``endpoints`` (or ``BATON_ENDPOINTS``, comma-separated; default ``http://127.0.0.1:7420``),
    ``token`` (``BATON_TOKEN``), ``ca_file`` (``BATON_CA_FILE``), ``namespace``
    (``BATON_NAMESPACE``; the ``Baton-Namespace`` header), ``holder`` (``BATON_HOLDER``; default
    ``user@host``), ``timeout`` (one attempt, seconds), ``retry_budget`` (all attempts of one
    operation, seconds), ``attempts_max``. Thread-safe; close it (or use ``with``) when done.
    """

    def __init__(
        self,
        endpoints: list[str] | str | None = None,
        *,
        token: str | None = None,
        ca_file: str | None = None,
        namespace: str | None = None,
        holder: str | None = None,
        timeout: float = REQUEST_TIMEOUT_DEFAULT,
        retry_budget: float = RETRY_BUDGET_DEFAULT,
        attempts_max: int = ATTEMPTS_MAX_DEFAULT,
        clock_rate_error: float = CLOCK_RATE_ERROR_DEFAULT,
        event_hooks: Mapping[str, list[Callable[..., Any]]] | None = None,
    ) -> None:
        self._config = Config.build(
            endpoints,
            token,
            ca_file,
            namespace,
            holder,
            timeout,
            retry_budget,
            attempts_max,
            clock_rate_error,
        )
        self._route_state = RouteState()
        self._event_hooks = {key: list(value) for key, value in (event_hooks or {}).items()}
        self._verify = self._config.verify()
        self._lock = threading.Lock()
        self._client: httpx.Client | None = None
        self._pid = os.getpid()

    # -- plumbing --------------------------------------------------------------------------

    @property
    def holder(self) -> str:
        return self._config.holder

    @property
    def namespace(self) -> str:
        return self._config.namespace or "default"

    @property
    def endpoints(self) -> list[str]:
        return [endpoint.base for endpoint in self._config.endpoints]

    def _http(self) -> httpx.Client:
        with self._lock:
            if self._client is None or self._pid != os.getpid():
                # A forked child never shares its parent's connections.
                self._pid = os.getpid()
                self._client = httpx.Client(
                    headers=self._config.headers(),
                    verify=self._verify,
                    trust_env=False,
                    event_hooks=self._event_hooks,
                )
            return self._client

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None and self._pid == os.getpid():
            client.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _attempt(self, send: Send) -> Outcome:
        call = send.call
        url = self._config.endpoints[send.endpoint].base + call.path
        try:
            response = self._http().request(
                call.method,
                url,
                content=call.content(),
                headers=call.request_headers(),
                timeout=_timeout(send.timeout),
            )
        except httpx.HTTPError as error:
            return _transport_failure(error, send.timeout)
        return Response(response.status_code, response.headers, response.content)

    def _execute(self, call: Call) -> Answer:
        plan = run(call, self._config, self._route_state)
        outcome: Outcome | None = None
        try:
            step = next(plan)
            while True:
                if isinstance(step, Sleep):
                    time.sleep(step.seconds)
                    outcome = None
                else:
                    outcome = self._attempt(step)
                step = plan.send(outcome)
        except StopIteration as stop:
            return cast(Answer, stop.value)

    def _object(self, call: Call) -> dict[str, Any]:
        return expect_object(self._execute(call), f"{call.method} {call.route}")

    # -- sessions --------------------------------------------------------------------------

    def create_session(
        self, ttl: float = TTL_DEFAULT, *, labels: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        """``POST /v1/sessions``: a bare session, not kept alive (see :meth:`session`)."""
        return self._object(
            routes.create_session(self.holder, seconds_to_ms(ttl, "ttl"), labels)
        )

    def session(
        self,
        ttl: float = TTL_DEFAULT,
        *,
        labels: Mapping[str, str] | None = None,
        on_lost: LostCallback | None = None,
    ) -> "Session":
        """A session kept alive in a background thread until :meth:`Session.end` (or the end
        of a ``with`` block). Several leases and task claims can share it."""
        answer = self._execute(
            routes.create_session(self.holder, seconds_to_ms(ttl, "ttl"), labels)
        )
        created = expect_object(answer, "POST /v1/sessions")
        session_id = require(created, "session_id", str, "POST /v1/sessions")
        expires_in_ms = require(created, "expires_in_ms", int, "POST /v1/sessions")
        state = SessionState(
            session_id,
            str(created.get("holder", self.holder)),
            ttl,
            True,
            valid_until(answer.sent_at, expires_in_ms, self._config.clock_rate_error),
            self._config.clock_rate_error,
        )
        return Session(self, state, on_lost)

    def keepalive(self, session_id: str) -> dict[str, Any]:
        """``POST /v1/sessions/{id}/keepalive``: renews the session and all it holds."""
        return self._object(routes.keepalive(session_id))

    def release(self, session_id: str, resource: str) -> dict[str, Any]:
        """``POST /v1/sessions/{id}/release``: frees one lease, or leaves the path's line."""
        return self._object(routes.release(session_id, resource))

    def get_session(
        self, session_id: str, *, limit: int | None = None, cursor: str | None = None
    ) -> dict[str, Any]:
        """``GET /v1/sessions/{id}``: the session and a page of its leases."""
        return self._object(routes.get_session(session_id, limit, cursor))

    def end_session(self, session_id: str) -> dict[str, Any]:
        """``DELETE /v1/sessions/{id}``: ends it, releasing everything it holds."""
        return self._object(routes.end_session(session_id))

    # -- leases ----------------------------------------------------------------------------

    def lease(
        self,
        resource: str,
        ttl: float = TTL_DEFAULT,
        *,
        mode: str = "exclusive",
        limit: int | None = None,
        max_hold: float | None = None,
        labels: Mapping[str, str] | None = None,
        reason: str | None = None,
        wait: float | None = None,
        on_lost: LostCallback | None = None,
    ) -> "LeaseGuard":
        """A lease guard on ``resource`` with a session of its own (TTL ``ttl`` seconds),
        acquired by ``with`` (or :meth:`LeaseGuard.acquire`) and released (its session
        ended) at the end of the block. ``mode``: ``exclusive``, ``subtree`` or ``shared``
        (with ``limit``, the most holders at once). ``wait``: seconds to wait in the path's
        line (up to 60 per round, renewed). ``on_lost(reason)`` is called once if the lease is
        lost while held. Raises :class:`LeaseHeld` when denied."""
        return LeaseGuard(
            self,
            None,
            resource,
            ttl=ttl,
            mode=mode,
            limit=limit,
            max_hold=max_hold,
            labels=labels,
            reason=reason,
            wait=wait,
            on_lost=on_lost,
        )

    def acquire(
        self,
        resource: str,
        *,
        session_id: str | None = None,
        ttl: float | None = None,
        mode: str = "exclusive",
        limit: int | None = None,
        max_hold: float | None = None,
        labels: Mapping[str, str] | None = None,
        reason: str | None = None,
        wait: float | None = None,
    ) -> dict[str, Any]:
        """``POST /v1/leases``: one grant, no guard and no keepalive (the raw grant, with its
        ``session_id``). Give ``session_id`` or ``ttl`` (a new session for the client's
        holder). With ``wait``, waits in the line as :meth:`lease` does."""
        body = routes.acquire_body(
            resource,
            session_id=session_id,
            holder=None if session_id is not None else self.holder,
            ttl_ms=None if ttl is None else seconds_to_ms(ttl, "ttl"),
            mode=mode,
            limit=limit,
            max_hold_ms=None if max_hold is None else seconds_to_ms(max_hold, "max_hold"),
            labels=labels,
            reason=reason,
        )
        return expect_object(self._acquire_waiting(body, wait), "POST /v1/leases")

    def _acquire_waiting(self, body: dict[str, Any], wait: float | None) -> Answer:
        """An acquire, waiting in the line for up to ``wait`` seconds in rounds of at most a
        third of the TTL, the session kept alive between rounds; past the wait, out of the
        line and one last plain acquire (whose denial says who holds it). A session this
        acquire made for itself that dies between rounds (renewed too late, as on a loaded
        machine) loses its place, not the acquire: it joins the line again."""
        if wait is None:
            return self._execute(routes.acquire(body))
        wait_ms = seconds_to_ms(wait, "wait")
        deadline = time.monotonic() + wait_ms / 1000.0
        if "ttl_ms" in body:
            ttl_ms = int(body["ttl_ms"])
        else:
            info = self.get_session(str(body["session_id"]))
            ttl_ms = int(require(info, "ttl_ms", int, "GET /v1/sessions/{id}"))
        round_max = min(max(ttl_ms // 3, 1), WAIT_MS_MAX) / 1000.0
        waiting = dict(body)
        created_id: str | None = None
        try:
            while True:
                round_seconds = max(0.0, min(deadline - time.monotonic(), round_max))
                waiting["wait_ms"] = int(round_seconds * 1000)
                try:
                    answer = self._execute(routes.acquire(waiting, held=round_seconds))
                    value = expect_object(answer, "POST /v1/leases")
                    if answer.status != 202:
                        require(value, "fence", int, "POST /v1/leases")
                        return answer
                    session_id = require(value, "session_id", str, "POST /v1/leases")
                    if value.get("session_created") is True:
                        created_id = session_id
                    waiting["session_id"] = session_id
                    waiting.pop("holder", None)
                    waiting.pop("ttl_ms", None)
                    if time.monotonic() < deadline:
                        self.keepalive(session_id)
                        continue
                    if created_id is None:
                        self.release(session_id, str(body["resource"]))
                    else:
                        self._end_own_session(created_id)
                        created_id = None
                except LeaseLost:
                    if created_id is None:
                        raise  # the caller's own session is gone
                    self._end_own_session(created_id)
                    created_id = None
                    waiting = dict(body)
                    if time.monotonic() < deadline:
                        continue
                return self._execute(routes.acquire(body))
        except BaseException:
            if created_id is not None:
                try:  # a session left in the line would be granted the lease later
                    self.end_session(created_id)
                except BatonError:
                    pass
            raise

    def _end_own_session(self, session_id: str) -> None:
        """Ends a session a waiting acquire made for itself; one already gone counts."""
        try:
            self.end_session(session_id)
        except NotFound:
            pass

    def get_lease(self, resource: str) -> dict[str, Any]:
        """``GET /v1/leases/{resource}``: the live lease that would refuse an exclusive
        acquire of the path (``NotFound`` when none)."""
        return self._object(routes.get_lease(resource))

    def list_leases(
        self, prefix: str | None = None, *, limit: int | None = None, cursor: str | None = None
    ) -> dict[str, Any]:
        """``GET /v1/leases``: one page (``leases``, ``next_cursor``)."""
        return self._object(routes.list_leases(prefix, limit, cursor))

    def iter_leases(self, prefix: str | None = None) -> Iterator[dict[str, Any]]:
        """Every live lease under ``prefix``, page after page."""
        cursor: str | None = None
        while True:
            page = self.list_leases(prefix, cursor=cursor)
            yield from page.get("leases", [])
            cursor = page.get("next_cursor")
            if not cursor:
                return

    def fence_check(self, resource: str, fence: int) -> dict[str, Any]:
        """``POST /v1/fence/check``: ``{"current": bool, "fence": live fence or None}``."""
        return self._object(routes.fence_check(resource, fence))

    # -- key-value store ---------------------------------------------------------------------

    def kv_get(self, key: str) -> dict[str, Any]:
        """``GET /v1/kv/{key}``: ``{key, value, revision, fence}`` (``NotFound`` when absent)."""
        return self._object(routes.kv_get(key))

    def kv_put(
        self,
        key: str,
        value: Any,
        *,
        guard: "GuardView | None" = None,
        fence: tuple[str, int] | None = None,
        session_id: str | None = None,
    ) -> dict[str, Any]:
        """``PUT /v1/kv/{key}``. With ``guard`` (or ``fence=(resource, token)`` and
        ``session_id``) the write is fenced: applied only while that fence is live
        (``StaleFence`` otherwise). A guard that is no longer valid raises
        :class:`ClaimLost` before anything is sent."""
        fence, session_id = _fenced_by(guard, fence, session_id)
        return self._object(routes.kv_put(key, value, fence, session_id))

    def kv_delete(
        self,
        key: str,
        *,
        guard: "GuardView | None" = None,
        fence: tuple[str, int] | None = None,
        session_id: str | None = None,
    ) -> dict[str, Any]:
        """``DELETE /v1/kv/{key}``, fenced like :meth:`kv_put`."""
        fence, session_id = _fenced_by(guard, fence, session_id)
        return self._object(routes.kv_delete(key, fence, session_id))

    # -- transactions ------------------------------------------------------------------------

    def txn(
        self,
        compare: Sequence[Mapping[str, Any]] = (),
        success: Sequence[Mapping[str, Any]] = (),
        failure: Sequence[Mapping[str, Any]] = (),
        *,
        session_id: str | None = None,
        guard: "GuardView | TaskClaim | None" = None,
    ) -> dict[str, Any]:
        """``POST /v1/txn``: ``{"succeeded": bool, "results": [...]}``. Build compares and ops
        with :mod:`baton.txn`. ``guard`` (or ``session_id``) is the session fence compares and
        fenced ops act for."""
        if guard is not None:
            guard.ensure_valid()
            session_id = guard.session_id
        return self._object(routes.txn(session_id, compare, success, failure))

    # -- work queues -------------------------------------------------------------------------

    def enqueue(
        self,
        queue: str,
        payload: Any,
        *,
        id: str | None = None,
        priority: int | None = None,
        depends_on: Sequence[str] | None = None,
        max_attempts: int | None = None,
        not_before: float | None = None,
        on_dead: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """``POST /v1/queues/{queue}/tasks``: adds a task; answers the task object."""
        body = routes.enqueue_body(
            payload,
            id=id,
            priority=priority,
            depends_on=depends_on,
            max_attempts=max_attempts,
            not_before_ms=None if not_before is None else seconds_to_ms(not_before, "not_before"),
            on_dead=on_dead,
        )
        return self._object(routes.enqueue(queue, body))

    def claim(
        self,
        queue: str,
        *,
        ttl: float = TTL_DEFAULT,
        wait: float | None = None,
        session: "Session | None" = None,
        on_lost: LostCallback | None = None,
    ) -> "TaskClaim | None":
        """``POST /v1/queues/{queue}/claim``: the best ready task, claimed with a session of
        its own (or ``session``) kept alive in the background; ``None`` when no task is ready
        (within ``wait`` seconds)."""
        wait_ms = None if wait is None else seconds_to_ms(wait, "wait")
        if session is not None:
            session._state_check()
            call = routes.claim(queue, session_id=session.id, wait_ms=wait_ms)
        else:
            call = routes.claim(
                queue, holder=self.holder, ttl_ms=seconds_to_ms(ttl, "ttl"), wait_ms=wait_ms
            )
        try:
            answer = self._execute(call)
        except LeaseLost as error:
            if session is not None:
                session._state.mark_lost(f"session ended (the server says: {error.message})")
            raise
        if answer.status == 204 or answer.value is None:
            return None
        value = expect_object(answer, "POST /v1/queues/{queue}/claim")
        session_id = require(value, "session_id", str, "POST /v1/queues/{queue}/claim")
        require(value, "fence", int, "POST /v1/queues/{queue}/claim")
        expires_in_ms = require(value, "expires_in_ms", int, "POST /v1/queues/{queue}/claim")
        if session is not None:
            session._state.record_renewal(answer.sent_at, expires_in_ms)
            return TaskClaim(self, queue, value, session._state, None, on_lost)
        state = SessionState(
            session_id,
            self.holder,
            ttl,
            True,
            valid_until(answer.sent_at, expires_in_ms, self._config.clock_rate_error),
            self._config.clock_rate_error,
        )
        return TaskClaim(self, queue, value, state, _Renewer(self, state), on_lost)

    def complete_task(
        self, queue: str, task_id: str, *, session_id: str, fence: int, result: Any = None
    ) -> dict[str, Any]:
        """``POST /v1/queues/{queue}/tasks/{id}/complete`` (fenced by the claim)."""
        return self._object(routes.complete_task(queue, task_id, session_id, fence, result))

    def fail_task(
        self,
        queue: str,
        task_id: str,
        *,
        session_id: str,
        fence: int,
        reason: str,
        retry: bool | None = None,
    ) -> dict[str, Any]:
        """``POST /v1/queues/{queue}/tasks/{id}/fail`` (fenced by the claim)."""
        return self._object(routes.fail_task(queue, task_id, session_id, fence, reason, retry))

    def release_task(
        self, queue: str, task_id: str, *, session_id: str, fence: int, note: str | None = None
    ) -> dict[str, Any]:
        """``POST /v1/queues/{queue}/tasks/{id}/release``: back to ready, no attempt counted."""
        return self._object(routes.release_task(queue, task_id, session_id, fence, note))

    def queue_info(self, queue: str) -> dict[str, Any]:
        """``GET /v1/queues/{queue}``: ``{queue, counts}``."""
        return self._object(routes.queue_info(queue))

    def list_queues(
        self, *, limit: int | None = None, cursor: str | None = None
    ) -> dict[str, Any]:
        """``GET /v1/queues``: a page of queues with their counts."""
        return self._object(routes.list_queues(limit, cursor))

    def list_tasks(
        self,
        queue: str,
        *,
        state: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        """``GET /v1/queues/{queue}/tasks``: a page of tasks, optionally in one state."""
        return self._object(routes.list_tasks(queue, state, limit, cursor))

    def work(
        self,
        queue: str,
        handler: Callable[["TaskClaim"], Any],
        *,
        ttl: float = TTL_DEFAULT,
        max_tasks: int | None = None,
        wait: float | None = None,
    ) -> WorkReport:
        """A worker loop: claims the best ready task, runs ``handler(claim)`` while the claim
        is renewed, completes the task with what the handler returns, or fails it (retry while
        attempts remain) with the exception it raises. One session serves every claim. Stops
        when no task is ready (within ``wait`` seconds), after ``max_tasks``, or when a claim
        is lost (the task is someone else's then)."""
        report = WorkReport()
        session: Session | None = None
        try:
            while max_tasks is None or report.completed + report.failed < max_tasks:
                if session is None:
                    claim = self.claim(queue, ttl=ttl, wait=wait)
                    if claim is not None:
                        session = claim._adopt_session()
                else:
                    claim = self.claim(queue, wait=wait, session=session)
                if claim is None:
                    report.stopped = "queue_empty"
                    return report
                try:
                    result = handler(claim)
                except Exception as error:  # the task failed; the worker goes on
                    outcome = ("fail", f"{type(error).__name__}: {error}")
                else:
                    outcome = ("complete", result)
                try:
                    if outcome[0] == "complete":
                        claim.complete(outcome[1])
                        report.completed += 1
                    else:
                        claim.fail(str(outcome[1]), retry=True)
                        report.failed += 1
                except (StaleFence, LeaseLost) as error:
                    report.stopped = "claim_lost"
                    report.task_id = claim.id
                    report.reason = str(error)
                    return report
            report.stopped = "max_tasks"
            return report
        finally:
            if session is not None:
                session.end(quiet=True)

    # -- events ------------------------------------------------------------------------------

    def events(self, *, after: int | None = None, limit: int | None = None) -> dict[str, Any]:
        """``GET /v1/events``: one page, ``{"events": [...], "next": N}``."""
        return self._object(routes.events(after, limit))

    def follow_events(self, after: int | None = None) -> "EventStream":
        """Server-sent events after revision ``after`` (from the oldest kept when None), as an
        iterator of event objects that resumes on any node after a lost connection."""
        return EventStream(self, after)

    # -- access control, limits, cluster -----------------------------------------------------

    def create_token(
        self,
        name: str,
        role: str,
        namespaces: Sequence[str],
        *,
        quotas: Mapping[str, int] | None = None,
    ) -> dict[str, Any]:
        """``POST /v1/auth/tokens`` (admin): the token and its secret (shown only here)."""
        return self._object(routes.create_token(name, role, namespaces, quotas))

    def list_tokens(self) -> dict[str, Any]:
        """``GET /v1/auth/tokens`` (admin)."""
        return self._object(routes.list_tokens())

    def revoke_token(self, name: str) -> dict[str, Any]:
        """``DELETE /v1/auth/tokens/{name}`` (admin)."""
        return self._object(routes.revoke_token(name))

    def limits(self) -> dict[str, Any]:
        """``GET /v1/limits``: every limit by name."""
        return self._object(routes.get_limits())

    def set_limits(self, **changes: int) -> dict[str, Any]:
        """``PUT /v1/limits`` (admin): changes some limits; answers all of them."""
        return self._object(routes.set_limits(changes))

    def cluster_status(self) -> dict[str, Any]:
        """``GET /v1/cluster`` of the node that answers (node-local)."""
        return self._object(routes.cluster_status())

    def add_member(
        self, id: int, api_addr: str, peer_addr: str, *, voter: bool | None = None
    ) -> dict[str, Any]:
        """``POST /v1/cluster/members`` (admin)."""
        return self._object(routes.add_member(id, api_addr, peer_addr, voter))

    def remove_member(self, id: int) -> dict[str, Any]:
        """``DELETE /v1/cluster/members/{id}`` (admin)."""
        return self._object(routes.remove_member(id))

    # -- agent tools -------------------------------------------------------------------------

    def claims(
        self,
        resource_of: Callable[..., str],
        *,
        ttl: float = TTL_DEFAULT,
        mode: str = "exclusive",
        wait: float | None = None,
        reason: str | None = None,
    ) -> Callable[[F], F]:
        """A decorator for an agent's tool: the tool runs under a lease on the path
        ``resource_of(*args, **kwargs)`` names, renewed while it runs, and released after.
        A denial is the tool's result, a string such as
        ``denied: agent-b holds src/auth.rs for 38 s more``; so is any failure to claim
        (timeout, auth, a bad answer: ``error: ...``), and the tool does not run then.
        Sync and async tools both work (an async one claims in a worker thread)."""
        spec = ClaimSpec(resource_of, ttl, mode, wait, reason)

        def decorate(tool: F) -> F:
            if inspect.iscoroutinefunction(tool):

                async def open_claim(spec: ClaimSpec, resource: str) -> LeaseGuard:
                    return await asyncio.to_thread(self._open_claim_sync, spec, resource)

                async def release(guard: LeaseGuard) -> None:
                    await asyncio.to_thread(guard.release)

                @functools.wraps(tool)
                async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                    return await run_claimed_async(open_claim, release, spec, tool, args, kwargs)

                return cast(F, async_wrapper)

            @functools.wraps(tool)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                return run_claimed_sync(self._open_claim_sync, spec, tool, args, kwargs)

            return cast(F, wrapper)

        return decorate

    def _open_claim_sync(self, spec: ClaimSpec, resource: str) -> "LeaseGuard":
        guard = self.lease(
            resource, spec.ttl, mode=spec.mode, wait=spec.wait, reason=spec.reason
        )
        guard.acquire()
        return guard


def _fenced_by(
    guard: GuardView | None, fence: tuple[str, int] | None, session_id: str | None
) -> tuple[tuple[str, int] | None, str | None]:
    if guard is None:
        return fence, session_id
    guard.ensure_valid()
    return (guard.resource, guard.fence), guard.session_id


# ---------------------------------------------------------------------------------------------
# Renewals
# ---------------------------------------------------------------------------------------------


class _Renewer:
    """The keepalive thread of one session: a renewal every third of the TTL, retried with
    backoff across nodes until the G7 deadline, each bounded by the time left; reports the
    loss of every guard on the session once, just before the deadline."""

    def __init__(self, client: Client, state: SessionState) -> None:
        self.client = client
        self.state = state
        self.stop_event = threading.Event()
        self.thread: threading.Thread | None = None
        self.paused = False

    def start(self, owner: object) -> None:
        self.owner_ref: "weakref.ref[object]" = weakref.ref(owner)
        self.thread = threading.Thread(
            target=self._loop, name=f"baton-keepalive-{self.state.id[:8]}"
        )
        self.thread.daemon = True
        self.thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        thread = self.thread
        if (
            thread is not None
            and thread is not threading.current_thread()
            and self.state.pid == os.getpid()
        ):
            thread.join(timeout=self.client._config.timeout + 1.0)

    def rebind(self, owner: object) -> None:
        """Renews while ``owner`` lives (instead of the previous owner)."""
        self.owner_ref = weakref.ref(owner)

    def _loop(self) -> None:
        state = self.state
        interval = state.ttl / 3.0
        retry_max = max(state.ttl / 10.0, KEEPALIVE_RETRY_INITIAL)
        retry = KEEPALIVE_RETRY_INITIAL
        next_renewal = time.monotonic() + interval
        while not self.stop_event.is_set():
            wake = min(next_renewal, state.next_report_at())
            if self.stop_event.wait(max(0.0, wake - time.monotonic())):
                return
            if self.owner_ref() is None or os.getpid() != state.pid:
                return
            state.check_reports()
            if state.lost is not None:
                return
            now = time.monotonic()
            if self.paused:
                next_renewal = now + interval
                continue
            if now < next_renewal:
                continue
            remaining = state.valid_until - state.margin - now
            call = routes.keepalive(state.id)
            call.timeout = state.keepalive_timeout(self.client._config.timeout)
            call.budget = max(0.0, remaining)
            started = time.monotonic()
            try:
                answer = self.client._execute(call)
                expires_in_ms = require(
                    expect_object(answer, "keepalive"), "expires_in_ms", int, "keepalive"
                )
            except (LeaseLost, NotFound) as error:
                state.mark_lost(f"session ended (the server says: {error.message})")
                return
            except BatonError:
                next_renewal = time.monotonic() + retry
                retry = min(retry * 2, retry_max)
                continue
            except Exception:  # never let the thread die silently
                next_renewal = time.monotonic() + retry
                retry = min(retry * 2, retry_max)
                continue
            if self.stop_event.is_set():
                return
            state.record_renewal(answer.sent_at, expires_in_ms)
            retry = KEEPALIVE_RETRY_INITIAL
            next_renewal = started + interval


# ---------------------------------------------------------------------------------------------
# Sessions, guards, claims
# ---------------------------------------------------------------------------------------------


class Session:
    """A session renewed in a background (daemon) thread every third of its TTL. Leases and
    claims taken through it live and die with it; one renewal renews them all."""

    def __init__(self, client: Client, state: SessionState, on_lost: LostCallback | None) -> None:
        self._client = client
        self._state = state
        self.lost = threading.Event()
        self._watch = Watch(on_lost, None)
        self._watch.notify = self.lost.set
        state.watches.append(self._watch)
        self._renewer = _Renewer(client, state)
        self._renewer.start(self)

    @property
    def id(self) -> str:
        return self._state.id

    @property
    def ttl(self) -> float:
        return self._state.ttl

    def lost_reason(self) -> str | None:
        return self._state.lost_reason()

    def is_valid(self) -> bool:
        return self.lost_reason() is None

    def _state_check(self) -> None:
        reason = self._state.lost_reason()
        if reason is not None:
            raise ClaimLost(f"session is lost: {reason}")

    def lease(
        self,
        resource: str,
        *,
        mode: str = "exclusive",
        limit: int | None = None,
        max_hold: float | None = None,
        labels: Mapping[str, str] | None = None,
        reason: str | None = None,
        wait: float | None = None,
        on_lost: LostCallback | None = None,
    ) -> "LeaseGuard":
        """A guard on ``resource`` held by this session: acquired by ``with`` (or
        :meth:`LeaseGuard.acquire`); leaving the block releases that lease only."""
        return LeaseGuard(
            self._client,
            self,
            resource,
            ttl=self._state.ttl,
            mode=mode,
            limit=limit,
            max_hold=max_hold,
            labels=labels,
            reason=reason,
            wait=wait,
            on_lost=on_lost,
        )

    def claim(
        self, queue: str, *, wait: float | None = None, on_lost: LostCallback | None = None
    ) -> "TaskClaim | None":
        return self._client.claim(queue, wait=wait, session=self, on_lost=on_lost)

    def keepalive(self) -> None:
        """Renews now (the background thread does it anyway)."""
        answer = self._client._execute(routes.keepalive(self._state.id))
        expires_in_ms = require(expect_object(answer, "keepalive"), "expires_in_ms", int, "keepalive")
        self._state.record_renewal(answer.sent_at, expires_in_ms)

    def end(self, *, quiet: bool = False) -> None:
        """Ends the session (releasing all it holds) and stops its renewals."""
        self._watch.retired = True
        self._state.mark_lost(ENDED)
        self._renewer.stop()
        if self._state.pid != os.getpid():
            return
        try:
            self._client.end_session(self._state.id)
        except (NotFound, LeaseLost):
            pass
        except BatonError:
            if not quiet:
                raise

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: object) -> None:
        self.end(quiet=True)


class LeaseGuard(GuardView):
    """A lease held while the guard is entered: ``fence``, ``is_valid()`` (G7 from
    ``time.monotonic()``, counted from when the acquire or the last keepalive was *sent*),
    ``lost`` (a ``threading.Event`` set once when the lease is lost while held), and
    ``on_lost(reason)``, called once, before the G7 deadline, when renewals keep failing."""

    def __init__(
        self,
        client: Client,
        session: Session | None,
        resource: str,
        *,
        ttl: float,
        mode: str,
        limit: int | None,
        max_hold: float | None,
        labels: Mapping[str, str] | None,
        reason: str | None,
        wait: float | None,
        on_lost: LostCallback | None,
    ) -> None:
        self._client = client
        self._session = session
        self._request = dict(
            resource=resource,
            ttl=ttl,
            mode=mode,
            limit=limit,
            max_hold=max_hold,
            labels=labels,
            reason=reason,
            wait=wait,
        )
        self._on_lost = on_lost
        self.lost = threading.Event()
        self._state = None
        self._watch = None
        self._grant = {}
        self._what = f"the lease on {resource}"
        self._renewer: _Renewer | None = None
        self._released = False
        self._pid = os.getpid()

    def acquire(self) -> "LeaseGuard":
        """Acquires the lease (raises :class:`LeaseHeld` when denied)."""
        if self._state is not None:
            raise BatonError("this guard is already acquired", code="INVALID_ARGUMENT")
        request = self._request
        ttl = float(cast(float, request["ttl"]))
        max_hold = cast("float | None", request["max_hold"])
        session = self._session
        if session is not None:
            session._state_check()
        body = routes.acquire_body(
            str(request["resource"]),
            session_id=session.id if session is not None else None,
            holder=None if session is not None else self._client.holder,
            ttl_ms=None if session is not None else seconds_to_ms(ttl, "ttl"),
            mode=str(request["mode"]),
            limit=cast("int | None", request["limit"]),
            max_hold_ms=None if max_hold is None else seconds_to_ms(max_hold, "max_hold"),
            labels=cast("Mapping[str, str] | None", request["labels"]),
            reason=cast("str | None", request["reason"]),
        )
        try:
            answer = self._client._acquire_waiting(body, cast("float | None", request["wait"]))
        except LeaseLost as error:
            if session is not None:
                session._state.mark_lost(f"session ended (the server says: {error.message})")
            raise
        grant = expect_object(answer, "POST /v1/leases")
        session_id = require(grant, "session_id", str, "POST /v1/leases")
        require(grant, "fence", int, "POST /v1/leases")
        expires_in_ms = require(grant, "expires_in_ms", int, "POST /v1/leases")
        rate = self._client._config.clock_rate_error
        max_hold_ms = grant.get("max_hold_ms")
        max_hold_until = (
            valid_until(answer.sent_at, max_hold_ms, rate) if isinstance(max_hold_ms, int) else None
        )
        watch = Watch(self._on_lost, max_hold_until)
        watch.notify = self.lost.set
        if session is not None:
            state = session._state
            state.watches.append(watch)
            state.record_renewal(answer.sent_at, expires_in_ms)
        else:
            state = SessionState(
                session_id,
                str(grant.get("holder", self._client.holder)),
                ttl,
                True,
                valid_until(answer.sent_at, expires_in_ms, rate),
                rate,
            )
            state.watches.append(watch)
            self._renewer = _Renewer(self._client, state)
        self._grant = grant
        self._state = state
        self._watch = watch
        if self._renewer is not None:
            self._renewer.start(self)
        return self

    def wait_lost(self, timeout: float | None = None) -> str | None:
        """Blocks until the lease is lost (or ``timeout``); the reason, or None."""
        self.lost.wait(timeout)
        return self._watch.reason if self._watch is not None else None

    def pause_renewals(self) -> None:
        """Sends no more keepalives: the lease lapses at its deadline, and its loss is
        reported as when renewals fail. For tests and demonstrations."""
        if self._renewer is not None:
            self._renewer.paused = True

    def release(self) -> None:
        """Releases the lease (ends its own session, or releases it from the shared
        session). A guard of a forked child never releases its parent's lease."""
        if self._released or self._state is None or self._watch is None:
            return
        self._released = True
        self._watch.retired = True
        if self._pid != os.getpid():
            return
        if self._renewer is not None:
            self._state.mark_lost(ENDED)
            self._renewer.stop()
            try:
                self._client.end_session(self._state.id)
            except (NotFound, LeaseLost):
                pass
        else:
            if self._state.lost is not None:
                return
            try:
                self._client.release(self._state.id, self.resource)
            except LeaseLost:
                pass

    def __enter__(self) -> "LeaseGuard":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        try:
            self.release()
        except BatonError:
            pass  # the lease lapses with its TTL


class TaskClaim:
    """A claimed task: ``task`` (the task object), ``id``, ``payload``, ``fence``, ``attempt``,
    G7 validity like a guard's, and :meth:`complete`, :meth:`fail` and :meth:`release`, each
    fenced by the claim. Leaving a ``with`` block unsettled releases the task."""

    def __init__(
        self,
        client: Client,
        queue: str,
        claim: dict[str, Any],
        state: SessionState,
        renewer: _Renewer | None,
        on_lost: LostCallback | None,
    ) -> None:
        self._client = client
        self.queue = queue
        self.claim = claim
        self.task: dict[str, Any] = dict(claim.get("task") or {})
        self._state = state
        self._renewer = renewer
        self.lost = threading.Event()
        self._watch = Watch(on_lost, None)
        self._watch.notify = self.lost.set
        state.watches.append(self._watch)
        self._settled = False
        if renewer is not None:
            renewer.start(self)

    @property
    def id(self) -> str:
        return str(self.task.get("id", ""))

    @property
    def payload(self) -> Any:
        return self.task.get("payload")

    @property
    def fence(self) -> int:
        return int(self.claim["fence"])

    @property
    def attempt(self) -> int:
        return int(self.claim.get("attempt", 0))

    @property
    def session_id(self) -> str:
        return self._state.id

    def lost_reason(self) -> str | None:
        return self._state.watch_reason(self._watch)

    def is_valid(self) -> bool:
        return self.lost_reason() is None

    def ensure_valid(self) -> None:
        self._state.ensure_valid(self._watch, f"the claim on task {self.queue}/{self.id}")

    def _adopt_session(self) -> Session:
        """Hands this claim's own session to a :class:`Session` (the worker's)."""
        session = Session.__new__(Session)
        session._client = self._client
        session._state = self._state
        session.lost = threading.Event()
        session._watch = Watch(None, None)
        session._watch.notify = session.lost.set
        self._state.watches.append(session._watch)
        assert self._renewer is not None
        session._renewer = self._renewer
        self._renewer.rebind(session)  # renewed while the session lives, not only the claim
        self._renewer = None
        return session

    def _settle(self, call: Call) -> dict[str, Any]:
        self._settled = True
        self._watch.retired = True
        try:
            return self._client._object(call)
        finally:
            self._finish()

    def _finish(self) -> None:
        if self._renewer is not None:
            renewer, self._renewer = self._renewer, None
            self._state.mark_lost(ENDED)
            renewer.stop()
            try:
                self._client.end_session(self._state.id)
            except BatonError:
                pass

    def complete(self, result: Any = None) -> dict[str, Any]:
        """Completes the task (``StaleFence`` if the claim is no longer live)."""
        return self._settle(
            routes.complete_task(self.queue, self.id, self.session_id, self.fence, result)
        )

    def fail(self, reason: str, *, retry: bool = True) -> dict[str, Any]:
        """Fails this attempt: ready again while attempts remain (``retry=False``: dead now)."""
        return self._settle(
            routes.fail_task(self.queue, self.id, self.session_id, self.fence, reason, retry)
        )

    def release(self, note: str | None = None) -> dict[str, Any]:
        """Gives the task back without counting the attempt."""
        return self._settle(
            routes.release_task(self.queue, self.id, self.session_id, self.fence, note)
        )

    def __enter__(self) -> "TaskClaim":
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._settled and self._state.pid == os.getpid():
            try:
                self.release(DROPPED_NOTE)
            except BatonError:
                pass
        self._finish()


# ---------------------------------------------------------------------------------------------
# Events
# ---------------------------------------------------------------------------------------------


class EventStream:
    """Follows the namespace's events over server-sent events: an iterator of event objects
    (``{"revision", "namespace", "cluster_time_ms", "kind": {"type", ...}}``), each once, in
    revision order, across reconnections to any node (``Last-Event-ID``). ``endpoint`` is the
    node currently streaming; ``last_revision`` the last revision delivered."""

    def __init__(self, client: Client, after: int | None) -> None:
        self._client = client
        self._resume = Resume(after)
        self._response: httpx.Response | None = None
        self._lines: Iterator[str] | None = None
        self._closed = False
        self.endpoint: str | None = None

    @property
    def last_revision(self) -> int | None:
        return self._resume.delivered

    def __iter__(self) -> "EventStream":
        return self

    def __next__(self) -> dict[str, Any]:
        failing_since: float | None = None
        reconnects = 0
        while True:
            if self._closed:
                raise StopIteration
            if self._lines is None:
                opened = self._open()
                if opened is not None:
                    now = time.monotonic()
                    failing_since = failing_since or now
                    if now - failing_since >= self._client._config.retry_budget:
                        self.close()
                        raise Unavailable(
                            "the event stream could not be reopened within "
                            f"{self._client._config.retry_budget} s; last failure: {opened}"
                        )
                    reconnects += 1
                    pause = backoff(reconnects)
                    if opened.retry_after_ms is not None:
                        pause = min(opened.retry_after_ms / 1000.0, 2.0)
                    time.sleep(pause)
                    continue
                failing_since = None
                parser = SseParser()
                self._parser = parser
            assert self._lines is not None
            try:
                line = next(self._lines)
            except (StopIteration, httpx.HTTPError):
                self._drop()
                reconnects += 1
                time.sleep(backoff(reconnects))
                continue
            message = self._parser.line(line)
            if message is None:
                continue
            try:
                event = self._resume.accept(message)
            except BatonError as error:
                self._drop()
                if stream_error_is_final(error):
                    self.close()
                    raise
                continue
            if event is not None:
                return event

    def _open(self) -> BatonError | None:
        """One attempt on the preferred endpoint; the error when it failed."""
        client = self._client
        config = client._config
        index = client._route_state.preferred % len(config.endpoints)
        call = self._resume.call()
        base = config.endpoints[index].base
        count = len(config.endpoints)

        def rotate() -> None:
            client._route_state.preferred = (index + 1) % count

        try:
            request = client._http().build_request(
                "GET",
                base + call.path,
                headers=call.request_headers(),
                timeout=httpx.Timeout(STREAM_IDLE_MAX, connect=min(config.timeout, 2.0)),
            )
            response = client._http().send(request, stream=True)
        except httpx.HTTPError as error:
            failure = _transport_failure(error, config.timeout)
            if failure.tls:
                self.close()
                raise TLSError(f"{base}: the TLS handshake failed: {failure.message}") from None
            rotate()
            return Unavailable(f"{base}: {failure.message}")
        if response.status_code != 200:
            try:
                content = response.read()
            except httpx.HTTPError:
                content = b""
            finally:
                response.close()
            outcome = Response(response.status_code, response.headers, content)
            problem = _problem_of(outcome)
            if problem is None:
                rotate()
                malformed = ProtocolError(
                    f"{base}: HTTP {response.status_code} without a problem body",
                    status=response.status_code,
                )
                if 400 <= response.status_code < 500:
                    self.close()
                    raise malformed
                return malformed
            if stream_error_is_final(problem):
                self.close()
                raise problem
            rotate()
            return problem
        self._response = response
        self._lines = response.iter_lines()
        self.endpoint = base
        return None

    def _drop(self) -> None:
        response, self._response, self._lines = self._response, None, None
        if response is not None:
            try:
                response.close()
            except Exception:
                pass
        index = self._client._route_state.preferred
        self._client._route_state.preferred = (index + 1) % len(self._client._config.endpoints)

    def close(self) -> None:
        self._closed = True
        response, self._response, self._lines = self._response, None, None
        if response is not None:
            try:
                response.close()
            except Exception:
                pass

    def __enter__(self) -> "EventStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _problem_of(response: Response) -> BatonError | None:
    problem = _parse_problem(response)
    if problem is None:
        return None
    return error_from_problem(response.status, problem)


__all__ = [
    "Client",
    "Session",
    "LeaseGuard",
    "TaskClaim",
    "EventStream",
    "WorkReport",
]

