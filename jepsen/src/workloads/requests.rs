//! The request bodies the workloads send, built from the wire types of `baton_client::api` so
//! that a renamed or retyped field fails to compile here instead of becoming a 400 in a run.
//! Each returns the JSON the harness sends and records.

use baton_client::api::{
    AcquireRequest, ClaimRequest, CompleteRequest, EnqueueRequest, FenceRef, KvPutRequest,
    LeaseMode, ReleaseRequest, SessionId, TxnCompare, TxnOp, TxnRequest,
};
use serde::Serialize;
use serde_json::Value;

use super::Mode;

/// `POST /v1/leases` for a new session of `holder` with `ttl_ms`.
pub fn acquire(resource: &str, holder: &str, ttl_ms: u64, mode: Mode) -> Value {
    wire(&new_session_acquire(resource, holder, ttl_ms, mode, None))
}

fn new_session_acquire(
    resource: &str,
    holder: &str,
    ttl_ms: u64,
    mode: Mode,
    wait_ms: Option<u64>,
) -> AcquireRequest {
    AcquireRequest {
        resource: resource.to_owned(),
        session_id: None,
        holder: Some(holder.to_owned()),
        ttl_ms: Some(ttl_ms),
        mode: wire_mode(mode),
        limit: mode.limit(),
        max_hold_ms: None,
        labels: Default::default(),
        reason: None,
        wait_ms,
    }
}

/// `POST /v1/leases` for a new session of `holder` with `ttl_ms` that waits in the resource's
/// line up to `wait_ms` when it cannot be granted at once.
pub fn acquire_waiting(
    resource: &str,
    holder: &str,
    ttl_ms: u64,
    mode: Mode,
    wait_ms: u64,
) -> Value {
    wire(&new_session_acquire(
        resource,
        holder,
        ttl_ms,
        mode,
        Some(wait_ms),
    ))
}

/// The same acquire again for `session`, which waits in the line already: it keeps its place
/// and waits up to `wait_ms` more.
pub fn acquire_again(resource: &str, session: &str, mode: Mode, wait_ms: u64) -> Value {
    wire(&AcquireRequest {
        resource: resource.to_owned(),
        session_id: Some(SessionId::new(session)),
        holder: None,
        ttl_ms: None,
        mode: wire_mode(mode),
        limit: mode.limit(),
        max_hold_ms: None,
        labels: Default::default(),
        reason: None,
        wait_ms: Some(wait_ms),
    })
}

fn wire_mode(mode: Mode) -> LeaseMode {
    match mode {
        Mode::Exclusive => LeaseMode::Exclusive,
        Mode::Subtree => LeaseMode::Subtree,
        Mode::Shared { .. } => LeaseMode::Shared,
    }
}

/// `POST /v1/sessions/{id}/release`.
pub fn release(resource: &str) -> Value {
    wire(&ReleaseRequest {
        resource: resource.to_owned(),
    })
}

/// `PUT /v1/kv/{key}`, fenced by `fence` of `resource` held by `session` when given.
pub fn kv_put(value: Value, fenced_by: Option<(&str, u64, &str)>) -> Value {
    wire(&KvPutRequest {
        value,
        fence: fenced_by.map(|(resource, token, _)| FenceRef {
            resource: resource.to_owned(),
            token,
        }),
        session_id: fenced_by.map(|(_, _, session)| SessionId::new(session)),
    })
}

/// `POST /v1/txn`: put `value` under `key` if `fence` is still the live fence of `resource`
/// held by `session` (a fenced write as a transaction).
pub fn txn_put(key: &str, value: Value, resource: &str, fence: u64, session: &str) -> Value {
    wire(&TxnRequest {
        session_id: Some(SessionId::new(session)),
        compare: vec![TxnCompare::fence(resource, fence)],
        success: vec![TxnOp::Put {
            key: key.to_owned(),
            value,
        }],
        failure: Vec::new(),
    })
}

/// `POST /v1/txn`: put the same `value` under `key` and then under `twin`, in one
/// transaction, if `fence` is still the live fence of `resource` held by `session`. The two
/// puts are applied together or not at all, and get consecutive revisions (`key`'s first).
pub fn txn_put_pair(
    key: &str,
    twin: &str,
    value: Value,
    resource: &str,
    fence: u64,
    session: &str,
) -> Value {
    wire(&TxnRequest {
        session_id: Some(SessionId::new(session)),
        compare: vec![TxnCompare::fence(resource, fence)],
        success: vec![
            TxnOp::Put {
                key: key.to_owned(),
                value: value.clone(),
            },
            TxnOp::Put {
                key: twin.to_owned(),
                value,
            },
        ],
        failure: Vec::new(),
    })
}

/// `POST /v1/queues/{queue}/tasks`.
pub fn enqueue(id: &str, payload: Value, max_attempts: u32) -> Value {
    wire(&EnqueueRequest {
        id: Some(id.to_owned()),
        payload,
        priority: 0,
        depends_on: Vec::new(),
        max_attempts: Some(max_attempts),
        not_before_ms: None,
        on_dead: None,
    })
}

/// `POST /v1/queues/{queue}/claim` for a new session of `holder` with `ttl_ms`.
pub fn claim(holder: &str, ttl_ms: u64) -> Value {
    wire(&ClaimRequest {
        session_id: None,
        holder: Some(holder.to_owned()),
        ttl_ms: Some(ttl_ms),
        wait_ms: None,
    })
}

/// `POST /v1/queues/{queue}/tasks/{id}/complete`.
pub fn complete(session: &str, fence: u64, result: Value) -> Value {
    wire(&CompleteRequest {
        session_id: SessionId::new(session),
        fence,
        result: Some(result),
    })
}

fn wire(request: &impl Serialize) -> Value {
    serde_json::to_value(request).expect("a wire type always serializes")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn bodies_have_the_wire_shape() {
        assert_eq!(
            acquire("a/b", "w1", 800, Mode::Subtree),
            json!({"resource": "a/b", "holder": "w1", "ttl_ms": 800, "mode": "subtree"})
        );
        assert_eq!(
            kv_put(json!(7), Some(("r", 3, "s1"))),
            json!({"value": 7, "fence": {"resource": "r", "token": 3}, "session_id": "s1"})
        );
        assert_eq!(kv_put(json!(7), None), json!({"value": 7}));
        assert_eq!(
            acquire_waiting("q/s", "w1.3", 3000, Mode::Shared { limit: 2 }, 700),
            json!({"resource": "q/s", "holder": "w1.3", "ttl_ms": 3000, "mode": "shared",
                   "limit": 2, "wait_ms": 700})
        );
        assert_eq!(
            acquire_again("q/a", "s1", Mode::Exclusive, 0),
            json!({"resource": "q/a", "session_id": "s1", "mode": "exclusive", "wait_ms": 0})
        );
        assert_eq!(
            txn_put_pair("r0-1", "t0-1", json!(7), "kvlock/r0-1", 3, "s1"),
            json!({"session_id": "s1",
                   "compare": [{"fence": {"resource": "kvlock/r0-1", "token": 3}}],
                   "success": [{"op": "put", "key": "r0-1", "value": 7},
                               {"op": "put", "key": "t0-1", "value": 7}]})
        );
        assert_eq!(
            complete("s1", 4, json!({"by": 2})),
            json!({"session_id": "s1", "fence": 4, "result": {"by": 2}})
        );
    }
}
