//! `--workload leases` and `--workload tasks`: concurrent clients running cycles for
//! `--seconds` at each concurrency of `--clients`; with `--etcd`, each lease measurement is
//! followed by the same one against etcd.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use baton_client::api::{AcquireRequest, ClaimResponse, CreateSessionResponse, Grant, QueueInfo};
use futures_util::StreamExt;
use hyper::StatusCode;

use super::client::Http;
use super::report::{Chart, Figures};
use super::{check_endpoints_and_seconds, etcd, percentile_ms, term, BenchArgs, Workload};

/// Ready tasks the producer keeps in the queue at least, and enqueues at once when below.
const TASKS_READY_MIN: u64 = 1_000;

/// What one client did.
#[derive(Debug, Default)]
pub(super) struct ClientResult {
    pub cycles: u64,
    pub errors: u64,
    /// The latency of each cycle's first step: acquire, claim (Baton), or grant + put (etcd).
    pub acquire_latencies: Vec<Duration>,
}

/// Which system a measurement ran against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum System {
    Baton,
    Etcd,
}

/// One concurrency's figures.
#[derive(Debug)]
struct Row {
    system: System,
    clients: usize,
    cycles_per_second: f64,
    p50_ms: f64,
    p99_ms: f64,
    errors: u64,
    /// Term changes during the measurement (Baton only).
    elections: Option<u64>,
}

pub(super) async fn run(args: &BenchArgs) -> anyhow::Result<Figures> {
    check_endpoints_and_seconds(args)?;
    if args.clients.is_empty()
        || args
            .clients
            .iter()
            .any(|&clients| clients == 0 || clients > 4_096)
    {
        bail!("give --clients as counts of 1..=4096");
    }
    let fdatasync = match &args.fsync_probe {
        Some(dir) => {
            let p50 = super::probe::fdatasync_p50(dir)?;
            println!(
                "fdatasync of a {}-byte write under {}: p50 {} us",
                super::probe::RECORD_BYTES,
                dir.display(),
                p50.as_micros()
            );
            Some(p50)
        }
        None => None,
    };
    let http = Http::default();
    let first_call = match args.workload {
        Workload::Tasks => "claim",
        _ => "acquire",
    };
    println!(
        "system  clients  cycles/s  {first_call}_p50_ms  {first_call}_p99_ms  errors  elections"
    );
    let mut rows = Vec::new();
    for &clients in &args.clients {
        rows.push(measure(args, &http, System::Baton, clients).await?);
        if !args.etcd.is_empty() {
            rows.push(measure(args, &http, System::Etcd, clients).await?);
        }
    }
    let ratios: Vec<(usize, f64)> = args
        .clients
        .iter()
        .filter_map(|&clients| {
            let of = |system| {
                rows.iter()
                    .find(|row| row.system == system && row.clients == clients)
                    .map(|row| row.cycles_per_second)
            };
            Some((clients, of(System::Baton)? / of(System::Etcd)?))
        })
        .collect();
    for (clients, ratio) in &ratios {
        println!("ratio at {clients} clients: Baton {ratio:.2}x etcd's cycles/s");
    }
    let name = |system| match system {
        System::Baton => "baton",
        System::Etcd => "etcd",
    };
    let json = serde_json::json!({
        "workload": args.workload.name(),
        "seconds": args.seconds,
        "first_call": first_call,
        "fdatasync_p50_us": fdatasync.map(|p50| p50.as_micros() as u64),
        "rows": rows.iter().map(|row| serde_json::json!({
            "system": name(row.system),
            "clients": row.clients,
            "cycles_per_second": row.cycles_per_second.round(),
            "p50_ms": row.p50_ms,
            "p99_ms": row.p99_ms,
            "errors": row.errors,
            "elections": row.elections,
        })).collect::<Vec<_>>(),
        "ratios": ratios.iter().map(|(clients, ratio)| serde_json::json!({
            "clients": clients, "baton_over_etcd": ratio,
        })).collect::<Vec<_>>(),
    });
    let chart = Chart {
        title: format!("{} cycles per second by clients", args.workload.name()),
        unit: "cycles/s".to_owned(),
        bars: rows
            .iter()
            .map(|row| {
                (
                    format!("{} {}", name(row.system), row.clients),
                    row.cycles_per_second,
                )
            })
            .collect(),
    };
    Ok(Figures { json, chart })
}

/// Runs `clients` clients against `system` for `--seconds` and prints the row.
async fn measure(
    args: &BenchArgs,
    http: &Http,
    system: System,
    clients: usize,
) -> anyhow::Result<Row> {
    let endpoints = match system {
        System::Baton => &args.endpoints,
        System::Etcd => &args.etcd,
    };
    let queue = format!("bench-{clients}-{}", std::process::id());
    if args.workload == Workload::Tasks {
        enqueue_tasks(http, &endpoints[0], &queue, TASKS_READY_MIN).await?;
    }
    let term_before = match system {
        System::Baton => Some(term(http, &endpoints[0]).await?),
        System::Etcd => None,
    };
    let deadline = Instant::now() + Duration::from_secs(args.seconds);
    let producer = (args.workload == Workload::Tasks).then(|| {
        tokio::spawn(keep_filled(
            http.clone(),
            endpoints[0].clone(),
            queue.clone(),
            deadline,
        ))
    });
    // The clients' connections (`--connections`); `http` stays the setup's.
    let load = args.connections.shared();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for client in 0..clients {
        let http = args.connections.client(&load);
        let endpoint = endpoints[client % endpoints.len()].clone();
        let prefix = format!("bench/{}/{clients}/{client}", std::process::id());
        tasks.push(match (system, args.workload) {
            (System::Etcd, _) => tokio::spawn(etcd::cycles_until(http, endpoint, prefix, deadline)),
            (System::Baton, Workload::Tasks) => {
                tokio::spawn(task_cycles_until(http, endpoint, queue.clone(), deadline))
            }
            (System::Baton, _) => tokio::spawn(cycles_until(http, endpoint, prefix, deadline)),
        });
    }
    let mut total = ClientResult::default();
    for task in tasks {
        let result = task.await.context("client task")?;
        total.cycles += result.cycles;
        total.errors += result.errors;
        total.acquire_latencies.extend(result.acquire_latencies);
    }
    let elapsed = started.elapsed().as_secs_f64();
    if let Some(producer) = producer {
        producer.await.context("producer task")??;
    }
    total.acquire_latencies.sort();
    let elections = match term_before {
        Some(before) => Some(term(http, &endpoints[0]).await? - before),
        None => None,
    };
    let row = Row {
        system,
        clients,
        cycles_per_second: total.cycles as f64 / elapsed,
        p50_ms: percentile_ms(&total.acquire_latencies, 0.5),
        p99_ms: percentile_ms(&total.acquire_latencies, 0.99),
        errors: total.errors,
        elections,
    };
    println!(
        "{:<6}  {clients:>7}  {:>8.0}  {:>14.2}  {:>14.2}  {:>6}  {:>9}",
        match system {
            System::Baton => "baton",
            System::Etcd => "etcd",
        },
        row.cycles_per_second,
        row.p50_ms,
        row.p99_ms,
        row.errors,
        elections.map_or("-".to_owned(), |elections| elections.to_string())
    );
    Ok(row)
}

/// Runs lease cycles on resources `{resource_prefix}/{n}` until `deadline`.
pub(super) async fn cycles_until(
    http: Http,
    endpoint: String,
    resource_prefix: String,
    deadline: Instant,
) -> ClientResult {
    let mut result = ClientResult::default();
    let mut sequence = 0u64;
    while Instant::now() < deadline {
        sequence += 1;
        match cycle(
            &http,
            &endpoint,
            &format!("{resource_prefix}/{sequence}"),
            &mut result,
        )
        .await
        {
            Ok(()) => result.cycles += 1,
            Err(_) => result.errors += 1,
        }
    }
    result
}

/// One acquire (creating a session), keepalive, and the session's end.
pub(super) async fn cycle(
    http: &Http,
    endpoint: &str,
    resource: &str,
    result: &mut ClientResult,
) -> anyhow::Result<()> {
    let request = AcquireRequest {
        limit: None,
        resource: resource.to_owned(),
        session_id: None,
        holder: Some("bench".to_owned()),
        ttl_ms: Some(30_000),
        mode: Default::default(),
        max_hold_ms: None,
        labels: Default::default(),
        reason: None,
        wait_ms: None,
    };
    let started = Instant::now();
    let answer = http
        .post(endpoint, "/v1/leases", Some(&request), None)
        .await?;
    if answer.status != StatusCode::CREATED {
        bail!("acquire answered {}", answer.status);
    }
    let grant: Grant = answer.json()?;
    result.acquire_latencies.push(started.elapsed());
    let session = grant.session_id.as_str();
    let keepalive = http
        .post::<()>(
            endpoint,
            &format!("/v1/sessions/{session}/keepalive"),
            None,
            None,
        )
        .await?;
    if !keepalive.status.is_success() {
        bail!("keepalive answered {}", keepalive.status);
    }
    // Ending the session releases the lease and leaves nothing behind, as etcd's cycle revokes
    // its lease: a released lease's session would otherwise live on until its TTL and cost the
    // cluster a sweep later, work etcd's cycle does not have.
    let ended = http
        .delete(endpoint, &format!("/v1/sessions/{session}"))
        .await?;
    if !ended.status.is_success() {
        bail!("ending the session answered {}", ended.status);
    }
    Ok(())
}

/// Claims the next task with this client's own session and completes it, until `deadline`.
async fn task_cycles_until(
    http: Http,
    endpoint: String,
    queue: String,
    deadline: Instant,
) -> ClientResult {
    let mut result = ClientResult::default();
    let session = http
        .post(
            &endpoint,
            "/v1/sessions",
            Some(&serde_json::json!({ "holder": "bench", "ttl_ms": 60_000 })),
            None,
        )
        .await;
    let session: Option<CreateSessionResponse> = match session {
        Ok(answer) if answer.status.is_success() => answer.json().ok(),
        _ => None,
    };
    let Some(session) = session else {
        result.errors += 1;
        return result;
    };
    let session_id = session.session_id.as_str();
    while Instant::now() < deadline {
        match task_cycle(&http, &endpoint, &queue, session_id, &mut result).await {
            Ok(true) => result.cycles += 1,
            Ok(false) => tokio::time::sleep(Duration::from_millis(2)).await,
            Err(_) => result.errors += 1,
        }
    }
    let _ = http
        .delete(&endpoint, &format!("/v1/sessions/{session_id}"))
        .await;
    result
}

/// One claim and complete; `false` when the queue was empty.
async fn task_cycle(
    http: &Http,
    endpoint: &str,
    queue: &str,
    session_id: &str,
    result: &mut ClientResult,
) -> anyhow::Result<bool> {
    let started = Instant::now();
    let answer = http
        .post(
            endpoint,
            &format!("/v1/queues/{queue}/claim"),
            Some(&serde_json::json!({ "session_id": session_id })),
            None,
        )
        .await?;
    if answer.status == StatusCode::NO_CONTENT {
        return Ok(false);
    }
    if !answer.status.is_success() {
        bail!("claim answered {}", answer.status);
    }
    let claim: ClaimResponse = answer.json()?;
    result.acquire_latencies.push(started.elapsed());
    let complete = http
        .post(
            endpoint,
            &format!("/v1/queues/{queue}/tasks/{}/complete", claim.task.id),
            Some(&serde_json::json!({ "session_id": session_id, "fence": claim.fence })),
            None,
        )
        .await?;
    if !complete.status.is_success() {
        bail!("complete answered {}", complete.status);
    }
    Ok(true)
}

/// Keeps at least `TASKS_READY_MIN` ready tasks in the queue until `deadline`.
async fn keep_filled(
    http: Http,
    endpoint: String,
    queue: String,
    deadline: Instant,
) -> anyhow::Result<()> {
    while Instant::now() < deadline {
        let info: QueueInfo = http
            .get(&endpoint, &format!("/v1/queues/{queue}"), None)
            .await?
            .json()?;
        if info.counts.ready < TASKS_READY_MIN {
            enqueue_tasks(&http, &endpoint, &queue, TASKS_READY_MIN).await?;
        } else {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    Ok(())
}

async fn enqueue_tasks(http: &Http, endpoint: &str, queue: &str, count: u64) -> anyhow::Result<()> {
    let path = format!("/v1/queues/{queue}/tasks");
    let enqueues = futures_util::stream::iter(0..count)
        .map(|_| async {
            http.post(
                endpoint,
                &path,
                Some(&serde_json::json!({ "payload": {} })),
                None,
            )
            .await
            .map(|answer| answer.status)
        })
        .buffer_unordered(32);
    let statuses: Vec<_> = enqueues.collect().await;
    for status in statuses {
        let status = status?;
        if status != StatusCode::CREATED {
            bail!("enqueue answered {status}");
        }
    }
    Ok(())
}
