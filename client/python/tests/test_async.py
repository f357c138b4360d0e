"""The asyncio client against a real cluster."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import baton
from baton import txn


async def test_async_lease_renews_denies_and_fences(aclient: baton.AsyncClient,
                                                    cluster: object, namespace: str) -> None:
    other = baton.AsyncClient(aclient._config.endpoints[0].base, namespace=namespace,
                              holder="agent-b", timeout=3.0)
    try:
        async with aclient.lease("async/x", ttl=1.5) as guard:
            assert guard.is_valid()
            await asyncio.sleep(3.0)  # past the TTL: renewed by the task
            assert guard.is_valid(), guard.lost_reason()
            with pytest.raises(baton.LeaseHeld) as held:
                await other.lease("async/x", ttl=5).acquire()
            assert held.value.holder == "agent-async"
            assert 0.5 < (held.value.expires_in or 0) <= 1.5
            await aclient.kv_put("async/k", {"v": 1}, guard=guard)
            entry = await aclient.kv_get("async/k")
            assert entry["fence"] == {"resource": "async/x", "token": guard.fence}
            session_id, fence = guard.session_id, guard.fence
        assert not guard.is_valid()
        with pytest.raises(baton.StaleFence):
            await aclient.kv_put("async/k", 2, fence=("async/x", fence), session_id=session_id)
        async with other.lease("async/x", ttl=5) as second:
            assert second.fence > fence
    finally:
        await other.aclose()


async def test_async_waiter_whose_session_dies_rejoins_the_line(aclient: baton.AsyncClient,
                                                                namespace: str) -> None:
    """As the blocking client's test: a late renewal kills the wait's own session, and the
    acquire joins the line again instead of failing with LEASE_LOST."""
    waiter = baton.AsyncClient(aclient._config.endpoints[0].base, namespace=namespace,
                               holder="agent-b", timeout=3.0)
    renew = waiter.keepalive
    renewed: list[str] = []

    async def late_keepalive(session_id: str) -> dict[str, Any]:
        renewed.append(session_id)
        if len(renewed) == 1:
            await asyncio.sleep(1.5)  # past the 1 s TTL: the session is gone
        return await renew(session_id)

    waiter.keepalive = late_keepalive  # type: ignore[method-assign]
    try:
        async with aclient.lease("async/busy", ttl=10):
            with pytest.raises(baton.LeaseHeld):
                await waiter.lease("async/busy", ttl=1, wait=3).acquire()
            assert len(set(renewed)) >= 2
    finally:
        await waiter.aclose()


async def test_async_guard_reports_loss_once(aclient: baton.AsyncClient) -> None:
    reports: list[str] = []
    reported_at: list[float] = []

    def on_lost(reason: str) -> None:
        reported_at.append(time.monotonic())
        reports.append(reason)

    guard = await aclient.lease("async/pause", ttl=1.0, on_lost=on_lost).acquire()
    guard.pause_renewals()
    deadline = guard.valid_until
    await asyncio.wait_for(guard.lost.wait(), 3.0)
    assert reported_at[0] <= deadline
    assert len(reports) == 1 and not guard.is_valid()
    await guard.release()
    assert len(reports) == 1


async def test_async_session_txn_queue_and_worker(aclient: baton.AsyncClient) -> None:
    async with await aclient.session(ttl=5) as session:
        guard = await session.lease("async/build").acquire()
        await aclient.enqueue("apipe", {"step": 1}, id="a1")
        claim = await session.claim("apipe")
        assert claim is not None and claim.session_id == session.id
        done = await aclient.txn(
            compare=[txn.fence("async/build", guard.fence)],
            success=[txn.complete_task("apipe", "a1", claim.fence, {"ok": 1}),
                     txn.add_task("apipe", {"step": 2}, id="a2"),
                     txn.release("async/build")],
            guard=guard,
        )
        assert done["succeeded"] and done["results"][0]["task"]["state"] == "done"
    assert (await aclient.queue_info("apipe"))["counts"]["ready"] == 1
    seen: list[str] = []

    async def handle(claim: baton.AsyncTaskClaim) -> str:
        seen.append(claim.id)
        return "ok"

    report = await aclient.work("apipe", handle, ttl=5)
    assert seen == ["a2"] and report.completed == 1 and report.stopped == "queue_empty"


async def test_async_events_follow_and_resume(aclient: baton.AsyncClient) -> None:
    await aclient.kv_put("aev/1", 1)
    stream = aclient.follow_events(after=0)
    first = await stream.__anext__()
    assert first["revision"] == 1
    await stream._drop()  # a lost connection: it resumes after revision 1
    await aclient.kv_put("aev/2", 2)
    second = await asyncio.wait_for(stream.__anext__(), 10)
    assert second["revision"] == 2 and second["kind"]["key"] == "aev/2"
    await stream.aclose()
    page = await aclient.events(after=0)
    assert [e["revision"] for e in page["events"]] == [1, 2]
