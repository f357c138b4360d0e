//! The child of `baton run` and `baton task work` never outlives them, even when they are
//! SIGKILLed (docs/cli.md). What lives here: both halves of that promise and the watch over
//! a running command that both subcommands share. What must never live here: leases, claims
//! and requests; callers hand in the future that resolves when their lease is lost.
//!
//! The parent half, [`Supervised::spawn`], starts `baton __supervise --parent PID -- CMD...`
//! (this same executable) as the leader of a new process group. The supervisor half, [`main`],
//! asks the kernel for a signal when its parent dies (`PR_SET_PDEATHSIG`; the workspace
//! forbids `unsafe`, so no `pre_exec` in the parent), re-checks `getppid()` right after (the
//! parent may have died before the request), and waits. CMD starts in the same group first,
//! before the supervisor blocks the signals it waits for: a child inherits the signal mask.
//! When CMD exits, the supervisor exits with CMD's status (128 + N for signal N). When the
//! parent dies, it SIGKILLs the whole group (CMD, its children, and itself) at once.
//!
//! The parent passes signals on to the whole group; the supervisor blocks them and goes on
//! waiting, so CMD and its children get them as they would from a terminal. When `baton` owns
//! the terminal's foreground, the supervisor hands it to the new group while CMD runs (so an
//! interactive CMD can read the terminal and Ctrl-C reaches it) and gives it back after.
//!
//! The parent-death signal fires when the *thread* that spawned the supervisor ends, so
//! [`Supervised::spawn`] must be called from a thread that lives as long as the process:
//! `baton` calls it from the future `main` blocks on, which runs on the main thread.

use std::io::{self, IsTerminal};
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitCode, ExitStatus, Stdio};
use std::time::Duration;

use anyhow::Context;
use baton_client::LostReason;
use clap::Args;
use nix::sys::signal::{killpg, SigSet, Signal};
use nix::unistd::{getpgid, getpgrp, getppid, tcgetpgrp, tcsetpgrp, Pid};
use tokio::signal::unix::{signal, SignalKind};

use super::duration::format_duration;
use super::output::{note, EXIT_FAILURE};

/// The hidden subcommand that runs the supervisor half.
pub const SUPERVISE_COMMAND: &str = "__supervise";

/// The exit status of a supervisor that could not start CMD (as a shell's "command not
/// found").
const EXIT_CANNOT_START: u8 = 127;

/// The signal the kernel sends the supervisor when its parent dies (one `baton` never passes
/// on, so that it means only that).
const PARENT_DEATH_SIGNAL: Signal = Signal::SIGUSR1;

/// `baton __supervise --parent PID -- CMD ARGS...`.
#[derive(Debug, Args)]
pub struct SuperviseArgs {
    /// The process whose death ends CMD.
    #[arg(long)]
    pub parent: i32,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, num_args = 1..)]
    pub command: Vec<String>,
}

/// A command running under a supervisor in a process group of its own.
#[derive(Debug)]
pub struct Supervised {
    child: tokio::process::Child,
    group: Pid,
    exited: bool,
}

/// How a supervised command ended.
#[derive(Debug)]
pub enum Ended {
    /// It exited: its exit code (128 + N when signal N ended it), and the last signal that
    /// was passed on to it from `baton` (SIGINT, SIGTERM, SIGHUP, SIGQUIT), if any.
    Exited {
        /// CMD's exit code.
        code: u8,
        /// The signal `baton` received and passed on while CMD ran.
        interrupted: Option<Signal>,
    },
    /// The lease or claim was lost first: CMD was stopped (SIGTERM, then SIGKILL after the
    /// grace).
    Lost(LostReason),
}

impl Supervised {
    /// Starts `command` under a supervisor with `environment` added to `baton`'s own. CMD
    /// inherits stdin, stdout and stderr.
    pub fn spawn(command: &[String], environment: &[(&str, String)]) -> anyhow::Result<Supervised> {
        anyhow::ensure!(!command.is_empty(), "no command given after --");
        let executable = std::env::current_exe().context("cannot find baton's own executable")?;
        let child = tokio::process::Command::new(executable)
            .arg(SUPERVISE_COMMAND)
            .arg("--parent")
            .arg(std::process::id().to_string())
            .arg("--")
            .args(command)
            .envs(environment.iter().map(|(name, value)| (name, value)))
            .stdin(Stdio::inherit())
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit())
            .process_group(0)
            .spawn()
            .with_context(|| format!("cannot start the supervisor of {:?}", command[0]))?;
        let pid = child.id().context("the supervisor exited at once")?;
        let group = Pid::from_raw(i32::try_from(pid).context("a pid out of range")?);
        Ok(Supervised {
            child,
            group,
            exited: false,
        })
    }

    /// Waits until CMD exits, passing on the signals `baton` receives, or until `lost`
    /// resolves; then stops CMD (SIGTERM, then SIGKILL after `grace`).
    pub async fn watch(
        &mut self,
        lost: impl std::future::Future<Output = LostReason>,
        grace: Duration,
        what: &str,
    ) -> io::Result<Ended> {
        let mut signals = Signals::new()?;
        let mut interrupted = None;
        tokio::pin!(lost);
        loop {
            tokio::select! {
                status = self.child.wait() => {
                    self.exited = true;
                    return Ok(Ended::Exited { code: exit_code(status?), interrupted });
                }
                reason = &mut lost => {
                    note!("baton: {what} is lost ({reason}); stopping the command");
                    self.stop(grace).await;
                    return Ok(Ended::Lost(reason));
                }
                received = signals.next() => {
                    interrupted = Some(received);
                    self.signal(received);
                }
            }
        }
    }

    /// Sends `signal` to CMD's whole group (the supervisor ignores it).
    pub fn signal(&self, signal: Signal) {
        if self.exited {
            return;
        }
        if let Err(error) = killpg(self.group, signal) {
            tracing::debug!(%error, ?signal, "passing a signal on failed (the command may have exited)");
        }
    }

    /// SIGTERM to the group, then SIGKILL if CMD has not exited after `grace`.
    pub async fn stop(&mut self, grace: Duration) {
        self.signal(Signal::SIGTERM);
        if tokio::time::timeout(grace, self.child.wait()).await.is_ok() {
            self.exited = true;
            return;
        }
        note!(
            "baton: the command did not exit within {} of SIGTERM; sending SIGKILL",
            format_duration(grace)
        );
        self.signal(Signal::SIGKILL);
        if let Err(error) = self.child.wait().await {
            note!("baton: waiting for the command failed: {error}");
        }
        self.exited = true;
    }
}

impl Drop for Supervised {
    /// A command still running when its handle goes is killed with its group.
    fn drop(&mut self) {
        if !self.exited && matches!(self.child.try_wait(), Ok(None)) {
            let _ = killpg(self.group, Signal::SIGKILL);
        }
    }
}

/// CMD's exit code, or 128 + the signal that killed it.
pub fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(EXIT_FAILURE),
        (None, Some(signal)) => u8::try_from(128 + (signal & 0x7f)).unwrap_or(EXIT_FAILURE),
        (None, None) => EXIT_FAILURE,
    }
}

/// The supervisor half: runs CMD until it exits, or kills its group when the parent dies.
/// Synchronous and single-threaded, so that blocking signals here blocks them for good.
/// A failure to start CMD exits 127.
pub fn main(args: &SuperviseArgs) -> ExitCode {
    let parent = Pid::from_raw(args.parent);
    let Some((program, arguments)) = args.command.split_first() else {
        return ExitCode::from(EXIT_FAILURE);
    };
    let foreground = take_terminal(parent);
    // CMD inherits the signal mask, so it starts before anything is blocked here.
    let mut child = match std::process::Command::new(program).args(arguments).spawn() {
        Ok(child) => child,
        Err(error) => {
            give_terminal_back(foreground);
            note!("baton: cannot start {program:?}: {error}");
            return ExitCode::from(EXIT_CANNOT_START);
        }
    };
    let mut waited = SigSet::empty();
    for signal in [
        Signal::SIGCHLD,
        PARENT_DEATH_SIGNAL,
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGQUIT,
        Signal::SIGTTOU,
    ] {
        waited.add(signal);
    }
    let armed = waited
        .thread_block()
        .and_then(|()| arm_parent_death_signal());
    // Checked after arming: the parent may have died before, and nobody would signal us.
    if armed.is_err() || getppid() != parent {
        if let Err(error) = armed {
            note!("baton: cannot watch for the parent's death: {error}");
        }
        let _ = killpg(getpgrp(), Signal::SIGKILL);
        return ExitCode::from(EXIT_FAILURE);
    }
    loop {
        // Checked before each wait: CMD may have exited before SIGCHLD was blocked.
        match child.try_wait() {
            Ok(Some(status)) => {
                give_terminal_back(foreground);
                return ExitCode::from(exit_code(status));
            }
            Ok(None) => {}
            Err(error) => {
                note!("baton: waiting for the command failed: {error}");
                let _ = killpg(getpgrp(), Signal::SIGKILL);
                return ExitCode::from(EXIT_FAILURE);
            }
        }
        match waited.wait() {
            Ok(signal) if signal == PARENT_DEATH_SIGNAL && getppid() != parent => {
                let _ = killpg(getpgrp(), Signal::SIGKILL);
                return ExitCode::from(EXIT_FAILURE);
            }
            // SIGCHLD, or a signal `baton` passed on to the whole group: CMD has it too.
            Ok(_) | Err(_) => {}
        }
    }
}

/// Asks the kernel for [`PARENT_DEATH_SIGNAL`] when the parent dies.
#[cfg(any(target_os = "linux", target_os = "android"))]
fn arm_parent_death_signal() -> nix::Result<()> {
    nix::sys::prctl::set_pdeathsig(PARENT_DEATH_SIGNAL)
}

/// Elsewhere there is no parent-death signal: a SIGKILLed `baton` leaves CMD running (a
/// `baton` that exits any other way still stops it).
#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn arm_parent_death_signal() -> nix::Result<()> {
    Ok(())
}

/// When the parent's group owns the terminal's foreground, hands it to this group; returns
/// the group to give it back to.
fn take_terminal(parent: Pid) -> Option<Pid> {
    let stdin = io::stdin();
    if !stdin.is_terminal() {
        return None;
    }
    let parent_group = getpgid(Some(parent)).ok()?;
    if tcgetpgrp(&stdin).ok()? != parent_group {
        return None;
    }
    // A background group may take the foreground only with SIGTTOU blocked.
    let taken = with_terminal_stops_blocked(|| tcsetpgrp(&stdin, getpgrp()));
    taken.ok().map(|()| parent_group)
}

fn give_terminal_back(foreground: Option<Pid>) {
    if let Some(group) = foreground {
        let _ = with_terminal_stops_blocked(|| tcsetpgrp(io::stdin(), group));
    }
}

fn with_terminal_stops_blocked(action: impl FnOnce() -> nix::Result<()>) -> nix::Result<()> {
    let mut stops = SigSet::empty();
    stops.add(Signal::SIGTTOU);
    let mut previous = SigSet::empty();
    nix::sys::signal::pthread_sigmask(
        nix::sys::signal::SigmaskHow::SIG_BLOCK,
        Some(&stops),
        Some(&mut previous),
    )?;
    let result = action();
    nix::sys::signal::pthread_sigmask(
        nix::sys::signal::SigmaskHow::SIG_SETMASK,
        Some(&previous),
        None,
    )?;
    result
}

/// The signals `baton` passes on to CMD's group (SIGINT, SIGTERM, SIGHUP, SIGQUIT). Once
/// one is listened for, it no longer ends `baton` by itself: whoever listens must act on it.
#[derive(Debug)]
pub struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
    quit: tokio::signal::unix::Signal,
}

impl Signals {
    /// Listens from now on.
    pub fn new() -> io::Result<Signals> {
        Ok(Signals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            hangup: signal(SignalKind::hangup())?,
            quit: signal(SignalKind::quit())?,
        })
    }

    /// The next signal received.
    pub async fn next(&mut self) -> Signal {
        tokio::select! {
            _ = self.interrupt.recv() => Signal::SIGINT,
            _ = self.terminate.recv() => Signal::SIGTERM,
            _ = self.hangup.recv() => Signal::SIGHUP,
            _ = self.quit.recv() => Signal::SIGQUIT,
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
