//! The operator console (`/ui`) against a real `batond dev`: its page and assets are served by
//! the node itself with their content types, an `ETag` and `Cache-Control: no-cache` (a `304`
//! for a fresh copy), without a token even on a cluster with access control (whose API then
//! still wants one), and they load nothing from elsewhere; and in headless Chromium (Debian's
//! `chromium`, driven over the DevTools protocol) the four views render what the test made —
//! a held path with its holder and a countdown that counts down, a queue's counts — and an
//! event made after the page loaded shows up in the events view and in the lease tree.
//! Screenshots of each view go to `BATON_CONSOLE_SHOTS` (a directory) when it is set.
//!
//! Without `chromium` on the machine the browser test says so and passes, unless
//! `BATON_REQUIRE_BROWSER` is set (as `.ci/run` does, after installing it).

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use baton_client::api::QueueList;
use baton_tests::{free_port, json, Cluster, ClusterConfig, Value};
use futures_util::StreamExt;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// The bound on the page showing something the test waits for.
const RENDER_TIMEOUT: Duration = Duration::from_secs(20);

#[tokio::test]
async fn the_console_is_served_by_every_node_with_types_and_cache_headers() {
    let cluster = Cluster::dev().await;
    let node = cluster.node(1);
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("a client");
    let base = node.api_url();
    let redirect = http
        .get(format!("{base}/ui"))
        .send()
        .await
        .expect("GET /ui");
    assert_eq!(redirect.status(), 308);
    assert_eq!(redirect.headers()["location"], "/ui/");
    let mut bodies = Vec::new();
    for (path, content_type) in [
        ("/ui/", "text/html; charset=utf-8"),
        ("/ui/console.js", "text/javascript; charset=utf-8"),
        ("/ui/console.css", "text/css; charset=utf-8"),
    ] {
        let answer = http.get(format!("{base}{path}")).send().await.expect("GET");
        assert_eq!(answer.status(), 200, "{path}");
        assert_eq!(answer.headers()["content-type"], content_type, "{path}");
        assert_eq!(answer.headers()["cache-control"], "no-cache", "{path}");
        let etag = answer.headers()["etag"].clone();
        bodies.push(answer.text().await.expect("a body"));
        let again = http
            .get(format!("{base}{path}"))
            .header("if-none-match", etag)
            .send()
            .await
            .expect("GET again");
        assert_eq!(again.status(), 304, "{path}");
        assert!(again.bytes().await.expect("no body").is_empty());
    }
    // Nothing is loaded from elsewhere, and session ids are never asked for.
    for body in &bodies {
        for outside in [
            "src=\"http",
            "href=\"http",
            "fetch('http",
            "fetch(\"http",
            "//cdn",
        ] {
            assert!(!body.contains(outside), "an outside asset: {outside}");
        }
        assert!(!body.contains("session_id"));
    }
    assert!(bodies[0].contains("<script src=\"console.js\">"));

    // The queues the console lists, a page at a time in name order.
    let api = cluster.api();
    for queue in ["deploy", "build"] {
        api.post(
            node,
            &format!("/v1/queues/{queue}/tasks"),
            &json!({"payload": 1}),
        )
        .await
        .expect_status(201);
    }
    let first: QueueList = api.get(node, "/v1/queues?limit=1").await.expect_json(200);
    assert_eq!(first.queues.len(), 1);
    assert_eq!(first.queues[0].queue, "build");
    assert_eq!(first.queues[0].counts.ready, 1);
    let cursor = first.next_cursor.expect("a next page");
    let second: serde_json::Value = api
        .get(node, &format!("/v1/queues?limit=1&cursor={cursor}"))
        .await
        .expect_json(200);
    assert_eq!(second["queues"][0]["queue"], "deploy");
    // The last page says so with a null cursor, as every list answer does.
    assert_eq!(
        second.get("next_cursor"),
        Some(&serde_json::Value::Null),
        "{second}"
    );
}

#[tokio::test]
async fn with_access_control_the_page_is_public_and_the_api_is_not() {
    let cluster = Cluster::start_with(ClusterConfig {
        bootstrap_token: Some("console-test-bootstrap-secret".to_owned()),
        ..ClusterConfig::new(1)
    })
    .await;
    let base = cluster.node(1).api_url();
    let page = reqwest::get(format!("{base}/ui/")).await.expect("GET /ui/");
    assert_eq!(page.status(), 200);
    let api = reqwest::get(format!("{base}/v1/cluster"))
        .await
        .expect("GET /v1/cluster");
    assert_eq!(api.status(), 401);

    // In a browser: the page asks for a token, says what a 403 is, and works with a reader's.
    let Some(chromium) = browser() else {
        return;
    };
    let token = |name: &'static str, namespaces: &'static [&'static str]| {
        let cluster = &cluster;
        async move {
            let created: Value = cluster
                .api()
                .post(
                    cluster.node(1),
                    "/v1/auth/tokens",
                    &json!({"name": name, "role": "reader", "namespaces": namespaces}),
                )
                .await
                .expect_json(201);
            created["secret"].as_str().expect("a secret").to_owned()
        }
    };
    let reader = token("console-reader", &["*"]).await;
    let elsewhere = token("console-elsewhere", &["team-x"]).await;
    let mut page = Page::open(&chromium, &format!("{base}/ui/#overview")).await;
    let message = "document.getElementById('login').hidden ? '' : document.getElementById('message').innerText";
    page.wait_for("the token prompt", message, |text| text.contains("401"))
        .await;
    let submit = |secret: &str| {
        format!(
            "document.getElementById('token').value = {}; \
             document.getElementById('login').requestSubmit(); 'sent'",
            json!(secret)
        )
    };
    page.evaluate(&submit(&elsewhere)).await;
    page.wait_for(
        "a 403 for a token of another namespace",
        "document.getElementById('message').innerText",
        |text| text.contains("403") && text.contains("PERMISSION_DENIED"),
    )
    .await;
    page.evaluate(&submit(&reader)).await;
    page.wait_for(
        "the overview with a reader's token",
        "document.getElementById('message').hidden ? document.querySelector('#overview').innerText : ''",
        |text| text.contains("tasks in default") && text.contains("node 1"),
    )
    .await;
    // The token stays in the tab's session storage only.
    let stored = page
        .evaluate("[sessionStorage.getItem('baton.token') || '', localStorage.length].join(' ')")
        .await;
    assert_eq!(stored, format!("{reader} 0"));
}

#[tokio::test]
async fn a_browser_renders_the_four_views_and_follows_events_live() {
    let Some(chromium) = browser() else {
        return;
    };
    let cluster = Cluster::dev().await;
    let api = cluster.api();
    let node = cluster.node(1);
    for (resource, holder) in [("repo/src/auth.rs", "agent-b"), ("repo/docs", "agent-c")] {
        api.post(
            node,
            "/v1/leases",
            &json!({"resource": resource, "holder": holder, "ttl_ms": 60_000,
                    "reason": "refactor"}),
        )
        .await
        .expect_status(201);
    }
    for n in 0..3 {
        api.post(
            node,
            "/v1/queues/build/tasks",
            &json!({"payload": {"n": n}}),
        )
        .await
        .expect_status(201);
    }
    api.post(
        node,
        "/v1/queues/build/claim",
        &json!({"holder": "worker-1", "ttl_ms": 60_000}),
    )
    .await
    .expect_status(200);

    let mut page = Page::open(&chromium, &format!("{}/ui/#leases", node.api_url())).await;
    let shots = std::env::var_os("BATON_CONSOLE_SHOTS").map(PathBuf::from);
    let first = page
        .wait_for(
            "the held path with its holder and countdown",
            "[...document.querySelectorAll('.lease')].map(e => e.innerText).join('\\n')",
            |text| text.contains("auth.rs") && text.contains("held by agent-b (fence 1) for"),
        )
        .await;
    // The countdown counts down: `for 1m more`, `for 59s more`, ...
    let seconds_left = |text: &str| -> u64 {
        let line = text
            .lines()
            .find(|line| line.contains("agent-b"))
            .unwrap_or("");
        let left = line
            .split(" for ")
            .nth(1)
            .unwrap_or("")
            .trim_end_matches(" more");
        let (minutes, seconds) = match left.split_once('m') {
            Some((minutes, seconds)) => (minutes, seconds),
            None => ("0", left),
        };
        let minutes: u64 = minutes.parse().unwrap_or(0);
        let seconds: u64 = seconds.trim_end_matches('s').parse().unwrap_or(0);
        minutes * 60 + seconds
    };
    let before = seconds_left(&first);
    page.wait_for(
        "the countdown to move",
        "[...document.querySelectorAll('.lease')].map(e => e.innerText).join('\\n')",
        |text| seconds_left(text) > 0 && seconds_left(text) < before,
    )
    .await;
    page.screenshot(&shots, "leases").await;

    page.go("#queues").await;
    page.wait_for(
        "the queue's counts",
        "document.querySelector('#queue-table tbody').innerText",
        |text| text.contains("build") && text.contains("2\t0\t1\t0\t0"),
    )
    .await;
    page.screenshot(&shots, "queues").await;

    page.go("#overview").await;
    page.wait_for(
        "the overview's cards and members",
        "document.querySelector('#overview').innerText",
        |text| {
            text.contains("leader") && text.contains("node 1") && text.contains("tasks in default")
        },
    )
    .await;
    page.screenshot(&shots, "overview").await;

    page.go("#events").await;
    page.wait_for(
        "the events made before the page loaded",
        "document.querySelector('#event-table tbody').innerText",
        |text| text.contains("repo/src/auth.rs") && text.contains("task_claimed"),
    )
    .await;
    // A lease granted now reaches the open page through the event stream.
    api.post(
        node,
        "/v1/leases",
        &json!({"resource": "live/after-load", "holder": "agent-late", "ttl_ms": 60_000}),
    )
    .await
    .expect_status(201);
    page.wait_for(
        "the event made after the page loaded",
        "document.querySelector('#event-table tbody').innerText",
        |text| text.contains("live/after-load") && text.contains("agent-late"),
    )
    .await;
    page.screenshot(&shots, "events").await;
    page.go("#leases").await;
    page.wait_for(
        "the new lease in the tree",
        "document.querySelector('#lease-tree').innerText",
        |text| text.contains("after-load") && text.contains("held by agent-late"),
    )
    .await;
    // Selecting a lease shows its recent events.
    page.evaluate(
        "document.querySelector('.lease[data-resource=\"live/after-load\"]').click(); 'clicked'",
    )
    .await;
    page.wait_for(
        "the selected lease's events",
        "document.querySelector('#lease-detail').innerText",
        |text| text.contains("granted") && text.contains("agent-late"),
    )
    .await;
    // Dark mode follows the system's.
    page.call(
        "Emulation.setEmulatedMedia",
        json!({"features": [{"name": "prefers-color-scheme", "value": "dark"}]}),
    )
    .await;
    let background = page
        .evaluate("getComputedStyle(document.body).backgroundColor")
        .await;
    assert_eq!(background, "rgb(22, 24, 27)", "the dark background");
    page.screenshot(&shots, "leases-dark").await;
}

/// Many live leases (`BATON_CONSOLE_LOAD_LEASES`, 2,000 by default so the suite stays quick;
/// 100,000 for the figures in the notes): the leases view shows one page of 500 from one
/// request and never asks for the rest; its first render and the bytes it transferred are
/// printed.
///
/// FIXME: the view tells only that more leases are on the next page, not how many there are
/// (the API has no count under a prefix); this asserts that behaviour as it is today.
#[tokio::test]
async fn console_load_with_many_live_leases() {
    let Some(chromium) = browser() else {
        return;
    };
    let leases: usize = std::env::var("BATON_CONSOLE_LOAD_LEASES")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(2_000);
    let cluster = Cluster::dev().await;
    let api = cluster.api();
    let node = cluster.node(1);
    let started = Instant::now();
    // Sessions of 10,000 leases each (the most a session may hold), acquired 64 at a time.
    let per_session = 10_000;
    let mut sessions = Vec::new();
    for index in 0..leases.div_ceil(per_session) {
        sessions
            .push(crate::queues::new_session(api, node, &format!("agent-{index}"), 600_000).await);
    }
    let mut acquires = futures_util::stream::iter((0..leases).map(|index| {
        let body = json!({"resource": format!("fleet/team-{}/repo-{}/file-{index}.rs", index % 10, index % 100),
                          "session_id": sessions[index / per_session]});
        async move { api.post(node, "/v1/leases", &body).await.expect_status(201); }
    }))
    .buffer_unordered(64);
    while acquires.next().await.is_some() {}
    eprintln!(
        "console load: {leases} leases made in {:?}",
        started.elapsed()
    );
    let mut page = Page::open(&chromium, &format!("{}/ui/#leases", node.api_url())).await;
    page.wait_for(
        "the first page of leases",
        "String(performance.getEntriesByName('baton:leases-rendered').length)",
        |text| text == "1",
    )
    .await;
    // The event follower replays the last 200 events (these acquires) once the page is up; that
    // history is already in the page of leases and must not make the console read each lease
    // it names again. Give it time to, then count the requests.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let figures = page
        .evaluate(
            "JSON.stringify({first_render_ms: performance.getEntriesByName('baton:leases-rendered')[0].startTime, \
             shown: document.querySelectorAll('.lease').length, \
             transferred: performance.getEntriesByType('navigation').concat(performance.getEntriesByType('resource')) \
               .map(e => ({name: e.name, bytes: e.transferSize, body: e.encodedBodySize}))})",
        )
        .await;
    eprintln!("console load: {figures}");
    let figures: Value = serde_json::from_str(&figures).expect("the figures");
    assert_eq!(figures["shown"], 500, "one page of leases");
    let lease_requests: Vec<&str> = figures["transferred"]
        .as_array()
        .expect("the transfers")
        .iter()
        .filter_map(|entry| entry["name"].as_str())
        .filter(|name| name.contains("/v1/leases"))
        .collect();
    assert_eq!(lease_requests.len(), 1, "{lease_requests:?}");
    assert!(lease_requests[0].ends_with("/v1/leases?prefix=&limit=500"));
    let text = page
        .evaluate("document.getElementById('lease-count').innerText")
        .await;
    assert_eq!(text, "500 leases shown (more on the next page)");
}

/// Debian's `chromium`, if installed; missing is a failure when `BATON_REQUIRE_BROWSER` is
/// set.
fn browser() -> Option<PathBuf> {
    let found = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .map(PathBuf::from)
        .find(|path| path.exists());
    if found.is_none() {
        assert!(
            std::env::var_os("BATON_REQUIRE_BROWSER").is_none(),
            "BATON_REQUIRE_BROWSER is set but chromium is not installed (apt-get install chromium)"
        );
        eprintln!("console: chromium is not installed; the browser test did not run");
    }
    found
}

/// One headless Chromium with one page, driven over the DevTools protocol.
struct Page {
    browser: tokio::process::Child,
    socket: TcpStream,
    next_id: u64,
    base: String,
    _profile: tempfile::TempDir,
}

impl Page {
    async fn open(chromium: &PathBuf, url: &str) -> Page {
        let profile = tempfile::tempdir().expect("a profile directory");
        let port = free_port();
        let mut browser = tokio::process::Command::new(chromium)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--hide-scrollbars",
                "--window-size=1280,800",
                &format!("--remote-debugging-port={port}"),
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start chromium");
        // It says where its DevTools listen once it does.
        let mut lines = BufReader::new(browser.stderr.take().expect("stderr")).lines();
        tokio::time::timeout(RENDER_TIMEOUT, async {
            while let Some(line) = lines.next_line().await.expect("chromium's stderr") {
                if line.contains("DevTools listening on") {
                    return;
                }
            }
            panic!("chromium exited before listening");
        })
        .await
        .expect("chromium listens");
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let targets: Value = reqwest::get(format!("http://127.0.0.1:{port}/json/list"))
            .await
            .expect("the DevTools targets")
            .json()
            .await
            .expect("JSON");
        let target = targets
            .as_array()
            .and_then(|targets| targets.iter().find(|target| target["type"] == "page"))
            .expect("a page target");
        let ws = target["webSocketDebuggerUrl"].as_str().expect("its socket");
        let path = &ws[ws.find("/devtools").expect("a DevTools path")..];
        let mut socket = TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect to DevTools");
        let handshake = format!(
            "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n\
             Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
             Sec-WebSocket-Version: 13\r\n\r\n"
        );
        socket
            .write_all(handshake.as_bytes())
            .await
            .expect("handshake");
        let mut answer = Vec::new();
        while !answer.ends_with(b"\r\n\r\n") {
            answer.push(socket.read_u8().await.expect("the handshake's answer"));
        }
        assert!(
            answer.starts_with(b"HTTP/1.1 101"),
            "{}",
            String::from_utf8_lossy(&answer)
        );
        let base = url.split('#').next().expect("a URL").to_owned();
        let mut page = Page {
            browser,
            socket,
            next_id: 0,
            base,
            _profile: profile,
        };
        page.call("Page.navigate", json!({"url": url})).await;
        page
    }

    /// Sends one DevTools command and returns its result (events in between are skipped).
    async fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let text = json!({"id": id, "method": method, "params": params}).to_string();
        self.send_frame(text.as_bytes()).await;
        loop {
            let message: Value =
                serde_json::from_slice(&self.read_message().await).expect("a JSON message");
            if message["id"] == id {
                assert!(message.get("error").is_none(), "{method} failed: {message}");
                return message["result"].clone();
            }
        }
    }

    /// A masked text frame, as a client must send.
    async fn send_frame(&mut self, payload: &[u8]) {
        let mut frame = vec![0x81u8];
        match payload.len() {
            length @ 0..=125 => frame.push(0x80 | length as u8),
            length @ 126..=65_535 => {
                frame.push(0x80 | 126);
                frame.extend_from_slice(&(length as u16).to_be_bytes());
            }
            length => {
                frame.push(0x80 | 127);
                frame.extend_from_slice(&(length as u64).to_be_bytes());
            }
        }
        let mask = [0x1f, 0x2e, 0x3d, 0x4c];
        frame.extend_from_slice(&mask);
        frame.extend(
            payload
                .iter()
                .enumerate()
                .map(|(index, byte)| byte ^ mask[index % 4]),
        );
        self.socket.write_all(&frame).await.expect("send a frame");
    }

    /// One whole message (continuation frames joined).
    async fn read_message(&mut self) -> Vec<u8> {
        let mut message = Vec::new();
        loop {
            let head = self.socket.read_u16().await.expect("a frame");
            let (fin, opcode) = (head & 0x8000 != 0, (head >> 8) & 0x0f);
            let length = match head & 0x7f {
                126 => u64::from(self.socket.read_u16().await.expect("a length")),
                127 => self.socket.read_u64().await.expect("a length"),
                length => u64::from(length),
            };
            let mut payload = vec![0; length as usize];
            self.socket
                .read_exact(&mut payload)
                .await
                .expect("a payload");
            assert_ne!(opcode, 8, "DevTools closed the connection");
            message.extend_from_slice(&payload);
            if fin {
                return message;
            }
        }
    }

    async fn evaluate(&mut self, expression: &str) -> String {
        let result = self
            .call(
                "Runtime.evaluate",
                json!({"expression": expression, "returnByValue": true}),
            )
            .await;
        result["result"]["value"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// Polls `expression` until `done` holds for its text; returns that text.
    async fn wait_for(
        &mut self,
        what: &str,
        expression: &str,
        done: impl Fn(&str) -> bool,
    ) -> String {
        let deadline = Instant::now() + RENDER_TIMEOUT;
        let mut last = String::new();
        while Instant::now() < deadline {
            last = self.evaluate(expression).await;
            if done(&last) {
                return last;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let page = self
            .evaluate("[location.href, document.getElementById('message').innerText].join(' ')")
            .await;
        panic!("the console never showed {what}; it showed: {last}\nthe page: {page}");
    }

    async fn go(&mut self, hash: &str) {
        let url = format!("{}{hash}", self.base);
        self.call("Page.navigate", json!({"url": url})).await;
    }

    async fn screenshot(&mut self, directory: &Option<PathBuf>, view: &str) {
        let Some(directory) = directory else { return };
        let shot = self
            .call("Page.captureScreenshot", json!({"format": "png"}))
            .await;
        let png = decode_base64(shot["data"].as_str().expect("the image"));
        std::fs::create_dir_all(directory).expect("the screenshot directory");
        std::fs::write(directory.join(format!("console-{view}.png")), png)
            .expect("write the screenshot");
    }
}

impl Drop for Page {
    fn drop(&mut self) {
        let _ = self.browser.start_kill();
    }
}

/// Standard base64, as DevTools sends images.
fn decode_base64(text: &str) -> Vec<u8> {
    let value = |byte: u8| -> u32 {
        match byte {
            b'A'..=b'Z' => u32::from(byte - b'A'),
            b'a'..=b'z' => u32::from(byte - b'a') + 26,
            b'0'..=b'9' => u32::from(byte - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {byte}"),
        }
    };
    let bytes: Vec<u8> = text.bytes().filter(|byte| *byte != b'=').collect();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let mut bits = 0u32;
        for (index, byte) in chunk.iter().enumerate() {
            bits |= value(*byte) << (18 - 6 * index);
        }
        let produced = chunk.len() * 6 / 8;
        out.extend_from_slice(&bits.to_be_bytes()[1..1 + produced]);
    }
    out
}

#[test]
fn base64_decodes_what_devtools_sends() {
    assert_eq!(decode_base64("aGVsbG8="), b"hello");
    assert_eq!(decode_base64("aGk="), b"hi");
    assert_eq!(decode_base64("YWJj"), b"abc");
}
