//! `baton`, the command line for agents (docs/cli.md). The commands live in `cli/`; this
//! file only parses the arguments (a usage error exits 2, but for a hook, which answers it as a
//! decision), starts a runtime, and exits
//! with the command's code.

mod cli;
mod mcp;

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = match cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => return std::process::ExitCode::from(cli::usage_error(&error)),
    };
    if let cli::Command::Supervise(args) = &cli.command {
        // Before any runtime: the supervisor is single-threaded by design.
        return cli::supervise::main(args);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error[INTERNAL]: cannot start the async runtime: {error}");
            return std::process::ExitCode::from(cli::output::EXIT_FAILURE);
        }
    };
    let code = runtime.block_on(cli::main(cli));
    // Best-effort background work (a dropped guard's release) gets a moment, not forever.
    runtime.shutdown_timeout(std::time::Duration::from_millis(500));
    std::process::ExitCode::from(code)
}
