//! `baton`, the command line for agents. The subcommands of SPEC section 6 are being built on
//! top of the `baton_client` library; until then the binary says so and exits with status 2.

fn main() {
    eprintln!(
        "error[INVALID_ARGUMENT]: baton {}: no subcommands are built yet",
        env!("CARGO_PKG_VERSION")
    );
    std::process::exit(2);
}
