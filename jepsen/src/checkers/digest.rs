//! Replicas agree (docs/harness.md): after healing, the harness samples every node's
//! `/v1/debug/digest` many times (process `final`, f `digest`, one event per node with its
//! samples `{applied_index: digest}`). At every applied index two nodes both reported, their
//! digests must be equal. No common index at all is `unknown`.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::{CheckResult, Verdict};
use crate::history::{Op, FINAL};

/// Checks the digests.
pub fn check(history: &[Op]) -> CheckResult {
    // applied index -> node -> digest
    let mut at: BTreeMap<u64, BTreeMap<u64, &str>> = BTreeMap::new();
    let mut nodes = 0usize;
    for op in history
        .iter()
        .filter(|op| op.is_named(FINAL) && op.f == "digest")
    {
        nodes += 1;
        let node = op.value["node"].as_u64().unwrap_or(0);
        if let Some(samples) = op.value["samples"].as_object() {
            for (index, digest) in samples {
                if let (Ok(index), Some(digest)) = (index.parse::<u64>(), digest.as_str()) {
                    at.entry(index).or_default().insert(node, digest);
                }
            }
        }
    }
    let mut violations: Vec<Value> = Vec::new();
    let mut compared = 0usize;
    let mut all_nodes_at_once = 0usize;
    for (index, digests) in &at {
        if digests.len() < 2 {
            continue;
        }
        compared += 1;
        if digests.len() == nodes {
            all_nodes_at_once += 1;
        }
        let mut values = digests.values();
        let first = values.next().copied();
        if values.any(|digest| Some(*digest) != first) {
            violations.push(json!({"problem": "nodes differ at the same applied index",
                                   "applied_index": index, "digests": digests}));
        }
    }
    if violations.is_empty() && compared == 0 {
        return CheckResult {
            verdict: Verdict::Unknown,
            summary: format!("no applied index reported by two of {nodes} nodes"),
            details: Value::Null,
        };
    }
    CheckResult::from_violations(
        &format!("{compared} common applied indexes ({all_nodes_at_once} on all {nodes} nodes)"),
        violations,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{build::indexed, OpType, Process};

    fn samples(node: u64, samples: Value) -> Op {
        Op {
            index: 0,
            time_ns: 0,
            process: Process::Named(FINAL.to_owned()),
            kind: OpType::Info,
            f: "digest".to_owned(),
            key: Value::Null,
            value: json!({"node": node, "samples": samples}),
            error: None,
            cluster_time_ms: None,
            node: Some(node),
        }
    }

    #[test]
    fn equal_digests_pass() {
        let history = indexed(vec![
            samples(1, json!({"10": "a", "11": "b"})),
            samples(2, json!({"11": "b", "12": "c"})),
        ]);
        assert_eq!(check(&history).verdict, Verdict::Valid);
    }

    #[test]
    fn differing_digests_are_caught() {
        let history = indexed(vec![
            samples(1, json!({"10": "a"})),
            samples(2, json!({"10": "z"})),
        ]);
        assert_eq!(check(&history).verdict, Verdict::Invalid);
    }

    #[test]
    fn no_common_index_is_unknown() {
        let history = indexed(vec![
            samples(1, json!({"10": "a"})),
            samples(2, json!({"11": "a"})),
        ]);
        assert_eq!(check(&history).verdict, Verdict::Unknown);
    }
}
