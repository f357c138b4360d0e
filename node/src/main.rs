//! `batond`, the Baton server: one node of a replicated lease service (openraft over its own
//! log and state files, the HTTP API of docs/api.md). `batond dev` runs a one-node cluster; `batond run` one
//! member of a larger one; `batond restore` seeds a new member's data dir from a backup;
//! `batond recover` makes a survivor of a lost majority a one-member cluster. See `config` for the flags.

mod clock;
mod config;
mod connections;
mod http;
mod metrics;
mod network;
mod restore;
mod server;
mod service;
mod tls;

use std::io::IsTerminal;

use clap::Parser;
use tracing_subscriber::EnvFilter;

use crate::config::{Cli, LogFormat, Mode, NodeConfig};

/// jemalloc rather than glibc's malloc: every client request boxes futures of 1-4 KiB, above
/// glibc's per-thread cache, and glibc's bins for those sizes were about a tenth of a busy
/// leader's CPU; jemalloc caches them per thread. 4-8% more lease cycles at 64 clients, the same
/// RSS with 1,000,000 leases (docs/performance.md, "The load's own cost").
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let offline = match &cli.command {
        Mode::Restore(restore) => Some(("restore", restore::restore(restore).await)),
        Mode::Recover(recover) => Some(("recover", restore::recover(recover).await)),
        Mode::Dev { .. } | Mode::Run { .. } => None,
    };
    if let Some((name, outcome)) = offline {
        return match outcome {
            Ok(said) => {
                println!("{said}");
                std::process::ExitCode::SUCCESS
            }
            Err(error) => {
                eprintln!("batond {name}: {error:#}");
                std::process::ExitCode::FAILURE
            }
        };
    }
    let config = match NodeConfig::from_mode(cli.command) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("batond: {error:#}");
            return std::process::ExitCode::from(2);
        }
    };
    let filter = EnvFilter::try_from_env("BATON_LOG")
        .unwrap_or_else(|_| EnvFilter::new("info,openraft=warn,sled=warn"));
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    match config.tuning.log_format {
        LogFormat::Human => subscriber.init(),
        LogFormat::Json => subscriber.json().init(),
    }
    // A panic is a broken invariant (an impossible reply, a machine assertion): stop the whole
    // node at once rather than let one task die while the rest serves on from a state no
    // longer trusted. The other nodes take over; a restart rebuilds from the snapshot and log.
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |panic| {
        report(panic);
        tracing::error!("batond stopped: {panic}");
        std::process::abort();
    }));
    match server::run(config).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!("batond stopped: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
