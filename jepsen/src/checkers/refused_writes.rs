//! Refusals mean "not applied" (docs/api.md: `NO_LEADER` only ever means "surely not
//! applied"; STYLE rule 8): a register write that failed, as one logical operation (every
//! attempt with its idempotency key failed), must never become visible, neither to a client's
//! read nor in the final reads after healing. Written values are unique per write, so a value
//! seen names its write. The `fenced-kv` workload's non-retrying client is what makes this
//! bite: it sends no Idempotency-Key and never retries, so a server that answers `NO_LEADER`
//! for a write it then applies is caught here instead of being papered over by a replay.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::{ms, CheckResult};
use crate::history::{logical_pairs, pairs, Op, OpType, FINAL};

/// Checks that no refused write is ever seen.
pub fn check(history: &[Op]) -> CheckResult {
    // (key, value) -> (error code, invoke index, completion ns) of a refused write.
    let mut refused: BTreeMap<(&str, String), (&str, u64, u64)> = BTreeMap::new();
    let mut no_leader = 0usize;
    let mut refused_writes = 0usize;
    for pair in logical_pairs(history)
        .into_iter()
        .filter(|pair| pair.invoke.f == "write" && pair.outcome() == OpType::Fail)
    {
        let value = &pair.invoke.value["value"];
        if value.is_null() {
            continue;
        }
        let code = pair
            .complete
            .and_then(|op| op.error.as_deref())
            .unwrap_or("");
        no_leader += usize::from(code == "NO_LEADER");
        refused_writes += 1;
        // A refused pair write is seen under neither of its keys.
        for key in pair.invoke.written_keys() {
            refused.insert(
                (key, value.to_string()),
                (code, pair.invoke.index, pair.end_ns()),
            );
        }
    }
    let mut violations: Vec<Value> = Vec::new();
    let mut seen = |key: &str, value: &Value, by: Value| {
        if let Some((code, index, refused_ns)) = refused.get(&(key, value.to_string())) {
            violations.push(json!({
                "problem": "a write refused as surely not applied became visible",
                "key": key, "value": value, "error": code, "write": index,
                "refused_ms": ms(*refused_ns), "seen_by": by,
            }));
        }
    };
    for pair in pairs(history)
        .into_iter()
        .filter(|pair| pair.invoke.f == "read" && pair.outcome() == OpType::Ok)
    {
        let value = &pair.result()["value"];
        if !value.is_null() {
            seen(
                pair.invoke.key_str(),
                value,
                json!({"read": pair.invoke.index, "at_ms": ms(pair.end_ns())}),
            );
        }
    }
    for op in history
        .iter()
        .filter(|op| op.is_named(FINAL) && op.f == "final-read")
    {
        let value = &op.value["value"];
        if op.value["ok"] == Value::Bool(true) && !value.is_null() {
            seen(
                op.key_str(),
                value,
                json!({"final_read_on_node": op.value["node"]}),
            );
        }
    }
    CheckResult::from_violations(
        &format!("{refused_writes} refused writes ({no_leader} NO_LEADER) never seen"),
        violations,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkers::Verdict;
    use crate::history::build::{indexed, op};
    use crate::history::Process;

    fn write(process: u64, at: u64, value: u64, outcome: OpType, error: Option<&str>) -> Vec<Op> {
        let mut done = op(process, outcome, at + 2, "write", "r0-0", Value::Null);
        done.error = error.map(str::to_owned);
        vec![
            op(
                process,
                OpType::Invoke,
                at,
                "write",
                "r0-0",
                json!({"value": value, "idempotency_key": null}),
            ),
            done,
        ]
    }

    fn read(process: u64, at: u64, value: Value) -> Vec<Op> {
        vec![
            op(process, OpType::Invoke, at, "read", "r0-0", Value::Null),
            op(
                process,
                OpType::Ok,
                at + 1,
                "read",
                "r0-0",
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
            "r0-0",
            json!({"node": node, "ok": true, "value": value}),
        );
        read.process = Process::Named(FINAL.to_owned());
        read
    }

    #[test]
    fn refused_writes_that_stay_invisible_pass() {
        let history = indexed(
            [
                write(1, 0, 7, OpType::Ok, None),
                write(2, 5, 8, OpType::Fail, Some("NO_LEADER")),
                // An unknown write may well show up.
                write(3, 10, 9, OpType::Info, Some("TIMEOUT")),
                read(4, 20, json!(9)),
                vec![final_read(1, json!(9)), final_read(2, json!(9))],
            ]
            .concat(),
        );
        assert_eq!(check(&history).verdict, Verdict::Valid);
    }

    #[test]
    fn a_no_leader_write_read_later_is_caught() {
        let history = indexed(
            [
                write(1, 0, 7, OpType::Ok, None),
                write(2, 5, 8, OpType::Fail, Some("NO_LEADER")),
                read(4, 20, json!(8)),
            ]
            .concat(),
        );
        let result = check(&history);
        assert_eq!(result.verdict, Verdict::Invalid);
        assert_eq!(result.details[0]["error"], "NO_LEADER");
    }

    #[test]
    fn a_no_leader_write_in_the_final_read_is_caught() {
        let history = indexed(
            [
                write(2, 5, 8, OpType::Fail, Some("NO_LEADER")),
                vec![final_read(3, json!(8))],
            ]
            .concat(),
        );
        assert_eq!(check(&history).verdict, Verdict::Invalid);
    }

    #[test]
    fn a_refused_attempt_retried_with_its_key_until_ok_is_not_a_refusal() {
        let mut history = [
            write(2, 5, 8, OpType::Fail, Some("NO_LEADER")),
            write(2, 10, 8, OpType::Ok, None),
            read(4, 20, json!(8)),
        ]
        .concat();
        history[0].value["idempotency_key"] = json!("k-1");
        history[2].value["idempotency_key"] = json!("k-1");
        assert_eq!(check(&indexed(history)).verdict, Verdict::Valid);
    }

    #[test]
    fn a_refused_pair_write_seen_under_its_twin_is_caught() {
        let mut history = [
            write(2, 5, 8, OpType::Fail, Some("NO_LEADER")),
            vec![final_read(3, json!(8))],
        ]
        .concat();
        history[0].value["twin"] = json!("t0-0");
        history[2].key = json!("t0-0");
        let result = check(&indexed(history));
        assert_eq!(result.verdict, Verdict::Invalid);
        assert_eq!(result.details[0]["key"], "t0-0");
    }
}
