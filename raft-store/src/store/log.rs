//! The Raft log and vote: `LogStore` implements openraft's `RaftLogStorage` and
//! `RaftLogReader`.
//!
//! Entries live in the segment files of `segments.rs`, one record per entry, whose payload is
//! the bincode of the whole `openraft::Entry`. The vote, the committed log id and the last
//! purged log id live in files of their own (`files.rs`). Nothing here looks inside a `Batch`.
//!
//! The entries appended last are also kept decoded (`Recent`): each is read again right after
//! its append, by every replication stream and by the state machine, and serving those reads
//! from memory saves a positioned read, a CRC and a decode each.

use std::collections::VecDeque;
use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use openraft::storage::{IOFlushed, LogState, RaftLogStorage};
use openraft::{OptionalSend, RaftLogReader};

use super::mutation::{self, Mutation};
use super::segments::{index_span, Flush, SegmentLog};
use super::{
    decode, encode, io_error, Database, Entry, Io, LogId, StorageResult, StoreError, TypeConfig,
    Vote, COMMITTED_FILE, PURGED_FILE, VOTE_FILE,
};

/// A segment file that has reached this size gets no more entries (unless the store is opened
/// with other `Options`). A purge removes whole segments, so this is also about how much a
/// purged prefix may keep on disk.
pub const SEGMENT_BYTES_TARGET: u64 = 64 << 20;
/// Entries per write when an earlier build's sled log is copied into segments.
const IMPORT_BATCH_MAX: usize = 1_024;
/// The most recently appended entries kept decoded, at most this many...
const RECENT_ENTRIES_MAX: usize = 1_024;
/// ... and at most this many bytes of their encodings.
const RECENT_BYTES_MAX: usize = 8 << 20;
/// The most bytes of encoded entries one read for a replication stream returns (at least one
/// entry): an append to a follower stays well under the peer message limit.
pub const REPLICATION_READ_BYTES_MAX: usize = 16 << 20;

/// The durable Raft log and vote of one node.
///
/// Cloning is cheap and gives another handle on the same segments and files; openraft
/// uses clones as log readers for replication, concurrently with the one writer.
#[derive(Debug, Clone)]
pub struct LogStore {
    database: Database,
    segments: Arc<SegmentLog>,
    recent: Arc<Mutex<Recent>>,
    /// The thread (or the simulator's task) that completes each append's flush and answers its
    /// callback.
    flusher: Arc<Flusher>,
}

/// The last entries appended, in index order and consecutive, each with the size of its
/// encoding: always the newest entries on disk (an append after a gap starts it afresh, a
/// truncate or a purge takes out what it removes), so a read it covers whole is the read from
/// disk without the disk.
#[derive(Debug, Default)]
struct Recent {
    entries: VecDeque<(Entry, usize)>,
    bytes: usize,
}

impl Recent {
    fn first_index(&self) -> Option<u64> {
        self.entries.front().map(|(entry, _)| entry.log_id.index)
    }

    fn last_index(&self) -> Option<u64> {
        self.entries.back().map(|(entry, _)| entry.log_id.index)
    }

    /// Adds entries just written; they follow the last one kept, or replace everything.
    fn push(&mut self, appended: Vec<(Entry, usize)>) {
        let Some((first, _)) = appended.first() else {
            return;
        };
        if self
            .last_index()
            .is_some_and(|last| last + 1 != first.log_id.index)
        {
            self.clear();
        }
        for (entry, bytes) in appended {
            self.bytes += bytes;
            self.entries.push_back((entry, bytes));
        }
        while self.entries.len() > RECENT_ENTRIES_MAX || self.bytes > RECENT_BYTES_MAX {
            self.pop_front();
        }
    }

    /// The entries of `[start, end)` when every one of them is kept, with their encoded sizes.
    fn get(&self, start: u64, end: u64) -> Option<Vec<(Entry, usize)>> {
        let first = self.first_index()?;
        let last = self.last_index()?;
        if start < first || end > last + 1 || start >= end {
            return None;
        }
        let from = (start - first) as usize;
        let to = (end - first) as usize;
        Some(
            self.entries
                .range(from..to)
                .map(|(entry, bytes)| (entry.clone(), *bytes))
                .collect(),
        )
    }

    /// Forgets the entries from `index` on.
    fn truncate(&mut self, index: u64) {
        while self.last_index().is_some_and(|last| last >= index) {
            if let Some((_, bytes)) = self.entries.pop_back() {
                self.bytes -= bytes;
            }
        }
    }

    /// Forgets the entries up to `index`.
    fn purge(&mut self, index: u64) {
        while self.first_index().is_some_and(|first| first <= index) {
            self.pop_front();
        }
    }

    fn pop_front(&mut self) {
        if let Some((_, bytes)) = self.entries.pop_front() {
            self.bytes -= bytes;
        }
    }

    fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }
}

/// Reads entries for openraft's replication streams and for startup, and the vote.
///
/// Guarantees: returns the entries present in `range`, in index order, with no gaps among
/// them; an entry that is absent (purged, or never written) is simply not returned. An I/O
/// error, undecodable bytes, or an entry stored under another index than its own is an error
/// (a corrupt log stops the node rather than replicating garbage). A replication read
/// (`limited_get_log_entries`) stops at `REPLICATION_READ_BYTES_MAX` bytes of entries, after
/// at least one.
impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> StorageResult<Vec<Entry>> {
        self.read_entries(range, usize::MAX).map_err(io_error)
    }

    async fn limited_get_log_entries(&mut self, start: u64, end: u64) -> StorageResult<Vec<Entry>> {
        self.read_entries(start..end, REPLICATION_READ_BYTES_MAX)
            .map_err(io_error)
    }

    async fn read_vote(&mut self) -> StorageResult<Option<Vote>> {
        self.database.files.read(VOTE_FILE).map_err(io_error)
    }
}

/// The log storage contract Baton relies on.
///
/// - Writes are serialized: openraft calls these methods one at a time from its core task
///   (`&mut self`), and each one finishes its writes before returning.
/// - `append` writes every entry with one positioned write and returns; the flusher thread
///   `fdatasync`s the segment and only then reports the entries flushed through the callback:
///   an entry counted toward a commit (the leader's own, or acknowledged to the leader) is on
///   disk. The next append is written only once that flush is done. After the callback the
///   flusher may write zeros ahead of the records (`SegmentLog::preallocate`), so that later
///   appends change no file size.
/// - `save_vote` replaces the vote file and syncs it and the data dir before returning.
///   `truncate` and `purge` sync too.
/// - No holes: `truncate` removes a suffix, later segments first; `purge` durably records the
///   last purged log id before it removes whole segments of the prefix, and `open` finishes an
///   interrupted purge.
/// - Nothing that a restart needs is purged: an entry is removed only once a durable snapshot
///   covers it. openraft 0.10 purges only after the snapshot covering the purge point is
///   flushed (built or installed); should a purge ever go past every durable snapshot, it is
///   honoured by the readers (openraft never reads below its purge point) but leaves the
///   entries on disk, and `open` forgets it.
/// - On any I/O or decoding error the method returns an `io::Error` (and `append` also
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
        read().map_err(io_error)
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    /// Durable before returning: the vote file is replaced and synced with its directory.
    async fn save_vote(&mut self, vote: &Vote) -> StorageResult<()> {
        if mutation::active(Mutation::VoteNotSaved) {
            return Ok(());
        }
        let files = self.database.files.clone();
        let vote = *vote;
        self.database
            .run_blocking(move || files.replace(VOTE_FILE, &vote))
            .await
            .map_err(io_error)?;
        // The harness's `votes` checker reads these lines: one node never votes for two
        // candidates in a term, and no two nodes see two leaders of one term.
        tracing::info!(
            term = vote.leader_id.term,
            voted_for = vote.leader_id.node_id,
            committed = vote.committed,
            "vote saved"
        );
        Ok(())
    }

    /// Records the committed log id so that, after a restart, openraft re-applies the committed
    /// entries after the last snapshot before serving. Written in place and never synced: a
    /// crash may lose it or tear it, and it then reads as absent. That only means re-applying
    /// less at startup and learning the rest from the leader.
    async fn save_committed(&mut self, committed: Option<LogId>) -> StorageResult<()> {
        self.database
            .files
            .write_unsynced(COMMITTED_FILE, &committed)
            .map_err(io_error)
    }

    /// The committed log id saved, or the log's last entry if that is earlier. An entry is
    /// committed once a quorum has flushed it, which need not include this node's own append
    /// (a leader's flush overlaps its followers'), so a power cut may keep the id and lose the
    /// entries it names. The
    /// entries the log still holds are a prefix of the log the id was committed in (a truncate
    /// is synced before anything is written after it), so the last of them is committed too.
    async fn read_committed(&mut self) -> StorageResult<Option<LogId>> {
        let read = || -> Result<Option<LogId>, StoreError> {
            let saved = self
                .database
                .files
                .read_unsynced::<Option<LogId>>(COMMITTED_FILE)?
                .flatten();
            let end = self.last_entry_log_id()?.or(self.last_purged()?);
            Ok(match (saved, end) {
                (Some(saved), Some(end)) if saved.index > end.index => Some(end),
                (Some(_), None) => None,
                (saved, _) => saved,
            })
        };
        read().map_err(io_error)
    }

    /// Encodes the entries and writes them (readable as soon as this returns, so openraft
    /// replicates them at once), and hands their `fdatasync` to the flusher thread, which calls
    /// back once it succeeded (or with its error). The leader's flush and the followers' run in
    /// parallel; the next append waits for this one's flush before it writes.
    async fn append<I>(&mut self, entries: I, callback: IOFlushed<TypeConfig>) -> StorageResult<()>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let settled = self.flusher.settled().await;
        let written = settled.and_then(|()| {
            let entries: Vec<Entry> = entries.into_iter().collect();
            let records = entries
                .iter()
                .map(|entry| Ok((entry.log_id.index, encode(entry, "log entry")?)))
                .collect::<Result<Vec<_>, StoreError>>()?;
            let gap_allowed = match records.first() {
                Some((first, _)) => self.starts_after_purge(*first)?,
                None => false,
            };
            // On this thread, not the blocking pool: a write is one positioned write (and a
            // wait for the previous append's flush, ~0.2 ms here), and handing it to a pool
            // thread and back cost two thread wake-ups per entry (docs/performance.md).
            let flush = self.segments.write(&records, gap_allowed)?;
            let sizes = records.iter().map(|(_, payload)| payload.len());
            self.recent()?
                .push(entries.into_iter().zip(sizes).collect());
            Ok::<_, StoreError>(flush)
        });
        match written {
            Ok(Some(flush)) => self.flusher.send(flush, callback).map_err(io_error),
            Ok(None) => {
                callback.io_completed(Ok(()));
                Ok(())
            }
            Err(error) => {
                callback.io_completed(Err(io::Error::other(error.to_string())));
                Err(io_error(error))
            }
        }
    }

    /// Keeps the entries up to `last_log_id` (none when `None`) and removes the rest, durably.
    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> StorageResult<()> {
        if mutation::active(Mutation::TruncateNothing) {
            return Ok(());
        }
        let from = last_log_id.map_or(0, |log_id| log_id.index + 1);
        self.flusher.settled().await.map_err(io_error)?;
        self.recent().map_err(io_error)?.truncate(from);
        let segments = self.segments.clone();
        self.database
            .run_blocking(move || segments.truncate(from))
            .await
            .map_err(io_error)
    }

    /// Records `log_id` as the last purged log id and fsyncs, then removes the whole segments
    /// up to it that the durable snapshot covers. A crash between the two leaves stale entries
    /// below the purge point, which `open` removes; never a hole above it.
    async fn purge(&mut self, log_id: LogId) -> StorageResult<()> {
        let result = async {
            self.recent()?.purge(log_id.index);
            if self
                .last_purged()?
                .is_some_and(|last_purged| last_purged >= log_id)
            {
                return Ok(());
            }
            let files = self.database.files.clone();
            self.database
                .run_blocking(move || files.replace(PURGED_FILE, &log_id))
                .await?;
            let Some(durable) = self.database.durable_snapshot()? else {
                return Ok(());
            };
            // File removals and a directory fsync: off the async worker, which also runs
            // openraft's core (a slow purge inline once stalled heartbeats long enough for a
            // follower to call an election in the memory bench).
            let segments = self.segments.clone();
            let upto = durable.index.min(log_id.index);
            self.flusher.settled().await?;
            self.database
                .run_blocking(move || segments.remove_through(upto))
                .await
        };
        result.await.map_err(io_error)
    }
}

impl LogStore {
    /// Opens the segments in `dir` beside the store's files (the state machine has opened them
    /// first and knows the durable snapshot) and settles the purge point: a recorded purge past
    /// the durable snapshot never removed anything the snapshot does not cover (see `purge`),
    /// so it is forgotten and the entries after the snapshot are the log again; a purge that a
    /// crash interrupted is finished.
    pub(super) fn open(
        database: Database,
        dir: &Path,
        segment_bytes: u64,
    ) -> Result<LogStore, StoreError> {
        let segments = Arc::new(SegmentLog::open(database.files.disk(), dir, segment_bytes)?);
        let store = LogStore {
            flusher: Arc::new(Flusher::start(segments.clone(), &database.io)?),
            database,
            segments,
            recent: Arc::default(),
        };
        let durable = store.database.durable_snapshot()?;
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
                    Some(log_id) => store.database.files.replace(PURGED_FILE, &log_id)?,
                    None => store.database.files.remove(PURGED_FILE)?,
                };
            }
            if let Some(log_id) = kept_purge {
                store.segments.remove_through(log_id.index)?;
            }
        }
        Ok(store)
    }

    /// Copies the entries of an earlier build's sled `log` tree into the segments, whole: what
    /// a partial copy (a crash during it) left there goes first. The caller drops the tree once
    /// the copy is durable.
    pub(super) fn import_sled_log(&self, logs: &sled::Tree) -> Result<(), StoreError> {
        self.segments.truncate(0)?;
        let mut records: Vec<(u64, Vec<u8>)> = Vec::new();
        for item in logs.iter() {
            let (key, value) = item?;
            let entry = decode_sled_entry(&key, &value)?;
            let consecutive = records
                .last()
                .is_none_or(|(previous, _)| previous + 1 == entry.log_id.index);
            if !consecutive || records.len() == IMPORT_BATCH_MAX {
                // A hole is copied as it is; reading across it is the error it always was.
                self.segments.append(&std::mem::take(&mut records), true)?;
            }
            records.push((entry.log_id.index, value.to_vec()));
        }
        self.segments.append(&records, true)
    }

    fn last_purged(&self) -> Result<Option<LogId>, StoreError> {
        self.database.files.read(PURGED_FILE)
    }

    /// Whether an append starting at `index` begins the log afresh after the purge point (a
    /// snapshot install put the purge point past everything on disk), so the segments may
    /// start a new segment there.
    fn starts_after_purge(&self, index: u64) -> Result<bool, StoreError> {
        let last_on_disk = self.segments.bounds()?.map(|(_, last)| last);
        if last_on_disk.is_some_and(|last| last + 1 == index) {
            // The usual append, right after the last entry: no purge point to read.
            return Ok(false);
        }
        let Some(purged) = self.last_purged()? else {
            return Ok(false);
        };
        Ok(index == purged.index + 1 && last_on_disk.is_none_or(|last| last <= purged.index))
    }

    fn recent(&self) -> Result<std::sync::MutexGuard<'_, Recent>, StoreError> {
        self.recent.lock().map_err(|_| StoreError::Poisoned)
    }

    /// The log id of the last entry after the purge point.
    fn last_entry_log_id(&self) -> Result<Option<LogId>, StoreError> {
        let last_purged = self.last_purged()?;
        let Some((_, last)) = self.segments.bounds()? else {
            return Ok(None);
        };
        if last_purged.is_some_and(|purged| last <= purged.index) {
            return Ok(None);
        }
        let entries = self.read_entries(last..=last, usize::MAX)?;
        Ok(entries.last().map(|entry| entry.log_id))
    }

    /// The entries in `range` after the purge point (entries a purge past the durable snapshot
    /// left on disk are not part of the log), stopping once `bytes_max` bytes of encoded
    /// entries are read (after at least one).
    fn read_entries(
        &self,
        range: impl RangeBounds<u64>,
        bytes_max: usize,
    ) -> Result<Vec<Entry>, StoreError> {
        let first = self.last_purged()?.map_or(0, |purged| purged.index + 1);
        let start = match range.start_bound() {
            Bound::Included(start) => Bound::Included((*start).max(first)),
            Bound::Excluded(start) if *start >= first => Bound::Excluded(*start),
            Bound::Excluded(_) | Bound::Unbounded => Bound::Included(first),
        };
        let end = range.end_bound().cloned();
        if let Some((start, Some(end))) = index_span(&(start, end)) {
            if let Some(kept) = self.recent()?.get(start, end) {
                return Ok(within_bytes(kept, bytes_max));
            }
        }
        let mut entries: Vec<(Entry, usize)> = Vec::new();
        let mut bytes = 0;
        for (index, payload) in self.segments.read((start, end))? {
            if !entries.is_empty() && bytes + payload.len() > bytes_max {
                break;
            }
            bytes += payload.len();
            let entry: Entry = decode(&payload, &format!("log entry {index}"))?;
            if entry.log_id.index != index {
                return Err(StoreError::Corrupt {
                    what: format!("log entry {index}"),
                    reason: format!("it holds the entry for index {}", entry.log_id.index),
                });
            }
            if let Some((previous, _)) = entries.last() {
                if previous.log_id.index + 1 != index {
                    return Err(StoreError::Corrupt {
                        what: "log".to_owned(),
                        reason: format!("hole between index {} and {index}", previous.log_id.index),
                    });
                }
            }
            entries.push((entry, payload.len()));
        }
        Ok(entries.into_iter().map(|(entry, _)| entry).collect())
    }
}

/// Completes each append's flush in order, answers its callback, and then writes zeros ahead
/// of the log. After a failed flush it answers every later callback with the error (the node
/// is stopping).
///
/// With `Io::Threads` a thread of its own does it, fed by a queue; dropping the last handle
/// waits for the thread, so nothing of a closed store is still written when the dir is opened
/// again. With `Io::Simulated` a task of its own does it, each flush after the disk's pause;
/// the store's writers wait for it on tokio's clock (`settled`), not on the segments'
/// condition variable, which would block the one thread the simulation runs on.
#[derive(Debug)]
enum Flusher {
    Thread {
        queue: Option<std::sync::mpsc::Sender<(Flush, IOFlushed<TypeConfig>)>>,
        thread: Option<std::thread::JoinHandle<()>>,
    },
    Task {
        queue: tokio::sync::mpsc::UnboundedSender<(Flush, IOFlushed<TypeConfig>)>,
        /// Flushes sent to the task, and the task's count of those it completed.
        sent: AtomicU64,
        completed: tokio::sync::watch::Receiver<u64>,
    },
}

impl Flusher {
    fn start(segments: Arc<SegmentLog>, io: &Io) -> Result<Flusher, StoreError> {
        if let Io::Simulated(latency) = io {
            let (queue, mut pending) = tokio::sync::mpsc::unbounded_channel();
            let (count, completed) = tokio::sync::watch::channel(0u64);
            let latency = latency.clone();
            tokio::spawn(async move {
                let mut failed: Option<String> = None;
                while let Some((flush, callback)) = pending.recv().await {
                    tokio::time::sleep(latency.draw()).await;
                    complete(flush, callback, &segments, &mut failed);
                    count.send_modify(|count| *count += 1);
                }
            });
            return Ok(Flusher::Task {
                queue,
                sent: AtomicU64::new(0),
                completed,
            });
        }
        let (queue, pending) = std::sync::mpsc::channel::<(Flush, IOFlushed<TypeConfig>)>();
        let thread = std::thread::Builder::new()
            .name("baton-log-flush".to_owned())
            .spawn(move || {
                let mut failed: Option<String> = None;
                for (flush, callback) in pending {
                    complete(flush, callback, &segments, &mut failed);
                }
            })
            .map_err(|error| {
                StoreError::Io(format!("starting the log's flusher thread: {error}"))
            })?;
        Ok(Flusher::Thread {
            queue: Some(queue),
            thread: Some(thread),
        })
    }

    fn send(&self, flush: Flush, callback: IOFlushed<TypeConfig>) -> Result<(), StoreError> {
        let gone = || StoreError::Io("the log's flusher is gone".to_owned());
        match self {
            Flusher::Thread { queue, .. } => queue
                .as_ref()
                .and_then(|queue| queue.send((flush, callback)).ok())
                .ok_or_else(gone),
            Flusher::Task { queue, sent, .. } => {
                queue.send((flush, callback)).map_err(|_| gone())?;
                sent.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
        }
    }

    /// Returns once every flush sent so far is complete (at once with `Io::Threads`, whose
    /// writers wait on the segments themselves); an error if the flusher task is gone before
    /// that (it ends only with the store, or by a panic), rather than a writer left waiting.
    async fn settled(&self) -> Result<(), StoreError> {
        if let Flusher::Task {
            sent, completed, ..
        } = self
        {
            let sent = sent.load(Ordering::SeqCst);
            completed
                .clone()
                .wait_for(|count| *count >= sent)
                .await
                .map_err(|_| StoreError::Io("the log's flusher task is gone".to_owned()))?;
        }
        Ok(())
    }
}

/// Completes `flush` (unless an earlier one `failed`), answers `callback`, and writes zeros
/// ahead of the log.
fn complete(
    flush: Flush,
    callback: IOFlushed<TypeConfig>,
    segments: &SegmentLog,
    failed: &mut Option<String>,
) {
    let flushed = match failed {
        Some(error) => Err(error.clone()),
        None => flush.complete().map_err(|error| error.to_string()),
    };
    match flushed {
        Ok(()) => {
            callback.io_completed(Ok(()));
            // Only a saving: an append past the zeros grows the file instead, and a disk that
            // refuses writes fails the next append, which stops the node.
            if let Err(error) = segments.preallocate() {
                tracing::warn!(%error, "writing zeros ahead of the log failed");
            }
        }
        Err(error) => {
            *failed = Some(error.clone());
            callback.io_completed(Err(io::Error::other(error)));
        }
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        if let Flusher::Thread { queue, thread } = self {
            drop(queue.take());
            if let Some(thread) = thread.take() {
                let _ = thread.join();
            }
        }
    }
}

/// The first of `entries` whose encodings total at most `bytes_max`, and at least one.
fn within_bytes(entries: Vec<(Entry, usize)>, bytes_max: usize) -> Vec<Entry> {
    let mut bytes = 0;
    let mut kept = Vec::with_capacity(entries.len());
    for (entry, size) in entries {
        if !kept.is_empty() && bytes + size > bytes_max {
            break;
        }
        bytes += size;
        kept.push(entry);
    }
    kept
}

/// Decodes an entry an earlier build stored in sled under `key` and checks that it is the entry
/// for that index.
fn decode_sled_entry(key: &[u8], value: &[u8]) -> Result<Entry, StoreError> {
    let index = <[u8; 8]>::try_from(key)
        .map(u64::from_be_bytes)
        .map_err(|_| StoreError::Corrupt {
            what: "log key".to_owned(),
            reason: format!("{} bytes instead of 8", key.len()),
        })?;
    let entry: Entry = decode(value, &format!("log entry {index}"))?;
    if entry.log_id.index != index {
        return Err(StoreError::Corrupt {
            what: format!("log entry {index}"),
            reason: format!("it holds the entry for index {}", entry.log_id.index),
        });
    }
    Ok(entry)
}

#[cfg(test)]
mod tests {
    use openraft::EntryPayload;

    use super::super::log_id;
    use super::*;

    fn entry(term: u64, index: u64) -> (Entry, usize) {
        let entry = Entry {
            log_id: log_id(term, 1, index),
            payload: EntryPayload::Blank,
        };
        (entry, 100)
    }

    fn terms(entries: Option<Vec<(Entry, usize)>>) -> Option<Vec<(u64, u64)>> {
        entries.map(|entries| {
            entries
                .iter()
                .map(|(entry, _)| (entry.log_id.leader_id.term, entry.log_id.index))
                .collect()
        })
    }

    #[test]
    fn recent_entries_answer_only_ranges_they_hold_whole() {
        let mut recent = Recent::default();
        recent.push((1..=5).map(|index| entry(1, index)).collect());
        assert_eq!(terms(recent.get(2, 4)), Some(vec![(1, 2), (1, 3)]));
        assert_eq!(recent.get(1, 6).map(|entries| entries.len()), Some(5));
        assert_eq!(recent.get(0, 3), None);
        assert_eq!(recent.get(4, 7), None);
        assert_eq!(recent.get(3, 3), None);
    }

    #[test]
    fn a_truncate_a_purge_or_a_gap_takes_out_what_the_log_no_longer_holds() {
        let mut recent = Recent::default();
        recent.push((1..=5).map(|index| entry(1, index)).collect());
        // A new leader's entries replace 4 and 5.
        recent.truncate(4);
        recent.push(vec![entry(2, 4)]);
        assert_eq!(
            terms(recent.get(3, 5)),
            Some(vec![(1, 3), (2, 4)]),
            "never the truncated entry"
        );
        assert_eq!(recent.get(5, 6), None);
        recent.purge(2);
        assert_eq!(recent.get(2, 4), None);
        assert_eq!(terms(recent.get(3, 4)), Some(vec![(1, 3)]));
        // An append after a snapshot install starts past a gap: the entries before it go.
        recent.push(vec![entry(3, 10)]);
        assert_eq!(recent.get(3, 4), None);
        assert_eq!(terms(recent.get(10, 11)), Some(vec![(3, 10)]));
        assert_eq!(recent.bytes, 100);
    }

    #[test]
    fn recent_entries_are_bounded_by_count_and_bytes() {
        let mut recent = Recent::default();
        let count = RECENT_ENTRIES_MAX as u64 + 10;
        recent.push((1..=count).map(|index| entry(1, index)).collect());
        assert_eq!(recent.entries.len(), RECENT_ENTRIES_MAX);
        assert_eq!(recent.first_index(), Some(11));
        let (big, _) = entry(1, count + 1);
        recent.push(vec![(big, RECENT_BYTES_MAX)]);
        assert_eq!(recent.entries.len(), 1);
        assert_eq!(recent.bytes, RECENT_BYTES_MAX);
    }
}
