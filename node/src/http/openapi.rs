//! The HTTP API as an OpenAPI 3.1 document, generated from the handlers' `#[utoipa::path]`
//! annotations and the wire types of `baton-api`: served at `GET /v1/openapi.json` and checked
//! in at `docs/openapi.json` (a test keeps the two equal; docs/api.md is the prose).

use axum::http::header;
use axum::response::{IntoResponse, Response};
use utoipa::OpenApi;

use super::{auth, cluster, events, kv, leases, queues, txn};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Baton",
        description = "Leases with fence tokens for fleets of AI agents. Any node answers; \
                       followers forward to the leader. Every answer carries `Baton-Leader` \
                       and `Baton-Cluster-Time`; a replayed idempotent answer carries \
                       `Idempotent-Replayed: true`. Errors are `application/problem+json`. A node \
                       started with `--auth` wants `Authorization: Bearer <token>` on every \
                       route but `/healthz` and `/readyz`.",
        license(name = "Apache-2.0"),
    ),
    paths(
        leases::create_session,
        leases::get_session,
        leases::end_session,
        leases::keepalive,
        leases::release,
        leases::acquire,
        leases::list_leases,
        leases::get_lease,
        leases::fence_check,
        kv::get,
        kv::put,
        kv::delete,
        queues::list_queues,
        queues::counts,
        queues::enqueue,
        queues::list,
        queues::claim,
        queues::complete,
        queues::fail,
        queues::release,
        txn::txn,
        events::events,
        auth::create_token,
        auth::list_tokens,
        auth::revoke_token,
        auth::get_limits,
        auth::put_limits,
        cluster::status,
        cluster::snapshot,
        cluster::add_member,
        cluster::remove_member,
        cluster::digest,
        cluster::set_clock,
        cluster::healthz,
        cluster::readyz,
        cluster::metrics,
        openapi,
    ),
    tags(
        (name = "sessions", description = "A holder's heartbeat; one keepalive renews every lease"),
        (name = "leases", description = "Exclusive and subtree leases with fences"),
        (name = "kv", description = "The fenced key-value store"),
        (name = "queues", description = "Work queues with leased claims"),
        (name = "txn", description = "Transactions: compares, then ops applied all or none"),
        (name = "events", description = "Every state change, by revision"),
        (name = "auth", description = "Tokens and limits (docs/security.md)"),
        (name = "cluster", description = "Membership and this node's view"),
        (name = "health", description = "Liveness, readiness and metrics of this node"),
        (name = "debug", description = "State digests and the test-only clock control"),
    )
)]
struct ApiDoc;

/// The document as pretty JSON, ending in a newline, exactly as checked in.
pub fn document() -> String {
    let mut json = ApiDoc::openapi()
        .to_pretty_json()
        .expect("the OpenAPI document serializes");
    json.push('\n');
    json
}

#[utoipa::path(
    get,
    path = "/v1/openapi.json",
    tag = "health",
    summary = "This document",
    responses((status = 200, description = "The OpenAPI 3.1 document of this API", body = Object))
)]
pub async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], document()).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `docs/openapi.json` is the served document. After changing a route or a wire type,
    /// regenerate it with `BATON_UPDATE_OPENAPI=1 cargo test -p baton-node openapi`.
    #[test]
    fn the_checked_in_openapi_document_is_the_served_one() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/openapi.json");
        let generated = document();
        if std::env::var_os("BATON_UPDATE_OPENAPI").is_some() {
            std::fs::write(path, &generated).expect("write docs/openapi.json");
        }
        let checked_in = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            checked_in == generated,
            "docs/openapi.json differs from the document batond serves: regenerate it with \
             `BATON_UPDATE_OPENAPI=1 cargo test -p baton-node openapi` and commit it"
        );
    }

    /// Every route the router serves, with every method, is in the document, and nothing
    /// else is: read from the router's source (`.route("PATH", get(..).post(..))`), since an
    /// axum router cannot list its routes.
    #[test]
    fn the_document_lists_exactly_the_routes_the_router_serves() {
        let source = include_str!("mod.rs");
        let router = &source[source.find("pub fn router(").expect("the router")..];
        let mut served = std::collections::BTreeSet::new();
        for call in router.split(".route(").skip(1) {
            let path = call.split('"').nth(1).expect("a route path");
            let handlers = &call[..call.find("))").map_or(call.len(), |end| end + 2)];
            for method in ["get", "post", "put", "delete"] {
                let called = handlers.contains(&format!(" {method}("))
                    || handlers.contains(&format!("({method}("))
                    || handlers.contains(&format!(".{method}("))
                    || handlers.contains(&format!("\n{method}("));
                if called {
                    served.insert((method.to_owned(), path.replace("{*", "{")));
                }
            }
        }
        let document: serde_json::Value =
            serde_json::from_str(&document()).expect("the document is JSON");
        let mut documented = std::collections::BTreeSet::new();
        for (path, operations) in document["paths"].as_object().expect("paths") {
            for method in operations.as_object().expect("operations").keys() {
                documented.insert((method.clone(), path.clone()));
            }
        }
        assert_eq!(served.len(), 37, "the router's routes as read: {served:?}");
        assert_eq!(served, documented);
    }

    /// Clients generated from the document name a method after its operation, so two
    /// operations must never share an id (two handlers called `release` once did).
    #[test]
    fn every_operation_id_is_unique() {
        let document: serde_json::Value =
            serde_json::from_str(&document()).expect("the document is JSON");
        let mut seen = std::collections::BTreeMap::new();
        for (path, operations) in document["paths"].as_object().expect("paths") {
            for (method, operation) in operations.as_object().expect("operations") {
                let id = operation["operationId"].as_str().expect("an operationId");
                if let Some(earlier) = seen.insert(id.to_owned(), format!("{method} {path}")) {
                    panic!("operationId {id:?} names both {earlier} and {method} {path}");
                }
            }
        }
    }
}
