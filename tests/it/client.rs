//! The `baton-client` library against real `batond` processes: lease guards that stay valid
//! across renewals and know when they are lost (docs/guarantees.md G7), retries that spread over nodes and
//! never apply an operation twice (G8), and fenced calls that take a guard.
//!
//! Network faults come from [`Proxy`], a small TCP relay between the client and one node that
//! can forward, swallow every answer (a request that arrives and is applied, but whose answer
//! never comes back), or cut every connection.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton_client::api::{AcquireRequest, ErrorCode, Lease, LeaseList, LeaseMode};
use baton_client::{AcquireOptions, Client, Clock, Error, LostReason, SkewedClock};
use baton_tests::{idempotency_key, json, poll_until, Cluster, Method};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// A TTL short enough that ten of them fit in a test.
const TTL: Duration = Duration::from_secs(1);
/// How late `lost()` may resolve after the guard's deadline (scheduling on a loaded machine).
const LOST_SLACK: Duration = Duration::from_millis(150);

fn client_for(endpoints: &[String]) -> baton_client::ClientBuilder {
    Client::builder(endpoints.iter().cloned())
        .holder("agent-it")
        .request_timeout(Duration::from_secs(2))
}

fn endpoints(cluster: &Cluster) -> Vec<String> {
    cluster.nodes().iter().map(|node| node.api_url()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_stays_valid_across_ten_ttls_and_is_lost_by_its_deadline_when_every_node_dies() {
    let cluster = Cluster::start(3).await;
    let client = client_for(&endpoints(&cluster)).build().expect("a client");
    let guard = client
        .acquire("repo/src/auth.rs", AcquireOptions::new().ttl(TTL))
        .await
        .expect("acquire");
    let fence = guard.fence();

    // Ten TTLs of background renewals: valid all along, and the server agrees.
    let started = Instant::now();
    let mut reads = 0;
    while started.elapsed() < TTL * 10 {
        assert!(
            guard.is_valid(),
            "the guard lapsed after {:?}: {guard:?}",
            started.elapsed()
        );
        if reads < started.elapsed().as_secs() {
            let leader = cluster.leader().await;
            let lease: Lease = cluster
                .api()
                .get(leader, "/v1/leases/repo/src/auth.rs")
                .await
                .expect_json(200);
            assert_eq!(lease.fence, fence);
            reads += 1;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }

    // Every node dies: no renewal can succeed, and the guard is lost at its G7 deadline.
    let clock = Arc::clone(client.clock());
    let killed_at = clock.now();
    cluster.kill_all();
    let reason = tokio::time::timeout(TTL * 3, guard.lost())
        .await
        .expect("lost() resolves once no node answers");
    let resolved_at = clock.now();
    let deadline = guard.valid_until();
    assert_eq!(reason, LostReason::Expired);
    assert!(!guard.is_valid());
    assert!(
        resolved_at >= deadline,
        "lost() resolved before the deadline"
    );
    assert!(
        resolved_at - deadline <= LOST_SLACK,
        "lost() resolved {:?} after the deadline",
        resolved_at - deadline
    );
    assert!(
        deadline.saturating_sub(killed_at) < TTL,
        "the deadline is more than a TTL after the last possible renewal"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn is_valid_never_says_true_after_the_server_let_the_lease_expire() {
    let cluster = Cluster::start(1).await;
    let node = cluster.node(1);
    let proxy = Proxy::start(node.api_addr(), Mode::Forward).await;
    // The guard's clock runs 1% slow, the worst G7 must survive: it thinks less time passed.
    let slow: Arc<dyn Clock> = Arc::new(SkewedClock::new(0.99));
    let client = client_for(&[proxy.url()])
        .clock(slow)
        .request_timeout(Duration::from_millis(300))
        .build()
        .expect("a client");
    let guard = client
        .acquire("migrations", AcquireOptions::new().ttl(TTL))
        .await
        .expect("acquire");
    // Let a renewal through, then cut the client off: the server lets the lease expire.
    let first_deadline = guard.valid_until();
    poll_until(
        Duration::from_secs(5),
        "a renewal through the proxy",
        async || (guard.valid_until() > first_deadline).then_some(()),
    )
    .await;
    proxy.cut();
    assert!(
        guard.is_valid(),
        "the guard lapsed before the cut: {guard:?}"
    );

    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let reply = cluster.api().get(node, "/v1/leases/migrations").await;
        // Only a look taken after the server's answer counts: the expiry happened before it.
        let valid_after_read = guard.is_valid();
        let expired = match reply.status {
            404 => true,
            200 => reply.parse::<Lease>().fence != guard.fence(),
            _ => panic!("unexpected answer: {reply}"),
        };
        if expired {
            assert!(
                !valid_after_read,
                "the server let the lease expire but the guard still says valid: {reply}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the lease never expired: {reply}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(guard.lost().await, LostReason::Expired);
}

#[tokio::test]
async fn a_retried_acquire_after_a_timeout_is_applied_once() {
    let cluster = Cluster::start(1).await;
    let node = cluster.node(1);
    // The first endpoint delivers the request to the leader but never returns the answer.
    let black_hole = Proxy::start(node.api_addr(), Mode::Swallow).await;
    let client = client_for(&[black_hole.url(), node.api_url()])
        .request_timeout(Duration::from_millis(500))
        .build()
        .expect("a client");
    let request = AcquireRequest {
        limit: None,
        resource: "deploy/prod".to_owned(),
        session_id: None,
        holder: Some("agent-it".to_owned()),
        ttl_ms: Some(30_000),
        mode: LeaseMode::Exclusive,
        max_hold_ms: None,
        labels: Default::default(),
        reason: None,
        wait_ms: None,
    };
    let answer = client
        .acquire_raw(&request)
        .await
        .expect("the retry succeeds");
    assert!(
        black_hole.connections() >= 1,
        "the first attempt went elsewhere"
    );
    assert!(
        answer.replayed,
        "the retry was not answered from the first attempt's record: {answer:?}"
    );
    let lease: Lease = cluster
        .api()
        .get(node, "/v1/leases/deploy/prod")
        .await
        .expect_json(200);
    assert_eq!(lease.fence, answer.value.fence);
    let list: LeaseList = cluster
        .api()
        .get(node, "/v1/leases?prefix=deploy")
        .await
        .expect_json(200);
    assert_eq!(list.leases.len(), 1, "{list:?}");

    // The same through the library's own key handling: one key, two sends, one grant.
    let direct = client_for(&[node.api_url()]).build().expect("a client");
    let key = idempotency_key();
    let mut second = request.clone();
    second.resource = "deploy/staging".to_owned();
    let first = direct
        .acquire_raw_with_key(&second, &key)
        .await
        .expect("first send");
    let again = direct
        .acquire_raw_with_key(&second, &key)
        .await
        .expect("second send");
    assert!(!first.replayed && again.replayed);
    assert_eq!(first.value.fence, again.value.fence);
    assert_eq!(first.value.session_id, again.value.session_id);
    // The same key for another request is refused, and says it was not applied.
    second.resource = "deploy/dev".to_owned();
    let reused = direct
        .acquire_raw_with_key(&second, &key)
        .await
        .expect_err("a reused key");
    assert!(
        matches!(reused, Error::IdempotencyKeyReused { .. }),
        "{reused:?}"
    );
    assert!(!reused.is_indeterminate());
}

#[tokio::test]
async fn calls_spread_over_nodes_and_fenced_calls_take_a_guard() {
    let cluster = Cluster::start(3).await;
    // The first endpoint is dead from the start: every call must find another node.
    let dead = cluster.node(1);
    dead.kill();
    let client = client_for(&endpoints(&cluster)).build().expect("a client");
    let session = client
        .session(Duration::from_secs(10))
        .await
        .expect("a session");
    let guard = session
        .acquire("storage/file-17", AcquireOptions::new())
        .await
        .expect("acquire");
    let written = client
        .kv_put_fenced(&guard, "storage/file-17/contents", json!({"v": 1}))
        .await
        .expect("a fenced write");
    let entry = client
        .kv_get("storage/file-17/contents")
        .await
        .expect("read");
    assert_eq!(entry.revision, written.revision);
    assert_eq!(entry.fence.map(|fence| fence.token), Some(guard.fence()));
    let checked = client.check_fence(&guard).await.expect("fence check");
    assert!(checked.current);

    // A second holder is refused, with who holds it; nothing about the session leaks.
    let other = client_for(&endpoints(&cluster))
        .holder("agent-other")
        .build()
        .expect("a client");
    match other
        .acquire("storage/file-17", AcquireOptions::new())
        .await
    {
        Err(Error::Held { held_by, message }) => {
            assert_eq!(held_by.holder, "agent-it");
            assert_eq!(held_by.fence, guard.fence());
            assert!(message.contains("agent-it"), "{message}");
            assert!(!message.contains(session.id().as_str()));
        }
        unexpected => panic!("expected LEASE_HELD, got {unexpected:?}"),
    }

    // After release the old fence is stale: a write with it is refused with STALE_FENCE.
    let stale_fence = guard.fence_ref();
    guard.release().await.expect("release");
    let next = other
        .acquire("storage/file-17", AcquireOptions::new())
        .await
        .expect("acquirable at once after release");
    assert!(next.fence() > stale_fence.token);
    let refused = client
        .kv_put_request(
            "storage/file-17/contents",
            &baton_client::api::KvPutRequest {
                value: json!({"v": 2}),
                fence: Some(stale_fence),
                session_id: Some(session.id().clone()),
            },
        )
        .await
        .expect_err("a stale fence");
    assert!(
        matches!(refused, Error::StaleFence { current: Some(current), .. } if current == next.fence()),
        "{refused:?}"
    );
    assert!(
        client
            .check_fence(&next)
            .await
            .expect("fence check")
            .current
    );

    // Ending the session from elsewhere: the session's guards learn it from the next renewal.
    let third = session
        .acquire("storage/file-18", AcquireOptions::new())
        .await
        .expect("acquire");
    let leader = cluster.leader().await;
    cluster
        .api()
        .call(
            Method::DELETE,
            leader,
            &format!("/v1/sessions/{}", session.id().as_str()),
        )
        .send()
        .await
        .expect_status(200);
    let reason = tokio::time::timeout(Duration::from_secs(10), third.lost())
        .await
        .expect("lost() resolves within a renewal interval");
    assert!(matches!(reason, LostReason::Gone { .. }), "{reason:?}");
    let refused = client
        .kv_put_fenced(&third, "storage/file-18/contents", json!(1))
        .await
        .expect_err("a lost guard");
    assert!(matches!(refused, Error::Lost { .. }), "{refused:?}");
    let refused = client
        .kv_delete_fenced(&third, "storage/file-17/contents")
        .await
        .expect_err("a lost guard");
    assert!(matches!(refused, Error::Lost { .. }), "{refused:?}");
    // The current holder's fenced delete lands.
    let deleted = other
        .kv_delete_fenced(&next, "storage/file-17/contents")
        .await
        .expect("a fenced delete by the holder");
    assert!(deleted.deleted);
    assert!(deleted.revision > Some(written.revision), "{deleted:?}");
    next.release().await.expect("release");
}

#[tokio::test]
async fn an_unreachable_cluster_is_unavailable_and_a_refusal_is_definite() {
    let closed = format!("http://127.0.0.1:{}", baton_tests::free_port());
    let client = client_for(std::slice::from_ref(&closed))
        .retry_budget(Duration::from_secs(1))
        .build()
        .expect("a client");
    let error = client.get_lease("a").await.expect_err("nobody listens");
    assert!(matches!(error, Error::Unavailable { .. }), "{error:?}");
    assert!(!error.is_indeterminate());
    assert_eq!(error.code(), "UNAVAILABLE");

    let cluster = Cluster::start(1).await;
    let client = client_for(&[cluster.node(1).api_url()])
        .build()
        .expect("a client");
    let error = client
        .acquire("a", AcquireOptions::new().ttl(Duration::from_millis(10)))
        .await
        .expect_err("a TTL below the limit");
    assert!(matches!(error, Error::InvalidArgument { .. }), "{error:?}");
    assert_eq!(error.code(), ErrorCode::InvalidArgument.as_str());
    let error = client
        .get_lease("nothing/here")
        .await
        .expect_err("no lease");
    assert!(matches!(error, Error::NotFound { .. }), "{error:?}");
}

/// A read has no effect, so its outcome is never unknown: when every attempt went unanswered
/// (a node died with the connection open, an answer was lost) it is `Unavailable`, while a
/// mutation in the same place is `Indeterminate`.
#[tokio::test]
async fn a_read_whose_answers_are_lost_is_unavailable_and_a_write_is_unknown() {
    let cluster = Cluster::start(1).await;
    let black_hole = Proxy::start(cluster.node(1).api_addr(), Mode::Swallow).await;
    let client = client_for(&[black_hole.url()])
        .request_timeout(Duration::from_millis(300))
        .retry_budget(Duration::from_secs(1))
        .build()
        .expect("a client");
    let error = client
        .get_lease("a")
        .await
        .expect_err("every answer is lost");
    assert!(matches!(error, Error::Unavailable { .. }), "{error:?}");
    assert!(!error.is_indeterminate(), "{error:?}");
    let error = client
        .acquire("a", AcquireOptions::new())
        .await
        .expect_err("every answer is lost");
    assert!(error.is_indeterminate(), "{error:?}");
}

/// The session a waiting acquire made for itself dies when the client renews it too late (a
/// stalled process, a loaded machine): the place in line is lost, not the acquire, which joins
/// the line again and ends as every wait does. It used to end in `LEASE_LOST` for a lease it
/// never held.
#[tokio::test]
async fn a_waiting_acquire_whose_own_session_dies_joins_the_line_again() {
    let cluster = Cluster::start(1).await;
    let holder = client_for(&endpoints(&cluster))
        .holder("agent-a")
        .build()
        .expect("a client");
    let held = holder
        .acquire(
            "busy/path",
            AcquireOptions::new().ttl(Duration::from_secs(10)),
        )
        .await
        .expect("granted");
    let waiter = client_for(&endpoints(&cluster))
        .holder("agent-b")
        .build()
        .expect("a client");
    let started = Instant::now();
    let waiting = waiter.acquire(
        "busy/path",
        AcquireOptions::new()
            .ttl(Duration::from_secs(1))
            .wait(Duration::from_secs(3)),
    );
    let stall = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        // Blocks the test's only runtime thread: no round and no renewal for 1.5 s, past the
        // session's 1 s TTL.
        std::thread::sleep(Duration::from_millis(1_500));
    };
    let (answer, ()) = tokio::join!(waiting, stall);
    match answer {
        Err(Error::Held { held_by, .. }) => assert_eq!(held_by.holder, "agent-a"),
        unexpected => panic!("expected LEASE_HELD, got {unexpected:?}"),
    }
    assert!(started.elapsed() >= Duration::from_secs(3));
    // Nobody is left in the line: the next acquire after the release is granted at once.
    held.release().await.expect("release");
    let next = waiter
        .acquire("busy/path", AcquireOptions::new())
        .await
        .expect("granted at once");
    next.release().await.expect("release");
}

// ---------------------------------------------------------------------------------------------
// A TCP relay that injects network faults between the client and one node
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Relay both ways.
    Forward,
    /// Relay requests, drop every answer: the client times out after the server applied.
    Swallow,
    /// Close every connection and refuse new ones.
    Cut,
}

/// A relay on an ephemeral port; dropping it stops it and every connection it carries.
struct Proxy {
    address: String,
    state: Arc<Mutex<ProxyState>>,
    accept: JoinHandle<()>,
}

struct ProxyState {
    mode: Mode,
    connections: usize,
    relays: Vec<JoinHandle<()>>,
}

impl Proxy {
    async fn start(target: String, mode: Mode) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a proxy");
        let address = listener
            .local_addr()
            .expect("the proxy's address")
            .to_string();
        let state = Arc::new(Mutex::new(ProxyState {
            mode,
            connections: 0,
            relays: Vec::new(),
        }));
        let shared = Arc::clone(&state);
        let accept = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let mut state = shared.lock().expect("proxy state");
                if state.mode == Mode::Cut {
                    continue;
                }
                state.connections += 1;
                let relay = tokio::spawn(relay(inbound, target.clone(), state.mode));
                state.relays.push(relay);
            }
        });
        Proxy {
            address,
            state,
            accept,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    fn connections(&self) -> usize {
        self.state.lock().expect("proxy state").connections
    }

    fn cut(&self) {
        let mut state = self.state.lock().expect("proxy state");
        state.mode = Mode::Cut;
        for relay in state.relays.drain(..) {
            relay.abort();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        if let Ok(mut state) = self.state.lock() {
            for relay in state.relays.drain(..) {
                relay.abort();
            }
        }
    }
}

async fn relay(inbound: TcpStream, target: String, mode: Mode) {
    let Ok(outbound) = TcpStream::connect(&target).await else {
        return;
    };
    let (mut from_client, mut to_client) = inbound.into_split();
    let (mut from_server, mut to_server) = outbound.into_split();
    let upstream = async {
        let _ = tokio::io::copy(&mut from_client, &mut to_server).await;
        let _ = to_server.shutdown().await;
    };
    let downstream = async {
        match mode {
            Mode::Forward => {
                let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
            }
            // Read and drop: the client's connection stays open and silent.
            Mode::Swallow | Mode::Cut => {
                let _ = tokio::io::copy(&mut from_server, &mut tokio::io::sink()).await;
            }
        }
    };
    tokio::join!(upstream, downstream);
}
