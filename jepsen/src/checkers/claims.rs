//! Exclusive claims (docs/guarantees.md G2 and G7 for tasks): no task is held by two live claims at the same
//! moment. A claim is a lease on its task, so its claimer may count it live (G7) from the
//! claim's `ok` until `t0 + (expires_in_ms - 1) * (1 - 2 * clock_rate_error)`, `t0` being when
//! the claim was first sent, and no longer than until the claimer itself sent the
//! `complete`, `fail`, `release` or `end-session` that ends it (that may take effect at once).
//! Each claim is live on the server over at least that interval, so two different claims
//! (different fences) of one task whose intervals overlap were both live at one instant.
//! Under `clock-beyond` this checker is reported but not counted, like the hold intervals.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};

use super::{ms, CheckResult};
use crate::history::{logical_pairs, Op, OpType};
use crate::workloads::g7_valid_until;

/// The operations by which a claimer ends its own claim (they carry the claim's fence).
const ENDINGS: [&str; 4] = ["complete", "fail", "release", "end-session"];

struct Claim {
    fence: u64,
    index: u64,
    from_ns: u64,
    until_ns: u64,
}

/// Checks that claims of one task never overlap.
pub fn check(history: &[Op]) -> CheckResult {
    let all = logical_pairs(history);
    // (queue, fence) -> when the claimer first sent an operation that ends that claim.
    let mut ended: BTreeMap<(&str, u64), u64> = BTreeMap::new();
    for pair in all
        .iter()
        .filter(|pair| ENDINGS.contains(&pair.invoke.f.as_str()))
    {
        if let Some(fence) = pair.invoke.value["fence"].as_u64() {
            let at = ended
                .entry((pair.invoke.key_str(), fence))
                .or_insert(u64::MAX);
            *at = (*at).min(pair.invoke.time_ns);
        }
    }
    let mut claims: BTreeMap<(&str, &str), Vec<Claim>> = BTreeMap::new();
    for pair in all
        .iter()
        .filter(|pair| pair.invoke.f == "claim" && pair.outcome() == OpType::Ok)
    {
        let result = pair.result();
        let (Some(task), Some(fence), Some(expires_in_ms)) = (
            result["task"].as_str(),
            result["fence"].as_u64(),
            result["expires_in_ms"].as_u64(),
        ) else {
            continue; // an empty queue, or a claim recorded without its validity
        };
        let queue = pair.invoke.key_str();
        let sent_at = Duration::from_nanos(pair.invoke.time_ns);
        let g7_ns =
            u64::try_from(g7_valid_until(sent_at, expires_in_ms).as_nanos()).unwrap_or(u64::MAX);
        let until_ns = ended
            .get(&(queue, fence))
            .map_or(g7_ns, |&sent| sent.min(g7_ns));
        claims.entry((queue, task)).or_default().push(Claim {
            fence,
            index: pair.invoke.index,
            from_ns: pair.end_ns(),
            until_ns,
        });
    }
    let mut violations: Vec<Value> = Vec::new();
    let mut counted = 0usize;
    for ((queue, task), task_claims) in &mut claims {
        task_claims.retain(|claim| claim.until_ns > claim.from_ns);
        task_claims.sort_by_key(|claim| claim.from_ns);
        counted += task_claims.len();
        for (position, first) in task_claims.iter().enumerate() {
            for second in task_claims[position + 1..]
                .iter()
                .take_while(|second| second.from_ns < first.until_ns)
            {
                if second.fence != first.fence {
                    violations.push(json!({
                        "problem": "a task held by two live claims at once",
                        "queue": queue, "task": task,
                        "first": {"fence": first.fence, "claim": first.index,
                                  "from_ms": ms(first.from_ns), "until_ms": ms(first.until_ns)},
                        "second": {"fence": second.fence, "claim": second.index,
                                   "from_ms": ms(second.from_ns), "until_ms": ms(second.until_ns)},
                        "overlap_ms": ms(first.until_ns.min(second.until_ns) - second.from_ns),
                    }));
                }
            }
        }
    }
    CheckResult::from_violations(
        &format!("{counted} claims with a guaranteed interval"),
        violations,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkers::Verdict;
    use crate::history::build::{indexed, op};

    /// A claim of task `a` sent at `at` ms and answered 1 ms later.
    fn claim(process: u64, at: u64, fence: u64, expires_in_ms: u64) -> Vec<Op> {
        vec![
            op(process, OpType::Invoke, at, "claim", "q", json!({})),
            op(
                process,
                OpType::Ok,
                at + 1,
                "claim",
                "q",
                json!({"task": "a", "fence": fence, "expires_in_ms": expires_in_ms}),
            ),
        ]
    }

    fn ending(process: u64, at: u64, f: &str, fence: u64) -> Vec<Op> {
        vec![
            op(
                process,
                OpType::Invoke,
                at,
                f,
                "q",
                json!({"task": "a", "fence": fence}),
            ),
            op(process, OpType::Ok, at + 1, f, "q", json!({})),
        ]
    }

    #[test]
    fn claims_handed_over_after_expiry_or_release_pass() {
        let history = indexed(
            [
                // Fence 1 lapses: valid until 999 * 0.98 = 979 ms.
                claim(1, 0, 1, 1_000),
                claim(2, 985, 2, 1_000),
                // Fence 2 is released at 1100; fence 3 is granted right after.
                ending(2, 1_100, "release", 2),
                claim(3, 1_102, 3, 1_000),
                ending(3, 1_200, "complete", 3),
            ]
            .concat(),
        );
        let result = check(&history);
        assert_eq!(result.verdict, Verdict::Valid, "{:?}", result.details);
    }

    #[test]
    fn a_second_claim_inside_the_first_ones_validity_is_caught() {
        let history = indexed([claim(1, 0, 1, 1_000), claim(2, 500, 2, 1_000)].concat());
        let result = check(&history);
        assert_eq!(result.verdict, Verdict::Invalid);
        assert_eq!(result.details[0]["task"], "a");
    }

    #[test]
    fn a_claim_granted_before_the_first_claimer_let_go_is_caught() {
        let history = indexed(
            [
                claim(1, 0, 1, 1_000),
                claim(2, 100, 2, 1_000),
                ending(1, 300, "complete", 1),
            ]
            .concat(),
        );
        assert_eq!(check(&history).verdict, Verdict::Invalid);
    }
}
