//! The line (acquires made with `wait_ms`): waiters are served first come, first served, and
//! a place in line a client was told about is never lost, failovers included.
//!
//! The evidence is the cluster's own event log, read after healing from revision 0 to its end
//! (process `final`, f `final-events`), replayed per resource:
//!
//! - `queued` appends its holder to the resource's line; a holder that joins a line it already
//!   waits in, or joins the same line a second time, is a violation (the `line` workload never
//!   joins again after leaving: a second join means the first place was lost while its session
//!   lived, and a re-sent acquire took a new one at the back);
//! - `left_line` removes its holder (it must be in the line);
//! - `granted` to a holder that waits in the resource's line must go to the first of the line
//!   ("granted out of arrival order" otherwise, naming the revisions), and removes it; grants to
//!   holders not in line (nobody was waiting) are only counted.
//!
//! Then against the clients' history: every `202` (queued) an acquire got has a `queued` event
//! of that holder on that resource (an acknowledged place in line exists), and every grant an
//! acquire got has the `granted` event of that holder, resource and fence (so does the
//! session's own lease that a `LEASE_HELD` refusal of a re-sent acquire names). The workload gives
//! every session a holder name of its own, so events and operations match by holder.
//!
//! If the event log could not be read to its end, or its window no longer starts at revision 1
//! (the server refused `after=0`, or the first event returned is later), the checker answers
//! unknown: a replay of part of the log proves nothing about the order.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde_json::{json, Value};

use super::{CheckResult, Verdict, VIOLATIONS_SHOWN_MAX};
use crate::history::{pairs, Op, OpType, FINAL};

/// The f of the final read of the event log.
pub const FINAL_EVENTS: &str = "final-events";

/// One waiter in the replayed line: its holder and the revision of its `queued` event.
struct Waiting<'a> {
    holder: &'a str,
    queued_at: u64,
}

/// Checks the line.
pub fn check(history: &[Op]) -> CheckResult {
    let Some(read) = history
        .iter()
        .rev()
        .find(|op| op.is_named(FINAL) && op.f == FINAL_EVENTS)
    else {
        return unknown("no final read of the event log in the history", Value::Null);
    };
    if read.value["trimmed"] == Value::Bool(true) {
        return unknown(
            "the event window no longer starts at revision 1 (trimmed): the replay would miss the oldest events",
            json!({"node": read.value["node"], "error": read.value["error"]}),
        );
    }
    if read.value["complete"] != Value::Bool(true) {
        return unknown(
            "the event log could not be read to its end",
            json!({"node": read.value["node"], "error": read.value["error"]}),
        );
    }
    let events: Vec<&Value> = read.value["events"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    let first = events.first().and_then(|event| event["revision"].as_u64());
    if first.is_some_and(|revision| revision != 1) {
        return unknown(
            "the first event returned is not revision 1: the window was trimmed",
            json!({"first_revision": first}),
        );
    }

    let mut violations: Vec<Value> = Vec::new();
    let mut lines: BTreeMap<&str, VecDeque<Waiting<'_>>> = BTreeMap::new();
    // Every (resource, holder) that ever joined, with the revision it first did.
    let mut joined: BTreeMap<(&str, &str), u64> = BTreeMap::new();
    let mut granted: BTreeSet<(&str, &str, u64)> = BTreeSet::new();
    let (mut queued, mut left, mut grants, mut line_grants) = (0usize, 0usize, 0usize, 0usize);
    let mut last_revision = 0u64;
    let mut longest = 0usize;
    for event in &events {
        let revision = event["revision"].as_u64().unwrap_or(0);
        if revision <= last_revision {
            violations.push(json!({"problem": "event revisions do not rise",
                                   "revision": revision, "after": last_revision}));
        }
        last_revision = last_revision.max(revision);
        let resource = event["resource"].as_str().unwrap_or("");
        let holder = event["holder"].as_str().unwrap_or("");
        match event["type"].as_str().unwrap_or("") {
            "queued" => {
                queued += 1;
                let line = lines.entry(resource).or_default();
                if let Some(waiting) = line.iter().find(|waiting| waiting.holder == holder) {
                    violations.push(json!({
                        "problem": "a holder joined a line it already waits in",
                        "resource": resource, "holder": holder, "revision": revision,
                        "first_queued_revision": waiting.queued_at,
                    }));
                    continue;
                }
                if let Some(&earlier) = joined.get(&(resource, holder)) {
                    violations.push(json!({
                        "problem": "a holder joined the same line twice: its first place was lost while its session lived",
                        "resource": resource, "holder": holder, "revision": revision,
                        "first_queued_revision": earlier,
                    }));
                }
                joined.entry((resource, holder)).or_insert(revision);
                line.push_back(Waiting {
                    holder,
                    queued_at: revision,
                });
                longest = longest.max(line.len());
            }
            "left_line" => {
                left += 1;
                let line = lines.entry(resource).or_default();
                match line.iter().position(|waiting| waiting.holder == holder) {
                    Some(position) => {
                        line.remove(position);
                    }
                    None => violations.push(json!({
                        "problem": "a holder left a line it was not in",
                        "resource": resource, "holder": holder, "revision": revision,
                    })),
                }
            }
            "granted" => {
                grants += 1;
                let fence = event["fence"].as_u64().unwrap_or(0);
                granted.insert((resource, holder, fence));
                let line = lines.entry(resource).or_default();
                let Some(position) = line.iter().position(|waiting| waiting.holder == holder)
                else {
                    continue;
                };
                line_grants += 1;
                if position > 0 {
                    let ahead = &line[0];
                    violations.push(json!({
                        "problem": "granted out of arrival order",
                        "resource": resource,
                        "granted": {"holder": holder, "fence": fence, "revision": revision,
                                    "queued_revision": line[position].queued_at},
                        "first_in_line": {"holder": ahead.holder, "queued_revision": ahead.queued_at},
                        "waiters_ahead": position,
                    }));
                }
                line.remove(position);
            }
            _ => {}
        }
    }

    // The clients' side: what they were told must be in the log.
    let (mut told_queued, mut told_granted, mut told_granted_after_waiting) = (0usize, 0, 0);
    let mut waited: BTreeSet<(&str, &str)> = BTreeSet::new();
    let mut told_own = 0usize;
    for pair in pairs(history) {
        if pair.invoke.f != "acquire" {
            continue;
        }
        let resource = pair.invoke.key_str();
        let Some(holder) = pair.invoke.value["holder"].as_str() else {
            continue;
        };
        let answer = pair.result();
        if pair.outcome() == OpType::Fail {
            // Refused because the session holds the lease already: granted while it waited.
            let own = &answer["held_by"];
            if own["holder"] == holder && own["resource"] == resource {
                told_own += 1;
                let fence = own["fence"].as_u64().unwrap_or(0);
                if !granted.contains(&(resource, holder, fence)) {
                    violations.push(json!({
                        "problem": "a refusal naming the holder's own lease has no granted event for it",
                        "resource": resource, "holder": holder, "fence": fence,
                        "invocation": pair.invoke.index,
                    }));
                }
            }
            continue;
        }
        if pair.outcome() != OpType::Ok {
            continue;
        }
        if answer["queued"] == Value::Bool(true) {
            told_queued += 1;
            waited.insert((resource, holder));
            if !joined.contains_key(&(resource, holder)) {
                violations.push(json!({
                    "problem": "an acknowledged place in line has no queued event (lost)",
                    "resource": resource, "holder": holder,
                    "invocation": pair.invoke.index, "position": answer["position"],
                }));
            }
        } else if let Some(fence) = answer["fence"].as_u64() {
            told_granted += 1;
            // Granted from the line: it joined (the log says so, or it was told so earlier),
            // or it sent the acquire again while waiting.
            let after_waiting = joined.contains_key(&(resource, holder))
                || waited.contains(&(resource, holder))
                || pair.invoke.value["resend"] == Value::Bool(true);
            told_granted_after_waiting += usize::from(after_waiting);
            if !granted.contains(&(resource, holder, fence)) {
                violations.push(json!({
                    "problem": if after_waiting {
                        "a grant the client saw after waiting has no granted event for its holder"
                    } else {
                        "a grant the client saw has no granted event for its holder"
                    },
                    "resource": resource, "holder": holder, "fence": fence,
                    "invocation": pair.invoke.index,
                }));
            }
        }
    }

    let counts = json!({
        "events": events.len(), "last_revision": last_revision,
        "queued": queued, "left_line": left, "granted": grants, "line_grants": line_grants,
        "longest_line": longest,
        "clients_queued": told_queued, "clients_granted": told_granted,
        "clients_granted_after_waiting": told_granted_after_waiting,
        "clients_told_own_lease": told_own,
    });
    let checked = format!(
        "{} events, {queued} queued (at most {longest} waiting), {line_grants} line grants of {grants}, {left} left; clients: {told_queued} queued answers, {told_granted_after_waiting} grants after waiting, {told_own} refusals naming their own lease",
        events.len()
    );
    if violations.is_empty() {
        CheckResult::valid(checked, counts)
    } else {
        CheckResult {
            verdict: Verdict::Invalid,
            summary: format!("{} violation(s); {checked}", violations.len()),
            details: json!({
                "violations": violations.into_iter().take(VIOLATIONS_SHOWN_MAX).collect::<Vec<_>>(),
                "counts": counts,
            }),
        }
    }
}

fn unknown(why: &str, details: Value) -> CheckResult {
    CheckResult {
        verdict: Verdict::Unknown,
        summary: why.to_owned(),
        details,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::build::{indexed, op};
    use crate::history::Process;

    fn event(revision: u64, kind: &str, resource: &str, holder: &str) -> Value {
        json!({"revision": revision, "type": kind, "resource": resource, "holder": holder,
               "fence": revision, "mode": "exclusive"})
    }

    fn final_events(events: Vec<Value>) -> Op {
        Op {
            index: 0,
            time_ns: 0,
            process: Process::Named(FINAL.to_owned()),
            kind: OpType::Info,
            f: FINAL_EVENTS.to_owned(),
            key: Value::from(""),
            value: json!({"node": 1, "complete": true, "trimmed": false, "events": events}),
            error: None,
            cluster_time_ms: None,
            node: Some(1),
        }
    }

    /// An acquire by `holder` answered `answer` (a grant's fence or a place in line).
    fn acquire(process: u64, at: u64, holder: &str, resend: bool, answer: Value) -> Vec<Op> {
        vec![
            op(
                process,
                OpType::Invoke,
                at,
                "acquire",
                "r",
                json!({"holder": holder, "resend": resend}),
            ),
            op(process, OpType::Ok, at + 1, "acquire", "r", answer),
        ]
    }

    fn queued_answer(position: u64) -> Value {
        json!({"queued": true, "position": position})
    }

    /// `a` holds `r`; `b` then `c` wait; `a` releases and `b` gets it; `b` releases and `c` gets
    /// it; `d` joins and leaves. The clients saw their places and grants.
    fn faithful() -> (Vec<Value>, Vec<Op>) {
        let events = vec![
            event(1, "granted", "r", "a"),
            event(2, "queued", "r", "b"),
            event(3, "queued", "r", "c"),
            event(4, "released", "r", "a"),
            event(5, "granted", "r", "b"),
            event(6, "queued", "r", "d"),
            event(7, "left_line", "r", "d"),
            event(8, "expired", "r", ""),
            event(9, "granted", "r", "c"),
        ];
        let clients = [
            acquire(1, 0, "a", false, json!({"fence": 1})),
            acquire(2, 2, "b", false, queued_answer(1)),
            acquire(3, 4, "c", false, queued_answer(2)),
            acquire(2, 6, "b", true, json!({"fence": 5})),
            acquire(4, 8, "d", false, queued_answer(2)),
            acquire(3, 10, "c", true, queued_answer(1)),
            acquire(3, 12, "c", true, json!({"fence": 9})),
        ]
        .concat();
        (events, clients)
    }

    fn history(events: Vec<Value>, clients: Vec<Op>) -> Vec<Op> {
        let mut ops = clients;
        ops.push(final_events(events));
        indexed(ops)
    }

    #[test]
    fn grants_in_arrival_order_pass() {
        let (events, clients) = faithful();
        let result = check(&history(events, clients));
        assert_eq!(result.verdict, Verdict::Valid, "{}", result.details);
        assert_eq!(result.details["line_grants"], 2);
        assert_eq!(result.details["queued"], 3);
        assert_eq!(result.details["clients_granted_after_waiting"], 2);
    }

    #[test]
    fn a_grant_out_of_arrival_order_is_caught() {
        let (mut events, clients) = faithful();
        // `c` gets the resource while `b`, who came first, still waits.
        events[4] = event(5, "granted", "r", "c");
        events[8] = event(9, "granted", "r", "b");
        let result = check(&history(events, clients));
        assert_eq!(result.verdict, Verdict::Invalid);
        let violation = &result.details["violations"][0];
        assert_eq!(violation["problem"], "granted out of arrival order");
        assert_eq!(violation["granted"]["revision"], 5);
        assert_eq!(violation["first_in_line"]["holder"], "b");
        assert_eq!(violation["first_in_line"]["queued_revision"], 2);
    }

    #[test]
    fn a_lost_acknowledged_place_is_caught() {
        let (mut events, clients) = faithful();
        // `d` was told it waits second, but the log has no `queued` for it (a failover lost it).
        events.retain(|event| event["holder"] != "d");
        let result = check(&history(events, clients));
        assert_eq!(result.verdict, Verdict::Invalid);
        assert_eq!(
            result.details["violations"][0]["problem"],
            "an acknowledged place in line has no queued event (lost)"
        );
    }

    #[test]
    fn a_place_lost_and_taken_again_is_caught() {
        let (mut events, clients) = faithful();
        // `c`'s place vanished (left without asking) and its re-sent acquire joined again.
        events.truncate(7);
        events.push(event(8, "left_line", "r", "c"));
        events.push(event(9, "queued", "r", "c"));
        events.push(
            json!({"revision": 10, "type": "granted", "resource": "r", "holder": "c",
                           "fence": 9, "mode": "exclusive"}),
        );
        let result = check(&history(events, clients));
        assert_eq!(result.verdict, Verdict::Invalid);
        assert_eq!(
            result.details["violations"][0]["problem"],
            "a holder joined the same line twice: its first place was lost while its session lived"
        );
        assert_eq!(
            result.details["violations"].as_array().map(Vec::len),
            Some(1)
        );
    }

    #[test]
    fn a_grant_seen_after_waiting_without_its_event_is_caught() {
        let (mut events, clients) = faithful();
        // The log grants `c` another fence than the one its client was told.
        events[8] = json!({"revision": 9, "type": "granted", "resource": "r", "holder": "c",
                           "fence": 10, "mode": "exclusive"});
        let result = check(&history(events, clients));
        assert_eq!(result.verdict, Verdict::Invalid);
        assert_eq!(
            result.details["violations"][0]["problem"],
            "a grant the client saw after waiting has no granted event for its holder"
        );
    }

    #[test]
    fn a_refusal_naming_the_own_lease_must_match_a_grant() {
        let (events, mut clients) = faithful();
        // `b`'s re-sent acquire was refused by its own lease, granted at revision 5.
        let own = |fence: u64| json!({"held_by": {"holder": "b", "resource": "r", "fence": fence, "expires_in_ms": 900}});
        clients[7].kind = OpType::Fail;
        clients[7].value = own(5);
        clients[7].error = Some("LEASE_HELD".to_owned());
        let result = check(&history(events.clone(), clients.clone()));
        assert_eq!(result.verdict, Verdict::Valid, "{}", result.details);
        assert_eq!(result.details["clients_told_own_lease"], 1);
        clients[7].value = own(4);
        let result = check(&history(events, clients));
        assert_eq!(result.verdict, Verdict::Invalid);
    }

    #[test]
    fn a_trimmed_or_unread_log_is_unknown_never_valid() {
        let (events, clients) = faithful();
        let late_start: Vec<Value> = events[2..].to_vec();
        assert_eq!(
            check(&history(late_start, clients.clone())).verdict,
            Verdict::Unknown
        );
        let mut refused = history(events.clone(), clients.clone());
        let last = refused.len() - 1;
        refused[last].value = json!({"node": 1, "complete": false, "trimmed": true,
                                     "error": "NOT_FOUND", "events": []});
        assert_eq!(check(&refused).verdict, Verdict::Unknown);
        let mut incomplete = history(events, clients.clone());
        incomplete[last].value["complete"] = json!(false);
        assert_eq!(check(&incomplete).verdict, Verdict::Unknown);
        assert_eq!(check(&indexed(clients)).verdict, Verdict::Unknown);
    }
}
