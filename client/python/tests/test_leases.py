"""Leases against a real cluster: grants, denials, fences, guards, lines, semaphores."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import baton
from baton import LeaseHeld, StaleFence

from .conftest import ClientFactory


def test_grant_then_deny_names_holder_and_time_left(make_client: ClientFactory) -> None:
    a = make_client(holder="agent-a")
    b = make_client(holder="agent-b")
    with a.lease("src/auth.rs", ttl=20) as guard:
        assert guard.is_valid()
        assert guard.fence > 0
        assert guard.resource == "src/auth.rs"
        assert guard.holder == "agent-a"
        with pytest.raises(LeaseHeld) as denied:
            with b.lease("src/auth.rs", ttl=20):
                pytest.fail("granted twice")
        error = denied.value
        assert error.code == "LEASE_HELD" and error.status == 409
        assert not error.is_indeterminate
        assert error.holder == "agent-a"
        assert error.fence == guard.fence
        assert error.resource == "src/auth.rs"
        assert error.expires_in is not None and 15.0 < error.expires_in <= 20.0
        assert error.held_by["mode"] == "exclusive"
        seconds = error.denial("src/auth.rs")
        assert seconds.startswith("denied: agent-a holds src/auth.rs for ")
        assert seconds.endswith(" s more")
        assert a.get_lease("src/auth.rs")["fence"] == guard.fence
    # Released on exit: b gets it now, with a higher fence.
    with b.lease("src/auth.rs", ttl=20) as second:
        assert second.fence > guard.fence
    with pytest.raises(baton.NotFound):
        a.get_lease("src/auth.rs")


def test_fences_rise_and_a_stale_fence_is_refused(make_client: ClientFactory) -> None:
    a = make_client(holder="agent-a")
    fences = []
    for _ in range(3):
        with a.lease("db/row", ttl=10) as guard:
            fences.append(guard.fence)
            old_session = guard.session_id
            a.kv_put("db/value", {"n": guard.fence}, guard=guard)
    assert fences == sorted(fences) and len(set(fences)) == 3
    with a.lease("db/row", ttl=10) as guard:
        with pytest.raises(StaleFence) as stale:
            a.kv_put("db/value", {"n": 0}, fence=("db/row", fences[0]), session_id=old_session)
        assert stale.value.current_fence == guard.fence
        assert stale.value.code == "STALE_FENCE"
        with pytest.raises(StaleFence):
            a.kv_put("db/value", {"n": 0}, fence=("db/row", fences[0]), session_id=guard.session_id)
        check = a.fence_check("db/row", fences[0])
        assert check == {"current": False, "fence": guard.fence}
        assert a.fence_check("db/row", guard.fence)["current"] is True
    assert a.kv_get("db/value")["value"] == {"n": fences[-1]}


def test_the_guard_renews_past_its_ttl(make_client: ClientFactory) -> None:
    a = make_client(holder="agent-a")
    lost: list[str] = []
    with a.lease("renew/me", ttl=1.5, on_lost=lost.append) as guard:
        first_deadline = guard.valid_until
        assert first_deadline - time.monotonic() <= 1.5
        time.sleep(4.0)  # well past the TTL: only renewals keep it
        assert guard.is_valid(), guard.lost_reason()
        assert guard.valid_until > first_deadline + 2.0
        assert a.fence_check("renew/me", guard.fence)["current"] is True
        a.kv_put("renew/value", 1, guard=guard)
    assert lost == []
    assert not guard.is_valid()


def test_g7_deadline_counts_from_the_send_time() -> None:
    from baton._lease import valid_until

    # Sent at 1.0 s, 30 s granted, 1% rate error: 1 + 29.999 * 0.98 = 30.39902 s.
    assert valid_until(1.0, 30_000, 0.01) == pytest.approx(30.39902, abs=1e-9)
    assert valid_until(7.0, 0, 0.01) == 7.0
    assert valid_until(0.0, 1_000, 0.0) == pytest.approx(0.999)


def test_a_holder_paused_past_its_ttl_reports_lost_once_and_its_write_is_refused(
    make_client: ClientFactory,
) -> None:
    a = make_client(holder="agent-a")
    b = make_client(holder="agent-b")
    reports: list[str] = []
    reported_at: list[float] = []

    def on_lost(reason: str) -> None:
        reported_at.append(time.monotonic())
        reports.append(reason)

    guard = a.lease("pause/me", ttl=1.0, on_lost=on_lost).acquire()
    started = time.monotonic()
    guard.pause_renewals()
    deadline = guard.valid_until
    assert not guard.lost.wait(0.3)
    # No renewals: the guard reports itself lost, once, before its G7 deadline...
    assert guard.lost.wait(2.0)
    assert reported_at[0] <= deadline
    assert not guard.is_valid()
    assert reports and "expired" in reports[0]
    with pytest.raises(baton.ClaimLost):
        a.kv_put("pause/value", 1, guard=guard)
    # ...and the server lets the lease go; a late fenced write is refused.
    time.sleep(max(0.0, started + 1.6 - time.monotonic()))
    with b.lease("pause/me", ttl=5) as other:
        assert other.fence > guard.fence
        with pytest.raises(StaleFence):
            a.kv_put("pause/value", 1, fence=(guard.resource, guard.fence),
                     session_id=guard.session_id)
    guard.release()
    assert len(reports) == 1


def test_subtree_covers_and_denial_names_the_ancestor(make_client: ClientFactory) -> None:
    a = make_client(holder="agent-a")
    b = make_client(holder="agent-b")
    with a.lease("docs", ttl=10, mode="subtree"):
        with pytest.raises(LeaseHeld) as denied:
            b.lease("docs/login.md", ttl=10).acquire()
        assert denied.value.resource == "docs"
        assert denied.value.mode == "subtree"
        text = denied.value.denial("docs/login.md")
        assert text.startswith("denied: agent-a holds docs (subtree), which covers docs/login.md")
        assert b.get_lease("docs/login.md")["covering"] is True
        # a sibling is free
        with b.lease("docsx", ttl=10):
            pass


def test_shared_lease_is_a_semaphore(make_client: ClientFactory) -> None:
    clients = [make_client(holder=f"agent-{i}") for i in range(3)]
    guards = [c.lease("ci/suite", ttl=10, mode="shared", limit=2) for c in clients]
    guards[0].acquire()
    guards[1].acquire()
    assert guards[0].fence != guards[1].fence
    with pytest.raises(LeaseHeld) as full:
        guards[2].acquire()
    assert full.value.limit == 2
    assert {h["holder"] for h in full.value.holders} == {"agent-0", "agent-1"}
    assert full.value.denial().startswith("denied: ci/suite is shared by 2 of 2 holders")
    listed = clients[0].list_leases("ci/")["leases"]
    assert sorted(lease["fence"] for lease in listed) == sorted(g.fence for g in guards[:2])
    with pytest.raises(baton.InvalidArgument):
        clients[2].lease("ci/suite", ttl=10, mode="shared", limit=3).acquire()
    guards[0].release()
    guards[2].acquire()
    assert guards[2].is_valid()
    guards[1].release()
    guards[2].release()


def test_the_line_serves_a_waiter_when_the_holder_releases(make_client: ClientFactory) -> None:
    a = make_client(holder="agent-a")
    b = make_client(holder="agent-b")
    holder = a.lease("db/migrations", ttl=10).acquire()
    got: dict[str, object] = {}

    def wait_for_it() -> None:
        try:
            with b.lease("db/migrations", ttl=3, wait=8) as guard:
                got["fence"] = guard.fence
                got["at"] = time.monotonic()
        except baton.BatonError as error:  # pragma: no cover - reported below
            got["error"] = error

    waiter = threading.Thread(target=wait_for_it)
    waiter.start()
    time.sleep(1.5)
    released_at = time.monotonic()
    holder.release()
    waiter.join(10)
    assert "error" not in got, got
    assert isinstance(got["fence"], int) and got["fence"] > holder.fence
    assert float(got["at"]) - released_at < 2.0  # type: ignore[arg-type]


def test_a_wait_that_runs_out_is_denied_and_leaves_the_line(make_client: ClientFactory) -> None:
    a = make_client(holder="agent-a")
    b = make_client(holder="agent-b")
    with a.lease("busy/path", ttl=10):
        started = time.monotonic()
        with pytest.raises(LeaseHeld) as denied:
            b.lease("busy/path", ttl=3, wait=1.5).acquire()
        assert 1.4 < time.monotonic() - started < 6.0
        assert denied.value.holder == "agent-a"
    # Nobody waits any more: a plain acquire is granted at once.
    with b.lease("busy/path", ttl=3) as guard:
        assert guard.is_valid()


def test_a_waiter_whose_session_dies_rejoins_the_line(make_client: ClientFactory) -> None:
    """The session a waiting acquire made for itself can die between rounds (a client too slow
    to renew it, as on a loaded machine): the place is lost, not the acquire, which joins the
    line again with a new session and ends as every wait does."""
    a = make_client(holder="agent-a")
    b = make_client(holder="agent-b")
    renew = b.keepalive
    renewed: list[str] = []

    def late_keepalive(session_id: str) -> dict[str, Any]:
        renewed.append(session_id)
        if len(renewed) == 1:
            time.sleep(1.5)  # past the 1 s TTL: the session is gone
        return renew(session_id)

    b.keepalive = late_keepalive  # type: ignore[method-assign]
    with a.lease("busy/path", ttl=10):
        with pytest.raises(LeaseHeld) as denied:
            b.lease("busy/path", ttl=1, wait=3).acquire()
        assert denied.value.holder == "agent-a"
        assert len(set(renewed)) >= 2  # the late renewal came, then a new session's
    with b.lease("busy/path", ttl=3) as guard:
        assert guard.is_valid()


def test_sessions_hold_several_leases(make_client: ClientFactory) -> None:
    a = make_client(holder="agent-a")
    with a.session(ttl=2) as session:
        one = session.lease("multi/one").acquire()
        two = session.lease("multi/two").acquire()
        assert one.session_id == two.session_id == session.id
        time.sleep(3.0)
        assert one.is_valid() and two.is_valid()
        info = a.get_session(session.id)
        assert [lease["resource"] for lease in info["leases"]] == ["multi/one", "multi/two"]
        one.release()
        assert [x["resource"] for x in a.get_session(session.id)["leases"]] == ["multi/two"]
    with pytest.raises(baton.NotFound):
        a.get_session(session.id)
    assert not two.is_valid()


def test_max_hold_ends_validity(make_client: ClientFactory) -> None:
    a = make_client(holder="agent-a")
    reports: list[str] = []
    with a.lease("hold/short", ttl=10, max_hold=1.0, on_lost=reports.append) as guard:
        assert guard.valid_until - time.monotonic() < 1.0
        assert guard.lost.wait(2.0)
        assert reports == ["max hold reached"]
        assert not guard.is_valid()


def test_raw_acquire_and_release(make_client: ClientFactory) -> None:
    a = make_client(holder="agent-a")
    grant = a.acquire("raw/x", ttl=5, labels={"team": "core"}, reason="refactor")
    assert grant["labels"] == {"team": "core", "reason": "refactor"}
    assert a.release(grant["session_id"], "raw/x") == {"released": "raw/x"}
    with pytest.raises(baton.LeaseLost):
        a.release(grant["session_id"], "raw/x")
    assert a.end_session(grant["session_id"])["released"] == []
