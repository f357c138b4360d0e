//! Power cuts at every step of a workload, on the simulated disk of `files::sim`: the store's
//! small files and the log's segments live on it (durable only once synced, names only once
//! their directory is). For every operation a workload's run does, one run stops there (every
//! file operation after it fails), power is cut (with none, all, or a random part of each
//! unsynced write reaching the disk anyway, torn ones included), and the store reopens. It
//! must open, and hold every write it acknowledged: the vote (never older than the last one
//! saved, so a node never votes twice in a term), the log's entries, the purge point and the
//! snapshot.

use std::sync::Arc;

use openraft::storage::{IOFlushed, RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::{EntryPayload, RaftLogReader, RaftSnapshotBuilder};

use super::files::sim::SimDisk;
use super::{
    open_with, DiskLatency, Entry, Io, LogId, LogStore, Options, StateMachineStore, StoreError,
    Vote,
};

/// What the store acknowledged before the cut.
#[derive(Debug, Default, Clone, Copy)]
struct Acknowledged {
    vote: Option<Vote>,
    /// The last entry appended.
    appended: Option<u64>,
    purged: Option<LogId>,
    snapshot: Option<LogId>,
}

fn log_id(term: u64, index: u64) -> LogId {
    super::log_id(term, 1, index)
}

fn blank(term: u64, index: u64) -> Entry {
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Blank,
    }
}

/// A small deterministic generator (xorshift64*).
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn coin(&mut self) -> bool {
        self.next() & 1 == 1
    }
}

/// The store in `dir` on `disk`, with segments of a few entries each, so that purges remove
/// some.
fn open_on(
    dir: &std::path::Path,
    disk: &SimDisk,
) -> Result<(LogStore, StateMachineStore), StoreError> {
    let options = Options {
        io: Io::Threads,
        disk: Arc::new(disk.clone()),
        segment_bytes: 100,
    };
    open_with(dir, &options)
}

/// Votes, appends, commits, snapshots and purges, in rounds; records each acknowledgement.
/// Stops at the first error (the cut).
async fn workload(dir: &std::path::Path, disk: &SimDisk, acked: &mut Acknowledged) {
    let Ok((mut log, mut machine)) = open_on(dir, disk) else {
        return;
    };
    let mut index = 0;
    for term in 1..=4_u64 {
        let vote = Vote::new(term, term % 3 + 1);
        if log.save_vote(&vote).await.is_err() {
            return;
        }
        acked.vote = Some(vote);
        let entries: Vec<_> = (index + 1..=index + 3).map(|i| blank(term, i)).collect();
        index += 3;
        if log.blocking_append(entries.clone()).await.is_err() {
            return;
        }
        acked.appended = Some(index);
        if log.save_committed(Some(log_id(term, index))).await.is_err() {
            return;
        }
        let entries =
            futures_util::stream::iter(entries.into_iter().map(|entry| Ok((entry, None))));
        if machine.apply(entries).await.is_err() {
            return;
        }
        let Ok(snapshot) = machine.get_snapshot_builder().await.build_snapshot().await else {
            return;
        };
        acked.snapshot = snapshot.meta.last_log_id;
        if term % 2 == 0 {
            let upto = log_id(term, index - 1);
            if log.purge(upto).await.is_err() {
                return;
            }
            acked.purged = Some(upto);
        }
        let committed = Vote::new_committed(term, term % 3 + 1);
        if log.save_vote(&committed).await.is_err() {
            return;
        }
        acked.vote = Some(committed);
    }
}

#[tokio::test]
async fn power_cut_at_every_step_keeps_every_acknowledged_write() {
    let steps = {
        let dir = tempfile::tempdir().unwrap();
        let disk = SimDisk::default();
        let mut acked = Acknowledged::default();
        workload(dir.path(), &disk, &mut acked).await;
        assert!(acked.vote.is_some() && acked.purged.is_some() && acked.snapshot.is_some());
        assert_eq!(acked.appended, Some(12));
        disk.steps()
    };
    let mut random = Random(0x5eed_f00d_ba70);
    let mut cuts = 0;
    for cut_at in 0..=steps {
        for keep in ["none", "all", "some"] {
            let dir = tempfile::tempdir().unwrap();
            let disk = SimDisk::default();
            disk.fail_after(cut_at);
            let mut acked = Acknowledged::default();
            workload(dir.path(), &disk, &mut acked).await;
            let seed = random.next();
            let mut coins = Random(seed | 1);
            let disk = disk.power_cut(|steps| match keep {
                "none" => 0,
                "all" => steps,
                _ if coins.coin() => steps,
                _ => coins.next() % (steps + 1),
            });
            let context = format!("cut after {cut_at} of {steps} steps, {keep} unsynced kept (seed {seed}), acknowledged {acked:?}");
            let (mut log, mut machine) = open_on(dir.path(), &disk)
                .unwrap_or_else(|error| panic!("does not reopen: {error}; {context}"));
            let vote = log.read_vote().await.unwrap();
            assert!(
                vote >= acked.vote,
                "the vote went back to {vote:?}; {context}"
            );
            let state = log.get_log_state().await.unwrap();
            assert!(
                state.last_log_id.map(|log_id| log_id.index) >= acked.appended,
                "the log went back to {:?}; {context}",
                state.last_log_id
            );
            assert!(
                state.last_purged_log_id >= acked.purged,
                "the purge point went back to {:?}; {context}",
                state.last_purged_log_id
            );
            let (applied, _) = machine.applied_state().await.unwrap();
            assert!(
                applied >= acked.snapshot,
                "the snapshot went back to {applied:?}; {context}"
            );
            let current = machine.get_current_snapshot().await.unwrap();
            assert_eq!(
                current.and_then(|snapshot| snapshot.meta.last_log_id),
                applied,
                "{context}"
            );
            // Whatever was purged, the log goes on right after it.
            if let Some(last) = state.last_log_id {
                let first = state
                    .last_purged_log_id
                    .map_or(1, |purged| purged.index + 1);
                let entries = log.try_get_log_entries(first..=last.index).await.unwrap();
                assert_eq!(entries.len() as u64, last.index + 1 - first, "{context}");
            }
            cuts += 1;
        }
    }
    assert!(
        cuts > 100,
        "only {cuts} cuts: the workload is too small to say much"
    );
}

/// openraft saves the committed log id (written in place, never synced) as soon as a quorum
/// has flushed an entry, and on a leader that quorum may be its followers while its own append
/// of the entry is written and not yet synced. A power cut may then keep the committed id and
/// lose the entries it names. Whatever a cut keeps of the two, the store must open and name no
/// committed entry past the end of its log: openraft re-applies up to that id at startup, and
/// an id past the log stops the node from starting (the simulator's seed 36, once its disk had
/// latency).
// One thread: the flusher task cannot run before the cut, so the append is surely unsynced.
#[tokio::test]
async fn a_committed_id_a_power_cut_kept_past_the_log_it_lost_names_the_logs_end() {
    for kept in 0..16_u32 {
        let dir = tempfile::tempdir().unwrap();
        let disk = SimDisk::default();
        let options = |disk: &SimDisk| Options {
            io: Io::Simulated(DiskLatency::new(u64::from(kept))),
            disk: Arc::new(disk.clone()),
            segment_bytes: 100,
        };
        let (mut log, machine) = open_with(dir.path(), &options(&disk)).unwrap();
        log.blocking_append((1..=3).map(|index| blank(1, index)))
            .await
            .unwrap();
        // Written; its flush waits on the simulated disk.
        log.append([blank(1, 4), blank(1, 5)], IOFlushed::noop())
            .await
            .unwrap();
        log.save_committed(Some(log_id(1, 5))).await.unwrap();
        // Each unsynced change, in turn, survives whole or not at all, as `kept`'s bits say.
        let mut change = 0;
        let disk = disk.power_cut(|steps| {
            let survives = kept >> change & 1 == 1;
            change += 1;
            if survives {
                steps
            } else {
                0
            }
        });
        drop((log, machine));
        let (mut log, _machine) = open_with(dir.path(), &options(&disk))
            .unwrap_or_else(|error| panic!("does not reopen ({kept:04b} kept): {error}"));
        let last = log.get_log_state().await.unwrap().last_log_id;
        let committed = log.read_committed().await.unwrap();
        assert!(last.is_some_and(|last| last.index >= 3), "{last:?}");
        assert!(
            committed <= last,
            "committed {committed:?} past the log's end {last:?} ({kept:04b} kept)"
        );
    }
}

/// A crash (the process killed, its page cache kept) between an append's write and its flush
/// leaves a whole record on disk that was never synced. The restarted store reads it back as
/// part of its log and may acknowledge it to a leader; once later appends go to a new segment,
/// nothing syncs the old one, and a power cut then loses or tears a record before the last
/// segment: the store refused to open (the simulator's seed 5675). What the store finds when it
/// opens must be made durable before it is relied on.
// One thread: the flusher task cannot run before the crash, so the append is surely unsynced.
#[tokio::test]
async fn a_record_a_crash_left_unsynced_is_made_durable_when_the_store_opens() {
    let dir = tempfile::tempdir().unwrap();
    let options = |disk: &SimDisk| Options {
        io: Io::Simulated(DiskLatency::new(7)),
        disk: Arc::new(disk.clone()),
        segment_bytes: 100,
    };
    let disk = SimDisk::default();
    let (mut log, machine) = open_with(dir.path(), &options(&disk)).unwrap();
    log.blocking_append((1..=2).map(|index| blank(1, index)))
        .await
        .unwrap();
    // Enough records to fill the segment: the next append starts a new one.
    log.append((3..=8).map(|index| blank(1, index)), IOFlushed::noop())
        .await
        .unwrap();
    let disk = disk.crash();
    drop((log, machine));

    let (mut log, machine) = open_with(dir.path(), &options(&disk)).unwrap();
    let found = log.get_log_state().await.unwrap().last_log_id;
    assert_eq!(found.map(|log_id| log_id.index), Some(8));
    for index in 9..=12 {
        log.blocking_append([blank(1, index)]).await.unwrap();
    }
    let disk = disk.power_cut(|_| 0);
    drop((log, machine));

    let (mut log, _machine) = open_with(dir.path(), &options(&disk))
        .unwrap_or_else(|error| panic!("does not reopen after the power cut: {error}"));
    let state = log.get_log_state().await.unwrap();
    assert_eq!(state.last_log_id.map(|log_id| log_id.index), Some(12));
    let entries = log.try_get_log_entries(1..=12).await.unwrap();
    assert_eq!(entries.len(), 12);
}
