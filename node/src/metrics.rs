//! Prometheus text metrics: Raft state from openraft's metrics, live counts from the machine,
//! and request counts and latency histograms by route pattern, method and status. Labels are
//! bounded: route patterns, never raw paths (which may hold session ids).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use axum::http::Method;
use baton_raft_store::store::TypeConfig;
use openraft::RaftMetrics;

/// Upper bounds of the latency buckets, in seconds.
const BUCKETS_SECONDS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

/// What a follower relayed to the leader (relay.rs counts them): messages, and the commands in
/// them.
#[derive(Debug, Default)]
pub struct RelayCounters {
    pub messages: AtomicU64,
    pub commands: AtomicU64,
}

/// One route's histograms, by method and status.
type ByOutcome = HashMap<(Method, u16), Histogram>;

#[derive(Debug, Default)]
pub struct Metrics {
    /// By route pattern, then by method and status: a request finds its histogram without
    /// allocating (the route is looked up as a `&str`, the method is cloned inline).
    requests: Mutex<HashMap<String, ByOutcome>>,
}

#[derive(Debug, Default, Clone)]
struct Histogram {
    buckets: [u64; BUCKETS_SECONDS.len()],
    count: u64,
    sum_seconds: f64,
}

impl Metrics {
    pub fn observe(&self, route: &str, method: &Method, status: u16, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        let mut requests = self.requests.lock().expect("metrics lock");
        if !requests.contains_key(route) {
            requests.insert(route.to_owned(), ByOutcome::new());
        }
        let histogram = requests
            .get_mut(route)
            .expect("inserted above")
            .entry((method.clone(), status))
            .or_default();
        histogram.count += 1;
        histogram.sum_seconds += seconds;
        for (bucket, bound) in histogram.buckets.iter_mut().zip(BUCKETS_SECONDS) {
            if seconds <= bound {
                *bucket += 1;
            }
        }
    }

    pub fn render(
        &self,
        raft: &RaftMetrics<TypeConfig>,
        sessions: usize,
        leases: usize,
        batches_in_flight: usize,
        relayed: &RelayCounters,
    ) -> String {
        let mut text = String::new();
        let gauges = [
            ("baton_raft_term", "Current Raft term.", raft.current_term),
            (
                "baton_raft_leader",
                "Id of the known leader, 0 when none.",
                raft.current_leader.unwrap_or(0),
            ),
            (
                "baton_raft_is_leader",
                "1 when this node is the leader.",
                u64::from(raft.state.is_leader()),
            ),
            (
                "baton_raft_last_log_index",
                "Last log index on this node.",
                raft.last_log_index.unwrap_or(0),
            ),
            (
                "baton_raft_commit_index",
                "Highest index known committed here.",
                raft.local_committed.map_or(0, |log_id| log_id.index),
            ),
            (
                "baton_raft_applied_index",
                "Last applied log index.",
                raft.last_applied.map_or(0, |log_id| log_id.index),
            ),
            (
                "baton_sessions",
                "Sessions in the state machine, live or awaiting sweep.",
                sessions as u64,
            ),
            (
                "baton_leases",
                "Leases in the state machine, live or awaiting sweep.",
                leases as u64,
            ),
            (
                "baton_proposer_batches_in_flight",
                "Log entries this node proposed and is still waiting to hear back about.",
                batches_in_flight as u64,
            ),
        ];
        for (name, help, value) in gauges {
            let _ = writeln!(
                text,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
            );
        }
        let counters = [
            (
                "baton_relay_messages_total",
                "Relay messages this node sent to the leader, as a follower.",
                relayed.messages.load(Ordering::Relaxed),
            ),
            (
                "baton_relayed_commands_total",
                "Writes this node relayed to the leader as commands, as a follower.",
                relayed.commands.load(Ordering::Relaxed),
            ),
        ];
        for (name, help, value) in counters {
            let _ = writeln!(
                text,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
            );
        }
        // Sorted by route, method and status, so the text is stable between scrapes.
        let requests: BTreeMap<(String, String, u16), Histogram> = self
            .requests
            .lock()
            .expect("metrics lock")
            .iter()
            .flat_map(|(route, by_outcome)| {
                by_outcome.iter().map(move |((method, status), histogram)| {
                    (
                        (route.clone(), method.to_string(), *status),
                        histogram.clone(),
                    )
                })
            })
            .collect();
        let _ = writeln!(
            text,
            "# HELP baton_http_requests_total HTTP requests by route, method and status."
        );
        let _ = writeln!(text, "# TYPE baton_http_requests_total counter");
        for ((route, method, status), histogram) in &requests {
            let _ = writeln!(
                text,
                "baton_http_requests_total{{route=\"{route}\",method=\"{method}\",status=\"{status}\"}} {}",
                histogram.count
            );
        }
        let _ = writeln!(
            text,
            "# HELP baton_http_request_duration_seconds HTTP request latency."
        );
        let _ = writeln!(text, "# TYPE baton_http_request_duration_seconds histogram");
        for ((route, method, status), histogram) in &requests {
            let labels = format!("route=\"{route}\",method=\"{method}\",status=\"{status}\"");
            for (bucket, bound) in histogram.buckets.iter().zip(BUCKETS_SECONDS) {
                let _ = writeln!(text, "baton_http_request_duration_seconds_bucket{{{labels},le=\"{bound}\"}} {bucket}");
            }
            let _ = writeln!(
                text,
                "baton_http_request_duration_seconds_bucket{{{labels},le=\"+Inf\"}} {}",
                histogram.count
            );
            let _ = writeln!(
                text,
                "baton_http_request_duration_seconds_sum{{{labels}}} {}",
                histogram.sum_seconds
            );
            let _ = writeln!(
                text,
                "baton_http_request_duration_seconds_count{{{labels}}} {}",
                histogram.count
            );
        }
        text
    }
}
