//! The lease set after healing (docs/guarantees.md G3, G5, G7): the harness lists every live lease on every
//! node (process `final`, f `final-leases`) and checks each listing against the history.
//!
//! - No phantom: every listed lease's fence was handed out for that resource by an acquire that
//!   succeeded, or the resource had an acquire of unknown outcome (whose fence the history
//!   cannot know) and the fence is not one granted for another resource.
//! - No resurrection: a lease whose release was acknowledged before the listing is not listed.
//! - No loss: an acknowledged grant that its holder may still count on (G7: until
//!   `t0 + (expires_in_ms - 1) * (1 - 2 * clock_rate_error)` from its first attempt's send time,
//!   a lower bound, since keepalives only extend it) and that was never released (no release
//!   sent at all) is listed by every node whose listing completed before that moment. The
//!   workloads' own leases have all expired by then; the long leases (`workloads::long_leases`)
//!   have not, so this is where a grant lost across crashes and snapshot installs shows.
//!
//! The listing's harness time is when it was recorded, after every page's answer: later than
//! any instant at which the listing took effect, so the no-loss check only ever asks for leases
//! that were surely live. Under `clock-beyond` the no-loss check rests on broken time
//! assumptions; the checker is then reported but not counted.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::{json, Value};

use super::{ms, CheckResult, Verdict};
use crate::history::{logical_pairs, Op, OpType, FINAL};
use crate::workloads::g7_valid_until;

struct Grant<'a> {
    resource: &'a str,
    fence: u64,
    invoke: u64,
    g7_end_ns: u64,
}

/// Checks the final lease listings.
pub fn check(history: &[Op]) -> CheckResult {
    let all = logical_pairs(history);
    let mut grants: Vec<Grant<'_>> = Vec::new();
    let mut unknown_resources: BTreeSet<&str> = BTreeSet::new();
    for pair in all.iter().filter(|pair| pair.invoke.f == "acquire") {
        match pair.outcome() {
            OpType::Ok => {
                let Some(fence) = pair.result()["fence"].as_u64() else {
                    continue;
                };
                let expires_in_ms = pair.result()["expires_in_ms"].as_u64().unwrap_or(0);
                let sent_at = Duration::from_nanos(pair.invoke.time_ns);
                grants.push(Grant {
                    resource: pair.invoke.key_str(),
                    fence,
                    invoke: pair.invoke.index,
                    g7_end_ns: u64::try_from(g7_valid_until(sent_at, expires_in_ms).as_nanos())
                        .unwrap_or(u64::MAX),
                });
            }
            OpType::Info => {
                unknown_resources.insert(pair.invoke.key_str());
            }
            _ => {}
        }
    }
    let granted: BTreeMap<u64, &Grant<'_>> =
        grants.iter().map(|grant| (grant.fence, grant)).collect();
    // (resource, fence) -> when a release was first sent, and when one was acknowledged.
    let mut release_sent: BTreeMap<(&str, u64), u64> = BTreeMap::new();
    let mut release_acknowledged: BTreeMap<(&str, u64), u64> = BTreeMap::new();
    for pair in all.iter().filter(|pair| pair.invoke.f == "release") {
        let Some(fence) = pair.invoke.value["fence"].as_u64() else {
            continue;
        };
        let key = (pair.invoke.key_str(), fence);
        let sent = release_sent.entry(key).or_insert(u64::MAX);
        *sent = (*sent).min(pair.invoke.time_ns);
        if pair.outcome() == OpType::Ok {
            let acknowledged = release_acknowledged.entry(key).or_insert(u64::MAX);
            *acknowledged = (*acknowledged).min(pair.end_ns());
        }
    }
    let mut violations: Vec<Value> = Vec::new();
    let mut listings = 0usize;
    let mut listed_total = 0usize;
    let mut required_total = 0usize;
    for op in history
        .iter()
        .filter(|op| op.is_named(FINAL) && op.f == "final-leases")
    {
        if op.value["complete"] != Value::Bool(true) {
            continue;
        }
        listings += 1;
        let node = &op.value["node"];
        let mut listed: BTreeSet<(&str, u64)> = BTreeSet::new();
        for lease in op.value["leases"].as_array().into_iter().flatten() {
            let resource = lease["resource"].as_str().unwrap_or("");
            let fence = lease["fence"].as_u64().unwrap_or(0);
            listed.insert((resource, fence));
            listed_total += 1;
            match granted.get(&fence) {
                Some(grant) if grant.resource == resource => {}
                Some(grant) => violations.push(json!({
                    "problem": "a listed lease carries a fence granted for another resource",
                    "node": node, "resource": resource, "fence": fence,
                    "granted_for": grant.resource, "acquire": grant.invoke,
                })),
                None if unknown_resources.contains(resource) => {}
                None => violations.push(json!({
                    "problem": "a listed lease that no acquire handed out (phantom)",
                    "node": node, "resource": resource, "fence": fence,
                })),
            }
            if let Some(&acknowledged) = release_acknowledged.get(&(resource, fence)) {
                if acknowledged < op.time_ns {
                    violations.push(json!({
                        "problem": "a lease whose release was acknowledged is listed",
                        "node": node, "resource": resource, "fence": fence,
                        "released_ms": ms(acknowledged), "listed_ms": ms(op.time_ns),
                    }));
                }
            }
        }
        for grant in grants
            .iter()
            .filter(|grant| grant.g7_end_ns > op.time_ns)
            .filter(|grant| !release_sent.contains_key(&(grant.resource, grant.fence)))
        {
            required_total += 1;
            if !listed.contains(&(grant.resource, grant.fence)) {
                violations.push(json!({
                    "problem": "an acknowledged lease its holder may still count on is missing",
                    "node": node, "resource": grant.resource, "fence": grant.fence,
                    "acquire": grant.invoke, "valid_until_ms": ms(grant.g7_end_ns),
                    "listed_ms": ms(op.time_ns),
                }));
            }
        }
    }
    let expected_listings = history
        .iter()
        .filter(|op| op.is_named(FINAL) && op.f == "final-leases")
        .count();
    let result = CheckResult::from_violations(
        &format!(
            "{listings} listings, {listed_total} leases listed, {required_total} required live"
        ),
        violations,
    );
    if result.verdict == Verdict::Valid && expected_listings > 0 && listings == 0 {
        return CheckResult {
            verdict: Verdict::Unknown,
            summary: "no node could list its leases after healing".to_owned(),
            details: Value::Null,
        };
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::build::{indexed, op};
    use crate::history::Process;

    /// An acquire of `resource` sent at `at` ms, answered 2 ms later.
    fn acquire(process: u64, at: u64, resource: &str, outcome: OpType, fence: u64) -> Vec<Op> {
        vec![
            op(
                process,
                OpType::Invoke,
                at,
                "acquire",
                resource,
                json!({"idempotency_key": format!("k-{process}")}),
            ),
            op(
                process,
                outcome,
                at + 2,
                "acquire",
                resource,
                json!({"fence": fence, "expires_in_ms": 120_000}),
            ),
        ]
    }

    fn release(process: u64, at: u64, resource: &str, fence: u64, outcome: OpType) -> Vec<Op> {
        vec![
            op(
                process,
                OpType::Invoke,
                at,
                "release",
                resource,
                json!({"fence": fence}),
            ),
            op(process, outcome, at + 2, "release", resource, Value::Null),
        ]
    }

    fn listing(at: u64, node: u64, leases: Value) -> Op {
        let mut listing = op(
            0,
            OpType::Info,
            at,
            "final-leases",
            "",
            json!({"node": node, "complete": true, "leases": leases}),
        );
        listing.process = Process::Named(FINAL.to_owned());
        listing
    }

    #[test]
    fn a_faithful_listing_passes() {
        let history = indexed(
            [
                acquire(1, 0, "long/1", OpType::Ok, 5),
                acquire(2, 10, "long/2", OpType::Ok, 6),
                release(2, 20, "long/2", 6, OpType::Ok),
                // Unknown: it may be listed with a fence the history never saw.
                acquire(3, 30, "long/3", OpType::Info, 0),
                // Unknown release: the lease may or may not be listed.
                acquire(4, 40, "long/4", OpType::Ok, 8),
                release(4, 50, "long/4", 8, OpType::Info),
                vec![
                    listing(
                        1_000,
                        1,
                        json!([{"resource": "long/1", "fence": 5},
                                             {"resource": "long/3", "fence": 7}]),
                    ),
                    listing(
                        1_010,
                        2,
                        json!([{"resource": "long/1", "fence": 5},
                                             {"resource": "long/4", "fence": 8}]),
                    ),
                ],
            ]
            .concat(),
        );
        let result = check(&history);
        assert_eq!(result.verdict, Verdict::Valid, "{:?}", result.details);
    }

    #[test]
    fn a_lost_live_lease_is_caught() {
        let history = indexed(
            [
                acquire(1, 0, "long/1", OpType::Ok, 5),
                vec![listing(1_000, 2, json!([]))],
            ]
            .concat(),
        );
        let result = check(&history);
        assert_eq!(result.verdict, Verdict::Invalid);
        assert_eq!(result.details[0]["fence"], 5);
    }

    #[test]
    fn an_expired_lease_may_be_absent() {
        let mut history = acquire(1, 0, "t0/a", OpType::Ok, 5);
        history[1].value["expires_in_ms"] = json!(1_000);
        history.push(listing(5_000, 2, json!([])));
        assert_eq!(check(&indexed(history)).verdict, Verdict::Valid);
    }

    #[test]
    fn a_phantom_lease_is_caught() {
        let history = indexed(
            [
                acquire(1, 0, "long/1", OpType::Ok, 5),
                // Refused: it handed out nothing.
                acquire(2, 10, "long/2", OpType::Fail, 0),
                vec![listing(
                    1_000,
                    1,
                    json!([{"resource": "long/1", "fence": 5},
                           {"resource": "long/2", "fence": 6}]),
                )],
            ]
            .concat(),
        );
        assert_eq!(check(&history).verdict, Verdict::Invalid);
    }

    #[test]
    fn a_fence_listed_under_another_resource_is_caught() {
        let history = indexed(
            [
                acquire(1, 0, "long/1", OpType::Ok, 5),
                acquire(2, 10, "long/2", OpType::Info, 0),
                vec![listing(
                    1_000,
                    1,
                    json!([{"resource": "long/1", "fence": 5},
                           {"resource": "long/2", "fence": 5}]),
                )],
            ]
            .concat(),
        );
        assert_eq!(check(&history).verdict, Verdict::Invalid);
    }

    #[test]
    fn a_released_lease_listed_again_is_caught() {
        let history = indexed(
            [
                acquire(1, 0, "long/1", OpType::Ok, 5),
                release(1, 20, "long/1", 5, OpType::Ok),
                vec![listing(
                    1_000,
                    1,
                    json!([{"resource": "long/1", "fence": 5}]),
                )],
            ]
            .concat(),
        );
        assert_eq!(check(&history).verdict, Verdict::Invalid);
    }
}
