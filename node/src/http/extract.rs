//! Request extractors that refuse bad input with the spec's codes: the namespace header, the
//! idempotency key, JSON bodies (with their canonical bytes, for fingerprints), path and query
//! parameters. Every rejection is an `ApiError`, never axum's plain-text default.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, MatchedPath, Path, Query, Request};
use axum::http::request::Parts;
use axum::http::{Method, StatusCode};
use baton_api::{HEADER_IDEMPOTENCY_KEY, HEADER_NAMESPACE};
use baton_raft_store::machine::{
    validate_idempotency_key, Caller, IdempotencyTag, Name, Namespace, ResourcePath,
};
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};

use super::auth::TokenHash;
use super::error::ApiError;
use super::AppState;
use crate::service::Mutation;

/// A path in a write's body or route: its shape is checked here, its bounds by admission
/// (`Service::decide` and the machine's `apply` run `admit`).
pub fn write_path(text: &str) -> Result<ResourcePath, ApiError> {
    ResourcePath::new(text).map_err(ApiError::from_invalid)
}

/// A path a read looks up: its shape and its bounds.
pub fn read_path(app: &AppState, text: &str) -> Result<ResourcePath, ApiError> {
    app.with_limits(|limits| ResourcePath::parse(text, limits))
        .map_err(ApiError::from_invalid)
}

/// A queue name or task id of a write (see [`write_path`]).
pub fn write_name(what: &str, text: &str) -> Result<Name, ApiError> {
    Name::new(what, text).map_err(ApiError::from_invalid)
}

/// A queue name a read looks up (see [`read_path`]).
pub fn read_name(app: &AppState, what: &str, text: &str) -> Result<Name, ApiError> {
    app.with_limits(|limits| Name::parse(what, text, limits))
        .map_err(ApiError::from_invalid)
}

/// The request's namespace (`Baton-Namespace`, default `default`).
#[derive(Debug)]
pub struct Ns(pub Namespace);

impl FromRequestParts<AppState> for Ns {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &AppState) -> Result<Ns, ApiError> {
        let Some(value) = parts.headers.get(HEADER_NAMESPACE) else {
            return Ok(Ns(Namespace::default_namespace()));
        };
        let text = value
            .to_str()
            .map_err(|_| ApiError::invalid(format!("{HEADER_NAMESPACE} must be ASCII")))?;
        app.with_limits(|limits| Namespace::parse(text, limits))
            .map(Ns)
            .map_err(ApiError::from_invalid)
    }
}

/// The token a request was made with, when access control is on: the `Caller` the auth
/// middleware (`auth.rs`) put in the request, by name. Writes carry it into the log.
#[derive(Debug)]
pub struct By(pub Option<Name>);

impl FromRequestParts<AppState> for By {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _app: &AppState) -> Result<By, ApiError> {
        Ok(By(parts
            .extensions
            .get::<Caller>()
            .map(|caller| caller.name.clone())))
    }
}

/// The token a request was made with and its secret's hash, when access control is on.
#[derive(Debug)]
pub struct Token(pub Option<(Caller, TokenHash)>);

impl FromRequestParts<AppState> for Token {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _app: &AppState) -> Result<Token, ApiError> {
        let caller = parts.extensions.get::<Caller>().cloned();
        let hash = parts.extensions.get::<TokenHash>().copied();
        Ok(Token(caller.zip(hash)))
    }
}

/// The `Idempotency-Key` header, if any, checked for length.
#[derive(Debug)]
struct IdempotencyKey(Option<String>);

impl FromRequestParts<AppState> for IdempotencyKey {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        app: &AppState,
    ) -> Result<IdempotencyKey, ApiError> {
        let Some(value) = parts.headers.get(HEADER_IDEMPOTENCY_KEY) else {
            return Ok(IdempotencyKey(None));
        };
        let key = value.to_str().map_err(|_| {
            ApiError::invalid(format!("{HEADER_IDEMPOTENCY_KEY} must be printable ASCII"))
        })?;
        app.with_limits(|limits| validate_idempotency_key(key, limits))
            .map_err(ApiError::from_invalid)?;
        Ok(IdempotencyKey(Some(key.to_owned())))
    }
}

/// What a write takes from its request besides its parameters and body: the namespace, the
/// token it is made with, its idempotency key, and its route (method and path pattern, which
/// the key's fingerprint covers, so that one key sent to two routes is two requests).
#[derive(Debug)]
pub struct Write {
    pub namespace: Namespace,
    by: Option<Name>,
    key: Option<String>,
    method: Method,
    route: MatchedPath,
}

impl FromRequestParts<AppState> for Write {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &AppState) -> Result<Write, ApiError> {
        let Ns(namespace) = Ns::from_request_parts(parts, app).await?;
        let By(by) = By::from_request_parts(parts, app).await?;
        let IdempotencyKey(key) = IdempotencyKey::from_request_parts(parts, app).await?;
        let route = parts
            .extensions
            .get::<MatchedPath>()
            .cloned()
            .ok_or_else(|| ApiError::internal("a write's handler ran without its route"))?;
        Ok(Write {
            namespace,
            by,
            key,
            method: parts.method.clone(),
            route,
        })
    }
}

impl Write {
    /// The mutation, with its idempotency tag over the route, the path's `parameters` and the
    /// body's `canonical` bytes, and its estimated share of a log entry.
    pub fn mutation(
        self,
        app: &AppState,
        parameters: &[&str],
        canonical: &[u8],
        size_bytes: usize,
    ) -> Mutation {
        let tag = self.key.map(|key| IdempotencyTag {
            key,
            fingerprint: fingerprint(
                &self.namespace,
                self.method.as_str(),
                self.route.as_str(),
                parameters,
                canonical,
            ),
            wall_ms: app.clock.wall_ms(),
        });
        Mutation {
            namespace: self.namespace,
            by: self.by,
            tag,
            size_bytes,
        }
    }
}

/// What identifies a write for its idempotency key (G8): a retry must match it, and a key sent
/// with another request is refused. Recorded in the replicated state, so it never changes
/// between versions (a test pins it).
fn fingerprint(
    namespace: &Namespace,
    method: &str,
    route: &str,
    parameters: &[&str],
    canonical_body: &[u8],
) -> [u8; 32] {
    let mut hasher = Sha256::new();
    for part in [
        namespace.as_str().as_bytes(),
        method.as_bytes(),
        route.as_bytes(),
    ]
    .into_iter()
    .chain(parameters.iter().map(|parameter| parameter.as_bytes()))
    .chain([canonical_body])
    {
        hasher.update((part.len() as u64).to_le_bytes());
        hasher.update(part);
    }
    hasher.finalize().into()
}

/// A JSON body: the typed value and its canonical encoding (keys sorted), which the
/// idempotency fingerprint covers. An empty body reads as `{}`.
#[derive(Debug)]
pub struct ApiJson<T> {
    pub value: T,
    pub canonical: Vec<u8>,
}

impl<T: DeserializeOwned> FromRequest<AppState> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, app: &AppState) -> Result<ApiJson<T>, ApiError> {
        let bytes = Bytes::from_request(request, app)
            .await
            .map_err(|rejection| {
                if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                    ApiError::new(
                        baton_api::ErrorCode::PayloadTooLarge,
                        format!("the request body is over {} bytes", super::BODY_BYTES_MAX),
                    )
                } else {
                    ApiError::invalid(format!("could not read the request body: {rejection}"))
                }
            })?;
        let bytes: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
            b"{}"
        } else {
            &bytes
        };
        let json: serde_json::Value = serde_json::from_slice(bytes)
            .map_err(|error| ApiError::invalid(format!("malformed JSON body: {error}")))?;
        let canonical = serde_json::to_vec(&json).map_err(ApiError::internal)?;
        let value = T::deserialize(json)
            .map_err(|error| ApiError::invalid(format!("invalid request body: {error}")))?;
        Ok(ApiJson { value, canonical })
    }
}

/// Path parameters; a mismatch is `INVALID_ARGUMENT`.
#[derive(Debug)]
pub struct ApiPath<T>(pub T);

impl<T: DeserializeOwned + Send> FromRequestParts<AppState> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &AppState) -> Result<ApiPath<T>, ApiError> {
        Path::<T>::from_request_parts(parts, app)
            .await
            .map(|Path(value)| ApiPath(value))
            .map_err(|rejection| {
                ApiError::invalid(format!("invalid path: {}", rejection.body_text()))
            })
    }
}

/// Query parameters; unknown or malformed ones are `INVALID_ARGUMENT`.
#[derive(Debug)]
pub struct ApiQuery<T>(pub T);

impl<T: DeserializeOwned> FromRequestParts<AppState> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        app: &AppState,
    ) -> Result<ApiQuery<T>, ApiError> {
        Query::<T>::from_request_parts(parts, app)
            .await
            .map(|Query(value)| ApiQuery(value))
            .map_err(|rejection| {
                ApiError::invalid(format!("invalid query: {}", rejection.body_text()))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::routes::{Served, ROUTES};

    /// A retry during a rolling upgrade is fingerprinted by one version and checked by another:
    /// neither the fingerprint nor the route it covers may change.
    #[test]
    fn a_writes_fingerprint_is_the_one_earlier_versions_recorded() {
        let namespace = Namespace::default_namespace();
        let fingerprint = fingerprint(
            &namespace,
            "PUT",
            "/v1/kv/{*key}",
            &["a/b"],
            br#"{"value":1}"#,
        );
        let hex: String = fingerprint
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect();
        assert_eq!(
            hex,
            "ec1740c3b93b19a7484541301c3b3508d29735cb19bf295a7b4722c77619f340"
        );
        let mut relayed: Vec<String> = ROUTES
            .iter()
            .filter(|route| route.served == Served::Relayed)
            .map(|route| format!("{} {}", route.method, route.pattern))
            .collect();
        relayed.sort();
        assert_eq!(
            relayed,
            [
                "DELETE /v1/kv/{*key}",
                "DELETE /v1/sessions/{id}",
                "POST /v1/leases",
                "POST /v1/queues/{queue}/claim",
                "POST /v1/queues/{queue}/tasks",
                "POST /v1/queues/{queue}/tasks/{id}/complete",
                "POST /v1/queues/{queue}/tasks/{id}/fail",
                "POST /v1/queues/{queue}/tasks/{id}/release",
                "POST /v1/sessions",
                "POST /v1/sessions/{id}/keepalive",
                "POST /v1/sessions/{id}/release",
                "POST /v1/txn",
                "PUT /v1/kv/{*key}",
            ]
        );
    }
}
