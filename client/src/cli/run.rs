//! `baton run RESOURCE -- CMD ARGS...`: hold a lease exactly as long as a command runs.
//!
//! Acquire (optionally waiting), start CMD with `BATON_RESOURCE`, `BATON_FENCE` and
//! `BATON_SESSION`, keep the lease alive while it runs, and the moment the guard stops being
//! valid (its G7 deadline passes or the server says `LEASE_LOST`) send CMD SIGTERM, then
//! SIGKILL after `--grace`, and exit 4. When CMD ends by itself, release at once and exit with
//! its status (128 + signal when a signal killed it). SIGINT, SIGTERM, SIGHUP and SIGQUIT sent
//! to `baton run` are passed on to CMD. CMD's stdin, stdout and stderr are its own; this module
//! writes to stderr only. What must never live here: lease validity rules (the guard has them).

use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use anyhow::Context;
use baton_client::{AcquireOptions, Client, Error, LostReason};
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, SignalKind};

use super::duration::format_duration;
use super::output::{Failure, EXIT_CONFLICT, EXIT_FAILURE, EXIT_WAIT_EXPIRED};
use super::RunArgs;

/// How long ending a lost session may take before `baton run` exits anyway.
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(2);

/// Runs `baton run`; returns CMD's exit code, or a failure.
pub async fn run(client: &Client, args: RunArgs, timeout: Duration) -> Result<u8, Failure> {
    let mut options = AcquireOptions::new().ttl(args.ttl);
    if args.subtree {
        options = options.subtree();
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
    eprintln!(
        "baton: acquired {} fence={}; running {}",
        guard.resource(),
        guard.fence(),
        args.command.join(" ")
    );

    let mut child = match spawn(&args.command, &guard) {
        Ok(child) => child,
        Err(error) => {
            let released = guard.release().await;
            if let Err(release_error) = released {
                eprintln!("baton: releasing {} failed: {release_error}", args.resource);
            }
            return Err(Failure::new(EXIT_FAILURE, "SPAWN", format!("{error:#}")));
        }
    };
    let pid = child.id();
    let mut signals = Signals::new().map_err(|error| {
        Failure::new(
            EXIT_FAILURE,
            "INTERNAL",
            format!("cannot catch signals: {error:#}"),
        )
    })?;

    loop {
        tokio::select! {
            status = child.wait() => {
                let code = match status {
                    Ok(status) => exit_code(status),
                    Err(error) => {
                        eprintln!("baton: waiting for the command failed: {error}");
                        EXIT_FAILURE
                    }
                };
                if let Err(error) = guard.release().await {
                    eprintln!("baton: releasing {} failed: {error}", args.resource);
                }
                return Ok(code);
            }
            reason = guard.lost() => {
                eprintln!(
                    "baton: the lease on {} is lost ({reason}); stopping the command",
                    args.resource
                );
                stop(&mut child, pid, args.grace).await;
                if reason == LostReason::Expired || reason == LostReason::MaxHoldReached {
                    // The session may still be alive on the server: free the resource now.
                    let ended = tokio::time::timeout(
                        CLEANUP_TIMEOUT,
                        client.end_session(guard.session_id()),
                    )
                    .await;
                    if let Ok(Err(error)) = ended {
                        tracing::debug!(%error, "ending a lost session failed");
                    }
                }
                drop(guard);
                return Err(Failure::new(
                    EXIT_CONFLICT,
                    "LEASE_LOST",
                    format!("the lease on {} was lost ({reason}); the command was stopped", args.resource),
                ));
            }
            name = signals.next() => {
                if let Some(pid) = pid {
                    send_signal(pid, name);
                }
            }
        }
    }
}

fn spawn(command: &[String], guard: &baton_client::LeaseGuard) -> anyhow::Result<Child> {
    let (program, arguments) = command.split_first().context("no command given after --")?;
    Command::new(program)
        .args(arguments)
        .env("BATON_RESOURCE", guard.resource())
        .env("BATON_FENCE", guard.fence().to_string())
        .env("BATON_SESSION", guard.session_id().as_str())
        .stdin(Stdio::inherit())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot start {program:?}"))
}

/// SIGTERM, then SIGKILL if CMD has not exited after `grace`.
async fn stop(child: &mut Child, pid: Option<u32>, grace: Duration) {
    if let Some(pid) = pid {
        send_signal(pid, "TERM");
    }
    match tokio::time::timeout(grace, child.wait()).await {
        Ok(_) => {}
        Err(_) => {
            eprintln!(
                "baton: the command did not exit within {} of SIGTERM; sending SIGKILL",
                format_duration(grace)
            );
            if let Err(error) = child.kill().await {
                eprintln!("baton: SIGKILL failed: {error}");
            }
        }
    }
}

/// Sends a signal with `kill(1)` (the workspace forbids `unsafe`, so no raw `kill(2)`).
fn send_signal(pid: u32, name: &str) {
    let sent = std::process::Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !sent.is_ok_and(|status| status.success()) {
        tracing::debug!(
            pid,
            name,
            "passing a signal on failed (the command may have exited)"
        );
    }
}

/// CMD's exit code, or 128 + the signal that killed it.
fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(EXIT_FAILURE),
        (None, Some(signal)) => u8::try_from(128 + (signal & 0x7f)).unwrap_or(EXIT_FAILURE),
        (None, None) => EXIT_FAILURE,
    }
}

/// The signals passed on to CMD.
struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
    quit: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> std::io::Result<Signals> {
        Ok(Signals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            hangup: signal(SignalKind::hangup())?,
            quit: signal(SignalKind::quit())?,
        })
    }

    /// The name (for `kill -NAME`) of the next signal received.
    async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.interrupt.recv() => "INT",
            _ = self.terminate.recv() => "TERM",
            _ = self.hangup.recv() => "HUP",
            _ = self.quit.recv() => "QUIT",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exit_code_is_cmds_or_128_plus_its_signal() {
        assert_eq!(exit_code(ExitStatus::from_raw(0)), 0);
        assert_eq!(exit_code(ExitStatus::from_raw(7 << 8)), 7);
        assert_eq!(exit_code(ExitStatus::from_raw(15)), 143);
        assert_eq!(exit_code(ExitStatus::from_raw(9)), 137);
    }
}
