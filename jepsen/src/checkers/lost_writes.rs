//! Durability (docs/guarantees.md G5) of the fenced registers: after healing the harness reads every
//! register on every node (process `final`, f `final-read`). Every node must return the same
//! value; that value must have been written (ok or unknown), or be empty only if no write was
//! acknowledged; and no acknowledged write may have been invoked after the write whose value
//! survived had completed (it would have overwritten it: it was lost).

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::{ms, CheckResult, Verdict};
use crate::history::{pairs, Op, OpType, FINAL};

/// Checks the final reads against the acknowledged writes.
pub fn check(history: &[Op]) -> CheckResult {
    // key -> value -> (invoke ns, end ns, acknowledged)
    let mut writes: BTreeMap<&str, Vec<(Value, u64, u64, bool)>> = BTreeMap::new();
    for pair in pairs(history)
        .into_iter()
        .filter(|pair| pair.invoke.f == "write")
    {
        if pair.outcome() == OpType::Fail {
            continue;
        }
        // A pair write writes its value under both its keys.
        for key in pair.invoke.written_keys() {
            writes.entry(key).or_default().push((
                pair.invoke.value["value"].clone(),
                pair.invoke.time_ns,
                pair.end_ns(),
                pair.outcome() == OpType::Ok,
            ));
        }
    }
    let mut finals: BTreeMap<&str, Vec<(u64, Option<&Value>)>> = BTreeMap::new();
    for op in history
        .iter()
        .filter(|op| op.is_named(FINAL) && op.f == "final-read")
    {
        let node = op.value["node"].as_u64().unwrap_or(0);
        let value = (op.value["ok"] == Value::Bool(true)).then(|| &op.value["value"]);
        finals.entry(op.key_str()).or_default().push((node, value));
    }
    let mut violations: Vec<Value> = Vec::new();
    let mut unread = 0usize;
    for (key, key_writes) in &writes {
        let Some(reads) = finals.get(key) else {
            unread += 1;
            continue;
        };
        let values: Vec<&Value> = reads.iter().filter_map(|(_, value)| *value).collect();
        if values.is_empty() {
            unread += 1;
            continue;
        }
        if values.windows(2).any(|two| two[0] != two[1]) {
            violations.push(
                json!({"problem": "nodes disagree after healing", "key": key, "reads": reads}),
            );
            continue;
        }
        let survivor = values[0];
        let acknowledged: Vec<&(Value, u64, u64, bool)> =
            key_writes.iter().filter(|write| write.3).collect();
        if survivor.is_null() {
            if let Some(write) = acknowledged.first() {
                violations.push(json!({"problem": "acknowledged write lost: the register is empty",
                                       "key": key, "value": write.0, "acknowledged_ms": ms(write.2)}));
            }
            continue;
        }
        let Some(source) = key_writes.iter().find(|write| &write.0 == survivor) else {
            violations.push(
                json!({"problem": "final value was never written", "key": key, "value": survivor}),
            );
            continue;
        };
        for write in acknowledged.iter().filter(|write| write.1 > source.2) {
            violations.push(json!({"problem": "acknowledged write lost", "key": key,
                "lost_value": write.0, "lost_invoked_ms": ms(write.1),
                "surviving_value": survivor, "surviving_completed_ms": ms(source.2)}));
        }
    }
    let result = CheckResult::from_violations(&format!("{} registers", writes.len()), violations);
    if result.verdict == Verdict::Valid && unread > 0 {
        return CheckResult {
            verdict: Verdict::Unknown,
            summary: format!("{unread} registers could not be read after healing"),
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

    fn write(process: u64, from: u64, to: u64, value: u64) -> Vec<Op> {
        vec![
            op(
                process,
                OpType::Invoke,
                from,
                "write",
                "r",
                json!({"value": value}),
            ),
            op(
                process,
                OpType::Ok,
                to,
                "write",
                "r",
                json!({"value": value}),
            ),
        ]
    }

    fn final_read(node: u64, value: Value) -> Op {
        let mut read = op(
            0,
            OpType::Info,
            100,
            "final-read",
            "r",
            json!({"node": node, "ok": true, "value": value}),
        );
        read.process = Process::Named(FINAL.to_owned());
        read
    }

    #[test]
    fn the_last_write_surviving_passes() {
        let history = indexed(
            [
                write(1, 0, 1, 1),
                write(2, 2, 3, 2),
                vec![final_read(1, json!(2)), final_read(2, json!(2))],
            ]
            .concat(),
        );
        assert_eq!(check(&history).verdict, Verdict::Valid);
    }

    #[test]
    fn a_lost_acknowledged_write_is_caught() {
        let history = indexed(
            [
                write(1, 0, 1, 1),
                write(2, 2, 3, 2),
                vec![final_read(1, json!(1)), final_read(2, json!(1))],
            ]
            .concat(),
        );
        assert_eq!(check(&history).verdict, Verdict::Invalid);
    }

    #[test]
    fn disagreeing_nodes_are_caught() {
        let history = indexed(
            [
                write(1, 0, 1, 1),
                vec![final_read(1, json!(1)), final_read(2, Value::Null)],
            ]
            .concat(),
        );
        assert_eq!(check(&history).verdict, Verdict::Invalid);
    }
}
