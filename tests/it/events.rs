//! The event stream (docs/guarantees.md, "Semantics" "Events", section 5 `GET /v1/events`), against real
//! three-node clusters: a reader that pages with `after` while writers change things,
//! disconnects, and resumes from its last revision on another node after the leader is killed
//! sees every event exactly once, in revision order, none missing; an SSE reader on a follower
//! that drops its connection and reconnects with `Last-Event-ID` continues exactly after the
//! last event it saw.
//!
//! An `after` older than the kept window (100,000 events by default, not configurable from the
//! command line) is left to the state machine's unit tests.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use baton_client::api::{ClaimResponse, ErrorCode, Event, EventKind, EventsPage};
use baton_tests::{
    idempotency_key, json, poll_until, Api, Call, Cluster, ClusterConfig, Method, Node, Value,
    POLL_INTERVAL,
};

/// A small page, so that the reader pages many times.
const PAGE: u32 = 7;
/// Write rounds while the reader follows, before the failover.
const ROUNDS_BEFORE: usize = 10;
/// Write rounds while the reader is away.
const ROUNDS_AWAY: usize = 5;
/// Write rounds after the failover, while the reader resumes.
const ROUNDS_AFTER: usize = 10;
/// A TTL no session of these tests outlives.
const LONG_TTL_MS: u64 = 60_000;
/// The bound on a write or a read being acknowledged, a failover included.
const ACK_TIMEOUT: Duration = Duration::from_secs(15);
/// The bound on one SSE event arriving.
const SSE_EVENT_TIMEOUT: Duration = Duration::from_secs(5);

#[tokio::test]
async fn a_reader_resuming_from_its_last_revision_sees_every_event_once_across_a_failover() {
    let cluster = Cluster::start(3).await;
    let api = cluster.api();
    let leader = cluster.leader().await;
    let mut expected: BTreeMap<String, usize> = BTreeMap::new();
    // The reader starts on the leader, so that the failover takes its node away.
    let mut reader = Reader::new(cluster.nodes(), leader.id);

    // 1. The reader follows while the writers write.
    let written = Cell::new(false);
    let all_nodes: Vec<&Node> = cluster.nodes().iter().collect();
    let writer = async {
        let changes = write_rounds(&cluster, &all_nodes, 0..ROUNDS_BEFORE).await;
        written.set(true);
        changes
    };
    let (changes, ()) = tokio::join!(writer, reader.follow_until(api, &written));
    add_all(&mut expected, changes);
    let before = reader.after;
    assert!(before > 0, "the reader saw nothing");

    // 2. The reader is away; the writers go on; the leader is killed.
    let changes = write_rounds(
        &cluster,
        &all_nodes,
        ROUNDS_BEFORE..ROUNDS_BEFORE + ROUNDS_AWAY,
    )
    .await;
    add_all(&mut expected, changes);
    leader.kill();
    eprintln!("killed the leader, node {}", leader.id);

    // 3. The reader comes back with its last revision and follows while the writers write
    //    through the survivors; its own node is gone, so it reads from another.
    let survivors = cluster.live_nodes();
    let written = Cell::new(false);
    let writer = async {
        let rounds = ROUNDS_BEFORE + ROUNDS_AWAY..ROUNDS_BEFORE + ROUNDS_AWAY + ROUNDS_AFTER;
        let changes = write_rounds(&cluster, &survivors, rounds).await;
        written.set(true);
        changes
    };
    let (changes, ()) = tokio::join!(writer, reader.follow_until(api, &written));
    add_all(&mut expected, changes);
    let new_leader = cluster.leader().await;
    assert_ne!(new_leader.id, leader.id);
    eprintln!(
        "the reader resumed after revision {before}, read {} events in all, in {} pages, {} \
         retried",
        reader.seen.len(),
        reader.pages,
        reader.retries
    );
    assert!(
        reader.retries > 0,
        "the failover never made the reader switch nodes"
    );

    // Every event once, in order, none missing: one namespace, so the revisions have no gaps.
    for (n, event) in reader.seen.iter().enumerate() {
        assert_eq!(
            event.revision,
            n as u64 + 1,
            "event {n} out of order or after a gap: {:?}",
            &reader.seen[n.saturating_sub(2)..(n + 2).min(reader.seen.len())]
        );
        assert_eq!(event.namespace, "default", "{event:?}");
        assert_ne!(event.kind, EventKind::Unknown, "{event:?}");
    }
    for pair in reader.seen.windows(2) {
        assert!(
            pair[0].cluster_time_ms <= pair[1].cluster_time_ms,
            "cluster time went backwards: {pair:?}"
        );
    }
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    add_all(&mut seen, reader.seen.iter().map(describe).collect());
    assert_eq!(
        seen, expected,
        "the events seen are not exactly the changes acknowledged, each once"
    );

    // And what the reader pieced together is the log as one fresh read from the start sees it.
    let mut fresh = Reader::new(cluster.nodes(), new_leader.id);
    fresh.catch_up(api).await;
    assert_eq!(
        fresh.seen, reader.seen,
        "the resumed reading differs from a fresh one"
    );
}

#[tokio::test]
async fn an_sse_reader_on_a_follower_resumes_with_last_event_id() {
    let cluster = Cluster::start(3).await;
    let api = cluster.api();
    let leader = cluster.leader().await;
    let followers = cluster.followers().await;
    let (first, second) = (followers[0], followers[1]);
    let mut expected = Vec::new();
    for n in 0..4 {
        enqueue(api, leader, &format!("s-{n}")).await;
        expected.push(format!("task_enqueued jobs/s-{n}"));
    }

    // From the start: the events so far, then the ones that commit while it is connected.
    let mut stream = SseStream::open(first, None).await;
    let mut seen = Vec::new();
    for _ in 0..4 {
        seen.push(stream.next_event().await);
    }
    for n in 0..3 {
        put(api, second, &format!("live/{n}")).await;
        expected.push(format!("kv_written live/{n}"));
        seen.push(stream.next_event().await);
    }
    drop(stream);
    let last = seen.last().expect("events").revision;

    // Away: more changes, one of them in another namespace (not this reader's).
    for n in 4..7 {
        enqueue(api, leader, &format!("s-{n}")).await;
        expected.push(format!("task_enqueued jobs/s-{n}"));
    }
    let elsewhere = api
        .call(Method::PUT, leader, "/v1/kv/elsewhere")
        .namespace("other-team")
        .json(&json!({"value": "not yours"}))
        .send()
        .await;
    elsewhere.expect_status(200);
    for n in 3..5 {
        put(api, first, &format!("live/{n}")).await;
        expected.push(format!("kv_written live/{n}"));
    }

    // Back, on the other follower, with the last id seen.
    let mut stream = SseStream::open(second, Some(last)).await;
    let resumed_from = seen.len();
    while seen.len() < expected.len() {
        seen.push(stream.next_event().await);
    }
    assert_eq!(
        seen.iter().map(describe).collect::<Vec<_>>(),
        expected,
        "the events seen over SSE, before and after the reconnect"
    );
    assert_eq!(
        seen[resumed_from].revision,
        last + 1,
        "the resumed stream does not start right after Last-Event-ID {last}"
    );
    // Each namespace numbers its own changes: the other team's write took none of this one's
    // revisions, so they run on without a gap.
    for pair in seen.windows(2) {
        assert_eq!(
            pair[0].revision + 1,
            pair[1].revision,
            "a gap or a step back: {pair:?}"
        );
    }
    let mut page = Reader::new(cluster.nodes(), leader.id);
    page.catch_up(api).await;
    assert_eq!(seen, page.seen, "SSE and the paged list disagree");
    assert!(
        page.seen.iter().all(|event| event.namespace == "default"),
        "another namespace's event: {:?}",
        page.seen
    );
    // Nothing else arrives on the resumed stream.
    put(api, leader, "live/last").await;
    let next = stream.next_event().await;
    assert_eq!(describe(&next), "kv_written live/last");
    assert!(next.revision > page.after);
}

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// A reader of `GET /v1/events?after=&limit=`: every request is a new connection, so each page
/// resumes from the last revision seen. It sticks to one node and moves to the next on a
/// transport error, `NO_LEADER` or `OUTCOME_UNKNOWN`.
struct Reader<'a> {
    nodes: &'a [Node],
    node: usize,
    after: u64,
    seen: Vec<Event>,
    pages: usize,
    retries: usize,
}

impl<'a> Reader<'a> {
    fn new(nodes: &'a [Node], start_on: u64) -> Reader<'a> {
        let node = nodes
            .iter()
            .position(|node| node.id == start_on)
            .expect("a node of the cluster");
        Reader {
            nodes,
            node,
            after: 0,
            seen: Vec::new(),
            pages: 0,
            retries: 0,
        }
    }

    /// Reads one page after the last revision seen; returns whether it moved `after` on (a
    /// page that is not full has reached the end).
    async fn read_page(&mut self, api: &Api) -> bool {
        let deadline = Instant::now() + ACK_TIMEOUT;
        let path = format!("/v1/events?after={}&limit={PAGE}", self.after);
        let page: EventsPage = loop {
            let node = &self.nodes[self.node];
            let failure = match api.call(Method::GET, node, &path).try_send().await {
                Ok(reply) if reply.status == 200 => break reply.parse(),
                Ok(reply) if matches!(reply.code(), Some("NO_LEADER" | "OUTCOME_UNKNOWN")) => {
                    reply.to_string()
                }
                Ok(reply) => panic!("unexpected answer to a read of events: {reply}"),
                Err(error) => error,
            };
            assert!(
                Instant::now() < deadline,
                "no page of events within {ACK_TIMEOUT:?}: {failure}"
            );
            self.retries += 1;
            self.node = (self.node + 1) % self.nodes.len();
            tokio::time::sleep(POLL_INTERVAL).await;
        };
        self.pages += 1;
        assert!(
            page.events.len() <= PAGE as usize,
            "a page over its limit: {page:?}"
        );
        if let Some(first) = page.events.first() {
            assert!(
                first.revision > self.after,
                "an event not after {}: {page:?}",
                self.after
            );
        }
        if let Some(last) = page.events.last() {
            assert!(
                page.next >= last.revision,
                "`next` is before the last event: {page:?}"
            );
        }
        assert!(page.next >= self.after, "`next` went back: {page:?}");
        let moved = page.next > self.after;
        assert!(
            moved || page.events.is_empty(),
            "events without `next` moving: {page:?}"
        );
        self.after = page.next;
        self.seen.extend(page.events);
        moved
    }

    /// Pages until a page does not move on.
    async fn catch_up(&mut self, api: &Api) {
        while self.read_page(api).await {}
    }

    /// Pages as events come, until a page read after `written` was set does not move on.
    async fn follow_until(&mut self, api: &Api, written: &Cell<bool>) {
        let deadline = Instant::now() + ACK_TIMEOUT * 4;
        loop {
            let finished = written.get();
            if !self.read_page(api).await {
                if finished {
                    return;
                }
                assert!(Instant::now() < deadline, "the writers never finished");
                tokio::time::sleep(POLL_INTERVAL).await;
            }
        }
    }
}

/// Rounds of writes, each retried with its Idempotency-Key on the next of `nodes` until it is
/// acknowledged: per round, enqueue a task and write a key; every third round, also claim the
/// oldest task and complete it. Returns the events they must produce, as [`describe`] names
/// them.
async fn write_rounds(
    cluster: &Cluster,
    nodes: &[&Node],
    rounds: std::ops::Range<usize>,
) -> Vec<String> {
    let api = cluster.api();
    let mut changes = Vec::new();
    for round in rounds {
        let post = |path: String, body: Value| {
            let key = idempotency_key();
            move |node: &Node| -> Call {
                api.call(Method::POST, node, &path)
                    .idempotency_key(&key)
                    .json(&body)
            }
        };
        let task = format!("t-{round:03}");
        cluster
            .retry_until_acknowledged(
                nodes,
                ACK_TIMEOUT,
                post(
                    "/v1/queues/jobs/tasks".to_owned(),
                    json!({"id": task, "payload": round}),
                ),
            )
            .await;
        changes.push(format!("task_enqueued jobs/{task}"));

        let key = idempotency_key();
        let path = format!("/v1/kv/round/{round}");
        cluster
            .retry_until_acknowledged(nodes, ACK_TIMEOUT, |node| {
                api.call(Method::PUT, node, &path)
                    .idempotency_key(&key)
                    .json(&json!({"value": round}))
            })
            .await;
        changes.push(format!("kv_written round/{round}"));

        if round % 3 == 0 {
            let (reply, _) = cluster
                .retry_until_acknowledged(
                    nodes,
                    ACK_TIMEOUT,
                    post(
                        "/v1/queues/jobs/claim".to_owned(),
                        json!({"holder": format!("worker-{round}"), "ttl_ms": LONG_TTL_MS}),
                    ),
                )
                .await;
            let claimed: ClaimResponse = reply.expect_json(200);
            let id = claimed.task.id;
            changes.push(format!("task_claimed jobs/{id}"));
            cluster
                .retry_until_acknowledged(
                    nodes,
                    ACK_TIMEOUT,
                    post(
                        format!("/v1/queues/jobs/tasks/{id}/complete"),
                        json!({"session_id": claimed.session_id, "fence": claimed.fence}),
                    ),
                )
                .await;
            changes.push(format!("task_completed jobs/{id}"));
        }
    }
    changes
}

fn add_all(counts: &mut BTreeMap<String, usize>, changes: Vec<String>) {
    for change in changes {
        *counts.entry(change).or_default() += 1;
    }
}

/// `"<type> <what>"`: enough to tell the changes of these tests apart.
pub(crate) fn describe(event: &Event) -> String {
    match &event.kind {
        EventKind::KvWritten { key, .. } => format!("kv_written {key}"),
        EventKind::KvDeleted { key } => format!("kv_deleted {key}"),
        EventKind::Granted { resource, .. } => format!("granted {resource}"),
        EventKind::Released { resource, .. } => format!("released {resource}"),
        EventKind::Expired { resource, .. } => format!("expired {resource}"),
        EventKind::TaskEnqueued(change) => {
            format!("task_enqueued {}/{}", change.queue, change.task_id)
        }
        EventKind::TaskClaimed(change) => {
            format!("task_claimed {}/{}", change.queue, change.task_id)
        }
        EventKind::TaskCompleted(change) => {
            format!("task_completed {}/{}", change.queue, change.task_id)
        }
        EventKind::TaskFailed(change) => format!("task_failed {}/{}", change.queue, change.task_id),
        EventKind::TaskReleased(change) => {
            format!("task_released {}/{}", change.queue, change.task_id)
        }
        EventKind::TaskDead(change) => format!("task_dead {}/{}", change.queue, change.task_id),
        EventKind::TaskExpired(change) => {
            format!("task_expired {}/{}", change.queue, change.task_id)
        }
        EventKind::Queued {
            resource, holder, ..
        } => format!("queued {resource} {holder}"),
        EventKind::LeftLine { resource, holder } => format!("left_line {resource} {holder}"),
        EventKind::Unknown => "unknown".to_owned(),
    }
}

async fn enqueue(api: &Api, node: &Node, id: &str) {
    api.post(
        node,
        "/v1/queues/jobs/tasks",
        &json!({"id": id, "payload": {}}),
    )
    .await
    .expect_status(201);
}

async fn put(api: &Api, node: &Node, key: &str) {
    api.put(node, &format!("/v1/kv/{key}"), &json!({"value": key}))
        .await
        .expect_status(200);
}

/// One `GET /v1/events` with `Accept: text/event-stream`, read message by message.
struct SseStream {
    response: reqwest::Response,
    buffer: Vec<u8>,
    request: String,
}

impl SseStream {
    /// Opens the stream on `node`, from the start or after `last_event_id`.
    async fn open(node: &Node, last_event_id: Option<u64>) -> SseStream {
        let client = reqwest::Client::builder()
            .no_proxy()
            .connect_timeout(Duration::from_secs(1))
            .build()
            .expect("build an HTTP client");
        let url = format!("{}/v1/events", node.api_url());
        let mut request = client
            .get(&url)
            .header(reqwest::header::ACCEPT, "text/event-stream");
        if let Some(id) = last_event_id {
            request = request.header("Last-Event-ID", id.to_string());
        }
        let request_text = format!("GET {url} (Last-Event-ID: {last_event_id:?})");
        let response = tokio::time::timeout(SSE_EVENT_TIMEOUT, request.send())
            .await
            .unwrap_or_else(|_| panic!("{request_text}: no answer within {SSE_EVENT_TIMEOUT:?}"))
            .unwrap_or_else(|error| panic!("{request_text}: {error:#}"));
        let content_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        assert!(
            response.status().as_u16() == 200 && content_type.starts_with("text/event-stream"),
            "{request_text}: {} with content type {content_type:?}",
            response.status()
        );
        SseStream {
            response,
            buffer: Vec::new(),
            request: request_text,
        }
    }

    /// The next `change` message, parsed; checks that its `id` is its revision. Fails the
    /// test after [`SSE_EVENT_TIMEOUT`], on an `error` message, or when the stream ends.
    async fn next_event(&mut self) -> Event {
        let deadline = tokio::time::Instant::now() + SSE_EVENT_TIMEOUT;
        loop {
            if let Some(end) = self.buffer.windows(2).position(|pair| pair == b"\n\n") {
                let block: Vec<u8> = self.buffer.drain(..end + 2).collect();
                let block = String::from_utf8(block).expect("an SSE message is UTF-8");
                let mut fields: BTreeMap<&str, String> = BTreeMap::new();
                for line in block.lines().filter(|line| !line.starts_with(':')) {
                    let (name, value) = line.split_once(':').unwrap_or((line, ""));
                    let value = value.strip_prefix(' ').unwrap_or(value);
                    let field = fields.entry(name).or_default();
                    if name == "data" && !field.is_empty() {
                        field.push('\n');
                    }
                    field.push_str(value);
                }
                if fields.is_empty() {
                    continue; // a keep-alive comment
                }
                assert_eq!(
                    fields.get("event").map(String::as_str),
                    Some("change"),
                    "{}: not a change: {block:?}",
                    self.request
                );
                let data = fields.get("data").map(String::as_str).unwrap_or_default();
                let event: Event = serde_json::from_str(data)
                    .unwrap_or_else(|error| panic!("{}: bad data {data:?}: {error}", self.request));
                assert_eq!(
                    fields.get("id"),
                    Some(&event.revision.to_string()),
                    "{}: the id is not the revision: {block:?}",
                    self.request
                );
                return event;
            }
            let chunk = tokio::time::timeout_at(deadline, self.response.chunk())
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "{}: no event within {SSE_EVENT_TIMEOUT:?}; unparsed: {:?}",
                        self.request,
                        String::from_utf8_lossy(&self.buffer)
                    )
                })
                .unwrap_or_else(|error| panic!("{}: reading: {error:#}", self.request))
                .unwrap_or_else(|| panic!("{}: the stream ended", self.request));
            self.buffer
                .extend(chunk.iter().copied().filter(|byte| *byte != b'\r'));
        }
    }
}

/// G9: open event streams are bounded per node (`--event-streams-max`); one more is refused
/// with 429 RESOURCE_EXHAUSTED and Retry-After, and a closed stream frees its place.
#[tokio::test]
async fn event_streams_are_bounded_and_a_closed_one_frees_its_place() {
    let mut config = ClusterConfig::new(1);
    config.extra_args = vec!["--event-streams-max".to_owned(), "1".to_owned()];
    let cluster = Cluster::start_with(config).await;
    let node = &cluster.nodes()[0];
    let first = SseStream::open(node, None).await;
    let refused = cluster
        .api()
        .call(Method::GET, node, "/v1/events")
        .header("Accept", "text/event-stream")
        .send()
        .await;
    refused.expect_problem(429, ErrorCode::ResourceExhausted);
    assert!(refused.headers.contains_key("retry-after"), "{refused}");
    // Paging is not a stream and is not limited.
    cluster
        .api()
        .get(node, "/v1/events")
        .await
        .expect_status(200);
    drop(first);
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("an HTTP client");
    let url = format!("{}/v1/events", node.api_url());
    poll_until(
        Duration::from_secs(5),
        "the closed stream's place",
        async || {
            // `send` returns at the answer's head: a stream that opened answers 200 at once.
            let answer = client
                .get(&url)
                .header(reqwest::header::ACCEPT, "text/event-stream")
                .send()
                .await
                .ok()?;
            (answer.status().as_u16() == 200).then_some(())
        },
    )
    .await;
}

/// A stream is served by the node it arrives at; when that node is cut off from every other
/// node, it ends with `NO_LEADER` (after the longest a request waits for a leader) instead of
/// going silent, so its reader resumes on another node. The Rust client's stream does so by
/// itself: it reopens with `Last-Event-ID` and goes on without a gap, not ending with an error.
#[tokio::test]
async fn a_stream_on_a_node_cut_off_from_the_others_ends_with_no_leader() {
    let cluster = Cluster::start(3).await;
    let api = cluster.api();
    let follower = cluster.followers().await[0];
    let mut stream = SseStream::open(follower, None).await;
    // The client's stream, on the same follower first.
    let mut endpoints = vec![follower.api_url()];
    endpoints.extend(
        cluster
            .nodes()
            .iter()
            .filter(|node| node.id != follower.id)
            .map(Node::api_url),
    );
    let client = baton_client::Client::builder(endpoints)
        .request_timeout(Duration::from_secs(2))
        .build()
        .expect("a client");
    let mut followed = client.follow_events(None);
    put(api, cluster.leader().await, "cut-off/before").await;
    let first = next_followed(&mut followed).await;
    assert!(
        matches!(&first.kind, EventKind::KvWritten { key, .. } if key == "cut-off/before"),
        "{first:?}"
    );
    let others: Vec<&Node> = cluster
        .nodes()
        .iter()
        .filter(|node| node.id != follower.id)
        .collect();
    for node in &others {
        node.pause();
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let mut sent = String::new();
    loop {
        match tokio::time::timeout_at(deadline, stream.response.chunk()).await {
            Ok(Ok(Some(chunk))) => sent.push_str(&String::from_utf8_lossy(&chunk)),
            Ok(Ok(None)) | Ok(Err(_)) => break,
            Err(_) => panic!("the cut-off node's stream is still open: {sent:?}"),
        }
    }
    for node in &others {
        node.resume();
    }
    assert!(
        sent.contains("event: error") && sent.contains("NO_LEADER"),
        "{sent:?}"
    );
    // The client's stream got the same `NO_LEADER` (it is unread in its connection): it
    // resumes after its last event, and the next write reaches it.
    put(api, cluster.leader().await, "cut-off/after").await;
    let next = next_followed(&mut followed).await;
    assert_eq!(next.revision, first.revision + 1, "{next:?}");
    assert!(
        matches!(&next.kind, EventKind::KvWritten { key, .. } if key == "cut-off/after"),
        "{next:?}"
    );
}

/// The client stream's next event, within [`ACK_TIMEOUT`]; an error fails the test.
async fn next_followed(stream: &mut baton_client::EventStream) -> Event {
    use futures_util::StreamExt;
    match tokio::time::timeout(ACK_TIMEOUT, stream.next()).await {
        Ok(Some(Ok(event))) => event,
        Ok(Some(Err(error))) => panic!("the client's stream ended with an error: {error}"),
        Ok(None) => panic!("the client's stream ended"),
        Err(_) => panic!("no event within {ACK_TIMEOUT:?}"),
    }
}
