//! `--workload disruption`: what pre-vote is for (docs/guarantees.md, "Membership safety").
//! Three `batond` processes of their own on `--net` (network namespaces or the proxy mesh),
//! and a steady writer through the healthy majority:
//!
//! 1. a follower is cut off from both others for `--seconds`, then healed;
//! 2. the other follower is removed from the membership and keeps running for `--seconds`.
//!
//! Neither may raise the term of the healthy majority (the cut-off or removed node would depose
//! the leader if it campaigned without asking first), nor pause its writes for longer than
//! `--gap-max-ms` (100 ms by default). A run that sees either fails with exit 1, naming what it
//! saw.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use super::failover::{SteadyWriter, Writes};
use super::report::{Chart, Figures};
use super::{own_cluster_on, BenchArgs};
use crate::cluster::Cluster;

/// How long the cluster runs undisturbed before each phase, and after it.
const SETTLE: Duration = Duration::from_secs(2);
/// The longest a healed node may take to be ready again.
const HEAL_READY_MAX: Duration = Duration::from_secs(30);

/// One phase's findings.
#[derive(Debug)]
struct Phase {
    name: &'static str,
    terms_before: Vec<(u64, u64)>,
    terms_after: Vec<(u64, u64)>,
    longest_pause: Duration,
    acknowledged: usize,
}

pub(super) async fn run(args: &BenchArgs, run_dir: &Path) -> anyhow::Result<Figures> {
    if args.seconds == 0 || args.seconds > 120 {
        bail!(
            "give --seconds 1..=120: how long a follower stays cut off, and a removed member runs"
        );
    }
    let disrupted_for = Duration::from_secs(args.seconds);
    let gap_max = Duration::from_millis(args.gap_max_ms);
    let guard = own_cluster_on(args, run_dir, args.net).await?;
    let cluster = guard.0.clone();
    println!("disruption: network {}", cluster.net_selection);
    tokio::time::sleep(SETTLE).await;
    let leader = cluster
        .leader()
        .await
        .context("no leader: the cluster is not settled")?;
    let followers: Vec<u64> = cluster
        .ids()
        .into_iter()
        .filter(|id| *id != leader)
        .collect();
    let (cut, removed) = (followers[0], followers[1]);

    // 1. A follower cut off and healed.
    let healthy = [leader, removed];
    let terms_before = terms(&cluster, &cluster.ids()).await?;
    let writer = SteadyWriter::start(client(&cluster, &healthy)?, "bench/disruption");
    tokio::time::sleep(SETTLE).await;
    let from = Instant::now();
    cluster
        .net
        .set_blocked(&crate::net::cut_between(&[cut], &cluster.ids()));
    tokio::time::sleep(disrupted_for).await;
    cluster.net.heal();
    cluster
        .wait_ready(HEAL_READY_MAX)
        .await
        .context("the healed follower did not catch up")?;
    tokio::time::sleep(SETTLE).await;
    let paused = longest_pause(&writer.writes, from, Instant::now());
    let (acknowledged, _) = writer.stop().await?;
    let partition = Phase {
        name: "follower cut off and healed",
        terms_after: terms(&cluster, &cluster.ids()).await?,
        terms_before,
        longest_pause: paused,
        acknowledged,
    };

    // 2. A member removed while it keeps running.
    let healthy = [leader, cut];
    let terms_before = terms(&cluster, &healthy).await?;
    let writer = SteadyWriter::start(client(&cluster, &healthy)?, "bench/disruption");
    tokio::time::sleep(SETTLE).await;
    let from = Instant::now();
    let (status, answer) = cluster
        .call(
            leader,
            reqwest::Method::DELETE,
            &format!("/v1/cluster/members/{removed}"),
            None,
            Duration::from_secs(10),
        )
        .await?;
    if status != 200 {
        bail!("removing node {removed}: {status} {answer}");
    }
    tokio::time::sleep(disrupted_for).await;
    let paused = longest_pause(&writer.writes, from, Instant::now());
    let (acknowledged, _) = writer.stop().await?;
    let removal = Phase {
        name: "member removed, still running",
        terms_after: terms(&cluster, &healthy).await?,
        terms_before,
        longest_pause: paused,
        acknowledged,
    };

    let mut findings = Vec::new();
    for phase in [&partition, &removal] {
        println!(
            "{:<32} terms {:?} -> {:?}, longest write pause {} ms, {} writes acknowledged",
            phase.name,
            phase.terms_before,
            phase.terms_after,
            phase.longest_pause.as_millis(),
            phase.acknowledged
        );
        if phase.terms_after != phase.terms_before {
            findings.push(format!(
                "{}: the term changed ({:?} -> {:?})",
                phase.name, phase.terms_before, phase.terms_after
            ));
        }
        if phase.longest_pause > gap_max {
            findings.push(format!(
                "{}: the writes paused {} ms (at most {} ms)",
                phase.name,
                phase.longest_pause.as_millis(),
                gap_max.as_millis()
            ));
        }
    }
    drop(guard);
    if !findings.is_empty() {
        bail!("disruption: {}", findings.join("; "));
    }
    let phases: Vec<serde_json::Value> = [&partition, &removal]
        .iter()
        .map(|phase| {
            serde_json::json!({
                "phase": phase.name,
                "terms_before": phase.terms_before,
                "terms_after": phase.terms_after,
                "longest_write_pause_ms": phase.longest_pause.as_millis() as u64,
                "writes_acknowledged": phase.acknowledged,
            })
        })
        .collect();
    let json = serde_json::json!({
        "workload": "disruption",
        "net": cluster.net.name(),
        "seconds": args.seconds,
        "phases": phases,
    });
    let chart = Chart {
        title: "longest write pause of the healthy majority".to_owned(),
        unit: "ms".to_owned(),
        bars: [&partition, &removal]
            .iter()
            .map(|phase| {
                (
                    phase.name.to_owned(),
                    phase.longest_pause.as_millis() as f64,
                )
            })
            .collect(),
    };
    Ok(Figures { json, chart })
}

/// A client of the nodes `ids` only.
fn client(cluster: &Cluster, ids: &[u64]) -> anyhow::Result<baton_client::Client> {
    let urls = cluster.api_urls();
    let endpoints = ids.iter().map(|id| urls[(*id - 1) as usize].as_str());
    Ok(baton_client::Client::builder(endpoints)
        .holder("bench-disruption")
        .build()?)
}

/// Each node's Raft term, as `(node, term)`.
async fn terms(cluster: &Cluster, ids: &[u64]) -> anyhow::Result<Vec<(u64, u64)>> {
    let mut terms = Vec::new();
    for id in ids {
        let status = cluster.get_json(*id, "/v1/cluster").await?;
        let term = status["term"]
            .as_u64()
            .with_context(|| format!("node {id}'s /v1/cluster has no term"))?;
        terms.push((*id, term));
    }
    Ok(terms)
}

/// The longest time between `from` and `to` in which no write was acknowledged: between two
/// acknowledgements, or from `from` to the first, or from the last to `to`.
fn longest_pause(writes: &Writes, from: Instant, to: Instant) -> Duration {
    let writes = writes.lock().expect("writes");
    let mut acknowledged: Vec<Instant> = writes
        .iter()
        .filter(|(_, ended, ok)| *ok && *ended > from && *ended <= to)
        .map(|(_, ended, _)| *ended)
        .collect();
    acknowledged.sort();
    let mut previous = from;
    let mut longest = Duration::ZERO;
    for ended in acknowledged.into_iter().chain(std::iter::once(to)) {
        longest = longest.max(ended - previous);
        previous = ended;
    }
    longest
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[test]
    fn the_longest_pause_counts_the_edges_and_only_acknowledged_writes() {
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let writes: Writes = Arc::new(Mutex::new(vec![
            (at(0), at(5), true),
            (at(5), at(20), true),
            (at(20), at(300), false),
            (at(300), at(310), true),
            (at(310), at(320), true),
        ]));
        assert_eq!(
            longest_pause(&writes, at(10), at(400)),
            Duration::from_millis(290)
        );
        assert_eq!(
            longest_pause(&writes, at(305), at(500)),
            Duration::from_millis(180),
            "the end counts"
        );
        assert_eq!(
            longest_pause(&writes, at(0), at(10)),
            Duration::from_millis(5)
        );
    }
}
