//! The openraft storage, tested from the outside: openraft's own storage suite, plus
//! what the suite cannot see: durability across a reopen of the same data dir, rebuilding the
//! machine from a snapshot and re-applying the committed log after it, and refusing corrupt
//! bytes with an error instead of a panic.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Display;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_raft_store::machine::{
    Batch, Command, LeaseMode, Limits, Namespace, NewSession, Op, Owner, Reply, ResourcePath,
    SessionId,
};
use baton_raft_store::store::{
    self, open_with, Applied, ClusterId, Entry, Io, LogId, LogStore, Member, Options, SimDisk,
    SnapshotData, SnapshotMeta, StateMachineStore, StoreError, StoredMembership, TypeConfig, Vote,
};
use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::testing::log::{StoreBuilder, Suite};
use openraft::{
    EntryPayload, ErrorSubject, ErrorVerb, Membership, RaftLogReader, RaftSnapshotBuilder,
    StorageError, StorageHelper,
};
use serde::Serialize;
use tempfile::TempDir;

/// Opens a fresh store in a new temporary directory; the directory lives as long as the guard.
struct TempStoreBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, TempDir> for TempStoreBuilder {
    async fn build(
        &self,
    ) -> Result<(TempDir, LogStore, StateMachineStore), StorageError<TypeConfig>> {
        let dir = TempDir::new().map_err(|error| {
            StorageError::from_io_error(ErrorSubject::Store, ErrorVerb::Write, error)
        })?;
        let (log_store, state_machine) = store::open(dir.path()).map_err(|error| {
            StorageError::from_io_error(
                ErrorSubject::Store,
                ErrorVerb::Read,
                io::Error::other(error),
            )
        })?;
        Ok((dir, log_store, state_machine))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openraft_storage_suite() {
    Suite::test_all(TempStoreBuilder)
        .await
        .expect("openraft's storage suite passes");
}

#[tokio::test]
async fn appended_entries_survive_reopen() {
    let dir = TempDir::new().unwrap();
    let entries = vec![
        membership_entry(1, 1),
        blank_entry(1, 2),
        normal_entry(1, 3, create_session_batch(1_000, 1)),
        normal_entry(2, 4, acquire_batch(2_000, 1, "repo/src")),
    ];
    {
        let (mut log_store, _state_machine) = open(dir.path()).await.unwrap();
        log_store.blocking_append(entries.clone()).await.unwrap();
        log_store.save_committed(Some(log_id(2, 4))).await.unwrap();
    }
    let (mut log_store, _state_machine) = open(dir.path()).await.unwrap();
    let read_back = log_store.try_get_log_entries(..).await.unwrap();
    assert_eq!(read_back, entries);
    let state = log_store.get_log_state().await.unwrap();
    assert_eq!(state.last_log_id, Some(log_id(2, 4)));
    assert_eq!(state.last_purged_log_id, None);
    assert_eq!(
        log_store.read_committed().await.unwrap(),
        Some(log_id(2, 4))
    );
}

#[tokio::test]
async fn truncate_and_purge_survive_reopen() {
    let dir = TempDir::new().unwrap();
    {
        let (mut log_store, mut state_machine) = open(dir.path()).await.unwrap();
        let entries: Vec<_> = (1..=10).map(|index| blank_entry(1, index)).collect();
        log_store.blocking_append(entries.clone()).await.unwrap();
        log_store.truncate_after(Some(log_id(1, 7))).await.unwrap();
        // A purge removes only what a durable snapshot covers.
        state_machine.apply_entries(entries[..3].to_vec()).unwrap();
        state_machine
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        log_store.purge(log_id(1, 3)).await.unwrap();
    }
    let (mut log_store, _state_machine) = open(dir.path()).await.unwrap();
    let indexes: Vec<u64> = log_store
        .try_get_log_entries(..)
        .await
        .unwrap()
        .iter()
        .map(|entry| entry.log_id.index)
        .collect();
    assert_eq!(indexes, vec![4, 5, 6, 7]);
    let state = log_store.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 3)));
    assert_eq!(state.last_log_id, Some(log_id(1, 7)));
}

#[tokio::test]
async fn vote_survives_reopen() {
    let dir = TempDir::new().unwrap();
    let vote = Vote::new_committed(7, 3);
    {
        let (mut log_store, _state_machine) = open(dir.path()).await.unwrap();
        assert_eq!(log_store.read_vote().await.unwrap(), None);
        log_store.save_vote(&vote).await.unwrap();
    }
    let (mut log_store, _state_machine) = open(dir.path()).await.unwrap();
    assert_eq!(log_store.read_vote().await.unwrap(), Some(vote));
}

#[tokio::test]
async fn the_cluster_id_survives_reopen_and_a_seeded_dir_has_the_one_given() {
    let dir = TempDir::new().unwrap();
    let id = ClusterId([7; 16]);
    {
        let (_log_store, state_machine) = open(dir.path()).await.unwrap();
        let file = state_machine.cluster_file();
        assert_eq!(
            file.read().unwrap(),
            None,
            "a new dir belongs to no cluster"
        );
        file.write(id).unwrap();
    }
    let (_log_store, state_machine) = open(dir.path()).await.unwrap();
    assert_eq!(state_machine.cluster_file().read().unwrap(), Some(id));

    let seeded = TempDir::new().unwrap();
    let member = Member {
        api_addr: "127.0.0.1:1".to_owned(),
        peer_addr: "127.0.0.1:2".to_owned(),
    };
    let other = ClusterId([9; 16]);
    store::seed(
        &seeded.path().join("node"),
        &baton_raft_store::machine::Machine::default(),
        5,
        BTreeMap::from([(1, member)]),
        other,
    )
    .await
    .unwrap();
    let (_log_store, state_machine) = open(&seeded.path().join("node")).await.unwrap();
    assert_eq!(state_machine.cluster_file().read().unwrap(), Some(other));
}

#[test]
fn a_cluster_id_reads_back_from_its_text_and_refuses_other_text() {
    let id = ClusterId([0xab; 16]);
    let text = id.to_string();
    assert_eq!(text, "ab".repeat(16));
    assert_eq!(text.parse::<ClusterId>(), Ok(id));
    for bad in [
        "",
        "ab",
        &"AB".repeat(16),
        &"zz".repeat(16),
        &"ab".repeat(17),
    ] {
        assert!(bad.parse::<ClusterId>().is_err(), "{bad:?}");
    }
}

#[tokio::test]
async fn apply_answers_each_entry_with_responses_and_time() {
    let dir = TempDir::new().unwrap();
    let (_log_store, mut state_machine) = open(dir.path()).await.unwrap();
    let applied = state_machine
        .apply_entries(vec![
            membership_entry(1, 1),
            normal_entry(1, 2, create_session_batch(5_000, 1)),
            blank_entry(1, 3),
            normal_entry(1, 4, Batch::tick(4_000)),
        ])
        .unwrap();
    assert_eq!(applied.len(), 4);
    assert_eq!(
        applied[0],
        Applied {
            time_ms: 0,
            responses: Vec::new()
        }
    );
    assert_eq!(applied[1].time_ms, 5_000);
    assert!(matches!(
        applied[1].responses[0].outcome,
        Ok(Reply::SessionCreated(_))
    ));
    assert_eq!(
        applied[2],
        Applied {
            time_ms: 5_000,
            responses: Vec::new()
        }
    );
    assert_eq!(
        applied[3],
        Applied {
            time_ms: 5_000,
            responses: Vec::new()
        },
        "time never goes back"
    );
    let (last_applied, membership) = state_machine.applied_state().await.unwrap();
    assert_eq!(last_applied, Some(log_id(1, 4)));
    assert_eq!(membership.log_id(), &Some(log_id(1, 1)));
    assert_eq!(
        state_machine.handle().last_applied().unwrap(),
        Some(log_id(1, 4))
    );

    let error = state_machine.apply_entries(vec![blank_entry(1, 4)]);
    assert!(error.is_err(), "applying an entry twice is refused");
    let error = state_machine.apply_entries(vec![blank_entry(1, 6)]);
    assert!(error.is_err(), "skipping an entry is refused");
    assert_eq!(
        state_machine.applied_state().await.unwrap().0,
        Some(log_id(1, 4)),
        "a refused entry is not applied"
    );
}

#[tokio::test]
async fn snapshot_restores_machine_after_reopen() {
    let dir = TempDir::new().unwrap();
    let (expected_bytes, built_meta) = {
        let (_log_store, mut state_machine) = open(dir.path()).await.unwrap();
        state_machine
            .apply_entries(vec![
                membership_entry(1, 1),
                normal_entry(1, 2, create_session_batch(1_000, 1)),
                normal_entry(1, 3, acquire_batch(2_000, 1, "repo/src")),
            ])
            .unwrap();
        let snapshot = state_machine
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        let bytes = state_machine
            .handle()
            .read(|machine, _| machine.encode_snapshot().unwrap())
            .unwrap();
        let meta = snapshot.meta;
        assert_eq!(snapshot.snapshot.into_bytes().unwrap(), bytes);
        assert_eq!(meta.last_log_id, Some(log_id(1, 3)));
        (bytes, meta)
    };
    let (_log_store, mut state_machine) = open(dir.path()).await.unwrap();
    let handle = state_machine.handle();
    let (bytes, fence_counter, last_applied) = handle
        .read(|machine, last_applied| {
            (
                machine.encode_snapshot().unwrap(),
                machine.fence_counter(),
                last_applied,
            )
        })
        .unwrap();
    assert_eq!(bytes, expected_bytes);
    assert_eq!(fence_counter, 1, "the grant survived");
    assert_eq!(last_applied, Some(log_id(1, 3)));
    let (_, membership) = state_machine.applied_state().await.unwrap();
    assert_eq!(membership, built_meta.last_membership);
    let current = state_machine
        .get_current_snapshot()
        .await
        .unwrap()
        .expect("a persisted snapshot");
    assert_eq!(current.meta, built_meta);
}

/// After a restart the machine is the snapshot's; openraft re-applies the committed entries
/// after it, so the state is what it was before the restart: nothing applied twice or skipped.
#[tokio::test]
async fn committed_entries_after_snapshot_are_reapplied_once() {
    let dir = TempDir::new().unwrap();
    let entries = vec![
        membership_entry(1, 1),
        normal_entry(1, 2, create_session_batch(1_000, 1)),
        normal_entry(1, 3, acquire_batch(2_000, 1, "repo/src")),
        normal_entry(1, 4, acquire_batch(3_000, 1, "repo/docs")),
        normal_entry(1, 5, acquire_batch(4_000, 1, "repo/tests")),
    ];
    let before_restart = {
        let (mut log_store, mut state_machine) = open(dir.path()).await.unwrap();
        log_store
            .save_vote(&Vote::new_committed(1, 1))
            .await
            .unwrap();
        log_store.blocking_append(entries.clone()).await.unwrap();
        state_machine.apply_entries(entries[..3].to_vec()).unwrap();
        state_machine
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        log_store.purge(log_id(1, 2)).await.unwrap();
        state_machine.apply_entries(entries[3..].to_vec()).unwrap();
        log_store.save_committed(Some(log_id(1, 5))).await.unwrap();
        state_machine
            .handle()
            .read(|machine, _| machine.encode_snapshot().unwrap())
            .unwrap()
    };
    let (mut log_store, mut state_machine) = open(dir.path()).await.unwrap();
    assert_eq!(
        state_machine.handle().last_applied().unwrap(),
        Some(log_id(1, 3))
    );
    StorageHelper::new(&mut log_store, &mut state_machine)
        .get_initial_state()
        .await
        .unwrap();
    assert_eq!(
        state_machine.applied_state().await.unwrap().0,
        Some(log_id(1, 5))
    );
    let (after_restart, fence_counter) = state_machine
        .handle()
        .read(|machine, _| (machine.encode_snapshot().unwrap(), machine.fence_counter()))
        .unwrap();
    assert_eq!(fence_counter, 3);
    assert_eq!(after_restart, before_restart);
}

#[tokio::test]
async fn a_corrupt_log_record_is_an_error_not_a_panic() {
    let (dir, segment) = four_blank_entries_in_one_segment().await;
    let mut bytes = std::fs::read(&segment).unwrap();
    let records = record_offsets(&bytes);
    assert_eq!(records.len(), 4);
    // A flipped byte in the third record, with a whole record after it: not a torn append.
    bytes[records[2].1 - 1] ^= 0xff;
    std::fs::write(&segment, &bytes).unwrap();
    let refused = open(dir.path()).await;
    assert!(
        matches!(refused, Err(StoreError::Corrupt { .. })),
        "{:?}",
        refused.map(|_| ())
    );
}

/// What a crash during an append leaves: the last record cut short, or whole but not what was
/// written. It was never acknowledged (its fsync had not returned), so it is cut off and the
/// log goes on from the entry before it.
#[tokio::test]
async fn a_torn_last_record_is_cut_off_and_the_log_goes_on() {
    for tear in ["cut short", "flipped byte", "zeroed half"] {
        let (dir, segment) = four_blank_entries_in_one_segment().await;
        let mut bytes = std::fs::read(&segment).unwrap();
        let (last_start, last_end) = record_offsets(&bytes)[3];
        let middle = last_start + (last_end - last_start) / 2;
        match tear {
            "cut short" => bytes.truncate(middle),
            "flipped byte" => bytes[last_end - 1] ^= 0xff,
            // Written into the zeros preallocated after the records, half of it reached the disk.
            _ => bytes[middle..last_end].fill(0),
        }
        std::fs::write(&segment, &bytes).unwrap();
        {
            let (mut log_store, _state_machine) = open(dir.path()).await.unwrap();
            let state = log_store.get_log_state().await.unwrap();
            assert_eq!(state.last_log_id, Some(log_id(1, 3)), "{tear}");
            log_store
                .blocking_append([blank_entry(2, 4), blank_entry(2, 5)])
                .await
                .unwrap();
        }
        let (mut log_store, _state_machine) = open(dir.path()).await.unwrap();
        let read_back = log_store.try_get_log_entries(..).await.unwrap();
        let log_ids: Vec<_> = read_back.iter().map(|entry| entry.log_id).collect();
        assert_eq!(
            log_ids,
            vec![
                log_id(1, 1),
                log_id(1, 2),
                log_id(1, 3),
                log_id(2, 4),
                log_id(2, 5)
            ],
            "{tear}"
        );
    }
}

/// A record whose frame is sound but whose entry is another index's is refused when read.
#[tokio::test]
async fn a_record_holding_another_index_is_an_error() {
    let (dir, segment) = four_blank_entries_in_one_segment().await;
    let mut bytes = std::fs::read(&segment).unwrap();
    bytes.truncate(record_offsets(&bytes)[3].1);
    let misplaced =
        bincode::serde::encode_to_vec(blank_entry(1, 9), bincode::config::standard()).unwrap();
    bytes.extend_from_slice(&(misplaced.len() as u32).to_le_bytes());
    let mut crc = crc32fast::Hasher::new();
    crc.update(&5u64.to_le_bytes());
    crc.update(&misplaced);
    bytes.extend_from_slice(&crc.finalize().to_le_bytes());
    bytes.extend_from_slice(&5u64.to_le_bytes());
    bytes.extend_from_slice(&misplaced);
    std::fs::write(&segment, &bytes).unwrap();
    let (mut log_store, _state_machine) = open(dir.path()).await.unwrap();
    assert!(log_store.get_log_state().await.is_err());
    assert!(log_store.try_get_log_entries(..).await.is_err());
    assert_eq!(log_store.try_get_log_entries(1..5).await.unwrap().len(), 4);
}

/// A data dir of store format 1 kept its log in a sled tree; opening it copies the entries into
/// segment files and the vote into its own file, records format 3 and retires sled (stamped
/// with format 3, so that an earlier build refuses the dir, its trees emptied).
#[tokio::test]
async fn a_format_1_log_in_sled_is_copied_into_segments() {
    let dir = TempDir::new().unwrap();
    let entries: Vec<Entry> = std::iter::once(membership_entry(1, 1))
        .chain((2..=5).map(|index| blank_entry(1, index)))
        .collect();
    {
        let db = sled::open(dir.path()).unwrap();
        let meta = db.open_tree("meta").unwrap();
        meta.insert("format", bincode_of(&1u32)).unwrap();
        meta.insert("vote", bincode_of(&Vote::new_committed(1, 1)))
            .unwrap();
        let logs = db.open_tree("log").unwrap();
        for entry in &entries {
            logs.insert(entry.log_id.index.to_be_bytes(), bincode_of(entry))
                .unwrap();
        }
        db.flush().unwrap();
    }
    {
        let (mut log_store, _state_machine) = open(dir.path()).await.unwrap();
        assert_eq!(log_store.try_get_log_entries(..).await.unwrap(), entries);
        assert_eq!(
            log_store.read_vote().await.unwrap(),
            Some(Vote::new_committed(1, 1))
        );
        log_store
            .blocking_append([blank_entry(1, 6)])
            .await
            .unwrap();
    }
    {
        let db = retry_while_locked(|| sled::open(dir.path())).await.unwrap();
        assert!(!db.tree_names().iter().any(|name| name.as_ref() == b"log"));
        assert_eq!(sled_format(&db), 3);
        let meta = db.open_tree("meta").unwrap();
        assert!(meta.get("vote").unwrap().is_none(), "sled kept the vote");
        // A tree left in sled after the copy is never read again.
        let leftover = db.open_tree("log").unwrap();
        leftover
            .insert(1u64.to_be_bytes(), bincode_of(&entries[0]))
            .unwrap();
        db.flush().unwrap();
    }
    let (mut log_store, _state_machine) = open(dir.path()).await.unwrap();
    let indexes: Vec<u64> = log_store
        .try_get_log_entries(..)
        .await
        .unwrap()
        .iter()
        .map(|entry| entry.log_id.index)
        .collect();
    assert_eq!(indexes, (1..=6).collect::<Vec<_>>());
}

/// A data dir of store format 2 kept the vote, the purge point, the committed log id and the
/// snapshot in sled; opening it copies each into its own file, and the store goes on from them.
#[tokio::test]
async fn a_format_2_dir_moves_its_vote_purge_point_and_snapshot_out_of_sled() {
    let dir = TempDir::new().unwrap();
    let machine = baton_raft_store::machine::Machine::default();
    // The meta as openraft 0.9 wrote it, with the snapshot id 0.10 no longer has.
    #[derive(Serialize)]
    struct SnapshotMetaOf09 {
        last_log_id: Option<LogId>,
        last_membership: StoredMembership,
        snapshot_id: String,
    }
    let snapshot = SnapshotMetaOf09 {
        last_log_id: Some(log_id(2, 7)),
        last_membership: Default::default(),
        snapshot_id: "2-7-4".to_owned(),
    };
    {
        let db = sled::open(dir.path()).unwrap();
        let meta = db.open_tree("meta").unwrap();
        meta.insert("format", bincode_of(&2u32)).unwrap();
        meta.insert("vote", bincode_of(&Vote::new(3, 2))).unwrap();
        meta.insert("last_purged", bincode_of(&log_id(2, 7)))
            .unwrap();
        meta.insert("committed", bincode_of(&log_id(2, 7))).unwrap();
        let snapshots = db.open_tree("snapshot").unwrap();
        snapshots.insert("meta", bincode_of(&snapshot)).unwrap();
        snapshots
            .insert("data", machine.encode_snapshot().unwrap())
            .unwrap();
        snapshots.insert("counter", bincode_of(&4u64)).unwrap();
        db.flush().unwrap();
    }
    for reopen in 0..2_u64 {
        let (mut log_store, mut state_machine) = open(dir.path()).await.unwrap();
        assert_eq!(
            log_store.read_vote().await.unwrap(),
            Some(Vote::new(3, 2)),
            "reopen {reopen}"
        );
        let state = log_store.get_log_state().await.unwrap();
        assert_eq!(state.last_purged_log_id, Some(log_id(2, 7)));
        assert_eq!(
            log_store.read_committed().await.unwrap(),
            Some(log_id(2, 7))
        );
        // Then from the snapshot built on the first open.
        let (applied, _) = state_machine.applied_state().await.unwrap();
        assert_eq!(applied, Some(log_id(2, 7 + reopen)));
        let current = state_machine.get_current_snapshot().await.unwrap().unwrap();
        assert_eq!(current.meta.last_log_id, Some(log_id(2, 7 + reopen)));
        assert_eq!(current.meta.last_membership, snapshot.last_membership);
        state_machine
            .apply_entries(vec![normal_entry(
                2,
                8 + reopen,
                create_session_batch(1_000, 1 + u128::from(reopen)),
            )])
            .unwrap();
        let built = state_machine
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        assert_eq!(built.meta.last_log_id, Some(log_id(2, 8 + reopen)));
    }
    let db = retry_while_locked(|| sled::open(dir.path())).await.unwrap();
    assert_eq!(
        sled_format(&db),
        3,
        "an earlier build would read a stale vote"
    );
    assert!(!db
        .tree_names()
        .iter()
        .any(|name| name.as_ref() == b"snapshot"));
}

#[tokio::test]
async fn corrupt_vote_or_snapshot_is_an_error_not_a_panic() {
    let dir = TempDir::new().unwrap();
    {
        let (mut log_store, mut state_machine) = open(dir.path()).await.unwrap();
        log_store.save_vote(&Vote::new(1, 1)).await.unwrap();
        state_machine
            .apply_entries(vec![normal_entry(1, 1, create_session_batch(1_000, 1))])
            .unwrap();
        state_machine
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
    }
    let vote = dir.path().join("vote");
    let bytes = std::fs::read(&vote).unwrap();
    std::fs::write(&vote, &bytes[..bytes.len() - 1]).unwrap();
    {
        let (mut log_store, _state_machine) = open(dir.path()).await.unwrap();
        let error = log_store.read_vote().await.unwrap_err().to_string();
        assert!(error.contains(&vote.display().to_string()), "{error}");
    }
    let snapshot = dir.path().join("snapshot");
    let bytes = std::fs::read(&snapshot).unwrap();
    for damaged in [
        &bytes[..bytes.len() / 2],
        &bytes[..3],
        b"BTNF\x01\x00garbage",
    ] {
        std::fs::write(&snapshot, damaged).unwrap();
        let error = open(dir.path()).await.map(drop).unwrap_err().to_string();
        assert!(
            error.contains(&snapshot.display().to_string()),
            "a damaged snapshot refuses to open, naming its file: {error}"
        );
    }
}

#[tokio::test]
async fn install_snapshot_refuses_garbage_and_replaces_state() {
    let source_dir = TempDir::new().unwrap();
    let (_source_log, mut source) = open(source_dir.path()).await.unwrap();
    source
        .apply_entries(vec![
            membership_entry(1, 1),
            normal_entry(1, 2, create_session_batch(1_000, 1)),
        ])
        .unwrap();
    let snapshot = source
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    let meta = snapshot.meta;
    let built = snapshot.snapshot.into_bytes().unwrap();

    let dir = TempDir::new().unwrap();
    let (_log_store, mut state_machine) = open(dir.path()).await.unwrap();
    let garbage = SnapshotData::from_bytes(b"not a snapshot".to_vec());
    assert!(state_machine
        .install_snapshot(&meta, garbage)
        .await
        .is_err());
    // Cut short: the first bytes decode, the rest is missing.
    let truncated = SnapshotData::from_bytes(built[..built.len() - 1].to_vec());
    assert!(state_machine
        .install_snapshot(&meta, truncated)
        .await
        .is_err());
    assert_eq!(
        state_machine.applied_state().await.unwrap().0,
        None,
        "a refused install changes nothing"
    );
    assert!(
        state_machine
            .get_current_snapshot()
            .await
            .unwrap()
            .is_none(),
        "a refused install persists nothing"
    );
    assert_eq!(
        std::fs::read_dir(dir.path())
            .unwrap()
            .filter(|entry| entry
                .as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".tmp"))
            .count(),
        0,
        "a refused install leaves no file behind"
    );

    state_machine
        .install_snapshot(&meta, SnapshotData::from_bytes(built.clone()))
        .await
        .unwrap();
    let installed = state_machine
        .handle()
        .read(|machine, _| machine.encode_snapshot().unwrap())
        .unwrap();
    assert_eq!(installed, built);
    let current = state_machine.get_current_snapshot().await.unwrap().unwrap();
    assert_eq!(current.meta, meta);
    assert_eq!(
        state_machine.applied_state().await.unwrap().0,
        Some(log_id(1, 2))
    );
    let _: SnapshotMeta = current.meta;
}

/// A snapshot sent to a follower is gathered chunk by chunk into a file of its own, installed
/// from it, and the file is gone once the snapshot is; a transfer given up leaves nothing.
#[tokio::test]
async fn a_received_snapshot_is_gathered_in_a_file_installed_from_it_and_removed() {
    let source_dir = TempDir::new().unwrap();
    let (_source_log, mut source) = open(source_dir.path()).await.unwrap();
    let mut entries = vec![membership_entry(1, 1)];
    entries.extend(
        (2..200)
            .map(|index| normal_entry(1, index, create_session_batch(1_000, u128::from(index)))),
    );
    source.apply_entries(entries).unwrap();
    let built = source
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    let meta = built.meta;
    let bytes = built.snapshot.into_bytes().unwrap();

    let dir = TempDir::new().unwrap();
    let (_log_store, mut state_machine) = open(dir.path()).await.unwrap();
    let inbox = state_machine.snapshot_inbox();
    let leftovers = || {
        std::fs::read_dir(dir.path())
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.starts_with("snapshot-received-"))
            .collect::<Vec<_>>()
    };
    let given_up = {
        let mut receiving = inbox.receive().unwrap();
        receiving.append(&bytes[..10]).unwrap();
        leftovers()
    };
    assert_eq!(given_up.len(), 1, "gathered in a file: {given_up:?}");
    assert!(leftovers().is_empty(), "a transfer given up is removed");

    let mut receiving = inbox.receive().unwrap();
    for chunk in bytes.chunks(1000) {
        receiving.append(chunk).unwrap();
    }
    assert_eq!(receiving.len(), bytes.len() as u64);
    let data = receiving.finish().unwrap();
    assert_eq!(data.len(), bytes.len() as u64);
    state_machine.install_snapshot(&meta, data).await.unwrap();
    assert!(
        leftovers().is_empty(),
        "an installed snapshot's file is removed"
    );
    let installed = state_machine
        .handle()
        .read(|machine, _| machine.encode_snapshot().unwrap())
        .unwrap();
    assert_eq!(installed, bytes);
    let counted = state_machine
        .handle()
        .read(|machine, _| store::encoded_len(machine).unwrap())
        .unwrap();
    assert_eq!(counted, bytes.len() as u64, "the count a backup announces");
    let current = state_machine.get_current_snapshot().await.unwrap().unwrap();
    assert_eq!(current.meta, meta);
    assert_eq!(current.snapshot.into_bytes().unwrap(), bytes);
}

// ---- helpers ----

fn log_id(term: u64, index: u64) -> LogId {
    store::log_id(term, 1, index)
}

fn blank_entry(term: u64, index: u64) -> Entry {
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Blank,
    }
}

fn normal_entry(term: u64, index: u64, batch: Batch) -> Entry {
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Normal(batch),
    }
}

fn membership_entry(term: u64, index: u64) -> Entry {
    let voters = BTreeSet::from([1, 2, 3]);
    let nodes: BTreeMap<u64, Member> = voters
        .iter()
        .map(|id| {
            let member = Member {
                api_addr: format!("127.0.0.1:{}", 7420 + id),
                peer_addr: format!("127.0.0.1:{}", 7520 + id),
            };
            (*id, member)
        })
        .collect();
    let membership = Membership::new(vec![voters], nodes).unwrap();
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Membership(membership),
    }
}

fn create_session_batch(stamp_ms: u64, session: u128) -> Batch {
    let new_session = NewSession {
        session_id: SessionId(session),
        holder: "agent-a".to_owned(),
        ttl_ms: 30_000,
        labels: Default::default(),
    };
    Batch {
        stamp_ms,
        commands: vec![namespaced(Op::CreateSession(new_session))],
    }
}

fn acquire_batch(stamp_ms: u64, session: u128, resource: &str) -> Batch {
    let acquire = Op::Acquire {
        resource: ResourcePath::parse(resource, &Limits::default()).unwrap(),
        mode: LeaseMode::Exclusive,
        owner: Owner::Session(SessionId(session)),
        max_hold_ms: None,
        labels: Default::default(),
    };
    Batch {
        stamp_ms,
        commands: vec![namespaced(acquire)],
    }
}

fn namespaced(op: Op) -> Command {
    Command::Namespaced {
        namespace: Namespace::default_namespace(),
        idempotency: None,
        op,
    }
}

/// Opens the store in `dir`, waiting out the lock of a just-dropped handle on the same dir:
/// sled releases its file lock from background threads a moment after the last handle goes.
async fn open(dir: &Path) -> Result<(LogStore, StateMachineStore), StoreError> {
    retry_while_locked(|| store::open(dir)).await
}

/// A store holding blank entries 1 to 4 (term 1), closed, and its one segment file.
async fn four_blank_entries_in_one_segment() -> (TempDir, PathBuf) {
    let dir = TempDir::new().unwrap();
    {
        let (mut log_store, _state_machine) = open(dir.path()).await.unwrap();
        log_store
            .blocking_append((1..=4).map(|index| blank_entry(1, index)))
            .await
            .unwrap();
    }
    let segment = only_segment(dir.path());
    (dir, segment)
}

/// The one segment file of a small log in the store at `dir`.
fn only_segment(dir: &Path) -> PathBuf {
    let segments: Vec<PathBuf> = std::fs::read_dir(dir.join("raft-log"))
        .unwrap()
        .map(|item| item.unwrap().path())
        .collect();
    assert_eq!(segments.len(), 1, "{segments:?}");
    segments.into_iter().next().unwrap()
}

/// Where each record of a segment starts and ends: a 16-byte header (payload length, CRC,
/// index), then the payload.
fn record_offsets(bytes: &[u8]) -> Vec<(usize, usize)> {
    let mut records = Vec::new();
    let mut offset = 0;
    // Records end where the zeros written ahead of them begin.
    while offset < bytes.len() && bytes[offset..].iter().any(|byte| *byte != 0) {
        let len = u32::from_le_bytes(bytes[offset..offset + 4].try_into().unwrap()) as usize;
        records.push((offset, offset + 16 + len));
        offset += 16 + len;
    }
    records
}

/// A new data dir carries the stamp earlier builds (store formats 1 and 2) look for: a sled
/// database recording format 3. Without it such a build found no sled database, made an empty
/// one and started as a node with no vote and no log (it did: e0da6e0 served on a dir this
/// build had made), free to vote again in a term it had voted in.
#[tokio::test]
async fn a_new_dir_is_stamped_so_that_earlier_builds_refuse_it() {
    let dir = TempDir::new().unwrap();
    drop(open(dir.path()).await.unwrap());
    {
        let db = sled::open(dir.path()).unwrap();
        assert_eq!(sled_format(&db), 3);
    }
    // And this build opens it again as its own.
    let (mut log_store, _) = open(dir.path()).await.unwrap();
    assert_eq!(log_store.read_vote().await.unwrap(), None);
}

/// What an earlier build wrote into sled: the bincode of `value`.
fn bincode_of(value: &impl serde::Serialize) -> Vec<u8> {
    bincode::serde::encode_to_vec(value, bincode::config::standard()).unwrap()
}

/// The store format a sled database records.
fn sled_format(db: &sled::Db) -> u32 {
    let format = db
        .open_tree("meta")
        .unwrap()
        .get("format")
        .unwrap()
        .unwrap();
    let (format, _): (u32, usize) =
        bincode::serde::decode_from_slice(&format, bincode::config::standard()).unwrap();
    format
}

async fn retry_while_locked<T, E: Display>(mut open: impl FnMut() -> Result<T, E>) -> Result<T, E> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match open() {
            Err(error)
                if error.to_string().contains("could not acquire lock")
                    && Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            result => return result,
        }
    }
}

/// openraft 0.9 installed a received snapshot on its state-machine worker while RaftCore purged
/// the log up to that snapshot in parallel (0.10 waits for the install), and a purge past every
/// durable snapshot must still never lose what a restart needs: the committed entries after the last durable snapshot are
/// what a restart re-applies. Here: entries 0..=10, committed 6, a durable snapshot at 3 (or
/// none), then `purge(8)` as if the install of a snapshot at 8 had not reached disk yet. The
/// store reopens and loads its initial state, and the log is whole after the snapshot.
#[tokio::test]
async fn purge_past_the_durable_snapshot_keeps_what_a_restart_needs() {
    for snapshot_at in [Some(3), None] {
        let dir = TempDir::new().unwrap();
        // openraft's log starts at index 0, which a restart without a snapshot re-applies.
        let entries: Vec<Entry> = std::iter::once(membership_entry(1, 0))
            .chain(std::iter::once(normal_entry(
                1,
                1,
                create_session_batch(1_000, 1),
            )))
            .chain((2..=10).map(|index| blank_entry(1, index)))
            .collect();
        {
            let (mut log_store, mut state_machine) = open(dir.path()).await.unwrap();
            log_store
                .save_vote(&Vote::new_committed(1, 1))
                .await
                .unwrap();
            log_store.blocking_append(entries.clone()).await.unwrap();
            if let Some(snapshot_at) = snapshot_at {
                state_machine
                    .apply_entries(entries[..=snapshot_at].to_vec())
                    .unwrap();
                state_machine
                    .get_snapshot_builder()
                    .await
                    .build_snapshot()
                    .await
                    .unwrap();
            }
            log_store.save_committed(Some(log_id(1, 6))).await.unwrap();
            log_store.purge(log_id(1, 8)).await.unwrap();
            // While running, the store honours the purge: nothing at or below 8 is readable.
            let state = log_store.get_log_state().await.unwrap();
            assert_eq!(state.last_purged_log_id, Some(log_id(1, 8)));
            let first = log_store.try_get_log_entries(..).await.unwrap()[0].log_id;
            assert_eq!(first, log_id(1, 9), "snapshot at {snapshot_at:?}");
        }
        let (mut log_store, mut state_machine) = open(dir.path()).await.unwrap();
        StorageHelper::new(&mut log_store, &mut state_machine)
            .get_initial_state()
            .await
            .unwrap_or_else(|error| panic!("snapshot at {snapshot_at:?}: {error}"));
        assert_eq!(
            state_machine.applied_state().await.unwrap().0,
            Some(log_id(1, 6)),
            "snapshot at {snapshot_at:?}"
        );
        let state = log_store.get_log_state().await.unwrap();
        let snapshot_log_id = snapshot_at.map(|index| log_id(1, index as u64));
        assert_eq!(state.last_purged_log_id, snapshot_log_id);
        assert_eq!(state.last_log_id, Some(log_id(1, 10)));
    }
}

/// Once a snapshot covering the purge point is durable, the next purge (or a reopen) removes
/// the entries it covers.
#[tokio::test]
async fn entries_kept_past_a_purge_go_once_a_snapshot_covers_them() {
    let dir = TempDir::new().unwrap();
    let entries: Vec<Entry> = std::iter::once(membership_entry(1, 1))
        .chain((2..=10).map(|index| blank_entry(1, index)))
        .collect();
    {
        let (mut log_store, mut state_machine) = open(dir.path()).await.unwrap();
        log_store.blocking_append(entries.clone()).await.unwrap();
        log_store.purge(log_id(1, 8)).await.unwrap();
        state_machine.apply_entries(entries[..8].to_vec()).unwrap();
        state_machine
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
    }
    let (mut log_store, _state_machine) = open(dir.path()).await.unwrap();
    let state = log_store.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 8)));
    let indexes: Vec<u64> = log_store
        .try_get_log_entries(..)
        .await
        .unwrap()
        .iter()
        .map(|entry| entry.log_id.index)
        .collect();
    assert_eq!(indexes, vec![9, 10]);
}

/// `batond recover` replays a stopped member's dir and then swaps a new dir in for it: the
/// replay keeps the dir locked until the caller lets go, so no `batond` can start on the old
/// dir in between.
#[tokio::test]
async fn a_replayed_dir_stays_locked_until_the_replay_is_dropped() {
    let dir = TempDir::new().unwrap();
    {
        let (mut log_store, _state_machine) = open(dir.path()).await.unwrap();
        log_store
            .blocking_append(vec![
                membership_entry(1, 1),
                normal_entry(1, 2, create_session_batch(1_000, 1)),
            ])
            .await
            .unwrap();
    }
    let replayed = store::replay(dir.path()).await.unwrap();
    assert_eq!(replayed.applied, Some(log_id(1, 2)));
    assert_eq!(replayed.machine.counts().0, 1, "the session is applied");
    match store::open(dir.path()) {
        Err(StoreError::InUse(shown)) => assert_eq!(shown, dir.path().display().to_string()),
        other => panic!(
            "expected InUse while the replay is held, got {:?}",
            other.err()
        ),
    }
    drop(replayed);
    store::open(dir.path()).expect("the dir opens once the replay is dropped");
}

/// openraft reads only the meta of a snapshot it built, so the bytes are read back only when
/// read: as the file was written, or, if a newer snapshot replaced the file first, an error
/// that says so (never the newer snapshot's bytes under the older meta).
#[tokio::test]
async fn a_built_snapshot_reads_its_own_bytes_or_says_it_was_replaced() {
    let dir = TempDir::new().unwrap();
    let (_log, mut state_machine) = open(dir.path()).await.unwrap();
    state_machine
        .apply_entries(vec![
            membership_entry(1, 1),
            normal_entry(1, 2, create_session_batch(1_000, 1)),
        ])
        .unwrap();
    let mut builder = state_machine.get_snapshot_builder().await;
    let first = builder.build_snapshot().await.unwrap();
    state_machine
        .apply_entries(vec![normal_entry(1, 3, create_session_batch(2_000, 2))])
        .unwrap();
    let newer = builder.build_snapshot().await.unwrap();
    assert!(newer.meta.last_log_id > first.meta.last_log_id);
    let newer_len = newer.snapshot.len();
    let newer_bytes = newer.snapshot.into_bytes().unwrap();
    assert_eq!(newer_bytes.len() as u64, newer_len);
    let current = state_machine.get_current_snapshot().await.unwrap().unwrap();
    assert_eq!(current.snapshot.into_bytes().unwrap(), newer_bytes);
    let error = first.snapshot.into_bytes().unwrap_err().to_string();
    assert!(error.contains("replaced before it was read"), "{error}");
}

/// Gathering a snapshot is storage work openraft does not call: a disk error in it is kept by
/// the inbox, whose `failed` resolves with it, so that the node stops on it as openraft stops
/// on its own storage errors. Until then `failed` waits.
#[tokio::test]
async fn a_disk_error_while_gathering_a_snapshot_is_kept_for_the_node_to_stop_on() {
    let dir = TempDir::new().unwrap();
    let disk = SimDisk::default();
    let options = Options {
        io: Io::Threads,
        disk: Arc::new(disk.clone()),
        ..Options::default()
    };
    let (_log_store, state_machine) = open_with(dir.path(), &options).unwrap();
    let inbox = state_machine.snapshot_inbox();
    let mut receiving = inbox.receive().unwrap();
    receiving.append(b"first chunk").unwrap();
    let waiting = tokio::time::timeout(Duration::from_millis(50), inbox.failed()).await;
    assert!(waiting.is_err(), "no failure yet: {waiting:?}");

    disk.fail_after(disk.steps());
    let refused = receiving.append(b"second chunk").unwrap_err().to_string();
    assert!(inbox.receive().is_err(), "the disk refuses everything now");
    let failure = tokio::time::timeout(Duration::from_secs(5), inbox.failed())
        .await
        .expect("the failure is kept");
    assert_eq!(failure, refused, "the first error is the one kept");
}
