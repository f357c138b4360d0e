//! The Rust client of Baton, a replicated lease service for fleets of agents.
//!
//! An agent claims a resource with [`Client::acquire`] (or [`Session::acquire`]) and gets a
//! [`LeaseGuard`]: the lease's fence token, a background keepalive, and a local answer to
//! "may I still act as holder?" ([`LeaseGuard::is_valid`], [`LeaseGuard::lost`]) computed
//! exactly as docs/guarantees.md G7 allows, from the local monotonic clock alone. Writes to a protected
//! resource carry the fence ([`Client::kv_put_fenced`], [`Client::check_fence`]), so a holder
//! that lost its lease without noticing is refused.
//!
//! Work queues hand out tasks the same way: [`Client::claim`] (or [`Session::claim`]) claims
//! the best ready task with a lease and returns a [`TaskClaim`] whose `complete`, `fail` and
//! `release` carry the claim's fence, so a worker that went silent and lost its claim cannot
//! complete a task someone else is redoing. [`Client::work`] is the whole worker loop. The
//! event stream ([`Client::events`], [`Client::follow_events`]) lets agents wait for a change
//! instead of polling; an [`EventStream`] resumes by itself after a lost connection, without
//! losing or repeating an event.
//!
//! Every call goes to a list of endpoints, follows the leader, and retries only what is safe:
//! each mutation carries an `Idempotency-Key` made once per operation, so a retry after a
//! timeout is applied at most once. Every [`Error`] says whether the request was definitely not
//! applied or whether its outcome is unknown ([`Error::is_indeterminate`]).
//!
//! What lives here: the client ([`Client`]), sessions and guards ([`Session`], [`LeaseGuard`]),
//! task claims and the worker loop ([`TaskClaim`], [`WorkOptions`]), the event stream,
//! the guard clock ([`Clock`]), errors ([`Error`]) and the wire types ([`api`]). The `baton`
//! command line (crate `baton-cli`) is built on its public API alone. What must never live here:
//! server logic or HTTP status codes beyond classifying failures.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use baton_client::{AcquireOptions, Client, Error};
//! use serde_json::json;
//!
//! # async fn example() -> Result<(), Error> {
//! let client = Client::builder(["http://127.0.0.1:7420"])
//!     .holder("agent-a")
//!     .build()?;
//! match client
//!     .acquire("repo/src/auth.rs", AcquireOptions::new().ttl(Duration::from_secs(10)))
//!     .await
//! {
//!     Ok(guard) => {
//!         // Kept alive in the background; every write carries the fence.
//!         client.kv_put_fenced(&guard, "repo/src/auth.rs/owner", json!("agent-a")).await?;
//!         guard.release().await?;
//!     }
//!     Err(Error::Held { held_by, .. }) => {
//!         println!("{} holds it for {} ms more", held_by.holder, held_by.expires_in_ms);
//!     }
//!     Err(error) if error.is_indeterminate() => return Err(error), // unknown outcome
//!     Err(error) => return Err(error),
//! }
//! # Ok(())
//! # }
//! ```
//!
//! The G7 arithmetic is public, so it can be checked by hand:
//!
//! ```
//! use std::time::Duration;
//! use baton_client::clock::valid_until;
//!
//! // First attempt sent at t0 = 2 s, the answer said 30,000 ms, rate error 1%:
//! // valid until 2 s + 29,999 ms * 0.98.
//! let until = valid_until(Duration::from_secs(2), 30_000, 0.01);
//! assert_eq!(until, Duration::from_millis(2_000) + Duration::from_micros(29_399_020));
//! ```

pub use baton_api as api;
mod client;
pub mod clock;
mod error;
mod events;
pub mod names;
mod queue;
mod session;

pub use client::{
    default_holder, idempotency_key, AcquireOptions, Answer, Client, ClientBuilder,
    ATTEMPTS_MAX_DEFAULT, BACKOFF_INITIAL, BACKOFF_MAX, REQUEST_TIMEOUT_DEFAULT,
    RETRY_BUDGET_DEFAULT, TTL_DEFAULT,
};
pub use clock::{Clock, ManualClock, SkewedClock, SystemClock, CLOCK_RATE_ERROR_DEFAULT};
pub use error::{Error, Result};
pub use events::{EventStream, STREAM_IDLE_MAX};
pub use names::{name_file, FileName, FileNaming, NameError};
pub use queue::{TaskClaim, WorkOptions, WorkReport, WorkStopped};
pub use session::{LeaseGuard, LostReason, Session};
