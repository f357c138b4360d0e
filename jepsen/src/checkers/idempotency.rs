//! Idempotency (docs/guarantees.md G8): every mutation the workers send carries an `Idempotency-Key`, and an
//! unknown one is sometimes retried with the same key on another node. Per key: at most one
//! answer is an original (not `Idempotent-Replayed`), so it took effect at most once, and every
//! successful answer has the same body fingerprint (and fence): replays are identical.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::CheckResult;
use crate::history::{pairs, Op, OpType, Pair};

/// Checks idempotent retries.
pub fn check(history: &[Op]) -> CheckResult {
    let mut by_key: BTreeMap<&str, Vec<Pair<'_>>> = BTreeMap::new();
    for pair in pairs(history) {
        if let Some(key) = pair.invoke.value["idempotency_key"].as_str() {
            by_key.entry(key).or_default().push(pair);
        }
    }
    let mut violations: Vec<Value> = Vec::new();
    let mut retried = 0usize;
    let mut replays = 0usize;
    for (key, attempts) in &by_key {
        if attempts.len() > 1 {
            retried += 1;
        }
        let answers: Vec<&Pair<'_>> = attempts
            .iter()
            .filter(|pair| pair.outcome() == OpType::Ok)
            .collect();
        let originals = answers
            .iter()
            .filter(|pair| pair.result()["replayed"] != Value::Bool(true))
            .count();
        replays += answers.len() - originals;
        if originals > 1 {
            violations.push(
                json!({"problem": "a key took effect more than once", "key": key,
                "invocations": answers.iter().map(|pair| pair.invoke.index).collect::<Vec<_>>()}),
            );
        }
        let shapes: Vec<(&Value, &Value)> = answers
            .iter()
            .map(|pair| (&pair.result()["digest"], &pair.result()["fence"]))
            .collect();
        if shapes.windows(2).any(|two| two[0] != two[1]) {
            violations.push(
                json!({"problem": "a replay differs from the first answer", "key": key,
                "invocations": answers.iter().map(|pair| pair.invoke.index).collect::<Vec<_>>(),
                "answers": answers.iter().map(|pair| pair.result().clone()).collect::<Vec<_>>()}),
            );
        }
    }
    CheckResult::from_violations(
        &format!(
            "{} keys, {retried} retried, {replays} replays",
            by_key.len()
        ),
        violations,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkers::Verdict;
    use crate::history::build::{indexed, op};

    fn attempt(process: u64, at: u64, kind: OpType, answer: Value) -> Vec<Op> {
        vec![
            op(
                process,
                OpType::Invoke,
                at,
                "acquire",
                "a",
                json!({"idempotency_key": "k"}),
            ),
            op(process, kind, at + 1, "acquire", "a", answer),
        ]
    }

    #[test]
    fn an_unknown_then_a_replay_passes() {
        let history = indexed(
            [
                attempt(1, 0, OpType::Info, Value::Null),
                attempt(
                    2,
                    5,
                    OpType::Ok,
                    json!({"fence": 3, "digest": "d", "replayed": true}),
                ),
            ]
            .concat(),
        );
        assert_eq!(check(&history).verdict, Verdict::Valid);
    }

    #[test]
    fn a_key_applied_twice_is_caught() {
        let history = indexed(
            [
                attempt(
                    1,
                    0,
                    OpType::Ok,
                    json!({"fence": 3, "digest": "d", "replayed": false}),
                ),
                attempt(
                    2,
                    5,
                    OpType::Ok,
                    json!({"fence": 4, "digest": "e", "replayed": false}),
                ),
            ]
            .concat(),
        );
        assert_eq!(check(&history).verdict, Verdict::Invalid);
    }

    #[test]
    fn a_replay_with_another_body_is_caught() {
        let history = indexed(
            [
                attempt(
                    1,
                    0,
                    OpType::Ok,
                    json!({"fence": 3, "digest": "d", "replayed": false}),
                ),
                attempt(
                    2,
                    5,
                    OpType::Ok,
                    json!({"fence": 3, "digest": "x", "replayed": true}),
                ),
            ]
            .concat(),
        );
        assert_eq!(check(&history).verdict, Verdict::Invalid);
    }
}
