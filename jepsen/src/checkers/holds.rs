//! Exclusion as the holders see it (docs/guarantees.md G2 with G7): no two holders' guaranteed-hold
//! intervals overlap on a path both cover, subtree coverage understood. A hold is recorded by
//! its holder (process `holds`) from the moment the grant came back to the end of its G7
//! validity, cut short by its own release and stretched to its last accepted write (a holder
//! that stalled and wrote late acted as holder until then). Under `clock-beyond` this checker
//! is reported but not counted: outside G6's assumptions only fences keep a resource safe.

use serde_json::{json, Value};

use super::{ms, CheckResult};
use crate::history::Op;
use crate::workloads::{overlapping, Mode, HOLDS};

struct Hold<'a> {
    lease: &'a str,
    resource: &'a str,
    mode: Mode,
    fence: u64,
    start_ns: u64,
    end_ns: u64,
}

/// Checks the hold intervals.
pub fn check(history: &[Op]) -> CheckResult {
    let mut holds: Vec<Hold<'_>> = history
        .iter()
        .filter(|op| op.is_named(HOLDS) && op.f == "hold")
        .map(|op| Hold {
            lease: op.value["lease"].as_str().unwrap_or(""),
            resource: op.key_str(),
            mode: Mode::parse(op.value["mode"].as_str().unwrap_or("")),
            fence: op.value["fence"].as_u64().unwrap_or(0),
            start_ns: op.value["start_ns"].as_u64().unwrap_or(0),
            end_ns: op.value["end_ns"].as_u64().unwrap_or(0),
        })
        .filter(|hold| hold.end_ns > hold.start_ns)
        .collect();
    holds.sort_by_key(|hold| hold.start_ns);
    let mut violations: Vec<Value> = Vec::new();
    for (position, first) in holds.iter().enumerate() {
        for second in holds[position + 1..]
            .iter()
            .take_while(|second| second.start_ns < first.end_ns)
        {
            if first.lease != second.lease
                && overlapping((first.resource, first.mode), (second.resource, second.mode))
            {
                violations.push(json!({
                    "problem": "two holders' guaranteed-hold intervals overlap on a covered path",
                    "first": {"lease": first.lease, "resource": first.resource, "mode": first.mode.as_str(),
                              "fence": first.fence, "from_ms": ms(first.start_ns), "until_ms": ms(first.end_ns)},
                    "second": {"lease": second.lease, "resource": second.resource, "mode": second.mode.as_str(),
                               "fence": second.fence, "from_ms": ms(second.start_ns), "until_ms": ms(second.end_ns)},
                    "overlap_ms": ms(first.end_ns.min(second.end_ns) - second.start_ns),
                }));
            }
        }
    }
    CheckResult::from_violations(&format!("{} holds", holds.len()), violations)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkers::Verdict;
    use crate::history::{build::indexed, OpType, Process};

    fn hold(lease: &str, resource: &str, mode: &str, from_ms: u64, to_ms: u64) -> Op {
        Op {
            index: 0,
            time_ns: to_ms * 1_000_000,
            process: Process::Named(HOLDS.to_owned()),
            kind: OpType::Info,
            f: "hold".to_owned(),
            key: Value::from(resource),
            value: json!({"lease": lease, "mode": mode, "fence": 1,
                          "start_ns": from_ms * 1_000_000, "end_ns": to_ms * 1_000_000}),
            error: None,
            cluster_time_ms: None,
            node: None,
        }
    }

    #[test]
    fn handed_over_holds_pass() {
        let history = indexed(vec![
            hold("l1", "t/a", "exclusive", 0, 100),
            hold("l2", "t/a", "exclusive", 101, 200),
            // Disjoint paths may overlap in time.
            hold("l3", "t/b", "exclusive", 50, 150),
            hold("l4", "t/a/x", "exclusive", 50, 150),
        ]);
        assert_eq!(check(&history).verdict, Verdict::Valid);
    }

    #[test]
    fn overlapping_exclusive_holds_are_caught() {
        let history = indexed(vec![
            hold("l1", "t/a", "exclusive", 0, 100),
            hold("l2", "t/a", "exclusive", 90, 200),
        ]);
        assert_eq!(check(&history).verdict, Verdict::Invalid);
    }

    #[test]
    fn a_subtree_hold_overlapping_a_hold_below_it_is_caught() {
        let history = indexed(vec![
            hold("l1", "t/a/x", "exclusive", 0, 100),
            hold("l2", "t", "subtree", 50, 200),
        ]);
        assert_eq!(check(&history).verdict, Verdict::Invalid);
    }
}
