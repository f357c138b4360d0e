//! Round trips, unknown-field refusals and owner rules of the wire types.

use std::fmt;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};

use crate::*;

/// A round-trip check for one type, picked per table row.
type RoundTrip = fn(&Value);
/// An unknown-field check for one request type: true when the body is refused.
type Refuses = fn(Value) -> bool;
/// `(session_id, holder, ttl_ms)` of an acquire or claim body.
type Fields<'a> = (Option<&'a str>, Option<&'a str>, Option<u64>);
/// The owner, or a fragment of the refusal message.
type Expected<'a> = Result<Owner<'a>, &'static str>;

/// Parses `json` as `T`, serializes it back and checks nothing was lost or added.
fn round_trip<T>(json: &Value)
where
    T: Serialize + DeserializeOwned + PartialEq + fmt::Debug,
{
    let parsed: T = serde_json::from_value(json.clone())
        .unwrap_or_else(|error| panic!("parse {json}: {error}"));
    let written = serde_json::to_value(&parsed).unwrap();
    assert_eq!(&written, json);
    let reparsed: T = serde_json::from_value(written).unwrap();
    assert_eq!(reparsed, parsed);
}

fn lease_json() -> Value {
    json!({
        "resource": "repo/src/auth.rs", "fence": 41, "holder": "agent-b",
        "mode": "subtree", "labels": {"pr": "12"},
        "acquired_at": "2025-01-01T00:00:00Z", "expires_in_ms": 38000,
        "expires_at": "2025-01-01T00:00:38Z"
    })
}

fn task_json() -> Value {
    json!({
        "id": "t1", "queue": "build", "payload": {"cmd": "make"}, "priority": 5,
        "depends_on": ["t0"], "state": "claimed", "attempt": 1, "max_attempts": 3,
        "ready_at_ms": 1500, "waiting_on": 0, "fence": 42, "holder": "agent-a"
    })
}

#[test]
fn formats_rfc3339_in_utc() {
    assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
    assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
    assert_eq!(rfc3339(1_796_006_939_123), "2026-11-30T02:48:59.123Z");
    assert_eq!(rfc3339(-1), "1969-12-31T23:59:59.999Z");
}

#[test]
fn uuids_carry_version_4_and_the_rfc_variant() {
    for bits in [0, u128::MAX, 0x0123_4567_89ab_cdef_0123_4567_89ab_cdef] {
        let uuid = uuid_v4(bits);
        assert_eq!(uuid.len(), 36, "{uuid}");
        assert_eq!(&uuid[14..15], "4", "{uuid}");
        assert!("89ab".contains(&uuid[19..20]), "{uuid}");
    }
    assert_eq!(uuid_v4(0), "00000000-0000-4000-8000-000000000000");
    assert_eq!(uuid_v4(u128::MAX), "ffffffff-ffff-4fff-bfff-ffffffffffff");
}

#[test]
fn an_answer_is_applied_surely_not_or_unknown() {
    assert_eq!(Applied::of_answer(201, None), Applied::Yes);
    assert_eq!(Applied::of_answer(204, None), Applied::Yes);
    assert_eq!(
        Applied::of_answer(503, Some(ErrorCode::NoLeader)),
        Applied::No
    );
    assert_eq!(
        Applied::of_answer(429, Some(ErrorCode::ResourceExhausted)),
        Applied::No
    );
    assert_eq!(
        Applied::of_answer(409, Some(ErrorCode::LeaseHeld)),
        Applied::No
    );
    assert_eq!(
        Applied::of_answer(504, Some(ErrorCode::OutcomeUnknown)),
        Applied::Unknown
    );
    assert_eq!(
        Applied::of_answer(500, Some(ErrorCode::Internal)),
        Applied::Unknown
    );
    assert_eq!(Applied::of_answer(404, None), Applied::No);
    assert_eq!(Applied::of_answer(502, None), Applied::Unknown);
}

#[test]
fn bodies_round_trip() {
    let cases: Vec<(&str, RoundTrip, Value)> = vec![
        (
            "create session",
            round_trip::<CreateSessionRequest>,
            json!({"holder": "agent-a", "ttl_ms": 30000, "labels": {"team": "x"}}),
        ),
        (
            "session created",
            round_trip::<CreateSessionResponse>,
            json!({"session_id": "s1", "holder": "agent-a", "ttl_ms": 30000,
                   "expires_in_ms": 30000, "expires_at": "2025-01-01T00:00:30Z"}),
        ),
        (
            "keepalive",
            round_trip::<KeepaliveResponse>,
            json!({"session_id": "s1", "expires_in_ms": 30000,
                   "expires_at": "2025-01-01T00:00:30Z"}),
        ),
        (
            "release",
            round_trip::<ReleaseRequest>,
            json!({"resource": "a/b"}),
        ),
        (
            "released",
            round_trip::<ReleaseResponse>,
            json!({"released": "a/b"}),
        ),
        (
            "session ended",
            round_trip::<EndSessionResponse>,
            json!({"released": ["a", "b"]}),
        ),
        (
            "session info",
            round_trip::<SessionInfo>,
            json!({"session_id": "s1", "holder": "agent-b", "ttl_ms": 30000, "labels": {},
                   "expires_in_ms": 1000, "expires_at": "2025-01-01T00:00:01Z",
                   "leases": [lease_json()], "next_cursor": null}),
        ),
        (
            "acquire with session",
            round_trip::<AcquireRequest>,
            json!({"resource": "a/b", "session_id": "s1", "mode": "exclusive"}),
        ),
        (
            "acquire with new session",
            round_trip::<AcquireRequest>,
            json!({"resource": "a", "holder": "agent-a", "ttl_ms": 5000, "mode": "subtree",
                   "max_hold_ms": 60000, "labels": {"k": "v"}, "reason": "refactor"}),
        ),
        (
            "grant",
            round_trip::<Grant>,
            json!({"resource": "a", "fence": 7, "session_id": "s1", "holder": "agent-a",
                   "mode": "exclusive", "labels": {}, "max_hold_ms": 60000,
                   "acquired_at": "2025-01-01T00:00:00Z", "expires_in_ms": 5000,
                   "expires_at": "2025-01-01T00:00:05Z"}),
        ),
        ("lease", round_trip::<Lease>, lease_json()),
        ("held by", round_trip::<HeldBy>, lease_json()),
        (
            "lease list",
            round_trip::<LeaseList>,
            json!({"leases": [lease_json()], "next_cursor": null}),
        ),
        (
            "list leases query",
            round_trip::<ListLeasesQuery>,
            json!({"prefix": "repo/", "limit": 10, "cursor": "c"}),
        ),
        (
            "fence check",
            round_trip::<FenceCheckRequest>,
            json!({"resource": "a", "fence": 3}),
        ),
        (
            "fence checked",
            round_trip::<FenceCheckResponse>,
            json!({"current": false, "fence": null}),
        ),
        (
            "kv put fenced",
            round_trip::<KvPutRequest>,
            json!({"value": {"n": 1}, "fence": {"resource": "a", "token": 3},
                   "session_id": "s1"}),
        ),
        (
            "kv put plain",
            round_trip::<KvPutRequest>,
            json!({"value": null}),
        ),
        (
            "kv put answer",
            round_trip::<KvPutResponse>,
            json!({"revision": 9}),
        ),
        (
            "kv entry",
            round_trip::<KvEntry>,
            json!({"key": "k", "value": [1, 2], "revision": 9,
                   "fence": {"resource": "a", "token": 3}}),
        ),
        ("kv delete", round_trip::<KvDeleteRequest>, json!({})),
        (
            "kv deleted",
            round_trip::<KvDeleteResponse>,
            json!({"deleted": true, "revision": 10}),
        ),
        (
            "enqueue",
            round_trip::<EnqueueRequest>,
            json!({"id": "t1", "payload": "x", "priority": -1, "depends_on": ["t0"],
                   "max_attempts": 3, "not_before_ms": 1000}),
        ),
        (
            "enqueue minimal",
            round_trip::<EnqueueRequest>,
            json!({"payload": {}}),
        ),
        ("task", round_trip::<Task>, task_json()),
        (
            "claim new session",
            round_trip::<ClaimRequest>,
            json!({"holder": "agent-a", "ttl_ms": 5000}),
        ),
        (
            "claimed",
            round_trip::<ClaimResponse>,
            json!({"task": task_json(), "fence": 42, "attempt": 1, "session_id": "s1",
                   "expires_in_ms": 5000, "expires_at": "2025-01-01T00:00:05Z"}),
        ),
        (
            "complete",
            round_trip::<CompleteRequest>,
            json!({"session_id": "s1", "fence": 42, "result": {"ok": true}}),
        ),
        (
            "fail",
            round_trip::<FailRequest>,
            json!({"session_id": "s1", "fence": 42, "reason": "oom", "retry": false}),
        ),
        (
            "task release",
            round_trip::<TaskReleaseRequest>,
            json!({"session_id": "s1", "fence": 42, "note": "half done"}),
        ),
        (
            "queue info",
            round_trip::<QueueInfo>,
            json!({"queue": "build", "counts": {"ready": 1, "waiting": 4, "claimed": 2, "done": 3,
                   "dead": 0}}),
        ),
        (
            "list tasks query",
            round_trip::<ListTasksQuery>,
            json!({"state": "dead", "limit": 5}),
        ),
        (
            "task list",
            round_trip::<TaskList>,
            json!({"tasks": [task_json()], "next_cursor": "t1"}),
        ),
        (
            "events query",
            round_trip::<EventsQuery>,
            json!({"after": 17}),
        ),
        (
            "events page",
            round_trip::<EventsPage>,
            json!({"events": [
                {"revision": 18, "namespace": "default", "cluster_time_ms": 500,
                 "kind": {"type": "granted", "resource": "a", "holder": "h", "fence": 4,
                          "mode": "exclusive"}},
                {"revision": 19, "namespace": "default", "cluster_time_ms": 501,
                 "kind": {"type": "expired", "resource": "a", "fence": 4}},
                {"revision": 20, "namespace": "default", "cluster_time_ms": 502,
                 "kind": {"type": "kv_written", "key": "k", "revision": 20,
                          "fence": 5}},
                {"revision": 21, "namespace": "default", "cluster_time_ms": 503,
                 "kind": {"type": "task_claimed", "queue": "q", "task_id": "t1",
                          "fence": 6, "attempt": 1}},
                {"revision": 22, "namespace": "default", "cluster_time_ms": 504,
                 "kind": {"type": "task_enqueued", "queue": "q", "task_id": "t2"}}
             ], "next": 22}),
        ),
        (
            "cluster status",
            round_trip::<ClusterStatus>,
            json!({"node_id": 1, "leader_id": null, "term": 3, "commit_index": 40,
                   "cluster_time_ms": 84210, "revision": 57, "sessions": 12, "leases": 9,
                   "members": [{"id": 1, "api_addr": "127.0.0.1:7420",
                                "peer_addr": "127.0.0.1:7520", "voter": true}]}),
        ),
        (
            "queue list",
            round_trip::<QueueList>,
            json!({"queues": [{"queue": "build", "counts": {"ready": 1, "waiting": 0,
                   "claimed": 2, "done": 3, "dead": 0}}], "next_cursor": "build"}),
        ),
        (
            "queue list, last page",
            round_trip::<QueueList>,
            json!({"queues": [], "next_cursor": null}),
        ),
        (
            "queued",
            round_trip::<Queued>,
            json!({"queued": true, "position": 2, "resource": "db/migrations",
                   "session_id": "9d0f3b5a1c2e4f6a8b7c6d5e4f3a2b1c", "session_created": false}),
        ),
        (
            "add member",
            round_trip::<AddMemberRequest>,
            json!({"id": 4, "api_addr": "h:1", "peer_addr": "h:2", "voter": false}),
        ),
        (
            "digest",
            round_trip::<Digest>,
            json!({"node_id": 2, "applied_index": 40, "cluster_time_ms": 9000,
                   "digest": "00ff"}),
        ),
        (
            "problem",
            round_trip::<Problem>,
            json!({"code": "LEASE_HELD", "message": "a is held by agent-b",
                   "held_by": lease_json(), "current_fence": 41}),
        ),
    ];
    for (name, check, json) in cases {
        eprintln!("case: {name}");
        check(&json);
    }
}

#[test]
fn error_codes_use_their_spec_spelling() {
    assert_eq!(
        serde_json::to_string(&ErrorCode::LeaseHeld).unwrap(),
        r#""LEASE_HELD""#
    );
    for code in ErrorCode::ALL {
        let written = serde_json::to_value(code).unwrap();
        assert_eq!(written, json!(code.as_str()));
        assert_eq!(code.to_string(), code.as_str());
        assert_eq!(serde_json::from_value::<ErrorCode>(written).unwrap(), code);
    }
    assert!(serde_json::from_value::<ErrorCode>(json!("lease_held")).is_err());
}

#[test]
fn only_unknown_outcomes_are_indeterminate() {
    let indeterminate: Vec<ErrorCode> = ErrorCode::ALL
        .into_iter()
        .filter(|code| code.is_indeterminate())
        .collect();
    assert_eq!(
        indeterminate,
        [ErrorCode::OutcomeUnknown, ErrorCode::Internal]
    );
    let retryable: Vec<ErrorCode> = ErrorCode::ALL
        .into_iter()
        .filter(|code| code.is_retryable())
        .collect();
    assert_eq!(
        retryable,
        [ErrorCode::ResourceExhausted, ErrorCode::NoLeader]
    );
}

#[test]
fn requests_refuse_unknown_fields() {
    let cases: Vec<(&str, Refuses, Value)> = vec![
        (
            "acquire",
            |json| serde_json::from_value::<AcquireRequest>(json).is_err(),
            json!({"resource": "a", "session_id": "s", "ttl": 5}),
        ),
        (
            "create session",
            |json| serde_json::from_value::<CreateSessionRequest>(json).is_err(),
            json!({"holder": "h", "ttl_ms": 1000, "label": {}}),
        ),
        (
            "kv put",
            |json| serde_json::from_value::<KvPutRequest>(json).is_err(),
            json!({"value": 1, "fence": {"resource": "a", "token": 1, "x": 0},
                   "session_id": "s"}),
        ),
        (
            "claim",
            |json| serde_json::from_value::<ClaimRequest>(json).is_err(),
            json!({"session": "s"}),
        ),
        (
            "enqueue",
            |json| serde_json::from_value::<EnqueueRequest>(json).is_err(),
            json!({"payload": 1, "prio": 2}),
        ),
        (
            "list leases query",
            |json| serde_json::from_value::<ListLeasesQuery>(json).is_err(),
            json!({"prefx": "a"}),
        ),
    ];
    for (name, refused, json) in cases {
        assert!(refused(json), "{name} accepted an unknown field");
    }
}

#[test]
fn answers_tolerate_unknown_fields_and_event_types() {
    let mut problem = json!({"code": "NO_LEADER", "message": "election", "status": 503,
                             "type": "about:blank", "retry_after_ms": 250});
    let parsed: Problem = serde_json::from_value(problem.clone()).unwrap();
    assert_eq!(parsed.retry_after_ms, Some(250));
    problem["code"] = json!("OUTCOME_UNKNOWN");
    assert!(serde_json::from_value::<Problem>(problem)
        .unwrap()
        .code
        .is_indeterminate());

    let event: Event = serde_json::from_value(json!({
        "revision": 1, "namespace": "default", "cluster_time_ms": 2, "shard": 0,
        "kind": {"type": "lease_migrated", "resource": "a"}
    }))
    .unwrap();
    assert_eq!(event.kind, EventKind::Unknown);
}

#[test]
fn held_by_never_carries_a_session_id() {
    let grant = Grant {
        limit: None,
        resource: "a".to_owned(),
        fence: 1,
        session_id: SessionId::new("secret-session"),
        holder: "agent-b".to_owned(),
        mode: LeaseMode::Exclusive,
        labels: Labels::new(),
        max_hold_ms: None,
        acquired_at: "2025-01-01T00:00:00Z".to_owned(),
        expires_in_ms: 1000,
        expires_at: "2025-01-01T00:00:01Z".to_owned(),
    };
    let mut problem = Problem::new(ErrorCode::LeaseHeld, "a is held by agent-b");
    problem.held_by = Some(HeldBy::from(grant.clone().into_lease()));
    let written = serde_json::to_string(&problem).unwrap();
    assert!(!written.contains("session_id"), "{written}");
    assert!(!written.contains("secret-session"), "{written}");
    // A stray session_id in a held_by is ignored, never surfaced.
    let mut held_by = lease_json();
    held_by["session_id"] = json!("secret-session");
    let parsed: HeldBy = serde_json::from_value(held_by).unwrap();
    assert!(!serde_json::to_string(&parsed)
        .unwrap()
        .contains("secret-session"));
    // Debug output of a body never shows the id either.
    assert!(!format!("{grant:?}").contains("secret-session"));
}

#[test]
fn unset_optional_fields_are_omitted() {
    let written = serde_json::to_value(Problem::new(ErrorCode::NotFound, "no lease a")).unwrap();
    assert_eq!(
        written,
        json!({"code": "NOT_FOUND", "message": "no lease a"})
    );

    let acquire = AcquireRequest {
        limit: None,
        resource: "a".to_owned(),
        session_id: Some(SessionId::new("s1")),
        holder: None,
        ttl_ms: None,
        mode: LeaseMode::default(),
        max_hold_ms: None,
        labels: Labels::new(),
        reason: None,
        wait_ms: None,
    };
    assert_eq!(
        serde_json::to_value(&acquire).unwrap(),
        json!({"resource": "a", "session_id": "s1", "mode": "exclusive"})
    );

    let parsed: AcquireRequest =
        serde_json::from_value(json!({"resource": "a", "session_id": "s1"})).unwrap();
    assert_eq!(parsed, acquire);
    let add: AddMemberRequest =
        serde_json::from_value(json!({"id": 2, "api_addr": "a", "peer_addr": "p"})).unwrap();
    assert!(add.voter);
    let fail: FailRequest =
        serde_json::from_value(json!({"session_id": "s", "fence": 1, "reason": "r"})).unwrap();
    assert!(fail.retry);
    assert!(
        serde_json::from_value::<KvPutRequest>(json!({})).is_err(),
        "value is required"
    );
}

#[test]
fn owner_is_a_session_or_a_new_session_never_both() {
    let session = SessionId::new("s1");
    let cases: Vec<(Fields<'_>, Expected<'_>)> = vec![
        ((Some("s1"), None, None), Ok(Owner::Session(&session))),
        (
            (None, Some("h"), Some(5000)),
            Ok(Owner::NewSession {
                holder: "h",
                ttl_ms: 5000,
            }),
        ),
        ((Some("s1"), Some("h"), Some(5000)), Err("not both")),
        ((Some("s1"), None, Some(5000)), Err("not both")),
        ((None, None, None), Err("give either")),
        ((None, Some("h"), None), Err("needs ttl_ms")),
        ((None, None, Some(5000)), Err("needs holder")),
    ];
    for ((session_id, holder, ttl_ms), expected) in cases {
        let acquire = AcquireRequest {
            limit: None,
            resource: "a".to_owned(),
            session_id: session_id.map(SessionId::from),
            holder: holder.map(str::to_owned),
            ttl_ms,
            mode: LeaseMode::Exclusive,
            max_hold_ms: None,
            labels: Labels::new(),
            reason: None,
            wait_ms: None,
        };
        let claim = ClaimRequest {
            session_id: acquire.session_id.clone(),
            holder: acquire.holder.clone(),
            ttl_ms,
            wait_ms: None,
        };
        for owner in [acquire.owner(), claim.owner()] {
            match (&owner, &expected) {
                (Ok(owner), Ok(expected)) => assert_eq!(owner, expected),
                (Err(message), Err(fragment)) => {
                    assert!(message.contains(fragment), "{message}")
                }
                _ => panic!("{session_id:?} {holder:?} {ttl_ms:?}: got {owner:?}"),
            }
        }
    }
}

#[test]
fn kv_fence_and_session_come_both_or_neither() {
    let fence = json!({"resource": "a", "token": 3});
    let cases = [
        (json!({"value": 1}), Ok(false)),
        (
            json!({"value": 1, "fence": fence, "session_id": "s"}),
            Ok(true),
        ),
        (
            json!({"value": 1, "fence": fence}),
            Err("needs the session_id"),
        ),
        (json!({"value": 1, "session_id": "s"}), Err("give both")),
    ];
    for (body, expected) in cases {
        let put: KvPutRequest = serde_json::from_value(body.clone()).unwrap();
        let mut delete_body = body;
        delete_body.as_object_mut().unwrap().remove("value");
        let delete: KvDeleteRequest = serde_json::from_value(delete_body).unwrap();
        for fenced_by in [put.fenced_by(), delete.fenced_by()] {
            match (fenced_by, expected) {
                (Ok(fenced_by), Ok(is_fenced)) => {
                    assert_eq!(fenced_by.is_some(), is_fenced);
                    if let Some(fenced_by) = fenced_by {
                        assert_eq!(fenced_by.fence.token, 3);
                        assert_eq!(fenced_by.session_id.as_str(), "s");
                    }
                }
                (Err(message), Err(fragment)) => {
                    assert!(message.contains(fragment), "{message}")
                }
                (got, _) => panic!("got {got:?}, expected {expected:?}"),
            }
        }
    }
}

/// A transaction's compares built by their constructors travel as docs/api.md shows them, and
/// read back as the compare they were made as.
#[test]
fn txn_compares_are_built_as_documented() {
    let fence = TxnCompare::fence("repo/build", 41);
    let absent = TxnCompare::kv_revision("results/build", 0);
    assert_eq!(
        serde_json::to_value(&fence).unwrap(),
        json!({"fence": {"resource": "repo/build", "token": 41}})
    );
    assert_eq!(
        serde_json::to_value(&absent).unwrap(),
        json!({"kv": "results/build", "revision": 0})
    );
    assert!(matches!(fence.kind(), Ok(CompareKind::Fence(fence)) if fence.token == 41));
    assert!(matches!(
        absent.kind(),
        Ok(CompareKind::KvRevision {
            key: "results/build",
            revision: 0
        })
    ));
}
