//! `/v1/txn`: transactions, the outbox. Compares, then the `success` or the `failure` ops, all
//! applied in one write or none of them.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::{EnqueueRequest, FenceRef, SessionId, Task};

/// `POST /v1/txn` body: `{session_id?, compare: [...], success: [...], failure?: [...]}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TxnRequest {
    /// The session that fence compares and fenced ops (`release`, `complete_task`,
    /// `fail_task`) act for; needed when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<SessionId>,
    /// All must hold for `success` to run; otherwise `failure` runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub compare: Vec<TxnCompare>,
    /// The ops run when every compare holds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub success: Vec<TxnOp>,
    /// The ops run when a compare does not hold.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failure: Vec<TxnOp>,
}

/// One compare: `{"fence": {"resource", "token"}}` (the token is the live fence of the
/// resource, held by the transaction's session) or `{"kv": KEY, "revision": N}` (the key's
/// revision is N; 0 means absent). Exactly one of `fence` and `kv` (checked by
/// [`TxnCompare::kind`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TxnCompare {
    /// Holds when this is a live fence of the transaction's session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<FenceRef>,
    /// Holds when this key's revision is `revision`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv: Option<String>,
    /// With `kv`: the expected revision, 0 for an absent key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<u64>,
}

/// What a [`TxnCompare`] compares, once checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompareKind<'a> {
    Fence(&'a FenceRef),
    KvRevision { key: &'a str, revision: u64 },
}

impl TxnCompare {
    /// A compare on a fence.
    pub fn fence(resource: impl Into<String>, token: u64) -> TxnCompare {
        TxnCompare {
            fence: Some(FenceRef {
                resource: resource.into(),
                token,
            }),
            kv: None,
            revision: None,
        }
    }

    /// A compare on a key's revision (0: the key is absent).
    pub fn kv_revision(key: impl Into<String>, revision: u64) -> TxnCompare {
        TxnCompare {
            fence: None,
            kv: Some(key.into()),
            revision: Some(revision),
        }
    }

    /// The compare, or a message for `INVALID_ARGUMENT`.
    pub fn kind(&self) -> Result<CompareKind<'_>, String> {
        match (&self.fence, &self.kv, self.revision) {
            (Some(fence), None, None) => Ok(CompareKind::Fence(fence)),
            (None, Some(key), Some(revision)) => Ok(CompareKind::KvRevision { key, revision }),
            (None, Some(_), None) => Err("a kv compare needs its revision (0: absent)".to_owned()),
            _ => Err(
                "a compare is {\"fence\": {\"resource\", \"token\"}} or {\"kv\": KEY, \"revision\": N}"
                    .to_owned(),
            ),
        }
    }
}

/// One op of a transaction, tagged by `op`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum TxnOp {
    /// Store a JSON value (unfenced: the compares guard the transaction).
    Put { key: String, value: Value },
    /// Remove a key; refused with `NOT_FOUND` when absent.
    Delete { key: String },
    /// Release the transaction's session's lease on `resource`.
    Release { resource: String },
    /// Add a task (the body of `POST /v1/queues/{queue}/tasks`); it may depend on tasks added
    /// by earlier ops.
    AddTask { queue: String, task: EnqueueRequest },
    /// Complete a task claimed by the transaction's session with `fence`.
    CompleteTask {
        queue: String,
        id: String,
        fence: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        result: Option<Value>,
    },
    /// Fail a task claimed by the transaction's session with `fence`; `retry` defaults to
    /// `false` here (the step failed for good, so its `on_dead` compensation runs).
    FailTask {
        queue: String,
        id: String,
        fence: u64,
        reason: String,
        #[serde(default)]
        retry: bool,
    },
}

/// `POST /v1/txn` answer: `{succeeded, results}`, one result per op run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TxnResponse {
    /// Whether every compare held (and so `success` ran, else `failure`).
    pub succeeded: bool,
    /// One per op run, in order.
    pub results: Vec<TxnOpResult>,
}

/// What one op did, tagged by `op` like the op itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum TxnOpResult {
    Put { revision: u64 },
    Delete { revision: u64 },
    Release { released: String, fence: u64 },
    AddTask { task: Task },
    CompleteTask { task: Task },
    FailTask { task: Task },
}
