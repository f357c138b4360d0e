//! The bounded window of recent state changes, numbered by a rising revision with no gaps, so
//! the event stream can resume from any revision still in the window.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use super::command::{Event, EventKind};
use super::{Limits, Name, Namespace};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct EventLog {
    /// The revision of the last event ever recorded (0 before the first).
    last_revision: u64,
    /// The most recent events, oldest first, at most `events_kept_max`.
    window: VecDeque<Event>,
}

impl EventLog {
    /// Records an event and returns its revision.
    pub(super) fn push(
        &mut self,
        time_ms: u64,
        namespace: &Namespace,
        kind: EventKind,
        by: Option<&Name>,
        limits: &Limits,
    ) -> u64 {
        self.last_revision += 1;
        self.window.push_back(Event {
            revision: self.last_revision,
            time_ms,
            namespace: namespace.clone(),
            kind,
            by: by.cloned(),
        });
        self.trim(limits);
        self.last_revision
    }

    /// Drops the oldest events beyond `events_kept_max`.
    pub(super) fn trim(&mut self, limits: &Limits) {
        while self.window.len() > limits.events_kept_max {
            self.window.pop_front();
        }
    }

    pub(super) fn oldest_revision(&self) -> u64 {
        self.window
            .front()
            .map_or(self.last_revision + 1, |event| event.revision)
    }

    pub(super) fn last_revision(&self) -> u64 {
        self.last_revision
    }

    /// Events with a revision above `after`, at most `limit`; `None` if some of them have
    /// already left the window.
    pub(super) fn after(&self, after: u64, limit: usize) -> Option<Vec<Event>> {
        if after.saturating_add(1) < self.oldest_revision() {
            return None;
        }
        Some(self.since(after).take(limit).cloned().collect())
    }

    /// The kept events after revision `after`, oldest first.
    pub(super) fn since(&self, after: u64) -> impl Iterator<Item = &Event> {
        let skip = after
            .saturating_add(1)
            .saturating_sub(self.oldest_revision());
        self.window
            .iter()
            .skip(usize::try_from(skip).unwrap_or(usize::MAX))
    }

    pub(super) fn window(&self) -> &VecDeque<Event> {
        &self.window
    }
}

/// An event as snapshot format 1 stored it, before events named their token.
#[derive(Debug, Deserialize)]
pub(super) struct EventV1 {
    revision: u64,
    time_ms: u64,
    namespace: Namespace,
    kind: EventKind,
}

/// The event log as snapshot format 1 stored it.
#[derive(Debug, Deserialize)]
pub(super) struct EventLogV1 {
    last_revision: u64,
    window: VecDeque<EventV1>,
}

impl From<EventLogV1> for EventLog {
    fn from(v1: EventLogV1) -> EventLog {
        EventLog {
            last_revision: v1.last_revision,
            window: v1
                .window
                .into_iter()
                .map(|event| Event {
                    revision: event.revision,
                    time_ms: event.time_ms,
                    namespace: event.namespace,
                    kind: event.kind,
                    by: None,
                })
                .collect(),
        }
    }
}
