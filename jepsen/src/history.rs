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
