//! The store's own small files: the vote, the last purged log id, the committed log id, the
//! store format and the snapshot, each one file in the data dir. They replaced sled (store
//! format 3) because sled's flush does not reach stable storage on a power loss (on Linux it
//! calls `sync_file_range`, which forces neither the file's metadata nor the device's cache).
//!
//! A durable file is replaced whole: the new bytes go to `NAME.tmp`, which is fdatasynced,
//! renamed over `NAME`, and the directory fsynced, before the write returns. A power cut
//! anywhere in that leaves the old file or the new one, never a mix, and a file that is read
//! back was synced whole: one whose checksum fails is corruption, and the store refuses to open
//! naming it. The committed log id is the one exception: it is written in place and never
//! synced (losing it only means re-applying less at startup, see `LogStore::save_committed`),
//! so a torn or missing one reads as absent.
//!
//! Every file operation of the store goes through [`Disk`], these files' and the log segments'
//! (`segments.rs`) alike, so that a test or the simulator can put the store on a [`SimDisk`],
//! cut power between any two operations, and reopen the store on what survived
//! (`power_tests::power_cut_at_every_step_keeps_every_acknowledged_write`).

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::mutation::{self, Mutation};
use super::{decode, encode, StoreError, SNAPSHOT_FILE};

/// What every file of ours starts with.
const MAGIC: &[u8; 4] = b"BTNF";
/// Magic, payload length, checksum.
const HEADER_BYTES: usize = 12;
/// The suffix of a file being written, before it is renamed into place.
pub(super) const TMP_SUFFIX: &str = ".tmp";
/// How much of a streamed file is gathered before it is written out.
const STREAM_BUFFER_BYTES: usize = 1 << 20;
/// A payload's length is a `u32` in the header.
const PAYLOAD_BYTES_MAX: u64 = u32::MAX as u64;

/// A file opened for reading.
pub trait DiskReader: Read + Seek + Send {}

/// A durable file's payload, checked: a reader at its first byte, and its length.
pub(super) type Payload = (Box<dyn DiskReader>, u64);

impl<T: Read + Seek + Send> DiskReader for T {}

/// The file operations the store's small files need. Paths are absolute (under the data dir).
pub trait Disk: fmt::Debug + Send + Sync + 'static {
    /// The whole content of `path`, or `None` if there is no such file.
    fn read(&self, path: &Path) -> io::Result<Option<Vec<u8>>>;
    /// Creates `path`, or truncates it, and writes `parts` one after another. Not durable.
    fn write(&self, path: &Path, parts: &[&[u8]]) -> io::Result<()>;
    /// Appends `bytes` to `path`. Not durable.
    fn append(&self, path: &Path, bytes: &[u8]) -> io::Result<()>;
    /// `path` opened for reading at its start, or `None` if there is no such file. The reader
    /// goes on reading the file it opened when another is renamed over `path`.
    fn open(&self, path: &Path) -> io::Result<Option<Box<dyn DiskReader>>>;
    /// Writes `bytes` at the start of `path` (created if absent), leaving any bytes after them
    /// and the file's size as they were. Not durable.
    fn overwrite(&self, path: &Path, bytes: &[u8]) -> io::Result<()>;
    /// Makes `path`'s content durable (`fdatasync`).
    fn sync(&self, path: &Path) -> io::Result<()>;
    /// Renames `from` over `to` (the same directory). Durable once the directory is synced.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Removes the file `path`; absent is fine. Durable once the directory is synced.
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// Makes `dir`'s entries (files created, renamed, removed) durable (`fsync`).
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// The names of the entries of `dir`.
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// Creates `dir` (and its parents) unless it exists; says whether it did. Durable once
    /// its parent is synced.
    fn create_dir(&self, dir: &Path) -> io::Result<bool>;
    /// Creates `path` empty (truncating it if it exists) for positioned reads and writes.
    fn create_file(&self, path: &Path) -> io::Result<Arc<dyn DiskFile>>;
    /// `path` opened for positioned reads and writes, or `None` if there is no such file.
    fn open_file(&self, path: &Path) -> io::Result<Option<Arc<dyn DiskFile>>>;
}

/// A file open for positioned reads and writes (a log segment). It stays the file it opened
/// when its name is removed or another is renamed over it.
pub trait DiskFile: fmt::Debug + Send + Sync {
    /// Writes all of `bytes` at `offset`, growing the file if need be. Not durable.
    fn write_at(&self, bytes: &[u8], offset: u64) -> io::Result<()>;
    /// Fills `buf` from `offset`; past the end of the file is an error.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Cuts the file to `len` bytes, or extends it with zeros. Not durable.
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Makes the file's content durable (`fdatasync`).
    fn sync_data(&self) -> io::Result<()>;
    /// Makes the file's content and metadata durable (`fsync`).
    fn sync_all(&self) -> io::Result<()>;
}

impl DiskFile for File {
    fn write_at(&self, bytes: &[u8], offset: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::write_all_at(self, bytes, offset)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(self, buf, offset)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        File::set_len(self, len)
    }

    fn sync_data(&self) -> io::Result<()> {
        File::sync_data(self)
    }

    fn sync_all(&self) -> io::Result<()> {
        File::sync_all(self)
    }
}

/// The real file system.
#[derive(Debug, Clone, Copy, Default)]
pub struct RealDisk;

impl Disk for RealDisk {
    fn read(&self, path: &Path) -> io::Result<Option<Vec<u8>>> {
        match fs::read(path) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(error),
        }
    }

    fn write(&self, path: &Path, parts: &[&[u8]]) -> io::Result<()> {
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        for part in parts {
            file.write_all(part)?;
        }
        Ok(())
    }

    fn append(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        OpenOptions::new().append(true).open(path)?.write_all(bytes)
    }

    fn open(&self, path: &Path) -> io::Result<Option<Box<dyn DiskReader>>> {
        match File::open(path) {
            Ok(file) => Ok(Some(Box::new(file))),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(error),
        }
    }

    fn overwrite(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?
            .write_all_at(bytes, 0)
    }

    fn sync(&self, path: &Path) -> io::Result<()> {
        File::open(path)?.sync_data()
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        match fs::remove_file(path) {
            Err(error) if error.kind() != io::ErrorKind::NotFound => Err(error),
            _ => Ok(()),
        }
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        fs::read_dir(dir)?
            .map(|entry| Ok(entry?.file_name().to_string_lossy().into_owned()))
            .collect()
    }

    fn create_dir(&self, dir: &Path) -> io::Result<bool> {
        if dir.exists() {
            return Ok(false);
        }
        fs::create_dir_all(dir)?;
        Ok(true)
    }

    fn create_file(&self, path: &Path) -> io::Result<Arc<dyn DiskFile>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        Ok(Arc::new(file))
    }

    fn open_file(&self, path: &Path) -> io::Result<Option<Arc<dyn DiskFile>>> {
        match OpenOptions::new().read(true).write(true).open(path) {
            Ok(file) => Ok(Some(Arc::new(file))),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(error),
        }
    }
}

/// The store's small files in one data dir.
#[derive(Debug, Clone)]
pub(super) struct Files {
    dir: PathBuf,
    disk: Arc<dyn Disk>,
}

impl Files {
    /// The files in `dir`, which exists. Forgets files a crash left half written.
    pub(super) fn open(dir: &Path, disk: Arc<dyn Disk>) -> Result<Files, StoreError> {
        let files = Files {
            dir: dir.to_owned(),
            disk,
        };
        for name in files.list()? {
            if name.ends_with(TMP_SUFFIX) {
                files
                    .disk
                    .remove(&files.path(&name))
                    .map_err(|error| files.io("remove", &name, error))?;
            }
        }
        Ok(files)
    }

    /// The names in the data dir.
    /// The disk the files are on.
    pub(super) fn disk(&self) -> Arc<dyn Disk> {
        self.disk.clone()
    }

    pub(super) fn list(&self) -> Result<Vec<String>, StoreError> {
        self.disk
            .list(&self.dir)
            .map_err(|error| self.io("list", "the data dir", error))
    }

    /// The value in the durable file `name`, if there is one; a file that does not check out
    /// is corruption, named in the error.
    pub(super) fn read<T: DeserializeOwned>(&self, name: &str) -> Result<Option<T>, StoreError> {
        let Some(bytes) = self.read_bytes(name)? else {
            return Ok(None);
        };
        let payload = unseal(&bytes).map_err(|reason| self.corrupt(name, reason))?;
        decode(payload, &self.describe(name)).map(Some)
    }

    /// Replaces the durable file `name` with `value`: durable when this returns.
    pub(super) fn replace<T: Serialize>(&self, name: &str, value: &T) -> Result<(), StoreError> {
        let payload = encode(value, &self.describe(name))?;
        self.replace_parts(name, &[&payload])
    }

    /// Creates the file `name`, empty (or empties it). Not durable.
    pub(super) fn create_empty(&self, name: &str) -> Result<(), StoreError> {
        self.disk
            .write(&self.path(name), &[])
            .map_err(|error| self.io("create", name, error))
    }

    /// Appends `bytes` to the file `name`. Not durable.
    pub(super) fn append(&self, name: &str, bytes: &[u8]) -> Result<(), StoreError> {
        self.disk
            .append(&self.path(name), bytes)
            .map_err(|error| self.io("write", name, error))
    }

    /// The file `name` (not a sealed one) opened for reading at its start.
    pub(super) fn open_plain(&self, name: &str) -> Result<Box<dyn DiskReader>, StoreError> {
        self.disk
            .open(&self.path(name))
            .and_then(|file| file.ok_or_else(|| io::ErrorKind::NotFound.into()))
            .map_err(|error| self.io("open", name, error))
    }

    /// Removes the file `name`, not durably: for files a restart removes anyway.
    pub(super) fn remove_unsynced(&self, name: &str) -> Result<(), StoreError> {
        self.disk
            .remove(&self.path(name))
            .map_err(|error| self.io("remove", name, error))
    }

    /// Removes the durable file `name`: durable when this returns.
    pub(super) fn remove(&self, name: &str) -> Result<(), StoreError> {
        self.disk
            .remove(&self.path(name))
            .map_err(|error| self.io("remove", name, error))?;
        self.sync_dir()
    }

    /// Writes `value` over the start of the file `name`, without syncing it: a power cut may
    /// lose it or tear it, and `read_unsynced` then finds nothing. In place, never truncating:
    /// one positioned write, no change of the file's blocks after the first.
    pub(super) fn write_unsynced<T: Serialize>(
        &self,
        name: &str,
        value: &T,
    ) -> Result<(), StoreError> {
        let payload = encode(value, &self.describe(name))?;
        let mut sealed = header(&[&payload]).to_vec();
        sealed.extend_from_slice(&payload);
        self.disk
            .overwrite(&self.path(name), &sealed)
            .map_err(|error| self.io("write", name, error))
    }

    /// The value of a file written by `write_unsynced`; torn, cut short or missing reads as
    /// `None`.
    pub(super) fn read_unsynced<T: DeserializeOwned>(
        &self,
        name: &str,
    ) -> Result<Option<T>, StoreError> {
        let Some(mut bytes) = self.read_bytes(name)? else {
            return Ok(None);
        };
        // What a longer earlier value left after this one.
        if let Some(length) = bytes.get(4..8) {
            let length = u32::from_le_bytes(length.try_into().expect("4 bytes")) as usize;
            bytes.truncate(HEADER_BYTES.saturating_add(length));
        }
        match unseal(&bytes).and_then(|payload| {
            decode(payload, &self.describe(name)).map_err(|error| error.to_string())
        }) {
            Ok(value) => Ok(Some(value)),
            Err(reason) => {
                tracing::warn!(file = %self.path(name).display(), %reason, "an unsynced file was torn by a crash; reading it as absent");
                Ok(None)
            }
        }
    }

    /// Replaces the durable file `name` with `parts` one after another, sealed as one payload.
    pub(super) fn replace_parts(&self, name: &str, parts: &[&[u8]]) -> Result<(), StoreError> {
        self.replace_streamed(name, |out| {
            parts
                .iter()
                .try_for_each(|part| out.write_all(part))
                .map_err(|error| self.io("write", name, error))
        })
    }

    /// Replaces the durable file `name` with the payload `write` writes to the [`Sealing`] it
    /// is given, streamed to disk a megabyte at a time rather than held whole: durable when
    /// this returns, as `replace` is. If `write` fails, the file is left as it was.
    pub(super) fn replace_streamed<T>(
        &self,
        name: &str,
        write: impl FnOnce(&mut Sealing<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let tmp = format!("{name}{TMP_SUFFIX}");
        let mut sealing = Sealing {
            files: self,
            tmp: self.path(&tmp),
            buffer: Vec::new(),
            hasher: crc32fast::Hasher::new(),
            length: 0,
            created: false,
        };
        let written = write(&mut sealing).and_then(|value| {
            sealing
                .finish()
                .map_err(|error| self.io("write", &tmp, error))?;
            Ok(value)
        });
        let value = match written {
            Ok(value) => value,
            Err(error) => {
                // Best effort: a leftover is removed when the store opens anyway.
                let _ = self.disk.remove(&sealing.tmp);
                return Err(error);
            }
        };
        let synced = !(name == SNAPSHOT_FILE && mutation::active(Mutation::SnapshotNotSynced));
        if synced {
            self.disk
                .sync(&sealing.tmp)
                .map_err(|error| self.io("fdatasync", &tmp, error))?;
        }
        self.disk
            .rename(&sealing.tmp, &self.path(name))
            .map_err(|error| self.io("rename into place", name, error))?;
        if synced {
            self.sync_dir()?;
        }
        Ok(value)
    }

    /// The payload of the durable file `name`, checked whole, as a reader at its first byte,
    /// with its length; `None` if there is no such file. The payload is read twice (to check
    /// it, then by the caller) and never held whole; the reader keeps the file it checked when
    /// another is renamed over `name`.
    pub(super) fn open_payload(&self, name: &str) -> Result<Option<Payload>, StoreError> {
        let Some(mut file) = self
            .disk
            .open(&self.path(name))
            .map_err(|error| self.io("open", name, error))?
        else {
            return Ok(None);
        };
        let read = |error| self.io("read", name, error);
        let mut header = Vec::with_capacity(HEADER_BYTES);
        (&mut file)
            .take(HEADER_BYTES as u64)
            .read_to_end(&mut header)
            .map_err(read)?;
        let (length, checksum) =
            parse_header(&header).map_err(|reason| self.corrupt(name, reason))?;
        let mut hasher = crc32fast::Hasher::new();
        let mut chunk = vec![0; 64 << 10];
        let mut payload = 0_u64;
        loop {
            let got = file.read(&mut chunk).map_err(read)?;
            if got == 0 {
                break;
            }
            hasher.update(&chunk[..got]);
            payload += got as u64;
        }
        check_payload(payload, length, hasher.finalize(), checksum)
            .map_err(|reason| self.corrupt(name, reason))?;
        file.seek(SeekFrom::Start(HEADER_BYTES as u64))
            .map_err(read)?;
        Ok(Some((file, payload)))
    }

    /// The error for a durable file whose content does not check out.
    pub(super) fn corrupt(&self, name: &str, reason: impl fmt::Display) -> StoreError {
        StoreError::Corrupt {
            what: self.describe(name),
            reason: format!("{reason}; the file was synced whole, so this is damage on disk (restore the node from a backup or re-add it empty)"),
        }
    }

    fn read_bytes(&self, name: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.disk
            .read(&self.path(name))
            .map_err(|error| self.io("read", name, error))
    }

    fn sync_dir(&self) -> Result<(), StoreError> {
        self.disk
            .sync_dir(&self.dir)
            .map_err(|error| self.io("fsync", "the data dir", error))
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn describe(&self, name: &str) -> String {
        self.path(name).display().to_string()
    }

    pub(super) fn io(&self, verb: &str, name: &str, error: io::Error) -> StoreError {
        StoreError::Io(format!("{verb} {}: {error}", self.describe(name)))
    }
}

/// Magic, the payload's length and its checksum.
fn header(parts: &[&[u8]]) -> [u8; HEADER_BYTES] {
    let mut hasher = crc32fast::Hasher::new();
    let mut length = 0_usize;
    for part in parts {
        hasher.update(part);
        length += part.len();
    }
    seal(length as u64, hasher.finalize())
}

/// The header of a payload of `length` bytes with `checksum`.
fn seal(length: u64, checksum: u32) -> [u8; HEADER_BYTES] {
    let mut header = [0; HEADER_BYTES];
    header[..4].copy_from_slice(MAGIC);
    header[4..8].copy_from_slice(&u32::try_from(length).unwrap_or(u32::MAX).to_le_bytes());
    header[8..].copy_from_slice(&checksum.to_le_bytes());
    header
}

/// The payload length and checksum a header announces, or why it is not a header.
fn parse_header(header: &[u8]) -> Result<(u64, u32), String> {
    let Some(header) = header.first_chunk::<HEADER_BYTES>() else {
        return Err(format!("{} bytes, shorter than a header", header.len()));
    };
    if &header[..4] != MAGIC {
        return Err("not a Baton store file (bad magic)".to_owned());
    }
    let length = u32::from_le_bytes(header[4..8].try_into().expect("4 bytes"));
    let checksum = u32::from_le_bytes(header[8..].try_into().expect("4 bytes"));
    Ok((u64::from(length), checksum))
}

/// Whether a payload of `length` bytes hashing to `hashed` is the one its header announced.
fn check_payload(length: u64, announced: u64, hashed: u32, checksum: u32) -> Result<(), String> {
    if length != announced {
        return Err(format!(
            "{length} bytes of payload where the header says {announced}"
        ));
    }
    if hashed != checksum {
        return Err("checksum mismatch".to_owned());
    }
    Ok(())
}

/// The payload of sealed bytes, or why they do not check out.
fn unseal(bytes: &[u8]) -> Result<&[u8], String> {
    let (length, checksum) = parse_header(bytes)?;
    let payload = &bytes[HEADER_BYTES..];
    check_payload(
        payload.len() as u64,
        length,
        crc32fast::hash(payload),
        checksum,
    )?;
    Ok(payload)
}

/// A durable file's payload being written by `Files::replace_streamed`: a writer that gathers
/// a megabyte, then appends it to the file being written, checksumming as it goes. A payload
/// that fits in the buffer is written in one go, header first, as `replace` writes.
pub(super) struct Sealing<'a> {
    files: &'a Files,
    tmp: PathBuf,
    buffer: Vec<u8>,
    hasher: crc32fast::Hasher,
    length: u64,
    /// The file exists, with a placeholder where the header goes.
    created: bool,
}

impl Sealing<'_> {
    /// How many payload bytes have been written so far.
    pub(super) fn len(&self) -> u64 {
        self.length
    }

    fn flush_buffer(&mut self) -> io::Result<()> {
        if !self.created {
            self.files
                .disk
                .write(&self.tmp, &[&[0; HEADER_BYTES], &self.buffer])?;
            self.created = true;
        } else {
            self.files.disk.append(&self.tmp, &self.buffer)?;
        }
        self.buffer.clear();
        Ok(())
    }

    /// Writes what is left and the header over its placeholder.
    fn finish(&mut self) -> io::Result<()> {
        if self.length > PAYLOAD_BYTES_MAX {
            return Err(io::Error::other(format!(
                "a payload of {} bytes, over the {PAYLOAD_BYTES_MAX} a file holds",
                self.length
            )));
        }
        let header = seal(self.length, self.hasher.clone().finalize());
        if !self.created {
            self.created = true;
            return self.files.disk.write(&self.tmp, &[&header, &self.buffer]);
        }
        self.flush_buffer()?;
        self.files.disk.overwrite(&self.tmp, &header)
    }
}

impl Write for Sealing<'_> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.hasher.update(bytes);
        self.length += bytes.len() as u64;
        self.buffer.extend_from_slice(bytes);
        if self.buffer.len() >= STREAM_BUFFER_BYTES {
            self.flush_buffer()?;
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

pub mod sim {
    //! A disk in memory that keeps what is durable apart from what is only written, and can
    //! crash or cut power: the store's disk in the power-cut tests and in the simulator
    //! (`baton-jepsen sim`).

    use std::collections::BTreeMap;
    use std::sync::Mutex;

    use super::*;

    /// One file's bytes: as last synced, and as written since.
    #[derive(Debug, Clone, Default)]
    struct Inode {
        durable: Option<Vec<u8>>,
        current: Vec<u8>,
    }

    impl Inode {
        fn unsynced(&self) -> bool {
            self.durable.as_ref() != Some(&self.current)
        }
    }

    #[derive(Debug, Clone, Default)]
    struct State {
        inodes: Vec<Inode>,
        /// Names as processes see them, and as last synced with their directory.
        names: BTreeMap<PathBuf, usize>,
        durable_names: BTreeMap<PathBuf, usize>,
        /// Operations done so far.
        steps: usize,
        /// Operations refused so far.
        failures: usize,
        /// Every operation after this many fails (power is being cut).
        fail_after: Option<usize>,
        /// The disk was crashed or its power cut: every operation fails. What survived is on
        /// the disk that `crash` or `power_cut` returned.
        gone: bool,
    }

    impl State {
        /// The inode named `path`, made (empty) if there is none.
        fn inode_for(&mut self, path: &Path) -> usize {
            if let Some(inode) = self.names.get(path) {
                return *inode;
            }
            self.inodes.push(Inode::default());
            self.names.insert(path.to_owned(), self.inodes.len() - 1);
            self.inodes.len() - 1
        }

        fn inode(&mut self, inode: usize) -> &mut Inode {
            &mut self.inodes[inode]
        }
    }

    /// A simulated disk: files are durable only once synced, and names only once their
    /// directory is synced (the rules of a lazy file system). Directories always exist.
    /// Clones share the disk.
    #[derive(Debug, Clone, Default)]
    pub struct SimDisk {
        state: Arc<Mutex<State>>,
    }

    impl SimDisk {
        /// How many operations were done.
        pub fn steps(&self) -> usize {
            self.lock().steps
        }

        /// From now on, every operation after the first `steps` fails, as if power was being
        /// cut in the middle of a store call, or the disk had died.
        pub fn fail_after(&self, steps: usize) {
            self.lock().fail_after = Some(steps);
        }

        /// How many operations failed.
        pub fn failures(&self) -> usize {
            self.lock().failures
        }

        /// The process using the disk is killed: everything it wrote stays as it was, synced
        /// or not (in the page cache). Returns the disk a restarted process finds; this one
        /// fails every operation from now on, so that nothing the dead process left running
        /// writes into its successor's files.
        pub fn crash(&self) -> SimDisk {
            self.successor(|_| {})
        }

        /// Power is cut: what was synced survives; of what was not, `survive(n)` decides, one
        /// change at a time, how much reached the disk anyway, from 0 (none of it) to `n` (all
        /// of it). A file's unsynced bytes are a change of `n` steps: in between, its new bytes
        /// reached the disk up to some point and its old ones are left after it (a torn
        /// write). An unsynced name (created, renamed or removed) is a change of 1 step.
        /// Returns the disk the machine finds when it comes back; this one fails every
        /// operation from now on.
        pub fn power_cut(&self, mut survive: impl FnMut(u64) -> u64) -> SimDisk {
            self.successor(|after| after.lose_unsynced(&mut survive))
        }

        /// The disk as the next process finds it: this one's state, changed by `change`,
        /// working again and with no operation refused yet. This one is gone from now on.
        fn successor(&self, change: impl FnOnce(&mut State)) -> SimDisk {
            let mut state = self.lock();
            let mut after = state.clone();
            state.gone = true;
            after.fail_after = None;
            after.failures = 0;
            change(&mut after);
            SimDisk {
                state: Arc::new(Mutex::new(after)),
            }
        }
    }

    impl State {
        /// What a power cut leaves: see `SimDisk::power_cut`.
        fn lose_unsynced(&mut self, survive: &mut impl FnMut(u64) -> u64) {
            for inode in self.inodes.iter_mut().filter(|inode| inode.unsynced()) {
                let old = inode.durable.clone().unwrap_or_default();
                let new = &inode.current;
                let same = old.iter().zip(new).take_while(|(a, b)| a == b).count();
                let steps = (new.len() - same) as u64 + 1;
                let kept = survive(steps).min(steps);
                let bytes = if kept == 0 {
                    inode.durable.clone()
                } else if kept == steps {
                    Some(new.clone())
                } else {
                    let reached = same + kept as usize;
                    let mut bytes = new[..reached].to_vec();
                    if old.len() > reached {
                        bytes.extend_from_slice(&old[reached..]);
                    }
                    Some(bytes)
                };
                inode.current = bytes.clone().unwrap_or_default();
                inode.durable = bytes;
            }
            let State {
                names,
                durable_names,
                ..
            } = self;
            let changed: Vec<PathBuf> = names
                .keys()
                .chain(durable_names.keys())
                .filter(|path| names.get(*path) != durable_names.get(*path))
                .cloned()
                .collect();
            let mut surviving = durable_names.clone();
            for path in changed {
                if survive(1) == 1 {
                    match names.get(&path) {
                        Some(inode) => surviving.insert(path, *inode),
                        None => surviving.remove(&path),
                    };
                }
            }
            *names = surviving.clone();
            *durable_names = surviving;
        }
    }

    impl SimDisk {
        fn lock(&self) -> std::sync::MutexGuard<'_, State> {
            self.state
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
        }

        /// Counts an operation, or fails it if power is off.
        fn step(&self) -> io::Result<std::sync::MutexGuard<'_, State>> {
            let mut state = self.lock();
            let refusal = if state.gone {
                Some("the disk is gone (a crash or a power cut)")
            } else if state.fail_after.is_some_and(|after| state.steps >= after) {
                Some("the disk failed (or its power is being cut)")
            } else {
                None
            };
            if let Some(refusal) = refusal {
                state.failures += 1;
                return Err(io::Error::other(refusal));
            }
            state.steps += 1;
            Ok(state)
        }
    }

    /// A file of a [`SimDisk`], open.
    #[derive(Debug)]
    struct SimFile {
        disk: SimDisk,
        inode: usize,
    }

    impl DiskFile for SimFile {
        fn write_at(&self, bytes: &[u8], offset: u64) -> io::Result<()> {
            let mut state = self.disk.step()?;
            let current = &mut state.inode(self.inode).current;
            let end = offset as usize + bytes.len();
            if current.len() < end {
                current.resize(end, 0);
            }
            current[offset as usize..end].copy_from_slice(bytes);
            Ok(())
        }

        fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
            let mut state = self.disk.step()?;
            let current = &state.inode(self.inode).current;
            let bytes = usize::try_from(offset)
                .ok()
                .and_then(|start| current.get(start..start.checked_add(buf.len())?))
                .ok_or(io::ErrorKind::UnexpectedEof)?;
            buf.copy_from_slice(bytes);
            Ok(())
        }

        fn set_len(&self, len: u64) -> io::Result<()> {
            let mut state = self.disk.step()?;
            state.inode(self.inode).current.resize(len as usize, 0);
            Ok(())
        }

        fn sync_data(&self) -> io::Result<()> {
            let mut state = self.disk.step()?;
            let inode = state.inode(self.inode);
            inode.durable = Some(inode.current.clone());
            Ok(())
        }

        fn sync_all(&self) -> io::Result<()> {
            self.sync_data()
        }
    }

    impl Disk for SimDisk {
        fn read(&self, path: &Path) -> io::Result<Option<Vec<u8>>> {
            let state = self.step()?;
            Ok(state
                .names
                .get(path)
                .map(|inode| state.inodes[*inode].current.clone()))
        }

        fn write(&self, path: &Path, parts: &[&[u8]]) -> io::Result<()> {
            let mut state = self.step()?;
            let inode = state.inode_for(path);
            state.inode(inode).current = parts.concat();
            Ok(())
        }

        fn append(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
            let mut state = self.step()?;
            let inode = *state.names.get(path).ok_or(io::ErrorKind::NotFound)?;
            state.inode(inode).current.extend_from_slice(bytes);
            Ok(())
        }

        fn open(&self, path: &Path) -> io::Result<Option<Box<dyn DiskReader>>> {
            let state = self.step()?;
            Ok(state.names.get(path).map(|inode| {
                Box::new(io::Cursor::new(state.inodes[*inode].current.clone()))
                    as Box<dyn DiskReader>
            }))
        }

        fn overwrite(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
            let mut state = self.step()?;
            let inode = state.inode_for(path);
            let current = &mut state.inode(inode).current;
            if current.len() < bytes.len() {
                current.resize(bytes.len(), 0);
            }
            current[..bytes.len()].copy_from_slice(bytes);
            Ok(())
        }

        fn sync(&self, path: &Path) -> io::Result<()> {
            let mut state = self.step()?;
            let inode = *state.names.get(path).ok_or(io::ErrorKind::NotFound)?;
            let inode = state.inode(inode);
            inode.durable = Some(inode.current.clone());
            Ok(())
        }

        fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
            let mut state = self.step()?;
            let inode = state.names.remove(from).ok_or(io::ErrorKind::NotFound)?;
            state.names.insert(to.to_owned(), inode);
            Ok(())
        }

        fn remove(&self, path: &Path) -> io::Result<()> {
            self.step()?.names.remove(path);
            Ok(())
        }

        fn sync_dir(&self, dir: &Path) -> io::Result<()> {
            let mut state = self.step()?;
            let State {
                names,
                durable_names,
                ..
            } = &mut *state;
            durable_names.retain(|path, _| path.parent() != Some(dir));
            for (path, inode) in names.iter() {
                if path.parent() == Some(dir) {
                    durable_names.insert(path.clone(), *inode);
                }
            }
            Ok(())
        }

        fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
            let state = self.step()?;
            Ok(state
                .names
                .keys()
                .filter(|path| path.parent() == Some(dir))
                .filter_map(|path| path.file_name())
                .map(|name| name.to_string_lossy().into_owned())
                .collect())
        }

        fn create_dir(&self, _dir: &Path) -> io::Result<bool> {
            drop(self.step()?);
            Ok(false)
        }

        fn create_file(&self, path: &Path) -> io::Result<Arc<dyn DiskFile>> {
            let mut state = self.step()?;
            let inode = state.inode_for(path);
            state.inode(inode).current.clear();
            Ok(Arc::new(SimFile {
                disk: self.clone(),
                inode,
            }))
        }

        fn open_file(&self, path: &Path) -> io::Result<Option<Arc<dyn DiskFile>>> {
            let state = self.step()?;
            Ok(state.names.get(path).map(|inode| {
                Arc::new(SimFile {
                    disk: self.clone(),
                    inode: *inode,
                }) as Arc<dyn DiskFile>
            }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::sim::SimDisk;
    use super::*;

    fn files(disk: &SimDisk) -> Files {
        Files::open(Path::new("/data"), Arc::new(disk.clone())).unwrap()
    }

    #[test]
    fn a_replaced_file_reads_back_and_survives_a_power_cut() {
        let disk = SimDisk::default();
        files(&disk).replace("vote", &7_u64).unwrap();
        assert_eq!(files(&disk).read::<u64>("vote").unwrap(), Some(7));
        let disk = disk.power_cut(|_| 0);
        assert_eq!(files(&disk).read::<u64>("vote").unwrap(), Some(7));
    }

    #[test]
    fn an_unsynced_file_may_be_lost_or_torn_and_reads_as_absent() {
        let disk = SimDisk::default();
        files(&disk).write_unsynced("committed", &3_u64).unwrap();
        assert_eq!(
            files(&disk).read_unsynced::<u64>("committed").unwrap(),
            Some(3)
        );
        let disk = disk.power_cut(|_| 0);
        assert_eq!(
            files(&disk).read_unsynced::<u64>("committed").unwrap(),
            None
        );
        // A shorter value over a longer one reads as itself.
        files(&disk).write_unsynced("committed", &u64::MAX).unwrap();
        files(&disk).write_unsynced("committed", &1_u64).unwrap();
        assert_eq!(
            files(&disk).read_unsynced::<u64>("committed").unwrap(),
            Some(1)
        );
        // Torn: only part of the bytes reached the disk.
        let real = tempfile::tempdir().unwrap();
        let on_disk = Files::open(real.path(), Arc::new(RealDisk)).unwrap();
        on_disk.write_unsynced("committed", &u64::MAX).unwrap();
        let path = real.path().join("committed");
        let bytes = fs::read(&path).unwrap();
        fs::write(&path, &bytes[..bytes.len() - 2]).unwrap();
        assert_eq!(on_disk.read_unsynced::<u64>("committed").unwrap(), None);
    }

    #[test]
    fn a_damaged_durable_file_is_an_error_that_names_it() {
        let real = tempfile::tempdir().unwrap();
        let on_disk = Files::open(real.path(), Arc::new(RealDisk)).unwrap();
        on_disk.replace("vote", &(1_u64, 2_u64)).unwrap();
        let path = real.path().join("vote");
        let mut bytes = fs::read(&path).unwrap();
        for (damage, expected) in [
            (bytes.len() - 1, "payload where the header says"),
            (5, "shorter than a header"),
        ] {
            fs::write(&path, &bytes[..damage]).unwrap();
            let error = on_disk.read::<(u64, u64)>("vote").unwrap_err().to_string();
            assert!(error.contains(&path.display().to_string()), "{error}");
            assert!(error.contains(expected), "{error}");
        }
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        fs::write(&path, &bytes).unwrap();
        let error = on_disk.read::<(u64, u64)>("vote").unwrap_err().to_string();
        assert!(error.contains("checksum mismatch"), "{error}");
    }

    /// A payload of 2.5 MiB: written to disk in three appends.
    fn big_payload() -> Vec<u8> {
        (0..5_u32 << 19).map(|i| (i % 251) as u8).collect()
    }

    fn replace_big(files: &Files, payload: &[u8]) -> Result<(), StoreError> {
        files.replace_streamed("snapshot", |out| {
            payload
                .chunks(4096)
                .try_for_each(|chunk| out.write_all(chunk))
                .map_err(|error| StoreError::Io(error.to_string()))
        })
    }

    fn read_payload(files: &Files, name: &str) -> Option<Vec<u8>> {
        let (mut reader, len) = files.open_payload(name).unwrap()?;
        let mut payload = Vec::new();
        reader.read_to_end(&mut payload).unwrap();
        assert_eq!(payload.len() as u64, len);
        Some(payload)
    }

    #[test]
    fn a_streamed_file_reads_back_checked_and_a_damaged_one_is_refused() {
        let real = tempfile::tempdir().unwrap();
        let on_disk = Files::open(real.path(), Arc::new(RealDisk)).unwrap();
        let payload = big_payload();
        replace_big(&on_disk, &payload).unwrap();
        assert_eq!(read_payload(&on_disk, "snapshot"), Some(payload.clone()));
        assert_eq!(read_payload(&on_disk, "absent"), None);
        // A small one is sealed alike.
        on_disk.replace_parts("snapshot", &[b"ab", b"cd"]).unwrap();
        assert_eq!(read_payload(&on_disk, "snapshot"), Some(b"abcd".to_vec()));

        replace_big(&on_disk, &payload).unwrap();
        let path = real.path().join("snapshot");
        let mut bytes = fs::read(&path).unwrap();
        bytes[3 << 19] ^= 1;
        fs::write(&path, &bytes).unwrap();
        let error = on_disk.open_payload("snapshot").err().unwrap().to_string();
        assert!(error.contains("checksum mismatch"), "{error}");
        fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
        let error = on_disk.open_payload("snapshot").err().unwrap().to_string();
        assert!(error.contains("payload where the header says"), "{error}");

        // A write that fails leaves the file as it was, and nothing beside it.
        on_disk.replace_parts("snapshot", &[b"old"]).unwrap();
        let failed = on_disk.replace_streamed("snapshot", |out| {
            out.write_all(&payload).unwrap();
            Err::<(), _>(StoreError::Refused("the writer gave up".to_owned()))
        });
        assert!(failed.is_err());
        assert_eq!(read_payload(&on_disk, "snapshot"), Some(b"old".to_vec()));
        assert_eq!(on_disk.list().unwrap(), ["snapshot"]);
    }

    /// How much of each unsynced change survives a power cut: none, half (torn), all.
    fn none(_steps: u64) -> u64 {
        0
    }

    fn half(steps: u64) -> u64 {
        steps / 2
    }

    fn all(steps: u64) -> u64 {
        steps
    }

    #[test]
    fn a_power_cut_in_a_streamed_replace_leaves_the_old_file_or_the_new_one() {
        let payload = big_payload();
        let steps = {
            let disk = SimDisk::default();
            let files = files(&disk);
            let before = disk.steps();
            replace_big(&files, &payload).unwrap();
            disk.steps() - before
        };
        assert!(steps >= 6, "{steps} steps: the payload is written in parts");
        for cut_at in 0..=steps {
            for survive in [none, half, all] {
                let disk = SimDisk::default();
                let before = files(&disk);
                before.replace_parts("snapshot", &[b"old"]).unwrap();
                disk.fail_after(disk.steps() + cut_at);
                let finished = replace_big(&before, &payload).is_ok();
                let disk = disk.power_cut(survive);
                let read = read_payload(&files(&disk), "snapshot").unwrap();
                if finished {
                    assert!(read == payload, "acknowledged, then lost (cut at {cut_at})");
                } else {
                    assert!(
                        read == b"old" || read == payload,
                        "{} bytes (cut at {cut_at})",
                        read.len()
                    );
                }
            }
        }
    }

    #[test]
    fn a_power_cut_in_a_replace_leaves_the_old_file_or_the_new_one() {
        let steps = {
            let disk = SimDisk::default();
            let files = files(&disk);
            let before = disk.steps();
            files.replace("vote", &2_u64).unwrap();
            disk.steps() - before
        };
        for cut_at in 0..=steps {
            for survive in [none, half, all] {
                let disk = SimDisk::default();
                let before = files(&disk);
                before.replace("vote", &1_u64).unwrap();
                disk.fail_after(disk.steps() + cut_at);
                let finished = before.replace("vote", &2_u64).is_ok();
                let disk = disk.power_cut(survive);
                let after = files(&disk);
                let read = after.read::<u64>("vote").unwrap();
                if finished {
                    assert_eq!(read, Some(2), "acknowledged, then lost (cut at {cut_at})");
                } else {
                    assert!(matches!(read, Some(1 | 2)), "{read:?} (cut at {cut_at})");
                }
                assert!(
                    !after
                        .list()
                        .unwrap()
                        .iter()
                        .any(|name| name.ends_with(TMP_SUFFIX)),
                    "a half-written file outlived the reopen"
                );
            }
        }
    }
}
