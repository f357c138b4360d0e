//! `baton-jepsen`, the fault-injection harness of SPEC section 7. Not built yet: it exits with
//! status 2 (harness failure), which no caller can mistake for a verdict.

fn main() {
    eprintln!(
        "baton-jepsen {}: the harness is not built yet",
        env!("CARGO_PKG_VERSION")
    );
    std::process::exit(2);
}
