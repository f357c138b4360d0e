//! Bad requests, as a table: each one gets its status and problem code (docs/api.md and
//! 8), a `application/problem+json` body with a message, the two Baton headers, and leaves the
//! state exactly as it was. Then the limits' edges are shown to be accepted, so that the
//! refusals above are about the limits and not about something else.

use baton_client::api::{ErrorCode, Grant, KvEntry, LeaseList, SessionInfo};
use baton_tests::{idempotency_key, json, Cluster, Method, Node, Value};

/// The observable state the table's requests must not change.
#[derive(Debug, PartialEq)]
struct State {
    /// (resource, fence, holder, mode) of every lease.
    leases: Vec<(String, u64, String, String)>,
    /// The kv entry written in the setup.
    existing: (Value, u64),
    /// The status of a read of the key the bad kv writes aim at.
    target_key_status: u16,
    /// The holder and leases of the bystander session.
    bystander: (String, Vec<String>),
}

async fn observe(cluster: &Cluster, node: &Node, bystander: &str) -> State {
    let api = cluster.api();
    let list: LeaseList = api.get(node, "/v1/leases").await.expect_json(200);
    let existing: KvEntry = api.get(node, "/v1/kv/kv/existing").await.expect_json(200);
    let info: SessionInfo = api
        .get(node, &format!("/v1/sessions/{bystander}"))
        .await
        .expect_json(200);
    State {
        leases: list
            .leases
            .into_iter()
            .map(|lease| {
                let mode = format!("{:?}", lease.mode);
                (lease.resource, lease.fence, lease.holder, mode)
            })
            .collect(),
        existing: (existing.value, existing.revision),
        target_key_status: api.get(node, "/v1/kv/bad/target").await.status,
        bystander: (
            info.holder,
            info.leases
                .into_iter()
                .map(|lease| lease.resource)
                .collect(),
        ),
    }
}

#[derive(Debug)]
enum Body {
    Empty,
    Json(Value),
    Raw(&'static str),
}

#[derive(Debug)]
struct Case {
    name: &'static str,
    method: Method,
    path: String,
    body: Body,
    headers: Vec<(&'static str, String)>,
    status: u16,
    code: ErrorCode,
}

fn case(
    name: &'static str,
    method: Method,
    path: &str,
    body: Body,
    status: u16,
    code: ErrorCode,
) -> Case {
    Case {
        name,
        method,
        path: path.to_owned(),
        body,
        headers: Vec::new(),
        status,
        code,
    }
}

fn acquire(body: Value) -> Body {
    Body::Json(body)
}

fn many_labels(count: usize) -> Value {
    Value::Object(
        (0..count)
            .map(|index| (format!("label-{index}"), json!("v")))
            .collect(),
    )
}

fn segments(count: usize) -> String {
    vec!["s"; count].join("/")
}

#[tokio::test]
async fn bad_requests_are_refused_with_their_code_and_change_nothing() {
    use ErrorCode::*;
    let cluster = Cluster::start(1).await;
    let node = cluster.node(1);
    let api = cluster.api();

    // Setup: a held lease, a bystander session holding nothing, a kv entry.
    let held: Grant = api
        .post(
            node,
            "/v1/leases",
            &json!({"resource": "held/x", "holder": "owner", "ttl_ms": 60_000}),
        )
        .await
        .expect_json(201);
    let bystander = api
        .post(
            node,
            "/v1/sessions",
            &json!({"holder": "bystander", "ttl_ms": 60_000}),
        )
        .await
        .expect_json::<Value>(201)["session_id"]
        .as_str()
        .expect("a session id")
        .to_owned();
    api.put(node, "/v1/kv/kv/existing", &json!({"value": "kept"}))
        .await
        .expect_status(200);
    let baseline = observe(&cluster, node, &bystander).await;
    assert_eq!(baseline.target_key_status, 404);

    let unknown_session = "0123456789abcdef0123456789abcdef";
    let ok_acquire = |resource: &str| json!({"resource": resource, "holder": "h", "ttl_ms": 5_000});
    let mut cases = vec![
        case(
            "malformed JSON",
            Method::POST,
            "/v1/leases",
            Body::Raw(r#"{"resource": "bad/a","#),
            400,
            InvalidArgument,
        ),
        case(
            "a field of the wrong type",
            Method::POST,
            "/v1/leases",
            acquire(json!({"resource": 42, "holder": "h", "ttl_ms": 5_000})),
            400,
            InvalidArgument,
        ),
        case(
            "an unknown field",
            Method::POST,
            "/v1/leases",
            acquire(json!({"resource": "bad/a", "holder": "h", "ttl_ms": 5_000, "colour": "red"})),
            400,
            InvalidArgument,
        ),
        case(
            "ttl_ms 999",
            Method::POST,
            "/v1/leases",
            acquire(json!({"resource": "bad/a", "holder": "h", "ttl_ms": 999})),
            400,
            InvalidArgument,
        ),
        case(
            "ttl_ms over an hour",
            Method::POST,
            "/v1/leases",
            acquire(json!({"resource": "bad/a", "holder": "h", "ttl_ms": 3_600_001})),
            400,
            InvalidArgument,
        ),
        case(
            "a session with ttl_ms 999",
            Method::POST,
            "/v1/sessions",
            Body::Json(json!({"holder": "h", "ttl_ms": 999})),
            400,
            InvalidArgument,
        ),
        case(
            "an empty segment",
            Method::POST,
            "/v1/leases",
            acquire(ok_acquire("bad//a")),
            400,
            InvalidArgument,
        ),
        case(
            "a . segment",
            Method::POST,
            "/v1/leases",
            acquire(ok_acquire("bad/./a")),
            400,
            InvalidArgument,
        ),
        case(
            "a .. segment",
            Method::POST,
            "/v1/leases",
            acquire(ok_acquire("bad/../held/x")),
            400,
            InvalidArgument,
        ),
        case(
            "a control character in a path",
            Method::POST,
            "/v1/leases",
            acquire(ok_acquire("bad/a\u{1b}[31m")),
            400,
            InvalidArgument,
        ),
        case(
            "a control character in a holder",
            Method::POST,
            "/v1/leases",
            acquire(json!({"resource": "bad/a", "holder": "h\u{0}", "ttl_ms": 5_000})),
            400,
            InvalidArgument,
        ),
        case(
            "a .. key in a fenced write's fence",
            Method::PUT,
            "/v1/kv/bad/target",
            Body::Json(
                json!({"value": 1, "fence": {"resource": "held/../held/x", "token": held.fence}, "session_id": unknown_session}),
            ),
            400,
            InvalidArgument,
        ),
        case(
            "a wrong method",
            Method::DELETE,
            "/v1/leases",
            Body::Empty,
            405,
            InvalidArgument,
        ),
        case(
            "an unknown route",
            Method::GET,
            "/v1/nothing/here",
            Body::Empty,
            404,
            NotFound,
        ),
        case(
            "completing a task that does not exist",
            Method::POST,
            "/v1/queues/q/tasks/nope/complete",
            Body::Json(json!({"session_id": unknown_session, "fence": 1})),
            409,
            StaleFence,
        ),
        case(
            "a trailing slash",
            Method::POST,
            "/v1/leases",
            acquire(ok_acquire("bad/a/")),
            400,
            InvalidArgument,
        ),
        case(
            "an empty resource",
            Method::POST,
            "/v1/leases",
            acquire(ok_acquire("")),
            400,
            InvalidArgument,
        ),
        case(
            "33 segments",
            Method::POST,
            "/v1/leases",
            acquire(ok_acquire(&segments(33))),
            400,
            InvalidArgument,
        ),
        case(
            "a 513-byte resource",
            Method::POST,
            "/v1/leases",
            acquire(ok_acquire(&"r".repeat(513))),
            400,
            InvalidArgument,
        ),
        case(
            "a 129-char holder",
            Method::POST,
            "/v1/leases",
            acquire(json!({"resource": "bad/a", "holder": "h".repeat(129), "ttl_ms": 5_000})),
            400,
            InvalidArgument,
        ),
        case(
            "an empty holder",
            Method::POST,
            "/v1/leases",
            acquire(json!({"resource": "bad/a", "holder": "", "ttl_ms": 5_000})),
            400,
            InvalidArgument,
        ),
        case(
            "17 labels",
            Method::POST,
            "/v1/leases",
            acquire(
                json!({"resource": "bad/a", "holder": "h", "ttl_ms": 5_000, "labels": many_labels(17)}),
            ),
            400,
            InvalidArgument,
        ),
        case(
            "a 129-char label value",
            Method::POST,
            "/v1/leases",
            acquire(
                json!({"resource": "bad/a", "holder": "h", "ttl_ms": 5_000, "labels": {"k": "v".repeat(129)}}),
            ),
            400,
            InvalidArgument,
        ),
        case(
            "both session_id and holder",
            Method::POST,
            "/v1/leases",
            acquire(
                json!({"resource": "bad/a", "session_id": bystander, "holder": "h", "ttl_ms": 5_000}),
            ),
            400,
            InvalidArgument,
        ),
        case(
            "neither session_id nor holder",
            Method::POST,
            "/v1/leases",
            acquire(json!({"resource": "bad/a"})),
            400,
            InvalidArgument,
        ),
        case(
            "an unknown mode",
            Method::POST,
            "/v1/leases",
            acquire(json!({"resource": "bad/a", "holder": "h", "ttl_ms": 5_000, "mode": "shared"})),
            400,
            InvalidArgument,
        ),
        case(
            "a kv value over 256 KiB",
            Method::PUT,
            "/v1/kv/bad/target",
            Body::Json(json!({"value": "x".repeat(256 * 1024 + 1)})),
            413,
            PayloadTooLarge,
        ),
        case(
            "a body over 1 MiB",
            Method::POST,
            "/v1/leases",
            acquire(
                json!({"resource": "bad/a", "holder": "h", "ttl_ms": 5_000, "reason": "x".repeat(1024 * 1024 + 1)}),
            ),
            413,
            PayloadTooLarge,
        ),
        case(
            "a kv write with a fence and no session_id",
            Method::PUT,
            "/v1/kv/bad/target",
            Body::Json(json!({"value": 1, "fence": {"resource": "held/x", "token": held.fence}})),
            400,
            InvalidArgument,
        ),
        case(
            "a kv write with a session_id and no fence",
            Method::PUT,
            "/v1/kv/bad/target",
            Body::Json(json!({"value": 1, "session_id": held.session_id.as_str()})),
            400,
            InvalidArgument,
        ),
        case(
            "a fence check with a non-numeric fence",
            Method::POST,
            "/v1/fence/check",
            Body::Json(json!({"resource": "held/x", "fence": "x"})),
            400,
            InvalidArgument,
        ),
        case(
            "a missing lease",
            Method::GET,
            "/v1/leases/no/such/lease",
            Body::Empty,
            404,
            NotFound,
        ),
        case(
            "a missing key",
            Method::GET,
            "/v1/kv/no/such/key",
            Body::Empty,
            404,
            NotFound,
        ),
        case(
            "a missing session",
            Method::GET,
            &format!("/v1/sessions/{unknown_session}"),
            Body::Empty,
            404,
            NotFound,
        ),
        // docs/api.md says errors are problem+json; an unknown route is an error like any other.
        case(
            "an unknown route",
            Method::GET,
            "/v1/no-such-route",
            Body::Empty,
            404,
            NotFound,
        ),
        case(
            "a keepalive of an unknown session",
            Method::POST,
            &format!("/v1/sessions/{unknown_session}/keepalive"),
            Body::Empty,
            409,
            LeaseLost,
        ),
        case(
            "a release by a session that does not hold",
            Method::POST,
            &format!("/v1/sessions/{bystander}/release"),
            Body::Json(json!({"resource": "held/x"})),
            409,
            LeaseLost,
        ),
        case(
            "a release of a free resource",
            Method::POST,
            &format!("/v1/sessions/{bystander}/release"),
            Body::Json(json!({"resource": "free/y"})),
            409,
            LeaseLost,
        ),
        case(
            "an acquire of a held resource",
            Method::POST,
            "/v1/leases",
            acquire(ok_acquire("held/x")),
            409,
            LeaseHeld,
        ),
        case(
            "a subtree acquire above a held resource",
            Method::POST,
            "/v1/leases",
            acquire(json!({"resource": "held", "mode": "subtree", "holder": "h", "ttl_ms": 5_000})),
            409,
            LeaseHeld,
        ),
    ];
    let mut short_key = case(
        "a 15-char Idempotency-Key",
        Method::POST,
        "/v1/leases",
        acquire(ok_acquire("bad/a")),
        400,
        InvalidArgument,
    );
    short_key.headers.push(("Idempotency-Key", "k".repeat(15)));
    let mut long_key = case(
        "a 256-char Idempotency-Key",
        Method::POST,
        "/v1/leases",
        acquire(ok_acquire("bad/a")),
        400,
        InvalidArgument,
    );
    long_key.headers.push(("Idempotency-Key", "k".repeat(256)));
    let mut bad_namespace = case(
        "a namespace with a space",
        Method::POST,
        "/v1/leases",
        acquire(ok_acquire("bad/a")),
        400,
        InvalidArgument,
    );
    bad_namespace
        .headers
        .push(("Baton-Namespace", "bad namespace".to_owned()));
    cases.extend([short_key, long_key, bad_namespace]);

    for case in cases {
        let mut call = api.call(case.method.clone(), node, &case.path);
        for (name, value) in &case.headers {
            call = call.header(name, value);
        }
        call = match &case.body {
            Body::Empty => call,
            Body::Json(body) => call.json(body),
            Body::Raw(text) => call.raw(text.as_bytes().to_vec(), "application/json"),
        };
        let reply = call
            .try_send()
            .await
            .unwrap_or_else(|error| panic!("{}: {error}", case.name));
        eprintln!(
            "case {}: {} {}",
            case.name,
            reply.status,
            reply.code().unwrap_or("-")
        );
        assert_eq!(reply.status, case.status, "{}: {reply}", case.name);
        assert_eq!(
            reply.code(),
            Some(case.code.as_str()),
            "{}: {reply}",
            case.name
        );
        reply.expect_problem(case.status, case.code);
        assert_eq!(
            observe(&cluster, node, &bystander).await,
            baseline,
            "{} changed the state",
            case.name
        );
    }
}

#[tokio::test]
async fn the_edges_of_the_limits_are_accepted() {
    let cluster = Cluster::start(1).await;
    let node = cluster.node(1);
    let api = cluster.api();
    let accepted = [
        (
            "ttl_ms 1000",
            json!({"resource": "edge/1", "holder": "h", "ttl_ms": 1_000}),
        ),
        (
            "ttl_ms an hour",
            json!({"resource": "edge/2", "holder": "h", "ttl_ms": 3_600_000}),
        ),
        (
            "32 segments",
            json!({"resource": segments(32), "holder": "h", "ttl_ms": 5_000}),
        ),
        (
            "a 512-byte resource",
            json!({"resource": "r".repeat(512), "holder": "h", "ttl_ms": 5_000}),
        ),
        (
            "a 128-char holder",
            json!({"resource": "edge/3", "holder": "h".repeat(128), "ttl_ms": 5_000}),
        ),
        (
            "16 labels",
            json!({"resource": "edge/4", "holder": "h", "ttl_ms": 5_000, "labels": many_labels(16)}),
        ),
    ];
    for (name, body) in accepted {
        let reply = api.post(node, "/v1/leases", &body).await;
        assert_eq!(reply.status, 201, "{name}: {reply}");
    }
    for (name, key) in [
        ("16 chars", "k".repeat(16)),
        ("255 chars", "k".repeat(255)),
        ("a UUID", idempotency_key()),
    ] {
        let reply = api
            .call(Method::PUT, node, "/v1/kv/edge/key")
            .idempotency_key(&key)
            .json(&json!({"value": name}))
            .send()
            .await;
        assert_eq!(reply.status, 200, "an Idempotency-Key of {name}: {reply}");
    }
    let reply = api
        .put(
            node,
            "/v1/kv/edge/large",
            &json!({"value": "x".repeat(200 * 1024)}),
        )
        .await;
    assert_eq!(reply.status, 200, "a 200 KiB value: {}", reply.status);
}
