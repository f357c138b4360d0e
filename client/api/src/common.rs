//! Pieces several route families share: session ids, lease modes, fences, owners.

use std::fmt;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A session id: a secret capability (docs/guarantees.md, "Vocabulary"). Serialized as a plain JSON string; its
/// `Debug` is redacted so that logging a request body never leaks it. Read it with
/// [`SessionId::as_str`] only where it must be sent or compared.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(transparent)]
pub struct SessionId(String);

impl SessionId {
    /// Wraps a session id string.
    pub fn new(id: impl Into<String>) -> SessionId {
        SessionId(id.into())
    }

    /// The id itself. Never log it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SessionId {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("SessionId(<redacted>)")
    }
}

impl From<String> for SessionId {
    fn from(id: String) -> SessionId {
        SessionId(id)
    }
}

impl From<&str> for SessionId {
    fn from(id: &str) -> SessionId {
        SessionId(id.to_owned())
    }
}

/// A lease's kind: `exclusive` (that path), `subtree` (that path and everything under it) or
/// `shared` (that path, by up to `limit` holders at once: a semaphore).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum LeaseMode {
    /// The path alone. The default.
    #[default]
    Exclusive,
    /// The path and every path below it.
    Subtree,
    /// The path, held by up to `limit` sessions at once, each with its own fence.
    Shared,
}

impl LeaseMode {
    /// `exclusive`, `subtree` or `shared`, as on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseMode::Exclusive => "exclusive",
            LeaseMode::Subtree => "subtree",
            LeaseMode::Shared => "shared",
        }
    }
}

/// A fence as carried by a fenced kv write and shown by a kv read: `{resource, token}`.
/// It refuses unknown fields because it is part of request bodies; it is also a closed,
/// two-field shape in answers.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FenceRef {
    /// The leased resource whose fence guards the write.
    pub resource: String,
    /// The fence token of that lease.
    pub token: u64,
}

/// Who will own a lease or task claim, as validated from a request's optional fields by
/// [`AcquireRequest::owner`](crate::AcquireRequest::owner) and [`ClaimRequest::owner`](crate::ClaimRequest::owner).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner<'a> {
    /// An existing session, named by its id.
    Session(&'a SessionId),
    /// A new session created in the same write (none is created if the write is refused).
    NewSession {
        /// The new session's holder name.
        holder: &'a str,
        /// The new session's TTL.
        ttl_ms: u64,
    },
}

/// The proof a fenced kv write carries, as validated by [`KvPutRequest::fenced_by`](crate::KvPutRequest::fenced_by) and
/// [`KvDeleteRequest::fenced_by`](crate::KvDeleteRequest::fenced_by).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FencedBy<'a> {
    /// The fence the write claims to hold.
    pub fence: &'a FenceRef,
    /// The session that must hold that fence.
    pub session_id: &'a SessionId,
}

pub(crate) fn owner_from_fields<'a>(
    session_id: Option<&'a SessionId>,
    holder: Option<&'a str>,
    ttl_ms: Option<u64>,
) -> Result<Owner<'a>, String> {
    match (session_id, holder, ttl_ms) {
        (Some(session_id), None, None) => Ok(Owner::Session(session_id)),
        (None, Some(holder), Some(ttl_ms)) => Ok(Owner::NewSession { holder, ttl_ms }),
        (Some(_), _, _) => Err("give either session_id, or holder and ttl_ms, not both".to_owned()),
        (None, None, None) => Err("give either session_id, or holder and ttl_ms".to_owned()),
        (None, Some(_), None) => Err("holder needs ttl_ms to create a session".to_owned()),
        (None, None, Some(_)) => Err("ttl_ms needs holder to create a session".to_owned()),
    }
}

pub(crate) fn fenced_by_fields<'a>(
    fence: Option<&'a FenceRef>,
    session_id: Option<&'a SessionId>,
) -> Result<Option<FencedBy<'a>>, String> {
    match (fence, session_id) {
        (Some(fence), Some(session_id)) => Ok(Some(FencedBy { fence, session_id })),
        (None, None) => Ok(None),
        (Some(_), None) => Err("fence needs the session_id that holds it".to_owned()),
        (None, Some(_)) => Err("session_id is only used with a fence; give both".to_owned()),
    }
}

pub(crate) fn default_true() -> bool {
    true
}

pub(crate) fn is_zero(value: &i32) -> bool {
    *value == 0
}
