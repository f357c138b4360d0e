//! `--workload sessions`: `--sessions` sessions on the endpoints, each renewed once per
//! `--period`, spread evenly, for `--seconds`, while a probe client acquires and releases a
//! path in a loop, and `--streams` event streams are read beside them. A keepalive's latency
//! runs from the moment it was due, so a client that falls behind shows it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use baton_client::api::{CreateSessionRequest, CreateSessionResponse};
use futures_util::{stream, StreamExt};
use hyper::StatusCode;

use super::client::{Connections, Http, HttpError};
use super::cycles::cycles_until;
use super::report::{Chart, Figures};
use super::{check_endpoints_and_seconds, percentile_ms, BenchArgs};

/// Sessions created at once while setting up.
const SESSIONS_CREATING: usize = 64;
/// Tries to open one event stream at most.
const STREAM_OPEN_TRIES: usize = 20;
/// Renewals at once while opening the measured connections.
const SETUP_IN_FLIGHT: usize = 512;

/// A session the bench made: the endpoint it talks to and its id.
pub(super) type BenchSession = (String, String);

/// Creates `count` sessions with `ttl_ms`, spread over `endpoints`, in `namespace` (the
/// default one when `None`).
pub(super) async fn create_sessions(
    http: &Http,
    endpoints: &[String],
    count: usize,
    ttl_ms: u64,
    namespace: Option<&str>,
) -> anyhow::Result<Vec<BenchSession>> {
    let created: Vec<anyhow::Result<BenchSession>> = stream::iter(0..count)
        .map(|index| {
            let endpoint = endpoints[index % endpoints.len()].clone();
            let request = CreateSessionRequest {
                holder: format!("bench-{index}"),
                ttl_ms,
                labels: Default::default(),
            };
            async move {
                let answer = http
                    .post(&endpoint, "/v1/sessions", Some(&request), namespace)
                    .await?;
                if !answer.status.is_success() {
                    bail!("creating a session answered {}", answer.status);
                }
                let created: CreateSessionResponse = answer.json()?;
                Ok((endpoint, created.session_id.as_str().to_owned()))
            }
        })
        .buffer_unordered(SESSIONS_CREATING)
        .collect()
        .await;
    created.into_iter().collect()
}

/// Renews every session once, `in_flight` at a time; the number that failed.
pub(super) async fn renew_all(
    http: &Http,
    sessions: &[BenchSession],
    namespace: Option<&str>,
    in_flight: usize,
) -> u64 {
    // Collected first: a closure inside the stream would make the spawned renewers' futures
    // fail the compiler's check that they are Send for every lifetime.
    let renewals: Vec<_> = sessions
        .iter()
        .map(|(endpoint, session)| renew(http, endpoint, session, namespace))
        .collect();
    let renewed: Vec<bool> = stream::iter(renewals)
        .buffer_unordered(in_flight)
        .collect()
        .await;
    let failed = renewed.iter().filter(|renewed| !**renewed).count();
    failed as u64
}

/// One keepalive of `session` at `endpoint`; whether it was answered with success.
async fn renew(http: &Http, endpoint: &str, session: &str, namespace: Option<&str>) -> bool {
    let answer = http
        .post::<()>(
            endpoint,
            &format!("/v1/sessions/{session}/keepalive"),
            None,
            namespace,
        )
        .await;
    answer.is_ok_and(|answer| answer.status.is_success())
}

pub(super) async fn run(args: &BenchArgs) -> anyhow::Result<Figures> {
    check_endpoints_and_seconds(args)?;
    if args.sessions == 0 || args.sessions > 100_000 {
        bail!("give --sessions 1..=100000");
    }
    let http = Http::default();
    let ttl_ms = (args.period * 4).max(Duration::from_secs(10)).as_millis() as u64;
    let setup = Instant::now();
    let sessions = create_sessions(&http, &args.endpoints, args.sessions, ttl_ms, None).await?;
    eprintln!(
        "baton-jepsen bench: {} sessions created in {:.1} s",
        sessions.len(),
        setup.elapsed().as_secs_f64()
    );

    // Each session's client: one shared pool (`pooled:N`, `fresh`) or a pool of its own.
    let connections = args.connections;
    let shared = connections.shared();
    let clients: Vec<Http> = sessions
        .iter()
        .map(|_| connections.client(&shared))
        .collect();
    // The connections the renewals will use, opened before the measurement: a fleet's agents
    // keep theirs open, and one opened while measuring would count in a renewal's latency.
    let warm = match connections {
        Connections::Pooled(busy) => sessions.len().min(busy),
        Connections::PerSession => sessions.len(),
        Connections::Fresh => 0,
    };
    let warmed: Vec<bool> = stream::iter(sessions.iter().zip(&clients).take(warm))
        .map(|((endpoint, session), http)| renew(http, endpoint, session, None))
        .buffer_unordered(SETUP_IN_FLIGHT)
        .collect()
        .await;
    let failed = warmed.iter().filter(|renewed| !**renewed).count();
    if failed > 0 {
        bail!("{failed} of {warm} renewals failed before the measurement");
    }
    if warm > 0 {
        eprintln!(
            "baton-jepsen bench: {warm} connections opened ({connections}) in {:.1} s",
            setup.elapsed().as_secs_f64()
        );
    }

    let streams = open_streams(&args.endpoints, args.streams).await?;
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.seconds);
    let reading: Vec<_> = streams
        .into_iter()
        .map(|stream| tokio::spawn(read_stream(stream, deadline)))
        .collect();
    // The probe is an agent of its own, with its own connection.
    let probe = tokio::spawn(cycles_until(
        Http::default(),
        args.endpoints[0].clone(),
        format!("bench/sessions-probe/{}", std::process::id()),
        deadline,
    ));
    // Renewals pending at most, as many as there are sessions: a server that falls behind makes
    // the bench wait here rather than pile up tasks (and, `fresh`, sockets) without bound.
    let in_flight = Arc::new(tokio::sync::Semaphore::new(sessions.len()));
    // Each renewal's latency with the second of the run it was due in.
    let latencies: Arc<Mutex<Vec<(u64, Duration)>>> = Arc::default();
    let errors = Arc::new(AtomicU64::new(0));
    let spacing = args.period / sessions.len() as u32;
    let mut renewals = Vec::new();
    let mut due = started;
    let mut index = 0usize;
    while due < deadline {
        tokio::time::sleep_until(due.into()).await;
        let permit = in_flight.clone().acquire_owned().await?;
        let (endpoint, session) = sessions[index].clone();
        let http = clients[index].clone();
        let (latencies, errors) = (latencies.clone(), errors.clone());
        let was_due = due;
        let second = due.duration_since(started).as_secs();
        renewals.push(tokio::spawn(async move {
            if renew(&http, &endpoint, &session, None).await {
                let latency = was_due.elapsed();
                latencies.lock().expect("latencies").push((second, latency));
            } else {
                errors.fetch_add(1, Ordering::Relaxed);
            }
            drop(permit);
        }));
        index = (index + 1) % sessions.len();
        due += spacing;
    }
    for renewal in renewals {
        renewal.await.context("a keepalive task")?;
    }
    let probe = probe.await.context("the probe")?;
    let (mut events, mut streams_cut) = (0u64, 0usize);
    for read in reading {
        let (read, cut) = read.await.context("an event stream")?;
        events += read;
        streams_cut += usize::from(cut);
    }
    let timed = std::mem::take(&mut *latencies.lock().expect("latencies"));
    let p99_by_second = p99_by_second(&timed, args.seconds);
    let mut latencies: Vec<Duration> = timed.into_iter().map(|(_, latency)| latency).collect();
    latencies.sort();
    let mut probe_latencies = probe.acquire_latencies;
    probe_latencies.sort();
    let keepalive = |fraction| percentile_ms(&latencies, fraction);
    let errors = errors.load(Ordering::Relaxed);
    let probe_p99 = percentile_ms(&probe_latencies, 0.99);
    println!(
        "sessions {} period {:?} connections {connections}: {} keepalives, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms, {errors} errors; probe acquire p99 {probe_p99:.2} ms ({} cycles, {} errors)",
        sessions.len(),
        args.period,
        latencies.len(),
        keepalive(0.5),
        keepalive(0.99),
        keepalive(1.0),
        probe.cycles,
        probe.errors
    );
    if args.streams > 0 {
        println!(
            "streams {}: {events} events read, {streams_cut} ended before the run did",
            args.streams
        );
    }
    let json = serde_json::json!({
        "workload": "sessions",
        "sessions": sessions.len(),
        "period_ms": args.period.as_millis() as u64,
        "connections": connections.to_string(),
        "seconds": args.seconds,
        "keepalives": latencies.len(),
        "keepalive_p50_ms": keepalive(0.5),
        "keepalive_p99_ms": keepalive(0.99),
        "keepalive_max_ms": keepalive(1.0),
        "keepalive_p99_ms_by_second": p99_by_second,
        "errors": errors,
        "probe_acquire_p99_ms": probe_p99,
        "probe_cycles": probe.cycles,
        "probe_errors": probe.errors,
        "streams": args.streams,
        "stream_events": events,
        "streams_cut": streams_cut,
    });
    let chart = Chart {
        title: format!(
            "{} sessions renewed every {:?}, {connections}: keepalive latency",
            sessions.len(),
            args.period
        ),
        unit: "ms from the moment the renewal was due".to_owned(),
        bars: vec![
            ("p50".to_owned(), keepalive(0.5)),
            ("p99".to_owned(), keepalive(0.99)),
            ("max".to_owned(), keepalive(1.0)),
            ("probe p99".to_owned(), probe_p99),
        ],
    };
    Ok(Figures { json, chart })
}

/// Opens `count` event streams spread over `endpoints`, from the cluster's current revision on:
/// each answered 200 before the measurement starts.
async fn open_streams(
    endpoints: &[String],
    count: usize,
) -> anyhow::Result<Vec<reqwest::Response>> {
    if count == 0 {
        return Ok(Vec::new());
    }
    // One connection per stream, as each watching agent has its own.
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .context("an HTTP client for the streams")?;
    // From the current revision on, as an agent that starts watching the board does: not the
    // whole window of events kept, which would measure 1,000 replays of it.
    let status: baton_client::api::ClusterStatus = client
        .get(format!("{}/v1/cluster", endpoints[0]))
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .context("the cluster's revision")?
        .json()
        .await
        .context("the cluster's revision")?;
    let after = status.revision;
    let opened: Vec<anyhow::Result<reqwest::Response>> = stream::iter(0..count)
        .map(|index| {
            let url = format!(
                "{}/v1/events?after={after}",
                endpoints[index % endpoints.len()]
            );
            let client = client.clone();
            async move {
                // NO_LEADER and overload are answered before anything is streamed: a client
                // opens the stream again, as docs/api.md says to.
                for _ in 0..STREAM_OPEN_TRIES {
                    let answer = client
                        .get(&url)
                        .header("accept", "text/event-stream")
                        .send()
                        .await
                        .with_context(|| format!("opening {url}"))?;
                    match answer.status() {
                        status if status.is_success() => return Ok(answer),
                        StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS => {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        status => bail!("opening {url} answered {status}"),
                    }
                }
                bail!("opening {url} answered 503 or 429 {STREAM_OPEN_TRIES} times")
            }
        })
        .buffer_unordered(SESSIONS_CREATING)
        .collect()
        .await;
    let opened: Vec<reqwest::Response> = opened.into_iter().collect::<anyhow::Result<_>>()?;
    eprintln!("baton-jepsen bench: {count} event streams open");
    Ok(opened)
}

/// Reads `stream` until `deadline`: the events read, and whether it ended first.
async fn read_stream(stream: reqwest::Response, deadline: Instant) -> (u64, bool) {
    let mut chunks = stream.bytes_stream();
    let mut events = 0u64;
    loop {
        match tokio::time::timeout_at(deadline.into(), chunks.next()).await {
            Err(_) => return (events, false),
            Ok(Some(Ok(chunk))) => {
                events += chunk.windows(5).filter(|window| window == b"data:").count() as u64;
            }
            Ok(Some(Err(_)) | None) => return (events, true),
        }
    }
}

/// The keepalive p99 of each second of the run, by the second the renewal was due in: whether
/// a tail is one stall or spread evenly.
fn p99_by_second(timed: &[(u64, Duration)], seconds: u64) -> Vec<f64> {
    let mut by_second: Vec<Vec<Duration>> = vec![Vec::new(); seconds as usize];
    for (second, latency) in timed {
        if let Some(bucket) = by_second.get_mut(*second as usize) {
            bucket.push(*latency);
        }
    }
    by_second
        .into_iter()
        .map(|mut bucket| {
            bucket.sort();
            (percentile_ms(&bucket, 0.99) * 100.0).round() / 100.0
        })
        .collect()
}

/// Leases one session holds at most in the bench's setups (the default limit per session).
pub(super) const LEASES_PER_SESSION: usize = 10_000;

/// Acquires `bench/{n}` for n in `0..count`, lease n held by session `n % sessions.len()`,
/// `in_flight` at a time. `progress` is told every 100,000. Returns the failures by cause (the
/// error code, or the transport error), so that a run that lost some says why, and every
/// acquire's latency.
pub(super) async fn acquire_many(
    http: &Http,
    sessions: &[BenchSession],
    count: usize,
    namespace: Option<&str>,
    in_flight: usize,
    progress: impl Fn(usize),
) -> Fill {
    let done = AtomicU64::new(0);
    let started = Instant::now();
    let outcomes: Vec<(Result<(), String>, Instant, Duration)> = stream::iter(0..count)
        .map(|index| {
            let (endpoint, session) = &sessions[index % sessions.len()];
            let request =
                serde_json::json!({ "resource": format!("bench/{index}"), "session_id": session });
            let (done, progress) = (&done, &progress);
            async move {
                let sent = Instant::now();
                let answer = http
                    .post(endpoint, "/v1/leases", Some(&request), namespace)
                    .await;
                let outcome = match answer {
                    Ok(answer) if answer.status == StatusCode::CREATED => Ok(()),
                    Ok(answer) => {
                        let body: serde_json::Value = answer.json().unwrap_or_default();
                        Err(format!(
                            "{} {}",
                            answer.status.as_u16(),
                            body["code"].as_str().unwrap_or("")
                        ))
                    }
                    Err(HttpError::Timeout) => Err("timeout".to_owned()),
                    Err(HttpError::Connect(_)) => Err("connect".to_owned()),
                    Err(HttpError::Transport(_)) => Err("transport".to_owned()),
                };
                let took = sent.elapsed();
                let finished = done.fetch_add(1, Ordering::Relaxed) + 1;
                if finished % 100_000 == 0 {
                    progress(finished as usize);
                }
                (outcome, sent, took)
            }
        })
        .buffer_unordered(in_flight)
        .collect()
        .await;
    let mut fill = Fill {
        started_ms: wall_ms(),
        ..Fill::default()
    };
    for (outcome, sent, took) in outcomes {
        if let Err(cause) = outcome {
            *fill.failures.by_cause.entry(cause).or_default() += 1;
        }
        fill.latencies.push(took);
        fill.sent.push((sent - started, took));
    }
    fill.latencies.sort_unstable();
    fill
}

/// What `acquire_many` did: the acquires that failed, how long each one took (failed ones
/// too), shortest first, and when each was sent.
#[derive(Debug, Default)]
pub(super) struct Fill {
    pub failures: Failures,
    pub latencies: Vec<Duration>,
    /// The wall clock (ms since the epoch) when the first acquire was sent.
    pub started_ms: i64,
    /// Each acquire: when it was sent, from the first, and how long it took.
    pub sent: Vec<(Duration, Duration)>,
}

impl Fill {
    /// The seconds of wall-clock time (UTC, as the nodes' logs print it) in which acquires
    /// slower than `slow` were sent: how many, and the slowest.
    pub fn slow_seconds(&self, slow: Duration) -> Vec<(String, usize, Duration)> {
        let mut seconds: std::collections::BTreeMap<u64, (usize, Duration)> = Default::default();
        for &(sent, took) in self.sent.iter().filter(|(_, took)| *took > slow) {
            let second = seconds.entry(sent.as_secs()).or_default();
            second.0 += 1;
            second.1 = second.1.max(took);
        }
        seconds
            .into_iter()
            .map(|(second, (count, slowest))| {
                let at = baton_client::api::rfc3339(self.started_ms + 1_000 * second as i64);
                (at[11..19].to_owned(), count, slowest)
            })
            .collect()
    }
}

/// Now, in milliseconds since the Unix epoch.
fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as i64)
}

/// Requests that failed, counted by cause.
#[derive(Debug, Default)]
pub(super) struct Failures {
    pub by_cause: std::collections::BTreeMap<String, u64>,
}

impl Failures {
    pub fn total(&self) -> u64 {
        self.by_cause.values().sum()
    }
}

impl std::fmt::Display for Failures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.by_cause.is_empty() {
            return write!(f, "none failed");
        }
        let causes: Vec<String> = self
            .by_cause
            .iter()
            .map(|(cause, count)| format!("{count} {cause}"))
            .collect();
        write!(f, "{} failed: {}", self.total(), causes.join(", "))
    }
}
