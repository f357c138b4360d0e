//! The versioned binary formats of the machine: log entries (`Batch`) and whole-machine
//! snapshots. Both are bincode 2 through serde. A snapshot starts with a magic and a format
//! version; a batch is a versioned enum. Decoding garbage, a truncated input or an unknown
//! version is an error, never a panic, and decoding is bounded by a size limit.

use bincode::de::read::Reader;
use bincode::enc::write::Writer;
use std::collections::BTreeMap;

use imbl::OrdMap;

use serde::{Deserialize, Serialize};

use super::events::{EventLog, EventLogV1, SharedEventLog};
use super::idempotency::IdempotencyTable;
use super::legacy::{IdempotencyTableV3, LimitsV1, NamespaceStateV2, NamespaceStateV3};
use super::{AuthState, Batch, Limits, Machine, Namespace, NamespaceState};

const SNAPSHOT_MAGIC: &[u8; 4] = b"BTNM";
/// The magic and the format version.
const SNAPSHOT_HEADER_BYTES: usize = 8;
/// Version 2 added the access-control state (`auth`) at the end and the token to each event
/// (`by`); version 3 gave tasks `on_dead` and a finishing time and the limits two more
/// (legacy.rs); version 4 added the lines of waiting acquires to each namespace and a task
/// view's `on_dead` to the replies recorded for idempotency; version 5 keeps each namespace's
/// events in a window of its own, numbered by its own revision (events.rs). Versions 1 to 4
/// are still read.
const SNAPSHOT_VERSION: u32 = 5;
const SNAPSHOT_VERSION_SHARED_EVENTS: u32 = 4;
const SNAPSHOT_VERSION_WITHOUT_LINES: u32 = 3;
const SNAPSHOT_VERSION_WITHOUT_TXN: u32 = 2;
const SNAPSHOT_VERSION_WITHOUT_AUTH: u32 = 1;
/// Larger than any snapshot the limits allow.
const SNAPSHOT_BYTES_MAX: usize = 1 << 34;
/// A batch holds at most a few thousand commands of at most a body each.
const BATCH_BYTES_MAX: usize = 1 << 30;

#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("not a Baton snapshot (bad magic)")]
    BadMagic,
    #[error("snapshot format version {0} is not supported (this build reads versions 1 to {SNAPSHOT_VERSION})")]
    UnsupportedVersion(u32),
    #[error("input of {0} bytes is over the decoding limit")]
    TooLarge(usize),
    #[error("decoding failed: {0}")]
    Decode(#[from] bincode::error::DecodeError),
    #[error("encoding failed: {0}")]
    Encode(#[from] bincode::error::EncodeError),
    #[error("{0} trailing bytes after the encoded value")]
    TrailingBytes(usize),
    #[error("the decoded snapshot is inconsistent: {0}")]
    Inconsistent(String),
}

fn config() -> impl bincode::config::Config {
    bincode::config::standard()
}

#[derive(Serialize)]
struct SnapshotRef<'a> {
    limits: &'a Limits,
    time_ms: u64,
    fence_counter: u64,
    #[serde(serialize_with = "namespaces_by_ref")]
    namespaces: &'a OrdMap<Namespace, NamespaceState>,
    idempotency: &'a IdempotencyTable,
    events: &'a EventLog,
    auth: &'a AuthState,
}

fn namespaces_by_ref<S: serde::Serializer>(
    namespaces: &&OrdMap<Namespace, NamespaceState>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    super::imbl_serde::ord_map::serialize(namespaces, serializer)
}

#[derive(Deserialize)]
struct SnapshotOwned {
    limits: Limits,
    time_ms: u64,
    fence_counter: u64,
    #[serde(with = "crate::imbl_serde::ord_map")]
    namespaces: OrdMap<Namespace, NamespaceState>,
    idempotency: IdempotencyTable,
    events: EventLog,
    auth: AuthState,
}

/// A version 4 snapshot: one event window for every namespace.
#[derive(Deserialize)]
struct SnapshotOwnedV4 {
    limits: Limits,
    time_ms: u64,
    fence_counter: u64,
    #[serde(with = "crate::imbl_serde::ord_map")]
    namespaces: OrdMap<Namespace, NamespaceState>,
    idempotency: IdempotencyTable,
    events: SharedEventLog,
    auth: AuthState,
}

/// A version 3 snapshot: namespaces without lines.
#[derive(Deserialize)]
struct SnapshotOwnedV3 {
    limits: Limits,
    time_ms: u64,
    fence_counter: u64,
    namespaces: BTreeMap<Namespace, NamespaceStateV3>,
    idempotency: IdempotencyTableV3,
    events: SharedEventLog,
    auth: AuthState,
}

/// A version 2 snapshot: limits and tasks in their old shapes.
#[derive(Deserialize)]
struct SnapshotOwnedV2 {
    limits: LimitsV1,
    time_ms: u64,
    fence_counter: u64,
    namespaces: BTreeMap<Namespace, NamespaceStateV2>,
    idempotency: IdempotencyTableV3,
    events: SharedEventLog,
    auth: AuthState,
}

/// A version 1 snapshot: as version 2, without `auth`, and events without `by`.
#[derive(Deserialize)]
struct SnapshotOwnedV1 {
    limits: LimitsV1,
    time_ms: u64,
    fence_counter: u64,
    namespaces: BTreeMap<Namespace, NamespaceStateV2>,
    idempotency: IdempotencyTableV3,
    events: EventLogV1,
}

fn upgrade_namespaces(
    namespaces: BTreeMap<Namespace, NamespaceStateV2>,
    time_ms: u64,
) -> OrdMap<Namespace, NamespaceState> {
    namespaces
        .into_iter()
        .map(|(namespace, state)| (namespace, state.upgrade(time_ms)))
        .collect()
}

/// Encodes any serde value in the same bincode configuration `decode_value` reads. The store
/// and the peer network use this pair too, so there is one bounded way to decode bytes.
pub fn encode_value<T: Serialize>(value: &T) -> Result<Vec<u8>, CodecError> {
    Ok(bincode::serde::encode_to_vec(value, config())?)
}

pub fn encode_batch(batch: &Batch) -> Result<Vec<u8>, CodecError> {
    encode_value(batch)
}

pub fn decode_batch(bytes: &[u8]) -> Result<Batch, CodecError> {
    decode_value(bytes, BATCH_BYTES_MAX)
}

/// Runs `$decode`, a bincode decode with the configuration `$config`, under the decoding
/// limit: the smallest power of four at least `$claim` (see `decode_value`).
macro_rules! decode_with_limit {
    ($claim:expr, |$config:ident| $decode:expr) => {
        decode_with_limit!(@ $claim, $config, $decode; 12 14 16 18 20 22 24 26 28 30 32 34 36 38)
    };
    (@ $claim:expr, $config:ident, $decode:expr; $($shift:literal)*) => {
        match $claim {
            $(claim if claim <= 1 << $shift => {
                let $config = bincode::config::standard().with_limit::<{ 1 << $shift }>();
                $decode?
            })*
            _ => {
                let $config = bincode::config::standard().with_limit::<{ 1 << 40 }>();
                $decode?
            }
        }
    };
}

/// How many times its input's length a decoder may claim: see `decode_value`.
const CLAIM_FACTOR: usize = 64;

/// Decodes exactly one value from `bytes`, refusing garbage without ever attempting a huge
/// allocation. bincode allocates a string as long as its length prefix claims before reading
/// it, and counts decoded values at their in-memory size (a one-byte varint claims eight), so
/// the decoder's limit is set to the smallest power of four at least `CLAIM_FACTOR` times the
/// input: legitimate input always fits, and a forged prefix can make us allocate at most a
/// few hundred times the bytes we were given.
pub fn decode_value<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    bytes_max: usize,
) -> Result<T, CodecError> {
    if bytes.len() > bytes_max {
        return Err(CodecError::TooLarge(bytes.len()));
    }
    let claim = bytes.len().max(64).saturating_mul(CLAIM_FACTOR);
    let (value, read) = decode_with_limit!(claim, |limited| {
        bincode::serde::decode_from_slice::<T, _>(bytes, limited)
    });
    if read != bytes.len() {
        return Err(CodecError::TrailingBytes(bytes.len() - read));
    }
    Ok(value)
}

/// `decode_value` of the next `len` bytes of `input`, read as they are decoded: the same limit,
/// and the value must take exactly `len` bytes. Reads nothing past them.
pub fn decode_value_from<T: serde::de::DeserializeOwned>(
    input: &mut impl Reader,
    len: u64,
    bytes_max: usize,
) -> Result<T, CodecError> {
    let too_large = || CodecError::TooLarge(usize::try_from(len).unwrap_or(usize::MAX));
    let size = usize::try_from(len).map_err(|_| too_large())?;
    if size > bytes_max {
        return Err(too_large());
    }
    let claim = size.max(64).saturating_mul(CLAIM_FACTOR);
    let mut input = Bounded { input, left: len };
    let value = decode_with_limit!(claim, |limited| {
        bincode::serde::decode_from_reader::<T, _, _>(&mut input, limited)
    });
    if input.left != 0 {
        return Err(CodecError::TrailingBytes(
            usize::try_from(input.left).unwrap_or(usize::MAX),
        ));
    }
    Ok(value)
}

/// A writer into a `Vec` (bincode's own is not public).
struct Grown(Vec<u8>);

impl Writer for Grown {
    fn write(&mut self, bytes: &[u8]) -> Result<(), bincode::error::EncodeError> {
        self.0.extend_from_slice(bytes);
        Ok(())
    }
}

/// A reader of at most `left` more bytes of `input`.
struct Bounded<R> {
    input: R,
    left: u64,
}

impl<R: Reader> Reader for Bounded<R> {
    fn read(&mut self, bytes: &mut [u8]) -> Result<(), bincode::error::DecodeError> {
        let wanted = bytes.len() as u64;
        if wanted > self.left {
            return Err(bincode::error::DecodeError::UnexpectedEnd {
                additional: usize::try_from(wanted - self.left).unwrap_or(usize::MAX),
            });
        }
        self.input.read(bytes)?;
        self.left -= wanted;
        Ok(())
    }
}

impl Machine {
    /// The whole state as bytes. Two machines with equal state encode to equal bytes.
    pub fn encode_snapshot(&self) -> Result<Vec<u8>, CodecError> {
        let mut bytes = Grown(Vec::with_capacity(64));
        self.encode_snapshot_to(&mut bytes)?;
        Ok(bytes.0)
    }

    /// Writes `encode_snapshot`'s bytes to `out` as they are encoded, never holding them whole.
    pub fn encode_snapshot_to(&self, mut out: impl Writer) -> Result<(), CodecError> {
        let body = SnapshotRef {
            limits: &self.limits,
            time_ms: self.time_ms,
            fence_counter: self.fence_counter,
            namespaces: &self.namespaces,
            idempotency: &self.idempotency,
            events: &self.events,
            auth: &self.auth,
        };
        out.write(SNAPSHOT_MAGIC)?;
        out.write(&SNAPSHOT_VERSION.to_le_bytes())?;
        bincode::serde::encode_into_writer(&body, out, config())?;
        Ok(())
    }

    /// Rebuilds a machine from `encode_snapshot` bytes, with its indexes, and checks it.
    pub fn decode_snapshot(bytes: &[u8]) -> Result<Machine, CodecError> {
        let input = bincode::de::read::SliceReader::new(bytes);
        Machine::decode_snapshot_from(input, bytes.len() as u64)
    }

    /// `decode_snapshot` of the `len` bytes `input` holds, read as they are decoded, never
    /// held whole. Fewer bytes than `len`, or more, is an error.
    pub fn decode_snapshot_from(mut input: impl Reader, len: u64) -> Result<Machine, CodecError> {
        let mut header = [0; SNAPSHOT_HEADER_BYTES];
        if len < SNAPSHOT_HEADER_BYTES as u64
            || input.read(&mut header).is_err()
            || &header[..4] != SNAPSHOT_MAGIC
        {
            return Err(CodecError::BadMagic);
        }
        let version = u32::from_le_bytes(header[4..].try_into().expect("four bytes"));
        let body = len - SNAPSHOT_HEADER_BYTES as u64;
        let shared = |events: SharedEventLog, namespaces: &OrdMap<Namespace, NamespaceState>| {
            events.into_windows(namespaces.keys())
        };
        let mut body: SnapshotOwned = match version {
            SNAPSHOT_VERSION => decode_value_from(&mut input, body, SNAPSHOT_BYTES_MAX)?,
            SNAPSHOT_VERSION_SHARED_EVENTS => {
                let v4: SnapshotOwnedV4 = decode_value_from(&mut input, body, SNAPSHOT_BYTES_MAX)?;
                SnapshotOwned {
                    events: shared(v4.events, &v4.namespaces),
                    limits: v4.limits,
                    time_ms: v4.time_ms,
                    fence_counter: v4.fence_counter,
                    namespaces: v4.namespaces,
                    idempotency: v4.idempotency,
                    auth: v4.auth,
                }
            }
            SNAPSHOT_VERSION_WITHOUT_LINES => {
                let v3: SnapshotOwnedV3 = decode_value_from(&mut input, body, SNAPSHOT_BYTES_MAX)?;
                let namespaces = v3
                    .namespaces
                    .into_iter()
                    .map(|(namespace, state)| (namespace, NamespaceState::from(state)))
                    .collect();
                SnapshotOwned {
                    events: shared(v3.events, &namespaces),
                    limits: v3.limits,
                    time_ms: v3.time_ms,
                    fence_counter: v3.fence_counter,
                    namespaces,
                    idempotency: v3.idempotency.into(),
                    auth: v3.auth,
                }
            }
            SNAPSHOT_VERSION_WITHOUT_TXN => {
                let v2: SnapshotOwnedV2 = decode_value_from(&mut input, body, SNAPSHOT_BYTES_MAX)?;
                let namespaces = upgrade_namespaces(v2.namespaces, v2.time_ms);
                SnapshotOwned {
                    events: shared(v2.events, &namespaces),
                    limits: v2.limits.into(),
                    time_ms: v2.time_ms,
                    fence_counter: v2.fence_counter,
                    namespaces,
                    idempotency: v2.idempotency.into(),
                    auth: v2.auth,
                }
            }
            SNAPSHOT_VERSION_WITHOUT_AUTH => {
                let v1: SnapshotOwnedV1 = decode_value_from(&mut input, body, SNAPSHOT_BYTES_MAX)?;
                let namespaces = upgrade_namespaces(v1.namespaces, v1.time_ms);
                SnapshotOwned {
                    events: shared(v1.events.into(), &namespaces),
                    limits: v1.limits.into(),
                    time_ms: v1.time_ms,
                    fence_counter: v1.fence_counter,
                    namespaces,
                    idempotency: v1.idempotency.into(),
                    auth: AuthState::default(),
                }
            }
            _ => return Err(CodecError::UnsupportedVersion(version)),
        };
        if input.read(&mut [0]).is_ok() {
            return Err(CodecError::TrailingBytes(1));
        }
        body.events.rebuild_index();
        let mut machine = Machine {
            limits: body.limits,
            time_ms: body.time_ms,
            fence_counter: body.fence_counter,
            namespaces: body.namespaces,
            session_deadlines: Default::default(),
            max_hold_deadlines: Default::default(),
            shared_max_hold_deadlines: Default::default(),
            claim_deadlines: Default::default(),
            delayed: Default::default(),
            finished: Default::default(),
            idempotency: body.idempotency,
            events: body.events,
            auth: body.auth,
            acting: None,
            compensations: Vec::new(),
            to_serve: Default::default(),
            applied_events: Default::default(),
        };
        machine
            .rebuild_indexes()
            .map_err(CodecError::Inconsistent)?;
        machine
            .check_invariants()
            .map_err(CodecError::Inconsistent)?;
        Ok(machine)
    }
}
