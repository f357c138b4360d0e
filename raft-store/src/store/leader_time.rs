//! The leader clock's rules, pure: when a leader may start stamping, and with what. No tokio,
//! no openraft, no reading of a clock: the node's proposer feeds in the term, the log and
//! applied positions and a monotonic reading, and waits where this says to; the simulator's
//! clients do the same with each simulated node's clock.
//!
//! The rules (docs: the time model): a leader's clock starts only once it has applied every
//! entry that was in its log when it took over, or resumed after a restart in the same term
//! (openraft 0.9 appends no new blank entry then, so the applied state may lack entries
//! another leader committed). It starts at the cluster time of that applied state, and from
//! then on advances with the node's monotonic clock. The start was stamped earlier in real
//! time, so cluster time gains nothing on real time at a failover; the leaderless gap simply
//! extends every lease.

use super::mutation::{self, Mutation};

/// What the next entry needs from the shell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stamp {
    /// Stamp it with this cluster time.
    At(u64),
    /// Wait until the applied index reaches `index` (the takeover log), then ask again.
    ApplyFirst { index: Option<u64> },
}

/// One node's leader clock across terms.
#[derive(Debug, Clone, Copy, Default)]
pub struct LeaderTime {
    /// The term this node leads and the last log index it saw when it noticed: the takeover
    /// log it must apply before stamping.
    takeover: Option<Takeover>,
    /// The started clock, of the term it was started in.
    clock: Option<Clock>,
}

#[derive(Debug, Clone, Copy)]
struct Takeover {
    term: u64,
    index: Option<u64>,
}

/// Cluster time `base_ms` at monotonic reading `base_reading_ms`.
#[derive(Debug, Clone, Copy)]
struct Clock {
    term: u64,
    base_ms: u64,
    base_reading_ms: u64,
}

impl LeaderTime {
    /// The stamp of the next entry this node proposes as leader of `term`, given the last
    /// index in its log now, its applied index (`None`: empty) and the cluster time of its
    /// applied state, and a reading of its monotonic clock.
    pub fn stamp(
        &mut self,
        term: u64,
        last_log_index: Option<u64>,
        applied_index: Option<u64>,
        applied_time_ms: u64,
        reading_ms: u64,
    ) -> Stamp {
        if let Some(clock) = self.clock.filter(|clock| clock.term == term) {
            return Stamp::At(clock.base_ms + reading_ms.saturating_sub(clock.base_reading_ms));
        }
        let takeover = match self.takeover {
            Some(takeover) if takeover.term == term => takeover,
            _ => {
                let takeover = Takeover {
                    term,
                    index: last_log_index,
                };
                self.takeover = Some(takeover);
                takeover
            }
        };
        if applied_index < takeover.index {
            return Stamp::ApplyFirst {
                index: takeover.index,
            };
        }
        let base_ms = if mutation::active(Mutation::ClockFromReading) {
            reading_ms
        } else {
            applied_time_ms
        };
        self.clock = Some(Clock {
            term,
            base_ms,
            base_reading_ms: reading_ms,
        });
        Stamp::At(base_ms)
    }

    /// The term whose clock has started, if any: from then on this node, as leader of that
    /// term, has applied its whole takeover log and may answer reads.
    pub fn started_term(&self) -> Option<u64> {
        self.clock.map(|clock| clock.term)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_starts_at_the_applied_time_once_the_takeover_log_is_applied() {
        let mut time = LeaderTime::default();
        // Term 3: the log holds entries up to 40 at takeover; 35 are applied.
        assert_eq!(
            time.stamp(3, Some(40), Some(35), 9_000, 100),
            Stamp::ApplyFirst { index: Some(40) }
        );
        assert_eq!(time.started_term(), None);
        // More entries arrive meanwhile (the new leader's own): the takeover log stays 40.
        assert_eq!(
            time.stamp(3, Some(45), Some(39), 9_100, 150),
            Stamp::ApplyFirst { index: Some(40) }
        );
        // Applied: the clock starts at the applied state's cluster time, not at the reading.
        assert_eq!(
            time.stamp(3, Some(45), Some(40), 9_200, 200),
            Stamp::At(9_200)
        );
        assert_eq!(time.started_term(), Some(3));
    }

    #[test]
    fn stamps_rise_with_the_monotonic_clock_and_never_fall() {
        let mut time = LeaderTime::default();
        assert_eq!(
            time.stamp(1, Some(0), Some(0), 5_000, 1_000),
            Stamp::At(5_000)
        );
        let mut previous = 5_000;
        for reading in [1_000, 1_001, 1_250, 1_250, 4_000] {
            let Stamp::At(stamp) = time.stamp(1, Some(7), Some(7), 0, reading) else {
                panic!("the clock has started");
            };
            assert!(stamp >= previous, "{stamp} after {previous}");
            assert_eq!(stamp, 5_000 + (reading - 1_000));
            previous = stamp;
        }
        // A reading below the base (cannot happen with a monotonic clock) never goes back.
        assert_eq!(time.stamp(1, Some(7), Some(7), 0, 900), Stamp::At(5_000));
    }

    #[test]
    fn a_restarted_leader_in_the_same_term_applies_its_log_before_stamping() {
        let mut before = LeaderTime::default();
        assert_eq!(
            before.stamp(4, Some(10), Some(10), 7_000, 50),
            Stamp::At(7_000)
        );
        // The process restarts and resumes leadership of term 4: its clock is gone, and its
        // applied state (rebuilt from a snapshot) trails its log.
        let mut after = LeaderTime::default();
        assert_eq!(
            after.stamp(4, Some(12), Some(8), 6_500, 10),
            Stamp::ApplyFirst { index: Some(12) }
        );
        assert_eq!(
            after.stamp(4, Some(12), Some(12), 7_300, 20),
            Stamp::At(7_300)
        );
    }

    #[test]
    fn a_new_term_starts_a_new_clock_from_the_applied_state() {
        let mut time = LeaderTime::default();
        assert_eq!(time.stamp(2, Some(5), Some(5), 1_000, 0), Stamp::At(1_000));
        assert_eq!(time.stamp(2, Some(5), Some(5), 0, 500), Stamp::At(1_500));
        // Leadership lost and regained in term 6: the old clock does not carry over.
        assert_eq!(
            time.stamp(6, Some(20), Some(18), 1_400, 900),
            Stamp::ApplyFirst { index: Some(20) }
        );
        assert_eq!(time.started_term(), Some(2));
        assert_eq!(
            time.stamp(6, Some(20), Some(20), 1_450, 2_000),
            Stamp::At(1_450)
        );
        assert_eq!(
            time.stamp(6, Some(21), Some(21), 0, 2_100),
            Stamp::At(1_550)
        );
        assert_eq!(time.started_term(), Some(6));
    }
}
