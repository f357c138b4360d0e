//! The fenced key-value store (G4): JSON values under paths, each write optionally proven by
//! the fence of a live lease and the session that holds it.

use super::command::{EventKind, KvView, Rejection, Reply, ResourceFence};
use super::{KvEntry, Machine, Namespace, ResourcePath};

impl Machine {
    pub(super) fn kv_put(
        &mut self,
        namespace: &Namespace,
        key: &ResourcePath,
        value: &str,
        fence: Option<&ResourceFence>,
    ) -> Result<Reply, Rejection> {
        self.check_fence(namespace, fence)?;
        let keys = self
            .namespaces
            .get(namespace)
            .map_or(0, |state| state.kv.len());
        let exists = self
            .namespaces
            .get(namespace)
            .is_some_and(|state| state.kv.contains_key(key));
        if !exists && keys >= self.limits.kv_keys_per_namespace_max {
            return Err(Rejection::ResourceExhausted(format!(
                "namespace {namespace} already has {keys} keys, the most allowed; delete some first"
            )));
        }
        let fence = fence.map(|claim| (claim.resource.clone(), claim.fence));
        let event = EventKind::KvWritten {
            key: key.clone(),
            fence: fence.as_ref().map(|(_, fence)| *fence),
        };
        let revision = self.record(namespace, event);
        let entry = KvEntry {
            value: value.to_owned(),
            revision,
            fence,
        };
        self.namespaces
            .entry(namespace.clone())
            .or_default()
            .kv
            .insert(key.clone(), entry);
        Ok(Reply::KvWritten { revision })
    }

    pub(super) fn kv_delete(
        &mut self,
        namespace: &Namespace,
        key: &ResourcePath,
        fence: Option<&ResourceFence>,
    ) -> Result<Reply, Rejection> {
        self.check_fence(namespace, fence)?;
        let exists = self
            .namespaces
            .get(namespace)
            .is_some_and(|state| state.kv.contains_key(key));
        if !exists {
            return Err(Rejection::NotFound(format!(
                "no value is stored under {key}"
            )));
        }
        if let Some(state) = self.namespaces.get_mut(namespace) {
            state.kv.remove(key);
        }
        let revision = self.record(namespace, EventKind::KvDeleted { key: key.clone() });
        Ok(Reply::KvDeleted { revision })
    }

    /// The value under `key`, with the revision and fence of the write that stored it.
    pub fn kv_get(&self, namespace: &Namespace, key: &ResourcePath) -> Option<KvView> {
        let entry = self.namespaces.get(namespace)?.kv.get(key)?;
        Some(KvView {
            key: key.clone(),
            value: entry.value.clone(),
            revision: entry.revision,
            fence: entry.fence.clone(),
        })
    }

    /// G4: the claim's token must be the fence of the live lease on its resource (or of one
    /// holder of its shared lease), held by the claim's session, at the current cluster time.
    /// Anything else is `STALE_FENCE`.
    pub(super) fn check_fence(
        &self,
        namespace: &Namespace,
        fence: Option<&ResourceFence>,
    ) -> Result<(), Rejection> {
        let Some(claim) = fence else { return Ok(()) };
        let state = self.namespaces.get(namespace);
        // The lease to judge the claim by: the path's own, or, for a shared lease, the
        // holder with the claimed fence, else the claimant's own hold, else the oldest holder.
        let live = state.and_then(|state| match state.leases.get(&claim.resource) {
            Some(lease) => Some((
                lease.session_id,
                self.live_view(state, &claim.resource, lease)?,
            )),
            None => {
                let holders = self.live_holders(state, &claim.resource);
                let pick = holders
                    .iter()
                    .position(|(_, view)| view.fence == claim.fence)
                    .or_else(|| {
                        holders
                            .iter()
                            .position(|(session_id, _)| *session_id == claim.session_id)
                    })
                    .unwrap_or(0);
                holders.into_iter().nth(pick)
            }
        });
        match live {
            Some((session_id, view)) if view.fence == claim.fence && session_id == claim.session_id => Ok(()),
            Some((_, view)) if view.fence == claim.fence => Err(Rejection::StaleFence {
                message: format!(
                    "fence {} is the live fence of {}, but it belongs to {}'s session, not the one given: the write was refused",
                    claim.fence, claim.resource, view.holder
                ),
                current_fence: Some(view.fence),
            }),
            Some((_, view)) => Err(Rejection::StaleFence {
                message: format!(
                    "fence {} is not the live fence of {} (live fence {}, held by {}): the write was refused",
                    claim.fence, claim.resource, view.fence, view.holder
                ),
                current_fence: Some(view.fence),
            }),
            None => Err(Rejection::StaleFence {
                message: format!(
                    "{} has no live lease, so fence {} is stale: the write was refused",
                    claim.resource, claim.fence
                ),
                current_fence: None,
            }),
        }
    }
}
