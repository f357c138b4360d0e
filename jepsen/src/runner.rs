//! `baton-jepsen test`: start a cluster, run a workload and the nemesis until the time limit,
//! heal, take the final reads, stop everything, check, and report. Exit 0 valid, 1 invalid,
//! 2 unknown or harness failure (docs/harness.md).
//!
//! What must never live here: the workloads, faults or checks themselves; this module only
//! puts them in order. Everything it starts is bounded by the time limit plus fixed grace
//! periods, and stopped by the [`ClusterGuard`] whatever happens.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context as _};
use serde_json::{json, Value};

use crate::checkers;
use crate::cluster::{find_batond, Cluster, ClusterConfig, ClusterGuard, NodeFailure};
use crate::history::{History, OpType, Process, FINAL};
use crate::nemesis::{Fault, Nemesis};
use crate::net::NetChoice;
use crate::report;
use crate::workloads::{self, ClientPause, Context, GuardClock, ProtectedResource, Workload};

/// Arguments of `baton-jepsen test`.
#[derive(Debug, clap::Args)]
pub struct TestArgs {
    /// lease, semaphore, fenced-kv, unfenced-lock, queue or line.
    #[arg(long, value_enum)]
    workload: Workload,
    /// Faults, comma-separated: kill, kill-all, power, pause, partition, clock, clock-beyond,
    /// membership, upgrade, none.
    #[arg(long, value_delimiter = ',', default_value = "none")]
    nemesis: Vec<String>,
    /// Seconds of workload (1..=3600); healing and checking come on top.
    #[arg(long, default_value_t = 60)]
    time_limit: u64,
    /// Concurrent clients (1..=64).
    #[arg(long, default_value_t = 6)]
    concurrency: usize,
    /// Seed of the generators and the fault schedule.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Run directory (default `jepsen/store/<timestamp>/`).
    #[arg(long)]
    out: Option<PathBuf>,
    /// The batond binary (default: `BATOND_BIN`, next to this binary, or on `PATH`).
    #[arg(long)]
    batond: Option<PathBuf>,
    /// Seconds the linearizability search may take before answering `unknown`.
    #[arg(long, default_value_t = 60)]
    check_time_limit: u64,
    /// The network between the nodes: namespaces with iptables (root only), the TCP proxy
    /// mesh on 127.0.0.1, or auto (namespaces when they work here, else the proxy mesh).
    #[arg(long, value_enum, default_value = "auto")]
    net: NetChoice,
    /// Snapshot-heavy: start every node with `--snapshot-log-entries 20`, so snapshots are
    /// built, sent and installed all the time, and aim half the kills at snapshot installs.
    #[arg(long)]
    snapshot_heavy: bool,
    /// Like `--snapshot-heavy` with this many log entries between snapshots.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    snapshot_log_entries: Option<u64>,
    /// Run against a secured cluster: `--auth` with a bootstrap admin token, the client API
    /// over HTTPS and mutual TLS between peers, with a CA made for the run.
    #[arg(long)]
    secure: bool,
    /// With the `power` nemesis: a power cut also tears the last unsynced write of each file
    /// (its first half reaches the disk).
    #[arg(long)]
    power_torn: bool,
    /// With the `upgrade` nemesis: the git revision of the release to upgrade from; its
    /// batond is built once and cached under target/upgrade-from/.
    #[arg(long, conflicts_with = "batond_before")]
    upgrade_from: Option<String>,
    /// With the `upgrade` nemesis: the earlier release's batond binary, instead of building
    /// one with --upgrade-from.
    #[arg(long)]
    batond_before: Option<PathBuf>,
}

/// `--snapshot-log-entries` of a `--snapshot-heavy` run: small enough that a follower down for
/// a second or two of writes falls behind the leader's purged log and needs a snapshot.
const SNAPSHOT_HEAVY_LOG_ENTRIES: u64 = 20;

/// The workloads the `restore` nemesis runs with: their checkers judge fences and values, which
/// a restore keeps (fences) or rolls back to the backup (values), not holds by time.
const RESTORABLE: [Workload; 1] = [Workload::FencedKv];

/// Arguments of `baton-jepsen check`: judge a stored history again.
#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// The run's `history.jsonl`.
    #[arg(long)]
    history: PathBuf,
    /// The workload that produced it.
    #[arg(long, value_enum)]
    workload: Workload,
    /// The run had clock-beyond (hold and rate checkers not counted).
    #[arg(long)]
    beyond: bool,
    /// Seconds the linearizability search may take.
    #[arg(long, default_value_t = 60)]
    check_time_limit: u64,
}

/// Re-checks a stored history and prints the checkers' verdicts and timings.
pub fn recheck(args: CheckArgs) -> u8 {
    let ops = match History::read_jsonl(&args.history) {
        Ok(ops) => ops,
        Err(error) => {
            eprintln!("baton-jepsen check: {}: {error:#}", args.history.display());
            return 2;
        }
    };
    let results = checkers::check_all(
        args.workload,
        &ops,
        args.beyond,
        Duration::from_secs(args.check_time_limit),
    );
    let verdict = checkers::overall(&results);
    let run = json!({"workload": args.workload.name(), "out": args.history.display().to_string(),
                     "history_events": ops.len()});
    print!("{}", report::summary(verdict, &results, &run, &ops));
    match verdict {
        checkers::Verdict::Valid => 0,
        checkers::Verdict::Invalid => 1,
        checkers::Verdict::Unknown => 2,
    }
}

/// Runs a test; returns the exit code.
pub async fn run(args: TestArgs) -> u8 {
    match run_inner(args).await {
        Ok(verdict) => match verdict {
            checkers::Verdict::Valid => 0,
            checkers::Verdict::Invalid => 1,
            checkers::Verdict::Unknown => 2,
        },
        Err(error) => {
            // A node that could not restart says which kind of failure it is itself.
            match error.downcast_ref::<NodeFailure>() {
                Some(failure) => eprintln!("baton-jepsen test: {failure}"),
                None => eprintln!("baton-jepsen test: harness failure: {error:#}"),
            }
            2
        }
    }
}

async fn run_inner(args: TestArgs) -> anyhow::Result<checkers::Verdict> {
    if !(1..=3600).contains(&args.time_limit) || !(1..=64).contains(&args.concurrency) {
        bail!("--time-limit must be 1..=3600 and --concurrency 1..=64");
    }
    let mut faults: Vec<Fault> = Vec::new();
    for name in &args.nemesis {
        if let Some(fault) = Fault::parse(name.trim())? {
            if !faults.contains(&fault) {
                faults.push(fault);
            }
        }
    }
    let beyond = faults.contains(&Fault::ClockBeyond);
    let clock_control = faults.contains(&Fault::Clock) || beyond;
    let out = match &args.out {
        Some(out) => out.clone(),
        None => PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/store")).join(timestamp()),
    };
    std::fs::create_dir_all(&out).with_context(|| format!("create {}", out.display()))?;
    let batond = find_batond(args.batond.as_deref())?;
    let batond_before = match (&args.upgrade_from, &args.batond_before) {
        (Some(revision), None) => Some(crate::upgrade::earlier_batond(revision)?),
        (None, Some(path)) if path.is_file() => Some(path.clone()),
        (None, Some(path)) => bail!("--batond-before {} is not a file", path.display()),
        _ => None,
    };
    if faults.contains(&Fault::Upgrade) != batond_before.is_some() {
        bail!("the upgrade nemesis and --upgrade-from (or --batond-before) go together");
    }
    if faults.contains(&Fault::Restore) && !RESTORABLE.contains(&args.workload) {
        bail!(
            "the restore nemesis runs with the {} workloads: the others' checkers judge holds by time, which a restore does not keep (a renewal after the backup is undone)",
            RESTORABLE.map(Workload::name).join(" and ")
        );
    }
    let snapshot_log_entries = args
        .snapshot_log_entries
        .or(args.snapshot_heavy.then_some(SNAPSHOT_HEAVY_LOG_ENTRIES));
    let config = ClusterConfig {
        batond,
        run_dir: out.clone(),
        heartbeat_ms: Some(50),
        election_timeout_ms: Some(300),
        tick_ms: Some(100),
        clock_control,
        net: args.net,
        snapshot_log_entries,
        secure: args.secure,
        lazy_data_dirs: faults
            .contains(&Fault::Power)
            .then_some(if args.power_torn {
                crate::lazyfs::Torn::LastWrite
            } else {
                crate::lazyfs::Torn::No
            }),
        batond_before,
    };
    let guard: ClusterGuard = Cluster::start(config)
        .await
        .context("starting the cluster")?;
    let cluster = guard.0.clone();
    eprintln!(
        "baton-jepsen: cluster up (network: {}, {}), running {} for {} s with {:?}",
        cluster.net.name(),
        cluster.net_selection,
        args.workload.name(),
        args.time_limit,
        faults.iter().map(|fault| fault.name()).collect::<Vec<_>>()
    );

    let history = History::new();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.time_limit);
    let clocks: Vec<Arc<GuardClock>> = (0..args.concurrency)
        .map(|_| Arc::new(GuardClock::new()))
        .collect();
    let client_pause = Arc::new(ClientPause::default());
    let http = cluster
        .client_builder()?
        .pool_max_idle_per_host(64)
        .build()?;
    let ctx = Context {
        history: history.clone(),
        nodes: cluster
            .nodes
            .iter()
            .map(|node| (node.id, node.api))
            .collect(),
        http,
        scheme: cluster.scheme(),
        deadline,
        seed: args.seed,
        clocks: clocks.clone(),
        client_pause: client_pause.clone(),
        resource: Arc::new(ProtectedResource::new(
            args.workload != Workload::UnfencedLock,
            history.clone(),
        )),
    };
    let nemesis = Nemesis {
        cluster: cluster.clone(),
        history: history.clone(),
        clocks,
        client_pause: client_pause.clone(),
        stall_clients: args.workload == Workload::UnfencedLock,
        faults: faults.clone(),
        deadline,
        seed: args.seed,
        snapshot_log_entries,
    };
    let mut nemesis_task = tokio::spawn(nemesis.clone().run());
    let workload = {
        let ctx = ctx.clone();
        let concurrency = args.concurrency;
        let kind = args.workload;
        tokio::spawn(async move {
            match kind {
                Workload::Lease => {
                    workloads::lease::run(ctx, concurrency, false, workloads::lease::TREE).await
                }
                Workload::Semaphore => {
                    let tree = workloads::lease::SEMAPHORE_TREE;
                    workloads::lease::run(ctx, concurrency, false, tree).await
                }
                Workload::UnfencedLock => workloads::unfenced_lock::run(ctx, concurrency).await,
                Workload::FencedKv => workloads::fenced_kv::run(ctx, concurrency).await,
                Workload::Queue => workloads::queue::run(ctx, concurrency).await,
                Workload::Line => workloads::line::run(ctx, concurrency).await,
            }
        })
    };
    // Workers stop at the deadline; an operation in flight ends within its timeout, a stalled
    // client within its stall. Anything later is a harness failure, not a hang. A node that
    // cannot be restarted ends the nemesis early with its failure: the run stops at once.
    let grace = Duration::from_secs(30);
    let mut workload = workload;
    let mut nemesis_result = None;
    let workload_done = loop {
        tokio::select! {
            done = tokio::time::timeout_at((deadline + grace).into(), &mut workload) => break done.is_ok(),
            finished = &mut nemesis_task, if nemesis_result.is_none() => {
                let Ok(finished) = finished else {
                    bail!("the nemesis task panicked");
                };
                if let Err(failure) = finished {
                    workload.abort();
                    return stop_on_node_failure(failure, guard, &history, &out, &args, &faults);
                }
                nemesis_result = Some(finished);
            }
        }
    };
    if !workload_done {
        bail!("the workload did not stop within {grace:?} of the time limit");
    }
    let injected = match nemesis_result {
        Some(finished) => finished,
        None => match tokio::time::timeout(grace + Duration::from_secs(30), nemesis_task).await {
            Ok(Ok(finished)) => finished,
            _ => bail!("the nemesis did not finish healing"),
        },
    };
    let injected = match injected {
        Ok(injected) => injected,
        Err(failure) => {
            return stop_on_node_failure(failure, guard, &history, &out, &args, &faults)
        }
    };
    if let Err(failure) = nemesis.heal().await {
        return stop_on_node_failure(failure, guard, &history, &out, &args, &faults);
    }
    eprintln!(
        "baton-jepsen: workload done after {:.1} s; healing and final reads",
        started.elapsed().as_secs_f64()
    );
    let healed = record_recovery(&cluster, &history).await;
    final_reads(&cluster, &history, args.workload).await;
    sample_digests(&cluster, &history).await;
    sample_pipelines(&cluster, &history).await;
    record_votes(&cluster, &history);
    // A node that died during the final reads would leave them short without saying why.
    if let Some(crash) = cluster.crashed() {
        history.nemesis("crashed", crash.to_json());
        return stop_on_node_failure(crash, guard, &history, &out, &args, &faults);
    }
    let starts = cluster.starts();
    let unidentified = cluster.net.unidentified_connections();
    let net_name = cluster.net.name();
    let net_selection = cluster.net_selection.clone();
    drop(guard);

    let ops = history.snapshot();
    History::write_jsonl(&ops, &out.join("history.jsonl"))?;
    let results = checkers::check_all(
        args.workload,
        &ops,
        beyond,
        Duration::from_secs(args.check_time_limit),
    );
    let verdict = checkers::overall(&results);
    let run = json!({
        "workload": args.workload.name(),
        "nemesis": faults.iter().map(|fault| fault.name()).collect::<Vec<_>>(),
        "time_limit_s": args.time_limit,
        "concurrency": args.concurrency,
        "seed": args.seed,
        "snapshot_log_entries": snapshot_log_entries,
        "secure": args.secure,
        "out": out.display().to_string(),
        "network": net_name,
        "network_selection": net_selection,
        "faults": injected,
        "client_stalls": client_pause.stalls.load(std::sync::atomic::Ordering::Relaxed),
        "node_starts": starts,
        "unidentified_peer_connections": unidentified,
        "healed": healed,
        "history_events": ops.len(),
        "operations": report::operation_counts(&ops),
    });
    report::write_results(&out.join("results.json"), verdict, &results, run.clone())?;
    report::write_latency_svg(
        &out.join("latency.svg"),
        &ops,
        &format!(
            "{} under {:?}, seed {}",
            args.workload.name(),
            args.nemesis,
            args.seed
        ),
    )?;
    print!("{}", report::summary(verdict, &results, &run, &ops));
    Ok(verdict)
}

/// Ends a run whose node could not be restarted: stops every process, keeps the history so
/// far, writes a `results.json` whose verdict is unknown and whose `failure` names the node,
/// the cause and its log's tail, and returns the failure (exit 2).
fn stop_on_node_failure(
    failure: NodeFailure,
    guard: ClusterGuard,
    history: &History,
    out: &std::path::Path,
    args: &TestArgs,
    faults: &[Fault],
) -> anyhow::Result<checkers::Verdict> {
    let starts = guard.0.starts();
    drop(guard);
    let ops = history.snapshot();
    History::write_jsonl(&ops, &out.join("history.jsonl"))?;
    let document = json!({
        "valid": checkers::Verdict::Unknown.to_json(),
        "failure": failure.to_json(),
        "checkers": {},
        "run": {
            "workload": args.workload.name(),
            "nemesis": faults.iter().map(|fault| fault.name()).collect::<Vec<_>>(),
            "time_limit_s": args.time_limit,
            "concurrency": args.concurrency,
            "seed": args.seed,
            "snapshot_log_entries": args
                .snapshot_log_entries
                .or(args.snapshot_heavy.then_some(SNAPSHOT_HEAVY_LOG_ENTRIES)),
            "out": out.display().to_string(),
            "node_starts": starts,
            "history_events": ops.len(),
        },
    });
    std::fs::write(
        out.join("results.json"),
        serde_json::to_string_pretty(&document)?,
    )?;
    Err(failure.into())
}

/// The reads after healing that the durability checkers need, recorded as `final` events.
async fn final_reads(cluster: &Cluster, history: &History, workload: Workload) {
    let snapshot = history.snapshot();
    let record = |f: &str, key: &str, value: Value, node: u64| {
        history.add(
            Process::Named(FINAL.to_owned()),
            OpType::Info,
            f,
            Value::from(key),
            value,
            None,
            None,
            Some(node),
        );
    };
    match workload {
        Workload::FencedKv => {
            // One read after another, each recorded once answered: a later read was sent after
            // an earlier one's answer (`txn-atomic` relies on that order).
            for key in workloads::fenced_kv::final_read_keys(&snapshot) {
                for id in cluster.ids() {
                    let path = format!("/v1/kv/{key}");
                    let answer = match get_settled(
                        cluster,
                        id,
                        &path,
                        Duration::from_secs(2),
                        |status, _| status == 200 || status == 404,
                    )
                    .await
                    {
                        Ok((200, body)) => Some((body["value"].clone(), body["revision"].clone())),
                        Ok(_) => Some((Value::Null, Value::from(0))),
                        Err(_) => None,
                    };
                    let (value, revision) = answer.clone().unwrap_or_default();
                    record(
                        "final-read",
                        &key,
                        json!({"node": id, "ok": answer.is_some(), "value": value,
                               "revision": revision}),
                        id,
                    );
                }
            }
        }
        Workload::Queue => {
            let mut queues: Vec<String> = snapshot
                .iter()
                .filter(|op| op.is_client() && op.f == "enqueue")
                .map(|op| op.key_str().to_owned())
                .collect();
            queues.sort();
            queues.dedup();
            for queue in queues {
                for id in cluster.ids() {
                    let (tasks, complete) = list_tasks(cluster, id, &queue).await;
                    record(
                        "final-tasks",
                        &queue,
                        json!({"node": id, "complete": complete, "tasks": tasks}),
                        id,
                    );
                }
            }
        }
        Workload::Line => {
            let read = read_events(cluster).await;
            let node = read["node"].as_u64().unwrap_or(0);
            record(checkers::line::FINAL_EVENTS, "", read, node);
        }
        Workload::Lease | Workload::UnfencedLock | Workload::Semaphore => {}
    }
    if !matches!(workload, Workload::Queue | Workload::Line) {
        // Every node's view of the lease set, for the final-leases checker. Recorded once the
        // listing is complete, so the event's time is after every page's answer.
        for id in cluster.ids() {
            let (leases, complete) = list_leases(cluster, id).await;
            record(
                "final-leases",
                "",
                json!({"node": id, "complete": complete, "leases": leases}),
                id,
            );
        }
    }
}

/// GETs `path` from node `id` until an answer `settles` (by its status and body), up to five
/// tries 200 ms apart: that answer, or the last unsettled answer or failure as JSON.
async fn get_settled(
    cluster: &Cluster,
    id: u64,
    path: &str,
    timeout: Duration,
    settles: impl Fn(u16, &Value) -> bool,
) -> Result<(u16, Value), Value> {
    let mut last = Value::Null;
    for _ in 0..5 {
        match cluster
            .call(id, reqwest::Method::GET, path, None, timeout)
            .await
        {
            Ok((status, body)) if settles(status, &body) => return Ok((status, body)),
            Ok((status, body)) => last = json!({"status": status, "body": body}),
            Err(error) => last = Value::from(format!("{error:#}")),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(last)
}

/// Every live lease of the default namespace as node `id` lists it, page by page; false
/// when a page could not be read.
async fn list_leases(cluster: &Cluster, id: u64) -> (Vec<Value>, bool) {
    let mut leases = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..100 {
        let mut path = "/v1/leases?prefix=&limit=1000".to_owned();
        if let Some(cursor) = &cursor {
            path.push_str(&format!("&cursor={cursor}"));
        }
        let page = get_settled(cluster, id, &path, Duration::from_secs(3), |status, _| {
            status == 200
        })
        .await;
        let Ok((_, page)) = page else {
            return (leases, false);
        };
        for lease in page["leases"].as_array().into_iter().flatten() {
            leases.push(
                json!({"resource": lease["resource"], "fence": lease["fence"],
                               "mode": lease["mode"], "expires_in_ms": lease["expires_in_ms"]}),
            );
        }
        match page["next_cursor"].as_str() {
            Some(next) if !next.is_empty() => cursor = Some(next.to_owned()),
            _ => return (leases, true),
        }
    }
    (leases, false)
}

/// Pages of the event log a final read may take (a thousand events each).
const EVENT_PAGES_MAX: usize = 1_000;

/// The whole event log of the default namespace from revision 0, page by page, from the first
/// node that answers every page (followers forward to the leader), for the `line` checker:
/// `{node, complete, trimmed, error, events}`, each event `{revision, cluster_time_ms, type,
/// resource, holder, fence, mode}`. `trimmed` when the server refuses a revision as older than
/// its window (`after=0` included): the log no longer starts at revision 1.
async fn read_events(cluster: &Cluster) -> Value {
    let mut last_error = Value::Null;
    for id in cluster.ids() {
        let mut events: Vec<Value> = Vec::new();
        let mut after = 0u64;
        for _ in 0..EVENT_PAGES_MAX {
            let path = format!("/v1/events?after={after}&limit=1000");
            let answer = get_settled(
                cluster,
                id,
                &path,
                Duration::from_secs(3),
                |status, body| status == 200 || (status == 404 && body["code"] == "NOT_FOUND"),
            )
            .await;
            let page = match answer {
                Ok((200, page)) => page,
                Ok((_, body)) => {
                    return json!({"node": id, "complete": false, "trimmed": true,
                                  "error": body, "events": []});
                }
                Err(error) => {
                    last_error = error;
                    break;
                }
            };
            for event in page["events"].as_array().into_iter().flatten() {
                let kind = &event["kind"];
                events.push(json!({"revision": event["revision"],
                                   "cluster_time_ms": event["cluster_time_ms"],
                                   "type": kind["type"], "resource": kind["resource"],
                                   "holder": kind["holder"], "fence": kind["fence"],
                                   "mode": kind["mode"]}));
            }
            let next = page["next"].as_u64().unwrap_or(after);
            if next <= after {
                return json!({"node": id, "complete": true, "trimmed": false,
                              "error": null, "events": events});
            }
            after = next;
        }
    }
    json!({"node": null, "complete": false, "trimmed": false, "error": last_error, "events": []})
}

async fn list_tasks(cluster: &Cluster, id: u64, queue: &str) -> (Vec<Value>, bool) {
    let mut tasks = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..100 {
        let mut path = format!("/v1/queues/{queue}/tasks?limit=1000");
        if let Some(cursor) = &cursor {
            path.push_str(&format!("&cursor={cursor}"));
        }
        let page = get_settled(cluster, id, &path, Duration::from_secs(3), |status, _| {
            status == 200
        })
        .await;
        let Ok((_, page)) = page else {
            return (tasks, false);
        };
        for task in page["tasks"].as_array().into_iter().flatten() {
            tasks.push(json!({"id": task["id"], "state": task["state"]}));
        }
        match page["next_cursor"].as_str() {
            Some(next) if !next.is_empty() => cursor = Some(next.to_owned()),
            _ => return (tasks, true),
        }
    }
    (tasks, false)
}

/// Samples every node's digest for a few seconds, so that nodes are caught at common applied
/// indexes despite the idle ticks that keep the index moving.
async fn sample_digests(cluster: &Cluster, history: &History) {
    let until = Instant::now() + Duration::from_secs(3);
    let mut samples: Vec<serde_json::Map<String, Value>> =
        vec![serde_json::Map::new(); cluster.nodes.len()];
    while Instant::now() < until {
        let answers = futures_util::future::join_all(
            cluster
                .ids()
                .into_iter()
                .map(|id| async move { (id, cluster.get_json(id, "/v1/debug/digest").await) }),
        )
        .await;
        for (id, answer) in answers {
            if let Ok(digest) = answer {
                if let (Some(index), Some(value)) =
                    (digest["applied_index"].as_u64(), digest["digest"].as_str())
                {
                    samples[usize::try_from(id - 1).unwrap_or(0)]
                        .insert(index.to_string(), Value::from(value));
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for (position, samples) in samples.into_iter().enumerate() {
        let id = position as u64 + 1;
        history.add(
            Process::Named(FINAL.to_owned()),
            OpType::Info,
            "digest",
            Value::Null,
            json!({"node": id, "samples": samples}),
            None,
            None,
            Some(id),
        );
    }
}

/// Every vote each node saved, from its log (every start of it), as one `final` event per
/// node and cluster it was a member of (`votes`: `[{term, voted_for, committed}]` in the order
/// saved), for the `votes` checker. A restore gives the node a new data dir whose votes start
/// again (`votes::per_data_dir`).
fn record_votes(cluster: &Cluster, history: &History) {
    for id in cluster.ids() {
        let log = std::fs::read_to_string(cluster.log_path(id)).unwrap_or_default();
        for (restores, votes) in checkers::votes::per_data_dir(&log).into_iter().enumerate() {
            history.add(
                Process::Named(FINAL.to_owned()),
                OpType::Info,
                checkers::votes::FINAL_VOTES,
                Value::Null,
                json!({"node": id, "restores": restores, "votes": votes}),
                None,
                None,
                Some(id),
            );
        }
    }
}

/// How long the cluster may take to be ready again once the faults are healed.
const RECOVERY_BOUND: Duration = Duration::from_secs(30);
/// How long each node's proposer may keep batches waiting once the cluster is ready again: a
/// few times its own bound on waiting for openraft's answer.
const PIPELINE_BOUND: Duration = Duration::from_secs(10);

/// Waits for the healed cluster to be ready and records how that went (checker `recovery`).
async fn record_recovery(cluster: &Cluster, history: &History) -> bool {
    let started = Instant::now();
    let ready = cluster.wait_ready(RECOVERY_BOUND).await;
    if let Err(error) = &ready {
        eprintln!("baton-jepsen: {error:#}");
    }
    history.add(
        Process::Named(FINAL.to_owned()),
        OpType::Info,
        "recovery",
        Value::Null,
        json!({
            "ready": ready.is_ok(),
            "waited_ms": started.elapsed().as_millis() as u64,
            "bound_ms": RECOVERY_BOUND.as_millis() as u64,
            "error": ready.as_ref().err().map(|error| format!("{error:#}")),
        }),
        None,
        None,
        None,
    );
    ready.is_ok()
}

/// Polls every running node's proposer gauge until it reads 0 or [`PIPELINE_BOUND`] passes,
/// and records one `pipeline` event per node (checker `recovery`).
async fn sample_pipelines(cluster: &Cluster, history: &History) {
    let started = Instant::now();
    let sampled = cluster
        .ids()
        .into_iter()
        .filter(|id| cluster.is_running(*id))
        .map(|id| async move {
            let mut last = None;
            loop {
                match cluster.gauge(id, "baton_proposer_batches_in_flight").await {
                    Ok(0) => return (id, true, Some(0)),
                    Ok(in_flight) => last = Some(in_flight),
                    Err(error) => eprintln!("baton-jepsen: {error:#}"),
                }
                if started.elapsed() >= PIPELINE_BOUND {
                    return (id, false, last);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
    for (id, drained, in_flight) in futures_util::future::join_all(sampled).await {
        history.add(
            Process::Named(FINAL.to_owned()),
            OpType::Info,
            "pipeline",
            Value::Null,
            json!({"node": id, "drained": drained, "in_flight": in_flight,
                   "waited_ms": started.elapsed().as_millis() as u64}),
            None,
            None,
            Some(id),
        );
    }
}

/// `YYYYMMDDTHHMMSSZ` of now, for the default run directory.
fn timestamp() -> String {
    let epoch_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| {
            i64::try_from(elapsed.as_secs()).unwrap_or(0) * 1_000
        });
    // `2026-11-30T02:48:59.000Z` without its separators and milliseconds.
    let rfc3339 = baton_client::api::rfc3339(epoch_ms);
    let compact: String = rfc3339[..19]
        .chars()
        .filter(|c| *c != '-' && *c != ':')
        .collect();
    format!("{compact}Z")
}
