//! openraft storage for Baton: the durable Raft log and vote (`LogStore`), and the in-memory
//! lease state machine with its persisted snapshots (`StateMachineStore`).
//!
//! Per node, in the data dir: the log's entries in segment files under `raft-log/`
//! (`segments.rs`: written and fdatasynced by the appending thread), and small files of our own
//! (`files.rs`): `format`, `vote`, `purged` and `snapshot`, each replaced whole and synced with
//! its directory before the write returns, and `committed`, written in place and never synced.
//! Store formats 1 and 2 kept those in sled (format 1 the log's entries too), whose flush does
//! not survive a power loss; `open` copies them out once (`legacy.rs`). The machine itself is
//! not persisted on every apply: a restart rebuilds it from the last snapshot, and openraft
//! re-applies the committed log after it (the committed log id is saved for exactly that).
//!
//! Every byte read back from disk is checked and decoded with a size limit; garbage is an
//! error naming the file, never a panic. Every I/O or decoding error becomes an openraft
//! `StorageError`, which stops the node. Nothing here interprets commands: that is `machine`'s
//! job.

mod change_watch;
mod files;
mod legacy;
mod log;
#[cfg(test)]
mod power_tests;
mod segments;
mod state_machine;

use std::fmt;
use std::fs;
use std::io::Cursor;
use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};

use openraft::{AnyError, ErrorSubject, ErrorVerb, LogId, StorageError, StorageIOError};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::machine::{decode_value, encode_value, Batch, CodecError, Machine, Response};

pub use self::change_watch::{ChangeWatch, Watching};
use self::files::Files;
pub use self::files::{Disk, RealDisk};
pub use self::log::LogStore;
use self::state_machine::SnapshotWritten;
pub use self::state_machine::{MachineHandle, SnapshotBuilder, StateMachineStore};

openraft::declare_raft_types!(
    /// The openraft type configuration of a Baton cluster.
    pub TypeConfig:
        D = Batch,
        R = Applied,
        NodeId = u64,
        Node = Member,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

/// The openraft error type every storage method returns.
pub type StorageResult<T> = Result<T, StorageError<u64>>;

/// What applying one log entry produced.
///
/// `time_ms` is the machine's cluster time right after the entry. Blank and membership entries
/// produce no `responses` and leave the time unchanged.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    pub time_ms: u64,
    pub responses: Vec<Response>,
}

/// A cluster member's addresses: `api_addr` serves clients (HTTP), `peer_addr` serves Raft.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub api_addr: String,
    pub peer_addr: String,
}

impl fmt::Display for Member {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.api_addr, self.peer_addr)
    }
}

/// Why the store could not open, read or write. Inside openraft's traits each of these becomes
/// a `StorageError`, which stops the node: the store never guesses past one.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("sled: {0}")]
    Sled(#[from] sled::Error),
    #[error("corrupt {what} on disk: {reason}")]
    Corrupt { what: String, reason: String },
    #[error("encoding {what} failed: {reason}")]
    Encode { what: String, reason: String },
    #[error("machine snapshot: {0}")]
    Machine(#[from] CodecError),
    #[error(
        "the data dir holds store format {found}; this build reads formats 1 to {STORE_FORMAT}"
    )]
    UnsupportedFormat { found: u32 },
    #[error("refused a write that breaks the storage contract: {0}")]
    Refused(String),
    #[error("the applied state is unusable: an apply panicked while holding it")]
    Poisoned,
    #[error("a blocking storage task did not complete: {0}")]
    Blocking(String),
    #[error("log files: {0}")]
    Io(String),
}

/// Opens (or creates) the store in `dir`. The machine is rebuilt from the last persisted
/// snapshot, or starts empty; openraft then re-applies the committed log entries after the
/// snapshot when the node starts. A data dir of an earlier store format is brought to this one
/// first (`legacy::upgrade`).
///
/// A purge never removes an entry that no durable snapshot covers, so a crash in the middle of
/// a snapshot install leaves every committed entry after the durable snapshot in the log;
/// `open` drops a recorded purge point past that snapshot and removes the entries the durable
/// snapshot covers, so the log starts right after the purge point with no hole.
pub fn open(dir: &Path) -> Result<(LogStore, StateMachineStore), StoreError> {
    open_on(dir, Arc::new(RealDisk))
}

/// `open`, with the small files on `disk` (the log's segments are always real files).
fn open_on(dir: &Path, disk: Arc<dyn Disk>) -> Result<(LogStore, StateMachineStore), StoreError> {
    if !dir.exists() {
        fs::create_dir_all(dir)
            .and_then(|()| match dir.parent() {
                Some(parent) => fs::File::open(parent)?.sync_all(),
                None => Ok(()),
            })
            .map_err(|error| StoreError::Io(format!("create {}: {error}", dir.display())))?;
    }
    let files = Files::open(dir, disk)?;
    let found_format = files.read::<u32>(FORMAT_FILE)?;
    if let Some(found) = found_format.filter(|found| *found != STORE_FORMAT) {
        return Err(StoreError::UnsupportedFormat { found });
    }
    let sled = legacy::Sled::find(dir)?;
    if found_format.is_none() {
        if let Some(sled) = &sled {
            sled.copy_state(&files)?;
        }
    }
    let database = Database {
        files,
        snapshot_write: Arc::default(),
        snapshot_progress: Arc::new(watch::Sender::new(SnapshotProgress::default())),
    };
    // The state machine first: it finds the durable snapshot, which bounds what the log may
    // have purged.
    let state_machine = StateMachineStore::open(database.clone())?;
    let log_store = LogStore::open(database.clone(), &dir.join(LOG_DIR))?;
    if found_format.is_none() {
        if let Some(sled) = &sled {
            sled.copy_log(&log_store)?;
        }
        database.files.replace(FORMAT_FILE, &STORE_FORMAT)?;
    }
    if let Some(sled) = sled {
        sled.retire()?;
    }
    Ok((log_store, state_machine))
}

// ---- helpers shared by the log and the state machine ----

/// Version of the on-disk layout (file names, value encodings). Bumped on any change.
/// 3: the small files of `files.rs`; 2: those in sled, the log in segment files; 1: the log in
/// sled too (2 and 1 are read once, by `legacy`).
const STORE_FORMAT: u32 = 3;
/// Larger than any log entry, vote or snapshot meta the limits allow; guards against absurd
/// length prefixes in corrupt bytes.
const VALUE_BYTES_MAX: usize = 1 << 30;

/// The directory of the log's segment files, inside the data dir.
const LOG_DIR: &str = "raft-log";
/// The small files, inside the data dir.
const FORMAT_FILE: &str = "format";
const VOTE_FILE: &str = "vote";
const PURGED_FILE: &str = "purged";
const COMMITTED_FILE: &str = "committed";
const SNAPSHOT_FILE: &str = "snapshot";

/// What both halves of the store share. Cloning is cheap.
#[derive(Debug, Clone)]
struct Database {
    files: Files,
    /// Serializes snapshot writes (a background build against an install), so an older snapshot
    /// never overwrites a newer one, and says what the snapshot file holds.
    snapshot_write: Arc<Mutex<SnapshotWritten>>,
    /// What the durable snapshot covers and whether one is being received: the state machine
    /// writes it, the log's `purge` waits on it.
    snapshot_progress: Arc<watch::Sender<SnapshotProgress>>,
}

/// The snapshot side of the purge rule: the log may remove an entry only once a durable
/// snapshot covers it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct SnapshotProgress {
    /// The last log id the persisted (fsynced) snapshot covers.
    durable: Option<LogId<u64>>,
    /// A snapshot from the leader is being received or installed: openraft purges the log up
    /// to it in parallel with the install, so `purge` waits for it to be durable.
    receiving: bool,
    /// An install failed: the node is stopping, and nothing past the durable snapshot goes.
    failed: bool,
}

impl SnapshotProgress {
    /// Whether the durable snapshot covers the entry at `index`.
    fn covers(&self, index: u64) -> bool {
        self.durable.is_some_and(|durable| durable.index >= index)
    }
}

/// Runs blocking store work (fsync, large files) on tokio's blocking pool.
async fn run_blocking<T, F>(work: F) -> Result<T, StoreError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, StoreError> + Send + 'static,
{
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|join_error| StoreError::Blocking(join_error.to_string()))?
}

fn encode<T: Serialize>(value: &T, what: &str) -> Result<Vec<u8>, StoreError> {
    encode_value(value).map_err(|error| StoreError::Encode {
        what: what.to_owned(),
        reason: error.to_string(),
    })
}

/// Decodes exactly one value from `bytes`: over the limit, malformed or trailing bytes are all
/// `StoreError::Corrupt`.
fn decode<T: DeserializeOwned>(bytes: &[u8], what: &str) -> Result<T, StoreError> {
    decode_value(bytes, VALUE_BYTES_MAX).map_err(|error| StoreError::Corrupt {
        what: what.to_owned(),
        reason: error.to_string(),
    })
}

/// Turns a store error into the openraft error that stops the node.
fn storage_error(
    subject: ErrorSubject<u64>,
    verb: ErrorVerb,
    error: StoreError,
) -> StorageError<u64> {
    StorageIOError::new(subject, verb, AnyError::new(&error)).into()
}

/// The state the machine is in, and the log position it is at. Shared between the openraft
/// state machine (writer) and `MachineHandle`s (readers).
#[derive(Debug)]
struct AppliedState {
    machine: Machine,
    last_applied: Option<LogId<u64>>,
    last_membership: openraft::StoredMembership<u64, Member>,
    /// The machine holds lease state (it applied a normal entry or came from a snapshot): from
    /// then on every entry must be the one right after `last_applied`.
    consecutive: bool,
}

type SharedState = Arc<RwLock<AppliedState>>;
