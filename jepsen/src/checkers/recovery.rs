//! The cluster recovers once the faults are healed (docs/harness.md): within a bound after the
//! heal every running node answers `/readyz` and one leads (process `final`, f `recovery`), and
//! every node's proposer stops waiting for answers about the batches it handed to Raft (f
//! `pipeline`, one event per node: its `baton_proposer_batches_in_flight` gauge reached 0).
//!
//! A batch whose answer never comes holds one of the proposer's few pipeline slots for good; a
//! node that lost all of them can never propose again, even as leader. The first symptom is a
//! slot held long after the faults ended, which this checker sees long before the slots run
//! out. A node whose metrics could not be read makes the result `unknown`.

use serde_json::{json, Value};

use super::{CheckResult, Verdict};
use crate::history::{Op, FINAL};

/// Checks recovery after the heal.
pub fn check(history: &[Op]) -> CheckResult {
    let finals = || history.iter().filter(|op| op.is_named(FINAL));
    let Some(recovery) = finals().find(|op| op.f == "recovery") else {
        return unknown("no recovery was recorded".to_owned());
    };
    let mut violations: Vec<Value> = Vec::new();
    if recovery.value["ready"] != Value::Bool(true) {
        violations.push(json!({
            "problem": "the cluster was not ready within the bound after the heal",
            "bound_ms": recovery.value["bound_ms"], "error": recovery.value["error"],
        }));
    }
    let mut drained = 0usize;
    let mut unread = Vec::new();
    for op in finals().filter(|op| op.f == "pipeline") {
        let node = &op.value["node"];
        match (&op.value["drained"], &op.value["in_flight"]) {
            (Value::Bool(true), _) => drained += 1,
            (_, Value::Number(in_flight)) => violations.push(json!({
                "problem": "batches handed to Raft were still waiting for an answer long after the heal",
                "node": node, "in_flight": in_flight, "waited_ms": op.value["waited_ms"],
            })),
            _ => unread.push(node.clone()),
        }
    }
    if violations.is_empty() && !unread.is_empty() {
        return unknown(format!(
            "the proposer gauge of nodes {unread:?} could not be read"
        ));
    }
    CheckResult::from_violations(
        &format!(
            "ready after {} ms; {drained} nodes' pipelines drained",
            recovery.value["waited_ms"]
        ),
        violations,
    )
}

fn unknown(summary: String) -> CheckResult {
    CheckResult {
        verdict: Verdict::Unknown,
        summary,
        details: Value::Null,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{build::indexed, OpType, Process};

    fn event(f: &str, value: Value) -> Op {
        Op {
            index: 0,
            time_ns: 0,
            process: Process::Named(FINAL.to_owned()),
            kind: OpType::Info,
            f: f.to_owned(),
            key: Value::Null,
            value,
            error: None,
            cluster_time_ms: None,
            node: None,
        }
    }

    fn ready(ready: bool) -> Op {
        event(
            "recovery",
            json!({"ready": ready, "waited_ms": 400, "bound_ms": 30_000}),
        )
    }

    fn pipeline(node: u64, drained: bool, in_flight: Option<u64>) -> Op {
        event(
            "pipeline",
            json!({"node": node, "drained": drained, "in_flight": in_flight, "waited_ms": 10_000}),
        )
    }

    #[test]
    fn a_ready_cluster_with_drained_pipelines_passes() {
        let history = indexed(vec![
            ready(true),
            pipeline(1, true, Some(0)),
            pipeline(2, true, Some(0)),
        ]);
        assert_eq!(check(&history).verdict, Verdict::Valid);
    }

    #[test]
    fn a_cluster_never_ready_after_the_heal_is_invalid() {
        let history = indexed(vec![ready(false), pipeline(1, true, Some(0))]);
        assert_eq!(check(&history).verdict, Verdict::Invalid);
    }

    #[test]
    fn a_batch_still_waiting_long_after_the_heal_is_invalid() {
        let history = indexed(vec![
            ready(true),
            pipeline(1, true, Some(0)),
            pipeline(2, false, Some(3)),
        ]);
        let result = check(&history);
        assert_eq!(result.verdict, Verdict::Invalid);
        assert_eq!(result.details[0]["node"], 2);
    }

    #[test]
    fn an_unreadable_gauge_or_no_record_is_unknown() {
        let history = indexed(vec![ready(true), pipeline(1, false, None)]);
        assert_eq!(check(&history).verdict, Verdict::Unknown);
        assert_eq!(check(&indexed(vec![])).verdict, Verdict::Unknown);
    }
}
