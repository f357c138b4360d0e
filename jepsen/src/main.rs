//! `baton-jepsen`: the fault-injection harness of docs/harness.md (`test`) and the load tool
//! the benchmarks in the issue notes come from (`bench`).
//!
//! `test` starts a three-node cluster of real `batond` processes (`cluster`), puts a
//! fault-injecting network between them (`net`), runs a workload (`workloads/`) and faults
//! (`nemesis`), records a history (`history`), judges it (`checkers/`) and reports (`report`);
//! `runner` puts these in order. Every process it starts is stopped on exit, on Ctrl-C or
//! SIGTERM, and on panic.

mod bench;
mod checkers;
mod cluster;
mod history;
mod http;
mod lazyfs;
mod nemesis;
mod net;
mod report;
mod runner;
mod sim;
mod upgrade;
mod workloads;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "baton-jepsen",
    version,
    about = "Fault injection and load for Baton"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Lease cycles (acquire, keepalive, end the session) per second at several concurrencies.
    Bench(bench::BenchArgs),
    /// The fault-injection test of docs/harness.md.
    Test(runner::TestArgs),
    /// Judge a stored history again (and time the checkers).
    Check(runner::CheckArgs),
    /// The deterministic simulator: the whole cluster in this process, one seed a run.
    Sim(sim::SimArgs),
}

fn main() -> std::process::ExitCode {
    let command = Cli::parse().command;
    // The simulator runs a runtime of its own per seed, on this thread.
    if let Command::Sim(args) = command {
        return std::process::ExitCode::from(sim::run(args));
    }
    match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime.block_on(serve(command)),
        Err(error) => {
            eprintln!("baton-jepsen: starting the async runtime: {error}");
            std::process::ExitCode::from(2)
        }
    }
}

async fn serve(command: Command) -> std::process::ExitCode {
    match command {
        Command::Sim(_) => unreachable!("the simulator runs without the shared runtime"),
        Command::Bench(args) => match bench::run(args).await {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("baton-jepsen bench: {error:#}");
                std::process::ExitCode::from(2)
            }
        },
        Command::Check(args) => std::process::ExitCode::from(runner::recheck(args)),
        Command::Test(args) => {
            // Dropping the run future on a signal drops its cluster guard, which resumes and
            // kills every node it started; a panic unwinds through the same guard.
            let code = tokio::select! {
                code = runner::run(args) => code,
                signal = shutdown_signal() => {
                    eprintln!("baton-jepsen test: {signal}: stopping every process started");
                    2
                }
            };
            std::process::ExitCode::from(code)
        }
    }
}

/// Resolves on Ctrl-C or SIGTERM, naming which.
async fn shutdown_signal() -> &'static str {
    let mut terminate =
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(terminate) => terminate,
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
                return "interrupted";
            }
        };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => "interrupted",
        _ = terminate.recv() => "terminated",
    }
}
