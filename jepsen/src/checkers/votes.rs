//! One vote per term (docs/harness.md): every vote a node saved is in its log (`vote saved
//! term=T voted_for=N committed=C`, every start of the node), recorded after the run as one
//! `final` event per node (f `votes`). A vote granted is saved uncommitted; a node that saved
//! uncommitted votes for two candidates in one term voted twice, and two leaders become
//! possible. (Granting A and then accepting B as the term's leader, a committed vote, is
//! fine: B won with other votes.) Committed votes name the leader each node accepted; two of
//! them naming different leaders of one term are two leaders in that term.
//! A run whose nodes saved no vote at all is `unknown`: the logs were not read.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::{CheckResult, Verdict};
use crate::history::{Op, FINAL};

/// The f of the `final` events that hold a node's votes.
pub const FINAL_VOTES: &str = "votes";
/// What batond logs once a vote is durable.
const VOTE_SAVED: &str = "vote saved";

/// The vote a log line records, as `{term, voted_for, committed}`, if it records one. Reads
/// both log formats: `key=value` fields (human) and JSON fields.
pub fn parse_line(line: &str) -> Option<Value> {
    if !line.contains(VOTE_SAVED) {
        return None;
    }
    if let Ok(json) = serde_json::from_str::<Value>(line) {
        let fields = &json["fields"];
        return Some(json!({
            "term": fields["term"].as_u64()?,
            "voted_for": fields["voted_for"].as_u64()?,
            "committed": fields["committed"].as_bool()?,
        }));
    }
    let field = |name: &str| {
        line.split_whitespace()
            .find_map(|token| token.strip_prefix(name)?.strip_prefix('='))
    };
    Some(json!({
        "term": field("term")?.parse::<u64>().ok()?,
        "voted_for": field("voted_for")?.parse::<u64>().ok()?,
        "committed": field("committed")?.parse::<bool>().ok()?,
    }))
}

/// Checks the votes.
pub fn check(history: &[Op]) -> CheckResult {
    let mut violations: Vec<Value> = Vec::new();
    // term -> leader -> the nodes that accepted it
    let mut leaders: BTreeMap<u64, BTreeMap<u64, Vec<u64>>> = BTreeMap::new();
    let mut saved = 0usize;
    for op in history
        .iter()
        .filter(|op| op.is_named(FINAL) && op.f == FINAL_VOTES)
    {
        let node = op.value["node"].as_u64().unwrap_or(0);
        // term -> the candidates this node voted for in it
        let mut voted: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        for vote in op.value["votes"].as_array().into_iter().flatten() {
            let (Some(term), Some(candidate)) = (vote["term"].as_u64(), vote["voted_for"].as_u64())
            else {
                continue;
            };
            saved += 1;
            if vote["committed"].as_bool() == Some(false) {
                let candidates = voted.entry(term).or_default();
                if !candidates.contains(&candidate) {
                    candidates.push(candidate);
                }
            } else {
                let accepted = leaders
                    .entry(term)
                    .or_default()
                    .entry(candidate)
                    .or_default();
                if !accepted.contains(&node) {
                    accepted.push(node);
                }
            }
        }
        for (term, candidates) in voted {
            if candidates.len() > 1 {
                violations.push(
                    json!({"problem": "a node voted for two candidates in one term",
                                       "node": node, "term": term, "candidates": candidates}),
                );
            }
        }
    }
    for (term, accepted) in &leaders {
        if accepted.len() > 1 {
            violations.push(json!({"problem": "two leaders in one term",
                                   "term": term, "leaders": accepted}));
        }
    }
    if violations.is_empty() && saved == 0 {
        return CheckResult {
            verdict: Verdict::Unknown,
            summary: "no node's log holds a saved vote".to_owned(),
            details: Value::Null,
        };
    }
    CheckResult::from_violations(
        &format!("{saved} votes saved, {} terms with a leader", leaders.len()),
        violations,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{OpType, Process};

    fn votes(node: u64, votes: Value) -> Op {
        Op {
            index: 0,
            time_ns: 0,
            process: Process::Named(FINAL.to_owned()),
            kind: OpType::Info,
            f: FINAL_VOTES.to_owned(),
            key: Value::Null,
            value: json!({"node": node, "votes": votes}),
            error: None,
            cluster_time_ms: None,
            node: Some(node),
        }
    }

    fn vote(term: u64, voted_for: u64, committed: bool) -> Value {
        json!({"term": term, "voted_for": voted_for, "committed": committed})
    }

    #[test]
    fn reads_both_log_formats() {
        let human = "2026-12-03T20:00:00.123456Z  INFO baton_raft_store::store::log: vote saved term=3 voted_for=2 committed=true";
        assert_eq!(parse_line(human), Some(vote(3, 2, true)));
        let json = r#"{"timestamp":"x","level":"INFO","fields":{"message":"vote saved","term":4,"voted_for":1,"committed":false},"target":"baton_raft_store::store::log"}"#;
        assert_eq!(parse_line(json), Some(vote(4, 1, false)));
        assert_eq!(parse_line("INFO something else term=3"), None);
    }

    #[test]
    fn one_vote_per_term_and_one_leader_per_term_are_valid() {
        let history = [
            votes(
                1,
                json!([vote(1, 1, false), vote(1, 1, true), vote(2, 2, false)]),
            ),
            votes(
                2,
                json!([vote(1, 1, false), vote(1, 1, true), vote(2, 2, true)]),
            ),
            votes(3, json!([vote(2, 3, false), vote(2, 2, true)])),
        ];
        assert_eq!(check(&history).verdict, Verdict::Valid);
    }

    #[test]
    fn a_second_candidate_in_a_term_is_a_double_vote() {
        // What a vote lost on power loss allows: the node restarts, forgets, votes again.
        let history = [votes(1, json!([vote(5, 1, false), vote(5, 3, false)]))];
        let result = check(&history);
        assert_eq!(result.verdict, Verdict::Invalid);
        assert!(
            result.details.to_string().contains("two candidates"),
            "{}",
            result.details
        );
    }

    #[test]
    fn two_committed_leaders_of_one_term_are_two_leaders() {
        let history = [
            votes(1, json!([vote(7, 1, true)])),
            votes(2, json!([vote(7, 2, true)])),
        ];
        let result = check(&history);
        assert_eq!(result.verdict, Verdict::Invalid);
        assert!(
            result.details.to_string().contains("two leaders"),
            "{}",
            result.details
        );
    }

    #[test]
    fn no_votes_at_all_is_unknown() {
        assert_eq!(check(&[votes(1, json!([]))]).verdict, Verdict::Unknown);
    }
}
