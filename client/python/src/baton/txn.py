"""Builders of the compares and ops of ``POST /v1/txn`` (docs/api.md, "Transactions").

    client.txn(
        compare=[txn.fence("repo/build", guard.fence)],
        success=[txn.put("results/build", {"ok": True}), txn.release("repo/build")],
        guard=guard,
    )
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ._routes import enqueue_body


def fence(resource: str, token: int) -> dict[str, Any]:
    """Holds when ``token`` is the live fence of ``resource`` held by the txn's session."""
    return {"fence": {"resource": resource, "token": token}}


def kv_revision(key: str, revision: int) -> dict[str, Any]:
    """Holds when ``key``'s revision is ``revision`` (0: the key is absent)."""
    return {"kv": key, "revision": revision}


def put(key: str, value: Any) -> dict[str, Any]:
    return {"op": "put", "key": key, "value": value}


def delete(key: str) -> dict[str, Any]:
    return {"op": "delete", "key": key}


def release(resource: str) -> dict[str, Any]:
    return {"op": "release", "resource": resource}


def add_task(
    queue: str,
    payload: Any,
    *,
    id: str | None = None,
    priority: int | None = None,
    depends_on: Sequence[str] | None = None,
    max_attempts: int | None = None,
    not_before_ms: int | None = None,
    on_dead: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    task = enqueue_body(
        payload,
        id=id,
        priority=priority,
        depends_on=depends_on,
        max_attempts=max_attempts,
        not_before_ms=not_before_ms,
        on_dead=on_dead,
    )
    return {"op": "add_task", "queue": queue, "task": task}


def complete_task(queue: str, id: str, fence: int, result: Any = None) -> dict[str, Any]:
    op: dict[str, Any] = {"op": "complete_task", "queue": queue, "id": id, "fence": fence}
    if result is not None:
        op["result"] = result
    return op


def fail_task(
    queue: str, id: str, fence: int, reason: str, retry: bool | None = None
) -> dict[str, Any]:
    op: dict[str, Any] = {
        "op": "fail_task", "queue": queue, "id": id, "fence": fence, "reason": reason
    }
    if retry is not None:
        op["retry"] = retry
    return op
