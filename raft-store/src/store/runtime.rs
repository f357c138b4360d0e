//! The async runtime openraft runs on: tokio, with one difference. openraft draws its
//! randomness (election timeouts, the first tick's phase) from `AsyncRuntime::thread_rng`, and
//! tokio's answer is seeded by the operating system. A thread that has called [`seed_thread`]
//! draws from a generator seeded by the caller instead, so a simulation that runs a whole
//! cluster on one thread under tokio's paused clock replays exactly from its seed. A thread
//! that never calls it (every thread of `batond`) draws as tokio's runtime does.

use std::cell::Cell;
use std::future::Future;
use std::time::Duration;

use openraft::{AsyncRuntime, OptionalSend, TokioRuntime};
use rand::rngs::SmallRng;
use rand::SeedableRng;

thread_local! {
    /// The next seed of this thread's draws, once [`seed_thread`] has set one.
    static SEED: Cell<Option<u64>> = const { Cell::new(None) };
}

/// From now on, openraft's random draws on this thread follow from `seed` (`None`: from the
/// operating system again).
pub fn seed_thread(seed: Option<u64>) {
    SEED.with(|cell| cell.set(seed));
}

/// SplitMix64: the seed of the draw after the one seeded by `seed`.
fn next_seed(seed: u64) -> u64 {
    let z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// tokio, with [`seed_thread`]'s randomness.
#[derive(Debug)]
pub struct Runtime(TokioRuntime);

impl AsyncRuntime for Runtime {
    type JoinError = <TokioRuntime as AsyncRuntime>::JoinError;
    type JoinHandle<T: OptionalSend + 'static> = <TokioRuntime as AsyncRuntime>::JoinHandle<T>;
    type Sleep = <TokioRuntime as AsyncRuntime>::Sleep;
    type Instant = <TokioRuntime as AsyncRuntime>::Instant;
    type TimeoutError = <TokioRuntime as AsyncRuntime>::TimeoutError;
    type Timeout<R, T: Future<Output = R> + OptionalSend> =
        <TokioRuntime as AsyncRuntime>::Timeout<R, T>;
    type ThreadLocalRng = SmallRng;
    type Mpsc = <TokioRuntime as AsyncRuntime>::Mpsc;
    type Watch = <TokioRuntime as AsyncRuntime>::Watch;
    type Oneshot = <TokioRuntime as AsyncRuntime>::Oneshot;
    type Mutex<T: OptionalSend + 'static> = <TokioRuntime as AsyncRuntime>::Mutex<T>;

    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        TokioRuntime::spawn(future)
    }

    fn sleep(duration: Duration) -> Self::Sleep {
        TokioRuntime::sleep(duration)
    }

    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        TokioRuntime::sleep_until(deadline)
    }

    fn timeout<R, F: Future<Output = R> + OptionalSend>(
        duration: Duration,
        future: F,
    ) -> Self::Timeout<R, F> {
        TokioRuntime::timeout(duration, future)
    }

    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(
        deadline: Self::Instant,
        future: F,
    ) -> Self::Timeout<R, F> {
        TokioRuntime::timeout_at(deadline, future)
    }

    fn is_panic(join_error: &Self::JoinError) -> bool {
        TokioRuntime::is_panic(join_error)
    }

    fn thread_rng() -> Self::ThreadLocalRng {
        match SEED.with(|cell| cell.get()) {
            Some(seed) => {
                SEED.with(|cell| cell.set(Some(next_seed(seed))));
                SmallRng::seed_from_u64(seed)
            }
            None => SmallRng::from_rng(&mut rand::rng()),
        }
    }

    fn new(threads: usize) -> Self {
        Runtime(TokioRuntime::new(threads))
    }

    fn block_on<F, T>(&mut self, future: F) -> T
    where
        F: Future<Output = T>,
    {
        self.0.block_on(future)
    }
}

#[cfg(test)]
mod tests {
    use rand::Rng as _;

    use super::*;

    fn draws() -> Vec<u64> {
        (0..8).map(|_| Runtime::thread_rng().next_u64()).collect()
    }

    #[test]
    fn a_seeded_thread_draws_the_same_numbers_from_the_same_seed_and_others_do_not() {
        seed_thread(Some(7));
        let first = draws();
        seed_thread(Some(7));
        assert_eq!(draws(), first);
        seed_thread(Some(8));
        assert_ne!(draws(), first);
        seed_thread(None);
        assert_ne!(draws(), draws());
    }
}
