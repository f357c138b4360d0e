//! `--workload hooks`: `--agents` simulated Claude Code agents, each running the real
//! `baton hook claude-code` process for an edit `--rate` times a second, as Claude Code does
//! before every edit, for `--seconds`. Each agent edits files of its own (so every hook call
//! should be a grant) and waits for its hook before its next edit, as Claude Code waits before
//! the edit. The figure is the hook's time end to end, from spawning the process to its exit,
//! beside the time a `baton --version` process takes on the same machine (the process start
//! alone), so what the hook adds over starting is visible.
//!
//! The hook reads the endpoints from `BATON_ENDPOINTS` (set from `--endpoints`, each agent's
//! list starting at a different node) and, for a secured cluster, `BATON_CA_FILE` and
//! `BATON_TOKEN` from the bench's own environment.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use tokio::io::AsyncWriteExt;

use super::report::{Chart, Figures};
use super::{percentile_ms, BenchArgs};

/// Files each agent edits in turn.
const FILES_PER_AGENT: usize = 4;
/// `baton --version` runs that measure the process start alone.
const START_SAMPLES: usize = 30;

/// What the agents saw.
#[derive(Debug, Default)]
struct Seen {
    latencies: Vec<Duration>,
    /// Hooks that denied the edit (each agent edits only its own files, so any deny is wrong).
    denied: u64,
    /// Hooks that could not be run or did not exit 0.
    failed: u64,
    /// The first few reasons, for the report.
    reasons: Vec<String>,
}

pub(super) async fn run(args: &BenchArgs, out: &Path) -> anyhow::Result<Figures> {
    if args.endpoints.is_empty() || args.seconds == 0 || args.seconds > 600 {
        bail!("give --endpoints and --seconds 1..=600");
    }
    if args.agents == 0 || args.agents > 10_000 {
        bail!("give --agents 1..=10000");
    }
    let baton = crate::cluster::find_binary(
        "baton",
        args.baton.as_deref(),
        "BATON_BIN",
        "cargo build --release -p baton-cli",
    )?;
    let start = process_start(&baton).await?;
    let state = out.join("state");
    let work = out.join("work");
    let period = Duration::from_secs_f64(1.0 / args.rate);
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.seconds);
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let mut agents = Vec::new();
    for agent in 0..args.agents {
        let directory = work.join(format!("agent-{agent}"));
        std::fs::create_dir_all(&directory)
            .with_context(|| format!("create {}", directory.display()))?;
        let endpoints = rotated(&args.endpoints, agent).join(",");
        let hook = Hook {
            baton: baton.clone(),
            endpoints,
            state: state.clone(),
            directory,
            session: format!(
                "{:08x}-bench-{agent:05}-{}",
                std::process::id(),
                args.seconds
            ),
        };
        // Agents start spread over the first period, not all at once.
        let first = started + period.mul_f64(agent as f64 / args.agents as f64);
        let seen = seen.clone();
        agents.push(tokio::spawn(async move {
            let mut due = first;
            let mut edit = 0usize;
            while due < deadline {
                tokio::time::sleep_until(due.into()).await;
                let file = hook
                    .directory
                    .join(format!("file-{}.rs", edit % FILES_PER_AGENT));
                let began = Instant::now();
                let outcome = hook.run("PreToolUse", Some(&file)).await;
                let took = began.elapsed();
                let mut seen = seen.lock().expect("seen");
                match outcome {
                    Ok(None) => seen.latencies.push(took),
                    Ok(Some(reason)) => {
                        seen.denied += 1;
                        if seen.reasons.len() < 3 {
                            seen.reasons.push(reason);
                        }
                    }
                    Err(error) => {
                        seen.failed += 1;
                        if seen.reasons.len() < 3 {
                            seen.reasons.push(format!("{error:#}"));
                        }
                    }
                }
                drop(seen);
                edit += 1;
                // The next edit comes a period after this one was due, or at once when the
                // hook took longer than that.
                due = (due + period).max(Instant::now());
            }
            // The end of the agent's turn releases its files.
            let _ = hook.run("Stop", None).await;
        }));
    }
    for agent in agents {
        agent.await.context("an agent")?;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let mut seen = std::mem::take(&mut *seen.lock().expect("seen"));
    seen.latencies.sort();
    let hook = |fraction| percentile_ms(&seen.latencies, fraction);
    let start_p50 = percentile_ms(&start, 0.5);
    let hooks = seen.latencies.len() as u64 + seen.denied + seen.failed;
    println!(
        "hooks: {} agents at {}/s each: {hooks} hook runs ({:.0}/s), p50 {:.2} ms, p99 {:.2} ms, \
         max {:.2} ms, {} denied, {} failed; a `baton --version` process: p50 {start_p50:.2} ms",
        args.agents,
        args.rate,
        hooks as f64 / elapsed,
        hook(0.5),
        hook(0.99),
        hook(1.0),
        seen.denied,
        seen.failed,
    );
    // A run whose hooks denied or failed is not a measurement of the hook's speed.
    if seen.denied + seen.failed > 0 {
        bail!(
            "{} hooks denied and {} failed (every agent edits its own files, so each should be \
             granted): {}",
            seen.denied,
            seen.failed,
            seen.reasons.join("; ")
        );
    }
    let json = serde_json::json!({
        "workload": "hooks",
        "agents": args.agents,
        "rate_per_agent": args.rate,
        "seconds": args.seconds,
        "hooks": hooks,
        "hook_p50_ms": hook(0.5),
        "hook_p99_ms": hook(0.99),
        "hook_max_ms": hook(1.0),
        "denied": seen.denied,
        "failed": seen.failed,
        "reasons": seen.reasons,
        "process_start_p50_ms": start_p50,
    });
    let chart = Chart {
        title: format!(
            "{} agents, a hook process per edit, {}/s each",
            args.agents, args.rate
        ),
        unit: "ms from spawning the hook to its exit".to_owned(),
        bars: vec![
            ("p50".to_owned(), hook(0.5)),
            ("p99".to_owned(), hook(0.99)),
            ("max".to_owned(), hook(1.0)),
            ("process start p50".to_owned(), start_p50),
        ],
    };
    Ok(Figures { json, chart })
}

/// `endpoints` starting at the `agent`-th (modulo their number).
fn rotated(endpoints: &[String], agent: usize) -> Vec<String> {
    let first = agent % endpoints.len();
    endpoints[first..]
        .iter()
        .chain(&endpoints[..first])
        .cloned()
        .collect()
}

/// How long a `baton --version` process takes, `START_SAMPLES` times, one after the other.
async fn process_start(baton: &Path) -> anyhow::Result<Vec<Duration>> {
    let mut samples = Vec::with_capacity(START_SAMPLES);
    for _ in 0..START_SAMPLES {
        let began = Instant::now();
        let status = tokio::process::Command::new(baton)
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .await
            .with_context(|| format!("run {} --version", baton.display()))?;
        if !status.success() {
            bail!("{} --version exited with {status}", baton.display());
        }
        samples.push(began.elapsed());
    }
    samples.sort();
    Ok(samples)
}

/// One agent's hook: the binary, its endpoints, and its Claude session.
struct Hook {
    baton: PathBuf,
    endpoints: String,
    /// `XDG_STATE_HOME` of every hook run: where the hook keeps its session.
    state: PathBuf,
    /// The agent's working directory (outside any repository, so files are named by path).
    directory: PathBuf,
    session: String,
}

impl Hook {
    /// Runs `baton hook claude-code` for `event` (editing `file`): `None` when it let the edit
    /// through, the reason when it denied it.
    async fn run(&self, event: &str, file: Option<&Path>) -> anyhow::Result<Option<String>> {
        let mut input = serde_json::json!({
            "session_id": self.session,
            "hook_event_name": event,
            "cwd": self.directory,
        });
        if let Some(file) = file {
            input["tool_name"] = "Edit".into();
            input["tool_input"] = serde_json::json!({ "file_path": file });
        }
        let mut child = tokio::process::Command::new(&self.baton)
            .args(["hook", "claude-code"])
            .env("BATON_ENDPOINTS", &self.endpoints)
            .env("XDG_STATE_HOME", &self.state)
            .current_dir(&self.directory)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("spawn the hook")?;
        let mut stdin = child.stdin.take().context("the hook's stdin")?;
        stdin.write_all(input.to_string().as_bytes()).await?;
        drop(stdin);
        let output = child.wait_with_output().await.context("the hook")?;
        if !output.status.success() {
            bail!(
                "the hook exited with {}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        if output.stdout.is_empty() {
            return Ok(None);
        }
        let answer: serde_json::Value =
            serde_json::from_slice(&output.stdout).context("the hook's answer")?;
        Ok(Some(
            answer["hookSpecificOutput"]["permissionDecisionReason"]
                .as_str()
                .unwrap_or("a deny without a reason")
                .to_owned(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_agent_starts_at_another_endpoint() {
        let endpoints: Vec<String> = ["a", "b", "c"].map(str::to_owned).to_vec();
        assert_eq!(rotated(&endpoints, 0), ["a", "b", "c"]);
        assert_eq!(rotated(&endpoints, 1), ["b", "c", "a"]);
        assert_eq!(rotated(&endpoints, 5), ["c", "a", "b"]);
    }
}
