//! Validated domain values: namespaces, resource paths, session ids, holders, labels, and the
//! limits that bound them. A name type is made only in its shape (`new`, and serde goes
//! through it), so holding one proves the shape; the bounds the limits set are checked by
//! `check`, which admission.rs runs for every command. No I/O, no clock.

use std::borrow::Borrow;
use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// The limits of docs/guarantees.md, "Limits", plus the few internal bounds the machine needs.
///
/// They are part of the replicated state (changed only through the `SetLimits` command), so
/// every replica decides with the same numbers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    pub ttl_ms_min: u64,
    pub ttl_ms_max: u64,
    pub max_hold_ms_max: u64,
    pub path_bytes_max: usize,
    pub path_segments_max: usize,
    pub namespace_bytes_max: usize,
    pub holder_chars_max: usize,
    pub label_chars_max: usize,
    pub labels_max: usize,
    pub leases_per_session_max: usize,
    pub sessions_per_namespace_max: usize,
    pub kv_keys_per_namespace_max: usize,
    pub kv_value_bytes_max: usize,
    pub task_payload_bytes_max: usize,
    pub tasks_per_queue_max: usize,
    pub queues_per_namespace_max: usize,
    pub task_dependencies_max: usize,
    pub task_attempts_max: u32,
    pub task_delay_ms_max: u64,
    pub task_text_chars_max: usize,
    pub name_chars_max: usize,
    pub list_page_max: usize,
    pub idempotency_key_chars_min: usize,
    pub idempotency_key_chars_max: usize,
    pub idempotency_ttl_ms: u64,
    pub idempotency_keys_max: usize,
    pub events_kept_max: usize,
    pub sweep_batch_max: usize,
    /// Done and dead tasks are removed this long after they finished.
    pub task_retention_ms: u64,
    /// Compares, and ops, in one transaction.
    pub txn_ops_max: usize,
    /// The most holders a shared lease may allow.
    pub shared_limit_max: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            ttl_ms_min: 1_000,
            ttl_ms_max: 3_600_000,
            max_hold_ms_max: 86_400_000,
            path_bytes_max: 512,
            path_segments_max: 32,
            namespace_bytes_max: 128,
            holder_chars_max: 128,
            label_chars_max: 128,
            labels_max: 16,
            leases_per_session_max: 10_000,
            sessions_per_namespace_max: 1_000_000,
            kv_keys_per_namespace_max: 1_000_000,
            kv_value_bytes_max: 256 * 1024,
            task_payload_bytes_max: 256 * 1024,
            tasks_per_queue_max: 1_000_000,
            queues_per_namespace_max: 10_000,
            task_dependencies_max: 64,
            task_attempts_max: 100,
            task_delay_ms_max: 30 * 24 * 60 * 60 * 1_000,
            task_text_chars_max: 4_096,
            name_chars_max: 128,
            list_page_max: 1_000,
            idempotency_key_chars_min: 16,
            idempotency_key_chars_max: 255,
            idempotency_ttl_ms: 24 * 60 * 60 * 1_000,
            idempotency_keys_max: 1_000_000,
            events_kept_max: 100_000,
            sweep_batch_max: 1_000,
            task_retention_ms: 7 * 24 * 60 * 60 * 1_000,
            txn_ops_max: 64,
            shared_limit_max: 1_024,
        }
    }
}

impl Limits {
    /// Whether these limits can be decided with: every bound positive and every minimum at
    /// most its maximum. `SetLimits` is admitted only when they hold.
    pub fn check(&self) -> Result<(), Invalid> {
        const DURATION_MS_MAX: u64 = 10 * 365 * 24 * 60 * 60 * 1_000;
        let durations = [
            ("ttl_ms_min", self.ttl_ms_min),
            ("ttl_ms_max", self.ttl_ms_max),
            ("max_hold_ms_max", self.max_hold_ms_max),
            ("task_delay_ms_max", self.task_delay_ms_max),
            ("idempotency_ttl_ms", self.idempotency_ttl_ms),
            ("task_retention_ms", self.task_retention_ms),
        ];
        let counts = [
            ("path_bytes_max", self.path_bytes_max as u64),
            ("path_segments_max", self.path_segments_max as u64),
            ("namespace_bytes_max", self.namespace_bytes_max as u64),
            ("holder_chars_max", self.holder_chars_max as u64),
            ("label_chars_max", self.label_chars_max as u64),
            ("labels_max", self.labels_max as u64),
            ("leases_per_session_max", self.leases_per_session_max as u64),
            (
                "sessions_per_namespace_max",
                self.sessions_per_namespace_max as u64,
            ),
            (
                "kv_keys_per_namespace_max",
                self.kv_keys_per_namespace_max as u64,
            ),
            ("kv_value_bytes_max", self.kv_value_bytes_max as u64),
            ("task_payload_bytes_max", self.task_payload_bytes_max as u64),
            ("tasks_per_queue_max", self.tasks_per_queue_max as u64),
            (
                "queues_per_namespace_max",
                self.queues_per_namespace_max as u64,
            ),
            ("task_dependencies_max", self.task_dependencies_max as u64),
            ("task_attempts_max", u64::from(self.task_attempts_max)),
            ("task_text_chars_max", self.task_text_chars_max as u64),
            ("name_chars_max", self.name_chars_max as u64),
            ("list_page_max", self.list_page_max as u64),
            (
                "idempotency_key_chars_min",
                self.idempotency_key_chars_min as u64,
            ),
            (
                "idempotency_key_chars_max",
                self.idempotency_key_chars_max as u64,
            ),
            ("idempotency_keys_max", self.idempotency_keys_max as u64),
            ("events_kept_max", self.events_kept_max as u64),
            ("sweep_batch_max", self.sweep_batch_max as u64),
            ("txn_ops_max", self.txn_ops_max as u64),
            ("shared_limit_max", u64::from(self.shared_limit_max)),
        ];
        // Zero is a usable setting for these (no labels, no dependencies, no delays).
        let may_be_zero = ["labels_max", "task_dependencies_max", "task_delay_ms_max"];
        // Bounds on the bounds, so that no deadline or count can overflow: durations at most
        // ten years, counts and sizes at most 2^32.
        for (name, value, max) in durations
            .iter()
            .map(|(name, value)| (name, value, DURATION_MS_MAX))
            .chain(
                counts
                    .iter()
                    .map(|(name, value)| (name, value, u64::from(u32::MAX))),
            )
        {
            if *value == 0 && !may_be_zero.contains(name) {
                return Err(Invalid::new(format!("limit {name} must be positive")));
            }
            if *value > max {
                return Err(Invalid::new(format!(
                    "limit {name} must be at most {max}, got {value}"
                )));
            }
        }
        // A page of leases never splits a shared lease's holders, so its limit bounds how far a
        // page may run past `list_page_max`.
        const SHARED_LIMIT_MAX: u32 = 65_536;
        if self.shared_limit_max > SHARED_LIMIT_MAX {
            return Err(Invalid::new(format!(
                "limit shared_limit_max must be at most {SHARED_LIMIT_MAX}, got {}",
                self.shared_limit_max
            )));
        }
        if self.ttl_ms_min > self.ttl_ms_max {
            return Err(Invalid::new(format!(
                "ttl_ms_min {} is above ttl_ms_max {}",
                self.ttl_ms_min, self.ttl_ms_max
            )));
        }
        if self.idempotency_key_chars_min > self.idempotency_key_chars_max {
            return Err(Invalid::new(format!(
                "idempotency_key_chars_min {} is above idempotency_key_chars_max {}",
                self.idempotency_key_chars_min, self.idempotency_key_chars_max
            )));
        }
        Ok(())
    }
}

/// Input that breaks a naming or range rule: refused as `INVALID_ARGUMENT` (the command layer
/// turns it into a `Rejection`). Kept here so that the types need nothing from the commands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid(pub String);

impl Invalid {
    pub fn new(message: impl Into<String>) -> Invalid {
        Invalid(message.into())
    }
}

impl fmt::Display for Invalid {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(&self.0)
    }
}

/// An isolated set of sessions, leases and keys. `[A-Za-z0-9._-]`, 1..=`namespace_bytes_max`.
///
/// Like every name type here, holding one proves its shape: construction (`new`, and so
/// deserialization from the log, a snapshot or a peer) refuses any other; the bounds the limits
/// set are checked by `check` (see admission.rs), because the limits can change.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String")]
pub struct Namespace(String);

impl Namespace {
    /// Below every namespace (never one itself): the lower bound of a range over keys that
    /// start with a namespace.
    pub(crate) fn below_all() -> Namespace {
        Namespace(String::new())
    }

    /// A namespace of the right shape: not empty, `[A-Za-z0-9._-]` only.
    pub fn new(text: impl Into<String>) -> Result<Namespace, Invalid> {
        let text = text.into();
        let valid_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
        if text.is_empty() {
            return Err(Invalid::new("namespace must not be empty"));
        }
        if !text.chars().all(valid_char) {
            return Err(Invalid::new(format!(
                "namespace {text:?} may only contain letters, digits, '.', '_' and '-'"
            )));
        }
        Ok(Namespace(text))
    }

    /// Within the bounds `limits` set.
    pub fn check(&self, limits: &Limits) -> Result<(), Invalid> {
        if self.0.len() > limits.namespace_bytes_max {
            return Err(Invalid::new(format!(
                "namespace must be 1..={} bytes, got {}",
                limits.namespace_bytes_max,
                self.0.len()
            )));
        }
        Ok(())
    }

    /// [`Namespace::new`] and [`Namespace::check`]: for input that is not admitted later.
    pub fn parse(text: &str, limits: &Limits) -> Result<Namespace, Invalid> {
        let namespace = Namespace::new(text)?;
        namespace.check(limits)?;
        Ok(namespace)
    }

    pub fn default_namespace() -> Namespace {
        Namespace("default".to_owned())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for Namespace {
    type Error = Invalid;

    fn try_from(text: String) -> Result<Namespace, Invalid> {
        Namespace::new(text)
    }
}

impl fmt::Display for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A `/`-separated path naming a resource or a key: 1..=`path_bytes_max` bytes, at most
/// `path_segments_max` segments, no empty segment (so no leading, trailing or double `/`), no
/// `.` or `..` segment and no control character. Compared as exact bytes, never normalised: the
/// refused forms are what would let one file go by two names.
///
/// Ordered as its string, so the paths under `a/b` are exactly the range `a/b/` .. `a/b0`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String")]
pub struct ResourcePath(String);

impl ResourcePath {
    /// Below every path (never one itself): the lower bound of a range over keys with a path.
    pub(crate) fn below_all() -> ResourcePath {
        ResourcePath(String::new())
    }

    /// A path of the right shape: not empty, no empty, `.` or `..` segment, no control
    /// character.
    pub fn new(text: impl Into<String>) -> Result<ResourcePath, Invalid> {
        let text = text.into();
        if text.is_empty() {
            return Err(Invalid::new("path must not be empty"));
        }
        refuse_control_chars("path", &text)?;
        for segment in text.split('/') {
            if segment.is_empty() {
                return Err(Invalid::new(format!(
                    "path {text:?} has an empty segment: no leading, trailing or double '/'"
                )));
            }
            if segment == "." || segment == ".." {
                return Err(Invalid::new(format!(
                    "path {text:?} has a {segment:?} segment: paths are compared as exact bytes, so name the file without '.' or '..'"
                )));
            }
        }
        Ok(ResourcePath(text))
    }

    /// Within the bounds `limits` set: its length and its number of segments.
    pub fn check(&self, limits: &Limits) -> Result<(), Invalid> {
        if self.0.len() > limits.path_bytes_max {
            return Err(Invalid::new(format!(
                "path must be 1..={} bytes, got {}",
                limits.path_bytes_max,
                self.0.len()
            )));
        }
        let segments = self.0.split('/').count();
        if segments > limits.path_segments_max {
            return Err(Invalid::new(format!(
                "path {:?} has {segments} segments, at most {} are allowed",
                self.0, limits.path_segments_max
            )));
        }
        Ok(())
    }

    /// [`ResourcePath::new`] and [`ResourcePath::check`]: for input that is not admitted later
    /// (a read's path).
    pub fn parse(text: &str, limits: &Limits) -> Result<ResourcePath, Invalid> {
        let path = ResourcePath::new(text)?;
        path.check(limits)?;
        Ok(path)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The proper ancestors of this path, nearest last: `a`, `a/b` for `a/b/c`.
    pub fn ancestors(&self) -> impl Iterator<Item = &str> {
        self.0
            .char_indices()
            .filter(|&(_, c)| c == '/')
            .map(|(index, _)| &self.0[..index])
    }

    /// The bounds of the string range holding exactly the paths strictly below this one.
    pub fn descendant_bounds(&self) -> (String, String) {
        // '0' is the character right after '/', so [p/, p0) holds every "p/..." string.
        (format!("{}/", self.0), format!("{}0", self.0))
    }

    /// Whether `self` is `other` or lies below it.
    pub fn is_within(&self, other: &ResourcePath) -> bool {
        self.0 == other.0
            || (self.0.len() > other.0.len()
                && self.0.starts_with(&other.0)
                && self.0.as_bytes()[other.0.len()] == b'/')
    }
}

impl TryFrom<String> for ResourcePath {
    type Error = Invalid;

    fn try_from(text: String) -> Result<ResourcePath, Invalid> {
        ResourcePath::new(text)
    }
}

impl Borrow<str> for ResourcePath {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ResourcePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A name of one segment: a queue name or a task id. `[A-Za-z0-9._:-]`, 1..=`name_chars_max`,
/// neither `.` nor `..`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String")]
pub struct Name(String);

impl Name {
    /// A name of the right shape; `what` names it in the refusal ("queue", "task id").
    pub fn new(what: &str, text: impl Into<String>) -> Result<Name, Invalid> {
        let text = text.into();
        let valid_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':');
        if text.is_empty() {
            return Err(Invalid::new(format!("{what} must not be empty")));
        }
        if !text.chars().all(valid_char) {
            return Err(Invalid::new(format!(
                "{what} {text:?} may only contain letters, digits, '.', '_', ':' and '-'"
            )));
        }
        if text == "." || text == ".." {
            return Err(Invalid::new(format!(
                "{what} may not be {text:?}: it names a path segment"
            )));
        }
        Ok(Name(text))
    }

    /// Within the length `limits` set.
    pub fn check(&self, what: &str, limits: &Limits) -> Result<(), Invalid> {
        if self.0.len() > limits.name_chars_max {
            return Err(Invalid::new(format!(
                "{what} must be 1..={} characters, got {}",
                limits.name_chars_max,
                self.0.len()
            )));
        }
        Ok(())
    }

    /// [`Name::new`] and [`Name::check`]: for input that is not admitted later (a read's
    /// name).
    pub fn parse(what: &str, text: &str, limits: &Limits) -> Result<Name, Invalid> {
        let name = Name::new(what, text)?;
        name.check(what, limits)?;
        Ok(name)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for Name {
    type Error = Invalid;

    fn try_from(text: String) -> Result<Name, Invalid> {
        Name::new("name", text)
    }
}

impl Borrow<str> for Name {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A session's secret capability: 128 random bits chosen by the leader and carried in the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SessionId(pub u128);

impl SessionId {
    /// Parses the 32 lowercase hex digits that `Display` prints.
    pub fn parse(text: &str) -> Result<SessionId, Invalid> {
        let well_formed = text.len() == 32
            && text
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        match u128::from_str_radix(text, 16) {
            Ok(value) if well_formed => Ok(SessionId(value)),
            _ => Err(Invalid::new(
                "session_id must be the 32 hex digits that session creation returned",
            )),
        }
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// `exclusive` covers exactly its path; `subtree` covers its path and everything below;
/// `shared` is held by up to `limit` sessions at once (a semaphore), each with its own fence,
/// and conflicts like an exclusive lease with everything but other shared holders.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum LeaseMode {
    Exclusive,
    Subtree,
    // Last, so that the log and the replies recorded before it decode unchanged.
    Shared { limit: u32 },
}

impl LeaseMode {
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseMode::Exclusive => "exclusive",
            LeaseMode::Subtree => "subtree",
            LeaseMode::Shared { .. } => "shared",
        }
    }
}

/// Free-form `key -> value` annotations, at most `labels_max`, each 1..=`label_chars_max`.
pub type Labels = BTreeMap<String, String>;

pub fn validate_labels(labels: &Labels, limits: &Limits) -> Result<(), Invalid> {
    if labels.len() > limits.labels_max {
        return Err(Invalid::new(format!(
            "at most {} labels are allowed, got {}",
            limits.labels_max,
            labels.len()
        )));
    }
    for (key, value) in labels {
        validate_chars("label key", key, limits.label_chars_max)?;
        validate_chars("label value", value, limits.label_chars_max)?;
    }
    Ok(())
}

pub fn validate_holder(holder: &str, limits: &Limits) -> Result<(), Invalid> {
    validate_chars("holder", holder, limits.holder_chars_max)
}

pub fn validate_ttl(ttl_ms: u64, limits: &Limits) -> Result<(), Invalid> {
    if ttl_ms < limits.ttl_ms_min || ttl_ms > limits.ttl_ms_max {
        return Err(Invalid::new(format!(
            "ttl_ms must be {}..={}, got {ttl_ms}",
            limits.ttl_ms_min, limits.ttl_ms_max
        )));
    }
    Ok(())
}

pub fn validate_max_hold(max_hold_ms: u64, limits: &Limits) -> Result<(), Invalid> {
    if max_hold_ms == 0 || max_hold_ms > limits.max_hold_ms_max {
        return Err(Invalid::new(format!(
            "max_hold_ms must be 1..={}, got {max_hold_ms}",
            limits.max_hold_ms_max
        )));
    }
    Ok(())
}

pub fn validate_idempotency_key(key: &str, limits: &Limits) -> Result<(), Invalid> {
    let chars = key.chars().count();
    let printable = key.chars().all(|c| c.is_ascii_graphic());
    if chars < limits.idempotency_key_chars_min
        || chars > limits.idempotency_key_chars_max
        || !printable
    {
        return Err(Invalid::new(format!(
            "Idempotency-Key must be {}..={} printable ASCII characters (a UUIDv4 is the intended form)",
            limits.idempotency_key_chars_min, limits.idempotency_key_chars_max
        )));
    }
    Ok(())
}

fn validate_chars(what: &str, text: &str, chars_max: usize) -> Result<(), Invalid> {
    let chars = text.chars().count();
    if chars == 0 || chars > chars_max {
        return Err(Invalid::new(format!(
            "{what} must be 1..={chars_max} characters, got {chars}"
        )));
    }
    refuse_control_chars(what, text)
}

/// No name holds a control character (U+0000..U+001F, U+007F): they hide in logs and
/// terminals, so two names that look the same could differ.
fn refuse_control_chars(what: &str, text: &str) -> Result<(), Invalid> {
    match text.chars().find(|c| c.is_ascii_control()) {
        Some(control) => Err(Invalid::new(format!(
            "{what} {text:?} contains the control character {control:?}"
        ))),
        None => Ok(()),
    }
}
