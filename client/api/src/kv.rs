//! `/v1/kv`: the fenced key-value store.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::common::fenced_by_fields;
use crate::{FenceRef, FencedBy, SessionId};

/// `PUT /v1/kv/{*key}` body: `{value, fence?, session_id?}`; `fence` and `session_id` come
/// both or neither (checked by [`KvPutRequest::fenced_by`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct KvPutRequest {
    /// The JSON value to store.
    pub value: Value,
    /// The fence the writer holds; the write applies only if it is live for `session_id`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<FenceRef>,
    /// The session that holds `fence`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<SessionId>,
}

impl KvPutRequest {
    /// `Ok(None)` for an unconditional write, `Ok(Some(..))` for a fenced one, or a message for
    /// `INVALID_ARGUMENT` when only one of `fence` and `session_id` is given.
    pub fn fenced_by(&self) -> Result<Option<FencedBy<'_>>, String> {
        fenced_by_fields(self.fence.as_ref(), self.session_id.as_ref())
    }
}

/// `PUT /v1/kv/{*key}` answer: `{revision}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct KvPutResponse {
    /// The revision of this write.
    pub revision: u64,
}

/// `GET /v1/kv/{*key}` answer: `{key, value, revision, fence}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct KvEntry {
    /// The key.
    pub key: String,
    /// The stored JSON value.
    pub value: Value,
    /// The revision of the write that stored it.
    pub revision: u64,
    /// The fence that wrote it, or `null` for an unconditional write.
    pub fence: Option<FenceRef>,
}

/// `DELETE /v1/kv/{*key}` body: `{fence?, session_id?}`, both or neither (checked by
/// [`KvDeleteRequest::fenced_by`]). An absent body means an unconditional delete.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct KvDeleteRequest {
    /// The fence the deleter holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<FenceRef>,
    /// The session that holds `fence`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<SessionId>,
}

impl KvDeleteRequest {
    /// Same rule as [`KvPutRequest::fenced_by`].
    pub fn fenced_by(&self) -> Result<Option<FencedBy<'_>>, String> {
        fenced_by_fields(self.fence.as_ref(), self.session_id.as_ref())
    }
}

/// `DELETE /v1/kv/{*key}` answer: `{deleted, revision}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct KvDeleteResponse {
    /// Whether the key existed.
    pub deleted: bool,
    /// The revision of the delete, or `null` when there was nothing to delete.
    pub revision: Option<u64>,
}
