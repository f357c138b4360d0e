//! Snapshots on disk and on the wire, as streams: the `snapshot` file, the [`SnapshotData`]
//! openraft hands between the state machine and the network, and the files a follower gathers a
//! snapshot it is sent into ([`SnapshotInbox`]). No snapshot is ever held whole in memory:
//! building one encodes the machine straight into the file, installing one decodes it while
//! copying it into the file, a leader sends the file a chunk at a time, and a follower writes
//! each chunk to a file of its own as it comes.
//!
//! The `snapshot` file's payload (sealed as every durable file of ours, `files.rs`) is the
//! length of a header (`u32` LE), the header (the counter of snapshots built here and the
//! meta), then the machine's bytes (`Machine::encode_snapshot`).

use std::fmt;
use std::io::{self, BufReader, Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::files::{Files, Sealing, TMP_SUFFIX};
use super::{decode, encode, Database, SnapshotMeta, StoreError, SNAPSHOT_FILE};
use crate::machine::{CodecError, Machine};

/// Writes `machine`'s snapshot bytes (`Machine::encode_snapshot`) to `out` as they are encoded.
pub fn encode_machine_to(machine: &Machine, out: &mut impl Write) -> Result<(), CodecError> {
    machine.encode_snapshot_to(ToWrite(out))
}

/// How many bytes `Machine::encode_snapshot` gives for `machine`, counted by encoding it
/// without keeping a byte.
pub fn encoded_len(machine: &Machine) -> Result<u64, CodecError> {
    let mut counted = bincode::enc::write::SizeWriter::default();
    machine.encode_snapshot_to(&mut counted)?;
    Ok(counted.bytes_written as u64)
}

/// bincode's writer over an `io::Write` (bincode's own is not public).
struct ToWrite<'a, W>(&'a mut W);

impl<W: Write> bincode::enc::write::Writer for ToWrite<'_, W> {
    fn write(&mut self, bytes: &[u8]) -> Result<(), bincode::error::EncodeError> {
        self.0
            .write_all(bytes)
            .map_err(|inner| bincode::error::EncodeError::Io { inner, index: 0 })
    }
}

/// Decodes a machine from the `len` snapshot bytes `input` holds, read as they are decoded.
pub fn decode_machine_from(input: impl Read, len: u64) -> Result<Machine, CodecError> {
    Machine::decode_snapshot_from(BufReader::new(input), len)
}

/// The longest header (counter and meta) read back: far above a real one, whose membership
/// names a few members, so a damaged length is refused rather than believed.
const HEADER_BYTES_MAX: u32 = 1 << 20;
/// The name every received snapshot's file starts with.
const RECEIVED_PREFIX: &str = "snapshot-received-";

/// A snapshot's bytes (the machine's encoding), read as they are needed: from the `snapshot`
/// file past its header, from a snapshot received from the leader, or from memory.
pub struct SnapshotData {
    source: Source,
    len: u64,
    /// A received snapshot's file, removed once the snapshot is dropped.
    _received: Option<ReceivedFile>,
}

/// Where a snapshot's bytes come from: a reader, or one opened at the first read.
enum Source {
    Reader(Box<dyn Read + Send>),
    Later(Option<OpenLater>),
}

type OpenLater = Box<dyn FnOnce() -> io::Result<SnapshotData> + Send>;

impl SnapshotData {
    /// A snapshot of bytes in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> SnapshotData {
        SnapshotData {
            len: bytes.len() as u64,
            source: Source::Reader(Box::new(io::Cursor::new(bytes))),
            _received: None,
        }
    }

    /// A snapshot of `len` bytes that `open` opens at its first read, and never if it is not
    /// read: a snapshot just built here, of which openraft reads only the meta.
    fn later(
        len: u64,
        open: impl FnOnce() -> io::Result<SnapshotData> + Send + 'static,
    ) -> SnapshotData {
        SnapshotData {
            len,
            source: Source::Later(Some(Box::new(open))),
            _received: None,
        }
    }

    /// How many bytes the snapshot holds (read or not).
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True when the snapshot holds no bytes (no machine's snapshot is empty).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes not read yet, whole: for tests and small snapshots.
    pub fn into_bytes(mut self) -> io::Result<Vec<u8>> {
        let mut bytes = Vec::new();
        self.read_to_end(&mut bytes)?;
        Ok(bytes)
    }
}

impl Read for SnapshotData {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Source::Later(open) = &mut self.source {
            let open = open
                .take()
                .ok_or_else(|| io::Error::other("a snapshot failed to open before"))?;
            let opened = open()?;
            if opened.len != self.len {
                return Err(io::Error::other(format!(
                    "the snapshot holds {} bytes, not the {} it was built with",
                    opened.len, self.len
                )));
            }
            *self = opened;
        }
        match &mut self.source {
            Source::Reader(reader) => reader.read(buf),
            Source::Later(_) => unreachable!("opened above"),
        }
    }
}

impl fmt::Debug for SnapshotData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SnapshotData")
            .field("len", &self.len)
            .field("received", &self._received.is_some())
            .finish_non_exhaustive()
    }
}

/// Where a node gathers the snapshots it is sent: a file of its own in the data dir for each
/// transfer (named `snapshot-received-N.tmp`, so a restart removes what a crash left), removed
/// once the transfer is given up or the snapshot installed.
///
/// Gathering is the one storage work that openraft does not call, so a storage error in it
/// would not stop the node by itself: the first one is kept, and [`failed`](Self::failed)
/// resolves with it, for the node to stop on.
#[derive(Debug, Clone)]
pub struct SnapshotInbox {
    files: Files,
    next: Arc<AtomicU64>,
    failure: Arc<tokio::sync::watch::Sender<Option<String>>>,
}

impl SnapshotInbox {
    pub(super) fn new(files: Files) -> SnapshotInbox {
        SnapshotInbox {
            files,
            next: Arc::default(),
            failure: Arc::new(tokio::sync::watch::Sender::new(None)),
        }
    }

    /// Starts gathering a snapshot into a new, empty file. Blocking.
    pub fn receive(&self) -> Result<ReceivingSnapshot, StoreError> {
        let name = format!(
            "{RECEIVED_PREFIX}{}{TMP_SUFFIX}",
            self.next.fetch_add(1, Ordering::Relaxed)
        );
        self.kept(self.files.create_empty(&name))?;
        Ok(ReceivingSnapshot {
            file: ReceivedFile {
                files: self.files.clone(),
                name,
            },
            len: 0,
            inbox: self.clone(),
        })
    }

    /// Resolves with the first storage error met while gathering a snapshot.
    pub async fn failed(&self) -> String {
        let mut failure = self.failure.subscribe();
        // The inbox holds the sender, so it is never dropped while `self` lives.
        let kept = match failure.wait_for(Option::is_some).await {
            Ok(kept) => kept.clone(),
            Err(_) => None,
        };
        kept.unwrap_or_else(|| "the snapshot inbox was dropped".to_owned())
    }

    /// `result`, after keeping its error as the inbox's failure if it is the first.
    fn kept<T>(&self, result: Result<T, StoreError>) -> Result<T, StoreError> {
        if let Err(error) = &result {
            self.failure.send_if_modified(|failure| {
                let first = failure.is_none();
                if first {
                    *failure = Some(error.to_string());
                }
                first
            });
        }
        result
    }
}

/// A snapshot being gathered from its chunks, in a file of its own (removed if this is
/// dropped before `finish`).
#[derive(Debug)]
pub struct ReceivingSnapshot {
    file: ReceivedFile,
    len: u64,
    inbox: SnapshotInbox,
}

impl ReceivingSnapshot {
    /// Appends the next chunk. Blocking.
    pub fn append(&mut self, chunk: &[u8]) -> Result<(), StoreError> {
        self.inbox
            .kept(self.file.files.append(&self.file.name, chunk))?;
        self.len += chunk.len() as u64;
        Ok(())
    }

    /// How many bytes were gathered.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True before the first byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The gathered snapshot, read from its file; the file is removed once it is dropped.
    /// Blocking.
    pub fn finish(self) -> Result<SnapshotData, StoreError> {
        let reader = self
            .inbox
            .kept(self.file.files.open_plain(&self.file.name))?;
        Ok(SnapshotData {
            source: Source::Reader(Box::new(BufReader::new(reader).take(self.len))),
            len: self.len,
            _received: Some(self.file),
        })
    }
}

/// A received snapshot's file: removed when dropped.
#[derive(Debug)]
struct ReceivedFile {
    files: Files,
    name: String,
}

impl Drop for ReceivedFile {
    fn drop(&mut self) {
        if let Err(error) = self.files.remove_unsynced(&self.name) {
            tracing::warn!(%error, "a received snapshot's file could not be removed (a restart removes it)");
        }
    }
}

/// The `snapshot` file, as read back: the counter of snapshots built here, the meta, and the
/// machine's bytes.
pub(super) struct SnapshotFile {
    pub(super) counter: u64,
    pub(super) meta: SnapshotMeta,
    pub(super) data: SnapshotData,
}

/// Opens the `snapshot` file, checked whole, if there is one. Blocking.
pub(super) fn open(files: &Files) -> Result<Option<SnapshotFile>, StoreError> {
    let Some((reader, len)) = files.open_payload(SNAPSHOT_FILE)? else {
        return Ok(None);
    };
    let mut reader = BufReader::new(reader);
    let runs_past = || files.corrupt(SNAPSHOT_FILE, "the meta's length runs past the end");
    let mut length = [0; 4];
    reader.read_exact(&mut length).map_err(|_| runs_past())?;
    let header_len = u32::from_le_bytes(length);
    let data_len = len
        .checked_sub(4 + u64::from(header_len))
        .filter(|_| header_len <= HEADER_BYTES_MAX)
        .ok_or_else(runs_past)?;
    let mut header = vec![0; header_len as usize];
    reader.read_exact(&mut header).map_err(|_| runs_past())?;
    let (counter, meta): (u64, SnapshotMeta) = decode(&header, "snapshot meta")?;
    Ok(Some(SnapshotFile {
        counter,
        meta,
        data: SnapshotData {
            source: Source::Reader(Box::new(reader.take(data_len))),
            len: data_len,
            _received: None,
        },
    }))
}

/// Replaces the `snapshot` file with the counter, `meta`, and the machine's bytes `write_data`
/// writes; durable when this returns. Returns what `write_data` returned. Blocking.
pub(super) fn replace<T>(
    files: &Files,
    counter: u64,
    meta: &SnapshotMeta,
    write_data: impl FnOnce(&mut Sealing<'_>) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let header = encode(&(counter, meta), "snapshot meta")?;
    let length = u32::try_from(header.len())
        .ok()
        .filter(|length| *length <= HEADER_BYTES_MAX)
        .ok_or_else(|| StoreError::Refused(format!("a snapshot meta of {} bytes", header.len())))?;
    files.replace_streamed(SNAPSHOT_FILE, |out| {
        out.write_all(&length.to_le_bytes())
            .and_then(|()| out.write_all(&header))
            .map_err(|error| files.io("write", SNAPSHOT_FILE, error))?;
        write_data(out)
    })
}

/// Replaces the snapshot file with a snapshot of `machine` at `meta`, built here, durably,
/// under the snapshot-write lock; counts it. Returns the snapshot, which opens the file only
/// if it is read; or, when a snapshot covering more of the log was persisted meanwhile (a slow
/// build racing an install), writes nothing and returns one that encodes `machine` only if it
/// is read. Blocking.
///
/// The file's header keeps a counter of the snapshots built here beside the meta: earlier
/// builds made snapshot ids of it, and read the header as (counter, meta), so a data dir stays
/// readable by the release before this one.
pub(super) fn persist_built(
    database: &Database,
    meta: &SnapshotMeta,
    machine: Machine,
) -> Result<SnapshotData, StoreError> {
    let mut written = database
        .snapshot_write
        .lock()
        .map_err(|_| StoreError::Poisoned)?;
    if written.last_log_id > meta.last_log_id {
        let len = encoded_len(&machine)?;
        return Ok(SnapshotData::later(len, move || {
            Ok(SnapshotData::from_bytes(
                machine.encode_snapshot().map_err(io::Error::other)?,
            ))
        }));
    }
    let counter = written.counter.saturating_add(1);
    let len = replace(&database.files, counter, meta, |out| {
        let start = out.len();
        encode_machine_to(&machine, out)?;
        Ok(out.len() - start)
    })?;
    *written = SnapshotWritten {
        counter,
        last_log_id: meta.last_log_id,
    };
    let (files, meta) = (database.files.clone(), meta.clone());
    Ok(SnapshotData::later(len, move || {
        match open(&files).map_err(io::Error::other)? {
            Some(file) if file.meta == meta => Ok(file.data),
            _ => Err(io::Error::other(format!(
                "the snapshot built at {meta} was replaced before it was read"
            ))),
        }
    }))
}

/// Replaces the snapshot file with `data`, a snapshot received from the leader, at `meta`,
/// durably, under the snapshot-write lock, and returns its machine: the bytes are decoded as
/// they are copied into the file, and bytes that do not decode are an error that leaves the
/// file as it was. openraft already decided the snapshot is newer. Blocking.
pub(super) fn persist_received(
    database: &Database,
    meta: &SnapshotMeta,
    data: SnapshotData,
) -> Result<Machine, StoreError> {
    let mut written = database
        .snapshot_write
        .lock()
        .map_err(|_| StoreError::Poisoned)?;
    let len = data.len();
    let machine = replace(&database.files, written.counter, meta, |out| {
        Ok(decode_machine_from(Tee { input: data, out }, len)?)
    })?;
    written.last_log_id = meta.last_log_id;
    Ok(machine)
}

/// A reader that writes what it reads to `out`.
struct Tee<'a, 'b> {
    input: SnapshotData,
    out: &'a mut Sealing<'b>,
}

impl Read for Tee<'_, '_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let read = self.input.read(buf)?;
        self.out.write_all(&buf[..read])?;
        Ok(read)
    }
}

/// What the snapshot file holds: the counter of snapshots built here and the last log id it
/// covers (the durable snapshot the log's purge goes by). Kept under the snapshot-write lock,
/// so that a write never reads the file back.
#[derive(Debug, Default)]
pub(super) struct SnapshotWritten {
    pub(super) counter: u64,
    pub(super) last_log_id: Option<super::LogId>,
}
