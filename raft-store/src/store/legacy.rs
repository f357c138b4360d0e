//! Data dirs of store formats 1 and 2, which kept the vote, the purge point, the committed log
//! id and the snapshot in a sled database at the top of the data dir (format 1 the log's
//! entries too, in a `log` tree). `open` copies them into the files of `files.rs` and the
//! segments once, records format 3, and then retires the sled database: it stamps it with
//! format 3, so that an earlier build refuses the dir instead of reading a stale vote, and
//! empties its trees. A new data dir gets such a stamp too (`stamp_new`). sled types never
//! leave this module.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::files::Files;
use super::{
    decode, encode, LogId, LogStore, SnapshotMeta, StoreError, Vote, COMMITTED_FILE, PURGED_FILE,
    STORE_FORMAT, VOTE_FILE,
};

/// The file sled creates first in a database's directory.
const SLED_CONF: &str = "conf";
const META_TREE: &str = "meta";
const SNAPSHOT_TREE: &str = "snapshot";
const LOG_TREE: &str = "log";
const FORMAT_KEY: &[u8] = b"format";
const VOTE_KEY: &[u8] = b"vote";
const COMMITTED_KEY: &[u8] = b"committed";
const LAST_PURGED_KEY: &[u8] = b"last_purged";
const SNAPSHOT_META_KEY: &[u8] = b"meta";
const SNAPSHOT_DATA_KEY: &[u8] = b"data";
const SNAPSHOT_COUNTER_KEY: &[u8] = b"counter";

/// An earlier build's sled database in the data dir.
pub(super) struct Sled {
    dir: PathBuf,
    db: sled::Db,
    meta: sled::Tree,
    /// The store format it records: 1 or 2 for a database still in use, 3 once retired.
    format: Option<u32>,
}

impl Sled {
    /// The sled database in `dir`, if there is one.
    pub(super) fn find(dir: &Path) -> Result<Option<Sled>, StoreError> {
        if !dir.join(SLED_CONF).exists() {
            return Ok(None);
        }
        let db = sled::Config::new().path(dir).open()?;
        let meta = db.open_tree(META_TREE)?;
        let format = match meta.get(FORMAT_KEY)? {
            Some(bytes) => Some(decode::<u32>(&bytes, "sled's store format")?),
            None => None,
        };
        if let Some(found) = format.filter(|found| !(1..=STORE_FORMAT).contains(found)) {
            return Err(StoreError::UnsupportedFormat { found });
        }
        Ok(Some(Sled {
            dir: dir.to_owned(),
            db,
            meta,
            format,
        }))
    }

    /// Makes a sled database in the new data dir `dir` that records this store format and
    /// holds nothing else: builds of formats 1 and 2 look only there, and without it would
    /// take the dir for an empty one and start with no vote and no log.
    pub(super) fn stamp_new(dir: &Path) -> Result<(), StoreError> {
        let db = sled::Config::new().path(dir).open()?;
        db.open_tree(META_TREE)?
            .insert(FORMAT_KEY, encode(&STORE_FORMAT, "store format")?)?;
        db.flush()?;
        drop(db);
        sync_sled_files(dir)
    }

    /// Copies the vote, the purge point, the committed log id and the snapshot into `files`,
    /// durably. Repeatable: a crash before the format is recorded copies them again.
    pub(super) fn copy_state(&self, files: &Files) -> Result<(), StoreError> {
        if self.format == Some(STORE_FORMAT) {
            return Ok(());
        }
        if let Some(vote) = self.meta_value::<Vote>(VOTE_KEY, "vote")? {
            files.replace(VOTE_FILE, &vote)?;
        }
        if let Some(purged) = self.meta_value::<LogId>(LAST_PURGED_KEY, "last purged log id")? {
            files.replace(PURGED_FILE, &purged)?;
        }
        if let Some(committed) = self.meta_value::<LogId>(COMMITTED_KEY, "committed log id")? {
            files.write_unsynced(COMMITTED_FILE, &Some(committed))?;
        }
        let snapshots = self.db.open_tree(SNAPSHOT_TREE)?;
        let meta = snapshots.get(SNAPSHOT_META_KEY)?;
        let data = snapshots.get(SNAPSHOT_DATA_KEY)?;
        match (meta, data) {
            (Some(meta), Some(data)) => {
                let meta: SnapshotMeta = decode(&meta, "sled's snapshot meta")?;
                let counter = match snapshots.get(SNAPSHOT_COUNTER_KEY)? {
                    Some(bytes) => decode::<u64>(&bytes, "sled's snapshot counter")?,
                    None => 0,
                };
                super::snapshot_file::replace(files, counter, &meta, |out| {
                    out.write_all(&data)
                        .map_err(|error| StoreError::Io(format!("write the snapshot: {error}")))
                })?;
            }
            (None, None) => {}
            _ => {
                return Err(StoreError::Corrupt {
                    what: "sled's snapshot".to_owned(),
                    reason: "meta without bytes or bytes without meta".to_owned(),
                })
            }
        }
        Ok(())
    }

    /// Format 1: copies the `log` tree's entries into the segments.
    pub(super) fn copy_log(&self, log_store: &LogStore) -> Result<(), StoreError> {
        let has_log = self
            .db
            .tree_names()
            .iter()
            .any(|name| name.as_ref() == LOG_TREE.as_bytes());
        if self.format != Some(1) || !has_log {
            return Ok(());
        }
        let logs = self.db.open_tree(LOG_TREE)?;
        if !logs.is_empty() {
            tracing::info!(
                entries = logs.len(),
                "copying the log from sled into segment files"
            );
            log_store.import_sled_log(&logs)?;
        }
        Ok(())
    }

    /// Once format 3 is recorded in our own files: stamps the database with it and empties the
    /// rest, so that an earlier build refuses the dir and the old snapshot's bytes go.
    pub(super) fn retire(self) -> Result<(), StoreError> {
        if self.format == Some(STORE_FORMAT) {
            return Ok(());
        }
        self.meta
            .insert(FORMAT_KEY, encode(&STORE_FORMAT, "store format")?)?;
        self.db.flush()?;
        for name in self.db.tree_names() {
            if name.as_ref() == META_TREE.as_bytes() {
                for key in [VOTE_KEY, COMMITTED_KEY, LAST_PURGED_KEY] {
                    self.meta.remove(key)?;
                }
            } else if name.as_ref() != b"__sled__default" {
                self.db.drop_tree(&name)?;
            }
        }
        self.db.flush()?;
        let Sled { dir, db, meta, .. } = self;
        drop((meta, db));
        sync_sled_files(&dir)?;
        tracing::info!(
            "the data dir's sled database is retired: its state now lives in the store's own files"
        );
        Ok(())
    }

    fn meta_value<T: serde::de::DeserializeOwned>(
        &self,
        key: &[u8],
        what: &str,
    ) -> Result<Option<T>, StoreError> {
        self.meta
            .get(key)?
            .map(|bytes| decode(&bytes, &format!("sled's {what}")))
            .transpose()
    }
}

/// fsyncs a closed sled database's files and the data dir: sled's own flush uses
/// `sync_file_range`, which a power cut does not respect, and a stamp that a cut could tear
/// would leave the dir unopenable.
fn sync_sled_files(dir: &Path) -> Result<(), StoreError> {
    let io = |error: std::io::Error| StoreError::Io(format!("sync sled's files: {error}"));
    for item in std::fs::read_dir(dir).map_err(io)? {
        let item = item.map_err(io)?;
        let name = item.file_name();
        let name = name.to_string_lossy();
        let sled_owns =
            name == SLED_CONF || name == "db" || name == "blobs" || name.starts_with("snap.");
        if sled_owns {
            File::open(item.path())
                .and_then(|file| file.sync_all())
                .map_err(io)?;
        }
    }
    File::open(dir).and_then(|file| file.sync_all()).map_err(io)
}
