//! Access control at the edge (docs/security.md): the middleware that turns a bearer token
//! into a `Caller` and refuses what its role or namespaces do not allow, and the token and
//! limits routes.
//!
//! Every node holds the token table (replicated state), so checking a token costs no Raft round
//! trip; a follower refuses on its own and forwards only what it allows, and the leader checks
//! again. Writes carry the token's name into the log (`Command::Authorized`), where the machine
//! checks it a last time: a revocation takes effect at the entry that applies it. Secrets are
//! never logged, stored or echoed; only their SHA-256 is compared.

use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use baton_api::{
    CreateTokenRequest, CreatedToken, ErrorCode, RevokedToken, TokenInfo, TokenList, TokenQuotas,
    TokenRole, HEADER_NAMESPACE,
};
use baton_raft_store::machine::{
    Caller, Command, Limits, Name, Namespace, NewToken, Quotas, Reply, Role, Scope, TokenView,
};
use sha2::{Digest, Sha256};

use super::convert::Clocks;
use super::error::ApiError;
use super::extract::{ApiJson, ApiPath, By};
use super::routes::{self, Acts};
use super::{ApiAnswer, AppState};
use crate::config::check_secret;

/// The prefix of every secret Baton makes, so a leaked one is recognisable.
const SECRET_PREFIX: &str = "baton_";

/// The SHA-256 a token's secret is known by.
pub fn secret_sha256(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// Proposes the `bootstrap` admin token with `secret`'s hash until the cluster has had one.
/// Every node started with `BATON_BOOTSTRAP_TOKEN` runs this; only the leader's proposals are
/// taken, and the machine keeps the first one applied, ever (a revoked bootstrap token stays
/// revoked when a node restarts with the old secret).
pub async fn bootstrap(app: AppState, secret: String) {
    let secret_sha256 = secret_sha256(&secret);
    drop(secret);
    loop {
        let bootstrapped = app
            .machine
            .read(|machine, _| machine.auth().is_bootstrapped())
            .unwrap_or(true);
        if bootstrapped {
            return;
        }
        if let Ok(committed) = app
            .proposer
            .propose(Command::BootstrapToken { secret_sha256 }, 64)
            .await
        {
            if let Ok(Reply::TokenBootstrapped { created: true }) = committed.response.outcome {
                tracing::info!(
                    "created the bootstrap admin token from {}",
                    crate::config::BOOTSTRAP_TOKEN_ENV
                );
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// What a request needs: the least role and whether its namespace must be in the token's
/// scope, or `None` for an open route (the health checks, the console's page and assets, which
/// ask for a token themselves). A request that matched no route still needs a token: only a
/// caller who may read learns which routes there are.
fn required(method: &Method, pattern: Option<&str>, path: &str) -> Option<(Role, bool)> {
    match pattern.and_then(|pattern| routes::find(method, pattern)) {
        Some(route) => Some((route.access.role()?, route.acts == Acts::InNamespace)),
        None if path == "/ui" || path.starts_with("/ui/") => None,
        None => Some((Role::Reader, false)),
    }
}

/// The middleware, installed only with access control on (`router`): a request needs a known
/// token whose role and namespaces allow it, and carries its `Caller` on to the handlers.
pub async fn authenticate(
    State(app): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    let pattern = request.extensions().get::<MatchedPath>();
    let needs = required(
        request.method(),
        pattern.map(MatchedPath::as_str),
        request.uri().path(),
    );
    let Some((role, namespaced)) = needs else {
        return next.run(request).await;
    };
    let hash = match token_hash(&request) {
        Ok(hash) => hash,
        Err(error) => return error.into_response(),
    };
    let (caller, hash) = match caller_of(&app, hash).await {
        Ok(authenticated) => authenticated,
        Err(error) => return error.into_response(),
    };
    if caller.role < role {
        return ApiError::new(
            ErrorCode::PermissionDenied,
            format!(
                "token {} has role {}; {} {} needs {}",
                caller.name,
                caller.role.as_str(),
                request.method(),
                request.uri().path(),
                role.as_str()
            ),
        )
        .into_response();
    }
    if caller.role != Role::Admin && namespaced {
        let namespace = request
            .headers()
            .get(HEADER_NAMESPACE)
            .and_then(|value| value.to_str().ok())
            .map_or_else(|| Ok(Namespace::default_namespace()), Namespace::new);
        // A malformed namespace is the handler's to refuse (400), with its own message.
        if let Ok(namespace) = namespace {
            if !caller.scope.allows(&namespace) {
                return ApiError::new(
                    ErrorCode::PermissionDenied,
                    format!("token {} may not use namespace {namespace}", caller.name),
                )
                .into_response();
            }
        }
    }
    request.extensions_mut().insert(caller);
    request.extensions_mut().insert(hash);
    next.run(request).await
}

/// The SHA-256 of the secret a request was authenticated with, put in the request beside its
/// `Caller`: what a long-lived answer (an event stream) checks again, so that it ends when
/// that token is revoked, even if another token is made under the same name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenHash(pub [u8; 32]);

/// The hash of the secret a request's `Authorization: Bearer` carries, or 401.
fn token_hash(request: &Request) -> Result<[u8; 32], ApiError> {
    let Some(value) = request.headers().get(header::AUTHORIZATION) else {
        return Err(unauthenticated(
            "this cluster needs a token: pass --token or set BATON_TOKEN",
        ));
    };
    let secret = value
        .to_str()
        .ok()
        .and_then(|value| value.strip_prefix("Bearer "))
        .ok_or_else(|| unauthenticated("the Authorization header must be `Bearer <token>`"))?;
    check_secret(secret).map_err(|problem| unauthenticated(&problem))?;
    Ok(secret_sha256(secret))
}

/// The caller whose token's secret hashes to `hash`, or 401.
///
/// A token this node does not know is looked up again after a read index (on a follower, the
/// leader's) before it is refused: this node may not yet have applied a creation that was
/// acknowledged before the request was sent. A known token is taken from the applied state as
/// it is, with no round trip.
async fn caller_of(app: &AppState, hash: [u8; 32]) -> Result<(Caller, TokenHash), ApiError> {
    let known = app
        .machine
        .read(|machine, _| machine.auth().authenticate(&hash))
        .map_err(ApiError::internal)?;
    let caller = match known {
        Some(caller) => caller,
        None => app
            .read_here(|machine| machine.auth().authenticate(&hash))
            .await?
            .0
            .ok_or_else(|| unauthenticated("unknown or revoked token"))?,
    };
    Ok((caller, TokenHash(hash)))
}

fn unauthenticated(message: &str) -> ApiError {
    ApiError::new(ErrorCode::Unauthenticated, message)
}

fn wire_role(role: Role) -> TokenRole {
    match role {
        Role::Reader => TokenRole::Reader,
        Role::Agent => TokenRole::Agent,
        Role::Admin => TokenRole::Admin,
    }
}

fn token_info(token: &TokenView, clocks: Clocks) -> TokenInfo {
    TokenInfo {
        name: token.name.to_string(),
        role: wire_role(token.role),
        namespaces: match &token.scope {
            Scope::All => vec!["*".to_owned()],
            Scope::Only(namespaces) => namespaces.iter().map(ToString::to_string).collect(),
        },
        quotas: TokenQuotas {
            sessions_max: token.quotas.sessions_max,
            leases_max: token.quotas.leases_max,
        },
        created_at: clocks.at(token.created_at_ms),
    }
}

#[utoipa::path(
    post,
    path = "/v1/auth/tokens",
    tag = "auth",
    summary = "Create a token (admin); its secret is in this answer only",
    request_body = baton_api::CreateTokenRequest,
    responses(
        (status = 201, description = "The token and its secret", body = baton_api::CreatedToken)
    )
)]
pub async fn create_token(
    State(app): State<AppState>,
    By(by): By,
    body: ApiJson<CreateTokenRequest>,
) -> Result<ApiAnswer, ApiError> {
    let request = body.value;
    let name = Name::new("token name", request.name).map_err(ApiError::from_invalid)?;
    let scope = if request.namespaces == ["*"] {
        Scope::All
    } else {
        Scope::Only(
            request
                .namespaces
                .iter()
                .map(|namespace| Namespace::new(namespace.as_str()))
                .collect::<Result<_, _>>()
                .map_err(ApiError::from_invalid)?,
        )
    };
    let role = match request.role {
        TokenRole::Reader => Role::Reader,
        TokenRole::Agent => Role::Agent,
        TokenRole::Admin => Role::Admin,
    };
    let secret = format!("{SECRET_PREFIX}{:032x}", rand::random::<u128>());
    let quotas = request.quotas.unwrap_or_default();
    let new_token = NewToken {
        name,
        role,
        scope,
        quotas: Quotas {
            sessions_max: quotas.sessions_max,
            leases_max: quotas.leases_max,
        },
        secret_sha256: secret_sha256(&secret),
    };
    let created = app
        .administer(by, Command::CreateToken(new_token), |reply| match reply {
            Reply::TokenCreated(view) => Ok(view),
            other => Err(Box::new(other)),
        })
        .await?;
    let answer = CreatedToken {
        token: token_info(&created.value, created.clocks),
        secret,
    };
    Ok(created.answer(StatusCode::CREATED, &answer))
}

#[utoipa::path(
    get,
    path = "/v1/auth/tokens",
    tag = "auth",
    summary = "List the tokens (admin), never their secrets",
    responses(
        (status = 200, description = "Every token", body = baton_api::TokenList)
    )
)]
pub async fn list_tokens(State(app): State<AppState>) -> Result<ApiAnswer, ApiError> {
    let (tokens, clocks) = app.read(|machine| machine.auth().tokens()).await?;
    let list = TokenList {
        tokens: tokens
            .iter()
            .map(|token| token_info(token, clocks))
            .collect(),
    };
    Ok(ApiAnswer::new(StatusCode::OK, &list, clocks.cluster_ms))
}

#[utoipa::path(
    delete,
    path = "/v1/auth/tokens/{name}",
    tag = "auth",
    summary = "Revoke a token (admin): refused cluster-wide from this entry on",
    params(("name" = String, Path, description = "The token's name")),
    responses(
        (status = 200, description = "Revoked", body = baton_api::RevokedToken)
    )
)]
pub async fn revoke_token(
    State(app): State<AppState>,
    By(by): By,
    ApiPath(name): ApiPath<String>,
) -> Result<ApiAnswer, ApiError> {
    let name = Name::new("token name", name).map_err(ApiError::from_invalid)?;
    let revoked = app
        .administer(by, Command::RevokeToken { name }, |reply| match reply {
            Reply::TokenRevoked { name } => Ok(name),
            other => Err(Box::new(other)),
        })
        .await?;
    let answer = RevokedToken {
        name: revoked.value.to_string(),
    };
    Ok(revoked.answer(StatusCode::OK, &answer))
}

#[utoipa::path(
    get,
    path = "/v1/limits",
    tag = "auth",
    summary = "The limits every node decides with",
    responses(
        (status = 200, description = "Every limit, by name", body = Object)
    )
)]
pub async fn get_limits(State(app): State<AppState>) -> Result<ApiAnswer, ApiError> {
    let (limits, clocks) = app.read(|machine| machine.limits().clone()).await?;
    Ok(ApiAnswer::new(StatusCode::OK, &limits, clocks.cluster_ms))
}

#[utoipa::path(
    put,
    path = "/v1/limits",
    tag = "auth",
    summary = "Change some limits (admin); the others keep their values",
    request_body(content = Object, description = "Limits by name, e.g. {\"ttl_ms_max\": 600000}"),
    responses(
        (status = 200, description = "Every limit after the change", body = Object)
    )
)]
pub async fn put_limits(
    State(app): State<AppState>,
    By(by): By,
    body: ApiJson<serde_json::Map<String, serde_json::Value>>,
) -> Result<ApiAnswer, ApiError> {
    let (current, _) = app.read(|machine| machine.limits().clone()).await?;
    let limits = changed_limits(&current, body.value)?;
    let set = app
        .administer(
            by,
            Command::SetLimits(limits.clone()),
            |reply| match reply {
                Reply::LimitsSet => Ok(()),
                other => Err(Box::new(other)),
            },
        )
        .await?;
    Ok(set.answer(StatusCode::OK, &limits))
}

/// `current` with the named limits changed; an unknown name, a value of the wrong type, or a
/// set of limits that contradicts itself is `INVALID_ARGUMENT`.
fn changed_limits(
    current: &Limits,
    changes: serde_json::Map<String, serde_json::Value>,
) -> Result<Limits, ApiError> {
    if changes.is_empty() {
        return Err(ApiError::invalid(
            "name at least one limit to change, e.g. {\"ttl_ms_max\": 600000}",
        ));
    }
    let serde_json::Value::Object(mut all) =
        serde_json::to_value(current).map_err(ApiError::internal)?
    else {
        return Err(ApiError::internal("limits are not a JSON object"));
    };
    for (name, value) in changes {
        let Some(slot) = all.get_mut(&name) else {
            return Err(ApiError::invalid(format!(
                "unknown limit {name:?}: GET /v1/limits lists them"
            )));
        };
        if !value.is_u64() {
            return Err(ApiError::invalid(format!(
                "limit {name} must be a non-negative integer, got {value}"
            )));
        }
        *slot = value;
    }
    let limits: Limits = serde_json::from_value(serde_json::Value::Object(all))
        .map_err(|error| ApiError::invalid(format!("a limit is out of range: {error}")))?;
    limits.check().map_err(ApiError::from_invalid)?;
    Ok(limits)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The route table's access column follows docs/security.md's rule, stated here on its
    /// own: tokens, membership, the clock, backups and changing limits are for admins; reads
    /// (and the fence check, a read by POST) for readers; every other write for agents.
    #[test]
    fn every_route_needs_the_role_the_security_rule_gives_it() {
        for route in routes::ROUTES.iter() {
            let path = route.path.as_str();
            let method = &route.method;
            let rule = if path == "/healthz" || path == "/readyz" {
                None
            } else if path.starts_with("/v1/auth/")
                || path.starts_with("/v1/cluster/members")
                || path == "/v1/debug/clock"
                || path == "/v1/snapshot"
                || (path == "/v1/limits" && method != Method::GET)
            {
                Some(Role::Admin)
            } else if method == Method::GET || path == "/v1/fence/check" {
                Some(Role::Reader)
            } else {
                Some(Role::Agent)
            };
            assert_eq!(route.access.role(), rule, "{method} {path}");
            let in_namespace = [
                "sessions", "leases", "fence", "kv", "queues", "txn", "events",
            ]
            .iter()
            .any(|family| path.starts_with(&format!("/v1/{family}")));
            assert_eq!(
                route.acts == Acts::InNamespace,
                in_namespace,
                "{method} {path}"
            );
        }
    }

    #[test]
    fn a_request_that_matched_no_route_needs_a_token_but_the_console_does_not() {
        assert_eq!(
            required(&Method::GET, None, "/v1/nowhere"),
            Some((Role::Reader, false))
        );
        assert_eq!(required(&Method::GET, Some("/ui/"), "/ui/"), None);
        assert_eq!(
            required(&Method::PUT, Some("/v1/kv/{*key}"), "/v1/kv/a/b"),
            Some((Role::Agent, true))
        );
        assert_eq!(required(&Method::GET, Some("/healthz"), "/healthz"), None);
        // The router answers HEAD with the GET handler: it needs what GET needs.
        assert_eq!(
            required(&Method::HEAD, Some("/v1/kv/{*key}"), "/v1/kv/a"),
            Some((Role::Reader, true))
        );
    }

    #[test]
    fn limits_change_by_name_and_refuse_unknown_or_contradictory_ones() {
        let current = Limits::default();
        let change = |json: serde_json::Value| {
            let serde_json::Value::Object(map) = json else {
                unreachable!()
            };
            changed_limits(&current, map)
        };
        let changed = change(serde_json::json!({"ttl_ms_max": 600_000})).unwrap();
        assert_eq!(changed.ttl_ms_max, 600_000);
        assert_eq!(changed.ttl_ms_min, current.ttl_ms_min);
        let longer = change(serde_json::json!({"max_hold_ms_max": 60u64 * 86_400_000})).unwrap();
        assert_eq!(
            longer.max_hold_ms_max,
            60 * 86_400_000,
            "two months of max hold is fine"
        );
        for refused in [
            serde_json::json!({}),
            serde_json::json!({"ttl_max": 1}),
            serde_json::json!({"ttl_ms_max": -1}),
            serde_json::json!({"ttl_ms_max": "60s"}),
            serde_json::json!({"ttl_ms_max": 10}),
            // Bounds that could overflow a deadline or a count.
            serde_json::json!({"ttl_ms_max": u64::MAX}),
            serde_json::json!({"leases_per_session_max": 1u64 << 40}),
            serde_json::json!({"task_attempts_max": 1u64 << 40}),
            serde_json::json!({"sweep_batch_max": 0}),
        ] {
            assert!(change(refused.clone()).is_err(), "{refused} was taken");
        }
    }
}
