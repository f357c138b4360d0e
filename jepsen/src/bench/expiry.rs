//! `--workload expiry`: `--leases` leases in a namespace of their own, held by sessions that
//! are all renewed one last time and then left to expire together. A probe client runs lease
//! cycles (in the default namespace) from before the deadline to well after it; the bench
//! reports when the leases were gone and the probe's latency around the deadline.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use super::client::Http;
use super::cycles::{cycle, ClientResult};
use super::report::{Chart, Figures};
use super::sessions::{acquire_many, create_sessions, renew_all, LEASES_PER_SESSION};
use super::{check_endpoints_and_seconds, percentile_ms, BenchArgs};

/// The sessions' TTL: long enough to outlast the final renewal of all of them.
const TTL: Duration = Duration::from_secs(10);
/// How often the sessions are renewed while their leases are acquired.
const RENEW_EVERY: Duration = Duration::from_secs(2);
/// The probe runs this long after the deadline.
const PROBE_AFTER: Duration = Duration::from_secs(5);
/// The chart's buckets of probe latency, around the deadline.
const BUCKET: Duration = Duration::from_millis(500);
/// Requests in flight while setting up.
const SETUP_IN_FLIGHT: usize = 128;

pub(super) async fn run(args: &BenchArgs) -> anyhow::Result<Figures> {
    check_endpoints_and_seconds(args)?;
    let leases = args.leases.unwrap_or(100_000);
    if leases == 0 || leases > 1_000_000 {
        bail!("give --leases 1..=1000000");
    }
    let http = Http::default();
    let namespace = format!("bench-expiry-{}", std::process::id());
    let session_count = leases.div_ceil(LEASES_PER_SESSION);
    let sessions = create_sessions(
        &http,
        &args.endpoints,
        session_count,
        TTL.as_millis() as u64,
        Some(&namespace),
    )
    .await?;
    let setup = Instant::now();
    let renewer = {
        let (http, sessions, namespace) = (http.clone(), sessions.clone(), namespace.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(RENEW_EVERY).await;
                renew_all(&http, &sessions, Some(&namespace), SETUP_IN_FLIGHT).await;
            }
        })
    };
    let failures = acquire_many(
        &http,
        &sessions,
        leases,
        Some(&namespace),
        SETUP_IN_FLIGHT,
        |done| eprintln!("baton-jepsen bench: {done} leases acquired"),
    )
    .await
    .failures;
    let failed = failures.total();
    renewer.abort();
    eprintln!(
        "baton-jepsen bench: {} leases in {} sessions acquired in {:.1} s ({failures})",
        leases as u64 - failed,
        sessions.len(),
        setup.elapsed().as_secs_f64()
    );
    // The last renewal: every session's deadline is within this call's span of `TTL` later.
    let last_renewal = Instant::now();
    let renew_failed = renew_all(&http, &sessions, Some(&namespace), SETUP_IN_FLIGHT).await;
    if renew_failed > 0 {
        bail!("{renew_failed} sessions could not be renewed before the expiry");
    }
    let deadline = Instant::now() + TTL;
    eprintln!(
        "baton-jepsen bench: last renewal took {} ms; the leases expire in {} s",
        last_renewal.elapsed().as_millis(),
        TTL.as_secs()
    );
    let probe = tokio::spawn(probe(
        http.clone(),
        args.endpoints[0].clone(),
        deadline + PROBE_AFTER,
    ));
    let gone = gone_after(&http, &args.endpoints[0], &namespace, deadline).await?;
    let samples = probe.await.context("the probe")?;

    let relative = |at: Instant| {
        at.saturating_duration_since(deadline).as_secs_f64() * 1_000.0
            - deadline.saturating_duration_since(at).as_secs_f64() * 1_000.0
    };
    let window_start = deadline - BUCKET;
    let window_end = deadline + gone.unwrap_or(PROBE_AFTER) + Duration::from_secs(1);
    let mut before: Vec<Duration> = samples
        .iter()
        .filter(|(at, _)| *at < window_start)
        .map(|(_, latency)| *latency)
        .collect();
    let mut around: Vec<Duration> = samples
        .iter()
        .filter(|(at, _)| *at >= window_start && *at < window_end)
        .map(|(_, latency)| *latency)
        .collect();
    before.sort();
    around.sort();
    let gone_ms = gone.map(|gone| gone.as_millis() as u64);
    println!(
        "expiry {} leases: gone {} after the deadline; probe acquire p99 {:.2} ms before, {:.2} ms around it (max {:.2} ms, {} cycles)",
        leases as u64 - failed,
        gone_ms.map_or("not yet, 5 s".to_owned(), |ms| format!("{ms} ms")),
        percentile_ms(&before, 0.99),
        percentile_ms(&around, 0.99),
        percentile_ms(&around, 1.0),
        samples.len()
    );
    let mut bars = Vec::new();
    let mut bucket_start = deadline.checked_sub(BUCKET * 6).unwrap_or(deadline);
    while bucket_start < deadline + PROBE_AFTER {
        let mut bucket: Vec<Duration> = samples
            .iter()
            .filter(|(at, _)| *at >= bucket_start && *at < bucket_start + BUCKET)
            .map(|(_, latency)| *latency)
            .collect();
        bucket.sort();
        bars.push((
            format!("{:+.1}s", relative(bucket_start) / 1_000.0),
            percentile_ms(&bucket, 0.99),
        ));
        bucket_start += BUCKET;
    }
    let json = serde_json::json!({
        "workload": "expiry",
        "leases": leases as u64 - failed,
        "acquire_failed": failures.by_cause,
        "sessions": sessions.len(),
        "gone_after_deadline_ms": gone_ms,
        "probe_p99_before_ms": percentile_ms(&before, 0.99),
        "probe_p99_around_ms": percentile_ms(&around, 0.99),
        "probe_max_around_ms": percentile_ms(&around, 1.0),
        "probe_cycles": samples.len(),
        "probe_p99_ms_by_bucket": bars.iter().map(|(label, p99)| serde_json::json!({ "from": label, "p99_ms": p99 })).collect::<Vec<_>>(),
    });
    let chart = Chart {
        title: format!(
            "probe acquire p99 per {} ms around the expiry of {} leases",
            BUCKET.as_millis(),
            leases as u64 - failed
        ),
        unit: "ms; labels are seconds from the deadline".to_owned(),
        bars,
    };
    Ok(Figures { json, chart })
}

/// Lease cycles until `until`, each as (when it started, its acquire latency).
async fn probe(http: Http, endpoint: String, until: Instant) -> Vec<(Instant, Duration)> {
    let mut samples = Vec::new();
    let mut result = ClientResult::default();
    let prefix = format!("bench/expiry-probe/{}", std::process::id());
    let mut sequence = 0u64;
    while Instant::now() < until {
        sequence += 1;
        let started = Instant::now();
        if cycle(
            &http,
            &endpoint,
            &format!("{prefix}/{sequence}"),
            &mut result,
        )
        .await
        .is_ok()
        {
            if let Some(latency) = result.acquire_latencies.pop() {
                samples.push((started, latency));
            }
        }
    }
    samples
}

/// How long after `deadline` the namespace had no lease left, polling every 20 ms from the
/// deadline on; `None` if some were still there `PROBE_AFTER` later.
async fn gone_after(
    http: &Http,
    endpoint: &str,
    namespace: &str,
    deadline: Instant,
) -> anyhow::Result<Option<Duration>> {
    tokio::time::sleep_until(deadline.into()).await;
    while deadline.elapsed() < PROBE_AFTER {
        let answer = http
            .get(endpoint, "/v1/leases?limit=1", Some(namespace))
            .await?;
        if !answer.status.is_success() {
            bail!("listing the leases answered {}", answer.status);
        }
        let page: serde_json::Value = answer.json()?;
        let left = page["leases"]
            .as_array()
            .context("a lease page without leases")?;
        if left.is_empty() {
            return Ok(Some(deadline.elapsed()));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(None)
}
