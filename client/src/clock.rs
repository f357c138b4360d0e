//! The local monotonic clock a lease guard measures its validity with (docs/guarantees.md G7), and the G7
//! arithmetic itself.
//!
//! The clock is a trait so that tests and the Jepsen clock nemesis can run a guard's clock
//! slow or fast, or drive it by hand. What must never live here: wall-clock time. A guard's
//! deadline is a local monotonic instant; absolute clock offsets between machines never enter
//! it, only the assumed rate error does.

use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The rate error assumed between any two monotonic clocks (docs/guarantees.md G6): 1%.
pub const CLOCK_RATE_ERROR_DEFAULT: f64 = 0.01;

/// A monotonic clock: the time elapsed since an arbitrary origin fixed when the clock was
/// made. It must never go backwards.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The current reading.
    fn now(&self) -> Duration;
}

/// The operating system's monotonic clock ([`Instant`]). The default.
#[derive(Debug, Clone, Copy)]
pub struct SystemClock {
    origin: Instant,
}

impl SystemClock {
    /// A clock reading zero now.
    pub fn new() -> SystemClock {
        SystemClock {
            origin: Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> SystemClock {
        SystemClock::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }
}

/// The system clock run at `rate` times real speed: `0.99` is a clock 1% slow, the worst
/// case G7 must survive. For tests and fault injection.
#[derive(Debug, Clone, Copy)]
pub struct SkewedClock {
    origin: Instant,
    rate: f64,
}

impl SkewedClock {
    /// A clock reading zero now and advancing `rate` seconds per real second.
    ///
    /// # Panics
    ///
    /// When `rate` is not a positive finite number.
    pub fn new(rate: f64) -> SkewedClock {
        assert!(
            rate.is_finite() && rate > 0.0,
            "a clock rate must be positive and finite, not {rate}"
        );
        SkewedClock {
            origin: Instant::now(),
            rate,
        }
    }
}

impl Clock for SkewedClock {
    fn now(&self) -> Duration {
        self.origin.elapsed().mul_f64(self.rate)
    }
}

/// A clock that moves only when told to. For unit tests of guards and of the G7 arithmetic.
#[derive(Debug, Default)]
pub struct ManualClock {
    now: Mutex<Duration>,
}

impl ManualClock {
    /// A clock reading zero.
    pub fn new() -> ManualClock {
        ManualClock::default()
    }

    /// Moves the clock forward by `step`.
    pub fn advance(&self, step: Duration) {
        let mut now = self
            .now
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *now += step;
    }

    /// Sets the reading; a value below the current one is ignored (the clock is monotonic).
    pub fn set(&self, reading: Duration) {
        let mut now = self
            .now
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *now = (*now).max(reading);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        *self
            .now
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A clock rate error in parts per million, rounded up so that the guard never claims more
/// than G7 allows.
///
/// # Panics
///
/// When `rate_error` is not in `0.0..0.5` (at 0.5 or more no validity is left at all).
pub(crate) fn rate_error_ppm(rate_error: f64) -> u64 {
    assert!(
        (0.0..0.5).contains(&rate_error),
        "clock_rate_error must be in 0.0..0.5, not {rate_error}"
    );
    (rate_error * 1e6).ceil() as u64
}

/// `expires_in_ms` shrunk as docs/guarantees.md G7 says: `(expires_in_ms - 1) * (1 - 2 * rate_error)`,
/// rounded down to the nanosecond (integer arithmetic, so never a rounding error upward).
pub fn shrunk_validity(expires_in_ms: u64, rate_error: f64) -> Duration {
    let ppm = u128::from(rate_error_ppm(rate_error));
    let nanos = u128::from(expires_in_ms.saturating_sub(1)) * 1_000_000;
    let shrunk = nanos * (1_000_000 - 2 * ppm) / 1_000_000;
    Duration::from_nanos(u64::try_from(shrunk).unwrap_or(u64::MAX))
}

/// The local instant until which a holder may act (docs/guarantees.md G7): `sent_at` (the local send time of
/// the first attempt of the successful acquire or keepalive) plus [`shrunk_validity`].
pub fn valid_until(sent_at: Duration, expires_in_ms: u64, rate_error: f64) -> Duration {
    sent_at.saturating_add(shrunk_validity(expires_in_ms, rate_error))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validity_follows_g7_exactly() {
        // (sent_at ms, expires_in_ms, rate error, expected valid-until in ns)
        let cases: [(u64, u64, f64, u64); 7] = [
            // 30 s at 1%: 29,999 ms * 0.98 = 29,399.02 ms.
            (0, 30_000, 0.01, 29_399_020_000),
            (1_000, 30_000, 0.01, 1_000_000_000 + 29_399_020_000),
            // 1 s at 1%: 999 ms * 0.98 = 979.02 ms.
            (5, 1_000, 0.01, 5_000_000 + 979_020_000),
            // No rate error: only the rounding millisecond goes.
            (0, 1_000, 0.0, 999_000_000),
            // Nothing left: 0 and 1 ms give no validity at all.
            (7, 1, 0.01, 7_000_000),
            (7, 0, 0.01, 7_000_000),
            // A rate error that is not a whole ppm is rounded up (conservative).
            (0, 1_001, 0.000_000_5, 999_998_000),
        ];
        for (sent_at_ms, expires_in_ms, rate_error, expected_ns) in cases {
            let sent_at = Duration::from_millis(sent_at_ms);
            assert_eq!(
                valid_until(sent_at, expires_in_ms, rate_error),
                Duration::from_nanos(expected_ns),
                "sent at {sent_at_ms} ms, expires in {expires_in_ms} ms, rate error {rate_error}"
            );
        }
    }

    #[test]
    fn validity_never_exceeds_the_slowest_server_view() {
        // The servers' clock may run (1 + e) fast while ours runs (1 - e) slow: our reading of
        // the true deadline is at least expires_in * (1 - e) / (1 + e) > expires_in * (1 - 2e).
        for expires_in_ms in [1u64, 2, 999, 1_000, 30_000, 3_600_000] {
            let claimed = shrunk_validity(expires_in_ms, 0.01).as_secs_f64() * 1e3;
            let bound = expires_in_ms.saturating_sub(1) as f64 * 0.99 / 1.01;
            assert!(claimed <= bound, "{expires_in_ms}: {claimed} > {bound}");
        }
    }

    #[test]
    fn clocks_are_monotonic_and_skewable() {
        let manual = ManualClock::new();
        manual.advance(Duration::from_millis(5));
        manual.set(Duration::from_millis(3));
        assert_eq!(manual.now(), Duration::from_millis(5));
        let slow = SkewedClock::new(0.5);
        let system = SystemClock::new();
        std::thread::sleep(Duration::from_millis(20));
        assert!(slow.now() < system.now());
    }
}
