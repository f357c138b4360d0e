//! The lease cycle against etcd (v3 API through its JSON gateway, `POST /v3/...`), the way an
//! etcd user builds a lease: grant a lease, put the key only if absent with that lease (a
//! transaction), keep the lease alive once, revoke it (which deletes the key). The first step's
//! latency is grant + put, the two round trips etcd needs for what one Baton acquire does.

use std::time::Instant;

use anyhow::{bail, Context};
use serde_json::{json, Value};

use super::client::Http;
use super::cycles::ClientResult;

/// Runs cycles on keys `{key_prefix}/{n}` until `deadline`.
pub(super) async fn cycles_until(
    http: Http,
    endpoint: String,
    key_prefix: String,
    deadline: Instant,
) -> ClientResult {
    let mut result = ClientResult::default();
    let mut sequence = 0u64;
    while Instant::now() < deadline {
        sequence += 1;
        let key = format!("{key_prefix}/{sequence}");
        match cycle(&http, &endpoint, &key, &mut result).await {
            Ok(()) => result.cycles += 1,
            Err(_) => result.errors += 1,
        }
    }
    result
}

async fn cycle(
    http: &Http,
    endpoint: &str,
    key: &str,
    result: &mut ClientResult,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let granted = call(http, endpoint, "lease/grant", json!({ "TTL": 30 })).await?;
    // The gateway writes 64-bit integers as strings.
    let lease = granted["ID"]
        .as_str()
        .context("the lease grant answered without an ID")?
        .to_owned();
    let put = call(
        http,
        endpoint,
        "kv/txn",
        json!({
            "compare": [{ "key": base64(key.as_bytes()), "target": "CREATE", "create_revision": "0" }],
            "success": [{ "request_put": {
                "key": base64(key.as_bytes()),
                "value": base64(b"bench"),
                "lease": lease,
            } }],
        }),
    )
    .await?;
    if put["succeeded"] != Value::Bool(true) {
        bail!("the put-if-absent of {key} did not succeed: {put}");
    }
    result.acquire_latencies.push(started.elapsed());
    let renewed = call(http, endpoint, "lease/keepalive", json!({ "ID": lease })).await?;
    // A keepalive is a stream: the gateway answers `{"result": {...}}` for the one request.
    let ttl = renewed["result"]["TTL"]
        .as_str()
        .and_then(|ttl| ttl.parse::<u64>().ok());
    if ttl.unwrap_or(0) == 0 {
        bail!("the keepalive did not renew the lease: {renewed}");
    }
    call(http, endpoint, "lease/revoke", json!({ "ID": lease })).await?;
    Ok(())
}

async fn call(http: &Http, endpoint: &str, method: &str, body: Value) -> anyhow::Result<Value> {
    let answer = http
        .post(endpoint, &format!("/v3/{method}"), Some(&body), None)
        .await?;
    if !answer.status.is_success() {
        bail!("etcd {method} answered {}", answer.status);
    }
    answer.json()
}

/// Standard base64 with padding: how the gateway takes keys and values.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut text = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let word = chunk.iter().enumerate().fold(0u32, |word, (index, byte)| {
            word | (u32::from(*byte) << (16 - 8 * index))
        });
        for position in 0..4 {
            if position <= chunk.len() {
                text.push(char::from(
                    ALPHABET[(word >> (18 - 6 * position)) as usize & 63],
                ));
            } else {
                text.push('=');
            }
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::base64;

    #[test]
    fn base64_matches_the_standard_alphabet_and_padding() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"bench/1/64/3/17"), "YmVuY2gvMS82NC8zLzE3");
    }
}
