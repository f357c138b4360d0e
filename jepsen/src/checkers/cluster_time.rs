//! Cluster time (docs/guarantees.md G6) from `Baton-Cluster-Time`: it never decreases across operations
//! ordered in real time (one completed before the other was invoked), and between two such
//! operations it grows at most `(1 + clock_rate_error)` times the harness clock.
//!
//! Which answers count: successes and refusals a server decided (they carry the cluster time
//! at which the answer was decided); not `NO_LEADER`, transport failures or unknowns.
//!
//! The rate bound: when A is a successful mutation, its time was stamped by the leader after A
//! was invoked; B's time (any answer) was stamped before B completed; so
//! `ct(B) - ct(A) <= (1 + e) * (complete(B) - invoke(A)) + slack`. A read cannot play A: it
//! answers at the applied state's time, which may have been stamped before the read was sent
//! (up to a tick and a commit earlier, docs/guarantees.md, "Time"). The slack is
//! [`RATE_SLACK_MS`]: both readings are whole milliseconds truncated from the nodes' clocks
//! (up to 1 ms each), and a leader's clock starts at the applied state's time, which was
//! stamped at most one tick's worth of rounding earlier; 5 ms covers both with room, and is
//! tiny against the 1% of any interval longer than half a second.

use serde_json::{json, Value};

use super::{ms, CheckResult};
use crate::history::{pairs, Op, OpType, Pair};

/// The rate error the cluster assumes (docs/guarantees.md G6).
pub const RATE_ERROR: f64 = 0.01;
/// See the module doc.
pub const RATE_SLACK_MS: f64 = 5.0;

struct Timed {
    /// A successful mutation: its time was stamped after its invocation.
    stamped_inside: bool,
    invoke_ns: u64,
    complete_ns: u64,
    cluster_time_ms: u64,
    index: u64,
    node: Option<u64>,
}

fn timed(history: &[Op]) -> Vec<Timed> {
    pairs(history)
        .into_iter()
        .filter_map(|pair: Pair<'_>| {
            let complete = pair.complete?;
            let decided = match complete.kind {
                OpType::Ok => true,
                OpType::Fail => !matches!(
                    complete.error.as_deref(),
                    Some("NO_LEADER" | "RESOURCE_EXHAUSTED" | "CONNECT")
                ),
                _ => false,
            };
            let mutation = matches!(
                pair.invoke.f.as_str(),
                "acquire" | "keepalive" | "release" | "write" | "enqueue" | "complete"
            ) || (pair.invoke.f == "claim" && !complete.value["task"].is_null());
            Some(Timed {
                stamped_inside: complete.kind == OpType::Ok && mutation,
                invoke_ns: pair.invoke.time_ns,
                complete_ns: complete.time_ns,
                cluster_time_ms: complete.cluster_time_ms.filter(|_| decided)?,
                index: pair.invoke.index,
                node: complete.node,
            })
        })
        .collect()
}

/// Operations sorted by invocation, and the same by completion.
fn sorted(history: &[Op]) -> (Vec<Timed>, Vec<usize>) {
    let mut ops = timed(history);
    ops.sort_by_key(|op| op.invoke_ns);
    let mut by_completion: Vec<usize> = (0..ops.len()).collect();
    by_completion.sort_by_key(|&position| ops[position].complete_ns);
    (ops, by_completion)
}

/// Cluster time never goes backwards across operations ordered in real time.
pub fn check_monotonic(history: &[Op]) -> CheckResult {
    let (ops, by_completion) = sorted(history);
    let mut violations: Vec<Value> = Vec::new();
    let mut next = 0;
    let mut highest: Option<&Timed> = None;
    for op in &ops {
        while next < by_completion.len() && ops[by_completion[next]].complete_ns < op.invoke_ns {
            let done = &ops[by_completion[next]];
            if highest.is_none_or(|top| done.cluster_time_ms > top.cluster_time_ms) {
                highest = Some(done);
            }
            next += 1;
        }
        if let Some(top) = highest.filter(|top| top.cluster_time_ms > op.cluster_time_ms) {
            violations.push(json!({"problem": "cluster time went backwards",
                "earlier": {"invocation": top.index, "cluster_time_ms": top.cluster_time_ms,
                            "completed_ms": ms(top.complete_ns), "node": top.node},
                "later": {"invocation": op.index, "cluster_time_ms": op.cluster_time_ms,
                          "invoked_ms": ms(op.invoke_ns), "node": op.node}}));
        }
    }
    CheckResult::from_violations(&format!("{} timed answers", ops.len()), violations)
}

/// Cluster time gains on the harness clock by at most the rate error.
pub fn check_rate(history: &[Op]) -> CheckResult {
    let (ops, by_completion) = sorted(history);
    let factor = 1.0 + RATE_ERROR;
    let mut violations: Vec<Value> = Vec::new();
    let mut next = 0;
    // Over completed A: the least `ct(A) - (1 + e) * invoke(A)`.
    let mut lowest: Option<(f64, &Timed)> = None;
    for op in &ops {
        while next < by_completion.len() && ops[by_completion[next]].complete_ns < op.invoke_ns {
            let done = &ops[by_completion[next]];
            next += 1;
            if !done.stamped_inside {
                continue;
            }
            let score = done.cluster_time_ms as f64 - factor * ms(done.invoke_ns);
            if lowest.is_none_or(|(least, _)| score < least) {
                lowest = Some((score, done));
            }
        }
        if let Some((score, earlier)) = lowest {
            let excess = op.cluster_time_ms as f64 - factor * ms(op.complete_ns) - score;
            if excess > RATE_SLACK_MS {
                violations.push(json!({"problem": "cluster time gained on real time by more than the rate error",
                    "earlier": {"invocation": earlier.index, "cluster_time_ms": earlier.cluster_time_ms,
                                "invoked_ms": ms(earlier.invoke_ns)},
                    "later": {"invocation": op.index, "cluster_time_ms": op.cluster_time_ms,
                              "completed_ms": ms(op.complete_ns)},
                    "excess_ms": excess}));
            }
        }
    }
    CheckResult::from_violations(
        &format!(
            "{} timed answers, rate error {RATE_ERROR}, slack {RATE_SLACK_MS} ms",
            ops.len()
        ),
        violations,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkers::Verdict;
    use crate::history::build::{indexed, op};

    fn read(process: u64, from_ms: u64, to_ms: u64, cluster_time_ms: u64) -> Vec<Op> {
        timed_op("read", process, from_ms, to_ms, cluster_time_ms)
    }

    fn write(process: u64, from_ms: u64, to_ms: u64, cluster_time_ms: u64) -> Vec<Op> {
        timed_op("write", process, from_ms, to_ms, cluster_time_ms)
    }

    fn timed_op(f: &str, process: u64, from_ms: u64, to_ms: u64, cluster_time_ms: u64) -> Vec<Op> {
        let mut done = op(process, OpType::Ok, to_ms, f, "k", json!({}));
        done.cluster_time_ms = Some(cluster_time_ms);
        vec![
            op(process, OpType::Invoke, from_ms, f, "k", json!({})),
            done,
        ]
    }

    #[test]
    fn steady_time_passes_both() {
        let history = indexed(
            [
                write(1, 0, 10, 1_000),
                read(2, 20, 30, 1_025),
                read(3, 1_000, 1_010, 2_005),
            ]
            .concat(),
        );
        assert_eq!(check_monotonic(&history).verdict, Verdict::Valid);
        assert_eq!(check_rate(&history).verdict, Verdict::Valid);
    }

    #[test]
    fn time_going_backwards_is_caught() {
        let history = indexed([read(1, 0, 10, 1_000), read(2, 20, 30, 999)].concat());
        assert_eq!(check_monotonic(&history).verdict, Verdict::Invalid);
    }

    #[test]
    fn time_running_fast_is_caught() {
        // 1,000 ms of harness time, 1,100 ms of cluster time.
        let history = indexed([write(1, 0, 10, 1_000), read(2, 990, 1_000, 2_100)].concat());
        assert_eq!(check_rate(&history).verdict, Verdict::Invalid);
        // A read's time may have been stamped before it was sent: it does not bound B.
        let history = indexed([read(1, 0, 10, 1_000), read(2, 990, 1_000, 2_100)].concat());
        assert_eq!(check_rate(&history).verdict, Verdict::Valid);
        assert_eq!(check_monotonic(&history).verdict, Verdict::Valid);
    }
}
