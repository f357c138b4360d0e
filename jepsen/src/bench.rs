//! The load tool: N concurrent clients run cycles against the given endpoints for a fixed time,
//! and the tool prints cycles per second and the latency percentiles of the cycle's first call.
//! `--workload leases`: acquire with a new session, keepalive, release, each client on its own
//! resources. `--workload tasks`: claim the next task of a shared queue with the client's
//! session, then complete it with the fence; a producer keeps the queue filled (its enqueues
//! are load too, and are not counted as cycles). Bounded in time and only ever aimed at the
//! endpoints given (loopback in our benchmarks). `--workload failover` is the exception: it
//! starts its own three `batond` processes with batond's default flags, keeps one writer
//! putting a key through the client library (which knows all three endpoints), SIGKILLs the
//! leader, measures the writer's gap, restarts the node, and repeats. `--workload sessions`
//! holds `--sessions` sessions on the endpoints, each renewed once per `--period`, spread
//! evenly, for `--seconds`, while a probe client acquires and releases a path in a loop.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
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
    /// `sessions`: how many sessions to keep alive.
    #[arg(long, default_value_t = 10_000)]
    sessions: usize,
    /// `sessions`: how often each session is renewed, e.g. `3s` or `500ms`.
    #[arg(long, default_value = "3s", value_parser = parse_period)]
    period: Duration,
    /// `failover`: how many leader kills.
    #[arg(long, default_value_t = 10)]
    repeat: usize,
    /// `failover`: the batond binary (default: next to this one, then on PATH).
    #[arg(long)]
    batond: Option<PathBuf>,
    /// `failover`: where the nodes' data, logs and `failover.json` go; must be new or empty
    /// (default: a new directory under the system's temporary directory).
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Workload {
    /// Acquire (creating a session), keepalive, release.
    Leases,
    /// Claim-next with a session, then complete with the fence.
    Tasks,
    /// A leader SIGKILLed under a steady writer, `--repeat` times: the writer's gap.
    Failover,
    /// `--sessions` sessions each renewed once per `--period`, and a probe's acquire latency.
    Sessions,
}

/// `3s`, `500ms`: a period of 10 ms..=60 s.
fn parse_period(text: &str) -> Result<Duration, String> {
    let (digits, unit) = match text.strip_suffix("ms") {
        Some(digits) => (digits, 1),
        None => (text.strip_suffix('s').unwrap_or(text), 1_000),
    };
    let value: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a period like 3s or 500ms"))?;
    let period = Duration::from_millis(value.saturating_mul(unit));
    if period < Duration::from_millis(10) || period > Duration::from_secs(60) {
        return Err(format!("the period must be 10ms..=60s, got {text}"));
    }
    Ok(period)
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
    if args.workload == Workload::Failover {
        return failover(&args).await;
    }
    if args.workload == Workload::Sessions {
        return sessions(&args).await;
    }
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
        Workload::Failover | Workload::Sessions => unreachable!("returned above"),
    };
    println!("clients  cycles/s  {first_call}_p50_ms  {first_call}_p99_ms  errors  elections");
    for &clients in &args.clients {
        let queue = format!("bench-{clients}-{}", std::process::id());
        if args.workload == Workload::Tasks {
            enqueue_tasks(&http, &args.endpoints[0], &queue, TASKS_READY_MIN).await?;
        }
        let term_before = term(&http, &args.endpoints[0]).await?;
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
                Workload::Failover | Workload::Sessions => unreachable!("returned above"),
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
        let percentile = |fraction: f64| percentile_ms(&total.acquire_latencies, fraction);
        let elections = term(&http, &args.endpoints[0]).await? - term_before;
        println!(
            "{clients:>7}  {:>8.0}  {:>14.2}  {:>14.2}  {:>6}  {elections:>9}",
            total.cycles as f64 / elapsed,
            percentile(0.5),
            percentile(0.99),
            total.errors
        );
    }
    Ok(())
}

/// The `fraction` percentile of `sorted` latencies (nearest rank), in milliseconds; NaN when
/// there are none.
fn percentile_ms(sorted: &[Duration], fraction: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let index = ((sorted.len() as f64 - 1.0) * fraction).round() as usize;
    sorted[index].as_secs_f64() * 1_000.0
}

/// The Raft term `endpoint` reports (`GET /v1/cluster`): how many elections a run caused is
/// the difference.
async fn term(http: &reqwest::Client, endpoint: &str) -> anyhow::Result<u64> {
    let status: serde_json::Value = http
        .get(format!("{endpoint}/v1/cluster"))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    status["term"]
        .as_u64()
        .context("GET /v1/cluster answered without a term")
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

/// Keepalives in flight at most; a renewal due while all are busy waits, and its wait counts
/// in its latency.
const SESSIONS_IN_FLIGHT_MAX: usize = 512;
/// Sessions created at once while setting up.
const SESSIONS_CREATING: usize = 64;

/// `--workload sessions`: see the module docs. A keepalive's latency runs from the moment it
/// was due, so a client that falls behind shows it.
async fn sessions(args: &BenchArgs) -> anyhow::Result<()> {
    use baton_client::api::CreateSessionRequest;
    use futures_util::stream;

    if args.endpoints.is_empty() || args.seconds == 0 || args.seconds > 600 {
        bail!("give endpoints and 1..=600 seconds");
    }
    if args.sessions == 0 || args.sessions > 100_000 {
        bail!("give --sessions 1..=100000");
    }
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .no_proxy()
        .build()?;
    let ttl_ms = (args.period * 4).max(Duration::from_secs(10)).as_millis() as u64;
    let setup = Instant::now();
    let created: Vec<anyhow::Result<(String, String)>> = stream::iter(0..args.sessions)
        .map(|index| {
            let http = http.clone();
            let endpoint = args.endpoints[index % args.endpoints.len()].clone();
            async move {
                let body = CreateSessionRequest {
                    holder: format!("bench-{index}"),
                    ttl_ms,
                    labels: Default::default(),
                };
                let answer = http
                    .post(format!("{endpoint}/v1/sessions"))
                    .json(&body)
                    .send()
                    .await?
                    .error_for_status()?;
                let created: CreateSessionResponse = answer.json().await?;
                Ok((endpoint, created.session_id.as_str().to_owned()))
            }
        })
        .buffer_unordered(SESSIONS_CREATING)
        .collect()
        .await;
    let sessions: Vec<(String, String)> = created.into_iter().collect::<anyhow::Result<_>>()?;
    eprintln!(
        "baton-jepsen bench: {} sessions created in {:.1} s",
        sessions.len(),
        setup.elapsed().as_secs_f64()
    );

    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.seconds);
    let probe = tokio::spawn(cycle_until(
        http.clone(),
        args.endpoints[0].clone(),
        format!("bench/sessions-probe/{}", std::process::id()),
        deadline,
    ));
    let in_flight = Arc::new(tokio::sync::Semaphore::new(SESSIONS_IN_FLIGHT_MAX));
    let latencies: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let errors = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let spacing = args.period / sessions.len() as u32;
    let mut renewals = Vec::new();
    let mut due = started;
    let mut index = 0usize;
    while due < deadline {
        tokio::time::sleep_until(due.into()).await;
        let permit = in_flight.clone().acquire_owned().await?;
        let (endpoint, session) = sessions[index].clone();
        let (http, latencies, errors) = (http.clone(), latencies.clone(), errors.clone());
        let was_due = due;
        renewals.push(tokio::spawn(async move {
            let answer = http
                .post(format!("{endpoint}/v1/sessions/{session}/keepalive"))
                .send()
                .await;
            let ok = answer.is_ok_and(|answer| answer.status().is_success());
            if ok {
                latencies.lock().expect("latencies").push(was_due.elapsed());
            } else {
                errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
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
    let mut latencies = std::mem::take(&mut *latencies.lock().expect("latencies"));
    latencies.sort();
    let mut probe_latencies = probe.acquire_latencies;
    probe_latencies.sort();
    println!(
        "sessions {} period {:?}: {} keepalives, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms, {} errors; probe acquire p99 {:.2} ms ({} cycles, {} errors)",
        sessions.len(),
        args.period,
        latencies.len(),
        percentile_ms(&latencies, 0.5),
        percentile_ms(&latencies, 0.99),
        percentile_ms(&latencies, 1.0),
        errors.load(std::sync::atomic::Ordering::Relaxed),
        percentile_ms(&probe_latencies, 0.99),
        probe.cycles,
        probe.errors
    );
    Ok(())
}

/// A steady writer's view of each write: when it was sent, when it ended, whether it was
/// acknowledged.
type Writes = Arc<Mutex<Vec<(Instant, Instant, bool)>>>;

/// How long the cluster runs undisturbed before each kill, and after a restart.
const FAILOVER_SETTLE: Duration = Duration::from_secs(3);
/// The longest a failover may take before the run gives up on it.
const FAILOVER_GAP_MAX: Duration = Duration::from_secs(30);

/// `--workload failover`: see the module docs. The gap of one kill is the time between the
/// writer's last acknowledged write before the kill and the acknowledgement of its first
/// write sent after the kill (an answer already on its way when the leader died says nothing
/// about the failover).
async fn failover(args: &BenchArgs) -> anyhow::Result<()> {
    use crate::cluster::{find_batond, Cluster, ClusterConfig, Readiness};

    if args.repeat == 0 || args.repeat > 100 {
        bail!("give --repeat 1..=100");
    }
    let batond = find_batond(args.batond.as_deref())?;
    let run_dir = match &args.out {
        Some(out) => out.clone(),
        None => std::env::temp_dir().join(format!("baton-failover-{}", std::process::id())),
    };
    if std::fs::read_dir(&run_dir).is_ok_and(|mut entries| entries.next().is_some()) {
        bail!(
            "{} is not empty: give a new --out (the nodes start from empty data directories)",
            run_dir.display()
        );
    }
    std::fs::create_dir_all(&run_dir)?;
    let guard = Cluster::start(ClusterConfig {
        batond,
        run_dir: run_dir.clone(),
        heartbeat_ms: None,
        election_timeout_ms: None,
        tick_ms: None,
        clock_control: false,
        net: crate::net::NetChoice::Auto,
        snapshot_log_entries: None,
    })
    .await?;
    let cluster = guard.0.clone();
    let endpoints: Vec<String> = cluster
        .ids()
        .iter()
        .map(|id| format!("http://{}", cluster.node(*id).api))
        .collect();
    let client = baton_client::Client::builder(endpoints.iter().map(String::as_str))
        .holder("bench-failover")
        .build()?;
    let writes: Writes = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (writes, stop) = (writes.clone(), stop.clone());
        tokio::spawn(async move {
            let mut sequence = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                sequence += 1;
                let sent = Instant::now();
                let ok = client
                    .kv_put("bench/failover", serde_json::Value::from(sequence))
                    .await
                    .is_ok();
                writes
                    .lock()
                    .expect("writes")
                    .push((sent, Instant::now(), ok));
                if !ok {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        })
    };
    let mut gaps: Vec<Duration> = Vec::new();
    println!("kill  leader  gap_ms");
    for kill in 1..=args.repeat {
        tokio::time::sleep(FAILOVER_SETTLE).await;
        let leader = cluster
            .leader()
            .await
            .context("no leader to kill: the cluster is not settled")?;
        let killed_at = Instant::now();
        cluster.kill(leader);
        let gap = loop {
            if let Some(gap) = write_gap(&writes, killed_at) {
                break gap;
            }
            if killed_at.elapsed() > FAILOVER_GAP_MAX {
                bail!("no write was acknowledged within {FAILOVER_GAP_MAX:?} of killing node {leader}");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        println!("{kill:>4}  {leader:>6}  {:>6}", gap.as_millis());
        gaps.push(gap);
        cluster
            .restart(leader, Readiness::Ready)
            .await
            .map_err(|failure| anyhow::anyhow!("{}: {}", failure.kind(), failure.cause))?;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.await.context("the writer")?;
    let mut sorted = gaps.clone();
    sorted.sort();
    let (median, max) = (percentile_ms(&sorted, 0.5), percentile_ms(&sorted, 1.0));
    let (acknowledged, failed) = {
        let writes = writes.lock().expect("writes");
        let acknowledged = writes.iter().filter(|(_, _, ok)| *ok).count();
        (acknowledged, writes.len() - acknowledged)
    };
    println!(
        "failover: {} leader kills, write gap median {median:.0} ms, max {max:.0} ms; {acknowledged} writes acknowledged, {failed} failed",
        gaps.len(),
    );
    let report = serde_json::json!({
        "workload": "failover",
        "kills": gaps.len(),
        "gaps_ms": gaps.iter().map(|gap| gap.as_millis() as u64).collect::<Vec<_>>(),
        "median_ms": median.round() as u64,
        "max_ms": max.round() as u64,
        "writes_acknowledged": acknowledged,
        "writes_failed": failed,
    });
    std::fs::write(
        run_dir.join("failover.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    drop(guard);
    Ok(())
}

/// The gap around `killed_at`: from the last acknowledged write that ended before it to the
/// end of the first acknowledged write sent after it; `None` until there is one.
fn write_gap(writes: &Writes, killed_at: Instant) -> Option<Duration> {
    let writes = writes.lock().expect("writes");
    let last_before = writes
        .iter()
        .rev()
        .find(|(_, ended, ok)| *ok && *ended <= killed_at)
        .map(|(_, ended, _)| *ended)?;
    let first_after = writes
        .iter()
        .find(|(sent, _, ok)| *ok && *sent > killed_at)
        .map(|(_, ended, _)| *ended)?;
    Some(first_after - last_before)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periods_are_seconds_or_milliseconds_within_bounds() {
        assert_eq!(parse_period("3s"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_period("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_period("2"), Ok(Duration::from_secs(2)));
        for refused in ["", "3m", "5ms", "61s", "-1s", "s"] {
            assert!(parse_period(refused).is_err(), "{refused:?} was taken");
        }
    }

    #[test]
    fn the_gap_runs_to_the_first_write_sent_after_the_kill() {
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let writes: Writes = Arc::new(Mutex::new(vec![
            (at(0), at(10), true),
            (at(10), at(20), true),
            // In flight when the leader died at 25 ms: its answer says nothing of the failover.
            (at(20), at(26), true),
            (at(26), at(400), false),
        ]));
        assert_eq!(
            write_gap(&writes, at(25)),
            None,
            "no write sent after the kill is acknowledged yet"
        );
        writes.lock().unwrap().push((at(400), at(700), true));
        assert_eq!(write_gap(&writes, at(25)), Some(Duration::from_millis(680)));
    }
}
