//! The load tool: N concurrent clients each run lease cycles (acquire with a new session,
//! keepalive, release) on their own resources against the given endpoints for a fixed time,
//! and the tool prints cycles per second and acquire latency percentiles. Bounded in time and
//! only ever aimed at the endpoints given (loopback in our benchmarks).

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use baton_client::api::{AcquireRequest, Grant};

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
}

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
    println!("clients  cycles/s  acquire_p50_ms  acquire_p99_ms  errors");
    for &clients in &args.clients {
        let deadline = Instant::now() + Duration::from_secs(args.seconds);
        let started = Instant::now();
        let mut tasks = Vec::new();
        for client in 0..clients {
            let http = http.clone();
            let endpoint = args.endpoints[client % args.endpoints.len()].clone();
            tasks.push(tokio::spawn(cycle_until(
                http,
                endpoint,
                format!("bench/{clients}/{client}"),
                deadline,
            )));
        }
        let mut total = ClientResult::default();
        for task in tasks {
            let result = task.await.context("client task")?;
            total.cycles += result.cycles;
            total.errors += result.errors;
            total.acquire_latencies.extend(result.acquire_latencies);
        }
        let elapsed = started.elapsed().as_secs_f64();
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
