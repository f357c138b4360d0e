//! What `baton` prints and how it exits: the exit codes of docs/cli.md, the one-line error
//! format (`error[LEASE_HELD]: ...`, always the last line on stderr), and `--json` output.
//! What must never live here: requests; this module only turns outcomes into text and codes.

use std::fmt;
use std::io::Write;

use baton_client::Error;
use serde::Serialize;
use serde_json::Value;

/// `println!` for `baton`'s stdout: see [`write_line`].
macro_rules! say {
    ($($argument:tt)*) => {
        $crate::cli::output::write_line(format_args!($($argument)*))
    };
}
pub(crate) use say;

/// `eprintln!` for `baton`'s own messages: see [`write_note`].
macro_rules! note {
    ($($argument:tt)*) => {
        $crate::cli::output::write_note(format_args!($($argument)*))
    };
}
pub(crate) use note;

/// Success.
pub const EXIT_OK: u8 = 0;
/// A failure or an unknown outcome: unreachable, 5xx, `--timeout` reached.
pub const EXIT_FAILURE: u8 = 1;
/// A usage error or `INVALID_ARGUMENT` (clap exits with 2 by itself).
pub const EXIT_USAGE: u8 = 2;
/// Not found.
pub const EXIT_NOT_FOUND: u8 = 3;
/// A conflict: `LEASE_HELD`, `LEASE_LOST`, `STALE_FENCE`, a fence check that is not current.
pub const EXIT_CONFLICT: u8 = 4;
/// A `--wait` that ran out.
pub const EXIT_WAIT_EXPIRED: u8 = 5;

/// A command that did not succeed: the exit code, the code and message of the error line, and
/// the problem object `--json` prints on stdout.
#[derive(Debug)]
pub struct Failure {
    /// The process exit code.
    pub exit: u8,
    /// `LEASE_HELD`, `UNAVAILABLE`, `TIMEOUT`...
    pub code: String,
    /// One line.
    pub message: String,
    /// The problem body, when a server gave one (or the client made one).
    pub problem: Option<Value>,
}

impl Failure {
    /// A failure that did not come from a client call.
    pub fn new(exit: u8, code: &str, message: impl Into<String>) -> Failure {
        Failure {
            exit,
            code: code.to_owned(),
            message: message.into(),
            problem: None,
        }
    }

    /// Prints the error line (and the problem on stdout with `--json`).
    pub fn report(&self, json: bool) {
        if json {
            if let Some(problem) = &self.problem {
                // Not `say!`: a closed stdout must not turn a failure into status 0.
                let _ = writeln!(std::io::stdout(), "{problem}");
            }
        }
        let message = self.message.replace('\n', " ");
        note!("error[{}]: {message}", self.code);
    }
}

impl From<Error> for Failure {
    fn from(error: Error) -> Failure {
        Failure {
            exit: exit_code(&error),
            code: error.code().to_owned(),
            message: error.message().to_owned(),
            problem: Some(error.to_problem()),
        }
    }
}

/// The exit code of a client error (docs/cli.md).
pub fn exit_code(error: &Error) -> u8 {
    match error {
        Error::Held { .. } | Error::Lost { .. } | Error::StaleFence { .. } => EXIT_CONFLICT,
        Error::NotFound { .. } => EXIT_NOT_FOUND,
        Error::InvalidArgument { .. }
        | Error::PayloadTooLarge { .. }
        | Error::IdempotencyKeyReused { .. }
        // A certificate this client cannot accept: configuration, not an outage.
        | Error::Tls { .. } => EXIT_USAGE,
        _ => EXIT_FAILURE,
    }
}

/// Writes one line on stdout. A closed stdout (`baton events | head -1`) ends the process
/// quietly with status 0: the reader has what it wanted (docs/cli.md). Any other write
/// error ends it with status 1.
pub fn write_line(arguments: fmt::Arguments<'_>) {
    let mut stdout = std::io::stdout().lock();
    let written = stdout
        .write_fmt(arguments)
        .and_then(|()| stdout.write_all(b"\n"))
        .and_then(|()| stdout.flush());
    match written {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        Err(error) => {
            note!("error[INTERNAL]: cannot write to stdout: {error}");
            std::process::exit(i32::from(EXIT_FAILURE));
        }
    }
}

/// Writes one line on stderr. A closed stderr is ignored (there is nobody left to tell), never
/// a panic.
pub fn write_note(arguments: fmt::Arguments<'_>) {
    let mut stderr = std::io::stderr().lock();
    let _ = stderr
        .write_fmt(arguments)
        .and_then(|()| stderr.write_all(b"\n"));
}

/// Prints `value` as one line of JSON on stdout.
pub fn print_json<T: Serialize>(value: &T) {
    match serde_json::to_string(value) {
        Ok(text) => write_line(format_args!("{text}")),
        Err(error) => note!("error[INTERNAL]: cannot print the answer as JSON: {error}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_client::api::{ErrorCode, HeldBy, LeaseMode, Problem};

    fn held_by() -> HeldBy {
        HeldBy {
            limit: None,
            holders_total: None,
            holders: Vec::new(),
            holder: "agent-b".to_owned(),
            resource: "a".to_owned(),
            mode: LeaseMode::Exclusive,
            fence: 41,
            labels: Default::default(),
            acquired_at: String::new(),
            expires_in_ms: 38_000,
            expires_at: String::new(),
        }
    }

    #[test]
    fn every_error_has_its_exit_code() {
        let message = || "m".to_owned();
        let cases = [
            (
                Error::Held {
                    held_by: Box::new(held_by()),
                    message: message(),
                },
                EXIT_CONFLICT,
            ),
            (Error::Lost { message: message() }, EXIT_CONFLICT),
            (
                Error::StaleFence {
                    current: Some(3),
                    message: message(),
                },
                EXIT_CONFLICT,
            ),
            (Error::NotFound { message: message() }, EXIT_NOT_FOUND),
            (Error::InvalidArgument { message: message() }, EXIT_USAGE),
            (Error::PayloadTooLarge { message: message() }, EXIT_USAGE),
            (
                Error::IdempotencyKeyReused { message: message() },
                EXIT_USAGE,
            ),
            (Error::Tls { message: message() }, EXIT_USAGE),
            (
                Error::Denied {
                    code: ErrorCode::PermissionDenied,
                    message: message(),
                },
                EXIT_FAILURE,
            ),
            (
                Error::Unavailable {
                    code: None,
                    message: message(),
                },
                EXIT_FAILURE,
            ),
            (
                Error::Unavailable {
                    code: Some(ErrorCode::NoLeader),
                    message: message(),
                },
                EXIT_FAILURE,
            ),
            (
                Error::Indeterminate {
                    code: Some(ErrorCode::OutcomeUnknown),
                    message: message(),
                },
                EXIT_FAILURE,
            ),
            (
                Error::Indeterminate {
                    code: Some(ErrorCode::Internal),
                    message: message(),
                },
                EXIT_FAILURE,
            ),
        ];
        for (error, exit) in cases {
            assert_eq!(exit_code(&error), exit, "{error:?}");
            let failure = Failure::from(error);
            assert_eq!(failure.exit, exit);
        }
    }

    #[test]
    fn a_refusal_keeps_the_server_message_and_problem() {
        let problem = Problem {
            held_by: Some(held_by()),
            ..Problem::new(
                ErrorCode::LeaseHeld,
                "a is held by agent-b (fence 41) for 38s more",
            )
        };
        let failure = Failure::from(Error::Held {
            held_by: Box::new(problem.held_by.clone().expect("held_by")),
            message: problem.message.clone(),
        });
        assert_eq!(failure.code, "LEASE_HELD");
        assert_eq!(
            failure.message,
            "a is held by agent-b (fence 41) for 38s more"
        );
        let printed = failure.problem.expect("a problem");
        assert_eq!(printed["held_by"]["holder"], "agent-b");
        assert_eq!(printed["code"], "LEASE_HELD");
    }
}
