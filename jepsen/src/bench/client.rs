//! The bench's HTTP client: plain HTTP/1.1 over kept-alive connections, one request at a time
//! on each, taken from and given back to a pool per endpoint.
//!
//! It is the load, so it is lean: the bench shares the machine with the nodes it measures (on
//! this project's 2-core hosts, with all three of them), and every microsecond it spends is one
//! the servers do not get. reqwest cost about 30 us of CPU a request here (URL parsing, its
//! connector and pool layers); hyper's bare HTTP/1.1 client with a path written once costs a
//! fraction of that (docs/performance.md, "The load's own cost"). Baton and etcd are driven by
//! the same client, so the ratio stays one measured under the same load.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper::header::{HeaderValue, CONTENT_TYPE, HOST};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::net::TcpStream;

/// A request's time at most, connection included.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Idle connections kept per endpoint at most.
const IDLE_PER_ENDPOINT_MAX: usize = 1_024;

/// One HTTP/1.1 connection's sending half; hyper's connection task does its I/O.
type Connection = SendRequest<Full<Bytes>>;

/// How the load's requests use connections: `--connections`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Connections {
    /// All requests share one pool of kept-alive connections, at most N of them busy at once
    /// (a request beyond that waits for one, and the wait counts in its latency).
    Pooled(usize),
    /// Each session (or each client of the lease cycle) keeps connections of its own, as an
    /// agent process holding its own connection does.
    PerSession,
    /// A new TCP connection for every request, closed by the client after the answer, as a
    /// `curl` or a hook process does.
    Fresh,
}

impl Connections {
    /// Connections busy at once in the default pool.
    pub const POOLED_DEFAULT: usize = 512;

    /// The client for one session or client of the load: `shared` when the mode shares one,
    /// else a pool of its own.
    pub(super) fn client(self, shared: &Http) -> Http {
        match self {
            Connections::PerSession => Http::default(),
            Connections::Pooled(_) | Connections::Fresh => shared.clone(),
        }
    }

    /// The client that `client` hands out when shared.
    pub(super) fn shared(self) -> Http {
        match self {
            Connections::Pooled(busy) => Http {
                busy: Some(Arc::new(tokio::sync::Semaphore::new(busy))),
                ..Http::default()
            },
            Connections::PerSession => Http::default(),
            Connections::Fresh => Http {
                fresh: true,
                ..Http::default()
            },
        }
    }
}

impl std::fmt::Display for Connections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Connections::Pooled(busy) => write!(f, "pooled:{busy}"),
            Connections::PerSession => write!(f, "per-session"),
            Connections::Fresh => write!(f, "fresh"),
        }
    }
}

/// `pooled:N` (or `pooled`, N = 512), `per-session`, `fresh`.
pub(crate) fn parse_connections(text: &str) -> Result<Connections, String> {
    match text {
        "per-session" => Ok(Connections::PerSession),
        "fresh" => Ok(Connections::Fresh),
        "pooled" => Ok(Connections::Pooled(Connections::POOLED_DEFAULT)),
        _ => {
            let busy = text
                .strip_prefix("pooled:")
                .and_then(|busy| busy.parse::<usize>().ok())
                .filter(|busy| (1..=65_536).contains(busy))
                .ok_or_else(|| {
                    format!("{text:?}: give pooled:N (N 1..=65536), per-session or fresh")
                })?;
            Ok(Connections::Pooled(busy))
        }
    }
}

/// A pool of connections to `http://host:port` endpoints; clones share it.
#[derive(Clone, Default)]
pub(super) struct Http {
    idle: Arc<Mutex<HashMap<String, Vec<Connection>>>>,
    /// With `pooled:N`: the N connections that may be busy at once.
    busy: Option<Arc<tokio::sync::Semaphore>>,
    /// With `fresh`: every request on a new connection, closed after it.
    fresh: bool,
}

/// A whole answer.
#[derive(Debug)]
pub(super) struct Answer {
    pub status: StatusCode,
    pub body: Bytes,
}

impl Answer {
    pub fn json<T: DeserializeOwned>(&self) -> anyhow::Result<T> {
        serde_json::from_slice(&self.body).with_context(|| {
            format!(
                "an answer with status {} did not decode: {}",
                self.status,
                String::from_utf8_lossy(&self.body[..self.body.len().min(200)])
            )
        })
    }
}

/// Why a request got no answer.
#[derive(Debug, thiserror::Error)]
pub(super) enum HttpError {
    #[error("connecting to {0}")]
    Connect(String),
    #[error("no answer within {REQUEST_TIMEOUT:?}")]
    Timeout,
    #[error("{0}")]
    Transport(String),
}

/// The `host:port` of an `http://host:port` endpoint (a trailing `/` allowed).
pub(super) fn authority(endpoint: &str) -> anyhow::Result<&str> {
    let Some(rest) = endpoint.strip_prefix("http://") else {
        bail!("the bench speaks plain HTTP: give endpoints as http://host:port, not {endpoint:?}");
    };
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.is_empty() || authority.contains('/') {
        bail!("give endpoints as http://host:port, without a path: {endpoint:?}");
    }
    Ok(authority)
}

impl Http {
    /// POSTs `body` as JSON (no body when `None`) to `path` at `endpoint`, with
    /// `Baton-Namespace: namespace` when given.
    pub async fn post<B: Serialize>(
        &self,
        endpoint: &str,
        path: &str,
        body: Option<&B>,
        namespace: Option<&str>,
    ) -> Result<Answer, HttpError> {
        let body = match body {
            Some(body) => Some(Bytes::from(
                serde_json::to_vec(body)
                    .map_err(|error| HttpError::Transport(error.to_string()))?,
            )),
            None => None,
        };
        self.send(Method::POST, endpoint, path, body, namespace)
            .await
    }

    pub async fn get(
        &self,
        endpoint: &str,
        path: &str,
        namespace: Option<&str>,
    ) -> Result<Answer, HttpError> {
        self.send(Method::GET, endpoint, path, None, namespace)
            .await
    }

    pub async fn delete(&self, endpoint: &str, path: &str) -> Result<Answer, HttpError> {
        self.send(Method::DELETE, endpoint, path, None, None).await
    }

    /// One exchange on an idle connection to `endpoint`, or on a new one. A request that an idle
    /// connection hands back unsent (the server closed it meanwhile) goes once more on a new one.
    async fn send(
        &self,
        method: Method,
        endpoint: &str,
        path: &str,
        body: Option<Bytes>,
        namespace: Option<&str>,
    ) -> Result<Answer, HttpError> {
        let authority =
            authority(endpoint).map_err(|error| HttpError::Connect(error.to_string()))?;
        let exchanged = async {
            let _busy = match &self.busy {
                Some(busy) => Some(busy.acquire().await.expect("never closed")),
                None => None,
            };
            loop {
                let idle = self.take_idle(authority);
                let reused = idle.is_some();
                let mut connection = match idle {
                    Some(connection) => connection,
                    None => connect(authority).await?,
                };
                let mut request = Request::builder()
                    .method(method.clone())
                    .uri(path)
                    .header(HOST, authority);
                if body.is_some() {
                    request =
                        request.header(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                }
                if let Some(namespace) = namespace {
                    request = request.header("Baton-Namespace", namespace);
                }
                let request = request
                    .body(Full::new(body.clone().unwrap_or_default()))
                    .map_err(|error| HttpError::Transport(error.to_string()))?;
                if connection.ready().await.is_err() {
                    if reused {
                        continue;
                    }
                    return Err(HttpError::Connect(format!(
                        "{authority} closed the connection"
                    )));
                }
                let response = match connection.try_send_request(request).await {
                    Ok(response) => response,
                    Err(mut error) => {
                        // Handed back unsent: the idle connection had closed meanwhile.
                        if reused && error.take_message().is_some() {
                            continue;
                        }
                        return Err(HttpError::Transport(error.error().to_string()));
                    }
                };
                let status = response.status();
                let body = response
                    .into_body()
                    .collect()
                    .await
                    .map_err(|error| HttpError::Transport(format!("reading the answer: {error}")))?
                    .to_bytes();
                self.put_idle(authority, connection);
                return Ok(Answer { status, body });
            }
        };
        tokio::time::timeout(REQUEST_TIMEOUT, exchanged)
            .await
            .unwrap_or(Err(HttpError::Timeout))
    }

    fn take_idle(&self, authority: &str) -> Option<Connection> {
        if self.fresh {
            return None;
        }
        let mut idle = self
            .idle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let connections = idle.get_mut(authority)?;
        while let Some(connection) = connections.pop() {
            if !connection.is_closed() {
                return Some(connection);
            }
        }
        None
    }

    fn put_idle(&self, authority: &str, connection: Connection) {
        if self.fresh {
            // Dropped: hyper's connection task closes the socket.
            return;
        }
        let mut idle = self
            .idle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let connections = match idle.get_mut(authority) {
            Some(connections) => connections,
            None => idle.entry(authority.to_owned()).or_default(),
        };
        if connections.len() < IDLE_PER_ENDPOINT_MAX {
            connections.push(connection);
        }
    }
}

/// A new connection to `authority`; hyper's connection task does its I/O and ends with it.
async fn connect(authority: &str) -> Result<Connection, HttpError> {
    let connect_error = |error: std::io::Error| HttpError::Connect(format!("{authority}: {error}"));
    let tcp = TcpStream::connect(authority).await.map_err(connect_error)?;
    tcp.set_nodelay(true).map_err(connect_error)?;
    let (send, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(|error| HttpError::Connect(format!("{authority}: {error}")))?;
    tokio::spawn(connection);
    Ok(send)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_modes_parse_and_bad_ones_say_what_to_give() {
        assert_eq!(parse_connections("pooled:64"), Ok(Connections::Pooled(64)));
        assert_eq!(
            parse_connections("pooled"),
            Ok(Connections::Pooled(Connections::POOLED_DEFAULT))
        );
        assert_eq!(
            parse_connections("per-session"),
            Ok(Connections::PerSession)
        );
        assert_eq!(parse_connections("fresh"), Ok(Connections::Fresh));
        for refused in [
            "",
            "pooled:0",
            "pooled:x",
            "pooled:65537",
            "per_session",
            "new",
        ] {
            let error = parse_connections(refused).unwrap_err();
            assert!(
                error.contains("per-session or fresh"),
                "{refused:?}: {error}"
            );
        }
        assert_eq!(Connections::Pooled(8).to_string(), "pooled:8");
    }

    #[test]
    fn endpoints_are_plain_http_host_and_port() {
        assert_eq!(
            authority("http://127.0.0.1:7431").unwrap(),
            "127.0.0.1:7431"
        );
        assert_eq!(
            authority("http://localhost:2379/").unwrap(),
            "localhost:2379"
        );
        assert!(authority("https://127.0.0.1:7431").is_err());
        assert!(authority("127.0.0.1:7431").is_err());
        assert!(authority("http://127.0.0.1:7431/v1").is_err());
        assert!(authority("http://").is_err());
    }

    /// A loopback server that answers every request with the number of the connection it came
    /// on and the request's body; with `first_closes_after`, the first connection closes after
    /// answering that many.
    async fn echo_server(
        first_closes_after: Option<usize>,
    ) -> (std::net::SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let connections = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let accepted = connections.clone();
        tokio::spawn(async move {
            loop {
                let (mut socket, _) = listener.accept().await.unwrap();
                let number = accepted.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                tokio::spawn(async move {
                    // The first connection answers two requests and closes; later ones answer on.
                    let mut answered = 0;
                    let mut buffer = vec![0u8; 4096];
                    let mut seen = Vec::new();
                    loop {
                        let read = socket.read(&mut buffer).await.unwrap_or(0);
                        if read == 0 {
                            return;
                        }
                        seen.extend_from_slice(&buffer[..read]);
                        while let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                            let head = String::from_utf8_lossy(&seen[..end]).to_string();
                            let length: usize = head
                                .lines()
                                .find_map(|line| {
                                    line.to_ascii_lowercase()
                                        .strip_prefix("content-length: ")
                                        .map(|n| n.trim().parse().unwrap())
                                })
                                .unwrap_or(0);
                            if seen.len() < end + 4 + length {
                                break;
                            }
                            let body = String::from_utf8_lossy(&seen[end + 4..end + 4 + length])
                                .to_string();
                            seen.drain(..end + 4 + length);
                            let answer = format!("{{\"connection\":{number},\"echo\":{body}}}");
                            let reply = format!(
                                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{answer}",
                                answer.len()
                            );
                            socket.write_all(reply.as_bytes()).await.unwrap();
                            answered += 1;
                            if number == 1 && Some(answered) == first_closes_after {
                                return;
                            }
                        }
                    }
                });
            }
        });
        (address, connections)
    }

    async fn echo(http: &Http, endpoint: &str, round: u64) -> u64 {
        let answer = http
            .post(
                endpoint,
                "/echo",
                Some(&serde_json::json!({ "round": round })),
                None,
            )
            .await
            .unwrap();
        assert_eq!(answer.status, StatusCode::OK);
        let value: serde_json::Value = answer.json().unwrap();
        assert_eq!(value["echo"]["round"], round);
        value["connection"].as_u64().unwrap()
    }

    /// A real exchange with a server on loopback, a second one on the kept connection, and one
    /// after the server dropped it (sent again on a new connection).
    #[tokio::test]
    async fn requests_reuse_a_kept_connection_and_survive_its_close() {
        let (address, _) = echo_server(Some(2)).await;
        let http = Http::default();
        let endpoint = format!("http://{address}");
        let mut seen = Vec::new();
        for round in 0..3 {
            seen.push(echo(&http, &endpoint, round).await);
            // Let the server's close reach the client before the next request.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(seen, vec![1, 1, 2], "kept, kept, then a new connection");
        assert!(matches!(
            http.get("http://127.0.0.1:1", "/", None).await,
            Err(HttpError::Connect(_))
        ));
    }

    /// `fresh` opens a connection per request; `per-session` clients keep one each; `pooled:1`
    /// sends concurrent requests one after the other on one connection.
    #[tokio::test]
    async fn each_connection_mode_uses_connections_as_it_says() {
        let (address, connections) = echo_server(None).await;
        let endpoint = format!("http://{address}");
        let fresh = Connections::Fresh.shared();
        let mut seen = Vec::new();
        for round in 0..3 {
            seen.push(echo(&fresh, &endpoint, round).await);
        }
        assert_eq!(seen, vec![1, 2, 3], "a new connection each time");

        let shared = Connections::PerSession.shared();
        let (first, second) = (
            Connections::PerSession.client(&shared),
            Connections::PerSession.client(&shared),
        );
        let a = echo(&first, &endpoint, 0).await;
        let b = echo(&second, &endpoint, 1).await;
        assert_ne!(a, b, "each session its own connection");
        assert_eq!(echo(&first, &endpoint, 2).await, a, "and kept");

        let before = connections.load(std::sync::atomic::Ordering::SeqCst);
        let pooled = Connections::Pooled(1).shared();
        let together = futures_util::future::join_all((0..4).map(|round| {
            let (pooled, endpoint) = (Connections::Pooled(1).client(&pooled), endpoint.clone());
            async move { echo(&pooled, &endpoint, round).await }
        }))
        .await;
        assert!(together.iter().all(|&connection| connection == together[0]));
        assert_eq!(
            connections.load(std::sync::atomic::Ordering::SeqCst),
            before + 1,
            "one connection for four concurrent requests"
        );
    }
}
