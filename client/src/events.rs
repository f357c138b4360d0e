//! The event stream (docs/guarantees.md and docs/api.md): one page of the changes after a revision
//! ([`Client::events`]), and [`EventStream`], which follows them as they commit over
//! server-sent events and reconnects by itself.
//!
//! An [`EventStream`] delivers every event of the client's namespace once, in revision order:
//! after a lost connection it reconnects (to the next endpoint when one is down) with
//! `Last-Event-ID` set to the last revision it delivered, and drops any event at or below it.
//! It ends with an error when the server says the revision to resume from is older than the
//! kept window (`NOT_FOUND`: re-list what you follow), or when no node took it back within the
//! client's retry budget. What must never live here: retries of mutations, and any event
//! skipped silently.

use std::collections::VecDeque;
use std::fmt;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::Stream;
use reqwest::Method;
use tokio::time::Instant;

use crate::api::{ErrorCode, Event, EventsPage, Problem};
use crate::client::{backoff, Client, StreamOpen, ANSWER_BYTES_MAX};
use crate::error::{Error, Result};

/// How long an open stream may stay silent before it is taken for dead and reopened. The
/// server sends a keep-alive comment every 15 s.
pub const STREAM_IDLE_MAX: Duration = Duration::from_secs(40);

/// The SSE event type of one change.
const EVENT_CHANGE: &str = "change";
/// The SSE event type of the server's last word on a stream (a problem body).
const EVENT_ERROR: &str = "error";

impl Client {
    /// `GET /v1/events?after=&limit=`: the changes of this client's namespace after revision
    /// `after` (from the oldest kept one when `None`), at most `limit` (the server's page
    /// limit when `None`). Pass the page's `next` as `after` to continue; an empty page means
    /// there is nothing newer yet.
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`] when `after` is older than the kept window (re-list what you
    /// follow, then resume from a recent revision); [`Error::InvalidArgument`] for a bad
    /// limit.
    pub async fn events(&self, after: Option<u64>, limit: Option<u32>) -> Result<EventsPage> {
        let mut parameters = Vec::new();
        if let Some(after) = after {
            parameters.push(format!("after={after}"));
        }
        if let Some(limit) = limit {
            parameters.push(format!("limit={limit}"));
        }
        let mut path = "/v1/events".to_owned();
        if !parameters.is_empty() {
            path.push('?');
            path.push_str(&parameters.join("&"));
        }
        self.read(Method::GET, path, None::<&()>).await
    }

    /// Follows the changes of this client's namespace after revision `after` (from the oldest
    /// kept one when `None`) as they commit: a [`Stream`] of events in revision order, each
    /// delivered once, across lost connections, node restarts and leader changes (a node that
    /// ends the stream with `NO_LEADER`, cut off from the others, is left for the next one).
    ///
    /// ```no_run
    /// # async fn example(client: baton_client::Client) -> Result<(), baton_client::Error> {
    /// use baton_client::api::EventKind;
    /// use futures_util::StreamExt;
    ///
    /// let mut events = client.follow_events(Some(41));
    /// while let Some(event) = events.next().await {
    ///     let event = event?; // NOT_FOUND: revision 41 is no longer kept; re-list
    ///     if let EventKind::Released { resource, .. } = &event.kind {
    ///         println!("{resource} is free at revision {}", event.revision);
    ///     }
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// The stream yields an error and then ends: [`Error::NotFound`] when the revision to
    /// resume from is older than the kept window, [`Error::Unavailable`] when no endpoint
    /// took the stream back within the client's retry budget, or the server's refusal of the
    /// request.
    pub fn follow_events(&self, after: Option<u64>) -> EventStream {
        let delivered = Arc::new(AtomicU64::new(after.unwrap_or(0)));
        let follow = Follow {
            client: self.clone(),
            start_after: after,
            delivered: after,
            shared_delivered: Arc::clone(&delivered),
            response: None,
            parser: SseParser::default(),
            ready: VecDeque::new(),
            reconnects: 0,
            failing_since: None,
            failure: None,
            finished: false,
        };
        EventStream {
            inner: Box::pin(futures_util::stream::unfold(follow, Follow::step)),
            delivered,
        }
    }
}

/// The events of a namespace as they commit; see [`Client::follow_events`]. Dropping it closes
/// the connection.
pub struct EventStream {
    inner: Pin<Box<dyn Stream<Item = Result<Event>> + Send>>,
    delivered: Arc<AtomicU64>,
}

impl EventStream {
    /// The revision of the last event delivered (or the `after` it started from; 0 for none):
    /// where a new stream would resume.
    pub fn last_revision(&self) -> u64 {
        self.delivered.load(Ordering::Relaxed)
    }
}

impl fmt::Debug for EventStream {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("EventStream")
            .field("last_revision", &self.last_revision())
            .finish_non_exhaustive()
    }
}

impl Stream for EventStream {
    type Item = Result<Event>;

    fn poll_next(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(context)
    }
}

/// The state of one [`EventStream`].
struct Follow {
    client: Client,
    /// The `after` the stream was asked for; sent only until an event was delivered.
    start_after: Option<u64>,
    /// The revision of the last event delivered (or `start_after`).
    delivered: Option<u64>,
    shared_delivered: Arc<AtomicU64>,
    response: Option<Box<reqwest::Response>>,
    parser: SseParser,
    ready: VecDeque<Event>,
    /// Reconnections since bytes last arrived: the backoff before the next one grows with it.
    reconnects: u32,
    /// When the current run of failed attempts to (re)open began.
    failing_since: Option<Instant>,
    /// The error the stream ends with, once the events before it are delivered.
    failure: Option<Error>,
    finished: bool,
}

impl Follow {
    async fn step(mut self) -> Option<(Result<Event>, Follow)> {
        loop {
            if let Some(event) = self.ready.pop_front() {
                return Some((Ok(event), self));
            }
            if let Some(error) = self.failure.take() {
                return Some((Err(error), self));
            }
            if self.finished {
                return None;
            }
            let outcome = match self.response.as_mut() {
                None => self.open().await,
                Some(response) => {
                    match tokio::time::timeout(STREAM_IDLE_MAX, response.chunk()).await {
                        Ok(Ok(Some(chunk))) => {
                            self.reconnects = 0;
                            match self.receive(&chunk) {
                                Ok(Received::More) => Ok(()),
                                Ok(Received::CutOff) => {
                                    // The serving node lost its leader: resume elsewhere.
                                    self.response = None;
                                    self.client.prefer_next_endpoint();
                                    self.reconnects = 1;
                                    Ok(())
                                }
                                Err(error) => Err(error),
                            }
                        }
                        Ok(Ok(None) | Err(_)) | Err(_) => {
                            // Lost (a node restarted, a forward broke) or silent: reopen.
                            self.response = None;
                            self.reconnects += 1;
                            Ok(())
                        }
                    }
                }
            };
            if let Err(error) = outcome {
                // Events that arrived before the error are delivered first, then the error.
                self.finished = true;
                self.response = None;
                self.failure = Some(error);
            }
        }
    }

    /// Opens (or reopens) the stream on the preferred endpoint, pausing first after a loss.
    async fn open(&mut self) -> Result<()> {
        if self.reconnects > 0 {
            tokio::time::sleep(backoff(self.reconnects)).await;
        }
        let (path, headers) = match (self.delivered, self.start_after) {
            // Resume after the last delivered event, as a browser's EventSource would.
            (Some(revision), _) if self.delivered != self.start_after => (
                "/v1/events".to_owned(),
                vec![("Last-Event-ID", revision.to_string())],
            ),
            (_, Some(after)) => (format!("/v1/events?after={after}"), Vec::new()),
            (_, None) => ("/v1/events".to_owned(), Vec::new()),
        };
        match self.client.open_stream(&path, &headers).await {
            StreamOpen::Open(response) => {
                self.response = Some(response);
                self.parser = SseParser::default();
                self.failing_since = None;
                Ok(())
            }
            StreamOpen::Refused(error) => Err(error),
            StreamOpen::Retry(error, retry_after) => {
                let now = Instant::now();
                let since = *self.failing_since.get_or_insert(now);
                if now.duration_since(since) >= self.client.retry_budget() {
                    return Err(Error::Unavailable {
                        code: None,
                        message: format!(
                            "the event stream could not be reopened within {:?}; last failure: {}",
                            self.client.retry_budget(),
                            error.message()
                        ),
                    });
                }
                self.reconnects += 1;
                if let Some(wait) = retry_after {
                    tokio::time::sleep(wait).await;
                }
                Ok(())
            }
        }
    }

    /// Parses a chunk; queues the new events, and says whether the server cut the stream off
    /// for want of a leader (a stream to resume on another node), or returns the server's
    /// final error.
    fn receive(&mut self, chunk: &[u8]) -> Result<Received> {
        let messages = self
            .parser
            .push(chunk)
            .map_err(|message| Error::Unavailable {
                code: None,
                message,
            })?;
        for message in messages {
            match message.event.as_str() {
                EVENT_CHANGE | "message" => {
                    let event: Event = serde_json::from_str(&message.data).map_err(|error| {
                        Error::Unavailable {
                            code: None,
                            message: format!("an event does not parse: {error}"),
                        }
                    })?;
                    if self.delivered.is_some_and(|last| event.revision <= last) {
                        continue; // Already delivered before a reconnection.
                    }
                    self.delivered = Some(event.revision);
                    self.shared_delivered
                        .store(event.revision, Ordering::Relaxed);
                    self.ready.push_back(event);
                }
                EVENT_ERROR => {
                    return Err(match serde_json::from_str::<Problem>(&message.data) {
                        Ok(problem) if problem.code == ErrorCode::NoLeader => {
                            return Ok(Received::CutOff);
                        }
                        Ok(problem) => Error::from_problem(problem),
                        Err(_) => Error::Unavailable {
                            code: None,
                            message: format!("the stream ended with an error: {}", message.data),
                        },
                    });
                }
                _ => {} // An event type this client does not know.
            }
        }
        Ok(Received::More)
    }
}

/// What a chunk of the stream came to.
enum Received {
    /// Events, or nothing yet: read on.
    More,
    /// The serving node has had no leader for too long and ended the stream (docs/api.md):
    /// what it would stream falls behind, so reopen, after the last delivered event, on the
    /// node the client prefers next.
    CutOff,
}

/// One server-sent event: its type (`message` when unnamed), data lines joined by `\n`, id.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SseMessage {
    event: String,
    data: String,
    id: Option<String>,
}

/// An incremental `text/event-stream` parser (the WHATWG rules the server's use needs: `\n` or
/// `\r\n` line ends, comments, `event`, `data`, `id`; `retry` is ignored). Bounded: a line or
/// message longer than [`ANSWER_BYTES_MAX`] is an error.
#[derive(Debug, Default)]
struct SseParser {
    buffer: Vec<u8>,
    event: Option<String>,
    data: Option<String>,
    id: Option<String>,
}

impl SseParser {
    fn push(&mut self, bytes: &[u8]) -> std::result::Result<Vec<SseMessage>, String> {
        self.buffer.extend_from_slice(bytes);
        let mut messages = Vec::new();
        let mut start = 0;
        while let Some(offset) = self.buffer[start..].iter().position(|byte| *byte == b'\n') {
            let end = start + offset;
            let line = self.buffer[start..end]
                .strip_suffix(b"\r")
                .unwrap_or(&self.buffer[start..end]);
            let line = String::from_utf8_lossy(line).into_owned();
            start = end + 1;
            if let Some(message) = self.line(&line) {
                messages.push(message);
            }
        }
        self.buffer.drain(..start);
        let pending = self.buffer.len() + self.data.as_ref().map_or(0, String::len);
        if pending > ANSWER_BYTES_MAX {
            return Err(format!(
                "an event stream message is longer than {ANSWER_BYTES_MAX} bytes"
            ));
        }
        Ok(messages)
    }

    fn line(&mut self, line: &str) -> Option<SseMessage> {
        if line.is_empty() {
            let data = self.data.take();
            let event = self.event.take();
            return data.map(|data| SseMessage {
                event: event.unwrap_or_else(|| "message".to_owned()),
                data,
                id: self.id.clone(),
            });
        }
        if line.starts_with(':') {
            return None; // A comment: the server's keep-alive.
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "event" => self.event = Some(value.to_owned()),
            "data" => match &mut self.data {
                Some(data) => {
                    data.push('\n');
                    data.push_str(value);
                }
                None => self.data = Some(value.to_owned()),
            },
            "id" => self.id = Some(value.to_owned()),
            _ => {}
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(event: &str, data: &str, id: Option<&str>) -> SseMessage {
        SseMessage {
            event: event.to_owned(),
            data: data.to_owned(),
            id: id.map(str::to_owned),
        }
    }

    #[test]
    fn server_sent_events_parse_across_chunk_boundaries() {
        // (chunks, messages expected after all of them)
        let cases: Vec<(Vec<&str>, Vec<SseMessage>)> = vec![
            (
                vec!["id: 7\nevent: change\ndata: {\"a\":1}\n\n"],
                vec![message("change", "{\"a\":1}", Some("7"))],
            ),
            (
                vec!["id: 7\nevent: cha", "nge\ndata: {\"a\"", ":1}\n", "\n"],
                vec![message("change", "{\"a\":1}", Some("7"))],
            ),
            (
                vec!["id:8\r\nevent:change\r\ndata:x\r\n\r\n"],
                vec![message("change", "x", Some("8"))],
            ),
            (
                vec![":keep-alive\n\n", "data: a\ndata: b\n\n"],
                vec![message("message", "a\nb", None)],
            ),
            (
                vec!["event: error\ndata: {}\n\nid: 9\ndata: y\n\n"],
                vec![
                    message("error", "{}", None),
                    message("message", "y", Some("9")),
                ],
            ),
            // An event name without data dispatches nothing; an unfinished message waits.
            (vec!["event: change\n\n", "data: z\n"], vec![]),
        ];
        for (chunks, expected) in cases {
            let mut parser = SseParser::default();
            let mut messages = Vec::new();
            for chunk in &chunks {
                messages.extend(parser.push(chunk.as_bytes()).expect("parses"));
            }
            assert_eq!(messages, expected, "{chunks:?}");
        }
    }

    #[test]
    fn an_endless_line_is_refused() {
        let mut parser = SseParser::default();
        let chunk = vec![b'x'; 1 << 20];
        let mut refused = false;
        for _ in 0..(ANSWER_BYTES_MAX >> 20) + 2 {
            if parser.push(&chunk).is_err() {
                refused = true;
                break;
            }
        }
        assert!(refused);
    }
}
