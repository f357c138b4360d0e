//! The checkers: each judges one guarantee from the history alone, in its own module, with
//! tests that feed it a history violating that guarantee (STYLE rule 13).
//!
//! What lives here: the verdict type ([`Verdict`]), a checker's result ([`CheckResult`]) and
//! the choice of checkers per workload ([`check_all`]). What must never live here: anything
//! that talks to a server: the final reads the checkers need are in the history (process
//! `final`).

pub mod claims;
pub mod cluster_time;
pub mod digest;
pub mod fences;
pub mod final_leases;
pub mod holds;
pub mod idempotency;
pub mod line;
pub mod linearizable;
pub mod lost_writes;
pub mod recovery;
pub mod refused_writes;
pub mod stale_writes;
pub mod tasks;
pub mod txn_atomic;
pub mod votes;

use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;

use crate::history::{self, Op};
use crate::workloads::Workload;

/// A verdict: valid, invalid, or unknown (could not tell: never counted as valid).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Checked and found to hold.
    Valid,
    /// A violation was found.
    Invalid,
    /// Could not decide (time limit, missing data).
    Unknown,
}

impl Verdict {
    /// `true`, `false` or `"unknown"`, as `results.json` writes it.
    pub fn to_json(self) -> Value {
        match self {
            Verdict::Valid => Value::Bool(true),
            Verdict::Invalid => Value::Bool(false),
            Verdict::Unknown => Value::from("unknown"),
        }
    }

    /// Combines verdicts: any invalid wins, then any unknown.
    pub fn combine(verdicts: impl IntoIterator<Item = Verdict>) -> Verdict {
        let mut combined = Verdict::Valid;
        for verdict in verdicts {
            match verdict {
                Verdict::Invalid => return Verdict::Invalid,
                Verdict::Unknown => combined = Verdict::Unknown,
                Verdict::Valid => {}
            }
        }
        combined
    }
}

/// What one checker found.
#[derive(Debug, Clone)]
pub struct CheckResult {
    /// The verdict.
    pub verdict: Verdict,
    /// One line for the summary.
    pub summary: String,
    /// The violations or counts (at most a few dozen entries).
    pub details: Value,
}

impl CheckResult {
    /// A valid result.
    pub fn valid(summary: impl Into<String>, details: Value) -> CheckResult {
        CheckResult {
            verdict: Verdict::Valid,
            summary: summary.into(),
            details,
        }
    }

    /// Valid when `violations` is empty, invalid otherwise.
    pub fn from_violations(checked: &str, violations: Vec<Value>) -> CheckResult {
        if violations.is_empty() {
            CheckResult::valid(checked.to_owned(), Value::Null)
        } else {
            CheckResult {
                verdict: Verdict::Invalid,
                summary: format!("{} violation(s); {checked}", violations.len()),
                details: Value::Array(violations.into_iter().take(VIOLATIONS_SHOWN_MAX).collect()),
            }
        }
    }
}

/// How many violations a result lists.
pub const VIOLATIONS_SHOWN_MAX: usize = 20;

/// One checker's result within a run.
#[derive(Debug, Clone, Serialize)]
pub struct Named {
    /// The checker.
    pub name: &'static str,
    /// Whether it counts toward the run's verdict.
    pub counted: bool,
    /// `true`, `false` or `"unknown"`.
    pub valid: Value,
    /// Its summary.
    pub summary: String,
    /// Its details.
    pub details: Value,
    /// How long it took.
    pub elapsed_ms: f64,
    #[serde(skip)]
    /// The verdict.
    pub verdict: Verdict,
}

/// Runs the checkers that apply to `workload`. `beyond`: the run had `clock-beyond`, so the
/// checkers that rest on G6's time assumptions are reported but not counted.
///
/// A run with restores is judged as the restored cluster knows it (`history::undone`): what
/// was answered between a backup and the restore may be undone. Fence order is judged on the
/// history as recorded: a restore never reissues a fence, whatever it undid.
pub fn check_all(
    workload: Workload,
    recorded: &[Op],
    beyond: bool,
    linearizable_limit: Duration,
) -> Vec<Named> {
    let undone = history::undone(recorded);
    let history: &[Op] = &undone;
    let mut results = Vec::new();
    let mut run = |name: &'static str, counted: bool, check: &dyn Fn() -> CheckResult| {
        let started = Instant::now();
        let result = check();
        results.push(Named {
            name,
            counted,
            valid: result.verdict.to_json(),
            summary: result.summary,
            details: result.details,
            elapsed_ms: started.elapsed().as_secs_f64() * 1e3,
            verdict: result.verdict,
        });
    };
    run("fences", true, &|| fences::check(recorded));
    run("cluster-time-monotonic", true, &|| {
        cluster_time::check_monotonic(history)
    });
    run("cluster-time-rate", !beyond, &|| {
        cluster_time::check_rate(history)
    });
    run("idempotency", true, &|| idempotency::check(history));
    run("digest", true, &|| digest::check(history));
    run("recovery", true, &|| recovery::check(history));
    run("votes", true, &|| votes::check(history));
    match workload {
        Workload::Lease | Workload::UnfencedLock | Workload::Semaphore => {
            run("holds", !beyond, &|| holds::check(history));
            run("shared-limits", !beyond, &|| holds::check_limits(history));
            run("stale-writes", true, &|| {
                stale_writes::check(history, recorded)
            });
            run("final-leases", !beyond, &|| final_leases::check(history));
        }
        Workload::FencedKv => {
            run("stale-writes", true, &|| {
                stale_writes::check(history, recorded)
            });
            run("lost-writes", true, &|| lost_writes::check(history));
            run("refused-writes", true, &|| refused_writes::check(history));
            run("txn-atomic", true, &|| txn_atomic::check(history));
            run("final-leases", !beyond, &|| final_leases::check(history));
            run("linearizable", true, &|| {
                linearizable::check(history, linearizable_limit)
            });
        }
        // No `final-leases`: a line grant its client never saw (it gave up, and its leave was
        // lost) is not a phantom, but that checker could not tell.
        Workload::Line => {
            run("holds", !beyond, &|| holds::check(history));
            run("shared-limits", !beyond, &|| holds::check_limits(history));
            run("stale-writes", true, &|| {
                stale_writes::check(history, recorded)
            });
            run("line", true, &|| line::check(history));
        }
        Workload::Queue => {
            run("tasks", true, &|| tasks::check(history));
            run("claims", !beyond, &|| claims::check(history));
        }
    }
    results
}

/// The run's verdict from the counted checkers.
pub fn overall(results: &[Named]) -> Verdict {
    Verdict::combine(
        results
            .iter()
            .filter(|result| result.counted)
            .map(|result| result.verdict),
    )
}

/// Milliseconds of a harness time, for messages.
pub fn ms(ns: u64) -> f64 {
    if ns == u64::MAX {
        f64::INFINITY
    } else {
        ns as f64 / 1e6
    }
}
