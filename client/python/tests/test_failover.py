"""Failover: SIGKILL the leader while a guard is held and calls are running; the client
carries on through the other nodes. Then lose the quorum: the guard reports its loss once,
before its G7 deadline, and writes are refused with NO_LEADER (surely not applied)."""

from __future__ import annotations

import threading
import time

import pytest

import baton

from .conftest import Cluster, _record


def test_the_client_carries_on_when_the_leader_is_killed(fresh_cluster: Cluster) -> None:
    def make(**kwargs: object) -> baton.Client:
        return baton.Client(fresh_cluster.endpoints, namespace="failover", timeout=1.0,
                            retry_budget=12.0, event_hooks={"request": [_record]},
                            **kwargs)  # type: ignore[arg-type]

    client = make(holder="agent-a")
    other = make(holder="agent-b")
    reports: list[tuple[float, str]] = []
    guard = client.lease("fo/resource", ttl=3.0,
                         on_lost=lambda why: reports.append((time.monotonic(), why))).acquire()
    first_fence = guard.fence
    stop = threading.Event()
    written: list[int] = []
    errors: list[BaseException] = []

    def writer() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            try:
                client.kv_put(f"fo/k{i % 5}", i, guard=guard)
                written.append(i)
            except baton.BatonError as error:
                errors.append(error)
            time.sleep(0.02)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        time.sleep(0.5)
        before = len(written)
        assert before > 0, errors
        leader = fresh_cluster.leader()
        leader.kill()
        killed_at = time.monotonic()
        # Keep going through more than two keepalive intervals and a TTL.
        time.sleep(4.0)
        after = len(written)
        assert after - before >= 20, (before, after, errors)
        assert errors == [], errors
        assert guard.is_valid(), guard.lost_reason()
        assert reports == []
        assert guard.valid_until > killed_at + 2.0  # renewed after the kill
        survivors = [n for n in fresh_cluster.nodes if n.alive()]
        assert len(survivors) == 2 and fresh_cluster.leader(10.0).id != leader.id
        # Leases still exclude, and fences still rise across the leader change (G3).
        with pytest.raises(baton.LeaseHeld) as held:
            other.lease("fo/resource", ttl=3).acquire()
        assert held.value.fence == first_fence
        with other.lease("fo/other", ttl=3) as newer:
            assert newer.fence > first_fence
    finally:
        stop.set()
        thread.join(15)
    last = written[-1]
    assert client.kv_get(f"fo/k{last % 5}")["value"] == last

    # Lose the quorum: no renewal can succeed any more.
    for node in [n for n in fresh_cluster.nodes if n.alive()][:1]:
        node.kill()
    deadline = guard.valid_until
    assert guard.lost.wait(deadline - time.monotonic() + 1.0)
    assert len(reports) == 1
    reported_at, why = reports[0]
    assert reported_at <= deadline, (reported_at, deadline)
    assert "expired" in why
    assert not guard.is_valid()
    with pytest.raises(baton.ClaimLost):
        client.kv_put("fo/late", 1, guard=guard)
    survivor = next(n for n in fresh_cluster.nodes if n.alive())
    lone = baton.Client([survivor.url], namespace="failover", timeout=3.0, retry_budget=2.0)
    try:
        with pytest.raises(baton.NoLeader) as no_leader:
            lone.kv_put("fo/nope", 1)
        assert no_leader.value.status == 503 and not no_leader.value.is_indeterminate
    finally:
        lone.close()
    time.sleep(0.5)
    assert len(reports) == 1  # reported exactly once
    with pytest.raises(baton.BatonError) as ending:  # no quorum to end the session with
        guard.release()
    assert isinstance(ending.value, (baton.OutcomeUnknown, baton.Unavailable, baton.NoLeader))
    assert len(reports) == 1
    client.close()
    other.close()
