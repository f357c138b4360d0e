//! Bugs put back on purpose, so that the simulator (`baton-jepsen sim`) can show that it finds
//! them; they live in the store, its Raft configuration and the proposer. A mutation is switched on for the calling thread only, and only in a build with the
//! `mutations` feature, which only baton-jepsen's tests turn on: `batond` is never built with
//! it, and without it `active` is always false.

/// A bug the simulator must find.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mutation {
    /// `save_vote` answers without writing the vote: a node that restarts forgets whom it voted
    /// for, and may vote again in the same term (two leaders of one term).
    VoteNotSaved,
    /// `truncate_after` keeps the entries it should remove: a follower keeps a deposed
    /// leader's uncommitted entries where the new leader's belong.
    TruncateNothing,
    /// The proposer answers `NotLeader` (surely not applied) for an entry a deposed leader
    /// dropped from its log, as it once did (issue 9's second guarantee bug): a new leader may
    /// have committed and applied it, and the client that was told it was refused then sees it.
    DiscardedIsNotLeader,
    /// A log append counts as flushed without its `fdatasync`: a power cut loses entries the
    /// node acknowledged to the leader (or, on the leader, counted toward a commit).
    AppendNotSynced,
    /// The snapshot file is replaced without syncing it or its directory, and still counts as
    /// durable, so the log is purged up to it (issue 9's first guarantee bug, a purge past a
    /// snapshot that is not durable): a power cut leaves the log's prefix gone and no snapshot
    /// that covers it.
    SnapshotNotSynced,
    /// A new leader's clock starts at its own monotonic reading rather than at the applied
    /// state's cluster time: cluster time jumps ahead at a failover by whatever the readings
    /// and the cluster time had drifted apart (leaderless gaps, a fast clock), and leases
    /// expire before their holders' time is up.
    ClockFromReading,
    /// A restarted leader resumes leading in its old term (openraft's default), though a power
    /// cut may have lost appends of its that its followers had synced and committed: it then
    /// writes other entries at those indexes, and the replicas part.
    LeaderRestored,
}

#[cfg(feature = "mutations")]
thread_local! {
    static ACTIVE: std::cell::Cell<Option<Mutation>> = const { std::cell::Cell::new(None) };
}

/// Switches `mutation` on for this thread (`None`: none).
#[cfg(feature = "mutations")]
pub fn set(mutation: Option<Mutation>) {
    ACTIVE.with(|active| active.set(mutation));
}

/// Whether `mutation` is on for this thread.
pub fn active(mutation: Mutation) -> bool {
    #[cfg(feature = "mutations")]
    return ACTIVE.with(|active| active.get()) == Some(mutation);
    #[cfg(not(feature = "mutations"))]
    {
        let _ = mutation;
        false
    }
}
