"""Every route the client sends, as a :class:`Call` builder: one place that names each
method, path template and body field (the OpenAPI conformance test checks this table)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ._core import WAIT_MS_MAX, Call, encode_name, encode_path, query_string
from .errors import InvalidArgument

MODES = ("exclusive", "subtree", "shared")
TASK_STATES = ("ready", "waiting", "claimed", "done", "dead")


def _put(body: dict[str, Any], name: str, value: Any) -> None:
    if value is not None:
        body[name] = value


# Sessions ------------------------------------------------------------------------------------


def create_session(holder: str, ttl_ms: int, labels: Mapping[str, str] | None = None) -> Call:
    body: dict[str, Any] = {"holder": holder, "ttl_ms": ttl_ms}
    _put(body, "labels", dict(labels) if labels else None)
    return Call("POST", "/v1/sessions", "/v1/sessions", body, mutation=True)


def keepalive(session_id: str) -> Call:
    path = f"/v1/sessions/{encode_name(session_id, 'session id')}/keepalive"
    return Call("POST", "/v1/sessions/{id}/keepalive", path, mutation=True)


def release(session_id: str, resource: str) -> Call:
    path = f"/v1/sessions/{encode_name(session_id, 'session id')}/release"
    return Call(
        "POST", "/v1/sessions/{id}/release", path, {"resource": resource}, mutation=True
    )


def get_session(session_id: str, limit: int | None = None, cursor: str | None = None) -> Call:
    path = f"/v1/sessions/{encode_name(session_id, 'session id')}"
    return Call("GET", "/v1/sessions/{id}", path + query_string({"limit": limit, "cursor": cursor}))


def end_session(session_id: str) -> Call:
    path = f"/v1/sessions/{encode_name(session_id, 'session id')}"
    return Call("DELETE", "/v1/sessions/{id}", path, mutation=True)


# Leases --------------------------------------------------------------------------------------


def acquire_body(
    resource: str,
    *,
    session_id: str | None = None,
    holder: str | None = None,
    ttl_ms: int | None = None,
    mode: str = "exclusive",
    limit: int | None = None,
    max_hold_ms: int | None = None,
    labels: Mapping[str, str] | None = None,
    reason: str | None = None,
    wait_ms: int | None = None,
) -> dict[str, Any]:
    if mode not in MODES:
        raise InvalidArgument(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    if (mode == "shared") != (limit is not None):
        raise InvalidArgument("limit goes with mode='shared', and only with it")
    if (session_id is None) == (holder is None or ttl_ms is None):
        raise InvalidArgument("give either session_id, or both holder and ttl")
    if wait_ms is not None and not 0 <= wait_ms <= WAIT_MS_MAX:
        raise InvalidArgument(f"wait must be 0 to {WAIT_MS_MAX // 1000} s")
    body: dict[str, Any] = {"resource": resource}
    _put(body, "session_id", session_id)
    _put(body, "holder", holder if session_id is None else None)
    _put(body, "ttl_ms", ttl_ms if session_id is None else None)
    if mode != "exclusive":
        body["mode"] = mode
    _put(body, "limit", limit)
    _put(body, "max_hold_ms", max_hold_ms)
    _put(body, "labels", dict(labels) if labels else None)
    _put(body, "reason", reason)
    _put(body, "wait_ms", wait_ms)
    return body


def acquire(body: Mapping[str, Any], held: float = 0.0) -> Call:
    return Call("POST", "/v1/leases", "/v1/leases", dict(body), mutation=True, held=held)


def get_lease(resource: str) -> Call:
    return Call("GET", "/v1/leases/{resource}", f"/v1/leases/{encode_path(resource)}")


def list_leases(
    prefix: str | None = None, limit: int | None = None, cursor: str | None = None
) -> Call:
    query = query_string({"prefix": prefix, "limit": limit, "cursor": cursor})
    return Call("GET", "/v1/leases", "/v1/leases" + query)


def fence_check(resource: str, fence: int) -> Call:
    body = {"resource": resource, "fence": fence}
    return Call("POST", "/v1/fence/check", "/v1/fence/check", body)


# Key-value store -----------------------------------------------------------------------------


def _fence_fields(
    body: dict[str, Any], fence: tuple[str, int] | None, session_id: str | None
) -> None:
    if (fence is None) != (session_id is None):
        raise InvalidArgument("a fenced write needs both the fence and its session_id")
    if fence is not None:
        body["fence"] = {"resource": fence[0], "token": fence[1]}
        body["session_id"] = session_id


def kv_get(key: str) -> Call:
    return Call("GET", "/v1/kv/{key}", f"/v1/kv/{encode_path(key, 'key')}")


def kv_put(
    key: str, value: Any, fence: tuple[str, int] | None = None, session_id: str | None = None
) -> Call:
    body: dict[str, Any] = {"value": value}
    _fence_fields(body, fence, session_id)
    return Call("PUT", "/v1/kv/{key}", f"/v1/kv/{encode_path(key, 'key')}", body, mutation=True)


def kv_delete(
    key: str, fence: tuple[str, int] | None = None, session_id: str | None = None
) -> Call:
    body: dict[str, Any] = {}
    _fence_fields(body, fence, session_id)
    path = f"/v1/kv/{encode_path(key, 'key')}"
    if body:
        return Call("DELETE", "/v1/kv/{key}", path, body, mutation=True)
    return Call("DELETE", "/v1/kv/{key}", path, mutation=True)


# Work queues ---------------------------------------------------------------------------------


def enqueue_body(
    payload: Any,
    *,
    id: str | None = None,
    priority: int | None = None,
    depends_on: Sequence[str] | None = None,
    max_attempts: int | None = None,
    not_before_ms: int | None = None,
    on_dead: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"payload": payload}
    _put(body, "id", id)
    _put(body, "priority", priority)
    _put(body, "depends_on", list(depends_on) if depends_on else None)
    _put(body, "max_attempts", max_attempts)
    _put(body, "not_before_ms", not_before_ms)
    if on_dead is not None:
        unknown = set(on_dead) - {"queue", "payload", "max_attempts"}
        if unknown or "queue" not in on_dead or "payload" not in on_dead:
            raise InvalidArgument("on_dead is {'queue', 'payload', 'max_attempts'?}")
        body["on_dead"] = dict(on_dead)
    return body


def enqueue(queue: str, body: Mapping[str, Any]) -> Call:
    path = f"/v1/queues/{encode_name(queue, 'queue')}/tasks"
    return Call("POST", "/v1/queues/{queue}/tasks", path, dict(body), mutation=True)


def claim(
    queue: str,
    *,
    session_id: str | None = None,
    holder: str | None = None,
    ttl_ms: int | None = None,
    wait_ms: int | None = None,
) -> Call:
    if (session_id is None) == (holder is None or ttl_ms is None):
        raise InvalidArgument("give either session_id, or both holder and ttl")
    if wait_ms is not None and not 0 <= wait_ms <= WAIT_MS_MAX:
        raise InvalidArgument(f"wait must be 0 to {WAIT_MS_MAX // 1000} s")
    body: dict[str, Any] = {}
    _put(body, "session_id", session_id)
    _put(body, "holder", holder if session_id is None else None)
    _put(body, "ttl_ms", ttl_ms if session_id is None else None)
    _put(body, "wait_ms", wait_ms)
    path = f"/v1/queues/{encode_name(queue, 'queue')}/claim"
    held = (wait_ms or 0) / 1000.0
    return Call("POST", "/v1/queues/{queue}/claim", path, body, mutation=True, held=held)


def _task_path(queue: str, task_id: str, action: str) -> str:
    return (
        f"/v1/queues/{encode_name(queue, 'queue')}/tasks/"
        f"{encode_name(task_id, 'task id')}/{action}"
    )


def complete_task(
    queue: str, task_id: str, session_id: str, fence: int, result: Any = None
) -> Call:
    body: dict[str, Any] = {"session_id": session_id, "fence": fence}
    _put(body, "result", result)
    return Call(
        "POST",
        "/v1/queues/{queue}/tasks/{id}/complete",
        _task_path(queue, task_id, "complete"),
        body,
        mutation=True,
    )


def fail_task(
    queue: str, task_id: str, session_id: str, fence: int, reason: str, retry: bool | None = None
) -> Call:
    body: dict[str, Any] = {"session_id": session_id, "fence": fence, "reason": reason}
    _put(body, "retry", retry)
    return Call(
        "POST",
        "/v1/queues/{queue}/tasks/{id}/fail",
        _task_path(queue, task_id, "fail"),
        body,
        mutation=True,
    )


def release_task(
    queue: str, task_id: str, session_id: str, fence: int, note: str | None = None
) -> Call:
    body: dict[str, Any] = {"session_id": session_id, "fence": fence}
    _put(body, "note", note)
    return Call(
        "POST",
        "/v1/queues/{queue}/tasks/{id}/release",
        _task_path(queue, task_id, "release"),
        body,
        mutation=True,
    )


def queue_info(queue: str) -> Call:
    return Call("GET", "/v1/queues/{queue}", f"/v1/queues/{encode_name(queue, 'queue')}")


def list_queues(limit: int | None = None, cursor: str | None = None) -> Call:
    return Call("GET", "/v1/queues", "/v1/queues" + query_string({"limit": limit, "cursor": cursor}))


def list_tasks(
    queue: str, state: str | None = None, limit: int | None = None, cursor: str | None = None
) -> Call:
    if state is not None and state not in TASK_STATES:
        raise InvalidArgument(f"state must be one of {', '.join(TASK_STATES)}, not {state!r}")
    path = f"/v1/queues/{encode_name(queue, 'queue')}/tasks"
    query = query_string({"state": state, "limit": limit, "cursor": cursor})
    return Call("GET", "/v1/queues/{queue}/tasks", path + query)


# Transactions --------------------------------------------------------------------------------


def txn(
    session_id: str | None,
    compare: Sequence[Mapping[str, Any]],
    success: Sequence[Mapping[str, Any]],
    failure: Sequence[Mapping[str, Any]],
) -> Call:
    body: dict[str, Any] = {}
    _put(body, "session_id", session_id)
    if compare:
        body["compare"] = [dict(c) for c in compare]
    if success:
        body["success"] = [dict(op) for op in success]
    if failure:
        body["failure"] = [dict(op) for op in failure]
    return Call("POST", "/v1/txn", "/v1/txn", body, mutation=True)


# Events --------------------------------------------------------------------------------------


def events(after: int | None = None, limit: int | None = None) -> Call:
    return Call("GET", "/v1/events", "/v1/events" + query_string({"after": after, "limit": limit}))


# Access control, limits, cluster -------------------------------------------------------------


def create_token(
    name: str,
    role: str,
    namespaces: Sequence[str],
    quotas: Mapping[str, int] | None = None,
) -> Call:
    body: dict[str, Any] = {"name": name, "role": role, "namespaces": list(namespaces)}
    _put(body, "quotas", dict(quotas) if quotas is not None else None)
    return Call("POST", "/v1/auth/tokens", "/v1/auth/tokens", body, mutation=True)


def list_tokens() -> Call:
    return Call("GET", "/v1/auth/tokens", "/v1/auth/tokens")


def revoke_token(name: str) -> Call:
    path = f"/v1/auth/tokens/{encode_name(name, 'token name')}"
    return Call("DELETE", "/v1/auth/tokens/{name}", path, mutation=True)


def get_limits() -> Call:
    return Call("GET", "/v1/limits", "/v1/limits")


def set_limits(changes: Mapping[str, int]) -> Call:
    if not changes:
        raise InvalidArgument("give at least one limit to change")
    return Call("PUT", "/v1/limits", "/v1/limits", dict(changes), mutation=True)


def cluster_status() -> Call:
    return Call("GET", "/v1/cluster", "/v1/cluster")


def add_member(id: int, api_addr: str, peer_addr: str, voter: bool | None = None) -> Call:
    body: dict[str, Any] = {"id": id, "api_addr": api_addr, "peer_addr": peer_addr}
    _put(body, "voter", voter)
    return Call("POST", "/v1/cluster/members", "/v1/cluster/members", body, mutation=True)


def remove_member(id: int) -> Call:
    return Call(
        "DELETE", "/v1/cluster/members/{id}", f"/v1/cluster/members/{int(id)}", mutation=True
    )
