//! All or none, as reads see it (docs/api.md, "Transactions"; docs/guarantees.md G1): a
//! transaction that writes several keys is never seen half applied.
//!
//! The `fenced-kv` workload's pair writes put one unique value under a register and under its
//! twin (a key only pair writes write) in one `POST /v1/txn`, register first. The two puts are
//! applied in one command, so they get consecutive revisions (the twin's is the register's
//! plus one), and every state a read answers from holds both or neither. Revisions are event
//! revisions, shared by every change and given in apply order, so a read that returns a key at
//! revision `x` answers from a state holding every change up to `x`.
//!
//! What is checked, per pair write:
//!
//! - **Its revisions.** Known from its answer (which must give consecutive revisions), or,
//!   when its outcome is unknown, from a read that returned its value: the register at `x`
//!   makes them `(x, x + 1)`, the twin at `y` makes them `(y - 1, y)`. Every read of its value
//!   must show it at the revision of that key's put, and every read of a key at that revision
//!   must show its value.
//! - **Seen on one key, whole on the other.** A read of one key that returned a revision at or
//!   after the pair's put on that key (the pair's value, or a later one) shows the pair was
//!   applied when that read answered. A read of the OTHER key sent after that answer came must
//!   show a revision at least the pair's put on it; otherwise the pair was seen half applied
//!   (a torn read). Reads are linearizable, so this holds across keys. The same holds after the
//!   pair write was acknowledged, for both keys.
//! - **A failed pair is seen nowhere.** The value of a pair write that surely failed (its
//!   compare failed, or every attempt was refused) is read on neither key.
//! - **The final reads** after healing are reads like the others: the harness reads every
//!   register, then every twin, then every paired register again, one read after another, so
//!   a pair seen on either key in the final reads is checked on the other.
//!
//! What cannot be concluded, so is never flagged: reads that overlap in time (the second sent
//! before the first answered) may see the pair in either order; a pair whose outcome is unknown
//! and whose value no read returned has unknown revisions, so it bounds nothing; a read of the
//! same key as the evidence is left to `linearizable`. A pair's revision on the other key is
//! inferred with the documented rule that its puts get consecutive revisions; answers check
//! that rule on every acknowledged pair. The verdict is `unknown` when no client read was
//! checked against what a read of the other key saw: then nothing was shown.

use std::collections::{BTreeMap, HashMap};

use serde_json::{json, Value};

use super::{ms, CheckResult, Verdict, VIOLATIONS_SHOWN_MAX};
use crate::history::{logical_pairs, pairs, Op, OpType, Process, FINAL};
use crate::workloads::COMPARE_FAILED;

/// Which of a pair's two keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Register,
    Twin,
}

/// One pair write, as one logical operation (its attempts with one idempotency key).
#[derive(Debug)]
struct PairWrite<'a> {
    register: &'a str,
    twin: &'a str,
    value: &'a Value,
    invocation: u64,
    outcome: OpType,
    error: Option<&'a str>,
    /// When its acknowledgement came.
    acknowledged_ns: Option<u64>,
    /// The revisions of its two puts (register, twin), once known.
    revisions: Option<(u64, u64)>,
    /// What made them known.
    known_from: Value,
    /// Whether some read returned its value.
    seen: bool,
}

impl PairWrite<'_> {
    fn revision_of(&self, role: Role) -> Option<u64> {
        self.revisions.map(|(register, twin)| match role {
            Role::Register => register,
            Role::Twin => twin,
        })
    }

    fn describe(&self) -> Value {
        json!({"write": self.invocation, "value": self.value, "register": self.register,
               "twin": self.twin, "revisions": self.revisions, "revisions_from": self.known_from})
    }
}

/// One ok read of a register or twin, by a client or by the final reads.
#[derive(Debug)]
struct Read<'a> {
    key: &'a str,
    value: &'a Value,
    /// The key's revision (0: absent); `None` when the history did not record it.
    revision: Option<u64>,
    /// No later than when it was sent.
    sent_ns: u64,
    /// No earlier than when its answer came.
    answered_ns: u64,
    index: u64,
    /// The client process, for a client read.
    process: Option<u64>,
    /// 1 or 2 for the first or second read of the workload's read of a register and its twin
    /// one after the other.
    pair_read: Option<u64>,
    /// The node, for a final read.
    final_node: Option<u64>,
}

impl Read<'_> {
    fn describe(&self) -> Value {
        let mut read = json!({"read": self.index, "key": self.key, "value": self.value,
                              "revision": self.revision, "sent_ms": ms(self.sent_ns),
                              "answered_ms": ms(self.answered_ns)});
        if let Some(node) = self.final_node {
            read["final_read_on_node"] = Value::from(node);
        }
        read
    }
}

/// What shows a pair was applied by some moment.
#[derive(Debug, Clone, Copy)]
enum Evidence {
    /// Its write was acknowledged.
    Acknowledged,
    /// A read (an index into the reads) returned, on its key, a revision at or after the pair's.
    Read(usize),
}

/// Checks that no read sees a pair write half applied, and that no failed one is seen.
pub fn check(history: &[Op]) -> CheckResult {
    let mut writes = pair_writes(history);
    // key -> (the register of its pair, which key of the pair it is)
    let mut roles: BTreeMap<&str, (&str, Role)> = BTreeMap::new();
    for write in &writes {
        roles.insert(write.register, (write.register, Role::Register));
        roles.insert(write.twin, (write.register, Role::Twin));
    }
    let reads = pair_key_reads(history, &roles);
    let by_value: HashMap<String, usize> = writes
        .iter()
        .enumerate()
        .map(|(position, write)| (write.value.to_string(), position))
        .collect();
    let mut violations: Vec<Value> = Vec::new();

    // The revisions an answer gave.
    for write in writes.iter_mut() {
        let Some((register, twin)) = write.revisions else {
            continue;
        };
        if twin != register + 1 {
            violations.push(json!({
                "problem": "a pair write's two puts were not given consecutive revisions",
                "pair": write.describe()}));
        }
    }
    // Reads of pair values: a failed pair is never seen; the others' revisions are learned or
    // checked.
    for read in &reads {
        if read.value.is_null() {
            continue;
        }
        let Some(&position) = by_value.get(&read.value.to_string()) else {
            continue;
        };
        let write = &mut writes[position];
        let role = if read.key == write.register {
            Role::Register
        } else if read.key == write.twin {
            Role::Twin
        } else {
            continue; // another key's business (`linearizable`: a value never written there)
        };
        write.seen = true;
        if write.outcome == OpType::Fail {
            violations.push(json!({
                "problem": "the value of a pair write that surely failed was read",
                "error": write.error, "pair": write.describe(), "read": read.describe()}));
            continue;
        }
        let Some(revision) = read.revision.filter(|&revision| revision > 0) else {
            continue;
        };
        let derived = match role {
            Role::Register => (revision, revision + 1),
            Role::Twin => (revision - 1, revision),
        };
        match write.revisions {
            None => {
                write.revisions = Some(derived);
                write.known_from = json!({"read": read.index});
            }
            Some(known) if known != derived => violations.push(json!({
                "problem": "a pair value was read at another revision than its write's",
                "pair": write.describe(), "read": read.describe()})),
            Some(_) => {}
        }
    }
    // A read at a pair's revision shows the pair's value.
    let mut at_revision: HashMap<(&str, u64), usize> = HashMap::new();
    for (position, write) in writes.iter().enumerate() {
        if let Some((register, twin)) = write.revisions {
            at_revision.insert((write.register, register), position);
            at_revision.insert((write.twin, twin), position);
        }
    }
    for read in &reads {
        let Some(revision) = read.revision else {
            continue;
        };
        if let Some(&position) = at_revision.get(&(read.key, revision)) {
            if read.value != writes[position].value {
                violations.push(json!({
                    "problem": "a read at a pair write's revision shows another value",
                    "pair": writes[position].describe(), "read": read.describe()}));
            }
        }
    }

    // Per pair of keys: what shows which pair applied by when, then every read against it.
    let mut groups: BTreeMap<&str, (Vec<usize>, Vec<usize>)> = BTreeMap::new();
    for (position, write) in writes.iter().enumerate() {
        if write.revisions.is_some() {
            groups.entry(write.register).or_default().0.push(position);
        }
    }
    for (position, read) in reads.iter().enumerate() {
        if let Some(&(register, _)) = roles.get(read.key) {
            groups.entry(register).or_default().1.push(position);
        }
    }
    let mut checked_across = 0usize;
    let mut checked_against_value = 0usize;
    let mut checked_within_pair_read = 0usize;
    let mut final_checked_across = 0usize;
    let mut checked_after_ack = 0usize;
    for (group_writes, group_reads) in groups.values() {
        if group_writes.is_empty() {
            continue;
        }
        // (from when, what shows it, which pair)
        let mut evidence: Vec<(u64, Evidence, usize)> = Vec::new();
        for &position in group_writes {
            if let Some(at) = writes[position].acknowledged_ns {
                evidence.push((at, Evidence::Acknowledged, position));
            }
        }
        for &position in group_reads {
            let read = &reads[position];
            let role = roles[read.key].1;
            let Some(revision) = read.revision else {
                continue;
            };
            // The latest pair applied at or before the revision this read saw.
            let latest = group_writes
                .iter()
                .filter_map(|&write| Some((writes[write].revision_of(role)?, write)))
                .filter(|&(put, _)| put <= revision)
                .max();
            if let Some((_, write)) = latest {
                evidence.push((read.answered_ns, Evidence::Read(position), write));
            }
        }
        for &position in group_reads {
            let read = &reads[position];
            let role = roles[read.key].1;
            let Some(revision) = read.revision else {
                continue;
            };
            let mut across = false;
            let mut against_value = false;
            let mut within_pair_read = false;
            let mut after_ack = false;
            // The highest revision this read should have seen and was not, and why: shown by
            // a read of the other key, or by an acknowledgement.
            let mut torn: Option<(u64, Evidence, usize)> = None;
            let mut stale: Option<(u64, Evidence, usize)> = None;
            for &(at, shown_by, write) in &evidence {
                // Shown once `at` had passed (an answer came no later than it was recorded);
                // this read was sent no earlier than `sent_ns`.
                if at > read.sent_ns {
                    continue;
                }
                let worst = match shown_by {
                    Evidence::Read(other) if roles[reads[other].key].1 == role => continue,
                    Evidence::Read(other) => {
                        across = true;
                        against_value |= reads[other].value == writes[write].value;
                        within_pair_read |= read.pair_read == Some(2)
                            && reads[other].pair_read == Some(1)
                            && read.process.is_some()
                            && reads[other].process == read.process;
                        &mut torn
                    }
                    Evidence::Acknowledged => {
                        after_ack = true;
                        &mut stale
                    }
                };
                let Some(bound) = writes[write].revision_of(role) else {
                    continue;
                };
                if revision < bound && worst.is_none_or(|(highest, _, _)| bound > highest) {
                    *worst = Some((bound, shown_by, write));
                }
            }
            let worst = torn.or(stale);
            if across {
                if read.final_node.is_some() {
                    final_checked_across += 1;
                } else {
                    checked_across += 1;
                    checked_against_value += usize::from(against_value);
                    checked_within_pair_read += usize::from(within_pair_read);
                }
            }
            checked_after_ack += usize::from(after_ack);
            if let Some((bound, shown_by, write)) = worst {
                let (problem, shown) = match shown_by {
                    Evidence::Read(other) => (
                        "torn read: the other key showed the pair write applied before this \
                         read was sent, and this read shows an older revision",
                        json!({"by_read": reads[other].describe()}),
                    ),
                    Evidence::Acknowledged => (
                        "a read sent after the pair write was acknowledged shows an older \
                         revision",
                        json!({"acknowledged_ms": writes[write].acknowledged_ns.map(ms)}),
                    ),
                };
                violations.push(json!({"problem": problem, "pair": writes[write].describe(),
                    "applied_shown": shown, "read": read.describe(),
                    "revision_at_least": bound}));
            }
        }
    }

    let count = |outcome: OpType| {
        writes
            .iter()
            .filter(|write| write.outcome == outcome)
            .count()
    };
    let counts = json!({
        "pairs_written": writes.len(),
        "pairs_acknowledged": count(OpType::Ok),
        "pairs_unknown": count(OpType::Info),
        "pairs_failed": count(OpType::Fail),
        "pairs_compare_failed": writes.iter()
            .filter(|write| write.error == Some(COMPARE_FAILED)).count(),
        "pair_values_read": writes.iter().filter(|write| write.seen).count(),
        "pairs_with_revisions": writes.iter().filter(|write| write.revisions.is_some()).count(),
        "reads_of_pair_keys": reads.iter().filter(|read| read.final_node.is_none()).count(),
        "pair_reads_checked": checked_across,
        "pair_reads_checked_against_a_pair_value": checked_against_value,
        "second_reads_checked_against_their_first": checked_within_pair_read,
        "final_pair_reads_checked": final_checked_across,
        "reads_checked_after_acknowledgement": checked_after_ack,
    });
    let summary = format!(
        "{} pair writes ({} acknowledged, {} failed), {checked_across} reads \
         ({checked_against_value} after a pair value was read, {checked_within_pair_read} second \
         reads of a register and its twin) and {final_checked_across} final reads checked \
         against the other key",
        writes.len(),
        count(OpType::Ok),
        count(OpType::Fail),
    );
    if !violations.is_empty() {
        return CheckResult {
            verdict: Verdict::Invalid,
            summary: format!("{} violation(s); {summary}", violations.len()),
            details: json!({"counts": counts,
                "violations": violations.into_iter().take(VIOLATIONS_SHOWN_MAX).collect::<Vec<_>>()}),
        };
    }
    if checked_across == 0 {
        return CheckResult {
            verdict: Verdict::Unknown,
            summary: format!("no read was checked against the other key: {summary}"),
            details: json!({"counts": counts}),
        };
    }
    CheckResult::valid(summary, json!({"counts": counts}))
}

/// The pair writes: writes naming a `twin`, each as one logical operation.
fn pair_writes(history: &[Op]) -> Vec<PairWrite<'_>> {
    let mut writes = Vec::new();
    for pair in logical_pairs(history) {
        if pair.invoke.f != "write" {
            continue;
        }
        let Some(twin) = pair.invoke.value["twin"].as_str() else {
            continue;
        };
        let outcome = pair.outcome();
        let answered = (outcome == OpType::Ok)
            .then(|| {
                let result = pair.result();
                Some((
                    result["revision"].as_u64()?,
                    result["twin_revision"].as_u64()?,
                ))
            })
            .flatten();
        writes.push(PairWrite {
            register: pair.invoke.key_str(),
            twin,
            value: &pair.invoke.value["value"],
            invocation: pair.invoke.index,
            outcome,
            error: pair.complete.and_then(|op| op.error.as_deref()),
            acknowledged_ns: (outcome == OpType::Ok).then(|| pair.end_ns()),
            revisions: answered,
            known_from: if answered.is_some() {
                json!({"answer": pair.invoke.index})
            } else {
                Value::Null
            },
            seen: false,
        });
    }
    writes
}

/// The ok reads of the keys in `roles`, by clients and by the final reads. A final read is
/// recorded once answered and sent after the previous final event was recorded.
fn pair_key_reads<'a>(history: &'a [Op], roles: &BTreeMap<&str, (&str, Role)>) -> Vec<Read<'a>> {
    // An absent key reads as null, without a revision: revision 0.
    let revision_of = |value: &Value| {
        value["revision"]
            .as_u64()
            .or_else(|| value["value"].is_null().then_some(0))
    };
    let mut reads = Vec::new();
    for pair in pairs(history) {
        if pair.invoke.f != "read"
            || pair.outcome() != OpType::Ok
            || !roles.contains_key(pair.invoke.key_str())
        {
            continue;
        }
        let Some(answer) = pair.complete.map(|op| &op.value) else {
            continue;
        };
        reads.push(Read {
            key: pair.invoke.key_str(),
            value: &answer["value"],
            revision: revision_of(answer),
            sent_ns: pair.invoke.time_ns,
            answered_ns: pair.end_ns(),
            index: pair.invoke.index,
            process: match pair.invoke.process {
                Process::Client(process) => Some(process),
                Process::Named(_) => None,
            },
            pair_read: pair.invoke.value["pair_read"].as_u64(),
            final_node: None,
        });
    }
    let mut previous_final_ns = 0;
    for op in history.iter().filter(|op| op.is_named(FINAL)) {
        if op.f == "final-read"
            && op.value["ok"] == Value::Bool(true)
            && roles.contains_key(op.key_str())
        {
            reads.push(Read {
                key: op.key_str(),
                value: &op.value["value"],
                revision: revision_of(&op.value),
                sent_ns: previous_final_ns,
                answered_ns: op.time_ns,
                index: op.index,
                process: None,
                pair_read: None,
                final_node: Some(op.value["node"].as_u64().unwrap_or(0)),
            });
        }
        previous_final_ns = op.time_ns;
    }
    reads
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::build::{indexed, op};
    use crate::history::Process;

    /// A pair write of `value` to `r0-0` and `t0-0`; `revisions` in its answer when ok.
    fn pair(
        process: u64,
        from: u64,
        to: u64,
        value: u64,
        outcome: OpType,
        revisions: Option<(u64, u64)>,
    ) -> Vec<Op> {
        let mut done = op(process, outcome, to, "write", "r0-0", Value::Null);
        match outcome {
            OpType::Ok => {
                let (register, twin) = revisions.expect("an ok pair has its revisions");
                done.value = json!({"value": value, "revision": register, "twin_revision": twin});
            }
            OpType::Fail => done.error = Some(COMPARE_FAILED.to_owned()),
            _ => done.error = Some("TIMEOUT".to_owned()),
        }
        vec![
            op(
                process,
                OpType::Invoke,
                from,
                "write",
                "r0-0",
                json!({"value": value, "twin": "t0-0", "idempotency_key": null, "via": "txn-pair"}),
            ),
            done,
        ]
    }

    /// A plain write of `value` to `r0-0` at `revision`.
    fn single(process: u64, from: u64, to: u64, value: u64, revision: u64) -> Vec<Op> {
        vec![
            op(
                process,
                OpType::Invoke,
                from,
                "write",
                "r0-0",
                json!({"value": value, "idempotency_key": null, "via": "put"}),
            ),
            op(
                process,
                OpType::Ok,
                to,
                "write",
                "r0-0",
                json!({"value": value, "revision": revision}),
            ),
        ]
    }

    /// An ok read of `key` that returned `value` at `revision` (null and 0: absent).
    fn read(process: u64, from: u64, to: u64, key: &str, value: Value, revision: u64) -> Vec<Op> {
        let answer = if value.is_null() {
            json!({"value": null})
        } else {
            json!({"value": value, "revision": revision})
        };
        vec![
            op(process, OpType::Invoke, from, "read", key, Value::Null),
            op(process, OpType::Ok, to, "read", key, answer),
        ]
    }

    /// The workload's read of one key and then the other, by one process: `first` then
    /// `second`, each (key, value, revision).
    fn read_both(
        process: u64,
        from: u64,
        first: (&str, Value, u64),
        second: (&str, Value, u64),
    ) -> Vec<Op> {
        let mut ops = [
            read(process, from, from + 1, first.0, first.1, first.2),
            read(process, from + 2, from + 3, second.0, second.1, second.2),
        ]
        .concat();
        ops[0].value = json!({"pair_read": 1, "then": second.0});
        ops[2].value = json!({"pair_read": 2, "after": first.0});
        ops
    }

    fn final_read(at: u64, node: u64, key: &str, value: Value, revision: u64) -> Op {
        let mut read = op(
            0,
            OpType::Info,
            at,
            "final-read",
            key,
            json!({"node": node, "ok": true, "value": value, "revision": revision}),
        );
        read.process = Process::Named(FINAL.to_owned());
        read
    }

    fn problems(result: &CheckResult) -> Vec<String> {
        result.details["violations"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|violation| violation["problem"].as_str().unwrap_or("").to_owned())
            .collect()
    }

    #[test]
    fn a_pair_seen_whole_in_either_order_passes() {
        let history = indexed(
            [
                single(1, 0, 1, 10, 3),
                pair(2, 2, 4, 11, OpType::Ok, Some((5, 6))),
                // register, then twin
                read_both(3, 5, ("r0-0", json!(11), 5), ("t0-0", json!(11), 6)),
                // twin, then register (overwritten since, at a later revision)
                single(4, 9, 10, 12, 8),
                read_both(5, 11, ("t0-0", json!(11), 6), ("r0-0", json!(12), 8)),
                vec![
                    final_read(20, 1, "r0-0", json!(12), 8),
                    final_read(21, 1, "t0-0", json!(11), 6),
                    final_read(22, 1, "r0-0", json!(12), 8),
                ],
            ]
            .concat(),
        );
        let result = check(&history);
        assert_eq!(result.verdict, Verdict::Valid, "{}", result.details);
        let counts = &result.details["counts"];
        assert_eq!(counts["pairs_written"], 1);
        assert_eq!(counts["pair_reads_checked"], 3);
        assert_eq!(counts["pair_reads_checked_against_a_pair_value"], 3);
        assert_eq!(counts["second_reads_checked_against_their_first"], 2);
        assert_eq!(counts["final_pair_reads_checked"], 2);
    }

    #[test]
    fn a_torn_read_register_then_twin_is_caught() {
        let history = indexed(
            [
                pair(1, 0, 1, 7, OpType::Ok, Some((3, 4))),
                pair(2, 2, 10, 8, OpType::Ok, Some((5, 6))),
                read(3, 3, 4, "r0-0", json!(8), 5),
                // sent after the register showed pair 8: the twin still shows pair 7
                read(3, 5, 6, "t0-0", json!(7), 4),
            ]
            .concat(),
        );
        let result = check(&history);
        assert_eq!(result.verdict, Verdict::Invalid);
        assert!(problems(&result)[0].starts_with("torn read"));
        assert_eq!(result.details["violations"][0]["revision_at_least"], 6);
    }

    #[test]
    fn a_torn_read_twin_then_register_of_an_unknown_pair_is_caught() {
        // The pair's outcome is unknown; the twin shows it at 9, so the register's put is 8.
        let history = indexed(
            [
                single(1, 0, 1, 10, 3),
                pair(2, 2, 3, 11, OpType::Info, None),
                read(3, 4, 5, "t0-0", json!(11), 9),
                read(3, 6, 7, "r0-0", json!(10), 3),
            ]
            .concat(),
        );
        let result = check(&history);
        assert_eq!(result.verdict, Verdict::Invalid);
        assert_eq!(result.details["violations"][0]["revision_at_least"], 8);
        // Seen whole, the same history passes.
        let whole = indexed(
            [
                single(1, 0, 1, 10, 3),
                pair(2, 2, 3, 11, OpType::Info, None),
                read(3, 4, 5, "t0-0", json!(11), 9),
                read(3, 6, 7, "r0-0", json!(11), 8),
            ]
            .concat(),
        );
        assert_eq!(check(&whole).verdict, Verdict::Valid);
    }

    #[test]
    fn a_later_revision_on_one_key_shows_the_pair_too() {
        // The register was overwritten after the pair; a read of it at that later revision
        // still shows the pair applied, so the twin read after it must show the pair.
        let history = indexed(
            [
                pair(1, 0, 1, 7, OpType::Ok, Some((3, 4))),
                single(2, 2, 3, 8, 5),
                read(3, 4, 5, "r0-0", json!(8), 5),
                read(3, 6, 7, "t0-0", Value::Null, 0),
            ]
            .concat(),
        );
        let result = check(&history);
        assert_eq!(result.verdict, Verdict::Invalid);
        assert!(problems(&result)
            .iter()
            .any(|problem| problem.starts_with("torn read")));
    }

    #[test]
    fn overlapping_reads_may_see_the_pair_in_either_order() {
        // The twin read was sent before the register read answered: no order between them.
        let history = indexed(
            [
                pair(1, 0, 1, 7, OpType::Info, None),
                read(2, 2, 6, "r0-0", json!(7), 3),
                read(3, 5, 8, "t0-0", Value::Null, 0),
                read(4, 9, 10, "r0-0", json!(7), 3),
                read(4, 11, 12, "t0-0", json!(7), 4),
            ]
            .concat(),
        );
        let result = check(&history);
        assert_eq!(result.verdict, Verdict::Valid, "{}", result.details);
        assert_eq!(result.details["counts"]["pair_reads_checked"], 1);
    }

    #[test]
    fn a_failed_pair_seen_on_either_key_is_caught() {
        for key in ["r0-0", "t0-0"] {
            let history = indexed(
                [
                    pair(1, 0, 1, 7, OpType::Ok, Some((3, 4))),
                    pair(2, 2, 3, 9, OpType::Fail, None),
                    read(3, 4, 5, key, json!(9), 6),
                    read(4, 6, 7, "r0-0", json!(7), 3),
                    read(4, 8, 9, "t0-0", json!(7), 4),
                ]
                .concat(),
            );
            let result = check(&history);
            assert_eq!(result.verdict, Verdict::Invalid, "{key}");
            assert_eq!(
                problems(&result)[0],
                "the value of a pair write that surely failed was read"
            );
            assert_eq!(result.details["counts"]["pairs_compare_failed"], 1);
        }
    }

    #[test]
    fn a_torn_final_state_is_caught() {
        // The register's final read shows the pair; the twin read after it does not.
        let torn = indexed(
            [
                pair(1, 0, 1, 7, OpType::Info, None),
                read(2, 2, 3, "r0-0", json!(7), 3),
                read(2, 4, 5, "t0-0", json!(7), 4),
                pair(3, 6, 7, 8, OpType::Info, None),
                vec![
                    final_read(20, 1, "r0-0", json!(8), 5),
                    final_read(21, 1, "t0-0", json!(7), 4),
                ],
            ]
            .concat(),
        );
        let result = check(&torn);
        assert_eq!(result.verdict, Verdict::Invalid);
        assert_eq!(
            result.details["violations"][0]["read"]["final_read_on_node"],
            1
        );
        // The twin's final read shows the pair, the register read after it does not.
        let torn_back = indexed(
            [
                pair(1, 0, 1, 7, OpType::Ok, Some((3, 4))),
                read(2, 2, 3, "r0-0", json!(7), 3),
                read(2, 4, 5, "t0-0", json!(7), 4),
                pair(3, 6, 7, 8, OpType::Info, None),
                vec![
                    final_read(20, 1, "r0-0", json!(7), 3),
                    final_read(21, 1, "t0-0", json!(8), 6),
                    final_read(22, 1, "r0-0", json!(7), 3),
                ],
            ]
            .concat(),
        );
        let result = check(&torn_back);
        assert_eq!(result.verdict, Verdict::Invalid);
        // A pair that applied between the first register read and the twin read is fine.
        let late = indexed(
            [
                pair(1, 0, 1, 7, OpType::Ok, Some((3, 4))),
                read(2, 2, 3, "r0-0", json!(7), 3),
                read(2, 4, 5, "t0-0", json!(7), 4),
                pair(3, 6, 7, 8, OpType::Info, None),
                vec![
                    final_read(20, 1, "r0-0", json!(7), 3),
                    final_read(21, 1, "t0-0", json!(8), 6),
                    final_read(22, 1, "r0-0", json!(8), 5),
                ],
            ]
            .concat(),
        );
        assert_eq!(check(&late).verdict, Verdict::Valid);
    }

    #[test]
    fn a_read_after_the_acknowledgement_must_see_both_keys() {
        let history = indexed(
            [
                pair(1, 0, 1, 7, OpType::Ok, Some((3, 4))),
                read(2, 2, 3, "t0-0", Value::Null, 0),
            ]
            .concat(),
        );
        let result = check(&history);
        assert_eq!(result.verdict, Verdict::Invalid);
        assert!(problems(&result)[0].contains("acknowledged"));
    }

    #[test]
    fn revisions_that_disagree_with_the_pair_are_caught() {
        let not_consecutive = indexed(pair(1, 0, 1, 7, OpType::Ok, Some((3, 5))));
        assert_eq!(
            problems(&check(&not_consecutive))[0],
            "a pair write's two puts were not given consecutive revisions"
        );
        let elsewhere = indexed(
            [
                pair(1, 0, 1, 7, OpType::Ok, Some((3, 4))),
                read(2, 2, 3, "t0-0", json!(7), 9),
            ]
            .concat(),
        );
        assert_eq!(
            problems(&check(&elsewhere))[0],
            "a pair value was read at another revision than its write's"
        );
        let other_value = indexed(
            [
                pair(1, 0, 1, 7, OpType::Ok, Some((3, 4))),
                read(2, 2, 3, "r0-0", json!(8), 3),
            ]
            .concat(),
        );
        assert_eq!(
            problems(&check(&other_value))[0],
            "a read at a pair write's revision shows another value"
        );
    }

    #[test]
    fn nothing_checked_is_unknown_never_valid() {
        let no_pairs =
            indexed([single(1, 0, 1, 10, 3), read(2, 2, 3, "r0-0", json!(10), 3)].concat());
        assert_eq!(check(&no_pairs).verdict, Verdict::Unknown);
        // Pairs written, but never read one after the other.
        let unread = indexed(
            [
                pair(1, 0, 1, 7, OpType::Ok, Some((3, 4))),
                read(2, 0, 5, "r0-0", json!(7), 3),
            ]
            .concat(),
        );
        let result = check(&unread);
        assert_eq!(result.verdict, Verdict::Unknown);
        assert_eq!(result.details["counts"]["pairs_written"], 1);
        assert_eq!(result.details["counts"]["pair_reads_checked"], 0);
    }
}
