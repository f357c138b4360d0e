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
//! One process at a time: `open` takes an exclusive lock on the file `lock` in the data dir and
//! holds it while either half of the store lives, so a second `batond`, or a `batond recover`
//! beside a running member, is refused instead of writing the same files.
//!
//! Every byte read back from disk is checked and decoded with a size limit; garbage is an
//! error naming the file, never a panic. Every I/O or decoding error is returned to openraft as
//! an `io::Error`, which it turns into a `StorageError` that stops the node. Nothing here
//! interprets commands: that is `machine`'s job.
//!
//! The openraft types the rest of Baton names (`LogId`, `Vote`, `Entry`, `SnapshotMeta`, the
//! `Raft` handle, ...) are aliases here, so that the node never spells an openraft generic
//! and a bump of openraft changes this file rather than every user.

mod change_watch;
mod files;
mod leader_time;
mod legacy;
mod log;
pub mod mutation;
#[cfg(test)]
mod power_tests;
mod raft_config;
mod runtime;
mod segments;
mod snapshot_file;
mod state_machine;

use std::fmt;
use std::fs;
use std::io;
use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use openraft::type_config::alias;
use rand::rngs::SmallRng;
use rand::{RngExt as _, SeedableRng};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::machine::{decode_value, encode_value, Batch, CodecError, Machine, Response};

pub use self::change_watch::{ChangeWatch, Watching};
pub use self::files::sim::SimDisk;
use self::files::Files;
pub use self::files::{Disk, DiskFile, DiskReader, RealDisk};
pub use self::leader_time::{LeaderTime, Stamp};
pub use self::log::LogStore;
pub use self::log::SEGMENT_BYTES_TARGET;
pub use self::raft_config::{raft_config, RaftTiming};
pub use self::runtime::{seed_thread, Runtime};
use self::snapshot_file::SnapshotWritten;
pub use self::snapshot_file::{
    decode_machine_from, encode_machine_to, encoded_len, ReceivingSnapshot, SnapshotData,
    SnapshotInbox,
};
pub use self::state_machine::{AppliedCopy, MachineHandle, SnapshotBuilder, StateMachineStore};

openraft::declare_raft_types!(
    /// The openraft type configuration of a Baton cluster: log entries carry `Batch`es, apply
    /// answers `Applied`, members are numbered by `--id` and reached at a `Member`'s addresses.
    /// The rest are openraft's defaults (leader ids of term and node), and tokio through
    /// `Runtime`, whose randomness a simulation seeds.
    pub TypeConfig:
        D = Batch,
        R = Applied,
        NodeId = u64,
        Node = Member,
        AsyncRuntime = Runtime,
);

/// A Baton node's Raft handle.
pub type Raft = openraft::Raft<TypeConfig, StateMachineStore>;
/// A log entry's position: the leader (term and node) that proposed it, and its index.
pub type LogId = alias::LogIdOf<TypeConfig>;
/// A node's vote: the leader id it voted for, and whether that leader is committed.
pub type Vote = alias::VoteOf<TypeConfig>;
/// One log entry.
pub type Entry = alias::EntryOf<TypeConfig>;
/// What a snapshot covers: the last log id applied to it and the membership then.
pub type SnapshotMeta = alias::SnapshotMetaOf<TypeConfig>;
/// A membership with the log id of the entry that set it.
pub type StoredMembership = alias::StoredMembershipOf<TypeConfig>;
/// A snapshot: its meta and its bytes.
pub type Snapshot = alias::SnapshotOf<TypeConfig, SnapshotData>;

/// The log id of entry `index`, proposed by the leader `node_id` elected in `term`.
pub fn log_id(term: u64, node_id: u64, index: u64) -> LogId {
    openraft::LogId::new(
        openraft::impls::leader_id_adv::LeaderId { term, node_id },
        index,
    )
}

/// What every storage method returns to openraft: an I/O error stops the node.
pub type StorageResult<T> = Result<T, io::Error>;

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
    #[error("{0} is not empty: a restore seeds a new member's data dir, never one in use")]
    NotEmpty(String),
    #[error("refused a write that breaks the storage contract: {0}")]
    Refused(String),
    #[error("the applied state is unusable: an apply panicked while holding it")]
    Poisoned,
    #[error("a blocking storage task did not complete: {0}")]
    Blocking(String),
    #[error("log files: {0}")]
    Io(String),
    #[error("{0} is in use by another process (a running batond?): stop it first")]
    InUse(String),
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
    open_with(dir, &Options::default())
}

/// How a store is opened. The default is what `batond` uses; the power-cut tests and the
/// simulator choose otherwise.
#[derive(Debug, Clone)]
pub struct Options {
    /// Where the blocking work is done.
    pub io: Io,
    /// What the store's files, the log's segments included, are on. The lock file (and an
    /// earlier format's sled database) are always on the real file system, in `dir`.
    pub disk: Arc<dyn Disk>,
    /// A log segment that has reached this many bytes gets no more entries. A purge removes
    /// whole segments only, so the simulator makes them small.
    pub segment_bytes: u64,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            io: Io::Threads,
            disk: Arc::new(RealDisk),
            segment_bytes: SEGMENT_BYTES_TARGET,
        }
    }
}

/// Where the store does its blocking work: file writes and syncs, and encoding and decoding
/// snapshots.
#[derive(Debug, Clone)]
pub enum Io {
    /// On tokio's blocking pool, and each append's `fdatasync` on a flusher thread of the
    /// log's own: what `batond` does, so that no async worker waits for the disk.
    Threads,
    /// The simulator's: on the task that asks, after a pause on tokio's clock that
    /// `DiskLatency` draws, and each append's `fdatasync` on a task of the log's own, after a
    /// pause of its own. The simulator runs a whole cluster on one thread under tokio's paused
    /// clock; work finished on another thread would come back at a moment no seed decides.
    /// The flush on its own task keeps the pipeline `batond` has: openraft replicates an
    /// append while it is written and not yet synced. The store must be opened inside a tokio
    /// runtime, which runs that task.
    Simulated(DiskLatency),
}

/// How long a simulated disk takes: each operation the store waits for draws a pause from a
/// generator seeded by the simulation, mostly a fraction of a millisecond, now and then a few
/// milliseconds, and rarely a stall of up to 200 ms.
#[derive(Clone)]
pub struct DiskLatency(Arc<Mutex<SmallRng>>);

impl DiskLatency {
    pub fn new(seed: u64) -> DiskLatency {
        DiskLatency(Arc::new(Mutex::new(SmallRng::seed_from_u64(seed))))
    }

    /// The pause of the next operation.
    fn draw(&self) -> Duration {
        let mut random = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let micros = match random.random_range(0..100u32) {
            0 => random.random_range(20_000..200_000u64),
            1..=9 => random.random_range(1_000..10_000),
            _ => random.random_range(20..500),
        };
        Duration::from_micros(micros)
    }
}

impl fmt::Debug for DiskLatency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DiskLatency")
    }
}

/// `open`, as `options` say.
pub fn open_with(
    dir: &Path,
    options: &Options,
) -> Result<(LogStore, StateMachineStore), StoreError> {
    if !dir.exists() {
        fs::create_dir_all(dir)
            .and_then(|()| match dir.parent() {
                Some(parent) => fs::File::open(parent)?.sync_all(),
                None => Ok(()),
            })
            .map_err(|error| StoreError::Io(format!("create {}: {error}", dir.display())))?;
    }
    let lock = DirLock::take(dir)?;
    let files = Files::open(dir, options.disk.clone())?;
    let found_format = files.read::<u32>(FORMAT_FILE)?;
    if let Some(found) = found_format.filter(|found| *found != STORE_FORMAT) {
        return Err(StoreError::UnsupportedFormat { found });
    }
    // A dir that records this format has its sled database retired or stamped durably
    // already (both come before the format file): sled is not opened again.
    let sled = match found_format {
        Some(_) => None,
        None => legacy::Sled::find(dir)?,
    };
    if found_format.is_none() && sled.is_none() {
        legacy::Sled::stamp_new(dir)?;
    }
    if found_format.is_none() {
        if let Some(sled) = &sled {
            sled.copy_state(&files)?;
        }
    }
    let database = Database {
        files,
        snapshot_write: Arc::default(),
        lock: Arc::new(lock),
        io: options.io.clone(),
    };
    // The state machine first: it finds the durable snapshot, which bounds what the log may
    // have purged.
    let state_machine = StateMachineStore::open(database.clone())?;
    let log_store = LogStore::open(database.clone(), &dir.join(LOG_DIR), options.segment_bytes)?;
    if found_format.is_none() {
        if let Some(sled) = sled {
            sled.copy_log(&log_store)?;
            sled.retire()?;
        }
        database.files.replace(FORMAT_FILE, &STORE_FORMAT)?;
    }
    Ok((log_store, state_machine))
}

/// Seeds the empty data dir `dir` of a new cluster's member with `machine` (`batond restore`):
/// a snapshot at log index `index` whose membership is `members`, and the log purged up to it,
/// as if the member had installed that snapshot from a leader. Every member seeded with the
/// same arguments holds byte-identical state; on start they find the cluster initialized and
/// elect a leader. The log id is of term 0, below any term the new cluster will elect.
///
/// Refuses a `dir` that exists and is not empty: nothing in it is touched.
pub async fn seed(
    dir: &Path,
    machine: &Machine,
    index: u64,
    members: std::collections::BTreeMap<u64, Member>,
    cluster: ClusterId,
) -> Result<(), StoreError> {
    use openraft::storage::{RaftLogStorage, RaftStateMachine};

    let occupied = match fs::read_dir(dir) {
        Ok(mut entries) => entries.next().is_some(),
        Err(error) if error.kind() == io::ErrorKind::NotFound => false,
        Err(error) => return Err(StoreError::Io(format!("read {}: {error}", dir.display()))),
    };
    if occupied {
        return Err(StoreError::NotEmpty(dir.display().to_string()));
    }
    let voters = members.keys().copied().collect();
    let membership = openraft::Membership::new(vec![voters], members)
        .map_err(|error| StoreError::Refused(format!("the members: {error}")))?;
    let log_id = log_id(0, 0, index);
    let meta = SnapshotMeta {
        last_log_id: Some(log_id),
        last_membership: StoredMembership::new(Some(log_id), membership),
    };
    let bytes = machine.encode_snapshot()?;
    let (mut log_store, mut state_machine) = open(dir)?;
    state_machine.cluster_file().write(cluster)?;
    state_machine
        .install_snapshot(&meta, SnapshotData::from_bytes(bytes))
        .await
        .map_err(|error| StoreError::Io(error.to_string()))?;
    log_store
        .purge(log_id)
        .await
        .map_err(|error| StoreError::Io(error.to_string()))?;
    Ok(())
}

/// Which cluster a data dir belongs to: 128 bits chosen when the cluster is made (its
/// bootstrap, a restore, a recover) and learned by a member that joins it from the first peer
/// request that names it. Peers name it in every request, and a node refuses a request that
/// names another cluster: a node of a cluster that was replaced (by a restore, say) and still
/// runs can never write into its successor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct ClusterId(pub [u8; 16]);

impl fmt::Display for ClusterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|byte| write!(f, "{byte:02x}"))
    }
}

impl std::str::FromStr for ClusterId {
    type Err = String;

    fn from_str(text: &str) -> Result<ClusterId, String> {
        let bad = || format!("a cluster id is 32 lowercase hex digits, not {text:?}");
        if text.len() != 32
            || !text
                .bytes()
                .all(|byte| matches!(byte, b'0'..=b'9' | b'a'..=b'f'))
        {
            return Err(bad());
        }
        let mut id = [0; 16];
        for (index, byte) in id.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&text[index * 2..index * 2 + 2], 16).map_err(|_| bad())?;
        }
        Ok(ClusterId(id))
    }
}

/// A data dir's record of its cluster (the `cluster` file): absent in a dir made before
/// clusters had ids, or of a member that has not yet heard from its cluster.
#[derive(Debug, Clone)]
pub struct ClusterFile(Database);

impl ClusterFile {
    pub fn read(&self) -> Result<Option<ClusterId>, StoreError> {
        self.0.files.read(CLUSTER_FILE)
    }

    /// Records `id`, durably (a synced file renamed into place, the dir synced).
    pub fn write(&self, id: ClusterId) -> Result<(), StoreError> {
        self.0.files.replace(CLUSTER_FILE, &id)
    }
}

/// What a member's data dir holds once its whole log is applied, and the dir's lock.
#[derive(Debug)]
pub struct Replayed {
    pub machine: Machine,
    /// The log id of the last entry applied.
    pub applied: Option<LogId>,
    /// The last membership.
    pub membership: StoredMembership,
    /// The dir stays locked until this is dropped, so no `batond` starts on it between the
    /// replay and what the caller does with the dir next (`recover` swaps it out).
    _lock: Arc<DirLock>,
}

/// Applies a member's whole log to its last snapshot. Used by `batond recover` on a stopped
/// member. Every entry in the log after the snapshot is applied, committed or not as far as
/// this member knows: with the rest of the cluster gone for good, what this member holds is all
/// there is.
pub async fn replay(dir: &Path) -> Result<Replayed, StoreError> {
    use openraft::storage::{RaftLogReader, RaftLogStorage};

    if !dir.join(FORMAT_FILE).exists() {
        return Err(StoreError::Refused(format!(
            "{} holds no store of this format (no `{FORMAT_FILE}` file): is it a member's data dir, started by this release?",
            dir.display()
        )));
    }
    let (mut log_store, state_machine) = open(dir)?;
    let last_log = log_store
        .get_log_state()
        .await
        .map_err(|error| StoreError::Io(error.to_string()))?
        .last_log_id;
    let handle = state_machine.handle();
    let applied = handle.read(|_, applied| applied)?;
    let from = applied.map_or(0, |log_id| log_id.index + 1);
    if let Some(last_log) = last_log.filter(|last_log| last_log.index >= from) {
        let entries = log_store
            .try_get_log_entries(from..=last_log.index)
            .await
            .map_err(|error| StoreError::Io(error.to_string()))?;
        state_machine.apply_entries(entries)?;
    }
    let (machine, applied) = handle.read(|machine, applied| (machine.clone(), applied))?;
    Ok(Replayed {
        machine,
        applied,
        membership: handle.last_membership()?,
        _lock: state_machine.dir_lock(),
    })
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
const CLUSTER_FILE: &str = "cluster";
/// The file whose exclusive lock says a process has the data dir open.
const LOCK_FILE: &str = "lock";

/// An exclusive advisory lock on a data dir's `lock` file, released when dropped (or when the
/// process dies, however it dies: the kernel drops it with the file descriptor).
#[derive(Debug)]
struct DirLock {
    /// Open for the lock's sake only: closing it releases the lock.
    _file: fs::File,
}

impl DirLock {
    fn take(dir: &Path) -> Result<DirLock, StoreError> {
        let path = dir.join(LOCK_FILE);
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|error| StoreError::Io(format!("open {}: {error}", path.display())))?;
        match file.try_lock() {
            Ok(()) => Ok(DirLock { _file: file }),
            Err(fs::TryLockError::WouldBlock) => Err(StoreError::InUse(dir.display().to_string())),
            Err(fs::TryLockError::Error(error)) => {
                Err(StoreError::Io(format!("lock {}: {error}", path.display())))
            }
        }
    }
}

/// What both halves of the store share. Cloning is cheap.
#[derive(Debug, Clone)]
struct Database {
    files: Files,
    /// Serializes snapshot writes (a background build against an install), so an older snapshot
    /// never overwrites a newer one, and says what the snapshot file holds.
    snapshot_write: Arc<Mutex<SnapshotWritten>>,
    /// Held while either half of the store lives (and by a `Replayed`).
    lock: Arc<DirLock>,
    io: Io,
}

impl Database {
    /// The last log id the persisted (fsynced) snapshot covers: the log may remove an entry
    /// only once it is covered.
    fn durable_snapshot(&self) -> Result<Option<LogId>, StoreError> {
        Ok(self
            .snapshot_write
            .lock()
            .map_err(|_| StoreError::Poisoned)?
            .last_log_id)
    }

    /// Runs blocking store work (fsync, large files) where `io` says.
    async fn run_blocking<T, F>(&self, work: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce() -> Result<T, StoreError> + Send + 'static,
    {
        match &self.io {
            Io::Threads => tokio::task::spawn_blocking(work)
                .await
                .map_err(|join_error| StoreError::Blocking(join_error.to_string()))?,
            Io::Simulated(latency) => {
                tokio::time::sleep(latency.draw()).await;
                work()
            }
        }
    }
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

/// A store error as the I/O error openraft takes, and stops the node on.
fn io_error(error: StoreError) -> io::Error {
    io::Error::other(error)
}

/// The state the machine is in, and the log position it is at. Shared between the openraft
/// state machine (writer) and `MachineHandle`s (readers).
#[derive(Debug)]
struct AppliedState {
    machine: Machine,
    last_applied: Option<LogId>,
    last_membership: StoredMembership,
    /// The machine holds lease state (it applied a normal entry or came from a snapshot): from
    /// then on every entry must be the one right after `last_applied`.
    consecutive: bool,
}

type SharedState = Arc<RwLock<AppliedState>>;
