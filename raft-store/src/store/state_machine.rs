//! The lease state machine as openraft sees it: `StateMachineStore` implements
//! `RaftStateMachine`, `SnapshotBuilder` implements `RaftSnapshotBuilder`, and `MachineHandle`
//! lets the HTTP server read the applied state.
//!
//! The `Machine` lives in memory behind one `RwLock`, together with the log id of the last
//! applied entry and the last applied membership, so a reader always sees a machine and the
//! log position it is at, never one without the other. Whatever reads the whole state (a
//! snapshot build, a backup, a digest) takes an O(1) copy under the lock and reads the copy
//! after letting go (`MachineHandle::copy`), so it never holds up an apply. Only snapshots are
//! persisted, streamed to and from the `snapshot` file (`snapshot_file.rs`). A restart rebuilds the machine
//! from the last snapshot and openraft re-applies the committed log after it: every entry is in
//! the rebuilt state exactly once. Deciding what a command does belongs to `machine`, never here.

use std::io;
use std::sync::Arc;

use futures_util::TryStreamExt;
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder};

use super::snapshot_file::{self, SnapshotFile, SnapshotInbox, SnapshotWritten};
use super::{
    io_error, Applied, AppliedState, ChangeWatch, Database, DirLock, Entry, LogId, SharedState,
    Snapshot, SnapshotData, SnapshotMeta, StorageResult, StoreError, StoredMembership, TypeConfig,
    Watching,
};
use crate::machine::{Command, Machine, Name, Namespace, ResourcePath};

/// The in-memory lease state machine and its persisted snapshots, for openraft.
#[derive(Debug)]
pub struct StateMachineStore {
    state: SharedState,
    database: Database,
    /// Wakes what waits for a path when an applied entry changes it.
    watch: ChangeWatch,
}

/// A cheap, cloneable read handle on the applied state, for linearizable reads (after the read
/// index is applied) and for the replica digest.
#[derive(Debug, Clone)]
pub struct MachineHandle {
    state: SharedState,
    watch: ChangeWatch,
}

/// The applied state at one log position, apart from the live one: see `MachineHandle::copy`.
#[derive(Debug, Clone)]
pub struct AppliedCopy {
    pub machine: Machine,
    pub last_applied: Option<LogId>,
    pub last_membership: StoredMembership,
}

/// Builds a snapshot of the applied state; runs in openraft's background task, concurrently
/// with `apply`.
#[derive(Debug)]
pub struct SnapshotBuilder {
    handle: MachineHandle,
    database: Database,
}

impl StateMachineStore {
    /// Applies `entries` in order (see the contract on `RaftStateMachine` below) and returns
    /// what each one produced, in order. An entry out of order stops at that entry with
    /// `StoreError::Refused`, the ones before it applied.
    pub fn apply_entries(
        &self,
        entries: impl IntoIterator<Item = Entry>,
    ) -> Result<Vec<Applied>, StoreError> {
        let mut state = self.state.write().map_err(|_| StoreError::Poisoned)?;
        let mut applied = Vec::new();
        for entry in entries {
            let normal = matches!(entry.payload, EntryPayload::Normal(_));
            state.consecutive |= normal;
            if let Some(last_applied) = state.last_applied {
                let in_order = if state.consecutive {
                    entry.log_id.index == last_applied.index + 1
                } else {
                    entry.log_id.index > last_applied.index
                };
                if !in_order {
                    return Err(StoreError::Refused(format!(
                        "applying entry {} after {last_applied}: entries apply once each, in order",
                        entry.log_id
                    )));
                }
            }
            state.last_applied = Some(entry.log_id);
            let responses = match entry.payload {
                EntryPayload::Blank => Vec::new(),
                EntryPayload::Normal(batch) => {
                    let responses = state.machine.apply(&batch);
                    self.watch.changed(state.machine.applied_events());
                    if batch.commands.iter().any(Command::changes_access) {
                        self.watch.changed_access();
                    }
                    responses
                }
                EntryPayload::Membership(membership) => {
                    state.last_membership = StoredMembership::new(Some(entry.log_id), membership);
                    Vec::new()
                }
            };
            applied.push(Applied {
                time_ms: state.machine.time_ms(),
                responses,
            });
        }
        Ok(applied)
    }

    /// The data dir's lock, to hold past this store's life.
    pub(super) fn dir_lock(&self) -> Arc<DirLock> {
        Arc::clone(&self.database.lock)
    }

    /// The data dir's record of its cluster.
    pub fn cluster_file(&self) -> super::ClusterFile {
        super::ClusterFile(self.database.clone())
    }

    /// A read handle on this state machine's applied state.
    pub fn handle(&self) -> MachineHandle {
        MachineHandle {
            state: self.state.clone(),
            watch: self.watch.clone(),
        }
    }

    /// Where this node gathers the snapshots it is sent.
    pub fn snapshot_inbox(&self) -> SnapshotInbox {
        SnapshotInbox::new(self.database.files.clone())
    }

    /// Rebuilds the machine from the last persisted snapshot, or starts empty.
    pub(super) fn open(database: Database) -> Result<StateMachineStore, StoreError> {
        let state = match snapshot_file::open(&database.files)? {
            Some(SnapshotFile {
                counter,
                meta,
                data,
            }) => {
                *database
                    .snapshot_write
                    .lock()
                    .map_err(|_| StoreError::Poisoned)? = SnapshotWritten {
                    counter,
                    last_log_id: meta.last_log_id,
                };
                let len = data.len();
                AppliedState {
                    machine: snapshot_file::decode_machine_from(data, len)?,
                    last_applied: meta.last_log_id,
                    last_membership: meta.last_membership,
                    consecutive: true,
                }
            }
            None => AppliedState {
                machine: Machine::default(),
                last_applied: None,
                last_membership: StoredMembership::default(),
                consecutive: false,
            },
        };
        tracing::info!(last_applied = ?state.last_applied, "state machine rebuilt from the last snapshot");
        Ok(StateMachineStore {
            state: SharedState::new(state.into()),
            database,
            watch: ChangeWatch::default(),
        })
    }
}

impl MachineHandle {
    /// Runs `read` on the machine and the log id of the last entry applied to it, under the read
    /// lock: keep `read` short, `apply` waits for it. Fails only if an apply panicked (then the
    /// state is unusable and the node is stopping).
    pub fn read<T>(
        &self,
        read: impl FnOnce(&Machine, Option<LogId>) -> T,
    ) -> Result<T, StoreError> {
        let state = self.state.read().map_err(|_| StoreError::Poisoned)?;
        Ok(read(&state.machine, state.last_applied))
    }

    /// Watches `resource` in `namespace`: woken after every applied entry with an event on it
    /// (see `ChangeWatch`).
    pub fn watch(&self, namespace: &Namespace, resource: &ResourcePath) -> Watching {
        self.watch.watch(namespace, resource)
    }

    /// Watches the tasks of `queue` in `namespace`: woken after every applied entry with a task
    /// event on it (see `ChangeWatch`).
    pub fn watch_queue(&self, namespace: &Namespace, queue: &Name) -> Watching {
        self.watch.watch_queue(namespace, queue)
    }

    /// Watches for any new event: woken after every applied entry that recorded one (see
    /// `ChangeWatch`).
    pub fn watch_events(&self) -> Watching {
        self.watch.watch_events()
    }

    /// A copy of the applied state, taken under the read lock in O(1) (the machine's maps are
    /// persistent: the copy shares them, and applies after it copy only what they change).
    /// For encoding the whole state (snapshots, backups, digests) without holding up applies.
    pub fn copy(&self) -> Result<AppliedCopy, StoreError> {
        let state = self.state.read().map_err(|_| StoreError::Poisoned)?;
        Ok(AppliedCopy {
            machine: state.machine.clone(),
            last_applied: state.last_applied,
            last_membership: state.last_membership.clone(),
        })
    }

    /// The log id of the last applied entry.
    pub fn last_applied(&self) -> Result<Option<LogId>, StoreError> {
        self.read(|_, last_applied| last_applied)
    }

    /// The last applied membership, with the log id of the entry that set it.
    pub fn last_membership(&self) -> Result<StoredMembership, StoreError> {
        let state = self.state.read().map_err(|_| StoreError::Poisoned)?;
        Ok(state.last_membership.clone())
    }
}

/// The state machine contract Baton relies on.
///
/// - `apply` (through `apply_entries`) runs each entry through `Machine::apply` (normal
///   entries), records membership (membership entries), advances the last applied log id,
///   and answers each entry proposed here with its `Applied`, in order, once the whole run is
///   applied. It refuses an entry at
///   or below the last applied index (applying twice) and, once the machine holds lease state
///   (a normal entry applied, or a snapshot), any entry that is not the one right after the
///   last applied (a skipped entry), with an error. Before that it takes any higher index:
///   openraft's own storage suite drives fresh machines with sparse blank and membership
///   entries.
/// - The machine is in memory; snapshots are what is durable. `build_snapshot` and
///   `install_snapshot` fsync the snapshot before returning, and openraft purges the log only
///   after that. A built snapshot never replaces a persisted one that covers more of the log.
/// - Snapshot bytes are `Machine::encode_snapshot`, streamed (`SnapshotData`, never held
///   whole); the applied log id and membership travel in openraft's `SnapshotMeta`. Bytes that
///   do not decode are an error, never a panic, and leave the persisted snapshot as it was.
/// - Any I/O, encoding or decoding error, or a poisoned lock, is an `io::Error`: openraft
///   stops the node.
impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotData = SnapshotData;
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> StorageResult<(Option<LogId>, StoredMembership)> {
        let state = self.state.read().map_err(|_| poisoned())?;
        Ok((state.last_applied, state.last_membership.clone()))
    }

    async fn apply<Strm>(&mut self, entries: Strm) -> StorageResult<()>
    where
        Strm: futures_util::Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>>
            + Unpin
            + OptionalSend,
    {
        // The whole run first: the state's lock is a std lock, never held across an await.
        let (entries, responders): (Vec<Entry>, Vec<_>) =
            entries.try_collect::<Vec<_>>().await?.into_iter().unzip();
        let applied = self.apply_entries(entries).map_err(io_error)?;
        for (responder, applied) in responders.into_iter().zip(applied) {
            if let Some(responder) = responder {
                responder.send(applied);
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> SnapshotBuilder {
        SnapshotBuilder {
            handle: self.handle(),
            database: self.database.clone(),
        }
    }

    /// Decodes the received bytes as it persists them with the meta (an error on garbage,
    /// which leaves the persisted snapshot as it was), fsyncs them, then replaces the
    /// in-memory machine, applied log id and membership at once.
    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: SnapshotData,
    ) -> StorageResult<()> {
        tracing::info!(snapshot = %meta, bytes = snapshot.len(), "installing snapshot");
        self.install(meta, snapshot).await?;
        self.watch.changed_all();
        Ok(())
    }

    /// The last persisted snapshot (built here or installed), streamed from disk.
    async fn get_current_snapshot(&mut self) -> StorageResult<Option<Snapshot>> {
        let database = self.database.clone();
        let persisted = self
            .database
            .run_blocking(move || snapshot_file::open(&database.files))
            .await
            .map_err(io_error)?;
        Ok(persisted.map(|file| Snapshot {
            meta: file.meta,
            snapshot: file.data,
        }))
    }
}

impl StateMachineStore {
    async fn install(&mut self, meta: &SnapshotMeta, snapshot: SnapshotData) -> StorageResult<()> {
        // Decoding a large snapshot is seconds of CPU: off the async workers, like building one.
        let database = self.database.clone();
        let persisted_meta = meta.clone();
        let machine = self
            .database
            .run_blocking(move || {
                snapshot_file::persist_received(&database, &persisted_meta, snapshot)
            })
            .await
            .map_err(io_error)?;
        tracing::info!(snapshot = %meta, "snapshot installed");
        let mut state = self.state.write().map_err(|_| poisoned())?;
        *state = AppliedState {
            machine,
            last_applied: meta.last_log_id,
            last_membership: meta.last_membership.clone(),
            consecutive: true,
        };
        Ok(())
    }
}

/// Takes a copy of the machine with its log id under the read lock (O(1): the bytes match that
/// log id exactly), then encodes the copy into the snapshot file with no lock on the state held,
/// so applies go on meanwhile, and syncs it before returning. The snapshot returned opens the
/// file only when it is read, which openraft never does with one it built (it keeps the meta).
///
/// All of it runs on a blocking thread: encoding a million leases takes a large fraction of a
/// second of CPU, and on an async worker it starved the node's heartbeats and appends long
/// enough for a follower to call an election (seen in the memory bench).
impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    type SnapshotData = SnapshotData;

    async fn build_snapshot(&mut self) -> StorageResult<Snapshot> {
        let (handle, database) = (self.handle.clone(), self.database.clone());
        let snapshot = self
            .database
            .run_blocking(move || {
                let copy = handle.copy()?;
                tracing::info!(last_applied = ?copy.last_applied, "building a snapshot of a copy");
                let meta = SnapshotMeta {
                    last_log_id: copy.last_applied,
                    last_membership: copy.last_membership,
                };
                // openraft reads only a built snapshot's meta: the bytes are read back (or,
                // when an install superseded the build, encoded) only if someone reads them.
                let data = snapshot_file::persist_built(&database, &meta, copy.machine)?;
                Ok(Snapshot {
                    meta,
                    snapshot: data,
                })
            })
            .await
            .map_err(io_error)?;
        tracing::info!(snapshot = %snapshot.meta, bytes = snapshot.snapshot.len(), "snapshot built");
        Ok(snapshot)
    }
}

fn poisoned() -> io::Error {
    io_error(StoreError::Poisoned)
}
