//! The Raft log's entries on disk: a directory of segment files, each a run of records in
//! index order.
//!
//! Why not sled: every sled flush hands the write to sled's IO thread pool and waits for it, and
//! sled pages and indexes each entry it stores; a Raft log needs neither. Here an append is one
//! positioned write of all its records (`write`, on the calling thread: readable at once) and one
//! `fdatasync` (`Flush::complete`, on whichever thread the caller chooses: durable then). At most
//! one append is written and not yet synced: the next `write` waits for its flush. So what a
//! crash can leave unsynced is always the last append alone, as the recovery rule below needs.
//!
//! A segment is named by the index of its first record (`00000000000000000042.log`). A record is
//! `len: u32 | crc: u32 | index: u64 | payload`, little-endian, where `len` counts the payload
//! bytes and `crc` is the CRC-32 of the index and payload. This module frames and finds bytes by
//! index; it never looks inside a payload (`log.rs` encodes the entries).
//!
//! The last segment is kept zero-filled ahead of its records (`preallocate`, a megabyte at a
//! time, after an append is acknowledged): an append into bytes that already exist changes no
//! file size, so its `fdatasync` writes the records and nothing else (about a fifth faster on
//! this disk). So a segment is its records followed by zeros, and zeros are not records.
//!
//! Recovery (`open`) reads every segment. Records must be well-formed and consecutive within a
//! segment, and no index may be on disk twice. Only the last record of the last segment may be
//! torn (cut short, or failing its CRC, with nothing but zeros after it): it is what a crash
//! during an append leaves, an append that was never acknowledged because its fsync had not
//! returned, and it is cut off. Anything else that does not read back is corruption, and `open`
//! fails: the node stops rather than serve a log with a hole. `open` cuts every file at the end
//! of its records, zeros included, so nothing that was never a record stays in a segment.
//!
//! Crash safety of the other writes: a new segment's directory entry is fsynced before a record
//! is written into it; `truncate` unlinks later segments (and fsyncs the directory) before it
//! shortens the segment that holds the cut, so a crash leaves a prefix of the old log, never a
//! gap; `remove_through` unlinks whole segments from the oldest up.
//!
//! Every file operation goes through the store's `Disk` (`files.rs`), so that the power-cut
//! tests and the simulator run the log on a simulated disk.
//!
//! Never here: openraft types, sled, or any decision about what may be removed (the purge rules
//! live in `log.rs`).

use std::collections::BTreeMap;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, RwLock};

use super::files::{Disk, DiskFile};
use super::mutation::{self, Mutation};
use super::StoreError;

/// Bytes before a record's payload: length, CRC and index.
const HEADER_BYTES: usize = 16;
/// Zeros written ahead of the last segment's records at a time (~0.9 ms with its fdatasync).
const PREALLOCATE_BYTES: u64 = 1 << 20;
/// A payload larger than this is corruption (no log entry the limits allow comes near it).
const PAYLOAD_BYTES_MAX: usize = 1 << 30;
const SEGMENT_SUFFIX: &str = ".log";

/// The segment files of one log directory and the position of every record in them.
///
/// One writer at a time (openraft's core calls `append`, `truncate` and `remove_through` one
/// after another; `writer` enforces it), any number of readers alongside it. A reader holds the
/// read lock while it reads, so a truncate never shortens a file under it.
#[derive(Debug)]
pub(super) struct SegmentLog {
    disk: Arc<dyn Disk>,
    dir: PathBuf,
    /// A segment that has reached this size gets no more records; the next append starts a new
    /// one.
    segment_bytes_target: u64,
    writer: Mutex<()>,
    state: RwLock<Segments>,
    /// Whether the last append is written and not yet synced; `Flush::complete` settles it.
    unsynced: Arc<(Mutex<Unsynced>, Condvar)>,
}

/// The last append's flush.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
enum Unsynced {
    /// Every append written is synced.
    #[default]
    None,
    /// One is written and its flush not done yet.
    Pending,
    /// A flush failed: nothing more is written (the node is stopping).
    Failed(String),
}

/// The flush an append still owes: `complete` makes its records durable.
#[derive(Debug)]
#[must_use = "an append is durable only once its flush completes"]
pub(super) struct Flush {
    file: Arc<dyn DiskFile>,
    unsynced: Arc<(Mutex<Unsynced>, Condvar)>,
}

impl Flush {
    /// `fdatasync`s the append's segment, and lets the next append be written.
    pub(super) fn complete(self) -> Result<(), StoreError> {
        let synced = if mutation::active(Mutation::AppendNotSynced) {
            Ok(())
        } else {
            self.file.sync_data()
        };
        let (unsynced, settled) = &*self.unsynced;
        let mut unsynced = unsynced.lock().map_err(|_| StoreError::Poisoned)?;
        *unsynced = match &synced {
            Ok(()) => Unsynced::None,
            Err(error) => Unsynced::Failed(error.to_string()),
        };
        settled.notify_all();
        synced.map_err(|error| io_error("fsync the log", error))
    }
}

#[derive(Debug, Default)]
struct Segments {
    /// By the index their name gives (their first record's).
    files: BTreeMap<u64, Segment>,
    /// Every record on disk, by index.
    records: BTreeMap<u64, Location>,
}

#[derive(Debug)]
struct Segment {
    file: Arc<dyn DiskFile>,
    path: PathBuf,
    /// Bytes of whole records, where the next record goes.
    len: u64,
    /// The file's size: `len` and the zeros after it.
    allocated: u64,
}

#[derive(Debug, Clone, Copy)]
struct Location {
    /// The segment's first index (its key in `files`).
    segment: u64,
    /// Where the record's header starts.
    offset: u64,
    payload_len: u32,
}

impl SegmentLog {
    /// Opens (creating it if need be) the log in `dir`, reads every segment back, cuts off a
    /// torn last record and fails on anything else that does not read back (see the module
    /// docs).
    pub(super) fn open(
        disk: Arc<dyn Disk>,
        dir: &Path,
        segment_bytes_target: u64,
    ) -> Result<SegmentLog, StoreError> {
        let created = disk
            .create_dir(dir)
            .map_err(|error| io_error("create the log directory", error))?;
        if let (true, Some(parent)) = (created, dir.parent()) {
            sync_dir(&*disk, parent)?;
        }
        let mut names: Vec<(u64, PathBuf)> = disk
            .list(dir)
            .map_err(|error| io_error("list the log directory", error))?
            .into_iter()
            .filter_map(|name| Some((parse_segment_name(&name)?, dir.join(name))))
            .collect();
        names.sort();
        let mut segments = Segments::default();
        let mut removed_empty = false;
        let last = names.len().checked_sub(1);
        for (position, (first, path)) in names.into_iter().enumerate() {
            let (Some(file), Some(bytes)) = (
                disk.open_file(&path)
                    .map_err(|error| io_error("open a log segment", error))?,
                disk.read(&path)
                    .map_err(|error| io_error("read a log segment", error))?,
            ) else {
                return Err(corrupt(&path, "listed, then gone".to_owned()));
            };
            let scanned = scan(first, &bytes, &path)?;
            let len = scanned.end;
            if scanned.torn {
                if Some(position) != last {
                    return Err(corrupt(
                        &path,
                        format!("an unreadable record at byte {len}, before the last segment"),
                    ));
                }
                tracing::warn!(
                    segment = %path.display(),
                    offset = len,
                    "cutting off a torn record at the end of the log (an append a crash interrupted; it was never acknowledged)"
                );
            }
            let cut = len < bytes.len() as u64;
            if cut {
                // A torn record, or zeros written ahead of the records.
                file.set_len(len)
                    .map_err(|error| io_error("cut a log segment after its last record", error))?;
                file.sync_data()
                    .map_err(|error| io_error("cut a log segment after its last record", error))?;
            }
            if len == 0 {
                // Created, then a crash before its first record: it holds nothing.
                disk.remove(&path)
                    .map_err(|error| io_error("remove an empty log segment", error))?;
                removed_empty = true;
                continue;
            }
            if Some(position) == last && !cut {
                // A crash between an append's write and its flush leaves the append whole on
                // disk and never synced (the page cache outlives the process). It is part of
                // the log from now on, and the next appends may go to a new segment that no
                // flush of this one follows: it is made durable here, before anything relies
                // on it. Only the last segment can hold an unsynced append.
                file.sync_data()
                    .map_err(|error| io_error("sync the last log segment", error))?;
            }
            // Segments follow one another without a hole: one missing from the middle of the
            // log would lose acknowledged entries silently.
            if let Some((&last_index, _)) = segments.records.last_key_value() {
                if first > last_index + 1 {
                    return Err(corrupt(
                        &path,
                        format!(
                            "entries {} to {} are missing: the log segment holding them is gone",
                            last_index + 1,
                            first - 1
                        ),
                    ));
                }
            }
            for (index, location) in scanned.records {
                if segments.records.insert(index, location).is_some() {
                    return Err(corrupt(&path, format!("index {index} is on disk twice")));
                }
            }
            segments.files.insert(
                first,
                Segment {
                    file,
                    path,
                    len,
                    allocated: len,
                },
            );
        }
        if removed_empty {
            sync_dir(&*disk, dir)?;
        }
        Ok(SegmentLog {
            disk,
            dir: dir.to_owned(),
            segment_bytes_target,
            writer: Mutex::new(()),
            state: RwLock::new(segments),
            unsynced: Arc::default(),
        })
    }

    /// The lowest and highest index on disk.
    pub(super) fn bounds(&self) -> Result<Option<(u64, u64)>, StoreError> {
        let state = self.read_state()?;
        let first = state.records.keys().next();
        let last = state.records.keys().next_back();
        Ok(first.zip(last).map(|(first, last)| (*first, *last)))
    }

    /// Writes `records` (index, payload), whose indexes must be consecutive, after the last
    /// record on disk, and fsyncs them before returning. See `write`.
    pub(super) fn append(
        &self,
        records: &[(u64, Vec<u8>)],
        gap_allowed: bool,
    ) -> Result<(), StoreError> {
        match self.write(records, gap_allowed)? {
            Some(flush) => flush.complete(),
            None => Ok(()),
        }
    }

    /// Writes `records` (index, payload), whose indexes must be consecutive, after the last
    /// record on disk, once the append before is synced; they are readable when this returns,
    /// and durable once the returned flush completes (`None`: nothing to write). The first may
    /// follow the last on disk or, when `gap_allowed`, any later index: a new segment starts
    /// there (the caller allows it only when everything on disk is below its purge point).
    pub(super) fn write(
        &self,
        records: &[(u64, Vec<u8>)],
        gap_allowed: bool,
    ) -> Result<Option<Flush>, StoreError> {
        let Some(&(first_index, _)) = records.first() else {
            return Ok(None);
        };
        let _writer = self.lock_writer()?;
        let mut bytes = Vec::with_capacity(
            records
                .iter()
                .map(|(_, payload)| HEADER_BYTES + payload.len())
                .sum(),
        );
        for (expected, (index, payload)) in (first_index..).zip(records) {
            if *index != expected {
                return Err(StoreError::Refused(format!(
                    "appended entries are not consecutive: index {index} where {expected} was due"
                )));
            }
            frame(*index, payload, &mut bytes)?;
        }
        let mut unsynced = self.wait_synced()?;
        let (segment, file, offset) = self.segment_for(first_index, gap_allowed)?;
        file.write_at(&bytes, offset)
            .map_err(|error| io_error("append to the log", error))?;
        *unsynced = Unsynced::Pending;
        drop(unsynced);
        let mut state = self.write_state()?;
        let mut position = offset;
        for (index, payload) in records {
            let payload_len = payload.len() as u32;
            state.records.insert(
                *index,
                Location {
                    segment,
                    offset: position,
                    payload_len,
                },
            );
            position += (HEADER_BYTES + payload.len()) as u64;
        }
        if let Some(open) = state.files.get_mut(&segment) {
            open.len = position;
            open.allocated = open.allocated.max(position);
        }
        Ok(Some(Flush {
            file,
            unsynced: self.unsynced.clone(),
        }))
    }

    /// Waits until no append is written and unsynced; a failed flush is an error. The guard
    /// keeps it so until dropped.
    fn wait_synced(&self) -> Result<std::sync::MutexGuard<'_, Unsynced>, StoreError> {
        let (unsynced, settled) = &*self.unsynced;
        let unsynced = unsynced.lock().map_err(|_| StoreError::Poisoned)?;
        let unsynced = settled
            .wait_while(unsynced, |unsynced| *unsynced == Unsynced::Pending)
            .map_err(|_| StoreError::Poisoned)?;
        if let Unsynced::Failed(error) = &*unsynced {
            return Err(StoreError::Io(format!(
                "an earlier fsync of the log failed: {error}"
            )));
        }
        Ok(unsynced)
    }

    /// Makes sure the last segment has at least half of `PREALLOCATE_BYTES` of zeros after its
    /// records, writing (and fdatasyncing) `PREALLOCATE_BYTES` more when it has not (or the
    /// segment's target size, when that is smaller: the simulator's segments are small). Called after
    /// an append's flush, so the next appends find their bytes already there. A segment that is
    /// full gets none: the next append starts a new one.
    ///
    /// Never waits, neither for a flush nor for the writer lock: it runs on the thread that
    /// completes the flushes, and a writer may hold the lock while it waits for the next flush
    /// in that thread's queue. With an append being written, or written and not yet synced, it
    /// does nothing (the next call does it).
    pub(super) fn preallocate(&self) -> Result<(), StoreError> {
        let _writer = match self.writer.try_lock() {
            Ok(writer) => writer,
            Err(std::sync::TryLockError::WouldBlock) => return Ok(()),
            Err(std::sync::TryLockError::Poisoned(_)) => return Err(StoreError::Poisoned),
        };
        if *self.unsynced.0.lock().map_err(|_| StoreError::Poisoned)? != Unsynced::None {
            return Ok(());
        }
        let (first, file, from) = {
            let state = self.read_state()?;
            let Some((first, segment)) = state.files.iter().next_back() else {
                return Ok(());
            };
            if segment.len == 0
                || segment.len >= self.segment_bytes_target
                || segment.allocated - segment.len >= self.preallocate_bytes() / 2
            {
                return Ok(());
            }
            (*first, segment.file.clone(), segment.allocated)
        };
        // Readers never look past `len`, and the writer lock keeps appends out: the zeros go
        // in without the state lock.
        let more = self.preallocate_bytes();
        let zeros = vec![0u8; more as usize];
        file.write_at(&zeros, from)
            .map_err(|error| io_error("preallocate the log", error))?;
        file.sync_data()
            .map_err(|error| io_error("preallocate the log", error))?;
        if let Some(segment) = self.write_state()?.files.get_mut(&first) {
            segment.allocated = from + more;
        }
        Ok(())
    }

    /// The payloads of the records in `range` that are on disk, in index order, with their
    /// indexes.
    pub(super) fn read(
        &self,
        range: impl RangeBounds<u64>,
    ) -> Result<Vec<(u64, Vec<u8>)>, StoreError> {
        let state = self.read_state()?;
        let mut payloads = Vec::new();
        // Consecutive records of one segment are read with one positioned read.
        let mut run: Vec<(u64, Location)> = Vec::new();
        let Some((start, end)) = index_span(&range) else {
            return Ok(payloads);
        };
        for (index, location) in state
            .records
            .range(start..)
            .take_while(|(index, _)| end.is_none_or(|end| **index < end))
        {
            let continues = run.last().is_some_and(|(_, previous)| {
                previous.segment == location.segment
                    && previous.offset + HEADER_BYTES as u64 + u64::from(previous.payload_len)
                        == location.offset
            });
            if !continues && !run.is_empty() {
                read_run(&state, &run, &mut payloads)?;
                run.clear();
            }
            run.push((*index, *location));
        }
        if !run.is_empty() {
            read_run(&state, &run, &mut payloads)?;
        }
        Ok(payloads)
    }

    /// Removes every record at or after `index`, durably: later segments are unlinked, then the
    /// segment that holds `index` is cut before it.
    pub(super) fn truncate(&self, index: u64) -> Result<(), StoreError> {
        let _writer = self.lock_writer()?;
        let _synced = self.wait_synced()?;
        let mut state = self.write_state()?;
        // Every segment that starts at or after `index`, the newest first.
        let doomed: Vec<u64> = state
            .files
            .range(index..)
            .map(|(first, _)| *first)
            .rev()
            .collect();
        for first in &doomed {
            if let Some(segment) = state.files.remove(first) {
                self.disk
                    .remove(&segment.path)
                    .map_err(|error| io_error("remove a log segment", error))?;
            }
        }
        if !doomed.is_empty() {
            sync_dir(&*self.disk, &self.dir)?;
        }
        if let Some(location) = state.records.get(&index).copied() {
            if let Some(segment) = state.files.get_mut(&location.segment) {
                segment
                    .file
                    .set_len(location.offset)
                    .map_err(|error| io_error("truncate the log", error))?;
                segment
                    .file
                    .sync_data()
                    .map_err(|error| io_error("truncate the log", error))?;
                segment.len = location.offset;
                segment.allocated = location.offset;
            }
        }
        state.records.split_off(&index);
        Ok(())
    }

    /// Unlinks every segment whose records all lie at or below `index`. Records below `index`
    /// that share a segment with later ones stay on disk; the caller ignores them.
    pub(super) fn remove_through(&self, index: u64) -> Result<(), StoreError> {
        let _writer = self.lock_writer()?;
        let _synced = self.wait_synced()?;
        let mut state = self.write_state()?;
        let firsts: Vec<u64> = state.files.keys().copied().collect();
        let mut removed = false;
        for (position, first) in firsts.iter().enumerate() {
            let next = firsts.get(position + 1).copied().unwrap_or(u64::MAX);
            let last_record = state
                .records
                .range(*first..next)
                .next_back()
                .map(|(index, _)| *index);
            let is_last_segment = position + 1 == firsts.len();
            let removable = match last_record {
                Some(last_record) => last_record <= index,
                // An empty segment in the middle is a leftover; the last one is where the next
                // append goes.
                None => !is_last_segment,
            };
            if !removable {
                break;
            }
            if let Some(segment) = state.files.remove(first) {
                self.disk
                    .remove(&segment.path)
                    .map_err(|error| io_error("remove a log segment", error))?;
                removed = true;
            }
            if let Some(last_record) = last_record {
                state.records = state.records.split_off(&(last_record + 1));
            }
        }
        if removed {
            sync_dir(&*self.disk, &self.dir)?;
        }
        Ok(())
    }

    /// The segment the next record (at `index`) goes into, its file and the offset to write
    /// at; starts a new segment when the current one is full, when there is none, or at a gap.
    fn segment_for(
        &self,
        index: u64,
        gap_allowed: bool,
    ) -> Result<(u64, Arc<dyn DiskFile>, u64), StoreError> {
        {
            let state = self.read_state()?;
            let last_index = state.records.keys().next_back().copied();
            if let Some(last_index) = last_index {
                if index <= last_index {
                    return Err(StoreError::Refused(format!(
                        "append at index {index} over the log's last index {last_index} (truncate first)"
                    )));
                }
                if index != last_index + 1 && !gap_allowed {
                    return Err(StoreError::Refused(format!(
                        "append at index {index} leaves a hole after the log's last index {last_index}"
                    )));
                }
            }
            if let Some((first, segment)) = state.files.iter().next_back() {
                // A record goes into the last segment only right after that segment's own last
                // record, or first into it when it is empty and named for it.
                let holds_previous = index
                    .checked_sub(1)
                    .and_then(|previous| state.records.get(&previous))
                    .is_some_and(|location| location.segment == *first);
                let follows = if segment.len == 0 {
                    *first == index
                } else {
                    holds_previous
                };
                if follows && segment.len < self.segment_bytes_target {
                    return Ok((*first, segment.file.clone(), segment.len));
                }
            }
        }
        self.start_segment(index)
    }

    fn start_segment(&self, first: u64) -> Result<(u64, Arc<dyn DiskFile>, u64), StoreError> {
        let path = self.dir.join(segment_name(first));
        let file = self
            .disk
            .create_file(&path)
            .map_err(|error| io_error("create a log segment", error))?;
        file.sync_all()
            .map_err(|error| io_error("create a log segment", error))?;
        sync_dir(&*self.disk, &self.dir)?;
        let mut state = self.write_state()?;
        // An empty segment left at the end (cut to nothing) is replaced by the new one.
        let empty: Vec<u64> = state
            .files
            .iter()
            .filter(|(_, segment)| segment.len == 0)
            .map(|(first, _)| *first)
            .filter(|existing| *existing != first)
            .collect();
        for existing in empty {
            if let Some(segment) = state.files.remove(&existing) {
                self.disk
                    .remove(&segment.path)
                    .map_err(|error| io_error("remove an empty log segment", error))?;
            }
        }
        state.files.insert(
            first,
            Segment {
                file: file.clone(),
                path,
                len: 0,
                allocated: 0,
            },
        );
        Ok((first, file, 0))
    }

    fn preallocate_bytes(&self) -> u64 {
        PREALLOCATE_BYTES.min(self.segment_bytes_target)
    }

    fn lock_writer(&self) -> Result<std::sync::MutexGuard<'_, ()>, StoreError> {
        self.writer.lock().map_err(|_| StoreError::Poisoned)
    }

    fn read_state(&self) -> Result<std::sync::RwLockReadGuard<'_, Segments>, StoreError> {
        self.state.read().map_err(|_| StoreError::Poisoned)
    }

    fn write_state(&self) -> Result<std::sync::RwLockWriteGuard<'_, Segments>, StoreError> {
        self.state.write().map_err(|_| StoreError::Poisoned)
    }
}

/// What reading one segment found: its whole records, where they end, and whether a torn
/// record starts there.
struct Scanned {
    records: Vec<(u64, Location)>,
    /// The end of the last whole record: zeros or a torn record may follow it.
    end: u64,
    torn: bool,
}

/// Reads the records of the segment named `first` from its bytes; they end where only zeros are
/// left. A record that runs past the end of the file (its header, or the payload its length
/// announces), or that fails its CRC with nothing but zeros after it, is torn; a record that
/// fails its CRC with more written after it, or records out of order, are corruption.
fn scan(first: u64, bytes: &[u8], path: &Path) -> Result<Scanned, StoreError> {
    let mut records = Vec::new();
    let mut offset = 0usize;
    let mut expected = first;
    while offset < bytes.len() {
        if is_zero(&bytes[offset..]) {
            break;
        }
        let Some(header) = bytes.get(offset..offset + HEADER_BYTES) else {
            return Ok(torn(records, offset));
        };
        let payload_len = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(header[4..8].try_into().expect("4 bytes"));
        let index = u64::from_le_bytes(header[8..16].try_into().expect("8 bytes"));
        let end = offset + HEADER_BYTES + payload_len;
        if payload_len > PAYLOAD_BYTES_MAX || end > bytes.len() {
            return Ok(torn(records, offset));
        }
        let payload = &bytes[offset + HEADER_BYTES..end];
        if checksum(index, payload) != crc {
            if is_zero(&bytes[end..]) {
                return Ok(torn(records, offset));
            }
            return Err(corrupt(
                path,
                format!("the record at byte {offset} fails its checksum"),
            ));
        }
        if index != expected {
            return Err(corrupt(
                path,
                format!("the record at byte {offset} has index {index} where {expected} was due"),
            ));
        }
        records.push((
            index,
            Location {
                segment: first,
                offset: offset as u64,
                payload_len: payload_len as u32,
            },
        ));
        expected += 1;
        offset = end;
    }
    Ok(Scanned {
        records,
        end: offset as u64,
        torn: false,
    })
}

fn torn(records: Vec<(u64, Location)>, offset: usize) -> Scanned {
    Scanned {
        records,
        end: offset as u64,
        torn: true,
    }
}

fn is_zero(bytes: &[u8]) -> bool {
    bytes.iter().all(|byte| *byte == 0)
}

/// Reads a run of records that lie back to back in one segment and checks each.
fn read_run(
    state: &Segments,
    run: &[(u64, Location)],
    payloads: &mut Vec<(u64, Vec<u8>)>,
) -> Result<(), StoreError> {
    let (_, first) = run[0];
    let (_, last) = run[run.len() - 1];
    let segment = state
        .files
        .get(&first.segment)
        .ok_or_else(|| StoreError::Corrupt {
            what: "log".to_owned(),
            reason: format!("segment {} is gone", first.segment),
        })?;
    let end = last.offset + HEADER_BYTES as u64 + u64::from(last.payload_len);
    let mut bytes = vec![0; (end - first.offset) as usize];
    segment
        .file
        .read_at(&mut bytes, first.offset)
        .map_err(|error| io_error("read the log", error))?;
    for (index, location) in run {
        let start = (location.offset - first.offset) as usize;
        let header = &bytes[start..start + HEADER_BYTES];
        let payload =
            &bytes[start + HEADER_BYTES..start + HEADER_BYTES + location.payload_len as usize];
        let crc = u32::from_le_bytes(header[4..8].try_into().expect("4 bytes"));
        let stored_index = u64::from_le_bytes(header[8..16].try_into().expect("8 bytes"));
        if stored_index != *index || checksum(*index, payload) != crc {
            return Err(corrupt(
                &segment.path,
                format!("the record of index {index} no longer reads back"),
            ));
        }
        payloads.push((*index, payload.to_vec()));
    }
    Ok(())
}

/// `range` as a first index and an end index (exclusive; `None`: no end), or `None` when it
/// holds no index (BTreeMap's `range` panics on a start past the end).
pub(super) fn index_span(range: &impl RangeBounds<u64>) -> Option<(u64, Option<u64>)> {
    let start = match range.start_bound() {
        Bound::Included(start) => *start,
        Bound::Excluded(start) => start.checked_add(1)?,
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(end) => end.checked_add(1),
        Bound::Excluded(end) => Some(*end),
        Bound::Unbounded => None,
    };
    end.is_none_or(|end| start < end).then_some((start, end))
}

fn frame(index: u64, payload: &[u8], bytes: &mut Vec<u8>) -> Result<(), StoreError> {
    if payload.len() > PAYLOAD_BYTES_MAX {
        return Err(StoreError::Refused(format!(
            "a log entry of {} bytes is over the {PAYLOAD_BYTES_MAX}-byte limit",
            payload.len()
        )));
    }
    bytes.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&checksum(index, payload).to_le_bytes());
    bytes.extend_from_slice(&index.to_le_bytes());
    bytes.extend_from_slice(payload);
    Ok(())
}

fn checksum(index: u64, payload: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&index.to_le_bytes());
    hasher.update(payload);
    hasher.finalize()
}

fn segment_name(first: u64) -> String {
    format!("{first:020}{SEGMENT_SUFFIX}")
}

fn parse_segment_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(SEGMENT_SUFFIX)?;
    (digits.len() == 20 && digits.bytes().all(|byte| byte.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// Makes the directory's entries (segments created or unlinked) durable.
fn sync_dir(disk: &dyn Disk, dir: &Path) -> Result<(), StoreError> {
    disk.sync_dir(dir)
        .map_err(|error| io_error("fsync the log directory", error))
}

fn io_error(what: &str, error: io::Error) -> StoreError {
    StoreError::Io(format!("{what}: {error}"))
}

fn corrupt(path: &Path, reason: String) -> StoreError {
    StoreError::Corrupt {
        what: format!("log segment {}", path.display()),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use std::fs::{self, File};

    use super::*;
    use crate::store::RealDisk;

    fn open_real(dir: &Path, segment_bytes_target: u64) -> Result<SegmentLog, StoreError> {
        SegmentLog::open(Arc::new(RealDisk), dir, segment_bytes_target)
    }

    fn payload(index: u64) -> Vec<u8> {
        format!("entry {index}").into_bytes()
    }

    fn records(indexes: std::ops::RangeInclusive<u64>) -> Vec<(u64, Vec<u8>)> {
        indexes.map(|index| (index, payload(index))).collect()
    }

    fn indexes(log: &SegmentLog, range: impl RangeBounds<u64>) -> Vec<u64> {
        let read = log.read(range).unwrap();
        for (index, bytes) in &read {
            assert_eq!(*bytes, payload(*index));
        }
        read.into_iter().map(|(index, _)| index).collect()
    }

    fn segment_firsts(dir: &Path) -> Vec<u64> {
        let mut firsts: Vec<u64> = fs::read_dir(dir)
            .unwrap()
            .filter_map(|item| parse_segment_name(item.unwrap().file_name().to_str()?))
            .collect();
        firsts.sort();
        firsts
    }

    /// Segments of 64 bytes: three records of `entry N` (23 bytes each) fill one.
    const SMALL: u64 = 64;

    /// A log of entries 1 to 9 in three full segments, named 1, 4 and 7.
    fn three_full_segments() -> (tempfile::TempDir, SegmentLog) {
        let dir = tempfile::tempdir().unwrap();
        let log = open_real(dir.path(), SMALL).unwrap();
        for batch in [1..=3, 4..=6, 7..=9] {
            log.append(&records(batch), false).unwrap();
        }
        (dir, log)
    }

    #[test]
    fn appends_roll_into_new_segments_and_read_back_across_them() {
        let (dir, log) = three_full_segments();
        assert_eq!(segment_firsts(dir.path()), vec![1, 4, 7]);
        assert_eq!(indexes(&log, ..), (1..=9).collect::<Vec<_>>());
        assert_eq!(indexes(&log, 2..8), (2..8).collect::<Vec<_>>());
        assert_eq!(indexes(&log, 9..=20), vec![9]);
        assert_eq!(indexes(&log, 5..5), Vec::<u64>::new());
        assert_eq!(
            indexes(&log, (Bound::Excluded(8), Bound::Included(3))),
            Vec::<u64>::new()
        );
        drop(log);
        let log = open_real(dir.path(), SMALL).unwrap();
        assert_eq!(log.bounds().unwrap(), Some((1, 9)));
        assert_eq!(indexes(&log, ..), (1..=9).collect::<Vec<_>>());
    }

    /// A segment gone from the middle of the log (the directory damaged) refuses to open,
    /// naming the missing entries; the newest gone leaves the log ending before it, as a log
    /// those appends never reached would (a new segment's directory entry is fsynced before
    /// any record goes into it, so a power cut cannot lose one).
    #[test]
    fn a_missing_segment_in_the_middle_refuses_to_open_and_a_missing_newest_ends_the_log() {
        let (dir, log) = three_full_segments();
        drop(log);
        let middle = dir.path().join(segment_name(4));
        let kept = fs::read(&middle).unwrap();
        fs::remove_file(&middle).unwrap();
        let error = open_real(dir.path(), SMALL).map(drop).unwrap_err();
        let message = error.to_string();
        assert!(
            matches!(error, StoreError::Corrupt { .. })
                && message.contains("entries 4 to 6 are missing")
                && message.contains(&segment_name(7)),
            "{message}"
        );
        fs::write(&middle, kept).unwrap();
        fs::remove_file(dir.path().join(segment_name(7))).unwrap();
        let log = open_real(dir.path(), SMALL).unwrap();
        assert_eq!(log.bounds().unwrap(), Some((1, 6)));
    }

    /// A written append is readable at once and durable once its flush completes; the next
    /// append waits for that flush, so a crash can leave only the last append unsynced.
    #[test]
    fn a_write_is_readable_at_once_and_the_next_waits_for_its_flush() {
        let dir = tempfile::tempdir().unwrap();
        let log = Arc::new(open_real(dir.path(), SMALL).unwrap());
        let flush = log.write(&records(1..=3), false).unwrap().expect("a flush");
        assert_eq!(indexes(&log, ..), vec![1, 2, 3]);
        let next = {
            let log = log.clone();
            std::thread::spawn(move || {
                let flush = log.write(&records(4..=6), false).unwrap().expect("a flush");
                flush.complete().unwrap();
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(
            !next.is_finished(),
            "the next append was written before the flush"
        );
        assert_eq!(indexes(&log, ..), vec![1, 2, 3]);
        flush.complete().unwrap();
        next.join().unwrap();
        assert_eq!(indexes(&log, ..), (1..=6).collect::<Vec<_>>());
    }

    /// The flusher thread preallocates after answering a flush, with the next flush behind it
    /// in its queue; an append may by then hold the writer lock and wait for that next flush.
    /// Preallocating must not wait for the writer: that would wait for the flush behind it
    /// (found by the harness: a follower wedged for good after a SIGSTOP/SIGCONT).
    #[test]
    fn preallocating_never_waits_for_an_append_that_waits_for_a_flush() {
        let dir = tempfile::tempdir().unwrap();
        let log = Arc::new(open_real(dir.path(), 1 << 20).unwrap());
        let first = log.write(&records(1..=3), false).unwrap().expect("a flush");
        first.complete().unwrap();
        let second = log.write(&records(4..=6), false).unwrap().expect("a flush");
        let third = {
            let log = log.clone();
            std::thread::spawn(move || {
                let flush = log.write(&records(7..=9), false).unwrap().expect("a flush");
                flush.complete().unwrap();
            })
        };
        // The third append holds the writer lock, waiting for the second's flush.
        while log.writer.try_lock().is_ok() {
            std::thread::yield_now();
        }
        let (done, preallocated) = std::sync::mpsc::channel();
        {
            let log = log.clone();
            std::thread::spawn(move || done.send(log.preallocate().is_ok()));
        }
        let answer = preallocated.recv_timeout(std::time::Duration::from_secs(5));
        // Unwedge the threads either way, so a failure reports instead of hanging.
        second.complete().unwrap();
        third.join().unwrap();
        assert_eq!(
            answer,
            Ok(true),
            "preallocate waited for the writer, which waits for a flush queued behind it"
        );
        assert_eq!(indexes(&log, ..), (1..=9).collect::<Vec<_>>());
    }

    #[test]
    fn truncate_unlinks_later_segments_and_cuts_the_one_that_holds_the_index() {
        let (dir, log) = three_full_segments();
        log.truncate(5).unwrap();
        assert_eq!(segment_firsts(dir.path()), vec![1, 4]);
        assert_eq!(indexes(&log, ..), vec![1, 2, 3, 4]);
        log.append(&records(5..=5), false).unwrap();
        // A cut at a segment's first index removes that segment.
        log.truncate(4).unwrap();
        assert_eq!(segment_firsts(dir.path()), vec![1]);
        log.append(&records(4..=6), false).unwrap();
        drop(log);
        let log = open_real(dir.path(), SMALL).unwrap();
        assert_eq!(indexes(&log, ..), (1..=6).collect::<Vec<_>>());
        log.truncate(0).unwrap();
        assert_eq!(log.bounds().unwrap(), None);
        assert_eq!(segment_firsts(dir.path()), Vec::<u64>::new());
    }

    #[test]
    fn remove_through_unlinks_only_segments_wholly_at_or_below_the_index() {
        let (dir, log) = three_full_segments();
        log.remove_through(5).unwrap();
        assert_eq!(segment_firsts(dir.path()), vec![4, 7]);
        assert_eq!(log.bounds().unwrap(), Some((4, 9)));
        log.remove_through(9).unwrap();
        assert_eq!(log.bounds().unwrap(), None);
        // After everything went, the log starts again wherever the caller allows.
        log.append(&records(20..=21), true).unwrap();
        drop(log);
        let log = open_real(dir.path(), SMALL).unwrap();
        assert_eq!(indexes(&log, ..), vec![20, 21]);
    }

    #[test]
    fn an_append_that_overlaps_or_leaves_a_hole_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let log = open_real(dir.path(), SMALL).unwrap();
        log.append(&records(1..=2), false).unwrap();
        for (batch, gap_allowed) in [(2..=3, false), (2..=3, true), (4..=4, false)] {
            let refused = log.append(&records(batch), gap_allowed);
            assert!(
                matches!(refused, Err(StoreError::Refused(_))),
                "{refused:?}"
            );
        }
        let not_consecutive = vec![(3, payload(3)), (5, payload(5))];
        assert!(matches!(
            log.append(&not_consecutive, false),
            Err(StoreError::Refused(_))
        ));
        assert_eq!(indexes(&log, ..), vec![1, 2]);
        log.append(&records(10..=10), true).unwrap();
        assert_eq!(segment_firsts(dir.path()), vec![1, 10]);
    }

    #[test]
    fn a_crash_before_the_first_record_of_a_new_segment_leaves_an_empty_one_that_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let log = open_real(dir.path(), SMALL).unwrap();
        log.append(&records(1..=3), false).unwrap();
        drop(log);
        File::create(dir.path().join(segment_name(4))).unwrap();
        let log = open_real(dir.path(), SMALL).unwrap();
        log.append(&records(4..=4), false).unwrap();
        drop(log);
        File::create(dir.path().join(segment_name(9))).unwrap();
        let log = open_real(dir.path(), SMALL).unwrap();
        log.append(&records(5..=5), false).unwrap();
        assert_eq!(segment_firsts(dir.path()), vec![1, 4]);
        assert_eq!(indexes(&log, ..), (1..=5).collect::<Vec<_>>());
    }

    /// The bytes of the one segment of `dir`, named `first`.
    fn segment_bytes(dir: &Path, first: u64) -> Vec<u8> {
        fs::read(dir.join(segment_name(first))).unwrap()
    }

    #[test]
    fn appends_go_into_preallocated_zeros_and_open_cuts_the_zeros_off() {
        let dir = tempfile::tempdir().unwrap();
        let log = open_real(dir.path(), 1 << 30).unwrap();
        log.append(&records(1..=2), false).unwrap();
        let records_end = segment_bytes(dir.path(), 1).len() as u64;
        log.preallocate().unwrap();
        assert_eq!(
            segment_bytes(dir.path(), 1).len() as u64,
            records_end + PREALLOCATE_BYTES
        );
        // Enough room left: no more zeros.
        log.preallocate().unwrap();
        log.append(&records(3..=4), false).unwrap();
        let bytes = segment_bytes(dir.path(), 1);
        assert_eq!(bytes.len() as u64, records_end + PREALLOCATE_BYTES);
        assert_eq!(indexes(&log, ..), vec![1, 2, 3, 4]);
        drop(log);

        let log = open_real(dir.path(), 1 << 30).unwrap();
        assert_eq!(indexes(&log, ..), vec![1, 2, 3, 4]);
        let cut = segment_bytes(dir.path(), 1);
        assert!(cut.len() < bytes.len() && !cut.ends_with(&[0; 8]));
        // A truncate into the zeros' segment, then appends: only the new records are there.
        log.preallocate().unwrap();
        log.truncate(3).unwrap();
        log.append(&records(3..=3), false).unwrap();
        drop(log);
        let log = open_real(dir.path(), 1 << 30).unwrap();
        assert_eq!(indexes(&log, ..), vec![1, 2, 3]);
    }

    /// A crash during an append into preallocated zeros leaves the record half written with
    /// zeros after it (or its header alone): torn, cut off. Something written after a bad
    /// record is corruption, as without the zeros.
    #[test]
    fn a_record_torn_inside_the_zeros_is_cut_off_and_one_with_writes_after_it_is_corruption() {
        for (tear, corrupt) in [
            ("half zeroed", false),
            ("header only", false),
            ("bytes after", true),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let log = open_real(dir.path(), 1 << 30).unwrap();
            log.append(&records(1..=3), false).unwrap();
            let third_at = log.read_state().unwrap().records[&3].offset as usize;
            let third_end = third_at + HEADER_BYTES + payload(3).len();
            log.preallocate().unwrap();
            drop(log);
            let mut bytes = segment_bytes(dir.path(), 1);
            match tear {
                "half zeroed" => bytes[third_end - 4..third_end].fill(0),
                "header only" => bytes[third_at + HEADER_BYTES..third_end].fill(0),
                _ => {
                    bytes[third_end - 1] ^= 0xff;
                    bytes[third_end + 100] = 1;
                }
            }
            fs::write(dir.path().join(segment_name(1)), &bytes).unwrap();
            let opened = open_real(dir.path(), 1 << 30);
            if corrupt {
                assert!(matches!(opened, Err(StoreError::Corrupt { .. })), "{tear}");
                continue;
            }
            let log = opened.unwrap();
            assert_eq!(indexes(&log, ..), vec![1, 2], "{tear}");
            assert_eq!(segment_bytes(dir.path(), 1).len(), third_at, "{tear}");
            log.append(&records(3..=4), false).unwrap();
            assert_eq!(indexes(&log, ..), vec![1, 2, 3, 4], "{tear}");
        }
    }
}
