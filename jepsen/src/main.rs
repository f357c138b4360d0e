//! `baton-jepsen`: the fault-injection harness of SPEC section 7 (`test`, being built) and the
//! load tool the benchmarks in the issue notes come from (`bench`).

mod bench;

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
    /// Lease cycles (acquire, keepalive, release) per second at several concurrencies.
    Bench(bench::BenchArgs),
    /// The fault-injection test of SPEC section 7.
    Test,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match Cli::parse().command {
        Command::Bench(args) => match bench::run(args).await {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("baton-jepsen bench: {error:#}");
                std::process::ExitCode::from(2)
            }
        },
        Command::Test => {
            // Exit 2 is "harness failure" in SPEC section 7: never mistaken for a verdict.
            eprintln!("baton-jepsen test: the fault-injection harness is not built yet");
            std::process::ExitCode::from(2)
        }
    }
}
