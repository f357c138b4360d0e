//! Votes never go back (docs/harness.md): every vote a node saved is in its log (`vote saved
//! term=T voted_for=N committed=C`, every start of the node), recorded after the run as one
//! `final` event per node and data dir (f `votes`; a restore gives the node a new data dir whose
//! votes start again, so its votes after it are an event of their own, `restores` counting
//! them). openraft orders votes by leader id, the pair (term,
//! candidate), then uncommitted before committed; a node may grant only a vote greater than
//! the one it holds, and the one it holds is durable. So the votes a node saved, in the order
//! it saved them across all its starts, must rise. One that is smaller than an earlier one
//! means the node forgot a vote (a restart found an older one on disk) and may have granted
//! two candidates the same leadership: two leaders of one leader id become possible.
//! (openraft's leader ids are (term, candidate) pairs, so two candidates granted in one term,
//! the second greater, are two leader ids, not a double vote.) A run whose nodes saved no vote
//! at all is `unknown`: the logs were not read.

use serde_json::{json, Value};

use super::{CheckResult, Verdict};
use crate::cluster::RESTORED_MARKER;
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

/// The votes a node's log holds, one list per data dir the node ran on, in the order saved: a
/// restore ([`RESTORED_MARKER`] in the log) gives the node a new data dir whose votes start
/// again.
pub fn per_data_dir(log: &str) -> Vec<Vec<Value>> {
    let mut dirs = vec![Vec::new()];
    for line in log.lines() {
        if line.starts_with(RESTORED_MARKER) {
            dirs.push(Vec::new());
        } else if let Some(vote) = parse_line(line) {
            dirs.last_mut().expect("one at least").push(vote);
        }
    }
    dirs
}

/// Checks the votes.
pub fn check(history: &[Op]) -> CheckResult {
    let mut violations: Vec<Value> = Vec::new();
    let mut saved = 0usize;
    for op in history
        .iter()
        .filter(|op| op.is_named(FINAL) && op.f == FINAL_VOTES)
    {
        let node = op.value["node"].as_u64().unwrap_or(0);
        let restores = op.value["restores"].as_u64().unwrap_or(0);
        let mut highest: Option<(u64, u64, bool)> = None;
        for vote in op.value["votes"].as_array().into_iter().flatten() {
            let (Some(term), Some(candidate), Some(committed)) = (
                vote["term"].as_u64(),
                vote["voted_for"].as_u64(),
                vote["committed"].as_bool(),
            ) else {
                continue;
            };
            saved += 1;
            let this = (term, candidate, committed);
            if let Some(before) = highest.filter(|before| this < *before) {
                violations.push(json!({"problem": "a node saved a vote smaller than one it had saved before",
                                       "node": node,
                                       "restores": restores,
                                       "before": {"term": before.0, "voted_for": before.1, "committed": before.2},
                                       "after": vote}));
            }
            highest = highest.max(Some(this));
        }
    }
    if violations.is_empty() && saved == 0 {
        return CheckResult {
            verdict: Verdict::Unknown,
            summary: "no node's log holds a saved vote".to_owned(),
            details: Value::Null,
        };
    }
    CheckResult::from_violations(&format!("{saved} votes saved"), violations)
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
    fn rising_votes_are_valid_a_second_candidate_of_a_term_included() {
        // Seen in a run: node 2, a candidate in term 2, then grants node 3 (T2-N3 > T2-N2).
        let history = [
            votes(
                1,
                json!([vote(1, 1, false), vote(1, 1, true), vote(2, 2, false)]),
            ),
            votes(
                2,
                json!([
                    vote(1, 1, true),
                    vote(2, 2, false),
                    vote(2, 3, false),
                    vote(2, 3, true)
                ]),
            ),
            votes(
                3,
                json!([vote(2, 3, false), vote(2, 3, true), vote(4, 1, true)]),
            ),
        ];
        assert_eq!(check(&history).verdict, Verdict::Valid);
    }

    #[test]
    fn a_vote_below_an_earlier_one_is_a_forgotten_vote() {
        // What a vote lost on power loss allows: the node restarts on an older vote and grants
        // a smaller leader id of the same term.
        let history = [votes(1, json!([vote(5, 3, false), vote(5, 1, false)]))];
        let result = check(&history);
        assert_eq!(result.verdict, Verdict::Invalid);
        assert!(
            result.details.to_string().contains("smaller"),
            "{}",
            result.details
        );
        let history = [votes(2, json!([vote(7, 2, true), vote(6, 3, false)]))];
        assert_eq!(check(&history).verdict, Verdict::Invalid);
        let history = [votes(2, json!([vote(7, 2, true), vote(7, 2, false)]))];
        assert_eq!(check(&history).verdict, Verdict::Invalid);
    }

    #[test]
    fn a_restore_starts_the_votes_again() {
        let saved = |term: u64| {
            format!("2026-12-06T20:00:00Z  INFO baton_raft_store::store::log: vote saved term={term} voted_for=1 committed=true")
        };
        let log = [
            saved(7),
            saved(9),
            format!("{RESTORED_MARKER} from /tmp/backup.bak"),
            "restored node 1 from /tmp/backup.bak".to_owned(),
            saved(1),
        ]
        .join("\n");
        let dirs = per_data_dir(&log);
        assert_eq!(
            dirs,
            [
                vec![vote(7, 1, true), vote(9, 1, true)],
                vec![vote(1, 1, true)]
            ]
        );
        let history: Vec<Op> = dirs
            .into_iter()
            .map(|votes_of_dir| votes(1, Value::Array(votes_of_dir)))
            .collect();
        assert_eq!(check(&history).verdict, Verdict::Valid);
        // Without the marker, the same votes are a forgotten vote.
        let one = per_data_dir(&log.replace(RESTORED_MARKER, "something else"));
        assert_eq!(one.len(), 1);
        let history = [votes(1, Value::Array(one.concat()))];
        assert_eq!(check(&history).verdict, Verdict::Invalid);
    }

    #[test]
    fn no_votes_at_all_is_unknown() {
        assert_eq!(check(&[votes(1, json!([]))]).verdict, Verdict::Unknown);
    }
}
