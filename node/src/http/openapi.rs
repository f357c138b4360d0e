//! The HTTP API as an OpenAPI 3.1 document, generated from the handlers' `#[utoipa::path]`
//! annotations, their rows of the route table (`routes.rs`) and the wire types of `baton-api`:
//! served at `GET /v1/openapi.json` and checked in at `docs/openapi.json` (a test keeps the two
//! equal; docs/api.md is the prose).

use axum::http::{header, Method};
use axum::response::{IntoResponse, Response};
use baton_api::{HEADER_IDEMPOTENCY_KEY, HEADER_NAMESPACE};
use utoipa::openapi::path::{Operation, ParameterBuilder, ParameterIn};
use utoipa::openapi::schema::{ObjectBuilder, SchemaType, Type};
use utoipa::openapi::{ContentBuilder, Ref, Required, ResponseBuilder};
use utoipa::OpenApi;

use super::routes::{self, Access, Acts, Route, Served};

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
    components(schemas(baton_api::Problem)),
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
    let mut document = ApiDoc::openapi();
    document.merge(routes::Paths::openapi());
    for route in routes::ROUTES.iter() {
        let operation = operation_mut(&mut document, route);
        complete(operation, route);
    }
    let mut json = document
        .to_pretty_json()
        .expect("the OpenAPI document serializes");
    json.push('\n');
    json
}

fn operation_mut<'d>(
    document: &'d mut utoipa::openapi::OpenApi,
    route: &Route,
) -> &'d mut Operation {
    let item = document
        .paths
        .paths
        .get_mut(&route.path)
        .expect("every row's handler is in the document");
    let operation = match route.method {
        Method::GET => &mut item.get,
        Method::POST => &mut item.post,
        Method::PUT => &mut item.put,
        Method::DELETE => &mut item.delete,
        _ => unreachable!("the API uses GET, POST, PUT and DELETE only"),
    };
    operation
        .as_mut()
        .expect("every row's operation is in the document")
}

/// Adds what a route shares with the others of its kind, from its row: the namespace header of
/// a route that acts in one, the idempotency key of a relayed write, and the problem answers
/// of a route that needs a token (4XX) or a leader (5XX), unless its annotation has its own.
fn complete(operation: &mut Operation, route: &Route) {
    let mut shared = Vec::new();
    if route.acts == Acts::InNamespace {
        shared.push((HEADER_NAMESPACE, "The namespace; `default` when absent"));
    }
    if route.served == Served::Relayed {
        shared.push((
            HEADER_IDEMPOTENCY_KEY,
            "16..255 characters; a retry with the same key is applied at most once (G8)",
        ));
    }
    if !shared.is_empty() {
        add_headers(operation, route, shared);
    }
    let problem = |description: &str| {
        ResponseBuilder::new()
            .description(description)
            .content(
                "application/problem+json",
                ContentBuilder::new()
                    .schema(Some(Ref::from_schema_name("Problem")))
                    .build(),
            )
            .build()
    };
    let responses = &mut operation.responses.responses;
    if route.access != Access::Open {
        responses
            .entry("4XX".to_owned())
            .or_insert_with(|| problem("Refused, nothing changed: see the problem's code").into());
    }
    if route.served != Served::Local {
        responses.entry("5XX".to_owned()).or_insert_with(|| {
            problem("NO_LEADER (surely not applied), OUTCOME_UNKNOWN (maybe applied) or INTERNAL")
                .into()
        });
    }
}

/// Puts the optional `headers` (name, description) first among the operation's parameters,
/// which must not declare them itself.
fn add_headers(operation: &mut Operation, route: &Route, headers: Vec<(&str, &str)>) {
    let parameters = operation.parameters.get_or_insert_with(Vec::new);
    for (name, _) in &headers {
        assert!(
            parameters.iter().all(|parameter| !parameter.name.eq_ignore_ascii_case(name)),
            "{} {} declares {name}, which its row of the route table adds: remove it from the annotation",
            route.method,
            route.path
        );
    }
    let header = |(name, description): (&str, &str)| {
        ParameterBuilder::new()
            .name(name)
            .parameter_in(ParameterIn::Header)
            .description(Some(description))
            .required(Required::False)
            .schema(Some(
                ObjectBuilder::new().schema_type(SchemaType::from_iter([Type::String, Type::Null])),
            ))
            .build()
    };
    parameters.splice(0..0, headers.into_iter().map(header));
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

    /// The document has one operation per row of the route table, at the row's method and
    /// path, and no other.
    #[test]
    fn the_document_has_exactly_the_route_tables_operations() {
        let table: std::collections::BTreeSet<(String, String)> = routes::ROUTES
            .iter()
            .map(|route| {
                (
                    route.method.as_str().to_ascii_lowercase(),
                    route.path.clone(),
                )
            })
            .collect();
        let document: serde_json::Value =
            serde_json::from_str(&document()).expect("the document is JSON");
        let mut documented = std::collections::BTreeSet::new();
        for (path, operations) in document["paths"].as_object().expect("paths") {
            for method in operations.as_object().expect("operations").keys() {
                documented.insert((method.clone(), path.clone()));
            }
        }
        assert_eq!(table.len(), routes::ROUTES.len(), "no row is there twice");
        assert_eq!(table, documented);
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
