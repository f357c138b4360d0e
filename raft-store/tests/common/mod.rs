//! A generator of random log entries for the lease state machine, shared by `machine_props` and
//! `machine_model`.
//!
//! The universe is deliberately tiny (two namespaces, four session ids, three holders, eight
//! paths) so that commands collide all the time: the same path is acquired by two sessions, a
//! subtree lands on top of an exclusive lease, a fence is presented by the wrong session, an
//! idempotency key is reused with another fingerprint. Stamps mostly rise, sometimes go back,
//! and sometimes jump past every TTL so that leases and sessions expire between entries.
//!
//! The strategy produces `Scenario`s of abstract commands. Fence tokens and "the session that
//! holds this path" are resolved against the machine just before each entry is applied
//! (`Entry::materialize`), so they land near the live fences instead of being random numbers.

#![allow(dead_code)]

use std::collections::BTreeMap;

use baton_raft_store::machine::{
    Batch, Command, FenceClaim, IdempotencyTag, Labels, LeaseMode, Limits, Machine, Namespace,
    NewSession, Op, Owner, ResourcePath, SessionId,
};
use proptest::prelude::*;

/// The namespaces of the universe.
pub const NAMESPACES: [&str; 2] = ["ns-a", "ns-b"];
/// The largest session id a scenario creates (ids are handed out in order, see
/// `Scenario::resolve_sessions`).
pub const SESSION_IDS_MAX: u128 = 256;
/// The valid paths of the universe: nested, with `a/bc` and `ab` next to `a/b` and `a` so that
/// string prefixes that are not path prefixes are exercised.
pub const PATHS: [&str; 8] = ["a", "a/b", "a/bc", "a/b/c", "a/b/c/d", "ab", "x", "x/y"];
/// A path over the tight limits' segment count (valid under the default limits).
pub const DEEP_PATH: &str = "a/b/c/d/e";
/// Paths the machine must refuse (built around `ResourcePath::parse`, see `unchecked_path`).
pub const INVALID_PATHS: [&str; 4] = ["", "a//b", "/a", "x/"];
/// Idempotency keys: three valid ones, one too short, one with a space (not printable ASCII).
pub const IDEMPOTENCY_KEYS: [&str; 5] = [
    "idem-key-0000000001",
    "idem-key-0000000002",
    "idem-key-0000000003",
    "short-key",
    "idem key with spaces",
];
/// Fingerprints; bytes 0xFD/0xFE are avoided so encodings stay clear of bincode's wide-length
/// markers (see `machine_props::decode_survives_*`).
pub const FINGERPRINTS: [[u8; 32]; 2] = [[0x11; 32], [0x22; 32]];

/// The default limits, or tight ones under which the quotas (`RESOURCE_EXHAUSTED`), the value
/// size, the segment count and the idempotency and event windows are reached within a few
/// commands.
pub fn limits_for(tight: bool) -> Limits {
    if !tight {
        return Limits::default();
    }
    Limits {
        path_segments_max: 4,
        holder_chars_max: 8,
        labels_max: 2,
        leases_per_session_max: 3,
        sessions_per_namespace_max: 3,
        kv_keys_per_namespace_max: 3,
        kv_value_bytes_max: 16,
        idempotency_ttl_ms: 10_000,
        idempotency_keys_max: 3,
        events_kept_max: 20,
        sweep_batch_max: 2,
        ..Limits::default()
    }
}

pub fn namespace(index: usize) -> Namespace {
    Namespace::parse(NAMESPACES[index], &Limits::default()).expect("a valid namespace")
}

pub fn path(text: &str) -> ResourcePath {
    ResourcePath::parse(text, &Limits::default()).expect("a valid path")
}

/// A `ResourcePath` holding any text, even one `parse` refuses: the log format carries paths as
/// strings, so the machine must re-validate them, and this is how a test hands it a bad one.
pub fn unchecked_path(text: &str) -> ResourcePath {
    let bytes =
        bincode::serde::encode_to_vec(text, bincode::config::standard()).expect("a string encodes");
    let (resource, _) =
        bincode::serde::decode_from_slice::<ResourcePath, _>(&bytes, bincode::config::standard())
            .expect("a newtype over a string decodes from a string");
    resource
}

/// Every path a scenario may name, valid and invalid.
pub fn all_paths() -> Vec<ResourcePath> {
    PATHS
        .iter()
        .chain([&DEEP_PATH])
        .map(|text| path(text))
        .collect()
}

#[derive(Debug, Clone)]
pub struct Scenario {
    pub tight: bool,
    pub entries: Vec<Entry>,
}

impl Scenario {
    pub fn limits(&self) -> Limits {
        limits_for(self.tight)
    }
}

#[derive(Debug, Clone)]
pub struct Entry {
    pub stamp_ms: u64,
    pub commands: Vec<AbstractCommand>,
}

#[derive(Debug, Clone)]
pub enum AbstractCommand {
    Namespaced {
        namespace: usize,
        tag: Option<(usize, usize)>,
        op: AbstractOp,
    },
    Sweep {
        max: u32,
    },
}

#[derive(Debug, Clone)]
pub enum AbstractOp {
    CreateSession(NewSession),
    Keepalive(SessionId),
    Release(SessionId, ReleaseChoice),
    EndSession(SessionId),
    Acquire {
        resource: ResourcePath,
        mode: LeaseMode,
        owner: Owner,
        max_hold_ms: Option<u64>,
        labels: Labels,
    },
    KvPut {
        key: ResourcePath,
        value: String,
        fence: Option<AbstractFence>,
    },
    KvDelete {
        key: ResourcePath,
        fence: Option<AbstractFence>,
    },
}

/// A fence claim, resolved against the machine's state right before the entry is applied.
#[derive(Debug, Clone)]
pub struct AbstractFence {
    pub resource: ResourcePath,
    pub token: TokenChoice,
    pub session: SessionChoice,
}

/// What a release names: a path the session holds (the `n`th, modulo their number, resolved
/// just before the entry), or any path.
#[derive(Debug, Clone)]
pub enum ReleaseChoice {
    Held(usize),
    Path(ResourcePath),
}

#[derive(Debug, Clone, Copy)]
pub enum TokenChoice {
    /// The live fence of the claimed resource (or the counter when there is none).
    Live,
    /// `fence_counter + offset`, clamped at 0: old tokens, and the next grants of this entry.
    CounterPlus(i64),
}

#[derive(Debug, Clone, Copy)]
pub enum SessionChoice {
    /// The session that holds the claimed resource, if one of the universe's ids does.
    Holder,
    Id(SessionId),
}

impl Entry {
    /// The concrete batch for `machine`'s current state.
    pub fn materialize(&self, machine: &Machine) -> Batch {
        let commands = self
            .commands
            .iter()
            .map(|command| command.materialize(machine))
            .collect();
        Batch {
            stamp_ms: self.stamp_ms,
            commands,
        }
    }
}

impl AbstractCommand {
    fn materialize(&self, machine: &Machine) -> Command {
        match self {
            AbstractCommand::Sweep { max } => Command::Sweep { max: *max },
            AbstractCommand::Namespaced {
                namespace: index,
                tag,
                op,
            } => {
                let namespace = namespace(*index);
                let idempotency = tag.map(|(key, fingerprint)| IdempotencyTag {
                    key: IDEMPOTENCY_KEYS[key].to_owned(),
                    fingerprint: FINGERPRINTS[fingerprint],
                    wall_ms: 0,
                });
                let op = match op {
                    AbstractOp::CreateSession(new_session) => {
                        Op::CreateSession(new_session.clone())
                    }
                    AbstractOp::Keepalive(session_id) => Op::Keepalive {
                        session_id: *session_id,
                    },
                    AbstractOp::Release(session_id, choice) => {
                        let resource = match choice {
                            ReleaseChoice::Path(resource) => resource.clone(),
                            ReleaseChoice::Held(index) => {
                                match machine.session(&namespace, *session_id) {
                                    Some((_, leases)) if !leases.is_empty() => {
                                        leases[index % leases.len()].resource.clone()
                                    }
                                    _ => path(PATHS[index % PATHS.len()]),
                                }
                            }
                        };
                        Op::Release {
                            session_id: *session_id,
                            resource,
                        }
                    }
                    AbstractOp::EndSession(session_id) => Op::EndSession {
                        session_id: *session_id,
                    },
                    AbstractOp::Acquire {
                        resource,
                        mode,
                        owner,
                        max_hold_ms,
                        labels,
                    } => Op::Acquire {
                        resource: resource.clone(),
                        mode: *mode,
                        owner: owner.clone(),
                        max_hold_ms: *max_hold_ms,
                        labels: labels.clone(),
                    },
                    AbstractOp::KvPut { key, value, fence } => Op::KvPut {
                        key: key.clone(),
                        value: value.clone(),
                        fence: fence
                            .as_ref()
                            .map(|fence| fence.materialize(machine, &namespace)),
                    },
                    AbstractOp::KvDelete { key, fence } => Op::KvDelete {
                        key: key.clone(),
                        fence: fence
                            .as_ref()
                            .map(|fence| fence.materialize(machine, &namespace)),
                    },
                };
                Command::Namespaced {
                    namespace,
                    idempotency,
                    op,
                }
            }
        }
    }
}

impl AbstractFence {
    fn materialize(&self, machine: &Machine, namespace: &Namespace) -> FenceClaim {
        let counter = machine.fence_counter();
        let live = machine
            .lease(namespace, &self.resource)
            .map(|lease| lease.fence);
        let token = match self.token {
            TokenChoice::Live => live.unwrap_or(counter),
            TokenChoice::CounterPlus(offset) => counter.saturating_add_signed(offset),
        };
        let session_id = match self.session {
            SessionChoice::Id(session_id) => session_id,
            SessionChoice::Holder => (1..=SESSION_IDS_MAX)
                .map(SessionId)
                .find(|session_id| {
                    machine
                        .session(namespace, *session_id)
                        .is_some_and(|(_, leases)| {
                            leases.iter().any(|lease| lease.resource == self.resource)
                        })
                })
                .unwrap_or(SessionId(1)),
        };
        FenceClaim {
            resource: self.resource.clone(),
            token,
            session_id,
        }
    }
}

// ---- strategies ----

/// A session reference, as generated: `SessionId(1..=4)` is the 1st..4th most recently
/// created session, `SessionId(5)` the first session of the scenario, `SessionId(6)` one that
/// does not exist yet. `Scenario::resolve_sessions` turns them into real ids.
fn session_id() -> impl Strategy<Value = SessionId> {
    prop_oneof![8 => (1u128..=4).prop_map(SessionId), 1 => Just(SessionId(5)), 1 => Just(SessionId(6))]
}

/// A new session's id, as generated: `SessionId(0)` is a fresh id, anything else refers to an
/// existing session like `session_id()` (an id already in use).
fn new_session_id() -> impl Strategy<Value = SessionId> {
    prop_oneof![12 => Just(SessionId(0)), 1 => session_id()]
}

fn resource() -> impl Strategy<Value = ResourcePath> {
    prop_oneof![
        60 => proptest::sample::select(PATHS.to_vec()).prop_map(path),
        1 => Just(path(DEEP_PATH)),
        1 => proptest::sample::select(INVALID_PATHS.to_vec()).prop_map(unchecked_path),
    ]
}

fn holder() -> impl Strategy<Value = String> {
    prop_oneof![
        60 => proptest::sample::select(vec!["a", "b", "c"]).prop_map(str::to_owned),
        1 => Just(String::new()),
        1 => Just("abcdefghij".to_owned()),
        1 => Just("h".repeat(129)),
    ]
}

fn ttl_ms() -> impl Strategy<Value = u64> {
    prop_oneof![
        40 => proptest::sample::select(vec![1_000u64, 2_000, 5_000]),
        1 => proptest::sample::select(vec![0u64, 999, 3_600_001, u64::MAX]),
    ]
}

fn max_hold_ms() -> impl Strategy<Value = Option<u64>> {
    prop_oneof![
        24 => Just(None),
        8 => proptest::sample::select(vec![1_500u64, 3_000]).prop_map(Some),
        1 => proptest::sample::select(vec![0u64, 86_400_001, u64::MAX]).prop_map(Some),
    ]
}

fn labels() -> impl Strategy<Value = Labels> {
    let one = |key: &str, value: &str| Labels::from([(key.to_owned(), value.to_owned())]);
    let many = |count: usize| {
        (0..count)
            .map(|index| (format!("k{index:02}"), "v".to_owned()))
            .collect::<Labels>()
    };
    prop_oneof![
        40 => Just(Labels::new()),
        8 => Just(one("team", "x")),
        1 => Just(many(3)),
        1 => Just(many(17)),
        1 => Just(one("k", "")),
    ]
}

fn new_session() -> impl Strategy<Value = NewSession> {
    (new_session_id(), holder(), ttl_ms(), labels()).prop_map(
        |(session_id, holder, ttl_ms, labels)| NewSession {
            session_id,
            holder,
            ttl_ms,
            labels,
        },
    )
}

fn owner() -> impl Strategy<Value = Owner> {
    prop_oneof![
        3 => session_id().prop_map(Owner::Session),
        2 => new_session().prop_map(Owner::NewSession),
    ]
}

fn mode() -> impl Strategy<Value = LeaseMode> {
    prop_oneof![3 => Just(LeaseMode::Exclusive), 2 => Just(LeaseMode::Subtree)]
}

fn fence() -> impl Strategy<Value = Option<AbstractFence>> {
    let token = prop_oneof![
        3 => Just(TokenChoice::Live),
        3 => (-3i64..=2).prop_map(TokenChoice::CounterPlus),
    ];
    let session = prop_oneof![
        3 => Just(SessionChoice::Holder),
        2 => session_id().prop_map(SessionChoice::Id),
    ];
    prop_oneof![
        2 => Just(None),
        3 => (resource(), token, session)
            .prop_map(|(resource, token, session)| Some(AbstractFence { resource, token, session })),
    ]
}

fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => proptest::sample::select(vec!["1", "\"v\"", "{}"]).prop_map(str::to_owned),
        1 => Just("\"this value is too long\"".to_owned()),
    ]
}

fn release_choice() -> impl Strategy<Value = ReleaseChoice> {
    prop_oneof![3 => (0usize..8).prop_map(ReleaseChoice::Held), 1 => resource().prop_map(ReleaseChoice::Path)]
}

fn op() -> impl Strategy<Value = AbstractOp> {
    prop_oneof![
        3 => new_session().prop_map(AbstractOp::CreateSession),
        4 => session_id().prop_map(AbstractOp::Keepalive),
        4 => (session_id(), release_choice()).prop_map(|(session_id, choice)| AbstractOp::Release(session_id, choice)),
        1 => session_id().prop_map(AbstractOp::EndSession),
        10 => (resource(), mode(), owner(), max_hold_ms(), labels()).prop_map(
            |(resource, mode, owner, max_hold_ms, labels)| AbstractOp::Acquire { resource, mode, owner, max_hold_ms, labels }
        ),
        3 => (resource(), value(), fence()).prop_map(|(key, value, fence)| AbstractOp::KvPut { key, value, fence }),
        2 => (resource(), fence()).prop_map(|(key, fence)| AbstractOp::KvDelete { key, fence }),
    ]
}

fn idempotency_key() -> impl Strategy<Value = usize> {
    prop_oneof![12 => 0usize..3, 1 => 3usize..IDEMPOTENCY_KEYS.len()]
}

fn tag() -> impl Strategy<Value = Option<(usize, usize)>> {
    prop_oneof![
        6 => Just(None),
        1 => (idempotency_key(), 0..FINGERPRINTS.len()).prop_map(Some),
    ]
}

fn command() -> impl Strategy<Value = AbstractCommand> {
    prop_oneof![
        12 => (0..NAMESPACES.len(), tag(), op())
            .prop_map(|(namespace, tag, op)| AbstractCommand::Namespaced { namespace, tag, op }),
        1 => (0u32..4).prop_map(|max| AbstractCommand::Sweep { max }),
    ]
}

/// How the stamp moves between entries: a step forward, a step back (a stale stamp that must
/// not move time), a jump past the TTLs, or a jump past the idempotency window.
fn stamp_step() -> impl Strategy<Value = i64> {
    prop_oneof![
        40 => 0i64..400,
        8 => -3_000i64..0,
        6 => 1_000i64..7_000,
        1 => Just(90_000_000i64),
    ]
}

pub fn scenario(entries_max: usize) -> impl Strategy<Value = Scenario> {
    let entry = (stamp_step(), proptest::collection::vec(command(), 1..=8));
    (
        proptest::bool::weighted(0.35),
        proptest::collection::vec(entry, 1..=entries_max),
    )
        .prop_map(|(tight, steps)| {
            let mut stamp_ms: u64 = 1_000;
            let entries = steps
                .into_iter()
                .map(|(step, commands)| {
                    stamp_ms = stamp_ms.saturating_add_signed(step);
                    Entry { stamp_ms, commands }
                })
                .collect();
            let mut scenario = Scenario { tight, entries };
            scenario.resolve_sessions();
            scenario
        })
}

impl Scenario {
    /// Turns the generated session references into ids: new sessions get ids 1, 2, 3... in
    /// scenario order (whether or not their creation succeeds), references pick recent ones.
    fn resolve_sessions(&mut self) {
        /// The id a generated reference stands for, and whether it names a created session.
        fn reference(created: u128, generated: SessionId) -> (SessionId, bool) {
            match generated.0 {
                recent @ 1..=4 if created > 0 => {
                    (SessionId(created.saturating_sub(recent - 1).max(1)), true)
                }
                5 => (SessionId(1), false),
                _ => (SessionId((created + 1).min(SESSION_IDS_MAX)), false),
            }
        }
        let mut created: u128 = 0;
        // The namespace each created id was made in, so that references follow their session.
        let mut namespaces: BTreeMap<SessionId, usize> = BTreeMap::new();
        for entry in &mut self.entries {
            for command in &mut entry.commands {
                let AbstractCommand::Namespaced { namespace, op, .. } = command else {
                    continue;
                };
                let follow = |namespace: &mut usize, session_id: &mut SessionId| {
                    let (resolved, existing) = reference(created, *session_id);
                    *session_id = resolved;
                    if let (true, Some(home)) = (existing, namespaces.get(&resolved)) {
                        *namespace = *home;
                    }
                };
                match op {
                    AbstractOp::CreateSession(session)
                    | AbstractOp::Acquire {
                        owner: Owner::NewSession(session),
                        ..
                    } => {
                        if session.session_id.0 == 0 {
                            created = (created + 1).min(SESSION_IDS_MAX);
                            session.session_id = SessionId(created);
                            namespaces.insert(session.session_id, *namespace);
                        } else {
                            follow(namespace, &mut session.session_id);
                        }
                    }
                    AbstractOp::Acquire {
                        owner: Owner::Session(session_id),
                        ..
                    }
                    | AbstractOp::Keepalive(session_id)
                    | AbstractOp::Release(session_id, _)
                    | AbstractOp::EndSession(session_id) => follow(namespace, session_id),
                    AbstractOp::KvPut { fence, .. } | AbstractOp::KvDelete { fence, .. } => {
                        if let Some(AbstractFence {
                            session: SessionChoice::Id(session_id),
                            ..
                        }) = fence
                        {
                            *session_id = reference(created, *session_id).0;
                        }
                    }
                }
            }
        }
    }
}

/// The number of proptest cases: `PROPTEST_CASES` if set, else `default`.
pub fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(default)
}

/// Paths keyed by namespace, for walking every `(namespace, path)` pair of the universe.
pub fn universe() -> BTreeMap<Namespace, Vec<ResourcePath>> {
    (0..NAMESPACES.len())
        .map(|index| (namespace(index), all_paths()))
        .collect()
}
