//! The API's one route table. Each operation is declared in two halves that never repeat each
//! other: its handler's `#[utoipa::path]` (method, path, parameters, request body,
//! answers and errors), and its row in `table!` below (who may call it, whether it acts in the
//! request's namespace, where it is served). Everything else reads those two: the router, the
//! OpenAPI document's paths and its shared parameters and errors (`openapi.rs`), a follower's
//! forward-or-relay decision (`forward.rs`), the access rule (`auth.rs`) and the idempotency
//! fingerprint's route (`extract.rs`). ARCHITECTURE.md shows what adding a route touches.

use std::collections::HashMap;
use std::sync::LazyLock;

use axum::http::Method;
use axum::routing::{on, MethodFilter};
use axum::Router;
use baton_raft_store::machine::Role;
use utoipa::openapi::path::HttpMethod;

use super::AppState;

/// Who may call a route when access control is on (docs/security.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Anyone, without a token: the health checks.
    Open,
    Reader,
    Agent,
    Admin,
}

impl Access {
    /// The least role a token needs, or none for an open route.
    pub fn role(self) -> Option<Role> {
        match self {
            Access::Open => None,
            Access::Reader => Some(Role::Reader),
            Access::Agent => Some(Role::Agent),
            Access::Admin => Some(Role::Admin),
        }
    }
}

/// What a route acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acts {
    /// The namespace the request names (`Baton-Namespace`), which a token's scope must allow.
    InNamespace,
    /// The cluster or this node, in no namespace.
    OnCluster,
}

/// Which node answers a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// A write: a follower decides it itself and relays its command to the leader (relay.rs),
    /// unless it asks the leader to hold it (`wait_ms`), when it is forwarded. Takes an
    /// `Idempotency-Key`.
    Relayed,
    /// By the leader: a follower forwards the HTTP request (forward.rs).
    Forwarded,
    /// By the node asked, about itself.
    Local,
}

/// One row of the table, with its method and paths read from the handler's annotation.
#[derive(Debug)]
pub struct Route {
    pub method: Method,
    /// The path as documented, `/v1/kv/{key}`.
    pub path: String,
    /// The path as the router matches it (`MatchedPath`), where a last parameter declared
    /// `tail` takes the rest of the path, slashes included: `/v1/kv/{*key}`.
    pub pattern: String,
    pub access: Access,
    pub acts: Acts,
    pub served: Served,
}

impl Route {
    fn new<P: utoipa::Path>(
        access: Access,
        acts: Acts,
        served: Served,
        tail: Option<&str>,
    ) -> Route {
        let methods = P::methods();
        let [method] = methods.as_slice() else {
            panic!("{} declares {} methods, not one", P::path(), methods.len());
        };
        let path = P::path();
        let pattern = match tail {
            Some(name) => {
                let last = format!("/{{{name}}}");
                assert!(path.ends_with(&last), "{path} does not end in {last}");
                format!("{}/{{*{name}}}", &path[..path.len() - last.len()])
            }
            None => path.clone(),
        };
        Route {
            method: http_method(method),
            path,
            pattern,
            access,
            acts,
            served,
        }
    }

    fn filter(&self) -> MethodFilter {
        MethodFilter::try_from(self.method.clone()).expect("a documented method is routable")
    }
}

fn http_method(method: &HttpMethod) -> Method {
    match method {
        HttpMethod::Get => Method::GET,
        HttpMethod::Post => Method::POST,
        HttpMethod::Put => Method::PUT,
        HttpMethod::Delete => Method::DELETE,
        HttpMethod::Options => Method::OPTIONS,
        HttpMethod::Head => Method::HEAD,
        HttpMethod::Patch => Method::PATCH,
        HttpMethod::Trace => Method::TRACE,
    }
}

/// The row a request matched: by its method and the router's `MatchedPath`. A `HEAD` is its
/// path's `GET` (the router answers it with the `GET` handler), so it needs what the `GET` needs.
pub fn find(method: &Method, pattern: &str) -> Option<&'static Route> {
    let method = if method == Method::HEAD {
        &Method::GET
    } else {
        method
    };
    static BY_PATTERN: LazyLock<HashMap<&'static str, Vec<&'static Route>>> = LazyLock::new(|| {
        let mut by_pattern: HashMap<&str, Vec<&Route>> = HashMap::new();
        for route in ROUTES.iter() {
            by_pattern.entry(&route.pattern).or_default().push(route);
        }
        by_pattern
    });
    BY_PATTERN
        .get(pattern)?
        .iter()
        .find(|route| route.method == *method)
        .copied()
}

/// Declares the table: one row per handler, `module::handler: Access, Acts, Served` and, for a
/// path whose last parameter takes the rest of the path, `, tail = "name"`. Makes `ROUTES`
/// (the rows, in order), `router` (one route per row) and `Paths` (the handlers' OpenAPI
/// operations).
macro_rules! table {
    ($($module:ident :: $handler:ident : $access:ident, $acts:ident, $served:ident
        $(, tail = $tail:literal)?;)*) => {
        /// Every route of the API, in the table's order.
        pub static ROUTES: LazyLock<Vec<Route>> = LazyLock::new(|| {
            vec![$(pastey::paste! {
                Route::new::<super::$module::[<__path_ $handler>]>(
                    Access::$access,
                    Acts::$acts,
                    Served::$served,
                    None $(.or(Some($tail)))?
                )
            }),*]
        });

        /// The router of the API's routes, one per row.
        pub fn router() -> Router<AppState> {
            let mut router = Router::new();
            let mut rows = ROUTES.iter();
            $(
                let route = rows.next().expect("one row per handler");
                router = router.route(&route.pattern, on(route.filter(), super::$module::$handler));
            )*
            router
        }

        /// The handlers' OpenAPI operations, which `openapi.rs` completes from the rows.
        #[derive(utoipa::OpenApi)]
        #[openapi(paths($(super::$module::$handler),*))]
        pub struct Paths;
    };
}

table! {
    leases::create_session: Agent, InNamespace, Relayed;
    leases::get_session: Reader, InNamespace, Forwarded;
    leases::end_session: Agent, InNamespace, Relayed;
    leases::keepalive: Agent, InNamespace, Relayed;
    leases::release: Agent, InNamespace, Relayed;
    leases::acquire: Agent, InNamespace, Relayed;
    leases::list_leases: Reader, InNamespace, Forwarded;
    leases::get_lease: Reader, InNamespace, Forwarded, tail = "resource";
    leases::fence_check: Reader, InNamespace, Forwarded;
    kv::get: Reader, InNamespace, Forwarded, tail = "key";
    kv::put: Agent, InNamespace, Relayed, tail = "key";
    kv::delete: Agent, InNamespace, Relayed, tail = "key";
    queues::list_queues: Reader, InNamespace, Forwarded;
    queues::counts: Reader, InNamespace, Forwarded;
    queues::enqueue: Agent, InNamespace, Relayed;
    queues::list: Reader, InNamespace, Forwarded;
    queues::claim: Agent, InNamespace, Relayed;
    queues::complete: Agent, InNamespace, Relayed;
    queues::fail: Agent, InNamespace, Relayed;
    queues::release: Agent, InNamespace, Relayed;
    txn::txn: Agent, InNamespace, Relayed;
    events::events: Reader, InNamespace, Forwarded;
    auth::create_token: Admin, OnCluster, Forwarded;
    auth::list_tokens: Admin, OnCluster, Forwarded;
    auth::revoke_token: Admin, OnCluster, Forwarded;
    auth::get_limits: Reader, OnCluster, Forwarded;
    auth::put_limits: Admin, OnCluster, Forwarded;
    cluster::add_member: Admin, OnCluster, Forwarded;
    cluster::remove_member: Admin, OnCluster, Forwarded;
    cluster::status: Reader, OnCluster, Local;
    cluster::snapshot: Admin, OnCluster, Local;
    cluster::digest: Reader, OnCluster, Local;
    cluster::set_clock: Admin, OnCluster, Local;
    cluster::healthz: Open, OnCluster, Local;
    cluster::readyz: Open, OnCluster, Local;
    cluster::metrics: Reader, OnCluster, Local;
    openapi::openapi: Reader, OnCluster, Local;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_finds_its_row_by_method_and_matched_path() {
        let put = find(&Method::PUT, "/v1/kv/{*key}").expect("PUT /v1/kv");
        assert_eq!(put.path, "/v1/kv/{key}");
        assert_eq!(put.served, Served::Relayed);
        assert_eq!(put.access, Access::Agent);
        assert!(find(&Method::PATCH, "/v1/kv/{*key}").is_none());
        let head = find(&Method::HEAD, "/v1/kv/{*key}").expect("HEAD /v1/kv");
        assert_eq!(head.method, Method::GET);
        assert!(find(&Method::GET, "/v1/kv/{key}").is_none());
        assert!(find(&Method::GET, "/nowhere").is_none());
    }

    /// The router is built from the rows: building it panics on a pattern axum refuses or on
    /// two rows of one method and path.
    #[test]
    fn the_router_accepts_every_row() {
        let _router = router();
    }
}
