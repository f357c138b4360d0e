//! `--workload failover`: three `batond` processes of its own with batond's default flags, one
//! writer putting a key through the client library (which knows all three endpoints); the
//! leader is SIGKILLed (or, with `--signal term`, sent SIGTERM, on which it hands leadership
//! over and must exit 0), the writer's gap measured, the node restarted, `--repeat` times.
//! The writer (`SteadyWriter`) is shared with `disruption`.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use super::report::{Chart, Figures};
use super::{own_cluster, percentile_ms, BenchArgs, Signal};
use crate::cluster::Readiness;

/// A steady writer's view of each write: when it was sent, when it ended, whether it was
/// acknowledged.
pub(super) type Writes = Arc<Mutex<Vec<(Instant, Instant, bool)>>>;

/// One writer putting a key again and again through `client`, recording every write.
pub(super) struct SteadyWriter {
    pub(super) writes: Writes,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl SteadyWriter {
    pub(super) fn start(client: baton_client::Client, key: &'static str) -> SteadyWriter {
        let writes: Writes = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let task = {
            let (writes, stop) = (writes.clone(), stop.clone());
            tokio::spawn(async move {
                let mut sequence = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    sequence += 1;
                    let sent = Instant::now();
                    let ok = client
                        .kv_put(key, serde_json::Value::from(sequence))
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
        SteadyWriter { writes, stop, task }
    }

    /// Stops the writer; how many writes were acknowledged and how many failed.
    pub(super) async fn stop(self) -> anyhow::Result<(usize, usize)> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.context("the writer")?;
        let writes = self.writes.lock().expect("writes");
        let acknowledged = writes.iter().filter(|(_, _, ok)| *ok).count();
        Ok((acknowledged, writes.len() - acknowledged))
    }
}

/// How long the cluster runs undisturbed before each kill, and after a restart.
const FAILOVER_SETTLE: Duration = Duration::from_secs(3);
/// The longest a failover may take before the run gives up on it.
const FAILOVER_GAP_MAX: Duration = Duration::from_secs(30);

/// The gap of one kill is the time between the writer's last acknowledged write before the
/// kill and the acknowledgement of its first write sent after the kill (an answer already on
/// its way when the leader died says nothing about the failover).
pub(super) async fn run(args: &BenchArgs, run_dir: &Path) -> anyhow::Result<Figures> {
    if args.repeat == 0 || args.repeat > 100 {
        bail!("give --repeat 1..=100");
    }
    let guard = own_cluster(args, run_dir).await?;
    let cluster = guard.0.clone();
    let endpoints = cluster.api_urls();
    let client = baton_client::Client::builder(endpoints.iter().map(String::as_str))
        .holder("bench-failover")
        .build()?;
    let writer = SteadyWriter::start(client, "bench/failover");
    let writes = writer.writes.clone();
    let terminate = args.signal == Signal::Term;
    let mut gaps: Vec<Duration> = Vec::new();
    println!("stop  leader  gap_ms");
    for kill in 1..=args.repeat {
        tokio::time::sleep(FAILOVER_SETTLE).await;
        let leader = cluster
            .leader()
            .await
            .context("no leader to kill: the cluster is not settled")?;
        let killed_at = Instant::now();
        if terminate {
            let status = cluster.terminate(leader, FAILOVER_GAP_MAX).await?;
            if !status.success() {
                bail!("node {leader} exited with {status} after SIGTERM");
            }
        } else {
            cluster.kill(leader);
        }
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
    let (acknowledged, failed) = writer.stop().await?;
    let mut sorted = gaps.clone();
    sorted.sort();
    let (median, max) = (percentile_ms(&sorted, 0.5), percentile_ms(&sorted, 1.0));
    let how = if terminate { "SIGTERMs" } else { "SIGKILLs" };
    println!(
        "failover: {} leader {how}, write gap median {median:.0} ms, max {max:.0} ms; {acknowledged} writes acknowledged, {failed} failed",
        gaps.len(),
    );
    let json = serde_json::json!({
        "workload": "failover",
        "signal": if terminate { "term" } else { "kill" },
        "kills": gaps.len(),
        "gaps_ms": gaps.iter().map(|gap| gap.as_millis() as u64).collect::<Vec<_>>(),
        "median_ms": median.round() as u64,
        "max_ms": max.round() as u64,
        "writes_acknowledged": acknowledged,
        "writes_failed": failed,
    });
    let chart = Chart {
        title: format!(
            "write gap per leader {} (median {median:.0} ms)",
            if terminate { "SIGTERM" } else { "SIGKILL" }
        ),
        unit: "ms".to_owned(),
        bars: gaps
            .iter()
            .enumerate()
            .map(|(kill, gap)| (format!("kill {}", kill + 1), gap.as_millis() as f64))
            .collect(),
    };
    drop(guard);
    Ok(Figures { json, chart })
}

/// The gap around `killed_at`: from the last acknowledged write that ended before it to the
/// end of the first acknowledged write sent after it; `None` until there is one.
pub(super) fn write_gap(writes: &Writes, killed_at: Instant) -> Option<Duration> {
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
