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

/// The recorded holds, by start.
fn holds(history: &[Op]) -> Vec<Hold<'_>> {
    let mut holds: Vec<Hold<'_>> = history
        .iter()
        .filter(|op| op.is_named(HOLDS) && op.f == "hold")
        .map(|op| Hold {
            lease: op.value["lease"].as_str().unwrap_or(""),
            resource: op.key_str(),
            mode: Mode::parse(
                op.value["mode"].as_str().unwrap_or(""),
                op.value["limit"].as_u64(),
            ),
            fence: op.value["fence"].as_u64().unwrap_or(0),
            start_ns: op.value["start_ns"].as_u64().unwrap_or(0),
            end_ns: op.value["end_ns"].as_u64().unwrap_or(0),
        })
        .filter(|hold| hold.end_ns > hold.start_ns)
        .collect();
    holds.sort_by_key(|hold| hold.start_ns);
    holds
}

/// Checks the hold intervals.
pub fn check(history: &[Op]) -> CheckResult {
    let holds = holds(history);
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

/// Shared leases (G2 for semaphores): at no moment do more holders of a path hold it, by their
/// guaranteed intervals, than its limit; and every holder of a path gave the same limit while
/// they overlapped.
pub fn check_limits(history: &[Op]) -> CheckResult {
    let holds = holds(history);
    let mut by_path: std::collections::BTreeMap<&str, Vec<&Hold<'_>>> = Default::default();
    for hold in &holds {
        if let Mode::Shared { .. } = hold.mode {
            by_path.entry(hold.resource).or_default().push(hold);
        }
    }
    let shared = by_path.values().map(Vec::len).sum::<usize>();
    let mut violations: Vec<Value> = Vec::new();
    for (path, holds) in &by_path {
        // Sweep the starts and ends in time order (an end before a start at the same instant:
        // intervals are half open).
        let mut edges: Vec<(u64, bool, &Hold<'_>)> = holds
            .iter()
            .flat_map(|hold| [(hold.start_ns, true, *hold), (hold.end_ns, false, *hold)])
            .collect();
        edges.sort_by_key(|(at, start, _)| (*at, *start));
        let mut holding: Vec<&Hold<'_>> = Vec::new();
        for (at, start, hold) in edges {
            if !start {
                holding.retain(|other| !std::ptr::eq(*other, hold));
                continue;
            }
            holding.push(hold);
            let limit = hold.mode.limit().unwrap_or(1) as usize;
            let limits_differ = holding.iter().any(|other| other.mode != hold.mode);
            if holding.len() > limit || limits_differ {
                violations.push(json!({
                    "problem": if limits_differ {
                        "holders of a shared lease overlapped with different limits"
                    } else {
                        "more holders of a shared lease at once than its limit"
                    },
                    "resource": path,
                    "limit": limit,
                    "at_ms": ms(at),
                    "holders": holding.iter().map(|other| json!({
                        "lease": other.lease, "fence": other.fence, "limit": other.mode.limit(),
                        "from_ms": ms(other.start_ns), "until_ms": ms(other.end_ns),
                    })).collect::<Vec<_>>(),
                }));
            }
        }
    }
    CheckResult::from_violations(&format!("{shared} shared holds"), violations)
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

    fn shared(lease: &str, resource: &str, limit: u32, from_ms: u64, to_ms: u64) -> Op {
        let mut op = hold(lease, resource, "shared", from_ms, to_ms);
        op.value["limit"] = json!(limit);
        op
    }

    #[test]
    fn shared_holds_up_to_their_limit_pass_and_one_more_is_caught() {
        let within = indexed(vec![
            shared("l1", "s", 2, 0, 100),
            shared("l2", "s", 2, 50, 150),
            // l1 has ended when l3 starts.
            shared("l3", "s", 2, 100, 200),
            shared("l4", "other", 2, 0, 200),
        ]);
        assert_eq!(check_limits(&within).verdict, Verdict::Valid);
        assert_eq!(check(&within).verdict, Verdict::Valid);
        let over = indexed(vec![
            shared("l1", "s", 2, 0, 100),
            shared("l2", "s", 2, 50, 150),
            shared("l3", "s", 2, 99, 200),
        ]);
        assert_eq!(check_limits(&over).verdict, Verdict::Invalid);
        let mixed = indexed(vec![
            shared("l1", "s", 2, 0, 100),
            shared("l2", "s", 3, 50, 150),
        ]);
        assert_eq!(check_limits(&mixed).verdict, Verdict::Invalid);
    }

    #[test]
    fn a_shared_hold_overlapping_an_exclusive_or_covering_one_is_caught() {
        let exclusive = indexed(vec![
            shared("l1", "t/s", 2, 0, 100),
            hold("l2", "t/s", "exclusive", 50, 150),
        ]);
        assert_eq!(check(&exclusive).verdict, Verdict::Invalid);
        let subtree = indexed(vec![
            shared("l1", "t/s", 2, 0, 100),
            hold("l2", "t", "subtree", 50, 150),
        ]);
        assert_eq!(check(&subtree).verdict, Verdict::Invalid);
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
