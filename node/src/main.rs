//! `batond`, the Baton server.
//!
//! The replicated server (openraft over sled, the HTTP API of SPEC section 5) is being built;
//! until it lands this binary only reports the state machine format it was built with.

fn main() {
    eprintln!(
        "batond {}: the replicated server is not built yet; `batond dev` arrives with it",
        env!("CARGO_PKG_VERSION")
    );
    std::process::exit(1);
}
