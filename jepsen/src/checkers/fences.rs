//! Fences rise (docs/guarantees.md G3): every grant (lease acquire or task claim) gets a token greater than
//! every token granted before it, cluster-wide. From the history: no two distinct grants share
//! a token, and a grant that was invoked after another one completed has a larger token. A
//! retry with the same idempotency key is the same grant (its replay shows the same token), so
//! a grant counts as invoked when the first attempt with its key was: a replay answered late
//! may carry a fence granted before grants that completed in between. Likewise a grant an
//! acquire in line learns of (the `line` workload's re-sent acquire, whose invocation records
//! `since_ns`, when its wait began) may have been made at any time since the wait began: it
//! counts as invoked then.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::{ms, CheckResult};
use crate::history::{logical_pairs, Op, OpType};

/// A successful grant: `(invoke ns, complete ns, fence, idempotency key, resource, index)`.
struct Grant<'a> {
    invoke_ns: u64,
    complete_ns: u64,
    fence: u64,
    key: &'a str,
    resource: &'a str,
    index: u64,
}

/// Checks fence order.
pub fn check(history: &[Op]) -> CheckResult {
    let mut grants: Vec<Grant<'_>> = logical_pairs(history)
        .into_iter()
        .filter(|pair| pair.outcome() == OpType::Ok)
        .filter(|pair| pair.invoke.f == "acquire" || pair.invoke.f == "claim")
        .filter_map(|pair| {
            let key = pair.invoke.value["idempotency_key"].as_str().unwrap_or("");
            let since_ns = pair.invoke.value["since_ns"].as_u64();
            Some(Grant {
                invoke_ns: since_ns
                    .map_or(pair.invoke.time_ns, |since| since.min(pair.invoke.time_ns)),
                complete_ns: pair.end_ns(),
                fence: pair.result()["fence"].as_u64()?,
                key,
                resource: pair.invoke.key_str(),
                index: pair.invoke.index,
            })
        })
        .collect();
    let mut violations: Vec<Value> = Vec::new();
    let mut by_fence: BTreeMap<u64, &Grant<'_>> = BTreeMap::new();
    for grant in &grants {
        if let Some(other) = by_fence.insert(grant.fence, grant) {
            if other.key != grant.key || grant.key.is_empty() {
                violations.push(
                    json!({"problem": "two grants share a fence", "fence": grant.fence,
                    "resources": [other.resource, grant.resource],
                    "invocations": [other.index, grant.index]}),
                );
            }
        }
    }
    // Sweep in invocation order, folding in grants that completed before each invocation.
    grants.sort_by_key(|grant| grant.invoke_ns);
    let mut completed: Vec<&Grant<'_>> = grants.iter().collect();
    completed.sort_by_key(|grant| grant.complete_ns);
    let mut next = 0;
    let mut highest: Option<&Grant<'_>> = None;
    for grant in &grants {
        while next < completed.len() && completed[next].complete_ns < grant.invoke_ns {
            if highest.is_none_or(|top| completed[next].fence > top.fence) {
                highest = Some(completed[next]);
            }
            next += 1;
        }
        if let Some(top) = highest {
            if top.fence >= grant.fence && (top.key != grant.key || grant.key.is_empty()) {
                violations.push(json!({"problem": "a later grant got a lower or equal fence",
                    "earlier": {"invocation": top.index, "fence": top.fence, "resource": top.resource,
                                "completed_ms": ms(top.complete_ns)},
                    "later": {"invocation": grant.index, "fence": grant.fence, "resource": grant.resource,
                              "invoked_ms": ms(grant.invoke_ns)}}));
            }
        }
    }
    CheckResult::from_violations(&format!("{} grants", grants.len()), violations)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkers::Verdict;
    use crate::history::build::{indexed, op};

    fn grant(process: u64, from: u64, to: u64, fence: u64, key: &str) -> Vec<Op> {
        vec![
            op(
                process,
                OpType::Invoke,
                from,
                "acquire",
                "a",
                json!({"idempotency_key": key}),
            ),
            op(
                process,
                OpType::Ok,
                to,
                "acquire",
                "a",
                json!({"fence": fence}),
            ),
        ]
    }

    #[test]
    fn rising_fences_pass() {
        let history = indexed([grant(1, 0, 1, 5, "k1"), grant(2, 2, 3, 6, "k2")].concat());
        assert_eq!(check(&history).verdict, Verdict::Valid);
    }

    #[test]
    fn a_lower_fence_after_a_completed_grant_is_caught() {
        let history = indexed([grant(1, 0, 1, 7, "k1"), grant(2, 2, 3, 6, "k2")].concat());
        assert_eq!(check(&history).verdict, Verdict::Invalid);
    }

    /// The simulator's grants carry no idempotency key: two of them are two grants, not one
    /// grant and its replay, so a lower fence after a completed one is still caught.
    #[test]
    fn grants_without_an_idempotency_key_are_held_to_the_order_too() {
        let keyless = |process: u64, from: u64, to: u64, fence: u64| {
            let mut grant = grant(process, from, to, fence, "");
            grant[0].value = Value::Null;
            grant
        };
        let history = indexed([keyless(1, 0, 1, 7), keyless(2, 2, 3, 6)].concat());
        assert_eq!(check(&history).verdict, Verdict::Invalid);
        let history = indexed([keyless(1, 0, 1, 7), keyless(2, 2, 3, 8)].concat());
        assert_eq!(check(&history).verdict, Verdict::Valid);
    }

    #[test]
    fn a_reused_fence_is_caught_but_a_replay_is_not() {
        let reused = indexed([grant(1, 0, 5, 7, "k1"), grant(2, 1, 4, 7, "k2")].concat());
        assert_eq!(check(&reused).verdict, Verdict::Invalid);
        let replay = indexed([grant(1, 0, 1, 7, "k1"), grant(2, 2, 3, 7, "k1")].concat());
        assert_eq!(check(&replay).verdict, Verdict::Valid);
    }

    /// A waiter granted while it waited: its re-sent acquire learns of a fence made before
    /// another grant completed, which is in order since the wait began before that grant.
    #[test]
    fn a_grant_learned_in_line_counts_from_when_the_wait_began() {
        let mut waited = grant(3, 5, 6, 6, "k3");
        waited[0].value["since_ns"] = json!(0);
        let history = indexed([grant(2, 3, 4, 7, "k2"), waited.clone()].concat());
        assert_eq!(check(&history).verdict, Verdict::Valid);
        waited[0].value["since_ns"] = json!(4_500_000);
        let history = indexed([grant(2, 3, 4, 7, "k2"), waited].concat());
        assert_eq!(check(&history).verdict, Verdict::Invalid);
    }

    /// Seen in a real run under `partition`: an acquire timed out, a later grant completed with a
    /// higher fence, then the retry of the first acquire was answered with its recorded (lower)
    /// fence. The grant happened during the first attempt, so the order holds.
    #[test]
    fn a_late_replay_counts_from_its_first_attempt() {
        let first_attempt = op(
            1,
            OpType::Invoke,
            0,
            "acquire",
            "a",
            json!({"idempotency_key": "k1"}),
        );
        let timed_out = op(1, OpType::Info, 2, "acquire", "a", json!(null));
        let history = indexed(
            [
                vec![first_attempt, timed_out],
                grant(2, 3, 4, 7, "k2"),
                grant(3, 5, 6, 6, "k1"),
            ]
            .concat(),
        );
        assert_eq!(check(&history).verdict, Verdict::Valid);
        let no_earlier_attempt =
            indexed([grant(2, 3, 4, 7, "k2"), grant(3, 5, 6, 6, "k1")].concat());
        assert_eq!(check(&no_earlier_attempt).verdict, Verdict::Invalid);
    }

    /// What a restore without a new fence epoch would do: fence 8, granted after the backup and
    /// undone by the restore, granted again by the restored cluster. The run's checkers judge
    /// fence order on the history as recorded, so the undone grant still counts.
    #[test]
    fn a_fence_granted_again_after_a_restore_is_caught() {
        let restore = |at: u64, f: &str, value: Value| {
            let mut event = op(0, OpType::Info, at, f, "", value);
            event.process = crate::history::Process::Named(crate::history::NEMESIS.to_owned());
            event
        };
        let run = |fence_after: u64| {
            let history = indexed(
                [
                    grant(1, 0, 1, 7, "k1"),
                    vec![restore(2, "start", json!({"fault": "restore"}))],
                    grant(2, 3, 4, 8, "k2"),
                    vec![restore(
                        5,
                        "stop",
                        json!({"fault": "restore", "saved": true}),
                    )],
                    grant(3, 6, 7, fence_after, "k3"),
                ]
                .concat(),
            );
            let results = crate::checkers::check_all(
                crate::workloads::Workload::FencedKv,
                &history,
                false,
                std::time::Duration::from_secs(1),
            );
            let fences = results.iter().find(|result| result.name == "fences");
            fences.expect("the fences checker runs").verdict
        };
        assert_eq!(run(8), Verdict::Invalid);
        assert_eq!(run((1 << 40) + 1), Verdict::Valid);
    }
}
