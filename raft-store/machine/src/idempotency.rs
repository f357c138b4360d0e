//! G8: per namespace and key, the fingerprint of the first request and the reply it got.
//! A retry with the same fingerprint gets that reply again; another fingerprint is refused.
//! Records live `idempotency_ttl_ms` of cluster time and at most `idempotency_keys_max` are
//! kept, oldest dropped first. Only replies of requests that changed state are recorded.

use imbl::{OrdMap, Vector};

use serde::{Deserialize, Serialize};

use super::command::{IdempotencyTag, Recorded, Rejection, Reply, Response};
use super::{Limits, Namespace};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct IdempotencyTable {
    #[serde(with = "crate::imbl_serde::ord_map")]
    pub(super) records: OrdMap<(Namespace, String), Record>,
    /// The keys in the order they were recorded, which is cluster-time order.
    #[serde(with = "crate::imbl_serde::vector")]
    pub(super) order: Vector<(u64, Namespace, String)>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Record {
    pub(super) fingerprint: [u8; 32],
    pub(super) reply: Reply,
    pub(super) recorded: Recorded,
}

impl IdempotencyTable {
    /// The recorded answer for this key: a replay, or a refusal if the request differs.
    pub(super) fn lookup(&self, namespace: &Namespace, tag: &IdempotencyTag) -> Option<Response> {
        let record = self.records.get(&(namespace.clone(), tag.key.clone()))?;
        if record.fingerprint != tag.fingerprint {
            return Some(Response::fresh(Err(Rejection::IdempotencyKeyReused(
                "this Idempotency-Key was already used for a different request: use a new key for a new request".to_owned(),
            ))));
        }
        Some(Response {
            outcome: Ok(record.reply.clone()),
            replayed: Some(record.recorded),
        })
    }

    pub(super) fn record(
        &mut self,
        namespace: &Namespace,
        tag: &IdempotencyTag,
        reply: Reply,
        time_ms: u64,
        limits: &Limits,
    ) {
        let record = Record {
            fingerprint: tag.fingerprint,
            reply,
            recorded: Recorded {
                time_ms,
                wall_ms: tag.wall_ms,
            },
        };
        self.records
            .insert((namespace.clone(), tag.key.clone()), record);
        self.order
            .push_back((time_ms, namespace.clone(), tag.key.clone()));
        while self.order.len() > limits.idempotency_keys_max {
            self.pop_oldest();
        }
    }

    /// Drops the records older than `idempotency_ttl_ms` at cluster time `time_ms`.
    pub(super) fn prune(&mut self, time_ms: u64, limits: &Limits) {
        while let Some((recorded_ms, _, _)) = self.order.front() {
            if recorded_ms.saturating_add(limits.idempotency_ttl_ms) > time_ms {
                break;
            }
            self.pop_oldest();
        }
        while self.order.len() > limits.idempotency_keys_max {
            self.pop_oldest();
        }
    }

    pub(super) fn len(&self) -> usize {
        self.records.len()
    }

    pub(super) fn order_len(&self) -> usize {
        self.order.len()
    }

    pub(super) fn is_ordered_by_time(&self) -> bool {
        self.order
            .iter()
            .zip(self.order.iter().skip(1))
            .all(|(a, b)| a.0 <= b.0)
            && self.order.iter().all(|(_, namespace, key)| {
                self.records.contains_key(&(namespace.clone(), key.clone()))
            })
    }

    fn pop_oldest(&mut self) {
        if let Some((_, namespace, key)) = self.order.pop_front() {
            self.records.remove(&(namespace, key));
        }
    }
}
