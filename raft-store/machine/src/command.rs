//! What goes into the log and what comes out of applying it: `Batch` (a stamp and many
//! commands), `Command`, `Response`, `Reply`, `Rejection`, and the read-side views.
//!
//! These are log types, a durability contract: changing a variant's shape changes the on-disk
//! format. They are deliberately distinct from the HTTP wire types in `baton-client`.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::auth::{NewToken, TokenView};
use super::legacy::CommandV1;
use super::types::{Invalid, Labels, LeaseMode, Limits, Name, Namespace, ResourcePath, SessionId};

/// One log entry's payload: the leader's cluster-time stamp and the commands it groups.
///
/// Serialized as a versioned enum (`V1`), so an entry written by a future format is refused
/// rather than misread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    pub stamp_ms: u64,
    pub commands: Vec<Command>,
}

/// How a log line names an entry's batch: its stamp and how many commands it carries (never
/// the commands, which hold session ids).
impl fmt::Display for Batch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "batch(stamp {} ms, {} commands)",
            self.stamp_ms,
            self.commands.len()
        )
    }
}

impl Batch {
    /// An entry with no commands: it only advances cluster time (the leader's idle tick).
    pub fn tick(stamp_ms: u64) -> Batch {
        Batch {
            stamp_ms,
            commands: Vec::new(),
        }
    }
}

/// `V1` entries were written before tasks had `on_dead` and the limits had
/// `task_retention_ms` and `txn_ops_max`; they are still read (legacy.rs).
#[derive(Serialize)]
enum VersionedBatchRef<'a> {
    #[allow(dead_code)]
    V1,
    V2 {
        stamp_ms: u64,
        commands: &'a [Command],
    },
}

#[derive(Deserialize)]
enum VersionedBatch {
    V1 {
        stamp_ms: u64,
        commands: Vec<CommandV1>,
    },
    V2 {
        stamp_ms: u64,
        commands: Vec<Command>,
    },
}

impl Serialize for Batch {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        VersionedBatchRef::V2 {
            stamp_ms: self.stamp_ms,
            commands: &self.commands,
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Batch {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match VersionedBatch::deserialize(deserializer)? {
            VersionedBatch::V1 { stamp_ms, commands } => Ok(Batch {
                stamp_ms,
                commands: commands.into_iter().map(Command::from).collect(),
            }),
            VersionedBatch::V2 { stamp_ms, commands } => Ok(Batch { stamp_ms, commands }),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// A client operation inside one namespace, optionally made idempotent (G8).
    Namespaced {
        namespace: Namespace,
        idempotency: Option<IdempotencyTag>,
        op: Op,
    },
    /// Removes at most `max` dead things: expired sessions and their leases, max-held leases,
    /// then done and dead tasks past their retention.
    Sweep { max: u32 },
    /// Replaces the limits every replica decides with.
    SetLimits(Limits),
    /// Adds a token (admin; or anyone while access control is off).
    CreateToken(NewToken),
    /// Removes a token: from this entry on, no request made with it is applied.
    RevokeToken { name: Name },
    /// Creates the `bootstrap` admin token from `BATON_BOOTSTRAP_TOKEN`, once in the cluster's
    /// life: any node started with it proposes this, and only the first one applied counts.
    BootstrapToken { secret_sha256: [u8; 32] },
    /// `command` made with token `token`: the machine checks the token still exists and may
    /// do it (role, namespace, the session's owner) before applying it.
    Authorized { token: Name, command: Box<Command> },
}

impl Command {
    /// Whether applying this may take a token away or change what it may do (a revocation,
    /// new limits): the node then checks again what it serves under a token, such as open
    /// event streams.
    pub fn changes_access(&self) -> bool {
        match self {
            Command::RevokeToken { .. } | Command::SetLimits(_) => true,
            Command::Authorized { command, .. } => command.changes_access(),
            Command::Namespaced { .. }
            | Command::Sweep { .. }
            | Command::CreateToken(_)
            | Command::BootstrapToken { .. } => false,
        }
    }
}

/// The `Idempotency-Key` of a request and a hash of everything that identifies the request
/// (namespace, method, route, path parameters, body), computed at the edge.
///
/// `wall_ms` is the accepting node's wall clock (Unix milliseconds) when the request arrived.
/// It decides nothing: it is recorded so that the informational `*_at` times of the first
/// answer and of every replay render identically, on any node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdempotencyTag {
    pub key: String,
    pub fingerprint: [u8; 32],
    pub wall_ms: i64,
}

/// When a recorded answer was first given: the cluster time it was decided at and the wall
/// clock of its `IdempotencyTag`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recorded {
    pub time_ms: u64,
    pub wall_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewSession {
    /// Chosen at random by the leader and carried in the log, so every replica agrees.
    pub session_id: SessionId,
    pub holder: String,
    pub ttl_ms: u64,
    pub labels: Labels,
}

/// Who an acquire is for: an existing session, or one created in the same write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Owner {
    Session(SessionId),
    NewSession(NewSession),
}

/// The proof a fenced write carries: the fence of a lease and the session that holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceFence {
    pub resource: ResourcePath,
    pub fence: u64,
    pub session_id: SessionId,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    CreateSession(NewSession),
    Keepalive {
        session_id: SessionId,
    },
    Release {
        session_id: SessionId,
        resource: ResourcePath,
    },
    EndSession {
        session_id: SessionId,
    },
    Acquire {
        resource: ResourcePath,
        mode: LeaseMode,
        owner: Owner,
        max_hold_ms: Option<u64>,
        labels: Labels,
    },
    /// `value` is JSON text, validated at the edge; the machine stores it as given.
    KvPut {
        key: ResourcePath,
        value: String,
        fence: Option<ResourceFence>,
    },
    KvDelete {
        key: ResourcePath,
        fence: Option<ResourceFence>,
    },
    Enqueue {
        queue: Name,
        task: TaskSpec,
    },
    /// Claim-next: the best ready task of the queue, claimed with a fence in one write.
    Claim {
        queue: Name,
        owner: Owner,
    },
    Complete {
        queue: Name,
        task_id: Name,
        claim: TaskFence,
        result: Option<String>,
    },
    Fail {
        queue: Name,
        task_id: Name,
        claim: TaskFence,
        reason: String,
        retry: bool,
    },
    /// Gives a claim back without counting the attempt; the note stays on the task.
    ReleaseTask {
        queue: Name,
        task_id: Name,
        claim: TaskFence,
        note: Option<String>,
    },
    /// Compares, then the `success` or the `failure` ops: all applied, or none.
    Txn(Txn),
    // The line's operations come last, so that entries written before them decode unchanged.
    /// `Acquire`, but one the resource's holders refuse joins its line instead (line.rs).
    AcquireOrWait {
        resource: ResourcePath,
        mode: LeaseMode,
        owner: Owner,
        max_hold_ms: Option<u64>,
        labels: Labels,
    },
    /// Leaves the line of `resource` if the session waits in it, else releases its lease.
    LeaveOrRelease {
        session_id: SessionId,
        resource: ResourcePath,
    },
}

/// A new task. `task_id` is given by the client or generated by the leader and carried here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskSpec {
    pub task_id: Name,
    /// JSON text, validated at the edge.
    pub payload: String,
    pub priority: i32,
    pub depends_on: Vec<Name>,
    pub max_attempts: u32,
    pub delay_ms: u64,
    /// The compensating task enqueued in the same apply that makes this one dead.
    pub on_dead: Option<Compensation>,
}

/// A task to enqueue when another goes dead: a saga step's undo.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compensation {
    pub queue: Name,
    /// JSON text, validated at the edge.
    pub payload: String,
    pub max_attempts: u32,
}

/// A transaction: if every compare holds, the `success` ops run, else the `failure` ops; an
/// op that would be refused refuses the whole transaction and nothing changes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Txn {
    /// The session that fence compares and fenced ops act for.
    pub session_id: Option<SessionId>,
    pub compare: Vec<Compare>,
    pub success: Vec<TxnOp>,
    pub failure: Vec<TxnOp>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Compare {
    /// Holds when `fence` is the live fence of `resource`, held by the transaction's session.
    Fence { resource: ResourcePath, fence: u64 },
    /// Holds when `key`'s revision is `revision` (0: the key is absent).
    KvRevision { key: ResourcePath, revision: u64 },
}

/// One operation of a transaction. Fenced ones act with the transaction's session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TxnOp {
    Put {
        key: ResourcePath,
        value: String,
    },
    Delete {
        key: ResourcePath,
    },
    Release {
        resource: ResourcePath,
    },
    AddTask {
        queue: Name,
        task: TaskSpec,
    },
    CompleteTask {
        queue: Name,
        task_id: Name,
        fence: u64,
        result: Option<String>,
    },
    FailTask {
        queue: Name,
        task_id: Name,
        fence: u64,
        reason: String,
        retry: bool,
    },
}

/// The proof a task operation carries: the claim's fence and the session that holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskFence {
    pub session_id: SessionId,
    pub fence: u64,
}

/// The result of one command. `replayed` is set when an idempotent retry returned the answer
/// recorded by the first attempt instead of applying again, and says when that was.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Response {
    pub outcome: Result<Reply, Rejection>,
    pub replayed: Option<Recorded>,
}

impl Response {
    pub fn fresh(outcome: Result<Reply, Rejection>) -> Response {
        Response {
            outcome,
            replayed: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    SessionCreated(SessionView),
    KeptAlive {
        session_id: SessionId,
        expires_in_ms: u64,
    },
    Released {
        resource: ResourcePath,
        fence: u64,
    },
    SessionEnded {
        released: Vec<ResourcePath>,
    },
    Granted(Grant),
    KvWritten {
        revision: u64,
    },
    KvDeleted {
        revision: u64,
    },
    Swept {
        leases: u64,
        sessions: u64,
        tasks: u64,
    },
    LimitsSet,
    TaskEnqueued(TaskView),
    TaskClaimed(TaskClaimed),
    /// Claim-next found no ready task. Nothing changed, so it is never recorded for replay.
    QueueEmpty,
    /// The task after a complete, fail or release.
    TaskUpdated(TaskView),
    TokenCreated(TokenView),
    TokenRevoked {
        name: Name,
    },
    /// Whether this entry created the bootstrap token (only the first one does).
    TokenBootstrapped {
        created: bool,
    },
    /// A transaction applied: whether its compares held, and one reply per op run.
    TxnDone {
        succeeded: bool,
        results: Vec<Reply>,
    },
    /// The acquire waits in the resource's line.
    Queued(Queued),
    LeftLine {
        resource: ResourcePath,
    },
    /// A waiting acquire whose session was granted the lease from the line since it asked:
    /// that grant, as it stands now. Nothing changed.
    StillGranted(Grant),
}

impl Reply {
    /// Whether the command that produced this reply changed the state (G8 records only those).
    pub fn changed_state(&self) -> bool {
        !matches!(
            self,
            Reply::QueueEmpty
                | Reply::Queued(Queued { joined: false, .. })
                | Reply::StillGranted(_)
        )
    }
}

/// An acquire waiting in line: its place (1 = next), and whether this command put it there
/// (else it was already waiting).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Queued {
    pub resource: ResourcePath,
    pub session_id: SessionId,
    pub session_created: bool,
    pub position: u32,
    pub joined: bool,
}

/// A successful claim: the task, the claim's fence and attempt, and the claiming session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskClaimed {
    pub task: TaskView,
    pub fence: u64,
    pub attempt: u32,
    pub session_id: SessionId,
    pub session_created: bool,
    pub expires_in_ms: u64,
}

/// Where a task is in its life. `Ready`: claim-next could take it now; `Waiting`: unclaimed
/// but held back by a dependency that is not done or a delay that has not passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum TaskState {
    Ready,
    Claimed,
    Done,
    Dead,
    // Last, so that replies recorded before it existed decode unchanged.
    Waiting,
}

/// A task as readers see it (never the claimer's session id).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskView {
    pub queue: Name,
    pub id: Name,
    pub payload: String,
    pub priority: i32,
    pub depends_on: Vec<Name>,
    pub state: TaskState,
    pub attempt: u32,
    pub max_attempts: u32,
    /// Cluster time at which the task becomes claimable (its enqueue time plus its delay).
    pub ready_at_ms: u64,
    /// Dependencies not done yet.
    pub waiting_on: u32,
    pub note: Option<String>,
    pub result: Option<String>,
    pub reason: Option<String>,
    /// The live claim's fence and holder, while claimed.
    pub claim: Option<(u64, String)>,
    pub enqueued_revision: u64,
    /// The compensation enqueued when the task goes dead.
    pub on_dead: Option<Compensation>,
}

/// Per-state task counts of one queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskCounts {
    pub ready: u64,
    pub waiting: u64,
    pub claimed: u64,
    pub done: u64,
    pub dead: u64,
}

/// A successful acquire: the lease, the session that holds it, and whether that session was
/// created by this write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    pub lease: LeaseView,
    pub session_id: SessionId,
    pub session_created: bool,
}

/// A lease as readers see it: public, so never the session id. Times are cluster time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseView {
    pub resource: ResourcePath,
    pub fence: u64,
    pub holder: String,
    pub mode: LeaseMode,
    pub labels: Labels,
    pub acquired_at_ms: u64,
    /// The max hold asked for at acquire, if any.
    pub max_hold_ms: Option<u64>,
    pub expires_in_ms: u64,
}

/// A session as its bearer sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionView {
    pub session_id: SessionId,
    pub holder: String,
    pub ttl_ms: u64,
    pub labels: Labels,
    pub expires_in_ms: u64,
}

/// A refused command. A refusal changes nothing in the state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Rejection {
    InvalidArgument(String),
    NotFound(String),
    /// `held_by` is the lease in the way; for a shared lease, `holders` lists up to ten of
    /// its live holders and `holders_total` counts them (empty and 0 otherwise).
    LeaseHeld {
        message: String,
        held_by: Box<LeaseView>,
        holders: Vec<LeaseView>,
        holders_total: u32,
    },
    LeaseLost(String),
    StaleFence {
        message: String,
        current_fence: Option<u64>,
    },
    PayloadTooLarge(String),
    IdempotencyKeyReused(String),
    ResourceExhausted(String),
    /// The request's token no longer exists (revoked after the node checked it).
    Unauthenticated(String),
    /// The token's role, namespaces or session ownership do not allow the command.
    PermissionDenied(String),
}

impl From<Invalid> for Rejection {
    fn from(invalid: Invalid) -> Rejection {
        Rejection::InvalidArgument(invalid.0)
    }
}

impl Rejection {
    pub fn invalid(message: impl Into<String>) -> Rejection {
        Rejection::InvalidArgument(message.into())
    }

    /// The stable code of docs/api.md for this refusal.
    pub fn code(&self) -> &'static str {
        match self {
            Rejection::InvalidArgument(_) => "INVALID_ARGUMENT",
            Rejection::NotFound(_) => "NOT_FOUND",
            Rejection::LeaseHeld { .. } => "LEASE_HELD",
            Rejection::LeaseLost(_) => "LEASE_LOST",
            Rejection::StaleFence { .. } => "STALE_FENCE",
            Rejection::PayloadTooLarge(_) => "PAYLOAD_TOO_LARGE",
            Rejection::IdempotencyKeyReused(_) => "IDEMPOTENCY_KEY_REUSED",
            Rejection::ResourceExhausted(_) => "RESOURCE_EXHAUSTED",
            Rejection::Unauthenticated(_) => "UNAUTHENTICATED",
            Rejection::PermissionDenied(_) => "PERMISSION_DENIED",
        }
    }

    pub fn message(&self) -> &str {
        match self {
            Rejection::InvalidArgument(message)
            | Rejection::NotFound(message)
            | Rejection::LeaseLost(message)
            | Rejection::PayloadTooLarge(message)
            | Rejection::IdempotencyKeyReused(message)
            | Rejection::ResourceExhausted(message)
            | Rejection::Unauthenticated(message)
            | Rejection::PermissionDenied(message)
            | Rejection::LeaseHeld { message, .. }
            | Rejection::StaleFence { message, .. } => message,
        }
    }
}

/// One state change, numbered by the machine's rising revision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub revision: u64,
    pub time_ms: u64,
    pub namespace: Namespace,
    pub kind: EventKind,
    /// The token whose request made the change, with access control on; `None` for changes
    /// nobody asked for (expiry) and when access control is off.
    pub by: Option<Name>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventKind {
    Granted {
        resource: ResourcePath,
        holder: String,
        fence: u64,
        mode: LeaseMode,
    },
    Released {
        resource: ResourcePath,
        fence: u64,
    },
    Expired {
        resource: ResourcePath,
        fence: u64,
    },
    KvWritten {
        key: ResourcePath,
        fence: Option<u64>,
    },
    KvDeleted {
        key: ResourcePath,
    },
    TaskEnqueued {
        queue: Name,
        task_id: Name,
    },
    TaskClaimed {
        queue: Name,
        task_id: Name,
        fence: u64,
        attempt: u32,
    },
    TaskCompleted {
        queue: Name,
        task_id: Name,
        fence: u64,
    },
    /// A claim failed by its holder; `retry` tells whether the task went back to ready.
    TaskFailed {
        queue: Name,
        task_id: Name,
        fence: u64,
        retry: bool,
    },
    TaskReleased {
        queue: Name,
        task_id: Name,
        fence: u64,
    },
    /// A claim lapsed with its session (expired or ended).
    TaskExpired {
        queue: Name,
        task_id: Name,
        fence: u64,
    },
    TaskDead {
        queue: Name,
        task_id: Name,
    },
    // Last, so that events recorded before them decode unchanged.
    /// An acquire joined the resource's line.
    Queued {
        resource: ResourcePath,
        holder: String,
        mode: LeaseMode,
    },
    /// A waiter left the line without a grant: it asked to, or its session ended or died.
    LeftLine {
        resource: ResourcePath,
        holder: String,
    },
}

/// A stored value with the revision and fence of the write that produced it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvView {
    pub key: ResourcePath,
    pub value: String,
    pub revision: u64,
    pub fence: Option<(ResourcePath, u64)>,
}

/// The answer to a fence check: whether `fence` is the live fence of the resource, and the
/// live fence if there is one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FenceStatus {
    pub current: bool,
    pub live_fence: Option<u64>,
}

/// A page of a list: the items and, when more remain, the cursor to continue after.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub next_cursor: Option<String>,
}
