//! Linearizability (docs/guarantees.md G1) of the fenced key-value registers, key by key (a register's
//! history is independent of the others', so the search is partitioned by key).
//!
//! The search is Wing and Gong's, with Lowe's memoization: from the set of operations already
//! linearized and the register's value, try every pending operation that may go next (one
//! invoked before every pending operation's completion), in a depth-first search that never
//! revisits a `(linearized set, value)` configuration. Unknown writes (`info`) never complete,
//! so they may take effect at any time after their invocation, or never; failed writes and
//! reads that did not succeed are left out; the final reads after healing are reads like any
//! other. Past the time limit the answer is `unknown`, never `valid`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{ms, CheckResult, Verdict};
use crate::history::{logical_pairs, Op, OpType, FINAL};

#[derive(Debug, Clone, Copy)]
enum Kind {
    Read(u32),
    Write(u32),
}

#[derive(Debug, Clone, Copy)]
struct LinOp {
    kind: Kind,
    invoke_ns: u64,
    end_ns: u64,
    required: bool,
    index: u64,
}

/// One register operation before value numbering: (value, is a write, invoke ns, end ns,
/// must be linearized, history index).
type Entry = (Value, bool, u64, u64, bool, u64);

/// What the search of one key came to.
#[derive(Debug, PartialEq, Eq)]
enum Search {
    Linearizable,
    NotLinearizable,
    TimedOut,
}

/// Checks every register.
pub fn check(history: &[Op], limit: Duration) -> CheckResult {
    let deadline = Instant::now() + limit;
    // key -> (value, is_write, invoke, end, required, index)
    let mut by_key: BTreeMap<&str, Vec<Entry>> = BTreeMap::new();
    // The attempts of one write are one operation, from its first attempt (`logical_pairs`).
    // A pair write is a write of each of its two keys.
    for pair in logical_pairs(history) {
        let key = pair.invoke.key_str();
        match (pair.invoke.f.as_str(), pair.outcome()) {
            ("write", OpType::Fail) => {}
            ("write", outcome) => {
                for key in pair.invoke.written_keys() {
                    by_key.entry(key).or_default().push((
                        pair.invoke.value["value"].clone(),
                        true,
                        pair.invoke.time_ns,
                        pair.end_ns(),
                        outcome == OpType::Ok,
                        pair.invoke.index,
                    ));
                }
            }
            ("read", OpType::Ok) => by_key.entry(key).or_default().push((
                pair.result()["value"].clone(),
                false,
                pair.invoke.time_ns,
                pair.end_ns(),
                true,
                pair.invoke.index,
            )),
            _ => {}
        }
    }
    for op in history
        .iter()
        .filter(|op| op.is_named(FINAL) && op.f == "final-read")
    {
        if op.value["ok"] == Value::Bool(true) {
            if let Some(entries) = by_key.get_mut(op.key_str()) {
                entries.push((
                    op.value["value"].clone(),
                    false,
                    op.time_ns,
                    op.time_ns,
                    true,
                    op.index,
                ));
            }
        }
    }
    let mut violations: Vec<Value> = Vec::new();
    let mut timed_out: Vec<&str> = Vec::new();
    let mut operations = 0usize;
    for (key, entries) in &by_key {
        operations += entries.len();
        let mut ids: HashMap<String, u32> = HashMap::from([(Value::Null.to_string(), 0)]);
        for entry in entries.iter().filter(|entry| entry.1) {
            let next = ids.len() as u32;
            ids.entry(entry.0.to_string()).or_insert(next);
        }
        let mut ops = Vec::new();
        for entry in entries {
            let Some(&id) = ids.get(&entry.0.to_string()) else {
                violations.push(json!({"problem": "read a value never written", "key": key,
                                       "value": entry.0, "invocation": entry.5}));
                continue;
            };
            ops.push(LinOp {
                kind: if entry.1 {
                    Kind::Write(id)
                } else {
                    Kind::Read(id)
                },
                invoke_ns: entry.2,
                end_ns: entry.3,
                required: entry.4,
                index: entry.5,
            });
        }
        ops.sort_by_key(|op| op.invoke_ns);
        match search(&ops, deadline) {
            Search::Linearizable => {}
            Search::NotLinearizable => violations.push(json!({
                "problem": "no linearization of the register's history", "key": key,
                "operations": ops.iter().map(|op| json!({"invocation": op.index,
                    "op": match op.kind { Kind::Read(_) => "read", Kind::Write(_) => "write" },
                    "from_ms": ms(op.invoke_ns), "to_ms": ms(op.end_ns)})).take(40).collect::<Vec<_>>()})),
            Search::TimedOut => timed_out.push(key),
        }
    }
    let result = CheckResult::from_violations(
        &format!("{} registers, {operations} operations", by_key.len()),
        violations,
    );
    if result.verdict == Verdict::Valid && !timed_out.is_empty() {
        return CheckResult {
            verdict: Verdict::Unknown,
            summary: format!(
                "search time limit reached on {} register(s)",
                timed_out.len()
            ),
            details: json!({"timed_out": timed_out}),
        };
    }
    result
}

/// How many steps the search takes between two looks at the clock.
const STEPS_BETWEEN_CLOCK_CHECKS: u32 = 1_024;

fn search(ops: &[LinOp], deadline: Instant) -> Search {
    let words = ops.len().div_ceil(64);
    let required: Vec<u64> = bits(ops.len(), |position| ops[position].required);
    let mut visited: HashSet<(Vec<u64>, u32)> = HashSet::new();
    let mut stack: Vec<(Vec<u64>, u32)> = vec![(vec![0; words], 0)];
    visited.insert((vec![0; words], 0));
    let mut steps = 0u32;
    while let Some((done, value)) = stack.pop() {
        steps += 1;
        if steps.is_multiple_of(STEPS_BETWEEN_CLOCK_CHECKS) && Instant::now() >= deadline {
            return Search::TimedOut;
        }
        if required
            .iter()
            .zip(&done)
            .all(|(need, have)| need & !have == 0)
        {
            return Search::Linearizable;
        }
        let pending = |position: usize| done[position / 64] & (1 << (position % 64)) == 0;
        let earliest_end = (0..ops.len())
            .filter(|&position| pending(position))
            .map(|position| ops[position].end_ns)
            .min()
            .unwrap_or(u64::MAX);
        for position in (0..ops.len()).filter(|&position| pending(position)) {
            let op = ops[position];
            if op.invoke_ns > earliest_end {
                break; // sorted by invocation: no later one may go next either
            }
            let next_value = match op.kind {
                Kind::Read(read) if read == value => value,
                Kind::Read(_) => continue,
                Kind::Write(written) => written,
            };
            let mut next = done.clone();
            next[position / 64] |= 1 << (position % 64);
            if visited.insert((next.clone(), next_value)) {
                stack.push((next, next_value));
            }
        }
    }
    Search::NotLinearizable
}

fn bits(length: usize, set: impl Fn(usize) -> bool) -> Vec<u64> {
    let mut words = vec![0u64; length.div_ceil(64)];
    for position in (0..length).filter(|&position| set(position)) {
        words[position / 64] |= 1 << (position % 64);
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::build::{indexed, op};

    fn call(process: u64, from: u64, to: u64, f: &str, value: Value, kind: OpType) -> Vec<Op> {
        let invoke_value = if f == "write" {
            json!({"value": value})
        } else {
            Value::Null
        };
        vec![
            op(process, OpType::Invoke, from, f, "r", invoke_value),
            op(process, kind, to, f, "r", json!({"value": value})),
        ]
    }

    const LIMIT: Duration = Duration::from_secs(5);

    #[test]
    fn concurrent_reads_and_writes_pass() {
        let history = indexed(
            [
                call(1, 0, 10, "write", json!(1), OpType::Ok),
                call(2, 5, 8, "read", json!(1), OpType::Ok),
                call(3, 6, 20, "write", json!(2), OpType::Ok),
                call(4, 9, 12, "read", json!(1), OpType::Ok),
                call(5, 21, 22, "read", json!(2), OpType::Ok),
            ]
            .concat(),
        );
        assert_eq!(check(&history, LIMIT).verdict, Verdict::Valid);
    }

    #[test]
    fn a_stale_read_is_caught() {
        let history = indexed(
            [
                call(1, 0, 1, "write", json!(1), OpType::Ok),
                call(2, 2, 3, "write", json!(2), OpType::Ok),
                call(3, 4, 5, "read", json!(1), OpType::Ok),
            ]
            .concat(),
        );
        assert_eq!(check(&history, LIMIT).verdict, Verdict::Invalid);
    }

    #[test]
    fn an_unknown_write_may_or_may_not_happen_but_a_failed_one_must_not() {
        let maybe = indexed(
            [
                call(1, 0, 1, "write", json!(1), OpType::Ok),
                call(2, 2, 3, "write", json!(2), OpType::Info),
                call(3, 4, 5, "read", json!(1), OpType::Ok),
                call(4, 6, 7, "read", json!(2), OpType::Ok),
            ]
            .concat(),
        );
        assert_eq!(check(&maybe, LIMIT).verdict, Verdict::Valid);
        let failed = indexed(
            [
                call(1, 0, 1, "write", json!(1), OpType::Ok),
                call(2, 2, 3, "write", json!(2), OpType::Fail),
                call(4, 6, 7, "read", json!(2), OpType::Ok),
            ]
            .concat(),
        );
        assert_eq!(check(&failed, LIMIT).verdict, Verdict::Invalid);
    }

    #[test]
    fn a_read_flip_flopping_between_values_is_caught() {
        let history = indexed(
            [
                call(1, 0, 1, "write", json!(1), OpType::Ok),
                call(2, 2, 30, "write", json!(2), OpType::Ok),
                call(3, 4, 5, "read", json!(2), OpType::Ok),
                call(4, 6, 7, "read", json!(1), OpType::Ok),
            ]
            .concat(),
        );
        assert_eq!(check(&history, LIMIT).verdict, Verdict::Invalid);
    }

    /// Seen in a real run under `membership`: a write timed out, a later write landed and was
    /// read, then the retry of the first write (same idempotency key) was answered with its
    /// recorded result. The first write took effect during its first attempt, so the history is
    /// linearizable; counted as a separate write at the retry's time it would not be.
    #[test]
    fn a_retried_write_takes_effect_within_its_first_attempt() {
        let attempt = |process: u64, from: u64, to: u64, kind: OpType| {
            vec![
                op(
                    process,
                    OpType::Invoke,
                    from,
                    "write",
                    "r",
                    json!({"value": 1, "idempotency_key": "k1"}),
                ),
                op(process, kind, to, "write", "r", json!({"value": 1})),
            ]
        };
        let history = indexed(
            [
                attempt(1, 0, 1, OpType::Info),
                call(2, 2, 3, "read", json!(1), OpType::Ok),
                call(3, 4, 5, "write", json!(2), OpType::Ok),
                call(4, 6, 7, "read", json!(2), OpType::Ok),
                attempt(5, 8, 9, OpType::Ok),
                call(6, 10, 11, "read", json!(2), OpType::Ok),
            ]
            .concat(),
        );
        assert_eq!(
            check(&history, Duration::from_secs(5)).verdict,
            Verdict::Valid
        );
        let without_first_attempt = indexed(
            [
                call(3, 4, 5, "write", json!(2), OpType::Ok),
                call(4, 6, 7, "read", json!(2), OpType::Ok),
                attempt(5, 8, 9, OpType::Ok),
                call(6, 10, 11, "read", json!(2), OpType::Ok),
            ]
            .concat(),
        );
        assert_eq!(
            check(&without_first_attempt, Duration::from_secs(5)).verdict,
            Verdict::Invalid
        );
    }

    #[test]
    fn a_pair_write_is_a_write_of_its_twin_too() {
        let pair_write = |value: u64| {
            vec![
                op(
                    1,
                    OpType::Invoke,
                    0,
                    "write",
                    "r",
                    json!({"value": value, "twin": "t"}),
                ),
                op(1, OpType::Ok, 1, "write", "r", json!({"value": value})),
            ]
        };
        let twin_read = |value: Value| {
            vec![
                op(2, OpType::Invoke, 2, "read", "t", Value::Null),
                op(2, OpType::Ok, 3, "read", "t", json!({"value": value})),
            ]
        };
        let seen = indexed([pair_write(1), twin_read(json!(1))].concat());
        assert_eq!(check(&seen, LIMIT).verdict, Verdict::Valid);
        let missing = indexed([pair_write(1), twin_read(Value::Null)].concat());
        assert_eq!(check(&missing, LIMIT).verdict, Verdict::Invalid);
    }

    #[test]
    fn the_time_limit_yields_unknown_never_valid() {
        // Many concurrent unknown writes and a read of a value that never settles.
        let mut ops = Vec::new();
        for process in 0..40 {
            ops.extend(call(
                process,
                process,
                process + 1,
                "write",
                json!(process),
                OpType::Info,
            ));
        }
        ops.extend(call(100, 50, 51, "read", json!(7), OpType::Ok));
        ops.extend(call(101, 52, 53, "read", json!(3), OpType::Ok));
        ops.extend(call(102, 54, 55, "read", json!(7), OpType::Ok));
        ops.extend(call(103, 56, 57, "read", json!(3), OpType::Ok));
        let history = indexed(ops);
        let verdict = check(&history, Duration::ZERO).verdict;
        assert_ne!(verdict, Verdict::Valid);
    }
}
