//! Serving a router on a TCP listener (plain, or TLS with `tls.rs`), with every connection
//! bounded: a client cannot hold a node's file descriptors by connecting and saying nothing
//! (slowloris), by sending its request a byte at a time, or by idling on keep-alive.
//!
//! - **A connection cap** (`--connections-max`, by default what the open-file limit leaves
//!   after the store's own files). At the cap, a new connection takes the place of the oldest
//!   *idle* one: first those that never sent a whole request, then those idling on keep-alive
//!   (as nginx reuses keep-alive connections when it runs out). A connection with a request in
//!   flight, an event stream included, is never taken, so a health check or a real client
//!   always gets in past a flood of silent connections. Only when every connection is busy is a
//!   new one closed at once.
//! - **A request-header timeout** (`--request-header-timeout-ms`): a connection (its TLS
//!   handshake done) must deliver a whole request head within it, and a request body must
//!   arrive within it too.
//! - **An idle timeout** (`--idle-timeout-ms`): a keep-alive connection with no request in
//!   flight is closed after it, and a slow head after the first request is bounded by it.
//!
//! What must never live here: routes, or anything that reads a request's content.

use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::Router;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

/// File descriptors left to the store (log segments, the store's files), the peers, stdio and the runtime
/// when the cap is derived from the open-file limit.
const DESCRIPTORS_RESERVED: u64 = 128;
/// The most connections a derived cap allows, however high the open-file limit.
const CONNECTIONS_DERIVED_MAX: u64 = 1 << 20;
/// The longest a connection may take to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the accept loop waits after a failed accept (out of descriptors and the like).
const ACCEPT_RETRY_DELAY: Duration = Duration::from_millis(20);

/// The bounds of one listener's connections.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionBounds {
    /// Most connections open at once (handshakes included).
    pub connections_max: usize,
    /// The longest from a connection's start (after its TLS handshake) to its first whole
    /// request head, and from a request's head to the end of its body.
    pub request_header_timeout: Duration,
    /// The longest a connection may idle between requests.
    pub idle_timeout: Duration,
}

/// `--connections-max`, or, when it is 0, what the open-file limit leaves: the soft limit is
/// raised to the hard one first, as most servers do.
pub fn connections_max(configured: usize) -> usize {
    if configured > 0 {
        return configured;
    }
    let descriptors = raise_open_file_limit();
    let derived = descriptors
        .saturating_sub(DESCRIPTORS_RESERVED)
        .clamp(16, CONNECTIONS_DERIVED_MAX);
    usize::try_from(derived).unwrap_or(usize::MAX)
}

/// Raises the soft open-file limit to the hard one; the soft limit in effect after.
fn raise_open_file_limit() -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return 1_024;
    };
    if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        return hard;
    }
    soft
}

/// Serves `router` on `listener` (over TLS with `tls`) within `bounds`, until `stopped` turns
/// true; then stops accepting, lets each connection finish the request it has (graceful
/// shutdown) and returns when all are closed.
pub async fn serve(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    router: Router,
    bounds: ConnectionBounds,
    mut stopped: watch::Receiver<bool>,
    port: &'static str,
) {
    let registry = Arc::new(Registry::default());
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stopped.wait_for(|stop| *stop) => break,
            Some(_) = connections.join_next() => continue,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(error) => {
                // Out of descriptors despite the cap (the store's own files grew): an idle
                // connection makes room, and the loop waits rather than spins.
                tracing::warn!(%error, port, "accept failed");
                registry.evict_idle();
                tokio::time::sleep(ACCEPT_RETRY_DELAY).await;
                continue;
            }
        };
        let Some(connection) = registry.admit(bounds.connections_max) else {
            tracing::warn!(
                port,
                connections_max = bounds.connections_max,
                "refused a connection: every connection is busy"
            );
            continue;
        };
        let _ = stream.set_nodelay(true);
        connections.spawn(serve_connection(
            stream,
            tls.clone(),
            router.clone(),
            bounds,
            connection,
            stopped.clone(),
            port,
        ));
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
}

/// Serves one connection until it closes, is evicted, idles past its bound, or the node stops.
async fn serve_connection(
    stream: TcpStream,
    tls: Option<TlsAcceptor>,
    router: Router,
    bounds: ConnectionBounds,
    connection: Admitted,
    stopped: watch::Receiver<bool>,
    port: &'static str,
) {
    match tls {
        None => serve_http(stream, router, bounds, connection, stopped).await,
        Some(acceptor) => {
            let handshake = tokio::select! {
                handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)) => handshake,
                () = connection.tracked.evicted.notified() => return,
            };
            match handshake {
                Ok(Ok(tls)) => serve_http(tls, router, bounds, connection, stopped).await,
                Ok(Err(error)) => tracing::info!(%error, port, "TLS handshake refused"),
                Err(_) => tracing::info!(port, "TLS handshake timed out"),
            }
        }
    }
}

async fn serve_http<I>(
    io: I,
    router: Router,
    bounds: ConnectionBounds,
    connection: Admitted,
    mut stopped: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let tracked = Arc::clone(&connection.tracked);
    tracked.restart_idle();
    let service = Counted {
        router,
        tracked: Arc::clone(&tracked),
        body_timeout: bounds.request_header_timeout,
    };
    let http =
        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(io), service);
    tokio::pin!(http);
    let mut stopping = false;
    loop {
        let deadline = tracked.idle_deadline(bounds);
        tokio::select! {
            _ = http.as_mut() => return,
            () = tracked.evicted.notified() => return,
            () = tokio::time::sleep_until(deadline.unwrap_or_else(far_future)) => {
                if tracked.idle_deadline(bounds).is_some_and(|deadline| deadline <= Instant::now()) {
                    return;
                }
            }
            _ = stopped.wait_for(|stop| *stop), if !stopping => {
                stopping = true;
                http.as_mut().graceful_shutdown();
            }
        }
    }
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(3_600)
}

/// The open connections of one listener, oldest first.
#[derive(Debug, Default)]
struct Registry {
    open: Mutex<Open>,
}

#[derive(Debug, Default)]
struct Open {
    next_id: u64,
    connections: BTreeMap<u64, Arc<Tracked>>,
}

impl Registry {
    /// A place for a new connection: a free one, or the place of the oldest idle connection
    /// (which is told to close); `None` when all `connections_max` are busy.
    fn admit(self: &Arc<Self>, connections_max: usize) -> Option<Admitted> {
        let mut open = self.open.lock().expect("connection registry");
        let staying = open
            .connections
            .values()
            .filter(|tracked| !tracked.is_evicted())
            .count();
        if staying >= connections_max && !Self::evict_oldest_idle(&open) {
            return None;
        }
        let id = open.next_id;
        open.next_id += 1;
        let tracked = Arc::new(Tracked::default());
        open.connections.insert(id, Arc::clone(&tracked));
        Some(Admitted {
            id,
            tracked,
            registry: Arc::clone(self),
        })
    }

    fn evict_idle(&self) {
        let open = self.open.lock().expect("connection registry");
        Self::evict_oldest_idle(&open);
    }

    /// Tells the oldest idle connection to close, those that never sent a request first.
    fn evict_oldest_idle(open: &Open) -> bool {
        let candidates = || {
            open.connections
                .values()
                .filter(|tracked| !tracked.is_evicted() && tracked.is_idle())
        };
        let chosen = candidates()
            .find(|tracked| !tracked.has_served())
            .or_else(|| candidates().next());
        match chosen {
            Some(tracked) => {
                tracked.evict();
                true
            }
            None => false,
        }
    }
}

/// A connection's place in the registry, given back when it is dropped.
#[derive(Debug)]
struct Admitted {
    id: u64,
    tracked: Arc<Tracked>,
    registry: Arc<Registry>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut open = self.registry.open.lock().expect("connection registry");
        open.connections.remove(&self.id);
    }
}

/// What the registry knows of one connection.
#[derive(Debug)]
struct Tracked {
    state: Mutex<Activity>,
    /// Notified once when the connection must close to make room.
    evicted: Notify,
}

#[derive(Debug)]
struct Activity {
    /// Requests whose response has not been sent whole (an event stream stays in flight).
    in_flight: usize,
    /// Requests seen on this connection.
    served: u64,
    /// Since when nothing has been in flight.
    idle_since: Instant,
    evicted: bool,
}

impl Default for Tracked {
    fn default() -> Tracked {
        Tracked {
            state: Mutex::new(Activity {
                in_flight: 0,
                served: 0,
                idle_since: Instant::now(),
                evicted: false,
            }),
            evicted: Notify::new(),
        }
    }
}

impl Tracked {
    fn activity(&self) -> std::sync::MutexGuard<'_, Activity> {
        self.state.lock().expect("connection activity")
    }

    fn is_idle(&self) -> bool {
        self.activity().in_flight == 0
    }

    fn has_served(&self) -> bool {
        self.activity().served > 0
    }

    fn is_evicted(&self) -> bool {
        self.activity().evicted
    }

    fn evict(&self) {
        self.activity().evicted = true;
        self.evicted.notify_one();
    }

    /// The idle clock starts again (the TLS handshake is not idling).
    fn restart_idle(&self) {
        self.activity().idle_since = Instant::now();
    }

    /// When this connection will have idled too long, or `None` while a request is in flight.
    fn idle_deadline(&self, bounds: ConnectionBounds) -> Option<Instant> {
        let activity = self.activity();
        if activity.in_flight > 0 {
            return None;
        }
        let allowed = if activity.served == 0 {
            bounds.request_header_timeout
        } else {
            bounds.idle_timeout
        };
        Some(activity.idle_since + allowed)
    }

    fn request_started(self: &Arc<Self>) -> InFlight {
        let mut activity = self.activity();
        activity.in_flight += 1;
        activity.served += 1;
        InFlight {
            tracked: Arc::clone(self),
        }
    }
}

/// One request in flight, until its response body is dropped (sent whole, or abandoned).
#[derive(Debug)]
struct InFlight {
    tracked: Arc<Tracked>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut activity = self.tracked.activity();
        activity.in_flight -= 1;
        if activity.in_flight == 0 {
            activity.idle_since = Instant::now();
        }
    }
}

/// The router as hyper's service, counting each request in flight on its connection.
#[derive(Debug, Clone)]
struct Counted {
    router: Router,
    tracked: Arc<Tracked>,
    body_timeout: Duration,
}

impl hyper::service::Service<hyper::Request<Incoming>> for Counted {
    type Response = axum::response::Response;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn call(&self, request: hyper::Request<Incoming>) -> Self::Future {
        let in_flight = self.tracked.request_started();
        let deadline = Instant::now() + self.body_timeout;
        let request = request.map(|body| Body::new(Deadlined::new(body, deadline)));
        let mut router = self.router.clone();
        Box::pin(async move {
            // A router is always ready (axum's `Router::poll_ready`), so it is called at once.
            let response = tower_service::Service::call(&mut router, request).await?;
            Ok(response.map(|body| Body::new(Finished::new(body, in_flight))))
        })
    }
}

/// A request body that must arrive whole by a deadline.
struct Deadlined {
    inner: Incoming,
    deadline: Pin<Box<tokio::time::Sleep>>,
}

impl Deadlined {
    fn new(inner: Incoming, deadline: Instant) -> Deadlined {
        Deadlined {
            inner,
            deadline: Box::pin(tokio::time::sleep_until(deadline)),
        }
    }
}

impl hyper::body::Body for Deadlined {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(context) {
            return Poll::Ready(frame.map(|frame| frame.map_err(io::Error::other)));
        }
        match self.deadline.as_mut().poll(context) {
            Poll::Ready(()) => Poll::Ready(Some(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the request body did not arrive in time",
            )))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A response body that keeps its request in flight until it is dropped.
struct Finished {
    inner: Body,
    _in_flight: InFlight,
}

impl Finished {
    fn new(inner: Body, in_flight: InFlight) -> Finished {
        Finished {
            inner,
            _in_flight: in_flight,
        }
    }
}

impl hyper::body::Body for Finished {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(context)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
