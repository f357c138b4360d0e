//! Access control as replicated state: tokens (a name, a role, the namespaces it may use, and
//! only a SHA-256 of its secret), and the token each session was created with.
//!
//! Every replica holds the same table, so a node checks a request's token without a Raft round
//! trip; the machine checks it again when it applies a command made under it
//! (`Command::Authorized`), so a revocation takes effect exactly at the entry that applies it.

use std::collections::BTreeSet;

use imbl::{OrdMap, OrdSet};

use serde::{Deserialize, Serialize};

use super::admission::admit_new_token;
use super::command::{Op, Owner, Rejection, Reply};
use super::types::{Limits, Name, Namespace, SessionId};

/// The name of the admin token made from `BATON_BOOTSTRAP_TOKEN`.
pub const BOOTSTRAP_TOKEN_NAME: &str = "bootstrap";

/// What a token may do, each role including the ones before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Role {
    /// Reads and event streams.
    Reader,
    /// Every lease, key-value and queue operation in its namespaces.
    Agent,
    /// Everything: tokens, limits, membership, every namespace's sessions.
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Reader => "reader",
            Role::Agent => "agent",
            Role::Admin => "admin",
        }
    }
}

/// The namespaces a token may use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Scope {
    /// `["*"]`.
    All,
    Only(BTreeSet<Namespace>),
}

impl Scope {
    pub fn allows(&self, namespace: &Namespace) -> bool {
        match self {
            Scope::All => true,
            Scope::Only(namespaces) => namespaces.contains(namespace),
        }
    }
}

/// Most live sessions and leases a token may hold at once; `None` is no limit of its own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quotas {
    pub sessions_max: Option<u64>,
    pub leases_max: Option<u64>,
}

/// A token to create: the secret itself never reaches the log, only its SHA-256.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewToken {
    pub name: Name,
    pub role: Role,
    pub scope: Scope,
    pub quotas: Quotas,
    pub secret_sha256: [u8; 32],
}

/// A token as the API lists it: never its secret or hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenView {
    pub name: Name,
    pub role: Role,
    pub scope: Scope,
    pub quotas: Quotas,
    pub created_at_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Token {
    role: Role,
    scope: Scope,
    quotas: Quotas,
    secret_sha256: [u8; 32],
    created_at_ms: u64,
}

/// Who a request was made by, once its token is known: what the edge and the machine decide
/// with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub name: Name,
    pub role: Role,
    pub scope: Scope,
}

/// The tokens and session owners. Part of the snapshot from format version 2 on.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthState {
    #[serde(with = "crate::imbl_serde::ord_map")]
    tokens: OrdMap<Name, Token>,
    /// Set when the bootstrap token is first created: it is never created again, even after
    /// it is revoked.
    bootstrapped: bool,
    /// The token each live session was created with (sessions created without one have none).
    #[serde(with = "crate::imbl_serde::ord_map")]
    owners: OrdMap<(Namespace, SessionId), Name>,
    /// Token names by secret hash (rebuilt on decode).
    #[serde(skip)]
    by_hash: OrdMap<[u8; 32], Name>,
    /// The sessions each token owns (rebuilt on decode): what its quotas count.
    #[serde(skip)]
    owned_by: OrdMap<Name, OrdSet<(Namespace, SessionId)>>,
}

impl AuthState {
    pub(super) fn rebuild_index(&mut self) {
        self.by_hash = self
            .tokens
            .iter()
            .map(|(name, token)| (token.secret_sha256, name.clone()))
            .collect();
        self.owned_by.clear();
        for (session, owner) in &self.owners {
            self.owned_by
                .entry(owner.clone())
                .or_default()
                .insert(session.clone());
        }
    }

    /// The sessions `token` owns.
    pub(super) fn sessions_of(
        &self,
        token: &Name,
    ) -> impl Iterator<Item = &(Namespace, SessionId)> {
        self.owned_by.get(token).into_iter().flatten()
    }

    /// `token`'s quotas, if the token exists.
    pub(super) fn quotas(&self, token: &Name) -> Option<Quotas> {
        self.tokens.get(token).map(|token| token.quotas)
    }

    /// The caller a secret's hash belongs to, if any token has it.
    pub fn authenticate(&self, secret_sha256: &[u8; 32]) -> Option<Caller> {
        let name = self.by_hash.get(secret_sha256)?;
        self.caller(name)
    }

    /// The caller named `name`, if that token exists.
    pub fn caller(&self, name: &Name) -> Option<Caller> {
        let token = self.tokens.get(name)?;
        Some(Caller {
            name: name.clone(),
            role: token.role,
            scope: token.scope.clone(),
        })
    }

    /// Every token, by name.
    pub fn tokens(&self) -> Vec<TokenView> {
        self.tokens
            .iter()
            .map(|(name, token)| TokenView {
                name: name.clone(),
                role: token.role,
                scope: token.scope.clone(),
                quotas: token.quotas,
                created_at_ms: token.created_at_ms,
            })
            .collect()
    }

    /// The token a session was created with.
    pub fn owner(&self, namespace: &Namespace, session_id: SessionId) -> Option<&Name> {
        self.owners.get(&(namespace.clone(), session_id))
    }

    /// Every session that has an owner.
    pub(super) fn owned_sessions(&self) -> impl Iterator<Item = &(Namespace, SessionId)> {
        self.owners.keys()
    }

    pub fn is_bootstrapped(&self) -> bool {
        self.bootstrapped
    }

    pub(super) fn create(
        &mut self,
        new_token: &NewToken,
        time_ms: u64,
        limits: &Limits,
    ) -> Result<Reply, Rejection> {
        admit_new_token(new_token, limits)?;
        if self.tokens.contains_key(&new_token.name) {
            return Err(Rejection::invalid(format!(
                "a token named {} exists: revoke it first, or choose another name",
                new_token.name
            )));
        }
        if self.by_hash.contains_key(&new_token.secret_sha256) {
            return Err(Rejection::invalid(
                "another token has this secret: choose another secret",
            ));
        }
        self.tokens.insert(
            new_token.name.clone(),
            Token {
                role: new_token.role,
                scope: new_token.scope.clone(),
                quotas: new_token.quotas,
                secret_sha256: new_token.secret_sha256,
                created_at_ms: time_ms,
            },
        );
        self.by_hash
            .insert(new_token.secret_sha256, new_token.name.clone());
        Ok(Reply::TokenCreated(TokenView {
            name: new_token.name.clone(),
            role: new_token.role,
            scope: new_token.scope.clone(),
            quotas: new_token.quotas,
            created_at_ms: time_ms,
        }))
    }

    /// Creates the bootstrap admin token unless one was ever created.
    pub(super) fn bootstrap(
        &mut self,
        secret_sha256: [u8; 32],
        time_ms: u64,
        limits: &Limits,
    ) -> Result<Reply, Rejection> {
        if self.bootstrapped {
            return Ok(Reply::TokenBootstrapped { created: false });
        }
        self.create(
            &NewToken {
                name: Name::new("token name", BOOTSTRAP_TOKEN_NAME).expect("a valid name"),
                role: Role::Admin,
                scope: Scope::All,
                quotas: Quotas::default(),
                secret_sha256,
            },
            time_ms,
            limits,
        )?;
        self.bootstrapped = true;
        Ok(Reply::TokenBootstrapped { created: true })
    }

    pub(super) fn revoke(&mut self, name: &Name) -> Result<Reply, Rejection> {
        let Some(token) = self.tokens.remove(name) else {
            return Err(Rejection::NotFound(format!("no token named {name}")));
        };
        self.by_hash.remove(&token.secret_sha256);
        Ok(Reply::TokenRevoked { name: name.clone() })
    }

    pub(super) fn set_owner(&mut self, namespace: &Namespace, session_id: SessionId, owner: &Name) {
        let session = (namespace.clone(), session_id);
        self.owners.insert(session.clone(), owner.clone());
        self.owned_by
            .entry(owner.clone())
            .or_default()
            .insert(session);
    }

    pub(super) fn forget_session(&mut self, namespace: &Namespace, session_id: SessionId) {
        let session = (namespace.clone(), session_id);
        let Some(owner) = self.owners.remove(&session) else {
            return;
        };
        if let Some(sessions) = self.owned_by.get_mut(&owner) {
            sessions.remove(&session);
            if sessions.is_empty() {
                self.owned_by.remove(&owner);
            }
        }
    }

    /// Whether `caller` may run `op` in `namespace`: a role that writes, the namespace in its
    /// scope, and (unless an admin) any existing session `op` uses created with this token.
    pub(super) fn authorize(
        &self,
        caller: &Caller,
        namespace: &Namespace,
        op: &Op,
    ) -> Result<(), Rejection> {
        if caller.role < Role::Agent {
            return Err(Rejection::PermissionDenied(format!(
                "token {} has role {}: writes need agent or admin",
                caller.name,
                caller.role.as_str()
            )));
        }
        if !caller.scope.allows(namespace) {
            return Err(Rejection::PermissionDenied(format!(
                "token {} may not use namespace {namespace}",
                caller.name
            )));
        }
        if caller.role == Role::Admin {
            return Ok(());
        }
        match op.session_used() {
            Some(session_id) => match self.owner(namespace, session_id) {
                Some(owner) if *owner != caller.name => Err(Rejection::PermissionDenied(
                    "this session belongs to another token".to_owned(),
                )),
                _ => Ok(()),
            },
            None => Ok(()),
        }
    }
}

impl Op {
    /// The session this operation creates, if it creates one.
    pub fn session_created(&self) -> Option<SessionId> {
        match self {
            Op::CreateSession(new_session)
            | Op::Acquire {
                owner: Owner::NewSession(new_session),
                ..
            }
            | Op::AcquireOrWait {
                owner: Owner::NewSession(new_session),
                ..
            }
            | Op::Claim {
                owner: Owner::NewSession(new_session),
                ..
            } => Some(new_session.session_id),
            _ => None,
        }
    }

    /// The existing session this operation acts with, if any.
    pub fn session_used(&self) -> Option<SessionId> {
        match self {
            Op::Keepalive { session_id }
            | Op::Release { session_id, .. }
            | Op::LeaveOrRelease { session_id, .. }
            | Op::EndSession { session_id } => Some(*session_id),
            Op::Acquire { owner, .. }
            | Op::AcquireOrWait { owner, .. }
            | Op::Claim { owner, .. } => match owner {
                Owner::Session(session_id) => Some(*session_id),
                Owner::NewSession(_) => None,
            },
            Op::KvPut { fence, .. } | Op::KvDelete { fence, .. } => {
                fence.as_ref().map(|fence| fence.session_id)
            }
            Op::Complete { claim, .. } | Op::Fail { claim, .. } | Op::ReleaseTask { claim, .. } => {
                Some(claim.session_id)
            }
            Op::Txn(txn) => txn.session_id,
            Op::CreateSession(_) | Op::Enqueue { .. } => None,
        }
    }
}
