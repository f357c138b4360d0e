//! The tool calls of `baton mcp` by request id, so that a `notifications/cancelled` is honoured
//! wherever it finds its call: still running (the call is told to stop, and whatever it took
//! is given back), or already answered (the answer crossed the cancel on the wire, and the
//! client ignores it, so what that call took is given back too). The transport tells this
//! registry of a cancel as it reads it, before any later message reaches the server, so a call
//! read after a cancel always sees it.
//!
//! What must never live here: what a call takes or how it is given back (that is `agent.rs`;
//! here it is an opaque `T`), and anything about the wire (`transport.rs`).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rmcp::model::RequestId;
use tokio_util::sync::CancellationToken;

/// How many answered calls that took something are remembered for a late cancel.
const ANSWERED_MAX: usize = 64;
/// How long an answered call is remembered for a late cancel: a client cancels a call it is
/// still waiting for, so a cancel that crosses the answer comes within moments of it.
const ANSWERED_FOR: Duration = Duration::from_secs(30);

/// The calls in flight and those recently answered that took something (`T`).
#[derive(Debug)]
pub struct Calls<T> {
    state: Mutex<State<T>>,
}

#[derive(Debug)]
struct State<T> {
    in_flight: HashMap<RequestId, InFlight>,
    /// Answered calls that took something, oldest first.
    answered: VecDeque<Answered<T>>,
    /// What calls cancelled after their answer took, not yet given back.
    to_give_back: Vec<T>,
}

#[derive(Debug)]
struct InFlight {
    /// Cancelled when the client cancels the call.
    cancelled: CancellationToken,
    /// Cancelled when the call has finished (given back what it took, if it was cancelled).
    finished: CancellationToken,
}

#[derive(Debug)]
struct Answered<T> {
    id: RequestId,
    at: Instant,
    taken: T,
}

/// One call in flight: its cancel signal. Dropping it marks the call finished.
#[derive(Debug)]
pub struct Call<T> {
    calls: Arc<Calls<T>>,
    id: RequestId,
    cancelled: CancellationToken,
    _finished: tokio_util::sync::DropGuard,
}

impl<T> Default for Calls<T> {
    fn default() -> Self {
        Calls {
            state: Mutex::new(State {
                in_flight: HashMap::new(),
                answered: VecDeque::new(),
                to_give_back: Vec::new(),
            }),
        }
    }
}

impl<T> Calls<T> {
    /// Registers call `id` as in flight; `cancelled` is cancelled when the client cancels it
    /// (and may be cancelled by its owner for other reasons).
    pub fn start(self: &Arc<Self>, id: RequestId, cancelled: CancellationToken) -> Call<T> {
        let finished = CancellationToken::new();
        self.lock().in_flight.insert(
            id.clone(),
            InFlight {
                cancelled: cancelled.clone(),
                finished: finished.clone(),
            },
        );
        Call {
            calls: Arc::clone(self),
            id,
            cancelled,
            _finished: finished.drop_guard(),
        }
    }

    /// The client cancelled call `id`: a call in flight is told to stop; what an answered
    /// call took is set aside to be given back ([`Calls::take_to_give_back`]). An id this
    /// registry does not know (answered long ago, or that took nothing) changes nothing.
    pub fn cancel(&self, id: &RequestId) {
        let mut state = self.lock();
        if let Some(call) = state.in_flight.get(id) {
            call.cancelled.cancel();
            return;
        }
        state.forget_old();
        if let Some(at) = state
            .answered
            .iter()
            .position(|answered| &answered.id == id)
        {
            if let Some(answered) = state.answered.remove(at) {
                state.to_give_back.push(answered.taken);
            }
        }
    }

    /// What calls cancelled after their answer took, to be given back now.
    pub fn take_to_give_back(&self) -> Vec<T> {
        std::mem::take(&mut self.lock().to_give_back)
    }

    /// Resolves when every call cancelled so far, other than `except`, has finished.
    pub async fn cancelled_finished(&self, except: Option<&RequestId>) {
        let finishing: Vec<CancellationToken> = self
            .lock()
            .in_flight
            .iter()
            .filter(|(id, call)| Some(*id) != except && call.cancelled.is_cancelled())
            .map(|(_, call)| call.finished.clone())
            .collect();
        for finished in finishing {
            finished.cancelled().await;
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl<T> State<T> {
    fn forget_old(&mut self) {
        let now = Instant::now();
        while self.answered.len() > ANSWERED_MAX
            || self
                .answered
                .front()
                .is_some_and(|answered| now.duration_since(answered.at) > ANSWERED_FOR)
        {
            self.answered.pop_front();
        }
    }
}

impl<T> Call<T> {
    /// The call's request id.
    pub fn id(&self) -> &RequestId {
        &self.id
    }

    /// Cancelled when the client cancels this call.
    pub fn cancelled(&self) -> &CancellationToken {
        &self.cancelled
    }

    /// The call is answered and took `taken`. If it was cancelled meanwhile, `taken` comes
    /// back (`Err`) to be given back now, before this `Call` is dropped; otherwise it is
    /// remembered for a late cancel.
    pub fn answered(&self, taken: Option<T>) -> Result<(), T> {
        let mut state = self.calls.lock();
        if self.cancelled.is_cancelled() {
            // Still in flight until dropped, so that later calls wait for the give-back.
            return taken.map_or(Ok(()), Err);
        }
        state.in_flight.remove(&self.id);
        let Some(taken) = taken else {
            return Ok(());
        };
        state.answered.push_back(Answered {
            id: self.id.clone(),
            at: Instant::now(),
            taken,
        });
        state.forget_old();
        Ok(())
    }
}

impl<T> Drop for Call<T> {
    fn drop(&mut self) {
        self.calls.lock().in_flight.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(number: i64) -> RequestId {
        RequestId::Number(number)
    }

    impl<T> Calls<T> {
        fn start_new(self: &Arc<Self>, id: RequestId) -> Call<T> {
            self.start(id, CancellationToken::new())
        }
    }

    #[tokio::test]
    async fn a_cancel_stops_a_call_in_flight_or_gives_back_what_an_answered_call_took() {
        let calls: Arc<Calls<&str>> = Arc::default();
        let running = calls.start_new(id(1));
        calls.cancel(&id(1));
        assert!(running.cancelled().is_cancelled());
        assert_eq!(running.answered(Some("raced")), Err("raced"));

        let answered = calls.start_new(id(2));
        assert_eq!(answered.answered(Some("granted")), Ok(()));
        drop(answered);
        assert!(calls.take_to_give_back().is_empty());
        calls.cancel(&id(2));
        assert_eq!(calls.take_to_give_back(), ["granted"]);
        calls.cancel(&id(2));
        assert!(calls.take_to_give_back().is_empty(), "given back once");

        let nothing = calls.start_new(id(3));
        assert_eq!(nothing.answered(None), Ok(()));
        calls.cancel(&id(3));
        calls.cancel(&id(99));
        assert!(calls.take_to_give_back().is_empty());
    }

    #[tokio::test]
    async fn waiting_for_cancelled_calls_skips_the_caller_and_ends_when_they_finish() {
        let calls: Arc<Calls<()>> = Arc::default();
        let cancelled = calls.start_new(id(1));
        let own = calls.start_new(id(2));
        let _other = calls.start_new(id(3));
        calls.cancel(&id(1));
        calls.cancel(&id(2));
        let waiting = tokio::spawn({
            let calls = Arc::clone(&calls);
            async move { calls.cancelled_finished(Some(&id(2))).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        drop(cancelled);
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("finished once the cancelled call is")
            .expect("no panic");
        drop(own);
    }
}
