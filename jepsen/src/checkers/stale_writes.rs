//! Fenced writes (docs/guarantees.md G4) as the protected resources see them.
//!
//! The harness's protected resource (process `resource`): per path, the fences of accepted
//! writes never go down in the order the resource accepted them (a stale-fenced write
//! accepted is a violation), and every accepted fence was granted for that lease's resource
//! (no phantom fence). Baton's own fenced key-value store: a fenced write that succeeded must
//! not carry a token older than a grant on the same resource that had completed before the
//! write was sent (that token cannot have been live), and its token must have been granted.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Value};

use super::{ms, CheckResult};
use crate::history::{logical_pairs, Op, OpType, Pair};
use crate::workloads::RESOURCE;

/// Checks stale and phantom fences. `history` is the run as the cluster at its end knows it,
/// `recorded` as it was recorded: they differ only in a run with restores
/// (`history::undone`). A fence a restore undid was granted all the same (a holder may still
/// show it to a resource, and its resource's writes are real); the grants that make a token
/// superseded are the ones the cluster still knows.
pub fn check(history: &[Op], recorded: &[Op]) -> CheckResult {
    // A retried write took effect during its first attempt (see `logical_pairs`).
    let all = logical_pairs(history);
    let grants = |pairs: &[Pair<'_>]| -> Vec<(String, u64, u64)> {
        pairs
            .iter()
            .filter(|pair| pair.invoke.f == "acquire" && pair.outcome() == OpType::Ok)
            .filter_map(|pair| {
                Some((
                    pair.invoke.key_str().to_owned(),
                    pair.result()["fence"].as_u64()?,
                    pair.end_ns(),
                ))
            })
            .collect()
    };
    let known = grants(&all);
    let granted: BTreeSet<(String, u64)> = grants(&logical_pairs(recorded))
        .into_iter()
        .map(|(resource, fence, _)| (resource, fence))
        .collect();
    let granted = |resource: &str, fence: u64| granted.contains(&(resource.to_owned(), fence));
    let mut violations: Vec<Value> = Vec::new();
    let mut highest: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    let mut accepted = 0usize;
    for op in history
        .iter()
        .filter(|op| op.is_named(RESOURCE) && op.f == "write")
    {
        if op.kind != OpType::Ok {
            continue;
        }
        accepted += 1;
        let fence = op.value["fence"].as_u64().unwrap_or(0);
        if !granted(op.key_str(), fence) {
            violations.push(
                json!({"problem": "phantom fence accepted", "index": op.index,
                                   "resource": op.key_str(), "fence": fence}),
            );
        }
        for path in op.value["paths"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
        {
            let top = highest.entry(path.to_owned()).or_insert((0, 0));
            if fence < top.0 {
                violations.push(json!({"problem": "stale-fenced write accepted", "index": op.index,
                    "path": path, "fence": fence, "lease": op.value["lease"],
                    "higher_fence_accepted_before": top.0, "at_index": top.1, "time_ms": ms(op.time_ns)}));
            } else {
                *top = (fence, op.index);
            }
        }
    }
    // Baton's fenced kv writes.
    let mut kv_writes = 0usize;
    for pair in all
        .iter()
        .filter(|pair| pair.invoke.f == "write" && pair.outcome() == OpType::Ok)
    {
        let (Some(resource), Some(token)) = (
            pair.invoke.value["resource"].as_str(),
            pair.invoke.value["fence"].as_u64(),
        ) else {
            continue;
        };
        kv_writes += 1;
        if !granted(resource, token) {
            violations.push(json!({"problem": "kv write applied with a phantom fence",
                                   "invocation": pair.invoke.index, "resource": resource, "fence": token}));
        }
        if let Some(&(_, newer, completed)) =
            known.iter().find(|(known_resource, fence, completed)| {
                known_resource == resource && *fence > token && *completed < pair.invoke.time_ns
            })
        {
            violations.push(
                json!({"problem": "kv write applied with a superseded fence",
                "invocation": pair.invoke.index, "key": pair.invoke.key_str(), "resource": resource,
                "fence": token, "newer_fence": newer, "newer_granted_by_ms": ms(completed),
                "write_invoked_ms": ms(pair.invoke.time_ns)}),
            );
        }
    }
    CheckResult::from_violations(
        &format!("{accepted} accepted resource writes, {kv_writes} fenced kv writes"),
        violations,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkers::Verdict;
    use crate::history::build::{indexed, op};
    use crate::history::Process;

    fn granted(process: u64, at: u64, resource: &str, fence: u64) -> Vec<Op> {
        vec![
            op(process, OpType::Invoke, at, "acquire", resource, json!({})),
            op(
                process,
                OpType::Ok,
                at + 1,
                "acquire",
                resource,
                json!({"fence": fence}),
            ),
        ]
    }

    fn write(resource: &str, fence: u64, paths: &[&str]) -> Op {
        let mut write = op(
            0,
            OpType::Ok,
            50,
            "write",
            resource,
            json!({"fence": fence, "paths": paths, "lease": "l"}),
        );
        write.process = Process::Named(RESOURCE.to_owned());
        write
    }

    #[test]
    fn rising_writes_pass() {
        let history = indexed(
            [
                granted(1, 0, "t/a", 3),
                granted(2, 5, "t", 4),
                vec![write("t/a", 3, &["t/a"]), write("t", 4, &["t", "t/a"])],
            ]
            .concat(),
        );
        assert_eq!(check(&history, &history).verdict, Verdict::Valid);
    }

    #[test]
    fn a_stale_write_on_a_covered_path_is_caught() {
        let history = indexed(
            [
                granted(1, 0, "t/a", 3),
                granted(2, 5, "t", 4),
                vec![write("t", 4, &["t", "t/a"]), write("t/a", 3, &["t/a"])],
            ]
            .concat(),
        );
        assert_eq!(check(&history, &history).verdict, Verdict::Invalid);
    }

    #[test]
    fn a_phantom_fence_is_caught() {
        let history = indexed([granted(1, 0, "t/a", 3), vec![write("t/a", 9, &["t/a"])]].concat());
        assert_eq!(check(&history, &history).verdict, Verdict::Invalid);
    }

    /// Seen in a real run under `membership`: a fenced kv write timed out while its fence was
    /// live, a newer fence was granted, then the write's retry (same idempotency key) was
    /// answered with its recorded result. The write was applied during its first attempt.
    #[test]
    fn a_retried_kv_write_counts_from_its_first_attempt() {
        let attempt = |process: u64, at: u64, kind: OpType| {
            let value =
                json!({"value": 1, "fence": 3, "resource": "kvlock/r", "idempotency_key": "w1"});
            vec![
                op(process, OpType::Invoke, at, "write", "r", value),
                op(
                    process,
                    kind,
                    at + 1,
                    "write",
                    "r",
                    json!({"replayed": kind == OpType::Ok}),
                ),
            ]
        };
        let history = indexed(
            [
                granted(1, 0, "kvlock/r", 3),
                attempt(2, 5, OpType::Info),
                granted(3, 10, "kvlock/r", 4),
                attempt(4, 20, OpType::Ok),
            ]
            .concat(),
        );
        assert_eq!(check(&history, &history).verdict, Verdict::Valid);
        let history = indexed(
            [
                granted(1, 0, "kvlock/r", 3),
                granted(3, 10, "kvlock/r", 4),
                attempt(4, 20, OpType::Ok),
            ]
            .concat(),
        );
        assert_eq!(check(&history, &history).verdict, Verdict::Invalid);
    }

    #[test]
    fn a_kv_write_with_a_superseded_fence_is_caught() {
        let history = indexed(
            [
                granted(1, 0, "kvlock/r", 3),
                granted(2, 10, "kvlock/r", 4),
                vec![
                    op(
                        1,
                        OpType::Invoke,
                        20,
                        "write",
                        "r",
                        json!({"value": 1, "fence": 3, "resource": "kvlock/r"}),
                    ),
                    op(1, OpType::Ok, 21, "write", "r", json!({"value": 1})),
                ],
            ]
            .concat(),
        );
        assert_eq!(check(&history, &history).verdict, Verdict::Invalid);
    }

    /// Across a restore: fence 4 was granted after the backup and undone by the restore, so the
    /// backup's holder of fence 3 writes to the restored cluster's kv rightly; the holder of
    /// fence 4 still shows it to the harness's resource, and it is no phantom. Judged on the
    /// recorded history alone, the kv write would look superseded.
    #[test]
    fn a_restore_undoes_a_grant_for_the_kv_but_not_for_the_resource() {
        let nemesis = |at: u64, f: &str, value: Value| {
            let mut event = op(0, OpType::Info, at, f, "", value);
            event.process = Process::Named(crate::history::NEMESIS.to_owned());
            event
        };
        let kv_write = |at: u64| {
            vec![
                op(
                    1,
                    OpType::Invoke,
                    at,
                    "write",
                    "r",
                    json!({"value": 1, "fence": 3, "resource": "kvlock/r"}),
                ),
                op(1, OpType::Ok, at + 1, "write", "r", json!({"value": 1})),
            ]
        };
        let recorded = indexed(
            [
                granted(1, 0, "kvlock/r", 3),
                vec![nemesis(5, "start", json!({"fault": "restore"}))],
                granted(2, 10, "kvlock/r", 4),
                vec![nemesis(
                    30,
                    "stop",
                    json!({"fault": "restore", "saved": true}),
                )],
                kv_write(40),
                vec![write("kvlock/r", 4, &["kvlock/r"])],
            ]
            .concat(),
        );
        let undone = crate::history::undone(&recorded);
        let result = check(&undone, &recorded);
        assert_eq!(result.verdict, Verdict::Valid, "{}", result.details);
        assert_eq!(check(&recorded, &recorded).verdict, Verdict::Invalid);
    }
}
