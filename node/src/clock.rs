//! The node's clock: the only place `batond` reads time for stamping proposals.
//!
//! Stamps are derived from a monotonic clock (never the wall clock), so wall-clock offsets
//! between nodes never enter a deadline (docs/guarantees.md, "Time"). For the fault harness the clock can be
//! driven: its rate can be changed while running, when the node was started with
//! `--clock-control` (never in production use).

use std::sync::Mutex;

use baton_raft_store::proposer::Clock;
use std::time::{Duration, Instant};

/// The monotonic clock with an adjustable rate (1.0 = real time) and a wall-clock offset used
/// only for the informational `expires_at` fields.
#[derive(Debug)]
pub struct NodeClock {
    state: Mutex<ClockState>,
}

#[derive(Debug)]
struct ClockState {
    /// Real instant and scaled reading at the last rate change.
    anchor: Instant,
    anchor_ms: f64,
    rate: f64,
    wall_offset_ms: i64,
}

impl Default for NodeClock {
    fn default() -> Self {
        NodeClock {
            state: Mutex::new(ClockState {
                anchor: Instant::now(),
                anchor_ms: 0.0,
                rate: 1.0,
                wall_offset_ms: 0,
            }),
        }
    }
}

impl NodeClock {
    /// Changes the rate from now on; the reading never jumps and never goes backwards.
    pub fn set_rate(&self, rate: f64) {
        let mut state = self.state.lock().expect("clock lock");
        let now = Instant::now();
        state.anchor_ms += elapsed_ms(state.anchor, now) * state.rate;
        state.anchor = now;
        state.rate = rate.max(0.0);
    }

    pub fn set_wall_offset_ms(&self, offset_ms: i64) {
        self.state.lock().expect("clock lock").wall_offset_ms = offset_ms;
    }

    /// Milliseconds since the Unix epoch by the (possibly offset) wall clock.
    pub fn wall_ms(&self) -> i64 {
        let since_epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        i64::try_from(since_epoch.as_millis()).unwrap_or(i64::MAX)
            + self.state.lock().expect("clock lock").wall_offset_ms
    }
}

impl Clock for NodeClock {
    fn now_ms(&self) -> u64 {
        let state = self.state.lock().expect("clock lock");
        let reading = state.anchor_ms + elapsed_ms(state.anchor, Instant::now()) * state.rate;
        reading as u64
    }
}

fn elapsed_ms(from: Instant, to: Instant) -> f64 {
    to.saturating_duration_since(from).as_secs_f64() * 1_000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_changes_never_move_the_reading_backwards() {
        let clock = NodeClock::default();
        let before = clock.now_ms();
        clock.set_rate(0.0);
        let frozen = clock.now_ms();
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(clock.now_ms(), frozen, "a stopped clock does not advance");
        assert!(frozen >= before);
        clock.set_rate(2.0);
        std::thread::sleep(Duration::from_millis(20));
        assert!(clock.now_ms() >= frozen + 30, "a doubled rate runs fast");
    }
}
