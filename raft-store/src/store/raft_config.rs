//! openraft's configuration of a Baton node, from the few numbers `batond`'s flags set: one
//! place for both `batond` and the simulator, so the simulator runs the protocol as deployed.

use openraft::{Config, ConfigError, SnapshotPolicy};

use super::mutation::{self, Mutation};

/// The numbers a node's Raft is configured from.
#[derive(Debug, Clone, Copy)]
pub struct RaftTiming {
    /// How often the leader sends heartbeats.
    pub heartbeat_ms: u64,
    /// The least time a follower waits for a leader before it calls an election.
    pub election_timeout_ms: u64,
    /// Entries applied between snapshots (stretched per node: `snapshot_interval`).
    pub snapshot_log_entries: u64,
    /// The largest piece of a snapshot one message carries.
    pub snapshot_chunk_bytes: u64,
}

/// The configuration of node `node_id`, validated.
pub fn raft_config(node_id: u64, timing: &RaftTiming) -> Result<Config, ConfigError> {
    Config {
        cluster_name: "baton".to_owned(),
        heartbeat_interval: timing.heartbeat_ms,
        election_timeout_min: timing.election_timeout_ms,
        // openraft also takes the maximum as the leader's lease: a follower that stops hearing
        // the leader waits out the lease and then a random timeout between the two. At 1.5x
        // (not 2x) a dead leader is replaced after 0.375-0.45 s of silence with the defaults,
        // not 0.45-0.6 s, and the random spread (75 ms) still dwarfs a vote's round trip.
        election_timeout_max: timing.election_timeout_ms + timing.election_timeout_ms / 2,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(snapshot_interval(
            node_id,
            timing.snapshot_log_entries,
        )),
        max_in_snapshot_log_to_keep: timing.snapshot_log_entries.min(1_000),
        // Each chunk of a snapshot gets this long (the network sends one message a chunk).
        install_snapshot_timeout: 10_000,
        snapshot_max_chunk_size: timing.snapshot_chunk_bytes,
        // A member coming back from a partition, or one removed that keeps running, asks first
        // whether it could win, and disturbs no healthy leader (docs/guarantees.md).
        enable_pre_vote: Some(true),
        // The log store writes an append and returns, flushing it on a thread of its own: so
        // the followers get the entries while the leader flushes them (docs/performance.md).
        broadcast_submitted_on_append: Some(true),
        // So a leader's followers may hold, synced, entries the leader had not synced when its
        // power went: a leader restored in its old term after such a cut would write other
        // entries at those indexes, and the replicas would part. A restarted leader stands for
        // election like any node instead; one whose log lacks committed entries cannot win.
        enable_leader_restore: Some(mutation::active(Mutation::LeaderRestored)),
        ..Default::default()
    }
    .validate()
}

/// Entries between this node's snapshots: `snapshot_log_entries`, stretched by up to a
/// quarter by node id, so that the nodes of a cluster do not all build and persist a
/// snapshot at the same entry. When they did, every node's appends stalled at once behind the
/// snapshot's write and flush, and the cluster's writes waited (tail latency of 10,000
/// renewing sessions, and at a million leases an election).
fn snapshot_interval(node_id: u64, snapshot_log_entries: u64) -> u64 {
    snapshot_log_entries + snapshot_log_entries * (node_id % 4) / 12
}

#[cfg(test)]
mod tests {
    use super::snapshot_interval;

    #[test]
    fn the_nodes_of_a_cluster_snapshot_at_different_entries() {
        let intervals: Vec<u64> = (1..=3).map(|id| snapshot_interval(id, 10_000)).collect();
        assert_eq!(intervals, [10_833, 11_666, 12_500]);
        for id in 1..=100 {
            let interval = snapshot_interval(id, 20);
            assert!((20..=25).contains(&interval), "node {id}: {interval}");
        }
    }
}
