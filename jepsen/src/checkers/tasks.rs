//! Work queues (docs/guarantees.md, "Semantics"): no task completed twice, none lost. From the history: at most
//! one successful `complete` per task; no successful claim of a task after a `complete` of it
//! had succeeded; and after healing (process `final`, f `final-tasks`, the listing of every
//! queue used) every task whose enqueue succeeded is present, every task whose completion
//! succeeded is `done`, and no task is present that was never enqueued.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Value};

use super::{ms, CheckResult, Verdict};
use crate::history::{pairs, Op, OpType, FINAL};

/// Checks the queues.
pub fn check(history: &[Op]) -> CheckResult {
    let all = pairs(history);
    let mut violations: Vec<Value> = Vec::new();
    let mut enqueued_ok: BTreeSet<(&str, &str)> = BTreeSet::new();
    let mut enqueued_maybe: BTreeSet<(&str, &str)> = BTreeSet::new();
    let mut completed: BTreeMap<(&str, &str), Vec<(u64, u64)>> = BTreeMap::new();
    for pair in &all {
        let queue = pair.invoke.key_str();
        let task = pair.invoke.value["task"].as_str().unwrap_or("");
        match (pair.invoke.f.as_str(), pair.outcome()) {
            ("enqueue", OpType::Ok) => {
                enqueued_ok.insert((queue, task));
                enqueued_maybe.insert((queue, task));
            }
            ("enqueue", OpType::Info) => {
                enqueued_maybe.insert((queue, task));
            }
            ("complete", OpType::Ok) => {
                completed
                    .entry((queue, task))
                    .or_default()
                    .push((pair.end_ns(), pair.invoke.index));
            }
            _ => {}
        }
    }
    for ((queue, task), completions) in &completed {
        if completions.len() > 1 {
            violations.push(
                json!({"problem": "task completed twice", "queue": queue, "task": task,
                "invocations": completions.iter().map(|(_, index)| index).collect::<Vec<_>>()}),
            );
        }
    }
    for pair in all
        .iter()
        .filter(|pair| pair.invoke.f == "claim" && pair.outcome() == OpType::Ok)
    {
        let queue = pair.invoke.key_str();
        let Some(task) = pair.result()["task"].as_str() else {
            continue;
        };
        if let Some(&(done_at, index)) = completed
            .get(&(queue, task))
            .and_then(|completions| completions.iter().min())
            .filter(|(done_at, _)| *done_at < pair.invoke.time_ns)
        {
            violations.push(
                json!({"problem": "a completed task was claimed again", "queue": queue,
                "task": task, "completed_ms": ms(done_at), "completion": index,
                "claim": pair.invoke.index}),
            );
        }
    }
    let mut listed: BTreeMap<&str, BTreeMap<&str, &str>> = BTreeMap::new();
    let mut listings = 0usize;
    for op in history
        .iter()
        .filter(|op| op.is_named(FINAL) && op.f == "final-tasks")
    {
        if op.value["complete"] != Value::Bool(true) {
            continue;
        }
        listings += 1;
        let tasks = listed.entry(op.key_str()).or_default();
        for task in op.value["tasks"].as_array().into_iter().flatten() {
            tasks.insert(
                task["id"].as_str().unwrap_or(""),
                task["state"].as_str().unwrap_or(""),
            );
        }
    }
    let queues: BTreeSet<&str> = enqueued_maybe.iter().map(|(queue, _)| *queue).collect();
    let unlisted: Vec<&&str> = queues
        .iter()
        .filter(|queue| !listed.contains_key(**queue))
        .collect();
    for (queue, tasks) in &listed {
        for (task, state) in tasks {
            if !enqueued_maybe.contains(&(*queue, *task)) {
                violations.push(json!({"problem": "a task that was never enqueued", "queue": queue, "task": task}));
            }
            if completed.contains_key(&(*queue, *task)) && *state != "done" {
                violations.push(
                    json!({"problem": "a completed task is not done after healing",
                                       "queue": queue, "task": task, "state": state}),
                );
            }
        }
    }
    for (queue, task) in &enqueued_ok {
        if listed
            .get(queue)
            .is_some_and(|tasks| !tasks.contains_key(task))
        {
            violations.push(
                json!({"problem": "an enqueued task was lost", "queue": queue, "task": task}),
            );
        }
    }
    let result = CheckResult::from_violations(
        &format!(
            "{} tasks enqueued, {} completed, {listings} final listings",
            enqueued_ok.len(),
            completed.len()
        ),
        violations,
    );
    if result.verdict == Verdict::Valid && !unlisted.is_empty() {
        return CheckResult {
            verdict: Verdict::Unknown,
            summary: format!(
                "{} queue(s) could not be listed after healing",
                unlisted.len()
            ),
            details: json!({"unlisted": unlisted}),
        };
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::build::{indexed, op};
    use crate::history::Process;

    fn call(process: u64, at: u64, f: &str, task: &str, result: Value) -> Vec<Op> {
        vec![
            op(process, OpType::Invoke, at, f, "q", json!({"task": task})),
            op(process, OpType::Ok, at + 1, f, "q", result),
        ]
    }

    fn listing(tasks: Value) -> Op {
        let mut listing = op(
            0,
            OpType::Info,
            100,
            "final-tasks",
            "q",
            json!({"complete": true, "tasks": tasks}),
        );
        listing.process = Process::Named(FINAL.to_owned());
        listing
    }

    #[test]
    fn a_clean_queue_passes() {
        let history = indexed(
            [
                call(1, 0, "enqueue", "a", json!({})),
                call(2, 2, "claim", "", json!({"task": "a"})),
                call(2, 4, "complete", "a", json!({})),
                vec![listing(json!([{"id": "a", "state": "done"}]))],
            ]
            .concat(),
        );
        assert_eq!(check(&history).verdict, Verdict::Valid);
    }

    #[test]
    fn a_task_completed_twice_is_caught() {
        let history = indexed(
            [
                call(1, 0, "enqueue", "a", json!({})),
                call(2, 4, "complete", "a", json!({})),
                call(3, 8, "complete", "a", json!({})),
                vec![listing(json!([{"id": "a", "state": "done"}]))],
            ]
            .concat(),
        );
        assert_eq!(check(&history).verdict, Verdict::Invalid);
    }

    #[test]
    fn a_lost_task_is_caught() {
        let history = indexed(
            [
                call(1, 0, "enqueue", "a", json!({})),
                call(1, 2, "enqueue", "b", json!({})),
                vec![listing(json!([{"id": "a", "state": "ready"}]))],
            ]
            .concat(),
        );
        assert_eq!(check(&history).verdict, Verdict::Invalid);
    }

    #[test]
    fn a_completed_task_claimed_again_is_caught() {
        let history = indexed(
            [
                call(1, 0, "enqueue", "a", json!({})),
                call(2, 4, "complete", "a", json!({})),
                call(3, 8, "claim", "", json!({"task": "a"})),
                vec![listing(json!([{"id": "a", "state": "done"}]))],
            ]
            .concat(),
        );
        assert_eq!(check(&history).verdict, Verdict::Invalid);
    }
}
