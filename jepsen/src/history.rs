//! The history of a run: every client operation as an `invoke` followed by exactly one of
//! `ok` (it happened), `fail` (it surely did not) or `info` (unknown), every fault window of
//! the nemesis, and the final reads taken after healing. Written as JSON Lines
//! (`history.jsonl`), one event a line, and read back by the checkers.
//!
//! What lives here: the event type ([`Op`]), the recorder ([`History`]) and the pairing of
//! invocations with completions ([`pairs`]). What must never live here: judging a history
//! (that is `checkers/`), or anything that talks to a server.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What kind of event an [`Op`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OpType {
    /// The operation was sent.
    Invoke,
    /// It took effect (or, for a read, returned this value).
    Ok,
    /// It surely did not take effect.
    Fail,
    /// Unknown: it may or may not have taken effect. Also used for nemesis and final events.
    Info,
}

/// Who did something: a client process (a number; a client takes a new one after every
/// `info`) or a named actor (`nemesis`, `final`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Process {
    /// A client process.
    Client(u64),
    /// The nemesis, or the harness's final reads.
    Named(String),
}

/// The process name of fault windows.
pub const NEMESIS: &str = "nemesis";
/// The process name of the reads taken after healing.
pub const FINAL: &str = "final";

/// One line of `history.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Op {
    /// Position in the history, from 0.
    pub index: u64,
    /// Harness monotonic time since the run started.
    pub time_ns: u64,
    /// Who.
    pub process: Process,
    /// What kind of event.
    #[serde(rename = "type")]
    pub kind: OpType,
    /// The function: `acquire`, `keepalive`, `release`, `write`, `read`, `hold`, `start`, ...
    pub f: String,
    /// The key or resource path the operation is about.
    #[serde(default)]
    pub key: Value,
    /// Arguments (on invoke) or results (on completion).
    #[serde(default)]
    pub value: Value,
    /// The error code of a `fail` or `info`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// `Baton-Cluster-Time` of the answer, when one came.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_time_ms: Option<u64>,
    /// The node the client is bound to (clients never follow the leader).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<u64>,
}

impl Op {
    /// True for a client process's event.
    pub fn is_client(&self) -> bool {
        matches!(self.process, Process::Client(_))
    }

    /// True when the event belongs to the named actor.
    pub fn is_named(&self, name: &str) -> bool {
        matches!(&self.process, Process::Named(named) if named == name)
    }

    /// The key as a string (empty when there is none).
    pub fn key_str(&self) -> &str {
        self.key.as_str().unwrap_or("")
    }

    /// The keys a `write` invocation writes its value under: its key, and the `twin` a pair
    /// write (one transaction putting the same value under two keys) also names. Any other
    /// event: its key.
    pub fn written_keys(&self) -> Vec<&str> {
        let mut keys = vec![self.key_str()];
        if self.f == "write" {
            if let Some(twin) = self.value["twin"].as_str() {
                keys.push(twin);
            }
        }
        keys
    }
}

/// An invocation and its completion (`None` when the run ended before it completed: treated
/// like `info`).
#[derive(Debug, Clone, Copy)]
pub struct Pair<'a> {
    /// The `invoke` event.
    pub invoke: &'a Op,
    /// The `ok`, `fail` or `info` event.
    pub complete: Option<&'a Op>,
}

impl Pair<'_> {
    /// The completion type; a missing completion counts as `info`.
    pub fn outcome(&self) -> OpType {
        self.complete.map_or(OpType::Info, |op| op.kind)
    }

    /// The completion time, `u64::MAX` when unknown (`info` or missing): the operation may
    /// take effect at any later time.
    pub fn end_ns(&self) -> u64 {
        match self.complete {
            Some(op) if op.kind != OpType::Info => op.time_ns,
            _ => u64::MAX,
        }
    }

    /// The completion's value (`null` when there is none).
    pub fn result(&self) -> &Value {
        static NULL: Value = Value::Null;
        self.complete.map_or(&NULL, |op| &op.value)
    }
}

/// The client operations of a history, each invocation with its completion, in invocation
/// order. A client process has at most one operation outstanding.
pub fn pairs(history: &[Op]) -> Vec<Pair<'_>> {
    let mut open: BTreeMap<&Process, usize> = BTreeMap::new();
    let mut result: Vec<Pair<'_>> = Vec::new();
    for op in history.iter().filter(|op| op.is_client()) {
        match op.kind {
            OpType::Invoke => {
                open.insert(&op.process, result.len());
                result.push(Pair {
                    invoke: op,
                    complete: None,
                });
            }
            _ => {
                if let Some(position) = open.remove(&op.process) {
                    result[position].complete = Some(op);
                }
            }
        }
    }
    result
}

/// The client operations as the server saw them: the attempts of a mutation that share an
/// `idempotency_key` are one operation (the server applies it at most once, and a retry's
/// replay carries the first attempt's answer), invoked when its first attempt was. It
/// completed `ok` if any attempt did (with that completion), is unknown if any attempt was,
/// and failed only if every attempt did. Operations without a key are their own.
pub fn logical_pairs(history: &[Op]) -> Vec<Pair<'_>> {
    let all = pairs(history);
    let mut attempts: BTreeMap<&str, Vec<Pair<'_>>> = BTreeMap::new();
    let mut result: Vec<Pair<'_>> = Vec::new();
    for pair in &all {
        match pair.invoke.value["idempotency_key"].as_str() {
            Some(key) => attempts.entry(key).or_default().push(*pair),
            None => result.push(*pair),
        }
    }
    for tries in attempts.values() {
        let first = tries[0].invoke;
        let complete = tries
            .iter()
            .find(|attempt| attempt.outcome() == OpType::Ok)
            .or_else(|| {
                tries
                    .iter()
                    .find(|attempt| attempt.outcome() == OpType::Info)
            })
            .unwrap_or(&tries[tries.len() - 1])
            .complete;
        result.push(Pair {
            invoke: first,
            complete,
        });
    }
    result.sort_by_key(|pair| pair.invoke.index);
    result
}

/// The history as the cluster that remains after every `restore` fault knows it. A restore
/// brings the cluster back to its backup, so what it did after the backup was cut may be
/// undone: every client answer that came between the start of a restore fault whose backup was
/// saved and the fault's end (all the old cluster's nodes killed, the new one ready) becomes
/// `info` (it may or may not have taken effect in the restored cluster) and loses its cluster
/// time (the restored cluster's time resumes at the backup's). An answer before the start is
/// in the backup (the backup is cut after a read index); an answer after the end came from the
/// restored cluster. A history without a restore comes back as it is.
///
/// The fences the undone answers carried are not forgotten by a restore: the checkers of fence
/// order (`fences`, and the grants `stale_writes` knows of) read the history as recorded.
pub fn undone(history: &[Op]) -> std::borrow::Cow<'_, [Op]> {
    let mut windows: Vec<(u64, u64)> = Vec::new();
    let mut started: Option<u64> = None;
    for op in history.iter().filter(|op| op.is_named(NEMESIS)) {
        if op.value["fault"] != "restore" {
            continue;
        }
        match op.f.as_str() {
            "start" => started = Some(op.time_ns),
            "stop" => {
                if let Some(start) = started.take() {
                    if op.value["saved"] == Value::Bool(true) {
                        windows.push((start, op.time_ns));
                    }
                }
            }
            _ => {}
        }
    }
    // A run that stopped inside a restore: everything after its start may be undone.
    if let Some(start) = started {
        windows.push((start, u64::MAX));
    }
    if windows.is_empty() {
        return std::borrow::Cow::Borrowed(history);
    }
    let inside = |time_ns: u64| {
        windows
            .iter()
            .any(|&(from, to)| (from..=to).contains(&time_ns))
    };
    std::borrow::Cow::Owned(
        history
            .iter()
            .map(|op| {
                let mut op = op.clone();
                if op.is_client() && op.kind != OpType::Invoke && inside(op.time_ns) {
                    op.kind = OpType::Info;
                    op.cluster_time_ms = None;
                }
                op
            })
            .collect(),
    )
}

/// The recorder: appends events under one lock, so the order of the file is the order in
/// which events happened, and hands out client process ids.
#[derive(Debug, Clone)]
pub struct History {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    started: Instant,
    ops: Mutex<Vec<Op>>,
    next_process: AtomicU64,
}

impl Default for History {
    fn default() -> History {
        History::new()
    }
}

impl History {
    /// An empty history whose clock starts now.
    pub fn new() -> History {
        History {
            inner: Arc::new(Inner {
                started: Instant::now(),
                ops: Mutex::new(Vec::new()),
                next_process: AtomicU64::new(0),
            }),
        }
    }

    /// Harness time since the start of the run.
    pub fn now_ns(&self) -> u64 {
        u64::try_from(self.inner.started.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// The harness time of a monotonic instant (0 before the start).
    pub fn ns_of(&self, instant: Instant) -> u64 {
        u64::try_from(
            instant
                .saturating_duration_since(self.inner.started)
                .as_nanos(),
        )
        .unwrap_or(u64::MAX)
    }

    /// A fresh client process id.
    pub fn new_process(&self) -> u64 {
        self.inner.next_process.fetch_add(1, Ordering::Relaxed)
    }

    /// Appends an event, stamping its index and time; returns the index.
    pub fn record(&self, mut op: Op) -> u64 {
        let mut ops = self.lock();
        op.index = ops.len() as u64;
        op.time_ns = self.now_ns();
        let index = op.index;
        ops.push(op);
        index
    }

    /// Appends an event built from its parts.
    #[allow(clippy::too_many_arguments)]
    pub fn add(
        &self,
        process: Process,
        kind: OpType,
        f: &str,
        key: Value,
        value: Value,
        error: Option<String>,
        cluster_time_ms: Option<u64>,
        node: Option<u64>,
    ) -> u64 {
        self.record(Op {
            index: 0,
            time_ns: 0,
            process,
            kind,
            f: f.to_owned(),
            key,
            value,
            error,
            cluster_time_ms,
            node,
        })
    }

    /// A nemesis event (`start` or `stop` of a fault window, or a single action).
    pub fn nemesis(&self, f: &str, value: Value) {
        self.add(
            Process::Named(NEMESIS.to_owned()),
            OpType::Info,
            f,
            Value::Null,
            value,
            None,
            None,
            None,
        );
    }

    /// A copy of every event so far.
    pub fn snapshot(&self) -> Vec<Op> {
        self.lock().clone()
    }

    /// Writes `history.jsonl`.
    pub fn write_jsonl(ops: &[Op], path: &Path) -> anyhow::Result<()> {
        let mut file = std::io::BufWriter::new(std::fs::File::create(path)?);
        for op in ops {
            serde_json::to_writer(&mut file, op)?;
            file.write_all(b"\n")?;
        }
        file.flush()?;
        Ok(())
    }

    /// Reads a `history.jsonl` back.
    pub fn read_jsonl(path: &Path) -> anyhow::Result<Vec<Op>> {
        let text = std::fs::read_to_string(path)?;
        text.lines()
            .filter(|line| !line.trim().is_empty())
            .map(|line| Ok(serde_json::from_str(line)?))
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Op>> {
        self.inner
            .ops
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Builds histories by hand for the checkers' tests.
#[cfg(test)]
pub mod build {
    use super::*;

    /// A client event at a given time.
    pub fn op(process: u64, kind: OpType, time_ms: u64, f: &str, key: &str, value: Value) -> Op {
        Op {
            index: 0,
            time_ns: time_ms * 1_000_000,
            process: Process::Client(process),
            kind,
            f: f.to_owned(),
            key: Value::from(key),
            value,
            error: None,
            cluster_time_ms: None,
            node: None,
        }
    }

    /// Numbers the events in order.
    pub fn indexed(mut ops: Vec<Op>) -> Vec<Op> {
        for (index, op) in ops.iter_mut().enumerate() {
            op.index = index as u64;
        }
        ops
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::build::{indexed, op};
    use super::*;

    fn nemesis(time_ms: u64, f: &str, value: Value) -> Op {
        Op {
            process: Process::Named(NEMESIS.to_owned()),
            kind: OpType::Info,
            ..op(0, OpType::Info, time_ms, f, "", value)
        }
    }

    fn timed(mut op: Op, cluster_time_ms: u64) -> Op {
        op.cluster_time_ms = Some(cluster_time_ms);
        op
    }

    /// A write answered before the restore began is in the backup; one answered between the
    /// backup and the restored cluster's start may be undone; one answered after came from the
    /// restored cluster. Events of the nemesis and the final reads are never undone.
    #[test]
    fn the_answers_inside_a_restore_are_unknown_and_the_others_stand() {
        let history = indexed(vec![
            op(1, OpType::Invoke, 0, "write", "k", json!({"value": 1})),
            timed(op(1, OpType::Ok, 1, "write", "k", json!({})), 10),
            nemesis(2, "start", json!({"fault": "restore"})),
            op(2, OpType::Invoke, 3, "write", "k", json!({"value": 2})),
            timed(op(2, OpType::Ok, 4, "write", "k", json!({})), 20),
            op(3, OpType::Invoke, 4, "acquire", "a", json!({})),
            op(3, OpType::Fail, 5, "acquire", "a", json!({})),
            nemesis(6, "backup", json!({})),
            nemesis(9, "stop", json!({"fault": "restore", "saved": true})),
            op(1, OpType::Invoke, 10, "write", "k", json!({"value": 3})),
            timed(op(1, OpType::Ok, 11, "write", "k", json!({})), 12),
        ]);
        let undone = undone(&history);
        let kinds: Vec<OpType> = undone.iter().map(|op| op.kind).collect();
        use OpType::{Info, Invoke, Ok};
        assert_eq!(
            kinds,
            [Invoke, Ok, Info, Invoke, Info, Invoke, Info, Info, Info, Invoke, Ok]
        );
        assert_eq!(undone[4].cluster_time_ms, None);
        assert_eq!(undone[4].value, history[4].value, "the answer is kept");
        assert_eq!(undone[10].cluster_time_ms, Some(12));
    }

    /// A restore whose backup failed changed nothing, and neither did the fault windows of
    /// other faults.
    #[test]
    fn a_history_without_a_saved_restore_is_read_as_recorded() {
        let history = indexed(vec![
            nemesis(0, "start", json!({"fault": "restore"})),
            op(1, OpType::Invoke, 1, "write", "k", json!({"value": 1})),
            op(1, OpType::Ok, 2, "write", "k", json!({})),
            nemesis(3, "stop", json!({"fault": "restore", "saved": false})),
            nemesis(4, "start", json!({"fault": "kill-all"})),
            op(1, OpType::Invoke, 5, "write", "k", json!({"value": 2})),
            op(1, OpType::Ok, 6, "write", "k", json!({})),
            nemesis(7, "stop", json!({"fault": "kill-all"})),
        ]);
        assert!(matches!(undone(&history), std::borrow::Cow::Borrowed(_)));
    }
}
