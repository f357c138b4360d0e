//! An agent that edits a file under a lease: acquire (waiting up to 10 s if someone else holds
//! it), write through the fence while the guard is valid, stop the moment it is not, release.
//! Run it against `batond dev`: `cargo run -p baton-client --example agent`.

use std::time::Duration;

use baton_client::{AcquireOptions, Client, Error};
use serde_json::json;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let client = Client::builder(["http://127.0.0.1:7420"])
        .holder("agent-rust")
        .build()?;
    let options = AcquireOptions::new()
        .ttl(Duration::from_secs(10))
        .reason("refactoring auth")
        .wait(Duration::from_secs(10));
    let guard = match client.acquire("repo/src/auth.rs", options).await {
        Ok(guard) => guard,
        Err(Error::Held { held_by, .. }) => {
            eprintln!(
                "{} still holds it (fence {})",
                held_by.holder, held_by.fence
            );
            return Ok(());
        }
        Err(error) => return Err(error),
    };
    println!("acquired {} fence={}", guard.resource(), guard.fence());

    // The guard renews itself in the background; every step checks it and writes with the
    // fence, so a write after the lease is gone is refused by the server (STALE_FENCE).
    for step in 1..=3 {
        tokio::select! {
            reason = guard.lost() => {
                eprintln!("lease lost ({reason}); stopping");
                return Ok(());
            }
            () = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
        let written = client
            .kv_put_fenced(&guard, "repo/src/auth.rs/progress", json!({"step": step}))
            .await?;
        println!("step {step} written at revision {}", written.revision);
    }
    guard.release().await?;
    println!("released");
    Ok(())
}
