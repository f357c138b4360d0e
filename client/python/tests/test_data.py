"""The fenced kv store, transactions and work queues against a real cluster."""

from __future__ import annotations

import time

import pytest

import baton
from baton import txn

from .conftest import ClientFactory


def test_fenced_kv_put_get_delete(make_client: ClientFactory) -> None:
    a = make_client(holder="agent-a")
    unfenced = a.kv_put("cfg/plain", {"x": 1})
    assert isinstance(unfenced["revision"], int)
    entry = a.kv_get("cfg/plain")
    assert entry == {"key": "cfg/plain", "value": {"x": 1}, "revision": unfenced["revision"],
                     "fence": None}
    with a.lease("cfg", ttl=10) as guard:
        written = a.kv_put("cfg/owner", "agent-a", guard=guard)
        entry = a.kv_get("cfg/owner")
        assert entry["fence"] == {"resource": "cfg", "token": guard.fence}
        assert entry["revision"] == written["revision"]
        deleted = a.kv_delete("cfg/owner", guard=guard)
        assert deleted["deleted"] is True and deleted["revision"] > written["revision"]
        with pytest.raises(baton.NotFound) as missing:
            a.kv_get("cfg/owner")
        assert missing.value.status == 404
        with pytest.raises(baton.NotFound):
            a.kv_delete("cfg/owner", guard=guard)
    # The guard is released: its fence no longer writes.
    with pytest.raises(baton.ClaimLost):
        a.kv_put("cfg/owner", 1, guard=guard)
    with pytest.raises(baton.StaleFence):
        a.kv_put("cfg/owner", 1, fence=("cfg", guard.fence), session_id=guard.session_id)
    # Odd names travel unchanged, each segment encoded.
    a.kv_put("odd/a b?c#d%/ü", [1, 2])
    assert a.kv_get("odd/a b?c#d%/ü")["value"] == [1, 2]
    with pytest.raises(baton.InvalidArgument):
        a.kv_put("odd/../escape", 1)
    with pytest.raises(baton.InvalidArgument):
        a.kv_get("..")


def test_a_transaction_applies_all_or_nothing(make_client: ClientFactory) -> None:
    a = make_client(holder="agent-a")
    with a.lease("repo/build", ttl=10) as guard:
        done = a.txn(
            compare=[txn.fence("repo/build", guard.fence), txn.kv_revision("results/build", 0)],
            success=[
                txn.put("results/build", {"artifact": "b1"}),
                txn.add_task("pipeline", {"suite": "all"}, id="test"),
                txn.release("repo/build"),
            ],
            guard=guard,
        )
        assert done["succeeded"] is True
        assert [r["op"] for r in done["results"]] == ["put", "add_task", "release"]
        assert done["results"][2] == {"op": "release", "released": "repo/build",
                                      "fence": guard.fence}
        revision = a.kv_get("results/build")["revision"]
        # A compare that fails picks the failure branch.
        other = a.txn(
            compare=[txn.kv_revision("results/build", revision + 100)],
            success=[txn.put("results/build", "never")],
            failure=[txn.put("results/failed", True)],
        )
        assert other["succeeded"] is False
        assert a.kv_get("results/build")["value"] == {"artifact": "b1"}
        assert a.kv_get("results/failed")["value"] is True
        # A refused op refuses the whole transaction and changes nothing.
        with pytest.raises(baton.NotFound):
            a.txn(success=[txn.put("results/x", 1), txn.delete("results/absent")])
        with pytest.raises(baton.NotFound):
            a.kv_get("results/x")
        with pytest.raises(baton.LeaseLost):  # released above by the first txn
            a.txn(success=[txn.release("repo/build")], session_id=guard.session_id)
    assert a.queue_info("pipeline")["counts"]["ready"] == 1


def test_queue_claim_complete_fail_release(make_client: ClientFactory) -> None:
    a = make_client(holder="worker-1")
    first = a.enqueue("build", {"cmd": "make"}, id="t1", priority=5)
    assert first["state"] == "ready" and first["priority"] == 5
    a.enqueue("build", {"cmd": "test"}, id="t2", depends_on=["t1"], max_attempts=2)
    assert a.queue_info("build")["counts"] == {
        "ready": 1, "waiting": 1, "claimed": 0, "done": 0, "dead": 0
    }
    claim = a.claim("build", ttl=5)
    assert claim is not None and claim.id == "t1" and claim.attempt == 1
    assert claim.payload == {"cmd": "make"} and claim.is_valid()
    released = claim.release("not now")
    assert released["state"] == "ready" and released["note"] == "not now"
    claim = a.claim("build", ttl=5)
    assert claim is not None and claim.id == "t1"
    stale_fence = claim.fence
    done = claim.complete({"ok": True})
    assert done["state"] == "done" and done["result"] == {"ok": True}
    with pytest.raises(baton.StaleFence):
        a.complete_task("build", "t1", session_id=claim.session_id, fence=stale_fence)
    second = a.claim("build", ttl=5)
    assert second is not None and second.id == "t2"
    failed = second.fail("flaky", retry=True)
    assert failed["state"] == "ready" and failed["reason"] == "flaky"
    tasks = a.list_tasks("build", state="done")["tasks"]
    assert [t["id"] for t in tasks] == ["t1"]
    assert [q["queue"] for q in a.list_queues()["queues"]] == ["build"]
    assert a.claim("empty-queue", ttl=5) is None
    started = time.monotonic()
    assert a.claim("empty-queue", ttl=5, wait=0.5) is None
    assert time.monotonic() - started >= 0.45


def test_the_worker_loop_completes_fails_and_stops_when_empty(make_client: ClientFactory) -> None:
    a = make_client(holder="worker-loop")
    for i in range(4):
        a.enqueue("jobs", {"n": i}, id=f"j{i}", max_attempts=1)
    seen: list[tuple[str, int]] = []

    def handle(claim: baton.TaskClaim) -> object:
        seen.append((claim.id, claim.fence))
        assert claim.is_valid()
        if claim.payload["n"] == 2:
            raise RuntimeError("boom")
        return {"double": claim.payload["n"] * 2}

    report = a.work("jobs", handle, ttl=5)
    assert report.completed == 3 and report.failed == 1
    assert report.stopped == "queue_empty"
    assert [task_id for task_id, _ in seen] == ["j0", "j1", "j2", "j3"]
    fences = [fence for _, fence in seen]
    assert fences == sorted(fences)
    counts = a.queue_info("jobs")["counts"]
    assert counts["done"] == 3 and counts["dead"] == 1
    dead = a.list_tasks("jobs", state="dead")["tasks"][0]
    assert dead["id"] == "j2" and "RuntimeError: boom" in dead["reason"]
    assert a.list_tasks("jobs", state="done")["tasks"][1]["result"] == {"double": 2}
    # max_tasks stops early; the worker's session is ended afterwards.
    a.enqueue("jobs", {"n": 10}, id="k1")
    a.enqueue("jobs", {"n": 11}, id="k2")
    report = a.work("jobs", lambda claim: None, ttl=5, max_tasks=1)
    assert report.stopped == "max_tasks" and report.completed == 1
    assert a.queue_info("jobs")["counts"]["ready"] == 1


def test_a_claim_outlives_its_ttl_while_the_handler_runs(make_client: ClientFactory) -> None:
    a = make_client(holder="worker-slow")
    a.enqueue("slow", {"n": 1}, id="s1")

    def slow(claim: baton.TaskClaim) -> str:
        time.sleep(2.5)
        assert claim.is_valid()
        return "ok"

    report = a.work("slow", slow, ttl=1.0)
    assert report.completed == 1, report
