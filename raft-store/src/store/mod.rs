//! openraft storage for Baton: the durable Raft log and vote (`LogStore`), and the in-memory
//! lease state machine with its persisted snapshots (`StateMachineStore`).
//!
//! Per node, in the data dir: the log's entries in segment files under `raft-log/`
//! (`segments.rs`: written and fdatasynced by the appending thread), and one sled database
//! with two trees, `meta` (vote, committed log id, last purged log id, format version) and
//! `snapshot` (the last snapshot's meta and bytes). Store format 1 kept the entries in a sled
//! `log` tree; `open` copies them into segments once. The machine itself is not persisted on
//! every apply: a restart rebuilds it from the last snapshot, and openraft re-applies the
//! committed log after it (the committed log id is saved for exactly that).
//!
//! Every byte read back from disk is decoded with a size limit; garbage is an error, never a
//! panic. Every sled or decoding error becomes an openraft `StorageError`, which stops the node.
//! Nothing here interprets commands: that is `machine`'s job, and sled types never leave this
//! module tree.

mod change_watch;
mod log;
mod segments;
mod state_machine;

use std::fmt;
use std::io::Cursor;
use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};

use openraft::{AnyError, ErrorSubject, ErrorVerb, LogId, StorageError, StorageIOError};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::machine::{decode_value, encode_value, Batch, CodecError, Machine, Response};

pub use self::change_watch::{ChangeWatch, Watching};
pub use self::log::LogStore;
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
    #[error("the data dir holds store format {found}; this build reads formats {LEGACY_STORE_FORMAT} and {STORE_FORMAT}")]
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

/// Opens (or creates) the store in `dir`: one sled database shared by the log and the state
/// machine. The machine is rebuilt from the last persisted snapshot, or starts empty; openraft
/// then re-applies the committed log entries after the snapshot when the node starts.
///
/// A purge never removes an entry that no durable snapshot covers, so a crash in the middle of
/// a snapshot install leaves every committed entry after the durable snapshot in the log;
/// `open` drops a recorded purge point past that snapshot and removes the entries the durable
/// snapshot covers, so the log starts right after the purge point with no hole.
pub fn open(dir: &Path) -> Result<(LogStore, StateMachineStore), StoreError> {
    let db = sled::Config::new().path(dir).open()?;
    let meta = db.open_tree(META_TREE)?;
    let found_format = check_format(&meta)?;
    let database = Database {
        meta,
        snapshots: db.open_tree(SNAPSHOT_TREE)?,
        db,
        snapshot_write: Arc::new(Mutex::new(())),
        snapshot_progress: Arc::new(watch::Sender::new(SnapshotProgress::default())),
    };
    // The state machine first: it finds the durable snapshot, which bounds what the log may
    // have purged.
    let state_machine = StateMachineStore::open(database.clone())?;
    let log_store = LogStore::open(database.clone(), &dir.join(LOG_DIR))?;
    upgrade(&database, &log_store, found_format)?;
    Ok((log_store, state_machine))
}

/// Brings a data dir to `STORE_FORMAT`. From format 1: the sled `log` tree's entries are copied
/// into segments (fsynced), the format is recorded (so an earlier build refuses the dir rather
/// than see an empty log), and only then is the tree dropped. A crash before the format is
/// recorded leaves format 1 and the tree, which the next open copies again whole; after it, the
/// copy is complete and a tree still there is only dropped, never copied over newer segments.
fn upgrade(
    database: &Database,
    log_store: &LogStore,
    found_format: Option<u32>,
) -> Result<(), StoreError> {
    let has_sled_log = database
        .db
        .tree_names()
        .iter()
        .any(|name| name.as_ref() == LEGACY_LOG_TREE.as_bytes());
    if has_sled_log && found_format == Some(LEGACY_STORE_FORMAT) {
        let logs = database.db.open_tree(LEGACY_LOG_TREE)?;
        if !logs.is_empty() {
            tracing::info!(
                entries = logs.len(),
                "copying the log from sled into segment files"
            );
            log_store.import_sled_log(&logs)?;
        }
    }
    if found_format != Some(STORE_FORMAT) {
        database
            .meta
            .insert(FORMAT_KEY, encode(&STORE_FORMAT, "store format")?)?;
        database.db.flush()?;
    }
    if has_sled_log {
        database.db.drop_tree(LEGACY_LOG_TREE)?;
        database.db.flush()?;
    }
    Ok(())
}

// ---- helpers shared by the log and the state machine ----

/// Version of the on-disk layout (files, tree names, keys, value encodings). Bumped on any
/// change. 2: the log in segment files; 1: the log in sled (read once, by `upgrade`).
const STORE_FORMAT: u32 = 2;
const LEGACY_STORE_FORMAT: u32 = 1;
/// Larger than any log entry, vote or snapshot meta the limits allow; guards against absurd
/// length prefixes in corrupt bytes.
const VALUE_BYTES_MAX: usize = 1 << 30;

/// Where format 1 kept the log's entries.
const LEGACY_LOG_TREE: &str = "log";
/// The directory of the log's segment files, inside the data dir.
const LOG_DIR: &str = "raft-log";
const META_TREE: &str = "meta";
const SNAPSHOT_TREE: &str = "snapshot";
const FORMAT_KEY: &[u8] = b"format";

/// The sled handles both halves of the store share. Cloning is cheap (sled handles are `Arc`s).
#[derive(Debug, Clone)]
struct Database {
    db: sled::Db,
    meta: sled::Tree,
    snapshots: sled::Tree,
    /// Serializes snapshot writes (a background build against an install), so an older snapshot
    /// never overwrites a newer one.
    snapshot_write: Arc<Mutex<()>>,
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

impl Database {
    /// Fsyncs everything written so far, in every tree, off the async runtime's threads.
    async fn flush(&self) -> Result<(), StoreError> {
        let db = self.db.clone();
        run_blocking(move || db.flush().map(|_| ()).map_err(StoreError::from)).await
    }
}

/// The format the data dir was written in (`None` for a new one); refuses a format this build
/// cannot read.
fn check_format(meta: &sled::Tree) -> Result<Option<u32>, StoreError> {
    let Some(bytes) = meta.get(FORMAT_KEY)? else {
        return Ok(None);
    };
    let found = decode::<u32>(&bytes, "store format")?;
    if found != STORE_FORMAT && found != LEGACY_STORE_FORMAT {
        return Err(StoreError::UnsupportedFormat { found });
    }
    Ok(Some(found))
}

/// Runs blocking sled work (fsync, large values) on tokio's blocking pool.
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

fn read_meta<T: DeserializeOwned>(
    meta: &sled::Tree,
    key: &[u8],
    what: &str,
) -> Result<Option<T>, StoreError> {
    meta.get(key)?.map(|bytes| decode(&bytes, what)).transpose()
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
