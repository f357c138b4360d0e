"""The event stream: pages, server-sent events, and resuming after a lost connection."""

from __future__ import annotations

import threading
import time

import pytest

import baton

from .conftest import ClientFactory, Cluster


def test_event_pages(make_client: ClientFactory) -> None:
    a = make_client(holder="agent-a")
    with a.lease("ev/a", ttl=5) as guard:
        a.kv_put("ev/k", 1)
    page = a.events(after=0)
    kinds = [event["kind"]["type"] for event in page["events"]]
    assert kinds == ["granted", "kv_written", "released"]
    assert page["events"][0]["kind"]["fence"] == guard.fence
    assert page["next"] == page["events"][-1]["revision"]
    assert a.events(after=page["next"])["events"] == []
    one = a.events(after=0, limit=1)
    assert len(one["events"]) == 1 and one["next"] == 1
    with pytest.raises(baton.InvalidArgument):
        a.events(after=page["next"] + 10)


def test_sse_follows_and_resumes_without_gaps(make_client: ClientFactory) -> None:
    a = make_client(holder="agent-a")
    for i in range(3):
        a.kv_put(f"sse/{i}", i)
    stream = a.follow_events(after=1)
    got = [next(stream), next(stream)]
    assert [e["revision"] for e in got] == [2, 3]
    # Cut the connection under the stream (as a node restart would): it resumes after 3.
    stream._drop()
    a.kv_put("sse/3", 3)
    event = next(stream)
    assert event["revision"] == 4 and event["kind"] == {"type": "kv_written", "key": "sse/3",
                                                        "revision": 4}
    assert stream.last_revision == 4
    stream.close()


def test_sse_resumes_on_another_node_when_its_node_dies(fresh_cluster: Cluster,
                                                        namespace: str) -> None:
    from .conftest import _record

    client = baton.Client(fresh_cluster.endpoints, namespace=namespace, holder="agent-a",
                          timeout=2.0, retry_budget=15.0, event_hooks={"request": [_record]})
    writer = baton.Client(fresh_cluster.endpoints, namespace=namespace, holder="writer",
                          timeout=2.0, retry_budget=15.0)
    try:
        writer.kv_put("move/0", 0)
        # Stream from a follower, so that killing it leaves the cluster a leader.
        leader = fresh_cluster.leader()
        follower = next(n for n in fresh_cluster.nodes if n.id != leader.id)
        client._route_state.preferred = fresh_cluster.nodes.index(follower)
        stream = client.follow_events()
        assert next(stream)["revision"] == 1
        assert stream.endpoint == follower.url
        follower.kill()
        written: list[int] = []

        def write() -> None:
            for i in range(1, 6):
                written.append(writer.kv_put(f"move/{i}", i)["revision"])

        thread = threading.Thread(target=write)
        thread.start()
        thread.join(20)
        revisions = []
        deadline = time.monotonic() + 20
        while len(revisions) < 5 and time.monotonic() < deadline:
            revisions.append(next(stream)["revision"])
        assert revisions == written == [2, 3, 4, 5, 6]
        assert stream.endpoint != follower.url
        stream.close()
    finally:
        client.close()
        writer.close()


def test_a_revision_older_than_kept_or_in_the_future_is_refused(make_client: ClientFactory) -> None:
    a = make_client(holder="agent-a")
    a.kv_put("future/x", 1)
    stream = a.follow_events(after=1000)
    with pytest.raises(baton.InvalidArgument):
        next(stream)
