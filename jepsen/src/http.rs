//! One client bound to one node, and the rule that turns an HTTP exchange into a history
//! outcome: `ok`, `fail` (surely not applied) or `info` (unknown).
//!
//! Clients never follow the leader (docs/harness.md): a client bound to a minority node must
//! see that node's answers, so stale reads cannot hide behind leader-following. That is why
//! the workloads speak raw HTTP with the wire shapes of `baton_client::api` instead of the
//! crate's `Client`, which retries across endpoints. The classification follows STYLE rule 8
//! and the client crate's `Error::is_indeterminate`. What must never live here: retries.

use std::net::SocketAddr;
use std::time::Duration;

use baton_client::api::{Applied, ErrorCode};
use serde_json::Value;

/// How an operation ended.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// A 2xx answer (204 included).
    Ok {
        /// The status.
        status: u16,
        /// The JSON body, `null` when there is none.
        body: Value,
        /// `Baton-Cluster-Time`.
        cluster_time_ms: Option<u64>,
        /// `Idempotent-Replayed: true`.
        replayed: bool,
    },
    /// Surely not applied: a refusal (4xx), `NO_LEADER` or `RESOURCE_EXHAUSTED`, or a
    /// connection that could not be opened.
    Fail {
        /// The problem code (`CONNECT` when no server answered).
        code: String,
        /// The problem's `held_by` (who holds the lease), when it names one.
        held_by: Value,
        /// `Baton-Cluster-Time`, when a server answered.
        cluster_time_ms: Option<u64>,
    },
    /// Unknown: a timeout, a cut connection, `OUTCOME_UNKNOWN`, `INTERNAL`, an unreadable
    /// answer.
    Info {
        /// What happened.
        code: String,
        /// `Baton-Cluster-Time`, when a server answered.
        cluster_time_ms: Option<u64>,
    },
}

/// An HTTP client bound to one node's API.
#[derive(Debug, Clone)]
pub struct NodeClient {
    http: reqwest::Client,
    base: String,
    /// The node id.
    pub node: u64,
    timeout: Duration,
}

impl NodeClient {
    /// A client of node `node` at `scheme://address` whose requests time out after `timeout`.
    pub fn new(
        http: reqwest::Client,
        scheme: &str,
        node: u64,
        address: SocketAddr,
        timeout: Duration,
    ) -> NodeClient {
        NodeClient {
            http,
            base: format!("{scheme}://{address}"),
            node,
            timeout,
        }
    }

    /// Sends one request, once, and classifies what came back.
    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
        idempotency_key: Option<&str>,
    ) -> Outcome {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base))
            .timeout(self.timeout);
        if let Some(body) = body {
            request = request.json(body);
        }
        if let Some(key) = idempotency_key {
            request = request.header("Idempotency-Key", key);
        }
        let response = match request.send().await {
            Ok(response) => response,
            Err(error) if error.is_connect() => {
                return Outcome::Fail {
                    code: "CONNECT".to_owned(),
                    held_by: Value::Null,
                    cluster_time_ms: None,
                }
            }
            Err(error) if error.is_timeout() => {
                return Outcome::Info {
                    code: "TIMEOUT".to_owned(),
                    cluster_time_ms: None,
                }
            }
            Err(_) => {
                return Outcome::Info {
                    code: "CONNECTION".to_owned(),
                    cluster_time_ms: None,
                }
            }
        };
        let status = response.status().as_u16();
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned)
        };
        let cluster_time_ms = header("baton-cluster-time").and_then(|text| text.parse().ok());
        let replayed = header("idempotent-replayed").is_some_and(|text| text == "true");
        let bytes = match response.bytes().await {
            Ok(bytes) => bytes,
            Err(_) if (200..300).contains(&status) || status >= 500 => {
                return Outcome::Info {
                    code: "BODY".to_owned(),
                    cluster_time_ms,
                }
            }
            Err(_) => Default::default(),
        };
        let body: Value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap_or(Value::Null)
        };
        let error_code: Option<ErrorCode> = serde_json::from_value(body["code"].clone()).ok();
        let code = error_code.map_or_else(|| format!("HTTP_{status}"), |code| code.to_string());
        let held_by = body["held_by"].clone();
        match Applied::of_answer(status, error_code) {
            Applied::Yes => Outcome::Ok {
                status,
                body,
                cluster_time_ms,
                replayed,
            },
            Applied::No => Outcome::Fail {
                code,
                held_by,
                cluster_time_ms,
            },
            Applied::Unknown => Outcome::Info {
                code,
                cluster_time_ms,
            },
        }
    }
}
