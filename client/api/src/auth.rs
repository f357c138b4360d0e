//! `/v1/auth/tokens` and `/v1/limits`: access control and the cluster's limits.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// What a token may do; each role includes the ones before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum TokenRole {
    /// GET routes, fence checks and event streams.
    Reader,
    /// Every session, lease, key-value and queue route in its namespaces.
    Agent,
    /// Everything: tokens, limits, membership, and every session.
    Admin,
}

/// Most live sessions and leases a token may hold; past them, 429 `RESOURCE_EXHAUSTED`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenQuotas {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sessions_max: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leases_max: Option<u64>,
}

/// `POST /v1/auth/tokens` body: `{name, role, namespaces, quotas?}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTokenRequest {
    /// 1..=128 characters of `A-Z a-z 0-9 . _ : -`, unique in the cluster.
    pub name: String,
    pub role: TokenRole,
    /// The namespaces it may use; `["*"]` for all.
    pub namespaces: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quotas: Option<TokenQuotas>,
}

/// A token as listed: never its secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TokenInfo {
    pub name: String,
    pub role: TokenRole,
    /// `["*"]` for all.
    pub namespaces: Vec<String>,
    /// Its quotas; `{}` when it has none.
    #[serde(default)]
    pub quotas: TokenQuotas,
    /// When it was created (informational, RFC 3339 UTC).
    pub created_at: String,
}

/// `POST /v1/auth/tokens` answer: the token and its secret, shown this once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CreatedToken {
    #[serde(flatten)]
    pub token: TokenInfo,
    /// Send it as `Authorization: Bearer <secret>`. Only its SHA-256 is kept.
    pub secret: String,
}

/// `GET /v1/auth/tokens` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TokenList {
    pub tokens: Vec<TokenInfo>,
}

/// `DELETE /v1/auth/tokens/{name}` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RevokedToken {
    pub name: String,
}
