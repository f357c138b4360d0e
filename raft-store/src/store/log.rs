//! The Raft log and vote on sled: `LogStore` implements openraft's `RaftLogStorage` and
//! `RaftLogReader`.
//!
//! Entries live in the `log` tree keyed by their big-endian index, so sled's key order is log
//! order; each value is the bincode of the whole `openraft::Entry`. The vote, the committed log
//! id and the last purged log id live in the `meta` tree. Nothing here looks inside a `Batch`.

use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::time::Duration;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{Entry, ErrorSubject, ErrorVerb, LogId, OptionalSend, RaftLogReader, Vote};

use super::{
    decode, encode, log_key, read_meta, run_blocking, storage_error, Database, SnapshotProgress,
    StorageResult, StoreError, TypeConfig,
};

const VOTE_KEY: &[u8] = b"vote";
const COMMITTED_KEY: &[u8] = b"committed";
const LAST_PURGED_KEY: &[u8] = b"last_purged";
/// How long a purge waits for a snapshot install to become durable before the node stops.
const PURGE_WAIT_MAX: Duration = Duration::from_secs(120);

/// The durable Raft log and vote of one node.
///
/// Cloning is cheap and gives another handle on the same sled trees; openraft uses clones as
/// log readers for replication, concurrently with the one writer.
#[derive(Debug, Clone)]
pub struct LogStore {
    database: Database,
}

/// Reads entries for openraft's replication streams and for startup.
///
/// Guarantees: returns the entries present in `range`, in index order, with no gaps among
/// them; an entry that is absent (purged, or never written) is simply not returned. A sled
/// error, undecodable bytes, or an entry stored under another index than its own is a
/// `StorageError` (a corrupt log stops the node rather than replicating garbage).
impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> StorageResult<Vec<Entry<TypeConfig>>> {
        self.read_entries(range)
            .map_err(|error| storage_error(ErrorSubject::Logs, ErrorVerb::Read, error))
    }
}

/// The log storage contract Baton relies on.
///
/// - Writes are serialized: openraft calls these methods one at a time from its core task
///   (`&mut self`), and each one finishes its sled writes before returning.
/// - `append` writes every entry, then fsyncs sled, and only then reports the entries flushed
///   through the callback: an entry acknowledged to the leader is on disk.
/// - `save_vote` fsyncs before returning. `truncate` and `purge` fsync too.
/// - No holes: `truncate` removes a suffix in one atomic sled batch; `purge` durably records
///   the last purged log id before it removes the prefix, and `open` finishes an interrupted
///   purge.
/// - Nothing that a restart needs is purged: an entry is removed only once a durable snapshot
///   covers it. openraft 0.9 purges up to a snapshot received from the leader while its
///   state-machine worker is still persisting that snapshot, so `purge` waits for the install
///   to be durable; a purge past every durable snapshot is honoured by the readers (openraft
///   never reads below its purge point) but leaves the entries on disk, and `open` forgets it.
/// - On any sled or decoding error the method returns a `StorageError` (and `append` also
///   reports the error through its callback): openraft then stops the node. Nothing is retried
///   or ignored here.
impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    /// The last purged log id and the last log id present (or the last purged one when the log
    /// is empty).
    async fn get_log_state(&mut self) -> StorageResult<LogState<TypeConfig>> {
        let read = || -> Result<LogState<TypeConfig>, StoreError> {
            let last_purged_log_id = self.last_purged()?;
            let last_log_id = self.last_entry_log_id()?.or(last_purged_log_id);
            Ok(LogState {
                last_purged_log_id,
                last_log_id,
            })
        };
        read().map_err(|error| storage_error(ErrorSubject::Logs, ErrorVerb::Read, error))
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    /// Durable before returning: the vote is fsynced.
    async fn save_vote(&mut self, vote: &Vote<u64>) -> StorageResult<()> {
        let result = async {
            self.database.meta.insert(VOTE_KEY, encode(vote, "vote")?)?;
            self.database.flush().await
        };
        result
            .await
            .map_err(|error| storage_error(ErrorSubject::Vote, ErrorVerb::Write, error))
    }

    async fn read_vote(&mut self) -> StorageResult<Option<Vote<u64>>> {
        read_meta(&self.database.meta, VOTE_KEY, "vote")
            .map_err(|error| storage_error(ErrorSubject::Vote, ErrorVerb::Read, error))
    }

    /// Records the committed log id so that, after a restart, openraft re-applies the committed
    /// entries after the last snapshot before serving. Not fsynced on its own: it reaches disk
    /// with the next flush (every append, vote or sled's periodic flush). Losing the latest value
    /// in a crash only means re-applying less at startup and learning the rest from the leader;
    /// a saved value never points past the flushed log, because every append fsyncs before
    /// openraft can commit it.
    async fn save_committed(&mut self, committed: Option<LogId<u64>>) -> StorageResult<()> {
        let write = || -> Result<(), StoreError> {
            match committed {
                Some(log_id) => self
                    .database
                    .meta
                    .insert(COMMITTED_KEY, encode(&log_id, "committed log id")?)?,
                None => self.database.meta.remove(COMMITTED_KEY)?,
            };
            Ok(())
        };
        write().map_err(|error| storage_error(ErrorSubject::Store, ErrorVerb::Write, error))
    }

    async fn read_committed(&mut self) -> StorageResult<Option<LogId<u64>>> {
        read_meta(&self.database.meta, COMMITTED_KEY, "committed log id")
            .map_err(|error| storage_error(ErrorSubject::Store, ErrorVerb::Read, error))
    }

    /// Writes the entries (readable as soon as this returns), fsyncs, then calls back. The
    /// callback is never invoked before the fsync succeeded; on failure it receives the error.
    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> StorageResult<()>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let result = async {
            self.write_entries(entries)?;
            self.database.flush().await
        };
        match result.await {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(error) => {
                callback.log_io_completed(Err(io::Error::other(error.to_string())));
                Err(storage_error(ErrorSubject::Logs, ErrorVerb::Write, error))
            }
        }
    }

    /// Removes the entries from `log_id.index` on, in one atomic sled batch, and fsyncs.
    async fn truncate(&mut self, log_id: LogId<u64>) -> StorageResult<()> {
        let result = async {
            remove_entries(
                &self.database.logs,
                (Bound::Included(log_id.index), Bound::Unbounded),
            )?;
            self.database.flush().await
        };
        result
            .await
            .map_err(|error| storage_error(ErrorSubject::Log(log_id), ErrorVerb::Delete, error))
    }

    /// Waits until a snapshot being installed covers `log_id` (see the contract above), records
    /// `log_id` as the last purged log id and fsyncs, then removes the entries up to it that the
    /// durable snapshot covers. A crash between the two leaves stale entries below the purge
    /// point, which `open` removes; never a hole above it.
    async fn purge(&mut self, log_id: LogId<u64>) -> StorageResult<()> {
        let result = async {
            let progress = self.wait_for_installed_snapshot(log_id.index).await?;
            if self
                .last_purged()?
                .is_some_and(|last_purged| last_purged >= log_id)
            {
                return Ok(());
            }
            self.database
                .meta
                .insert(LAST_PURGED_KEY, encode(&log_id, "last purged log id")?)?;
            self.database.flush().await?;
            let Some(durable) = progress.durable else {
                return Ok(());
            };
            // Thousands of entries, megabytes of sled pages: off the async worker, which also
            // runs openraft's core (a purge inline stalled heartbeats long enough for a
            // follower to call an election in the memory bench).
            let logs = self.database.logs.clone();
            let upto = durable.index.min(log_id.index);
            run_blocking(move || remove_entries(&logs, (Bound::Unbounded, Bound::Included(upto))))
                .await
        };
        result
            .await
            .map_err(|error| storage_error(ErrorSubject::Log(log_id), ErrorVerb::Delete, error))
    }
}

impl LogStore {
    /// Wraps the shared database (the state machine has opened it first and knows the durable
    /// snapshot) and settles the purge point: a recorded purge past the durable snapshot never
    /// removed anything the snapshot does not cover (see `purge`), so it is forgotten and the
    /// entries after the snapshot are the log again; a purge that a crash interrupted is
    /// finished.
    pub(super) fn open(database: Database) -> Result<LogStore, StoreError> {
        let store = LogStore { database };
        let durable = store.database.snapshot_progress.borrow().durable;
        if let Some(last_purged) = store.last_purged()? {
            let kept_purge = match durable {
                Some(durable) if durable.index >= last_purged.index => Some(last_purged),
                Some(durable) => Some(durable),
                None => None,
            };
            if kept_purge != Some(last_purged) {
                tracing::warn!(
                    recorded = %last_purged,
                    durable_snapshot = ?durable,
                    "the log was purged past the durable snapshot (a crash during a snapshot install); keeping the entries after the snapshot"
                );
                match kept_purge {
                    Some(log_id) => store
                        .database
                        .meta
                        .insert(LAST_PURGED_KEY, encode(&log_id, "last purged log id")?)?,
                    None => store.database.meta.remove(LAST_PURGED_KEY)?,
                };
            }
            if let Some(log_id) = kept_purge {
                remove_entries(
                    &store.database.logs,
                    (Bound::Unbounded, Bound::Included(log_id.index)),
                )?;
            }
            store.database.db.flush()?;
        }
        Ok(store)
    }

    /// While a snapshot from the leader is being received or installed, waits until a durable
    /// snapshot covers `index` (openraft purges up to the snapshot in parallel with persisting
    /// it). Returns the snapshot progress the purge may go by. An install that failed, or one
    /// that takes longer than `PURGE_WAIT_MAX`, is an error: the node stops rather than purge
    /// what a restart would need.
    async fn wait_for_installed_snapshot(
        &self,
        index: u64,
    ) -> Result<SnapshotProgress, StoreError> {
        let mut progress = self.database.snapshot_progress.subscribe();
        let settled = progress
            .wait_for(|progress| progress.failed || !progress.receiving || progress.covers(index));
        let progress = match tokio::time::timeout(PURGE_WAIT_MAX, settled).await {
            Ok(Ok(progress)) => *progress,
            Ok(Err(_)) => return Err(StoreError::Refused("the snapshot progress is gone".to_owned())),
            Err(_) => {
                return Err(StoreError::Refused(format!(
                    "purge up to index {index}: the snapshot install covering it did not become durable within {PURGE_WAIT_MAX:?}"
                )))
            }
        };
        if progress.failed && !progress.covers(index) {
            return Err(StoreError::Refused(format!(
                "purge up to index {index}: the snapshot install covering it failed"
            )));
        }
        Ok(progress)
    }

    fn last_purged(&self) -> Result<Option<LogId<u64>>, StoreError> {
        read_meta(&self.database.meta, LAST_PURGED_KEY, "last purged log id")
    }

    /// The log id of the last entry after the purge point.
    fn last_entry_log_id(&self) -> Result<Option<LogId<u64>>, StoreError> {
        let last_purged = self.last_purged()?;
        match self.database.logs.last()? {
            Some((key, value)) => {
                let log_id = decode_entry(&key, &value)?.log_id;
                Ok(Some(log_id)
                    .filter(|log_id| last_purged.is_none_or(|purged| log_id.index > purged.index)))
            }
            None => Ok(None),
        }
    }

    /// The entries in `range` after the purge point (entries a purge past the durable snapshot
    /// left on disk are not part of the log).
    fn read_entries(
        &self,
        range: impl RangeBounds<u64>,
    ) -> Result<Vec<Entry<TypeConfig>>, StoreError> {
        let mut entries: Vec<Entry<TypeConfig>> = Vec::new();
        let first = self.last_purged()?.map_or(0, |purged| purged.index + 1);
        let start = match range.start_bound() {
            Bound::Included(start) => Bound::Included((*start).max(first)),
            Bound::Excluded(start) if *start >= first => Bound::Excluded(*start),
            Bound::Excluded(_) | Bound::Unbounded => Bound::Included(first),
        };
        let range = (start, range.end_bound().cloned());
        for item in self.database.logs.range(key_range(range)) {
            let (key, value) = item?;
            let entry = decode_entry(&key, &value)?;
            if let Some(previous) = entries.last() {
                if previous.log_id.index + 1 != entry.log_id.index {
                    return Err(StoreError::Corrupt {
                        what: "log".to_owned(),
                        reason: format!(
                            "hole between index {} and {}",
                            previous.log_id.index, entry.log_id.index
                        ),
                    });
                }
            }
            entries.push(entry);
        }
        Ok(entries)
    }

    /// Inserts the entries in one atomic sled batch. They must be consecutive.
    fn write_entries(
        &self,
        entries: impl IntoIterator<Item = Entry<TypeConfig>>,
    ) -> Result<(), StoreError> {
        let mut batch = sled::Batch::default();
        let mut previous: Option<LogId<u64>> = None;
        for entry in entries {
            if let Some(previous) = previous {
                if previous.index + 1 != entry.log_id.index {
                    return Err(StoreError::Refused(format!(
                        "appended entries are not consecutive: index {} after {}",
                        entry.log_id.index, previous.index
                    )));
                }
            }
            previous = Some(entry.log_id);
            batch.insert(&log_key(entry.log_id.index), encode(&entry, "log entry")?);
        }
        self.database.logs.apply_batch(batch)?;
        Ok(())
    }
}

/// Removes the entries in `range` from the log tree in one atomic sled batch (not flushed).
fn remove_entries(logs: &sled::Tree, range: impl RangeBounds<u64>) -> Result<(), StoreError> {
    let mut batch = sled::Batch::default();
    for key in logs.range(key_range(range)).keys() {
        batch.remove(key?);
    }
    logs.apply_batch(batch)?;
    Ok(())
}

fn key_range(range: impl RangeBounds<u64>) -> (Bound<[u8; 8]>, Bound<[u8; 8]>) {
    let start = range.start_bound().map(|index| log_key(*index));
    let end = range.end_bound().map(|index| log_key(*index));
    (start, end)
}

/// Decodes the entry stored under `key` and checks that it is the entry for that index.
fn decode_entry(key: &[u8], value: &[u8]) -> Result<Entry<TypeConfig>, StoreError> {
    let index = <[u8; 8]>::try_from(key)
        .map(u64::from_be_bytes)
        .map_err(|_| StoreError::Corrupt {
            what: "log key".to_owned(),
            reason: format!("{} bytes instead of 8", key.len()),
        })?;
    let entry: Entry<TypeConfig> = decode(value, &format!("log entry {index}"))?;
    if entry.log_id.index != index {
        return Err(StoreError::Corrupt {
            what: format!("log entry {index}"),
            reason: format!("it holds the entry for index {}", entry.log_id.index),
        });
    }
    Ok(entry)
}
