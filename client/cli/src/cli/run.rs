//! `baton run RESOURCE -- CMD ARGS...`: hold a lease exactly as long as a command runs.
//!
//! Acquire (optionally waiting), start CMD with `BATON_RESOURCE`, `BATON_FENCE` and
//! `BATON_SESSION`, keep the lease alive while it runs, and the moment the guard stops being
//! valid (its G7 deadline passes or the server says `LEASE_LOST`) send CMD SIGTERM, then
//! SIGKILL after `--grace`, and exit 4. When CMD ends by itself, release at once and exit with
//! its status (128 + signal when a signal killed it, 127 when it could not be started).
//! SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to `baton run` are passed on to CMD's process
//! group. CMD runs under a supervisor (`supervise.rs`), so it never outlives `baton run`, even
//! a SIGKILLed one. CMD's stdin, stdout and stderr are its own; this module writes to stderr
//! only. What must never live here: lease validity rules (the guard has them).

use std::time::Duration;

use baton_client::{AcquireOptions, Client, Error, LostReason};

use super::duration::format_duration;
use super::output::{note, Failure, EXIT_CONFLICT, EXIT_FAILURE, EXIT_WAIT_EXPIRED};
use super::supervise::{Ended, Supervised};
use super::RunArgs;

/// How long ending a lost session may take before `baton run` exits anyway.
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(2);

/// Runs `baton run`; returns CMD's exit code, or a failure.
pub async fn run(client: &Client, args: RunArgs, timeout: Duration) -> Result<u8, Failure> {
    let mut options = AcquireOptions::new().ttl(args.ttl);
    if args.subtree {
        options = options.subtree();
    }
    if let Some(limit) = args.shared {
        options = options.shared(limit);
    }
    if let Some(max_hold) = args.max_hold {
        options = options.max_hold(max_hold);
    }
    if let Some(reason) = &args.reason {
        options = options.reason(reason.clone());
    }
    if let Some(wait) = args.wait {
        options = options.wait(wait);
    }
    let budget = timeout + args.wait.unwrap_or_default();
    let guard = match tokio::time::timeout(budget, client.acquire(&args.resource, options)).await {
        Ok(Ok(guard)) => guard,
        Ok(Err(error @ Error::Held { .. })) if args.wait.is_some() => {
            let mut failure = Failure::from(error);
            failure.exit = EXIT_WAIT_EXPIRED;
            failure.message = format!(
                "{} (gave up after waiting {})",
                failure.message,
                format_duration(args.wait.unwrap_or_default())
            );
            return Err(failure);
        }
        Ok(Err(error)) => return Err(error.into()),
        Err(_) => {
            return Err(Failure::new(
                EXIT_FAILURE,
                "TIMEOUT",
                format!(
                    "acquiring {} did not finish within --timeout {}; its outcome is unknown",
                    args.resource,
                    format_duration(timeout)
                ),
            ))
        }
    };
    note!(
        "baton: acquired {} fence={}; running {}",
        guard.resource(),
        guard.fence(),
        args.command.join(" ")
    );

    let environment = [
        ("BATON_RESOURCE", guard.resource().to_owned()),
        ("BATON_FENCE", guard.fence().to_string()),
        ("BATON_SESSION", guard.session_id().as_str().to_owned()),
    ];
    let mut child = match Supervised::spawn(&args.command, &environment) {
        Ok(child) => child,
        Err(error) => {
            let released = guard.release().await;
            if let Err(release_error) = released {
                note!("baton: releasing {} failed: {release_error}", args.resource);
            }
            return Err(Failure::new(EXIT_FAILURE, "SPAWN", format!("{error:#}")));
        }
    };
    let what = format!("the lease on {}", args.resource);
    let ended = child.watch(guard.lost(), args.grace, &what).await;
    match ended {
        Ok(Ended::Exited { code, .. }) => {
            if let Err(error) = guard.release().await {
                note!("baton: releasing {} failed: {error}", args.resource);
            }
            Ok(code)
        }
        Err(error) => {
            note!("baton: waiting for the command failed: {error}");
            if let Err(error) = guard.release().await {
                note!("baton: releasing {} failed: {error}", args.resource);
            }
            Ok(EXIT_FAILURE)
        }
        Ok(Ended::Lost(reason)) => {
            if reason == LostReason::Expired || reason == LostReason::MaxHoldReached {
                // The session may still be alive on the server: free the resource now.
                let ended =
                    tokio::time::timeout(CLEANUP_TIMEOUT, client.end_session(guard.session_id()))
                        .await;
                if let Ok(Err(error)) = ended {
                    tracing::debug!(%error, "ending a lost session failed");
                }
            }
            drop(guard);
            Err(Failure::new(
                EXIT_CONFLICT,
                "LEASE_LOST",
                format!("{what} was lost ({reason}); the command was stopped"),
            ))
        }
    }
}
