//! The load tool: `baton-jepsen bench --workload W`. Every workload prints its figures, one
//! line per measurement, and writes `W.json` and `W.svg` (a bar chart of the headline figure)
//! into `--out`. docs/performance.md has what it measured and the commands.
//!
//! Against running endpoints (loopback in our benchmarks), bounded by `--seconds`:
//! - `leases`, `tasks` (`cycles`): N concurrent clients run cycles; cycles per second and the
//!   latency of each cycle's first call. `--etcd` runs the same lease cycle against etcd's JSON
//!   gateway in the same run (`etcd`), so the ratio comes from one machine at one time.
//! - `sessions`: N sessions renewed once per period, and a probe's acquire latency.
//! - `hooks`: agents each running the real `baton hook claude-code` process per edit: the
//!   hook's time end to end beside a bare process start.
//! - `expiry`: L leases whose sessions all expire at the same moment, and the probe's latency
//!   around it.
//!
//! With their own three `batond` processes (batond's default flags; `--batond`):
//! - `failover`: the leader SIGKILLed (`--signal term`: SIGTERMed) under a steady writer, the
//!   writer's gap, `--repeat` times.
//! - `disruption`: a follower cut off for `--seconds` and healed, then a member removed while it
//!   keeps running, under a steady writer: the healthy majority's term must not change and its
//!   writes must not pause longer than `--gap-max-ms` (exit 1 otherwise).
//! - `memory`: L live leases, then every node's RSS and data size, and a node's restart time.

mod client;
mod cycles;
mod disruption;
mod etcd;
mod expiry;
mod failover;
mod hooks;
mod memory;
mod probe;
mod report;
mod sessions;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};

use crate::cluster::{find_batond, Cluster, ClusterConfig, ClusterGuard};

#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Client API endpoints, comma-separated; clients are spread over them.
    #[arg(long, value_delimiter = ',', default_value = "http://127.0.0.1:7420")]
    endpoints: Vec<String>,
    /// Concurrencies to measure, one after the other.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    clients: Vec<usize>,
    /// Seconds to run each measurement.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// What to measure.
    #[arg(long, value_enum, default_value_t = Workload::Leases)]
    workload: Workload,
    /// `leases`: etcd client endpoints (its JSON gateway, e.g. http://127.0.0.1:2379),
    /// comma-separated; each concurrency then runs against Baton and against etcd.
    #[arg(long, value_delimiter = ',')]
    etcd: Vec<String>,
    /// `leases`, `tasks`: measure one `fdatasync` of a small write on the disk under this
    /// directory (where the nodes' data dirs are) and print it beside the cycle's latency.
    #[arg(long)]
    fsync_probe: Option<PathBuf>,
    /// `sessions`: how many sessions to keep alive.
    #[arg(long, default_value_t = 10_000)]
    sessions: usize,
    /// `disruption`: the longest pause of the healthy majority's writes that passes, in ms
    /// (the target, and the default, is 100).
    #[arg(long, default_value_t = 100)]
    gap_max_ms: u64,
    /// `sessions`, `leases`, `tasks`: how requests use connections: `pooled:N` (one shared
    /// pool, at most N connections busy at once), `per-session` (each session, or each client
    /// of a cycle, keeps its own), or `fresh` (a new TCP connection per request, closed after
    /// it, as curl or a hook process does).
    #[arg(long, default_value = "pooled:512", value_parser = client::parse_connections)]
    connections: client::Connections,
    /// `sessions`: event streams (`GET /v1/events`, server-sent) kept open beside the renewals,
    /// spread over the endpoints, each read as it comes, as agents watching the board do.
    #[arg(long, default_value_t = 0)]
    streams: usize,
    /// `sessions`: how often each session is renewed, e.g. `3s` or `500ms`.
    #[arg(long, default_value = "3s", value_parser = parse_period)]
    period: Duration,
    /// `hooks`: how many agents run the hook.
    #[arg(long, default_value_t = 200)]
    agents: usize,
    /// `hooks`: edits per second of each agent, e.g. `2/s` (or `2`).
    #[arg(long, default_value = "2/s", value_parser = parse_rate)]
    rate: f64,
    /// `hooks`: the baton binary (default: `BATON_BIN`, next to this one, then on PATH).
    #[arg(long)]
    baton: Option<PathBuf>,
    /// `expiry`, `memory`: how many leases (default 100,000 for expiry, 1,000,000 for memory).
    #[arg(long)]
    leases: Option<usize>,
    /// `failover`: how many leader kills.
    #[arg(long, default_value_t = 10)]
    repeat: usize,
    /// `failover`: how the leader is stopped: `kill` (SIGKILL) or `term` (SIGTERM, on which
    /// it hands leadership over first).
    #[arg(long, value_enum, default_value_t = Signal::Kill)]
    signal: Signal,
    /// `disruption`: the network between the nodes (network namespaces or the proxy mesh).
    #[arg(long, value_enum, default_value_t = crate::net::NetChoice::Auto)]
    net: crate::net::NetChoice,
    /// `failover`, `memory`: the batond binary (default: next to this one, then on PATH).
    #[arg(long)]
    batond: Option<PathBuf>,
    /// Where the figures (`W.json`, `W.svg`) and, for `failover` and `memory`, the nodes' data
    /// and logs go; must be new or empty (default: a new directory under the system's
    /// temporary directory).
    #[arg(long)]
    out: Option<PathBuf>,
}

/// `--signal`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Signal {
    Kill,
    Term,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Workload {
    /// Acquire (creating a session), keepalive, end the session.
    Leases,
    /// Claim-next with a session, then complete with the fence.
    Tasks,
    /// A leader SIGKILLed under a steady writer, `--repeat` times: the writer's gap.
    Failover,
    /// A follower cut off and healed, a member removed while it runs: no term change, no gap.
    Disruption,
    /// `--sessions` sessions each renewed once per `--period`, and a probe's acquire latency.
    Sessions,
    /// `--agents` agents each running `baton hook claude-code` per edit at `--rate`.
    Hooks,
    /// `--leases` leases expiring together, and a probe's latency around their deadline.
    Expiry,
    /// `--leases` live leases on a cluster of its own: RSS, data size, restart time.
    Memory,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::Leases => "leases",
            Workload::Tasks => "tasks",
            Workload::Failover => "failover",
            Workload::Disruption => "disruption",
            Workload::Sessions => "sessions",
            Workload::Hooks => "hooks",
            Workload::Expiry => "expiry",
            Workload::Memory => "memory",
        }
    }
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    if !args.etcd.is_empty() && args.workload != Workload::Leases {
        bail!("--etcd goes with --workload leases only");
    }
    let out = out_dir(args.out.as_deref(), args.workload)?;
    if args.workload == Workload::Sessions && args.connections == client::Connections::PerSession {
        // A connection per session, and some to spare for the probe and the setup's pool.
        open_file_limit(args.sessions as u64 + 1_024)?;
    }
    let figures = match args.workload {
        Workload::Leases | Workload::Tasks => cycles::run(&args).await?,
        Workload::Sessions => sessions::run(&args).await?,
        Workload::Hooks => hooks::run(&args, &out).await?,
        Workload::Expiry => expiry::run(&args).await?,
        Workload::Failover => failover::run(&args, &out).await?,
        Workload::Disruption => disruption::run(&args, &out).await?,
        Workload::Memory => memory::run(&args, &out).await?,
    };
    figures.write(&out, args.workload.name())?;
    eprintln!(
        "baton-jepsen bench: figures in {}",
        out.join(format!("{}.json", args.workload.name())).display()
    );
    Ok(())
}

/// `--out`, or a new directory under the temporary directory; refused when not empty (the
/// cluster workloads start nodes on empty data directories under it).
fn out_dir(given: Option<&Path>, workload: Workload) -> anyhow::Result<PathBuf> {
    let dir = match given {
        Some(dir) => dir.to_owned(),
        None => std::env::temp_dir().join(format!(
            "baton-bench-{}-{}",
            workload.name(),
            std::process::id()
        )),
    };
    if std::fs::read_dir(&dir).is_ok_and(|mut entries| entries.next().is_some()) {
        bail!("{} is not empty: give a new --out", dir.display());
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    Ok(dir)
}

/// Starts three `batond` processes with batond's default flags, their data and logs under
/// `run_dir`, and waits until they have a leader.
async fn own_cluster(args: &BenchArgs, run_dir: &Path) -> anyhow::Result<ClusterGuard> {
    own_cluster_on(args, run_dir, crate::net::NetChoice::Auto).await
}

/// `own_cluster` on the network `net`.
async fn own_cluster_on(
    args: &BenchArgs,
    run_dir: &Path,
    net: crate::net::NetChoice,
) -> anyhow::Result<ClusterGuard> {
    Cluster::start(ClusterConfig {
        batond: find_batond(args.batond.as_deref())?,
        run_dir: run_dir.to_owned(),
        heartbeat_ms: None,
        election_timeout_ms: None,
        tick_ms: None,
        clock_control: false,
        net,
        snapshot_log_entries: None,
        secure: false,
        lazy_data_dirs: None,
        batond_before: None,
    })
    .await
}

/// Raises this process's open-file limit to at least `needed` descriptors: the soft limit up to
/// the hard one, and past the hard one where the system lets this process raise it (root).
fn open_file_limit(needed: u64) -> anyhow::Result<()> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).context("getrlimit")?;
    if soft >= needed {
        return Ok(());
    }
    setrlimit(Resource::RLIMIT_NOFILE, needed, needed.max(hard)).with_context(|| {
        format!(
            "--connections per-session needs {needed} open files and the limit is {soft} (hard \
             {hard}), which this process may not raise: raise it (ulimit -n) or give fewer \
             --sessions"
        )
    })
}

/// Checks `--seconds`, and `--endpoints` and `--etcd` (`http://host:port` each) for the workloads
/// that run against endpoints.
fn check_endpoints_and_seconds(args: &BenchArgs) -> anyhow::Result<()> {
    if args.endpoints.is_empty() || args.seconds == 0 || args.seconds > 600 {
        bail!("give --endpoints and --seconds 1..=600");
    }
    for endpoint in args.endpoints.iter().chain(&args.etcd) {
        client::authority(endpoint)?;
    }
    Ok(())
}

/// `3s`, `500ms`: a period of 10 ms..=60 s.
fn parse_period(text: &str) -> Result<Duration, String> {
    let (digits, unit) = match text.strip_suffix("ms") {
        Some(digits) => (digits, 1),
        None => (text.strip_suffix('s').unwrap_or(text), 1_000),
    };
    let value: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a period like 3s or 500ms"))?;
    let period = Duration::from_millis(value.saturating_mul(unit));
    if period < Duration::from_millis(10) || period > Duration::from_secs(60) {
        return Err(format!("the period must be 10ms..=60s, got {text}"));
    }
    Ok(period)
}

/// `2/s` or `2`: edits a second of one agent, 0.01..=100.
fn parse_rate(text: &str) -> Result<f64, String> {
    let rate: f64 = text
        .strip_suffix("/s")
        .unwrap_or(text)
        .parse()
        .map_err(|_| format!("{text:?} is not a rate like 2/s"))?;
    if !(0.01..=100.0).contains(&rate) {
        return Err(format!("the rate must be 0.01/s..=100/s, got {text}"));
    }
    Ok(rate)
}

/// The `fraction` percentile of `sorted` latencies (nearest rank), in milliseconds; NaN when
/// there are none.
fn percentile_ms(sorted: &[Duration], fraction: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let index = ((sorted.len() as f64 - 1.0) * fraction).round() as usize;
    sorted[index].as_secs_f64() * 1_000.0
}

/// The Raft term `endpoint` reports (`GET /v1/cluster`): how many elections a run caused is
/// the difference.
async fn term(http: &client::Http, endpoint: &str) -> anyhow::Result<u64> {
    let answer = http.get(endpoint, "/v1/cluster", None).await?;
    if !answer.status.is_success() {
        bail!("GET /v1/cluster at {endpoint} answered {}", answer.status);
    }
    let status: serde_json::Value = answer.json()?;
    status["term"]
        .as_u64()
        .context("GET /v1/cluster answered without a term")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periods_are_seconds_or_milliseconds_within_bounds() {
        assert_eq!(parse_period("3s"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_period("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_period("2"), Ok(Duration::from_secs(2)));
        for refused in ["", "3m", "5ms", "61s", "-1s", "s"] {
            assert!(parse_period(refused).is_err(), "{refused:?} was taken");
        }
    }

    #[test]
    fn rates_are_per_second_within_bounds() {
        assert_eq!(parse_rate("2/s"), Ok(2.0));
        assert_eq!(parse_rate("0.5"), Ok(0.5));
        for refused in ["", "2/m", "0/s", "101/s", "-1", "x/s"] {
            assert!(parse_rate(refused).is_err(), "{refused:?} was taken");
        }
    }

    #[test]
    fn percentiles_take_the_nearest_rank() {
        let sorted: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile_ms(&sorted, 0.5), 51.0);
        assert_eq!(percentile_ms(&sorted, 0.99), 99.0);
        assert_eq!(percentile_ms(&sorted, 1.0), 100.0);
        assert!(percentile_ms(&[], 0.5).is_nan());
    }

    #[test]
    fn an_out_directory_with_files_is_refused() {
        let dir = std::env::temp_dir().join(format!("baton-bench-out-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(
            out_dir(Some(&dir), Workload::Leases).is_ok(),
            "empty is fine"
        );
        std::fs::write(dir.join("leases.json"), "{}").unwrap();
        let refused = out_dir(Some(&dir), Workload::Leases).unwrap_err();
        assert!(refused.to_string().contains("not empty"), "{refused}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
