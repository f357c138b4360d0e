//! The bounds on a node's connections (docs/api.md, "Connections"): a connection that says
//! nothing, or sends its request a byte at a time, is closed after the request-header
//! timeout; one idling on keep-alive after the idle timeout; and a flood of silent
//! connections (slowloris) never locks out a health check or an open event stream, even on a
//! node with few file descriptors.

use std::time::{Duration, Instant};

use baton_tests::{json, Cluster, ClusterConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long a test waits for a node to close a connection it should close.
const CLOSE_WAIT_MAX: Duration = Duration::from_secs(15);

async fn node_with(extra_args: &[&str], open_files_max: Option<u64>) -> Cluster {
    Cluster::start_with(ClusterConfig {
        extra_args: extra_args.iter().map(|arg| (*arg).to_owned()).collect(),
        open_files_max,
        ..ClusterConfig::new(1)
    })
    .await
}

/// Reads until the node closes `stream` (or `CLOSE_WAIT_MAX` passes); how long that took and
/// what was read.
async fn until_closed(stream: &mut TcpStream) -> (Duration, Vec<u8>) {
    let start = Instant::now();
    let mut read = Vec::new();
    let mut buffer = [0_u8; 4096];
    while start.elapsed() < CLOSE_WAIT_MAX {
        match tokio::time::timeout(Duration::from_millis(200), stream.read(&mut buffer)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (start.elapsed(), read),
            Ok(Ok(count)) => read.extend_from_slice(&buffer[..count]),
            Err(_) => {}
        }
    }
    panic!(
        "the node kept the connection open for {CLOSE_WAIT_MAX:?}; read {:?}",
        String::from_utf8_lossy(&read)
    );
}

/// `GET /healthz` on a connection of its own: the status line, within `within`.
async fn health(address: &str, within: Duration) -> Result<String, String> {
    let exchange = async {
        let mut stream = TcpStream::connect(address)
            .await
            .map_err(|error| format!("connect: {error}"))?;
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nhost: baton\r\nconnection: close\r\n\r\n")
            .await
            .map_err(|error| format!("write: {error}"))?;
        let mut answer = Vec::new();
        stream
            .read_to_end(&mut answer)
            .await
            .map_err(|error| format!("read: {error}"))?;
        let answer = String::from_utf8_lossy(&answer).into_owned();
        Ok(answer.lines().next().unwrap_or_default().to_owned())
    };
    tokio::time::timeout(within, exchange)
        .await
        .map_err(|_| format!("no answer within {within:?}"))?
}

#[tokio::test]
async fn silent_trickling_and_idle_connections_are_closed_after_their_timeouts() {
    let cluster = node_with(
        &[
            "--request-header-timeout-ms",
            "1000",
            "--idle-timeout-ms",
            "3000",
        ],
        None,
    )
    .await;
    let address = cluster.node(1).api_addr();

    // Says nothing at all.
    let mut silent = TcpStream::connect(&address).await.unwrap();
    let (after, read) = until_closed(&mut silent).await;
    assert!(read.is_empty(), "{read:?}");
    assert!(
        (Duration::from_millis(800)..Duration::from_secs(5)).contains(&after),
        "a silent connection closed after {after:?}"
    );

    // Sends its request head a byte every 100 ms: never whole within the timeout.
    let mut trickle = TcpStream::connect(&address).await.unwrap();
    let start = Instant::now();
    let head = b"GET /healthz HTTP/1.1\r\nhost: baton\r\nx-slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
    let mut closed_after = None;
    for byte in head {
        if trickle.write_all(&[*byte]).await.is_err() {
            closed_after = Some(start.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut probe = [0_u8; 64];
        if let Ok(Ok(0)) =
            tokio::time::timeout(Duration::from_millis(1), trickle.read(&mut probe)).await
        {
            closed_after = Some(start.elapsed());
            break;
        }
    }
    let closed_after = closed_after.expect("a trickled head is never served");
    assert!(
        closed_after < Duration::from_secs(5),
        "a trickling connection closed after {closed_after:?}"
    );

    // One request, then idle on keep-alive: open past the header timeout, closed by the idle
    // timeout.
    let mut idle = TcpStream::connect(&address).await.unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nhost: baton\r\n\r\n")
        .await
        .unwrap();
    let (after, read) = until_closed(&mut idle).await;
    let answer = String::from_utf8_lossy(&read);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        (Duration::from_millis(2_500)..Duration::from_secs(8)).contains(&after),
        "an idle keep-alive connection closed after {after:?}"
    );
}

#[tokio::test]
async fn a_slowloris_flood_never_locks_out_health_checks_or_event_streams() {
    // 256 file descriptors: a cap of 128 connections is what the node derives. The flood
    // opens 300 silent connections, more than the descriptors the node has.
    let cluster = node_with(&[], Some(256)).await;
    let node = cluster.node(1);
    let address = node.api_addr();

    let mut stream = TcpStream::connect(&address).await.unwrap();
    stream
        .write_all(b"GET /v1/events HTTP/1.1\r\nhost: baton\r\naccept: text/event-stream\r\n\r\n")
        .await
        .unwrap();
    let mut buffer = vec![0_u8; 4096];
    let count = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buffer))
        .await
        .expect("the stream's head")
        .unwrap();
    assert!(
        String::from_utf8_lossy(&buffer[..count]).starts_with("HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&buffer[..count])
    );

    let mut flood = Vec::new();
    for _ in 0..300 {
        if let Ok(Ok(connection)) =
            tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(&address)).await
        {
            flood.push(connection);
        }
    }
    assert!(flood.len() >= 128, "opened only {}", flood.len());
    for attempt in 0..10 {
        let status = health(&address, Duration::from_secs(3)).await;
        assert_eq!(
            status.as_deref(),
            Ok("HTTP/1.1 200 OK"),
            "health check {attempt} behind a flood of {} silent connections",
            flood.len()
        );
    }

    // The event stream opened before the flood is still served.
    cluster
        .api()
        .post(
            node,
            "/v1/leases",
            &json!({"resource": "after/the/flood", "holder": "a", "ttl_ms": 30_000}),
        )
        .await
        .expect_status(201);
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut seen = String::new();
    while !seen.contains("after/the/flood") {
        assert!(
            Instant::now() < deadline,
            "the event stream lost its grant: {seen}"
        );
        if let Ok(Ok(count)) =
            tokio::time::timeout(Duration::from_millis(200), stream.read(&mut buffer)).await
        {
            assert!(count > 0, "the event stream was closed: {seen}");
            seen.push_str(&String::from_utf8_lossy(&buffer[..count]));
        }
    }
    assert!(
        !node.log_tail(200).contains("Too many open files"),
        "{}",
        node.log_tail(200)
    );
}
