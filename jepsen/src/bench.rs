//! The load tool: N concurrent clients run cycles against the given endpoints for a fixed time,
//! and the tool prints cycles per second and the latency percentiles of the cycle's first call.
//! `--workload leases`: acquire with a new session, keepalive, release, each client on its own
//! resources. `--workload tasks`: claim the next task of a shared queue with the client's
//! session, then complete it with the fence; a producer keeps the queue filled (its enqueues
//! are load too, and are not counted as cycles). Bounded in time and only ever aimed at the
//! endpoints given (loopback in our benchmarks).

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use baton_client::api::{AcquireRequest, ClaimResponse, CreateSessionResponse, Grant, QueueInfo};
use futures_util::StreamExt;

#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Client API endpoints, comma-separated; clients are spread over them.
    #[arg(long, value_delimiter = ',', default_value = "http://127.0.0.1:7420")]
    endpoints: Vec<String>,
    /// Concurrencies to measure, one after the other.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    clients: Vec<usize>,
    /// Seconds to run each concurrency.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// What one cycle is.
    #[arg(long, value_enum, default_value_t = Workload::Leases)]
    workload: Workload,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Workload {
    /// Acquire (creating a session), keepalive, release.
    Leases,
    /// Claim-next with a session, then complete with the fence.
    Tasks,
}

/// Ready tasks the producer keeps in the queue at least, and enqueues at once when below.
const TASKS_READY_MIN: u64 = 1_000;

#[derive(Debug, Default)]
struct ClientResult {
    cycles: u64,
    errors: u64,
    acquire_latencies: Vec<Duration>,
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    if args.endpoints.is_empty()
        || args.clients.is_empty()
        || args.seconds == 0
        || args.seconds > 600
    {
        bail!("give endpoints, clients and 1..=600 seconds");
    }
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .no_proxy()
        .build()?;
    let first_call = match args.workload {
        Workload::Leases => "acquire",
        Workload::Tasks => "claim",
    };
    println!("clients  cycles/s  {first_call}_p50_ms  {first_call}_p99_ms  errors");
    for &clients in &args.clients {
        let queue = format!("bench-{clients}-{}", std::process::id());
        if args.workload == Workload::Tasks {
            enqueue_tasks(&http, &args.endpoints[0], &queue, TASKS_READY_MIN).await?;
        }
        let deadline = Instant::now() + Duration::from_secs(args.seconds);
        let producer = (args.workload == Workload::Tasks).then(|| {
            tokio::spawn(keep_filled(
                http.clone(),
                args.endpoints[0].clone(),
                queue.clone(),
                deadline,
            ))
        });
        let started = Instant::now();
        let mut tasks = Vec::new();
        for client in 0..clients {
            let http = http.clone();
            let endpoint = args.endpoints[client % args.endpoints.len()].clone();
            tasks.push(match args.workload {
                Workload::Leases => tokio::spawn(cycle_until(
                    http,
                    endpoint,
                    format!("bench/{clients}/{client}"),
                    deadline,
                )),
                Workload::Tasks => {
                    tokio::spawn(task_cycles_until(http, endpoint, queue.clone(), deadline))
                }
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
        let percentile = |fraction: f64| {
            let latencies = &total.acquire_latencies;
            if latencies.is_empty() {
                return f64::NAN;
            }
            let index = ((latencies.len() as f64 - 1.0) * fraction).round() as usize;
            latencies[index].as_secs_f64() * 1_000.0
        };
        println!(
            "{clients:>7}  {:>8.0}  {:>14.2}  {:>14.2}  {:>6}",
            total.cycles as f64 / elapsed,
            percentile(0.5),
            percentile(0.99),
            total.errors
        );
    }
    Ok(())
}

async fn cycle_until(
    http: reqwest::Client,
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

/// One acquire (creating a session), keepalive and release.
async fn cycle(
    http: &reqwest::Client,
    endpoint: &str,
    resource: &str,
    result: &mut ClientResult,
) -> anyhow::Result<()> {
    let request = AcquireRequest {
        resource: resource.to_owned(),
        session_id: None,
        holder: Some("bench".to_owned()),
        ttl_ms: Some(30_000),
        mode: Default::default(),
        max_hold_ms: None,
        labels: Default::default(),
        reason: None,
    };
    let started = Instant::now();
    let answer = http
        .post(format!("{endpoint}/v1/leases"))
        .json(&request)
        .send()
        .await?;
    if answer.status() != reqwest::StatusCode::CREATED {
        bail!("acquire answered {}", answer.status());
    }
    let grant: Grant = answer.json().await?;
    result.acquire_latencies.push(started.elapsed());
    let session = grant.session_id.as_str();
    let keepalive = http
        .post(format!("{endpoint}/v1/sessions/{session}/keepalive"))
        .send()
        .await?;
    if !keepalive.status().is_success() {
        bail!("keepalive answered {}", keepalive.status());
    }
    let release = http
        .post(format!("{endpoint}/v1/sessions/{session}/release"))
        .json(&serde_json::json!({ "resource": resource }))
        .send()
        .await?;
    if !release.status().is_success() {
        bail!("release answered {}", release.status());
    }
    Ok(())
}

/// Claims the next task with this client's own session and completes it, until `deadline`.
async fn task_cycles_until(
    http: reqwest::Client,
    endpoint: String,
    queue: String,
    deadline: Instant,
) -> ClientResult {
    let mut result = ClientResult::default();
    let session = http
        .post(format!("{endpoint}/v1/sessions"))
        .json(&serde_json::json!({ "holder": "bench", "ttl_ms": 60_000 }))
        .send()
        .await;
    let session: Option<CreateSessionResponse> = match session {
        Ok(answer) if answer.status().is_success() => answer.json().await.ok(),
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
        .delete(format!("{endpoint}/v1/sessions/{session_id}"))
        .send()
        .await;
    result
}

/// One claim and complete; `false` when the queue was empty.
async fn task_cycle(
    http: &reqwest::Client,
    endpoint: &str,
    queue: &str,
    session_id: &str,
    result: &mut ClientResult,
) -> anyhow::Result<bool> {
    let started = Instant::now();
    let answer = http
        .post(format!("{endpoint}/v1/queues/{queue}/claim"))
        .json(&serde_json::json!({ "session_id": session_id }))
        .send()
        .await?;
    if answer.status() == reqwest::StatusCode::NO_CONTENT {
        return Ok(false);
    }
    if !answer.status().is_success() {
        bail!("claim answered {}", answer.status());
    }
    let claim: ClaimResponse = answer.json().await?;
    result.acquire_latencies.push(started.elapsed());
    let complete = http
        .post(format!(
            "{endpoint}/v1/queues/{queue}/tasks/{}/complete",
            claim.task.id
        ))
        .json(&serde_json::json!({ "session_id": session_id, "fence": claim.fence }))
        .send()
        .await?;
    if !complete.status().is_success() {
        bail!("complete answered {}", complete.status());
    }
    Ok(true)
}

/// Keeps at least `TASKS_READY_MIN` ready tasks in the queue until `deadline`.
async fn keep_filled(
    http: reqwest::Client,
    endpoint: String,
    queue: String,
    deadline: Instant,
) -> anyhow::Result<()> {
    while Instant::now() < deadline {
        let info: QueueInfo = http
            .get(format!("{endpoint}/v1/queues/{queue}"))
            .send()
            .await?
            .json()
            .await?;
        if info.counts.ready < TASKS_READY_MIN {
            enqueue_tasks(&http, &endpoint, &queue, TASKS_READY_MIN).await?;
        } else {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    Ok(())
}

async fn enqueue_tasks(
    http: &reqwest::Client,
    endpoint: &str,
    queue: &str,
    count: u64,
) -> anyhow::Result<()> {
    let url = format!("{endpoint}/v1/queues/{queue}/tasks");
    let enqueues = futures_util::stream::iter(0..count)
        .map(|_| {
            let request = http
                .post(&url)
                .json(&serde_json::json!({ "payload": {} }))
                .send();
            async move { request.await.map(|answer| answer.status()) }
        })
        .buffer_unordered(32);
    let statuses: Vec<_> = enqueues.collect().await;
    for status in statuses {
        let status = status?;
        if status != reqwest::StatusCode::CREATED {
            bail!("enqueue answered {status}");
        }
    }
    Ok(())
}
