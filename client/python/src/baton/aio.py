"""The asyncio client: :class:`AsyncClient` and its sessions, guards, claims and event
streams. Same semantics as :mod:`baton.client`; renewals run as asyncio tasks."""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import time
import weakref
from typing import Any, AsyncIterator, Awaitable, Callable, Mapping, Sequence, TypeVar, cast

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
    _parse_problem,
    backoff,
    expect_object,
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
from ._tools import ClaimSpec, run_claimed_async
from .client import DROPPED_NOTE, TTL_DEFAULT, WorkReport, _fenced_by, _timeout, _transport_failure
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


class AsyncClient:
    """The asyncio twin of :class:`baton.Client` (same arguments, same environment)."""

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
        self._client: httpx.AsyncClient | None = None
        self._pid = os.getpid()

    @property
    def holder(self) -> str:
        return self._config.holder

    @property
    def namespace(self) -> str:
        return self._config.namespace or "default"

    def _http(self) -> httpx.AsyncClient:
        if self._client is None or self._pid != os.getpid():
            self._pid = os.getpid()
            self._client = httpx.AsyncClient(
                headers=self._config.headers(),
                verify=self._verify,
                trust_env=False,
                event_hooks=self._event_hooks,
            )
        return self._client

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _attempt(self, send: Send) -> Outcome:
        call = send.call
        url = self._config.endpoints[send.endpoint].base + call.path
        try:
            response = await self._http().request(
                call.method,
                url,
                content=call.content(),
                headers=call.request_headers(),
                timeout=_timeout(send.timeout),
            )
        except httpx.HTTPError as error:
            return _transport_failure(error, send.timeout)
        return Response(response.status_code, response.headers, response.content)

    async def _execute(self, call: Call) -> Answer:
        plan = run(call, self._config, self._route_state)
        outcome: Outcome | None = None
        try:
            step = next(plan)
            while True:
                if isinstance(step, Sleep):
                    await asyncio.sleep(step.seconds)
                    outcome = None
                else:
                    outcome = await self._attempt(step)
                step = plan.send(outcome)
        except StopIteration as stop:
            return cast(Answer, stop.value)

    async def _object(self, call: Call) -> dict[str, Any]:
        return expect_object(await self._execute(call), f"{call.method} {call.route}")

    # -- sessions --------------------------------------------------------------------------

    async def create_session(
        self, ttl: float = TTL_DEFAULT, *, labels: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        return await self._object(
            routes.create_session(self.holder, seconds_to_ms(ttl, "ttl"), labels)
        )

    async def session(
        self,
        ttl: float = TTL_DEFAULT,
        *,
        labels: Mapping[str, str] | None = None,
        on_lost: LostCallback | None = None,
    ) -> "AsyncSession":
        answer = await self._execute(
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
        return AsyncSession(self, state, on_lost)

    async def keepalive(self, session_id: str) -> dict[str, Any]:
        return await self._object(routes.keepalive(session_id))

    async def release(self, session_id: str, resource: str) -> dict[str, Any]:
        return await self._object(routes.release(session_id, resource))

    async def get_session(
        self, session_id: str, *, limit: int | None = None, cursor: str | None = None
    ) -> dict[str, Any]:
        return await self._object(routes.get_session(session_id, limit, cursor))

    async def end_session(self, session_id: str) -> dict[str, Any]:
        return await self._object(routes.end_session(session_id))

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
    ) -> "AsyncLeaseGuard":
        """``async with client.lease("src/auth.rs", ttl=30) as guard:`` (see
        :meth:`baton.Client.lease`)."""
        return AsyncLeaseGuard(
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

    async def acquire(
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
        return expect_object(await self._acquire_waiting(body, wait), "POST /v1/leases")

    async def _acquire_waiting(self, body: dict[str, Any], wait: float | None) -> Answer:
        if wait is None:
            return await self._execute(routes.acquire(body))
        wait_ms = seconds_to_ms(wait, "wait")
        deadline = time.monotonic() + wait_ms / 1000.0
        if "ttl_ms" in body:
            ttl_ms = int(body["ttl_ms"])
        else:
            info = await self.get_session(str(body["session_id"]))
            ttl_ms = int(require(info, "ttl_ms", int, "GET /v1/sessions/{id}"))
        round_max = min(max(ttl_ms // 3, 1), WAIT_MS_MAX) / 1000.0
        waiting = dict(body)
        created_id: str | None = None
        try:
            while True:
                round_seconds = max(0.0, min(deadline - time.monotonic(), round_max))
                waiting["wait_ms"] = int(round_seconds * 1000)
                try:
                    answer = await self._execute(routes.acquire(waiting, held=round_seconds))
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
                        await self.keepalive(session_id)
                        continue
                    if created_id is None:
                        await self.release(session_id, str(body["resource"]))
                    else:
                        await self._end_own_session(created_id)
                        created_id = None
                except LeaseLost:
                    if created_id is None:
                        raise  # the caller's own session is gone
                    await self._end_own_session(created_id)
                    created_id = None
                    waiting = dict(body)
                    if time.monotonic() < deadline:
                        continue
                return await self._execute(routes.acquire(body))
        except BaseException:
            if created_id is not None:
                try:
                    await self.end_session(created_id)
                except BatonError:
                    pass
            raise

    async def _end_own_session(self, session_id: str) -> None:
        try:
            await self.end_session(session_id)
        except NotFound:
            pass

    async def get_lease(self, resource: str) -> dict[str, Any]:
        return await self._object(routes.get_lease(resource))

    async def list_leases(
        self, prefix: str | None = None, *, limit: int | None = None, cursor: str | None = None
    ) -> dict[str, Any]:
        return await self._object(routes.list_leases(prefix, limit, cursor))

    async def iter_leases(self, prefix: str | None = None) -> AsyncIterator[dict[str, Any]]:
        cursor: str | None = None
        while True:
            page = await self.list_leases(prefix, cursor=cursor)
            for lease in page.get("leases", []):
                yield lease
            cursor = page.get("next_cursor")
            if not cursor:
                return

    async def fence_check(self, resource: str, fence: int) -> dict[str, Any]:
        return await self._object(routes.fence_check(resource, fence))

    # -- key-value store ---------------------------------------------------------------------

    async def kv_get(self, key: str) -> dict[str, Any]:
        return await self._object(routes.kv_get(key))

    async def kv_put(
        self,
        key: str,
        value: Any,
        *,
        guard: GuardView | None = None,
        fence: tuple[str, int] | None = None,
        session_id: str | None = None,
    ) -> dict[str, Any]:
        fence, session_id = _fenced_by(guard, fence, session_id)
        return await self._object(routes.kv_put(key, value, fence, session_id))

    async def kv_delete(
        self,
        key: str,
        *,
        guard: GuardView | None = None,
        fence: tuple[str, int] | None = None,
        session_id: str | None = None,
    ) -> dict[str, Any]:
        fence, session_id = _fenced_by(guard, fence, session_id)
        return await self._object(routes.kv_delete(key, fence, session_id))

    async def txn(
        self,
        compare: Sequence[Mapping[str, Any]] = (),
        success: Sequence[Mapping[str, Any]] = (),
        failure: Sequence[Mapping[str, Any]] = (),
        *,
        session_id: str | None = None,
        guard: "GuardView | AsyncTaskClaim | None" = None,
    ) -> dict[str, Any]:
        if guard is not None:
            guard.ensure_valid()
            session_id = guard.session_id
        return await self._object(routes.txn(session_id, compare, success, failure))

    # -- work queues -------------------------------------------------------------------------

    async def enqueue(
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
        body = routes.enqueue_body(
            payload,
            id=id,
            priority=priority,
            depends_on=depends_on,
            max_attempts=max_attempts,
            not_before_ms=None if not_before is None else seconds_to_ms(not_before, "not_before"),
            on_dead=on_dead,
        )
        return await self._object(routes.enqueue(queue, body))

    async def claim(
        self,
        queue: str,
        *,
        ttl: float = TTL_DEFAULT,
        wait: float | None = None,
        session: "AsyncSession | None" = None,
        on_lost: LostCallback | None = None,
    ) -> "AsyncTaskClaim | None":
        wait_ms = None if wait is None else seconds_to_ms(wait, "wait")
        if session is not None:
            session._state_check()
            call = routes.claim(queue, session_id=session.id, wait_ms=wait_ms)
        else:
            call = routes.claim(
                queue, holder=self.holder, ttl_ms=seconds_to_ms(ttl, "ttl"), wait_ms=wait_ms
            )
        try:
            answer = await self._execute(call)
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
            return AsyncTaskClaim(self, queue, value, session._state, None, on_lost)
        state = SessionState(
            session_id,
            self.holder,
            ttl,
            True,
            valid_until(answer.sent_at, expires_in_ms, self._config.clock_rate_error),
            self._config.clock_rate_error,
        )
        return AsyncTaskClaim(self, queue, value, state, _AsyncRenewer(self, state), on_lost)

    async def complete_task(
        self, queue: str, task_id: str, *, session_id: str, fence: int, result: Any = None
    ) -> dict[str, Any]:
        return await self._object(routes.complete_task(queue, task_id, session_id, fence, result))

    async def fail_task(
        self,
        queue: str,
        task_id: str,
        *,
        session_id: str,
        fence: int,
        reason: str,
        retry: bool | None = None,
    ) -> dict[str, Any]:
        return await self._object(
            routes.fail_task(queue, task_id, session_id, fence, reason, retry)
        )

    async def release_task(
        self, queue: str, task_id: str, *, session_id: str, fence: int, note: str | None = None
    ) -> dict[str, Any]:
        return await self._object(routes.release_task(queue, task_id, session_id, fence, note))

    async def queue_info(self, queue: str) -> dict[str, Any]:
        return await self._object(routes.queue_info(queue))

    async def list_queues(
        self, *, limit: int | None = None, cursor: str | None = None
    ) -> dict[str, Any]:
        return await self._object(routes.list_queues(limit, cursor))

    async def list_tasks(
        self,
        queue: str,
        *,
        state: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        return await self._object(routes.list_tasks(queue, state, limit, cursor))

    async def work(
        self,
        queue: str,
        handler: Callable[["AsyncTaskClaim"], Awaitable[Any]],
        *,
        ttl: float = TTL_DEFAULT,
        max_tasks: int | None = None,
        wait: float | None = None,
    ) -> WorkReport:
        """The worker loop of :meth:`baton.Client.work`; a handler whose claim is lost while
        it runs is cancelled."""
        report = WorkReport()
        session: AsyncSession | None = None
        try:
            while max_tasks is None or report.completed + report.failed < max_tasks:
                if session is None:
                    claim = await self.claim(queue, ttl=ttl, wait=wait)
                    if claim is not None:
                        session = claim._adopt_session()
                else:
                    claim = await self.claim(queue, wait=wait, session=session)
                if claim is None:
                    report.stopped = "queue_empty"
                    return report
                running = asyncio.ensure_future(handler(claim))
                lost = asyncio.ensure_future(claim.lost.wait())
                await asyncio.wait({running, lost}, return_when=asyncio.FIRST_COMPLETED)
                if not running.done():
                    running.cancel()
                    report.stopped = "claim_lost"
                    report.task_id = claim.id
                    report.reason = claim.lost_reason()
                    return report
                lost.cancel()
                try:
                    error = running.exception()
                    if error is None:
                        await claim.complete(running.result())
                        report.completed += 1
                    else:
                        await claim.fail(f"{type(error).__name__}: {error}", retry=True)
                        report.failed += 1
                except (StaleFence, LeaseLost) as error2:
                    report.stopped = "claim_lost"
                    report.task_id = claim.id
                    report.reason = str(error2)
                    return report
            report.stopped = "max_tasks"
            return report
        finally:
            if session is not None:
                await session.end(quiet=True)

    # -- events ------------------------------------------------------------------------------

    async def events(self, *, after: int | None = None, limit: int | None = None) -> dict[str, Any]:
        return await self._object(routes.events(after, limit))

    def follow_events(self, after: int | None = None) -> "AsyncEventStream":
        """``async for event in client.follow_events(after=rev):`` (see
        :meth:`baton.Client.follow_events`)."""
        return AsyncEventStream(self, after)

    # -- access control, limits, cluster -----------------------------------------------------

    async def create_token(
        self,
        name: str,
        role: str,
        namespaces: Sequence[str],
        *,
        quotas: Mapping[str, int] | None = None,
    ) -> dict[str, Any]:
        return await self._object(routes.create_token(name, role, namespaces, quotas))

    async def list_tokens(self) -> dict[str, Any]:
        return await self._object(routes.list_tokens())

    async def revoke_token(self, name: str) -> dict[str, Any]:
        return await self._object(routes.revoke_token(name))

    async def limits(self) -> dict[str, Any]:
        return await self._object(routes.get_limits())

    async def set_limits(self, **changes: int) -> dict[str, Any]:
        return await self._object(routes.set_limits(changes))

    async def cluster_status(self) -> dict[str, Any]:
        return await self._object(routes.cluster_status())

    async def add_member(
        self, id: int, api_addr: str, peer_addr: str, *, voter: bool | None = None
    ) -> dict[str, Any]:
        return await self._object(routes.add_member(id, api_addr, peer_addr, voter))

    async def remove_member(self, id: int) -> dict[str, Any]:
        return await self._object(routes.remove_member(id))

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
        """The decorator of :meth:`baton.Client.claims`, for ``async def`` tools."""
        spec = ClaimSpec(resource_of, ttl, mode, wait, reason)

        def decorate(tool: F) -> F:
            if not inspect.iscoroutinefunction(tool):
                raise TypeError(
                    "AsyncClient.claims wraps async tools; use Client.claims for sync ones"
                )

            async def open_claim(spec: ClaimSpec, resource: str) -> AsyncLeaseGuard:
                guard = self.lease(
                    resource, spec.ttl, mode=spec.mode, wait=spec.wait, reason=spec.reason
                )
                return await guard.acquire()

            async def release(guard: AsyncLeaseGuard) -> None:
                await guard.release()

            @functools.wraps(tool)
            async def wrapper(*args: Any, **kwargs: Any) -> Any:
                return await run_claimed_async(open_claim, release, spec, tool, args, kwargs)

            return cast(F, wrapper)

        return decorate


# ---------------------------------------------------------------------------------------------


class _AsyncRenewer:
    """The keepalive task of one session (see ``baton.client._Renewer``)."""

    def __init__(self, client: AsyncClient, state: SessionState) -> None:
        self.client = client
        self.state = state
        self.stop_event = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.paused = False

    def start(self, owner: object) -> None:
        self.owner_ref: "weakref.ref[object]" = weakref.ref(owner)
        self.task = asyncio.get_running_loop().create_task(self._loop())

    def rebind(self, owner: object) -> None:
        self.owner_ref = weakref.ref(owner)

    async def stop(self) -> None:
        self.stop_event.set()
        task = self.task
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass

    async def _loop(self) -> None:
        state = self.state
        interval = state.ttl / 3.0
        retry_max = max(state.ttl / 10.0, KEEPALIVE_RETRY_INITIAL)
        retry = KEEPALIVE_RETRY_INITIAL
        next_renewal = time.monotonic() + interval
        while not self.stop_event.is_set():
            wake = min(next_renewal, state.next_report_at())
            try:
                await asyncio.wait_for(
                    self.stop_event.wait(), timeout=max(0.0, wake - time.monotonic())
                )
                return
            except asyncio.TimeoutError:
                pass
            if self.owner_ref() is None:
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
            call = routes.keepalive(state.id)
            call.timeout = state.keepalive_timeout(self.client._config.timeout)
            call.budget = max(0.0, state.valid_until - state.margin - now)
            started = time.monotonic()
            try:
                answer = await self.client._execute(call)
                expires_in_ms = require(
                    expect_object(answer, "keepalive"), "expires_in_ms", int, "keepalive"
                )
            except (LeaseLost, NotFound) as error:
                state.mark_lost(f"session ended (the server says: {error.message})")
                return
            except Exception:
                next_renewal = time.monotonic() + retry
                retry = min(retry * 2, retry_max)
                continue
            state.record_renewal(answer.sent_at, expires_in_ms)
            retry = KEEPALIVE_RETRY_INITIAL
            next_renewal = started + interval


class AsyncSession:
    """The asyncio twin of :class:`baton.Session`."""

    def __init__(
        self, client: AsyncClient, state: SessionState, on_lost: LostCallback | None
    ) -> None:
        self._client = client
        self._state = state
        self.lost = asyncio.Event()
        self._watch = Watch(on_lost, None)
        self._watch.notify = self.lost.set
        state.watches.append(self._watch)
        self._renewer = _AsyncRenewer(client, state)
        self._renewer.start(self)

    @property
    def id(self) -> str:
        return self._state.id

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
    ) -> "AsyncLeaseGuard":
        return AsyncLeaseGuard(
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

    async def claim(
        self, queue: str, *, wait: float | None = None, on_lost: LostCallback | None = None
    ) -> "AsyncTaskClaim | None":
        return await self._client.claim(queue, wait=wait, session=self, on_lost=on_lost)

    async def end(self, *, quiet: bool = False) -> None:
        self._watch.retired = True
        self._state.mark_lost(ENDED)
        await self._renewer.stop()
        try:
            await self._client.end_session(self._state.id)
        except (NotFound, LeaseLost):
            pass
        except BatonError:
            if not quiet:
                raise

    async def __aenter__(self) -> "AsyncSession":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.end(quiet=True)


class AsyncLeaseGuard(GuardView):
    """The asyncio twin of :class:`baton.LeaseGuard`; ``lost`` is an ``asyncio.Event``."""

    def __init__(
        self,
        client: AsyncClient,
        session: AsyncSession | None,
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
        self._resource_asked = resource
        self._ttl = ttl
        self._mode = mode
        self._limit = limit
        self._max_hold = max_hold
        self._labels = labels
        self._reason = reason
        self._wait = wait
        self._on_lost = on_lost
        self.lost = asyncio.Event()
        self._state = None
        self._watch = None
        self._grant = {}
        self._what = f"the lease on {resource}"
        self._renewer: _AsyncRenewer | None = None
        self._released = False

    async def acquire(self) -> "AsyncLeaseGuard":
        if self._state is not None:
            raise BatonError("this guard is already acquired", code="INVALID_ARGUMENT")
        session = self._session
        if session is not None:
            session._state_check()
        body = routes.acquire_body(
            self._resource_asked,
            session_id=session.id if session is not None else None,
            holder=None if session is not None else self._client.holder,
            ttl_ms=None if session is not None else seconds_to_ms(self._ttl, "ttl"),
            mode=self._mode,
            limit=self._limit,
            max_hold_ms=(
                None if self._max_hold is None else seconds_to_ms(self._max_hold, "max_hold")
            ),
            labels=self._labels,
            reason=self._reason,
        )
        try:
            answer = await self._client._acquire_waiting(body, self._wait)
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
                self._ttl,
                True,
                valid_until(answer.sent_at, expires_in_ms, rate),
                rate,
            )
            state.watches.append(watch)
            self._renewer = _AsyncRenewer(self._client, state)
        self._grant = grant
        self._state = state
        self._watch = watch
        if self._renewer is not None:
            self._renewer.start(self)
        return self

    def pause_renewals(self) -> None:
        """Sends no more keepalives (the lease lapses at its deadline, and the loss is
        reported as when renewals fail). For tests and demonstrations."""
        if self._renewer is not None:
            self._renewer.paused = True

    async def release(self) -> None:
        if self._released or self._state is None or self._watch is None:
            return
        self._released = True
        self._watch.retired = True
        if self._state.pid != os.getpid():
            return
        if self._renewer is not None:
            self._state.mark_lost(ENDED)
            await self._renewer.stop()
            try:
                await self._client.end_session(self._state.id)
            except (NotFound, LeaseLost):
                pass
        else:
            if self._state.lost is not None:
                return
            try:
                await self._client.release(self._state.id, self.resource)
            except LeaseLost:
                pass

    async def __aenter__(self) -> "AsyncLeaseGuard":
        return await self.acquire()

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.release()
        except BatonError:
            pass


class AsyncTaskClaim:
    """The asyncio twin of :class:`baton.TaskClaim`."""

    def __init__(
        self,
        client: AsyncClient,
        queue: str,
        claim: dict[str, Any],
        state: SessionState,
        renewer: _AsyncRenewer | None,
        on_lost: LostCallback | None,
    ) -> None:
        self._client = client
        self.queue = queue
        self.claim = claim
        self.task: dict[str, Any] = dict(claim.get("task") or {})
        self._state = state
        self._renewer = renewer
        self.lost = asyncio.Event()
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

    def _adopt_session(self) -> AsyncSession:
        session = AsyncSession.__new__(AsyncSession)
        session._client = self._client
        session._state = self._state
        session.lost = asyncio.Event()
        session._watch = Watch(None, None)
        session._watch.notify = session.lost.set
        self._state.watches.append(session._watch)
        assert self._renewer is not None
        session._renewer = self._renewer
        self._renewer.rebind(session)
        self._renewer = None
        return session

    async def _settle(self, call: Call) -> dict[str, Any]:
        self._settled = True
        self._watch.retired = True
        try:
            return await self._client._object(call)
        finally:
            await self._finish()

    async def _finish(self) -> None:
        if self._renewer is not None:
            renewer, self._renewer = self._renewer, None
            self._state.mark_lost(ENDED)
            await renewer.stop()
            try:
                await self._client.end_session(self._state.id)
            except BatonError:
                pass

    async def complete(self, result: Any = None) -> dict[str, Any]:
        return await self._settle(
            routes.complete_task(self.queue, self.id, self.session_id, self.fence, result)
        )

    async def fail(self, reason: str, *, retry: bool = True) -> dict[str, Any]:
        return await self._settle(
            routes.fail_task(self.queue, self.id, self.session_id, self.fence, reason, retry)
        )

    async def release(self, note: str | None = None) -> dict[str, Any]:
        return await self._settle(
            routes.release_task(self.queue, self.id, self.session_id, self.fence, note)
        )

    async def __aenter__(self) -> "AsyncTaskClaim":
        return self

    async def __aexit__(self, *exc: object) -> None:
        if not self._settled:
            try:
                await self.release(DROPPED_NOTE)
            except BatonError:
                pass
        await self._finish()


class AsyncEventStream:
    """The asyncio twin of :class:`baton.EventStream`: ``async for event in stream``."""

    def __init__(self, client: AsyncClient, after: int | None) -> None:
        self._client = client
        self._resume = Resume(after)
        self._response: httpx.Response | None = None
        self._lines: AsyncIterator[str] | None = None
        self._parser = SseParser()
        self._closed = False
        self.endpoint: str | None = None

    @property
    def last_revision(self) -> int | None:
        return self._resume.delivered

    def __aiter__(self) -> "AsyncEventStream":
        return self

    async def __anext__(self) -> dict[str, Any]:
        failing_since: float | None = None
        reconnects = 0
        while True:
            if self._closed:
                raise StopAsyncIteration
            if self._lines is None:
                failure = await self._open()
                if failure is not None:
                    now = time.monotonic()
                    failing_since = failing_since or now
                    if now - failing_since >= self._client._config.retry_budget:
                        await self.aclose()
                        raise Unavailable(
                            "the event stream could not be reopened within "
                            f"{self._client._config.retry_budget} s; last failure: {failure}"
                        )
                    reconnects += 1
                    pause = backoff(reconnects)
                    if failure.retry_after_ms is not None:
                        pause = min(failure.retry_after_ms / 1000.0, 2.0)
                    await asyncio.sleep(pause)
                    continue
                failing_since = None
                self._parser = SseParser()
            assert self._lines is not None
            try:
                line = await self._lines.__anext__()
            except (StopAsyncIteration, httpx.HTTPError):
                await self._drop()
                reconnects += 1
                await asyncio.sleep(backoff(reconnects))
                continue
            message = self._parser.line(line)
            if message is None:
                continue
            try:
                event = self._resume.accept(message)
            except BatonError as error:
                await self._drop()
                if stream_error_is_final(error):
                    await self.aclose()
                    raise
                continue
            if event is not None:
                return event

    async def _open(self) -> BatonError | None:
        client = self._client
        config = client._config
        count = len(config.endpoints)
        index = client._route_state.preferred % count
        call = self._resume.call()
        base = config.endpoints[index].base

        def rotate() -> None:
            client._route_state.preferred = (index + 1) % count

        try:
            request = client._http().build_request(
                "GET",
                base + call.path,
                headers=call.request_headers(),
                timeout=httpx.Timeout(STREAM_IDLE_MAX, connect=min(config.timeout, 2.0)),
            )
            response = await client._http().send(request, stream=True)
        except httpx.HTTPError as error:
            failure = _transport_failure(error, config.timeout)
            if failure.tls:
                await self.aclose()
                raise TLSError(f"{base}: the TLS handshake failed: {failure.message}") from None
            rotate()
            return Unavailable(f"{base}: {failure.message}")
        if response.status_code != 200:
            try:
                content = await response.aread()
            except httpx.HTTPError:
                content = b""
            finally:
                await response.aclose()
            problem = _parse_problem(Response(response.status_code, response.headers, content))
            if problem is None:
                rotate()
                malformed = ProtocolError(
                    f"{base}: HTTP {response.status_code} without a problem body",
                    status=response.status_code,
                )
                if 400 <= response.status_code < 500:
                    await self.aclose()
                    raise malformed
                return malformed
            refusal = error_from_problem(response.status_code, problem)
            if stream_error_is_final(refusal):
                await self.aclose()
                raise refusal
            rotate()
            return refusal
        self._response = response
        self._lines = response.aiter_lines()
        self.endpoint = base
        return None

    async def _drop(self) -> None:
        response, self._response, self._lines = self._response, None, None
        if response is not None:
            try:
                await response.aclose()
            except Exception:
                pass
        state = self._client._route_state
        state.preferred = (state.preferred + 1) % len(self._client._config.endpoints)

    async def aclose(self) -> None:
        self._closed = True
        response, self._response, self._lines = self._response, None, None
        if response is not None:
            try:
                await response.aclose()
            except Exception:
                pass

    async def __aenter__(self) -> "AsyncEventStream":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
