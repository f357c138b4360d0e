//! Shared leases (semaphores) against real `batond` processes: eight agents on three nodes
//! contending for a semaphore of three for five seconds never hold it more than three at once
//! (in the test's own count, in a follower's list, and in the event stream), each gets it, and
//! every grant has its own fence, rising in event order and in real time; a full semaphore
//! refuses with its oldest holder, its holders and their total, a session's second acquire
//! names itself, and another limit, a limit out of bounds or a limit without `shared` are
//! `INVALID_ARGUMENT`, none of which changes anything (neither the list nor the event
//! revision); exclusive and subtree leases conflict with the holders as one set; a release
//! frees a place at once; any live holder's fence is current and guards a fenced write
//! together with its own session only; a holder whose session lapses loses its place to a
//! waiter with an `expired` event; and `baton acquire --shared N` exits as docs/cli.md says.

use crate::queues::new_session;
use std::cell::Cell;
use std::collections::BTreeSet;
use std::ops::Range;
use std::time::{Duration, Instant};

use baton_client::api::{
    ErrorCode, EventKind, FenceCheckResponse, FenceRef, Grant, KvEntry, KvPutResponse, Lease,
    LeaseList, LeaseMode, Problem, SessionInfo,
};
use baton_client::{AcquireOptions, Client};
use baton_tests::{
    json, mentions_number, poll_until, Api, Cluster, HttpReply, Node, Value, POLL_INTERVAL,
};
use futures_util::future::join_all;

use crate::cli::{baton, url};

/// A TTL no session of these tests outlives unless a test means it to.
const TTL_MS: u64 = 30_000;
/// The agents contending for the semaphore.
const AGENTS: usize = 8;
/// The semaphore's limit in the contention test.
const LIMIT: usize = 3;
/// How long the agents contend.
const CONTENTION: Duration = Duration::from_secs(5);
/// The bound on the whole contention (agents and watcher), well above `CONTENTION`.
const CONTENTION_TIMEOUT: Duration = Duration::from_secs(30);
/// The bound on a lapsed holder losing its place and a waiter getting it.
const EXPIRY_TIMEOUT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// Contention
// ---------------------------------------------------------------------------------------------

/// What one agent of the contention test did.
#[derive(Debug)]
struct AgentReport {
    agent: usize,
    /// Each grant's fence, when its acquire was sent and when its answer came, in order.
    grants: Vec<(u64, Instant, Instant)>,
    /// How many acquires were refused with `LEASE_HELD`.
    refused: usize,
    /// Any other answer to an acquire or a release (the agent stops at the first).
    unexpected: Vec<String>,
}

#[tokio::test]
async fn eight_agents_never_hold_a_semaphore_of_three_more_than_three_at_once() {
    const POOL: &str = "gpus/pool";
    let cluster = Cluster::start(3).await;
    let api = cluster.api();
    let nodes = cluster.nodes();
    let follower = cluster.followers().await[0];
    let mut agents = Vec::new();
    for agent in 0..AGENTS {
        let node = &nodes[agent % nodes.len()];
        let session = new_session(api, node, &format!("agent-{agent}"), TTL_MS).await;
        agents.push((node, session));
    }

    // The holders as the agents count them: from a grant's answer until just before its
    // release is sent, an agent surely holds its place, so this never exceeds what the cluster
    // counts.
    let holding = Cell::new(0_usize);
    let peak = Cell::new(0_usize);
    let done = Cell::new(false);
    let deadline = Instant::now() + CONTENTION;
    let contenders = agents.iter().enumerate().map(|(agent, (node, session))| {
        let (holding, peak) = (&holding, &peak);
        async move {
            let name = format!("agent-{agent}");
            let mut report = AgentReport {
                agent,
                grants: Vec::new(),
                refused: 0,
                unexpected: Vec::new(),
            };
            let mut round = 0;
            while Instant::now() < deadline {
                round += 1;
                let sent = Instant::now();
                let reply = acquire(
                    api,
                    node,
                    json!({"resource": POOL, "session_id": session, "mode": "shared",
                           "limit": LIMIT}),
                )
                .await;
                match (reply.status, reply.code()) {
                    (201, _) => {
                        let grant: Grant = reply.parse();
                        holding.set(holding.get() + 1);
                        peak.set(peak.get().max(holding.get()));
                        assert!(
                            holding.get() <= LIMIT,
                            "{} agents hold a semaphore of {LIMIT}: {name} was just granted \
                             fence {}",
                            holding.get(),
                            grant.fence
                        );
                        report.grants.push((grant.fence, sent, Instant::now()));
                        // The work done under the semaphore (a pause of the workload, not a
                        // wait for a state).
                        tokio::time::sleep(jitter(agent, round, 50..150)).await;
                        holding.set(holding.get() - 1);
                        let released = release(api, node, session, POOL).await;
                        if released.status != 200 {
                            report.unexpected.push(released.to_string());
                            return report;
                        }
                    }
                    (409, Some("LEASE_HELD")) => {
                        // Full: the oldest holder is named, all three are listed, and never
                        // this agent itself, which released before acquiring again.
                        let held_by = reply.parse::<Problem>().held_by;
                        let fits = held_by.as_ref().is_some_and(|held_by| {
                            held_by.holder != name
                                && held_by.holders_total == Some(LIMIT as u32)
                                && held_by.holders.len() == LIMIT
                        });
                        if !fits {
                            report.unexpected.push(reply.to_string());
                            return report;
                        }
                        report.refused += 1;
                        tokio::time::sleep(jitter(agent, round, 20..50)).await;
                    }
                    _ => {
                        report.unexpected.push(reply.to_string());
                        return report;
                    }
                }
            }
            report
        }
    });
    // A watcher lists the path's holders through a follower all along.
    let watcher = async {
        let (mut polls, mut most) = (0, 0);
        while !done.get() {
            let holders = holders_of(&list(api, follower, "gpus/").await, POOL);
            assert!(
                holders.len() <= LIMIT,
                "a follower lists {} holders of a semaphore of {LIMIT}: {holders:?}",
                holders.len()
            );
            let fences: BTreeSet<u64> = holders.iter().map(|(_, fence)| *fence).collect();
            assert_eq!(
                fences.len(),
                holders.len(),
                "a fence listed twice: {holders:?}"
            );
            most = most.max(holders.len());
            polls += 1;
            tokio::time::sleep(POLL_INTERVAL).await;
        }
        (polls, most)
    };
    let started = Instant::now();
    let (reports, (polls, most)) = tokio::time::timeout(CONTENTION_TIMEOUT, async {
        tokio::join!(
            async {
                let reports = join_all(contenders).await;
                done.set(true);
                reports
            },
            watcher
        )
    })
    .await
    .expect("the agents and the watcher finish in time");
    let grants: usize = reports.iter().map(|report| report.grants.len()).sum();
    let refused: usize = reports.iter().map(|report| report.refused).sum();
    eprintln!(
        "{grants} grants and {refused} LEASE_HELD refusals in {:?}; at most {} held at once by \
         the agents' count, {most} in {polls} lists through node {}",
        started.elapsed(),
        peak.get(),
        follower.id
    );

    for report in &reports {
        assert!(
            report.unexpected.is_empty(),
            "agent {} got an answer other than a grant or LEASE_HELD: {:?}",
            report.agent,
            report.unexpected
        );
        assert!(
            !report.grants.is_empty(),
            "agent {} never got the semaphore in {CONTENTION:?} ({} refusals)",
            report.agent,
            report.refused
        );
        for pair in report.grants.windows(2) {
            assert!(
                pair[0].0 < pair[1].0,
                "agent {}'s fences do not rise: {:?}",
                report.agent,
                report.grants
            );
        }
    }
    assert!(grants > LIMIT, "only {grants} grants in all");
    // Fences rise in real time too: a grant answered before another's acquire was sent has
    // the lower fence.
    let all: Vec<&(u64, Instant, Instant)> = reports
        .iter()
        .flat_map(|report| report.grants.iter())
        .collect();
    for earlier in &all {
        for later in &all {
            assert!(
                earlier.2 >= later.1 || earlier.0 < later.0,
                "fence {} was answered before the acquire of fence {} was sent",
                earlier.0,
                later.0
            );
        }
    }
    assert_eq!(peak.get(), LIMIT, "the semaphore was never full");
    assert!(polls > 0, "the watcher never listed");

    // The event stream: the grants with strictly rising fences, each exactly one the agents
    // were answered, and never more than three holding by its own account.
    let mut event_fences = Vec::new();
    let mut live = BTreeSet::new();
    for event in api.events_after(&nodes[0], 0).await {
        match event.kind {
            EventKind::Granted {
                resource,
                fence,
                mode,
                ..
            } if resource == POOL => {
                assert_eq!(mode, LeaseMode::Shared, "revision {}", event.revision);
                assert!(
                    event_fences.last().is_none_or(|last| *last < fence),
                    "fence {fence} granted after {event_fences:?} (revision {})",
                    event.revision
                );
                event_fences.push(fence);
                live.insert(fence);
                assert!(
                    live.len() <= LIMIT,
                    "the events hold {live:?} at once (revision {})",
                    event.revision
                );
            }
            EventKind::Released { resource, fence } if resource == POOL => {
                assert!(
                    live.remove(&fence),
                    "fence {fence} released while not held (revision {})",
                    event.revision
                );
            }
            EventKind::Expired { resource, fence } if resource == POOL => {
                panic!("fence {fence} expired (revision {})", event.revision)
            }
            _ => {}
        }
    }
    assert!(live.is_empty(), "never released: {live:?}");
    let mut answered: Vec<u64> = reports
        .iter()
        .flat_map(|report| report.grants.iter().map(|(fence, _, _)| *fence))
        .collect();
    answered.sort_unstable();
    assert_eq!(
        answered, event_fences,
        "the fences answered are not exactly the fences granted in the event stream"
    );
    assert!(
        holders_of(&list(api, follower, "gpus/").await, POOL).is_empty(),
        "a holder is left"
    );
}

// ---------------------------------------------------------------------------------------------
// Refusals
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_full_semaphore_refuses_with_its_holders_and_a_refusal_changes_nothing() {
    const PARENT: &str = "ci/runners";
    const PATH: &str = "ci/runners/linux";
    const FREE: &str = "ci/runners/macos";
    let cluster = Cluster::start(3).await;
    let api = cluster.api();
    let nodes = cluster.nodes();
    let leader = cluster.leader().await;
    let followers = cluster.followers().await;
    let shared = |holder: &str, limit: u32| {
        json!({"resource": PATH, "mode": "shared", "limit": limit, "holder": holder,
               "ttl_ms": TTL_MS})
    };

    // Three holders, each through another node, each with its own rising fence.
    let mut holders: Vec<Grant> = Vec::new();
    for (node, name) in nodes.iter().zip(["first", "second", "third"]) {
        let reply = acquire(api, node, shared(name, 3)).await;
        let grant: Grant = reply.expect_json(201);
        assert_eq!(
            (grant.resource.as_str(), grant.mode, grant.limit),
            (PATH, LeaseMode::Shared, Some(3)),
            "{reply}"
        );
        if let Some(last) = holders.last() {
            assert!(grant.fence > last.fence, "{reply} after {last:?}");
        }
        holders.push(grant);
    }
    let [first, second, third] = [&holders[0], &holders[1], &holders[2]];
    let sessions: Vec<String> = holders
        .iter()
        .map(|grant| grant.session_id.as_str().to_owned())
        .collect();
    // A read answers the oldest holder; the list answers every one.
    let lease: Lease = api
        .get(followers[0], &format!("/v1/leases/{PATH}"))
        .await
        .expect_json(200);
    assert_eq!(
        (lease.holder.as_str(), lease.fence, lease.mode, lease.limit),
        ("first", first.fence, LeaseMode::Shared, Some(3))
    );
    let before = Snapshot::take(api, followers[1]).await;
    assert_eq!(
        before.leases,
        holders
            .iter()
            .map(|grant| (
                PATH.to_owned(),
                grant.fence,
                grant.holder.clone(),
                LeaseMode::Shared,
                Some(3)
            ))
            .collect::<Vec<_>>()
    );
    let unchanged = |what: &'static str| {
        let before = &before;
        async move {
            for node in nodes {
                assert_eq!(
                    &Snapshot::take(api, node).await,
                    before,
                    "{what} changed something (as node {} sees it)",
                    node.id
                );
            }
        }
    };

    // The fourth: the oldest holder, all three holders and their total.
    let reply = acquire(api, followers[0], shared("fourth", 3)).await;
    let problem = reply.expect_problem(409, ErrorCode::LeaseHeld);
    let held_by = problem.held_by.clone().expect("LEASE_HELD carries held_by");
    assert_eq!(
        (
            held_by.holder.as_str(),
            held_by.resource.as_str(),
            held_by.mode,
            held_by.limit,
            held_by.fence
        ),
        ("first", PATH, LeaseMode::Shared, Some(3), first.fence),
        "{reply}"
    );
    assert_eq!(
        held_by
            .holders
            .iter()
            .map(|holder| (holder.holder.as_str(), holder.fence))
            .collect::<Vec<_>>(),
        [
            ("first", first.fence),
            ("second", second.fence),
            ("third", third.fence)
        ],
        "{reply}"
    );
    for holder in &held_by.holders {
        assert!(
            holder.expires_in_ms > 0 && holder.expires_in_ms <= TTL_MS,
            "{reply}"
        );
        assert!(
            !holder.acquired_at.is_empty() && !holder.expires_at.is_empty(),
            "{reply}"
        );
    }
    assert_eq!(held_by.holders_total, Some(3), "{reply}");
    assert!(problem.message.contains(PATH), "{reply}");
    for session in &sessions {
        assert!(
            !reply.text.contains(session.as_str()),
            "a refusal leaks a session id: {reply}"
        );
    }
    unchanged("the fourth acquire").await;

    // A holder's own second acquire names itself.
    let reply = acquire(
        api,
        leader,
        json!({"resource": PATH, "session_id": sessions[1], "mode": "shared", "limit": 3}),
    )
    .await;
    let held_by = reply
        .expect_problem(409, ErrorCode::LeaseHeld)
        .held_by
        .expect("held_by");
    assert_eq!(
        (
            held_by.holder.as_str(),
            held_by.fence,
            held_by.holders_total
        ),
        ("second", second.fence, Some(3)),
        "{reply}"
    );
    unchanged("a holder's second acquire").await;

    // Another limit while holders are live, from a newcomer or from a holder.
    for limit in [2, 4] {
        let reply = acquire(api, followers[1], shared("fourth", limit)).await;
        let problem = reply.expect_problem(400, ErrorCode::InvalidArgument);
        assert!(problem.message.contains(PATH), "{reply}");
        let reply = acquire(
            api,
            leader,
            json!({"resource": PATH, "session_id": sessions[2], "mode": "shared",
                   "limit": limit}),
        )
        .await;
        reply.expect_problem(400, ErrorCode::InvalidArgument);
    }
    unchanged("another limit").await;

    // Limits out of bounds, a limit without `shared`, `shared` without a limit: on the held
    // path and on a free one alike.
    for resource in [PATH, FREE] {
        let bodies = [
            json!({"resource": resource, "mode": "shared", "limit": 0}),
            json!({"resource": resource, "mode": "shared", "limit": 1025}),
            json!({"resource": resource, "mode": "exclusive", "limit": 3}),
            json!({"resource": resource, "limit": 3}),
            json!({"resource": resource, "mode": "subtree", "limit": 3}),
            json!({"resource": resource, "mode": "shared"}),
        ];
        for mut body in bodies {
            body["holder"] = json!("fifth");
            body["ttl_ms"] = json!(TTL_MS);
            let reply = acquire(api, followers[0], body.clone()).await;
            assert_eq!(
                reply.code(),
                Some("INVALID_ARGUMENT"),
                "{body} was not refused as invalid: {reply}"
            );
            reply.expect_problem(400, ErrorCode::InvalidArgument);
        }
    }
    unchanged("an invalid limit").await;

    // Exclusive and subtree leases conflict with the holders as one set: the oldest is named.
    for (mode, resource) in [("exclusive", PATH), ("subtree", PATH), ("subtree", PARENT)] {
        let reply = acquire(
            api,
            followers[1],
            json!({"resource": resource, "mode": mode, "holder": "sixth", "ttl_ms": TTL_MS}),
        )
        .await;
        let held_by = reply
            .expect_problem(409, ErrorCode::LeaseHeld)
            .held_by
            .unwrap_or_else(|| panic!("no held_by: {reply}"));
        assert_eq!(
            (
                held_by.resource.as_str(),
                held_by.mode,
                held_by.fence,
                held_by.holders_total
            ),
            (PATH, LeaseMode::Shared, first.fence, Some(3)),
            "{mode} {resource}: {reply}"
        );
    }
    unchanged("an exclusive or subtree acquire").await;

    // A release frees a place at once: the fourth gets it, with a higher fence.
    release(api, &nodes[1], &sessions[1], PATH)
        .await
        .expect_status(200);
    let fourth: Grant = acquire(api, followers[0], shared("fourth", 3))
        .await
        .expect_json(201);
    assert!(fourth.fence > third.fence, "{fourth:?} after {third:?}");
    assert_eq!(
        holders_of(&list(api, followers[1], PARENT).await, PATH),
        [
            ("first".to_owned(), first.fence),
            ("third".to_owned(), third.fence),
            ("fourth".to_owned(), fourth.fence)
        ]
    );
    // With the oldest gone, a read answers the next one.
    release(api, leader, &sessions[0], PATH)
        .await
        .expect_status(200);
    let lease: Lease = api
        .get(followers[1], &format!("/v1/leases/{PATH}"))
        .await
        .expect_json(200);
    assert_eq!((lease.holder.as_str(), lease.fence), ("third", third.fence));

    // Once every holder is gone, another limit is taken, and then it is the one in force.
    release(api, followers[0], &sessions[2], PATH)
        .await
        .expect_status(200);
    release(api, followers[1], fourth.session_id.as_str(), PATH)
        .await
        .expect_status(200);
    api.get(leader, &format!("/v1/leases/{PATH}"))
        .await
        .expect_problem(404, ErrorCode::NotFound);
    let reply = acquire(api, followers[0], shared("seventh", 5)).await;
    let seventh: Grant = reply.expect_json(201);
    assert_eq!(seventh.limit, Some(5), "{reply}");
    assert!(seventh.fence > fourth.fence);
    acquire(api, leader, shared("eighth", 3))
        .await
        .expect_problem(400, ErrorCode::InvalidArgument);
    // The largest limit is taken.
    let widest: Grant = acquire(
        api,
        leader,
        json!({"resource": FREE, "mode": "shared", "limit": 1024, "holder": "ninth",
               "ttl_ms": TTL_MS}),
    )
    .await
    .expect_json(201);
    assert_eq!(widest.limit, Some(1024));

    // A shared acquire is refused by an exclusive lease on the path and by a subtree lease
    // above it, and changes nothing either.
    let exclusive: Grant = acquire(
        api,
        leader,
        json!({"resource": "ci/deploy", "holder": "deployer", "ttl_ms": TTL_MS}),
    )
    .await
    .expect_json(201);
    let subtree: Grant = acquire(
        api,
        leader,
        json!({"resource": "ci/cache", "mode": "subtree", "holder": "cleaner",
               "ttl_ms": TTL_MS}),
    )
    .await
    .expect_json(201);
    let before = Snapshot::take(api, leader).await;
    for (resource, in_the_way) in [
        ("ci/deploy", &exclusive),
        ("ci/cache", &subtree),
        ("ci/cache/objects", &subtree),
    ] {
        let reply = acquire(
            api,
            followers[0],
            json!({"resource": resource, "mode": "shared", "limit": 3, "holder": "reader",
                   "ttl_ms": TTL_MS}),
        )
        .await;
        let held_by = reply
            .expect_problem(409, ErrorCode::LeaseHeld)
            .held_by
            .unwrap_or_else(|| panic!("no held_by: {reply}"));
        assert_eq!(
            (
                held_by.resource.as_str(),
                held_by.mode,
                held_by.fence,
                held_by.holders_total
            ),
            (
                in_the_way.resource.as_str(),
                in_the_way.mode,
                in_the_way.fence,
                None
            ),
            "{resource}: {reply}"
        );
    }
    assert_eq!(
        Snapshot::take(api, followers[1]).await,
        before,
        "a refused shared acquire changed something"
    );
}

// ---------------------------------------------------------------------------------------------
// Fences
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn any_live_holders_fence_is_current_and_guards_a_write_with_its_own_session_only() {
    const PATH: &str = "db/replicas";
    const KEY: &str = "db/replicas/config";
    let cluster = Cluster::start(3).await;
    let api = cluster.api();
    let nodes = cluster.nodes();
    let mut holders: Vec<(Grant, String)> = Vec::new();
    for (node, name) in nodes.iter().zip(["reader-a", "reader-b"]) {
        let grant: Grant = acquire(
            api,
            node,
            json!({"resource": PATH, "mode": "shared", "limit": 2, "holder": name,
                   "ttl_ms": TTL_MS}),
        )
        .await
        .expect_json(201);
        let session = grant.session_id.as_str().to_owned();
        holders.push((grant, session));
    }
    let [(a, session_a), (b, session_b)] = [&holders[0], &holders[1]];

    // Each holder's session lists its hold, as shared.
    let info: SessionInfo = api
        .get(&nodes[2], &format!("/v1/sessions/{session_b}"))
        .await
        .expect_json(200);
    assert_eq!(
        info.leases
            .iter()
            .map(|lease| (
                lease.resource.as_str(),
                lease.fence,
                lease.mode,
                lease.limit
            ))
            .collect::<Vec<_>>(),
        [(PATH, b.fence, LeaseMode::Shared, Some(2))]
    );

    // Both fences are current, on every node; another number is not (the oldest is named).
    for node in nodes {
        assert_eq!(
            fence_check(api, node, PATH, a.fence).await,
            (true, Some(a.fence))
        );
        assert_eq!(
            fence_check(api, node, PATH, b.fence).await,
            (true, Some(b.fence))
        );
        assert_eq!(
            fence_check(api, node, PATH, b.fence + 100).await,
            (false, Some(a.fence))
        );
    }

    // A fenced write with a holder's fence and that holder's session lands.
    let fenced = |value: &str, token: u64, session: &str| {
        json!({"value": value, "fence": {"resource": PATH, "token": token},
               "session_id": session})
    };
    let by_a: KvPutResponse = put(api, &nodes[2], KEY, fenced("by a", a.fence, session_a))
        .await
        .expect_json(200);
    let entry = get(api, &nodes[0], KEY).await;
    assert_eq!(
        (entry.value, entry.revision, entry.fence),
        (
            json!("by a"),
            by_a.revision,
            Some(FenceRef {
                resource: PATH.to_owned(),
                token: a.fence
            })
        )
    );
    let by_b: KvPutResponse = put(api, &nodes[1], KEY, fenced("by b", b.fence, session_b))
        .await
        .expect_json(200);
    assert!(by_b.revision > by_a.revision);

    // A holder's fence with the other holder's session is refused, either way round.
    for (token, session) in [(a.fence, session_b), (b.fence, session_a)] {
        let reply = put(api, &nodes[0], KEY, fenced("borrowed", token, session)).await;
        let problem = reply.expect_problem(409, ErrorCode::StaleFence);
        assert!(
            problem
                .current_fence
                .is_some_and(|fence| fence == a.fence || fence == b.fence),
            "STALE_FENCE names a live holder's fence: {reply}"
        );
    }
    let entry = get(api, &nodes[2], KEY).await;
    assert_eq!(
        (entry.value, entry.revision),
        (json!("by b"), by_b.revision),
        "a refused write changed the value"
    );

    // A released holder's fence is no longer current, nor good for a write; the other's is.
    release(api, &nodes[0], session_a, PATH)
        .await
        .expect_status(200);
    for node in nodes {
        assert_eq!(
            fence_check(api, node, PATH, a.fence).await,
            (false, Some(b.fence))
        );
        assert_eq!(
            fence_check(api, node, PATH, b.fence).await,
            (true, Some(b.fence))
        );
    }
    let reply = put(api, &nodes[1], KEY, fenced("late", a.fence, session_a)).await;
    reply.expect_problem(409, ErrorCode::StaleFence);
    let entry = get(api, &nodes[0], KEY).await;
    assert_eq!(
        (entry.value, entry.revision),
        (json!("by b"), by_b.revision),
        "a released holder's write changed the value"
    );
    put(
        api,
        &nodes[2],
        KEY,
        fenced("by b again", b.fence, session_b),
    )
    .await
    .expect_status(200);
}

// ---------------------------------------------------------------------------------------------
// Expiry
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_holder_whose_session_lapses_loses_its_place_to_a_waiter() {
    const PATH: &str = "licenses/cad";
    let cluster = Cluster::start(3).await;
    let api = cluster.api();
    let nodes = cluster.nodes();
    let follower = cluster.followers().await[0];
    let revision = api.last_revision(&nodes[0]).await;

    // A holder that is never kept alive, and one that lives long.
    let lapsing: Grant = acquire(
        api,
        &nodes[0],
        json!({"resource": PATH, "mode": "shared", "limit": 2, "holder": "lapsing",
               "ttl_ms": 1_000}),
    )
    .await
    .expect_json(201);
    let granted_at = Instant::now();
    let steady: Grant = acquire(
        api,
        &nodes[1],
        json!({"resource": PATH, "mode": "shared", "limit": 2, "holder": "steady",
               "ttl_ms": TTL_MS}),
    )
    .await
    .expect_json(201);
    let reply = acquire(
        api,
        &nodes[2],
        json!({"resource": PATH, "mode": "shared", "limit": 2, "holder": "waiter",
               "ttl_ms": TTL_MS}),
    )
    .await;
    let held_by = reply
        .expect_problem(409, ErrorCode::LeaseHeld)
        .held_by
        .expect("held_by");
    assert_eq!(
        (held_by.fence, held_by.holders_total),
        (lapsing.fence, Some(2))
    );

    // A waiter through the client crate, while a follower's list is watched for the lapsed
    // holder to go.
    let client = Client::builder(nodes.iter().map(Node::api_url))
        .holder("waiter")
        .build()
        .expect("a client");
    let waiting = async {
        let guard = client
            .acquire(
                PATH,
                AcquireOptions::new()
                    .shared(2)
                    .ttl(Duration::from_secs(30))
                    .wait(EXPIRY_TIMEOUT),
            )
            .await
            .expect("the waiter gets the place");
        (guard, granted_at.elapsed())
    };
    let gone = poll_until(EXPIRY_TIMEOUT, "the lapsed holder to go", async || {
        let holders = holders_of(&list(api, follower, "licenses/").await, PATH);
        assert!(holders.len() <= 2, "over the limit: {holders:?}");
        (!holders.contains(&("lapsing".to_owned(), lapsing.fence))).then_some(holders)
    });
    let ((guard, waited), _) = tokio::join!(waiting, gone);
    eprintln!(
        "the waiter got fence {} {waited:?} after the lapsing holder's grant",
        guard.fence()
    );
    // The lapsing session's TTL (1 s) ran from its grant, before `granted_at`; half of it is a
    // bound that no scheduling delay makes flaky.
    assert!(
        waited >= Duration::from_millis(500),
        "the place was given {waited:?} after the lapsing holder's grant, before its TTL ran out"
    );
    assert_eq!(
        (guard.mode(), guard.grant().limit),
        (LeaseMode::Shared, Some(2))
    );
    assert!(guard.fence() > steady.fence);
    assert_eq!(
        holders_of(&list(api, follower, "licenses/").await, PATH),
        [
            ("steady".to_owned(), steady.fence),
            ("waiter".to_owned(), guard.fence())
        ]
    );
    api.get(
        follower,
        &format!("/v1/sessions/{}", lapsing.session_id.as_str()),
    )
    .await
    .expect_problem(404, ErrorCode::NotFound);

    // The stream tells: the lapsed holder expired, named by path and fence; nobody else did.
    let expired: Vec<u64> = api
        .events_after(follower, revision)
        .await
        .into_iter()
        .filter_map(|event| match event.kind {
            EventKind::Expired { resource, fence } if resource == PATH => Some(fence),
            _ => None,
        })
        .collect();
    assert_eq!(expired, [lapsing.fence]);
    guard.release().await.expect("release the waiter's place");
}

// ---------------------------------------------------------------------------------------------
// The command line
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn baton_acquire_shared_exits_as_documented() {
    const PATH: &str = "builds/slots";
    let cluster = Cluster::start(1).await;
    let endpoints = url(&cluster);
    let api = cluster.api();
    let node = cluster.node(1);

    // Two invocations, two sessions, two places, each printing its own fence.
    let mut fences = Vec::new();
    let mut sessions = Vec::new();
    for _ in 0..2 {
        let granted = baton(&endpoints, &["acquire", PATH, "--shared", "2"]).await;
        granted.expect_code(0);
        let line = granted.stdout.trim();
        assert!(
            line.starts_with(&format!("acquired {PATH} fence=")),
            "{granted:#?}"
        );
        let field = |name: &str| {
            line.split_whitespace()
                .find_map(|word| word.strip_prefix(name))
                .unwrap_or_else(|| panic!("no {name}: {granted:#?}"))
                .to_owned()
        };
        fences.push(field("fence=").parse::<u64>().expect("a fence"));
        sessions.push(field("session="));
    }
    assert!(fences[0] < fences[1], "{fences:?}");
    assert_ne!(sessions[0], sessions[1]);
    let before = Snapshot::take(api, node).await;
    assert_eq!(
        before.leases,
        fences
            .iter()
            .map(|fence| (
                PATH.to_owned(),
                *fence,
                "tester".to_owned(),
                LeaseMode::Shared,
                Some(2)
            ))
            .collect::<Vec<_>>()
    );

    // Full: exit 4, the error line names the oldest holder's fence, nothing on stdout.
    let full = baton(&endpoints, &["acquire", PATH, "--shared", "2"]).await;
    full.expect_code(4);
    assert!(
        full.error_line().starts_with("error[LEASE_HELD]"),
        "{full:#?}"
    );
    assert!(mentions_number(full.error_line(), fences[0]), "{full:#?}");
    assert!(full.stdout.is_empty(), "{full:#?}");
    // Another limit is the server's INVALID_ARGUMENT, and --shared with --subtree a usage
    // error: both exit 2.
    let other = baton(&endpoints, &["acquire", PATH, "--shared", "3"]).await;
    other.expect_code(2);
    assert!(
        other.error_line().starts_with("error[INVALID_ARGUMENT]"),
        "{other:#?}"
    );
    let both = baton(&endpoints, &["acquire", PATH, "--shared", "2", "--subtree"]).await;
    both.expect_code(2);
    assert!(!both.stderr.is_empty(), "{both:#?}");
    assert!(both.stdout.is_empty(), "{both:#?}");
    let zero = baton(&endpoints, &["acquire", "builds/other", "--shared", "0"]).await;
    zero.expect_code(2);
    assert_eq!(
        Snapshot::take(api, node).await,
        before,
        "a refused baton acquire changed something"
    );

    // --json prints the grant, with its mode and limit.
    let grant: Grant = baton(
        &endpoints,
        &["--json", "acquire", "builds/cache", "--shared", "4"],
    )
    .await
    .expect_code(0)
    .json();
    assert_eq!(
        (grant.mode, grant.limit, grant.fence > fences[1]),
        (LeaseMode::Shared, Some(4), true)
    );
}

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// What a refusal must leave as it was: every live lease (resource, fence, holder, mode,
/// limit; not the remaining times, which run on) and the revision of the last event.
#[derive(Debug, PartialEq, Eq)]
struct Snapshot {
    leases: Vec<(String, u64, String, LeaseMode, Option<u32>)>,
    revision: u64,
}

impl Snapshot {
    async fn take(api: &Api, node: &Node) -> Snapshot {
        Snapshot {
            leases: list(api, node, "")
                .await
                .leases
                .into_iter()
                .map(|lease| {
                    (
                        lease.resource,
                        lease.fence,
                        lease.holder,
                        lease.mode,
                        lease.limit,
                    )
                })
                .collect(),
            revision: api.last_revision(node).await,
        }
    }
}

/// A pause in `range` (ms) that differs between agents and rounds.
fn jitter(agent: usize, round: u64, range: Range<u64>) -> Duration {
    let mut mixed = (agent as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ round;
    mixed ^= mixed >> 29;
    mixed = mixed.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    mixed ^= mixed >> 32;
    Duration::from_millis(range.start + mixed % (range.end - range.start + 1))
}

async fn acquire(api: &Api, node: &Node, body: Value) -> HttpReply {
    api.post(node, "/v1/leases", &body).await
}

async fn release(api: &Api, node: &Node, session: &str, resource: &str) -> HttpReply {
    api.post(
        node,
        &format!("/v1/sessions/{session}/release"),
        &json!({"resource": resource}),
    )
    .await
}

/// One page of the live leases under `prefix` (these tests hold far fewer than a page).
async fn list(api: &Api, node: &Node, prefix: &str) -> LeaseList {
    let reply = api.get(node, &format!("/v1/leases?prefix={prefix}")).await;
    assert!(
        !reply.text.contains("session_id"),
        "a list leaks session ids: {reply}"
    );
    let list: LeaseList = reply.expect_json(200);
    assert_eq!(list.next_cursor, None, "{reply}");
    list
}

/// The (holder, fence) of every lease listed on exactly `resource`, in list order.
fn holders_of(list: &LeaseList, resource: &str) -> Vec<(String, u64)> {
    list.leases
        .iter()
        .filter(|lease| lease.resource == resource)
        .map(|lease| (lease.holder.clone(), lease.fence))
        .collect()
}

async fn fence_check(api: &Api, node: &Node, resource: &str, fence: u64) -> (bool, Option<u64>) {
    let answer: FenceCheckResponse = api
        .post(
            node,
            "/v1/fence/check",
            &json!({"resource": resource, "fence": fence}),
        )
        .await
        .expect_json(200);
    (answer.current, answer.fence)
}

async fn put(api: &Api, node: &Node, key: &str, body: Value) -> HttpReply {
    api.put(node, &format!("/v1/kv/{key}"), &body).await
}

async fn get(api: &Api, node: &Node, key: &str) -> KvEntry {
    api.get(node, &format!("/v1/kv/{key}"))
        .await
        .expect_json(200)
}
