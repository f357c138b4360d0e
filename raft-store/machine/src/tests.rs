//! Table-driven tests of every rule of the machine. Each table is a list of steps
//! `(stamp_ms, op, expected)`; `check` applies each step as a one-command entry, checks the
//! invariants, and compares the response rendered as a short line with the expectation.

use super::types::{validate_holder, validate_labels};
use super::*;

const A: u128 = 1;
const B: u128 = 2;
const C: u128 = 3;

fn namespace() -> Namespace {
    Namespace::default_namespace()
}

fn path(text: &str) -> ResourcePath {
    ResourcePath::new(text).expect("a well-formed path")
}

fn new_session(session: u128, holder: &str, ttl_ms: u64) -> NewSession {
    NewSession {
        session_id: SessionId(session),
        holder: holder.to_owned(),
        ttl_ms,
        labels: Labels::new(),
    }
}

fn create(session: u128, holder: &str, ttl_ms: u64) -> Op {
    Op::CreateSession(new_session(session, holder, ttl_ms))
}

fn acquire_as(session: u128, resource: &str, mode: LeaseMode) -> Op {
    Op::Acquire {
        resource: path(resource),
        mode,
        owner: Owner::Session(SessionId(session)),
        max_hold_ms: None,
        labels: Labels::new(),
    }
}

fn acquire(session: u128, resource: &str) -> Op {
    acquire_as(session, resource, LeaseMode::Exclusive)
}

fn acquire_subtree(session: u128, resource: &str) -> Op {
    acquire_as(session, resource, LeaseMode::Subtree)
}

fn acquire_new(session: u128, holder: &str, ttl_ms: u64, resource: &str) -> Op {
    Op::Acquire {
        resource: path(resource),
        mode: LeaseMode::Exclusive,
        owner: Owner::NewSession(new_session(session, holder, ttl_ms)),
        max_hold_ms: None,
        labels: Labels::new(),
    }
}

fn acquire_max_hold(session: u128, resource: &str, max_hold_ms: u64) -> Op {
    Op::Acquire {
        resource: path(resource),
        mode: LeaseMode::Exclusive,
        owner: Owner::Session(SessionId(session)),
        max_hold_ms: Some(max_hold_ms),
        labels: Labels::new(),
    }
}

fn keepalive(session: u128) -> Op {
    Op::Keepalive {
        session_id: SessionId(session),
    }
}

fn release(session: u128, resource: &str) -> Op {
    Op::Release {
        session_id: SessionId(session),
        resource: path(resource),
    }
}

fn end(session: u128) -> Op {
    Op::EndSession {
        session_id: SessionId(session),
    }
}

fn fence(session: u128, resource: &str, fence: u64) -> Option<ResourceFence> {
    Some(ResourceFence {
        resource: path(resource),
        fence,
        session_id: SessionId(session),
    })
}

fn put(key: &str, value: &str, fence: Option<ResourceFence>) -> Op {
    Op::KvPut {
        key: path(key),
        value: value.to_owned(),
        fence,
    }
}

fn delete(key: &str, fence: Option<ResourceFence>) -> Op {
    Op::KvDelete {
        key: path(key),
        fence,
    }
}

fn command(op: Op) -> Command {
    Command::Namespaced {
        namespace: namespace(),
        idempotency: None,
        op,
    }
}

/// One response as a short line: `granted fence=1 expires_in=1000`, `LEASE_HELD a fence=1 ...`.
fn render(response: &Response) -> String {
    let line = match &response.outcome {
        Ok(Reply::SessionCreated(view)) => format!("session expires_in={}", view.expires_in_ms),
        Ok(Reply::KeptAlive { expires_in_ms, .. }) => {
            format!("kept_alive expires_in={expires_in_ms}")
        }
        Ok(Reply::Released { fence, .. }) => format!("released fence={fence}"),
        Ok(Reply::SessionEnded { released }) => {
            let released: Vec<&str> = released.iter().map(ResourcePath::as_str).collect();
            format!("ended [{}]", released.join(","))
        }
        Ok(Reply::Granted(grant)) => format!(
            "granted fence={} expires_in={}",
            grant.lease.fence, grant.lease.expires_in_ms
        ),
        Ok(Reply::StillGranted(grant)) => format!(
            "still granted fence={} expires_in={}",
            grant.lease.fence, grant.lease.expires_in_ms
        ),
        Ok(Reply::KvWritten { revision }) => format!("written rev={revision}"),
        Ok(Reply::KvDeleted { revision }) => format!("deleted rev={revision}"),
        Ok(Reply::Swept {
            leases,
            sessions,
            tasks,
        }) => {
            format!("swept leases={leases} sessions={sessions} tasks={tasks}")
        }
        Ok(Reply::LimitsSet) => "limits_set".to_owned(),
        Ok(Reply::TokenCreated(token)) => {
            format!("token {} {}", token.name, token.role.as_str())
        }
        Ok(Reply::TokenRevoked { name }) => format!("revoked {name}"),
        Ok(Reply::TokenBootstrapped { created }) => format!("bootstrapped created={created}"),
        Ok(Reply::TaskEnqueued(task)) => format!("enqueued {}", task.id),
        Ok(Reply::TaskClaimed(claimed)) => {
            format!(
                "claimed {} fence={} attempt={}",
                claimed.task.id, claimed.fence, claimed.attempt
            )
        }
        Ok(Reply::QueueEmpty) => "empty".to_owned(),
        Ok(Reply::Queued(queued)) if queued.joined => {
            format!("queued position={}", queued.position)
        }
        Ok(Reply::Queued(queued)) => format!("still queued position={}", queued.position),
        Ok(Reply::LeftLine { resource }) => format!("left the line of {resource}"),
        Ok(Reply::TxnDone { succeeded, results }) => {
            let results: Vec<String> = results
                .iter()
                .map(|reply| render(&Response::fresh(Ok(reply.clone()))))
                .collect();
            format!("txn succeeded={succeeded} [{}]", results.join("; "))
        }
        Ok(Reply::TaskUpdated(task)) => {
            format!("task {} {:?} attempt={}", task.id, task.state, task.attempt)
        }
        Err(Rejection::LeaseHeld { held_by, .. }) => {
            format!(
                "LEASE_HELD {} fence={} expires_in={}",
                held_by.holder, held_by.fence, held_by.expires_in_ms
            )
        }
        Err(Rejection::StaleFence { current_fence, .. }) => match current_fence {
            Some(current) => format!("STALE_FENCE current={current}"),
            None => "STALE_FENCE current=none".to_owned(),
        },
        Err(rejection) => rejection.code().to_owned(),
    };
    if response.replayed.is_some() {
        format!("replay {line}")
    } else {
        line
    }
}

/// Applies a command at a stamp, checks the invariants and returns the rendered response.
fn step(machine: &mut Machine, stamp_ms: u64, command: Command) -> String {
    let responses = machine.apply(&Batch {
        stamp_ms,
        commands: vec![command],
    });
    machine
        .check_invariants()
        .unwrap_or_else(|broken| panic!("invariant broken: {broken}"));
    assert_eq!(responses.len(), 1);
    render(&responses[0])
}

fn check_on(machine: &mut Machine, steps: Vec<(u64, Op, &str)>) {
    for (index, (stamp_ms, op, expected)) in steps.into_iter().enumerate() {
        let rendered = step(machine, stamp_ms, command(op));
        assert_eq!(rendered, expected, "step {index} at t={stamp_ms}");
    }
}

fn check(steps: Vec<(u64, Op, &str)>) -> Machine {
    let mut machine = Machine::default();
    check_on(&mut machine, steps);
    machine
}

#[test]
fn conflicts_follow_g2_exactly() {
    use LeaseMode::{Exclusive as X, Subtree as S};
    let table = [
        // (held, held mode, wanted, wanted mode, conflicts)
        ("a/b", X, "a/b", X, true),
        ("a/b", X, "a/b", S, true),
        ("a/b", S, "a/b", X, true),
        ("a/b", S, "a/b", S, true),
        ("a", S, "a/b", X, true),
        ("a", S, "a/b/c", S, true),
        ("a/b/c", X, "a", S, true),
        ("a/b", S, "a", S, true),
        ("a", X, "a/b", X, false),
        ("a", X, "a/b", S, false),
        ("a/b", X, "a", X, false),
        ("a/b", S, "a", X, false),
        ("a/b", X, "a/bc", X, false),
        ("a/b", S, "a/bc", X, false),
        ("a/b", S, "a/bc", S, false),
        ("a/bc", X, "a/b", S, false),
        ("a/b", X, "a/c", S, false),
        ("ab", S, "a", S, false),
        ("a", S, "ab", X, false),
    ];
    for (held, held_mode, wanted, wanted_mode, conflicts) in table {
        let mut machine = Machine::default();
        step(&mut machine, 0, command(create(A, "agent-a", 10_000)));
        step(&mut machine, 0, command(create(B, "agent-b", 10_000)));
        assert_eq!(
            step(&mut machine, 0, command(acquire_as(A, held, held_mode))),
            "granted fence=1 expires_in=10000"
        );
        let expected = if conflicts {
            "LEASE_HELD agent-a fence=1 expires_in=10000"
        } else {
            "granted fence=2 expires_in=10000"
        };
        assert_eq!(
            step(&mut machine, 0, command(acquire_as(B, wanted, wanted_mode))),
            expected,
            "{held} ({held_mode:?}) then {wanted} ({wanted_mode:?})"
        );
    }
}

#[test]
fn lease_lifecycle_with_denial_keepalive_release_and_higher_fence() {
    check(vec![
        (0, create(A, "agent-a", 5_000), "session expires_in=5000"),
        (0, create(B, "agent-b", 5_000), "session expires_in=5000"),
        (
            100,
            acquire(A, "repo/src/auth.rs"),
            "granted fence=1 expires_in=4900",
        ),
        (
            200,
            acquire(B, "repo/src/auth.rs"),
            "LEASE_HELD agent-a fence=1 expires_in=4800",
        ),
        (
            300,
            acquire(A, "repo/src/auth.rs"),
            "LEASE_HELD agent-a fence=1 expires_in=4700",
        ),
        (1_000, keepalive(A), "kept_alive expires_in=5000"),
        (
            1_000,
            acquire(B, "repo/src/auth.rs"),
            "LEASE_HELD agent-a fence=1 expires_in=5000",
        ),
        (1_500, release(A, "repo/src/auth.rs"), "released fence=1"),
        (1_500, release(A, "repo/src/auth.rs"), "LEASE_LOST"),
        (
            1_500,
            acquire(B, "repo/src/auth.rs"),
            "granted fence=2 expires_in=3500",
        ),
    ]);
}

#[test]
fn acquire_can_create_its_session_and_a_refused_one_creates_none() {
    let machine = check(vec![
        (
            0,
            acquire_new(A, "agent-a", 2_000, "x"),
            "granted fence=1 expires_in=2000",
        ),
        (
            0,
            acquire_new(B, "agent-b", 2_000, "x"),
            "LEASE_HELD agent-a fence=1 expires_in=2000",
        ),
        (0, keepalive(B), "LEASE_LOST"),
        (0, acquire_new(B, "agent-b", 999, "y"), "INVALID_ARGUMENT"),
        (0, keepalive(B), "LEASE_LOST"),
    ]);
    assert_eq!(machine.counts(), (1, 1));
}

#[test]
fn expiry_happens_exactly_at_the_deadline() {
    let mut machine = check(vec![
        (0, create(A, "agent-a", 1_000), "session expires_in=1000"),
        (0, acquire(A, "r"), "granted fence=1 expires_in=1000"),
        (0, create(B, "agent-b", 10_000), "session expires_in=10000"),
        (
            999,
            acquire(B, "r"),
            "LEASE_HELD agent-a fence=1 expires_in=1",
        ),
        (1_000, keepalive(A), "LEASE_LOST"),
        (1_000, release(A, "r"), "LEASE_LOST"),
        (1_000, end(A), "NOT_FOUND"),
    ]);
    assert!(
        machine.lease(&namespace(), &path("r")).is_none(),
        "dead at the deadline, before any sweep"
    );
    let before = machine.revision(&namespace());
    check_on(
        &mut machine,
        vec![(1_000, acquire(B, "r"), "granted fence=2 expires_in=9000")],
    );
    let events = machine
        .events_after(&namespace(), before, 10)
        .expect("in the window");
    let kinds: Vec<_> = events.iter().map(|event| &event.kind).collect();
    assert!(
        matches!(
            kinds.as_slice(),
            [
                EventKind::Expired { fence: 1, .. },
                EventKind::Granted { fence: 2, .. }
            ]
        ),
        "the expired event comes before the grant: {kinds:?}"
    );
}

#[test]
fn keepalive_renews_every_lease_of_the_session() {
    check(vec![
        (0, create(A, "agent-a", 1_000), "session expires_in=1000"),
        (0, create(B, "agent-b", 10_000), "session expires_in=10000"),
        (0, acquire(A, "p/1"), "granted fence=1 expires_in=1000"),
        (0, acquire(A, "p/2"), "granted fence=2 expires_in=1000"),
        (900, keepalive(A), "kept_alive expires_in=1000"),
        (1_800, keepalive(A), "kept_alive expires_in=1000"),
        (
            2_500,
            acquire(B, "p/1"),
            "LEASE_HELD agent-a fence=1 expires_in=300",
        ),
        (
            2_500,
            acquire(B, "p/2"),
            "LEASE_HELD agent-a fence=2 expires_in=300",
        ),
        (2_800, acquire(B, "p/2"), "granted fence=3 expires_in=7200"),
    ]);
}

#[test]
fn max_hold_caps_a_lease_even_while_keepalives_continue() {
    check(vec![
        (0, create(A, "agent-a", 1_000), "session expires_in=1000"),
        (0, create(B, "agent-b", 10_000), "session expires_in=10000"),
        (
            0,
            acquire_max_hold(A, "m", 1_500),
            "granted fence=1 expires_in=1000",
        ),
        (800, keepalive(A), "kept_alive expires_in=1000"),
        (
            1_000,
            acquire(B, "m"),
            "LEASE_HELD agent-a fence=1 expires_in=500",
        ),
        (1_400, keepalive(A), "kept_alive expires_in=1000"),
        (1_500, acquire(B, "m"), "granted fence=2 expires_in=8500"),
        (1_500, release(A, "m"), "LEASE_LOST"),
        (1_500, keepalive(A), "kept_alive expires_in=1000"),
        (1_500, acquire_max_hold(A, "n", 0), "INVALID_ARGUMENT"),
        (
            1_500,
            acquire_max_hold(A, "n", 86_400_001),
            "INVALID_ARGUMENT",
        ),
    ]);
}

#[test]
fn end_session_releases_everything_it_holds() {
    let mut machine = check(vec![
        (0, create(A, "agent-a", 5_000), "session expires_in=5000"),
        (0, acquire(A, "x"), "granted fence=1 expires_in=5000"),
        (
            0,
            acquire_subtree(A, "y"),
            "granted fence=2 expires_in=5000",
        ),
        (10, end(A), "ended [x,y]"),
        (10, end(A), "NOT_FOUND"),
        (10, keepalive(A), "LEASE_LOST"),
    ]);
    assert_eq!(machine.counts(), (0, 0));
    check_on(
        &mut machine,
        vec![(
            10,
            acquire_new(B, "agent-b", 1_000, "y/z"),
            "granted fence=3 expires_in=1000",
        )],
    );
}

#[test]
fn the_fenced_write_of_a_stale_holder_is_refused() {
    // Kleppmann's example: A's lease expires while A is paused; B acquires; A's late write must
    // not land, nor may anyone use B's public fence without B's session.
    let machine = check(vec![
        (0, create(A, "agent-a", 1_000), "session expires_in=1000"),
        (0, acquire(A, "db"), "granted fence=1 expires_in=1000"),
        (
            10,
            put("db/row", "\"from-a\"", fence(A, "db", 1)),
            "written rev=2",
        ),
        (
            2_000,
            acquire_new(B, "agent-b", 5_000, "db"),
            "granted fence=2 expires_in=5000",
        ),
        (
            2_001,
            put("db/row", "\"late-a\"", fence(A, "db", 1)),
            "STALE_FENCE current=2",
        ),
        (
            2_002,
            put("db/row", "\"forged\"", fence(A, "db", 2)),
            "STALE_FENCE current=2",
        ),
        (
            2_003,
            put("db/row", "\"from-b\"", fence(B, "db", 2)),
            "written rev=5",
        ),
        (
            2_004,
            delete("db/row", fence(A, "db", 1)),
            "STALE_FENCE current=2",
        ),
        (
            2_005,
            put("other", "1", fence(B, "nothing-held", 2)),
            "STALE_FENCE current=none",
        ),
    ]);
    let stored = machine
        .kv_get(&namespace(), &path("db/row"))
        .expect("stored");
    assert_eq!(stored.value, "\"from-b\"");
    assert_eq!(stored.fence, Some((path("db"), 2)));
    assert_eq!(stored.revision, 5);
}

#[test]
fn unfenced_kv_writes_and_deletes() {
    let machine = check(vec![
        (0, put("k", "1", None), "written rev=1"),
        (0, put("k", "2", None), "written rev=2"),
        (0, delete("k", None), "deleted rev=3"),
        (0, delete("k", None), "NOT_FOUND"),
    ]);
    assert!(machine.kv_get(&namespace(), &path("k")).is_none());
}

/// A path under a live subtree lease is not free: a get answers the covering lease and a fence
/// check of its fence is current, while an exclusive lease elsewhere covers only itself.
#[test]
fn a_subtree_lease_covers_the_paths_below_it() {
    let mut machine = check(vec![
        (0, create(A, "agent-a", 1_000), "session expires_in=1000"),
        (
            0,
            acquire_subtree(A, "repo/src"),
            "granted fence=1 expires_in=1000",
        ),
        (
            0,
            acquire(A, "repo/docs"),
            "granted fence=2 expires_in=1000",
        ),
    ]);
    let (lease, covering) = machine
        .covering_lease(&namespace(), &path("repo/src/auth/x.rs"))
        .expect("covered");
    assert_eq!(
        (lease.resource.as_str(), lease.fence, covering),
        ("repo/src", 1, true)
    );
    let (lease, covering) = machine
        .covering_lease(&namespace(), &path("repo/src"))
        .expect("its own");
    assert_eq!((lease.resource.as_str(), covering), ("repo/src", false));
    assert!(machine
        .covering_lease(&namespace(), &path("repo/docs/x.md"))
        .is_none());
    assert!(machine
        .covering_lease(&namespace(), &path("repo/srcx"))
        .is_none());
    assert_eq!(
        machine.fence_status(&namespace(), &path("repo/src/auth/x.rs"), 1),
        FenceStatus {
            current: true,
            live_fence: Some(1)
        }
    );
    assert!(
        !machine
            .fence_status(&namespace(), &path("repo/src/x.rs"), 2)
            .current
    );
    machine.apply(&Batch::tick(1_000));
    assert!(machine
        .covering_lease(&namespace(), &path("repo/src/auth/x.rs"))
        .is_none());
}

/// A refusal names the path asked for and, when the lease in the way is another path's, that
/// path too: an agent denied `repo/src/a.rs` learns that the subtree `repo/src` is why.
#[test]
fn a_refusal_names_the_path_asked_for_and_the_lease_in_its_way() {
    let mut machine = check(vec![
        (0, create(A, "agent-a", 60_000), "session expires_in=60000"),
        (0, create(B, "agent-b", 60_000), "session expires_in=60000"),
        (
            0,
            acquire_subtree(A, "repo/src"),
            "granted fence=1 expires_in=60000",
        ),
        (
            0,
            acquire(A, "repo/docs/a.md"),
            "granted fence=2 expires_in=60000",
        ),
        (
            0,
            acquire_as(A, "team/ci/x", LeaseMode::Shared { limit: 2 }),
            "granted fence=3 expires_in=60000",
        ),
    ]);
    let cases = [
        (acquire(B, "repo/src"), "repo/src is held by agent-a (fence 1) for 1m more"),
        (
            acquire(B, "repo/src/a.rs"),
            "repo/src/a.rs is inside repo/src, held (subtree) by agent-a (fence 1) for 1m more",
        ),
        (
            acquire_subtree(B, "repo/docs"),
            "repo/docs (subtree) covers repo/docs/a.md, held by agent-a (fence 2) for 1m more",
        ),
        (
            acquire_subtree(B, "team"),
            "team (subtree) covers team/ci/x, shared by 1 of 2 holders: agent-a (fence 3) for 1m more",
        ),
    ];
    for (op, expected) in cases {
        let refusal = machine
            .apply(&Batch {
                stamp_ms: 0,
                commands: vec![command(op)],
            })
            .pop()
            .expect("one response");
        match refusal.outcome {
            Err(Rejection::LeaseHeld { message, .. }) => assert_eq!(message, expected),
            other => panic!("expected LEASE_HELD, got {other:?}"),
        }
    }
}

/// A stale-fence refusal of a token that is the live number, but of another session's lease,
/// says whose session holds it: "not the live fence (live fence 1)" would contradict itself.
#[test]
fn a_stale_fence_refusal_says_whose_session_holds_the_live_fence() {
    let mut machine = check(vec![
        (0, create(A, "agent-a", 5_000), "session expires_in=5000"),
        (0, create(B, "agent-b", 5_000), "session expires_in=5000"),
        (0, acquire(A, "db"), "granted fence=1 expires_in=5000"),
    ]);
    let responses = machine.apply(&Batch {
        stamp_ms: 1,
        commands: vec![command(put("db/row", "1", fence(B, "db", 1)))],
    });
    match &responses[0].outcome {
        Err(Rejection::StaleFence {
            message,
            current_fence,
        }) => {
            assert!(
                message.contains("belongs to agent-a's session"),
                "{message}"
            );
            assert!(!message.contains("not the live fence"), "{message}");
            assert_eq!(*current_fence, Some(1));
        }
        other => panic!("expected STALE_FENCE, got {other:?}"),
    }
}

#[test]
fn fence_status_reports_the_live_fence_only() {
    let mut machine = check(vec![
        (0, create(A, "agent-a", 1_000), "session expires_in=1000"),
        (0, acquire(A, "f"), "granted fence=1 expires_in=1000"),
    ]);
    assert_eq!(
        machine.fence_status(&namespace(), &path("f"), 1),
        FenceStatus {
            current: true,
            live_fence: Some(1)
        }
    );
    assert_eq!(
        machine.fence_status(&namespace(), &path("f"), 0),
        FenceStatus {
            current: false,
            live_fence: Some(1)
        }
    );
    machine.apply(&Batch::tick(1_000));
    assert_eq!(
        machine.fence_status(&namespace(), &path("f"), 1),
        FenceStatus {
            current: false,
            live_fence: None
        }
    );
}

#[test]
fn cluster_time_never_goes_backwards_whatever_the_stamps() {
    let mut machine = Machine::default();
    for (stamp_ms, expected_ms) in [
        (100, 100),
        (50, 100),
        (100, 100),
        (5_000, 5_000),
        (0, 5_000),
    ] {
        machine.apply(&Batch::tick(stamp_ms));
        assert_eq!(machine.time_ms(), expected_ms);
    }
    // An entry stamped before a deadline but applied after a later one still decides at the
    // later time.
    check_on(
        &mut machine,
        vec![
            (
                5_000,
                create(A, "agent-a", 1_000),
                "session expires_in=1000",
            ),
            (5_000, acquire(A, "r"), "granted fence=1 expires_in=1000"),
            (7_000, keepalive(A), "LEASE_LOST"),
            (
                5_500,
                acquire_new(B, "agent-b", 1_000, "r"),
                "granted fence=2 expires_in=1000",
            ),
        ],
    );
}

#[test]
fn sweep_removes_dead_things_in_bounded_batches() {
    let mut machine = Machine::default();
    for session in 1..=3u128 {
        step(&mut machine, 0, command(create(session, "agent", 1_000)));
        step(
            &mut machine,
            0,
            command(acquire(session, &format!("s/{session}/a"))),
        );
        step(
            &mut machine,
            0,
            command(acquire(session, &format!("s/{session}/b"))),
        );
    }
    step(&mut machine, 0, command(create(10, "keeper", 10_000)));
    step(
        &mut machine,
        0,
        command(acquire_max_hold(10, "held", 1_000)),
    );
    step(&mut machine, 0, command(acquire(10, "kept")));
    assert_eq!(machine.counts(), (4, 8));
    assert_eq!(
        step(&mut machine, 500, Command::Sweep { max: 100 }),
        "swept leases=0 sessions=0 tasks=0"
    );
    assert_eq!(
        step(&mut machine, 1_000, Command::Sweep { max: 4 }),
        "swept leases=3 sessions=1 tasks=0"
    );
    assert_eq!(machine.counts(), (3, 5));
    assert_eq!(
        step(&mut machine, 1_000, Command::Sweep { max: 100 }),
        "swept leases=4 sessions=2 tasks=0"
    );
    assert_eq!(machine.counts(), (1, 1));
    assert!(machine.lease(&namespace(), &path("kept")).is_some());
    let expired = machine
        .events_after(&namespace(), 0, 1_000)
        .expect("window")
        .iter()
        .filter(|event| matches!(event.kind, EventKind::Expired { .. }))
        .count();
    assert_eq!(expired, 7);
}

#[test]
fn subtree_acquire_clears_dead_leases_below_it() {
    let mut machine = check(vec![
        (0, create(A, "agent-a", 1_000), "session expires_in=1000"),
        (0, acquire(A, "t/1"), "granted fence=1 expires_in=1000"),
        (0, acquire(A, "t/2"), "granted fence=2 expires_in=1000"),
        (0, create(B, "agent-b", 5_000), "session expires_in=5000"),
        (
            500,
            acquire_subtree(B, "t"),
            "LEASE_HELD agent-a fence=1 expires_in=500",
        ),
        (
            1_000,
            acquire_subtree(B, "t"),
            "granted fence=3 expires_in=4000",
        ),
    ]);
    assert_eq!(machine.counts(), (2, 1));
    check_on(
        &mut machine,
        vec![(
            1_000,
            acquire_new(C, "agent-c", 1_000, "t/1"),
            "LEASE_HELD agent-b fence=3 expires_in=4000",
        )],
    );
}

fn tagged(key: &str, fingerprint: u8, op: Op) -> Command {
    Command::Namespaced {
        namespace: namespace(),
        idempotency: Some(IdempotencyTag {
            key: key.to_owned(),
            fingerprint: [fingerprint; 32],
            wall_ms: 0,
        }),
        op,
    }
}

#[test]
fn idempotent_retries_replay_the_first_answer() {
    let key = "0f5e7a8c-1111-4222-8333-944455556666";
    let mut machine = Machine::default();
    let first = machine.apply(&Batch {
        stamp_ms: 0,
        commands: vec![tagged(key, 1, acquire_new(A, "agent-a", 5_000, "r"))],
    });
    assert_eq!(render(&first[0]), "granted fence=1 expires_in=5000");
    // A retry (the leader drew a new session id for it) replays the first grant.
    let retry = machine.apply(&Batch {
        stamp_ms: 100,
        commands: vec![tagged(key, 1, acquire_new(B, "agent-a", 5_000, "r"))],
    });
    assert_eq!(render(&retry[0]), "replay granted fence=1 expires_in=5000");
    assert_eq!(first[0].outcome, retry[0].outcome, "identical body");
    assert_eq!(machine.counts(), (1, 1), "applied at most once");
    assert_eq!(
        step(
            &mut machine,
            100,
            tagged(key, 2, acquire_new(B, "agent-a", 5_000, "s"))
        ),
        "IDEMPOTENCY_KEY_REUSED"
    );
    // The same key in another namespace is another key.
    let other = Command::Namespaced {
        namespace: Namespace::new("other").unwrap(),
        idempotency: Some(IdempotencyTag {
            key: key.to_owned(),
            fingerprint: [2; 32],
            wall_ms: 0,
        }),
        op: put("k", "1", None),
    };
    assert_eq!(step(&mut machine, 100, other), "written rev=1");
    // After 24 h of cluster time the record is gone and the key is evaluated afresh.
    let day_ms = 24 * 60 * 60 * 1_000;
    assert_eq!(
        step(&mut machine, day_ms, tagged(key, 2, put("k", "2", None))),
        "written rev=2"
    );
}

#[test]
fn refusals_are_not_recorded_and_a_retry_is_evaluated_afresh() {
    let key = "refused-request-key-0001";
    let mut machine = check(vec![
        (0, create(A, "agent-a", 1_000), "session expires_in=1000"),
        (0, acquire(A, "r"), "granted fence=1 expires_in=1000"),
    ]);
    assert_eq!(
        step(
            &mut machine,
            10,
            tagged(key, 1, acquire_new(B, "agent-b", 1_000, "r"))
        ),
        "LEASE_HELD agent-a fence=1 expires_in=990"
    );
    assert_eq!(
        step(
            &mut machine,
            1_000,
            tagged(key, 1, acquire_new(B, "agent-b", 1_000, "r"))
        ),
        "granted fence=2 expires_in=1000"
    );
    assert_eq!(
        step(&mut machine, 1_000, tagged("short", 1, put("k", "1", None))),
        "INVALID_ARGUMENT"
    );
}

#[test]
fn idempotency_records_are_bounded_oldest_first() {
    let mut machine = Machine::default();
    let limits = Limits {
        idempotency_keys_max: 2,
        ..Limits::default()
    };
    step(&mut machine, 0, Command::SetLimits(limits));
    for (index, key) in [
        "key-number-one-0000",
        "key-number-two-0000",
        "key-number-three-00",
    ]
    .iter()
    .enumerate()
    {
        step(
            &mut machine,
            index as u64,
            tagged(key, 1, put("k", "1", None)),
        );
    }
    assert_eq!(
        step(
            &mut machine,
            10,
            tagged("key-number-three-00", 1, put("k", "1", None))
        ),
        "replay written rev=3"
    );
    assert_eq!(
        step(
            &mut machine,
            10,
            tagged("key-number-one-0000", 1, put("k", "1", None))
        ),
        "written rev=4"
    );
}

fn with_limits(change: impl FnOnce(&mut Limits)) -> Machine {
    let mut limits = Limits::default();
    change(&mut limits);
    Machine::new(limits)
}

#[test]
fn every_limit_is_refused_with_its_code_and_changes_nothing() {
    let long = "x".repeat(129);
    let deep = vec!["d"; 33].join("/");
    let wide = "w".repeat(513);
    let mut many_labels = Labels::new();
    for index in 0..17 {
        many_labels.insert(format!("k{index}"), "v".to_owned());
    }
    let mut long_label = Labels::new();
    long_label.insert("k".to_owned(), long.clone());
    let big_value = format!("\"{}\"", "v".repeat(256 * 1024));
    let table: Vec<(Op, &str)> = vec![
        (create(A, "agent-a", 999), "INVALID_ARGUMENT"),
        (create(A, "agent-a", 3_600_001), "INVALID_ARGUMENT"),
        (create(A, "", 1_000), "INVALID_ARGUMENT"),
        (create(A, &long, 1_000), "INVALID_ARGUMENT"),
        (
            Op::CreateSession(NewSession {
                labels: many_labels.clone(),
                ..new_session(A, "a", 1_000)
            }),
            "INVALID_ARGUMENT",
        ),
        (
            Op::CreateSession(NewSession {
                labels: long_label.clone(),
                ..new_session(A, "a", 1_000)
            }),
            "INVALID_ARGUMENT",
        ),
        (acquire_new(A, "agent-a", 1_000, &deep), "INVALID_ARGUMENT"),
        (acquire_new(A, "agent-a", 1_000, &wide), "INVALID_ARGUMENT"),
        (
            Op::Acquire {
                resource: path("r"),
                mode: LeaseMode::Exclusive,
                owner: Owner::NewSession(new_session(A, "agent-a", 1_000)),
                max_hold_ms: None,
                labels: many_labels,
            },
            "INVALID_ARGUMENT",
        ),
        (put("k", &big_value, None), "PAYLOAD_TOO_LARGE"),
        (put(&wide, "1", None), "INVALID_ARGUMENT"),
    ];
    for (op, expected) in table {
        let mut machine = Machine::default();
        machine.apply(&Batch::tick(5));
        let before = machine.encode_snapshot().expect("encode");
        assert_eq!(
            step(&mut machine, 5, command(op.clone())),
            expected,
            "{op:?}"
        );
        assert_eq!(
            machine.encode_snapshot().expect("encode"),
            before,
            "state untouched by {op:?}"
        );
    }
    // The path limits themselves are the edges: 32 segments and 512 bytes are allowed.
    let deepest = vec!["d"; 32].join("/");
    let widest = "w".repeat(512);
    check(vec![
        (
            0,
            acquire_new(A, "agent-a", 1_000, &deepest),
            "granted fence=1 expires_in=1000",
        ),
        (
            0,
            acquire_new(B, &"h".repeat(128), 3_600_000, &widest),
            "granted fence=2 expires_in=3600000",
        ),
    ]);
}

#[test]
fn stateful_limits_answer_resource_exhausted() {
    let mut machine = with_limits(|limits| {
        limits.leases_per_session_max = 2;
        limits.sessions_per_namespace_max = 2;
        limits.kv_keys_per_namespace_max = 1;
    });
    check_on(
        &mut machine,
        vec![
            (0, create(A, "agent-a", 1_000), "session expires_in=1000"),
            (0, acquire(A, "1"), "granted fence=1 expires_in=1000"),
            (0, acquire(A, "2"), "granted fence=2 expires_in=1000"),
            (0, acquire(A, "3"), "RESOURCE_EXHAUSTED"),
            (0, release(A, "2"), "released fence=2"),
            (0, acquire(A, "3"), "granted fence=3 expires_in=1000"),
            (0, create(B, "agent-b", 1_000), "session expires_in=1000"),
            (0, create(C, "agent-c", 1_000), "RESOURCE_EXHAUSTED"),
            (
                0,
                acquire_new(C, "agent-c", 1_000, "4"),
                "RESOURCE_EXHAUSTED",
            ),
            (0, put("k", "1", None), "written rev=5"),
            (0, put("k", "2", None), "written rev=6"),
            (0, put("j", "1", None), "RESOURCE_EXHAUSTED"),
        ],
    );
    let mut other = Machine::default();
    let limits = Limits {
        leases_per_session_max: 1,
        ..Limits::default()
    };
    assert_eq!(
        step(&mut other, 0, Command::SetLimits(limits)),
        "limits_set"
    );
    check_on(
        &mut other,
        vec![
            (0, create(A, "agent-a", 1_000), "session expires_in=1000"),
            (0, acquire(A, "1"), "granted fence=1 expires_in=1000"),
            (0, acquire(A, "2"), "RESOURCE_EXHAUSTED"),
        ],
    );
}

#[test]
fn events_resume_after_a_revision_and_refuse_one_outside_the_window() {
    let mut machine = with_limits(|limits| limits.events_kept_max = 3);
    for index in 0..5 {
        step(
            &mut machine,
            0,
            command(put(&format!("k{index}"), "1", None)),
        );
    }
    assert_eq!(machine.revision(&namespace()), 5);
    let revisions = |events: Vec<Event>| {
        events
            .iter()
            .map(|event| event.revision)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        machine.events_after(&namespace(), 2, 10).map(revisions),
        Some(vec![3, 4, 5])
    );
    assert_eq!(
        machine.events_after(&namespace(), 3, 1).map(revisions),
        Some(vec![4])
    );
    assert_eq!(
        machine.events_after(&namespace(), 5, 10).map(revisions),
        Some(vec![])
    );
    assert_eq!(
        machine.events_after(&namespace(), 1, 10),
        None,
        "revision 2 has left the window"
    );
    assert_eq!(
        machine
            .events_after(&namespace(), u64::MAX, 10)
            .map(revisions),
        Some(vec![]),
        "the largest revision does not overflow"
    );
}

#[test]
fn lists_page_through_live_leases_by_prefix() {
    let mut machine = Machine::default();
    step(&mut machine, 0, command(create(A, "agent-a", 1_000)));
    step(&mut machine, 0, command(create(B, "agent-b", 5_000)));
    for resource in ["p/a", "p/b", "p/c", "q/a"] {
        step(&mut machine, 0, command(acquire(B, resource)));
    }
    step(&mut machine, 0, command(acquire(A, "p/bb")));
    machine.apply(&Batch::tick(1_000));
    let names = |page: &Page<LeaseView>| {
        page.items
            .iter()
            .map(|lease| lease.resource.to_string())
            .collect::<Vec<_>>()
    };
    let first = machine.leases(&namespace(), "p/", None, 2);
    assert_eq!(names(&first), ["p/a", "p/b"]);
    assert_eq!(first.next_cursor.as_deref(), Some("p/b"));
    let second = machine.leases(&namespace(), "p/", first.next_cursor.as_deref(), 2);
    assert_eq!(names(&second), ["p/c"], "the expired p/bb is not listed");
    assert_eq!(second.next_cursor, None);
    let (session, leases) = machine
        .session(&namespace(), SessionId(B), None, 1_000)
        .expect("live");
    assert_eq!(
        (session.holder.as_str(), leases.items.len()),
        ("agent-b", 4)
    );
    assert_eq!(leases.next_cursor, None);
    let (_, first) = machine
        .session(&namespace(), SessionId(B), None, 3)
        .expect("live");
    let (_, rest) = machine
        .session(&namespace(), SessionId(B), first.next_cursor.as_deref(), 3)
        .expect("live");
    assert_eq!((first.items.len(), rest.items.len()), (3, 1));
    assert_eq!(rest.next_cursor, None);
    assert!(machine
        .session(&namespace(), SessionId(A), None, 10)
        .is_none());
}

#[test]
fn namespaces_are_isolated() {
    let mut machine = Machine::default();
    let in_other = |op| Command::Namespaced {
        namespace: Namespace::new("team-b").unwrap(),
        idempotency: None,
        op,
    };
    step(
        &mut machine,
        0,
        command(acquire_new(A, "agent-a", 1_000, "r")),
    );
    assert_eq!(
        step(
            &mut machine,
            0,
            in_other(acquire_new(B, "agent-b", 1_000, "r"))
        ),
        "granted fence=2 expires_in=1000"
    );
    assert_eq!(step(&mut machine, 0, in_other(keepalive(A))), "LEASE_LOST");
    assert!(
        Namespace::new("bad/ns").is_err(),
        "a namespace of the wrong shape cannot be made"
    );
}

#[test]
fn snapshots_round_trip_and_refuse_garbage() {
    let machine = check(vec![
        (0, create(A, "agent-a", 1_000), "session expires_in=1000"),
        (
            0,
            acquire_max_hold(A, "a/b", 500),
            "granted fence=1 expires_in=500",
        ),
        (
            0,
            acquire_subtree(A, "c"),
            "granted fence=2 expires_in=1000",
        ),
        (0, put("k", "{\"x\":1}", fence(A, "c", 2)), "written rev=3"),
    ]);
    let bytes = machine.encode_snapshot().expect("encode");
    let decoded = Machine::decode_snapshot(&bytes).expect("decode");
    assert_eq!(decoded, machine);
    assert_eq!(decoded.encode_snapshot().expect("encode"), bytes);

    let mut future = bytes.clone();
    future[4] = 6;
    assert!(matches!(
        Machine::decode_snapshot(&future),
        Err(CodecError::UnsupportedVersion(6))
    ));
    assert!(matches!(
        Machine::decode_snapshot(b"nope"),
        Err(CodecError::BadMagic)
    ));
    for cut in [8, bytes.len() / 2, bytes.len() - 1] {
        assert!(
            Machine::decode_snapshot(&bytes[..cut]).is_err(),
            "truncated at {cut}"
        );
    }
    let mut trailing = bytes.clone();
    trailing.push(0);
    assert!(Machine::decode_snapshot(&trailing).is_err());

    // Streamed both ways: the same bytes, and a stream that ends early or runs on is refused.
    let mut streamed = [0; 1 << 16];
    let mut writer = bincode::enc::write::SliceWriter::new(&mut streamed);
    machine.encode_snapshot_to(&mut writer).expect("encode");
    let written = writer.bytes_written();
    assert_eq!(&streamed[..written], &bytes[..]);
    let len = bytes.len() as u64;
    let from = |input: &[u8], len: u64| {
        Machine::decode_snapshot_from(bincode::de::read::SliceReader::new(input), len)
    };
    assert_eq!(from(&bytes, len).expect("decode"), machine);
    assert!(from(&bytes[..bytes.len() - 1], len).is_err(), "ends early");
    assert!(from(&bytes, len - 1).is_err(), "shorter than the stream");
    assert!(
        matches!(from(&trailing, len), Err(CodecError::TrailingBytes(1))),
        "runs on"
    );
    assert!(from(&bytes, len + 1).is_err(), "longer than the stream");

    let batch = Batch {
        stamp_ms: 7,
        commands: vec![command(keepalive(A)), Command::Sweep { max: 3 }],
    };
    let encoded = encode_batch(&batch).expect("encode");
    assert_eq!(decode_batch(&encoded).expect("decode"), batch);
    let mut unknown_version = encoded.clone();
    unknown_version[0] = 9;
    assert!(decode_batch(&unknown_version).is_err());
    assert!(decode_batch(&[]).is_err());
}

#[test]
fn paths_parse_by_segments() {
    let limits = Limits::default();
    let parsed = ResourcePath::parse("a/b/c", &limits).expect("valid");
    assert_eq!(parsed.ancestors().collect::<Vec<_>>(), ["a", "a/b"]);
    assert!(parsed.is_within(&path("a/b")));
    assert!(!path("a/bc").is_within(&path("a/b")));
    assert!(
        ResourcePath::parse("a/ /c", &limits).is_ok(),
        "a blank segment is not empty"
    );
    assert_eq!(
        SessionId::parse(&SessionId(255).to_string()).expect("round trip"),
        SessionId(255)
    );
    assert!(SessionId::parse("FF").is_err());
    assert!(SessionId::parse(&"G".repeat(32)).is_err());
}

/// One file never goes by two names: `.` and `..` segments and control characters are refused
/// in every name, never normalised.
#[test]
fn dot_segments_and_control_characters_are_refused() {
    let limits = Limits::default();
    for refused in [
        "repo/./src/x.rs",
        "repo/../repo/src/x.rs",
        ".",
        "..",
        "repo/src/..",
        "./repo",
        "repo/x\u{0}",
        "repo/\u{1f}x",
        "repo/x\u{7f}",
        "repo/line\nbreak",
    ] {
        assert!(
            ResourcePath::parse(refused, &limits).is_err(),
            "{refused:?} was accepted"
        );
    }
    for accepted in [
        "repo/.env",
        "repo/..hidden",
        "repo/a..b",
        "repo/src/x.rs",
        "repo/\u{e9}t\u{e9}",
    ] {
        assert!(
            ResourcePath::parse(accepted, &limits).is_ok(),
            "{accepted:?} was refused"
        );
    }
    for refused in ["", "a//b", "/a", "a/"] {
        assert!(ResourcePath::new(refused).is_err(), "{refused:?} was made");
    }
    for refused in ["", "bad/id", "bad queue"] {
        assert!(
            Name::new("task id", refused).is_err(),
            "{refused:?} was made"
        );
    }
    assert!(Name::parse("queue", ".", &limits).is_err());
    assert!(Name::parse("queue", "..", &limits).is_err());
    assert!(Name::parse("queue", "...", &limits).is_ok());
    assert!(validate_holder("agent\u{7}b", &limits).is_err());
    assert!(validate_holder("agent-b", &limits).is_ok());
    let labels = Labels::from([("team".to_owned(), "a\tb".to_owned())]);
    assert!(validate_labels(&labels, &limits).is_err());
}

/// Holding a name proves its shape: a log entry, snapshot or peer message whose bytes carry a
/// path of the wrong shape does not decode, so `apply` never sees one.
#[test]
fn a_batch_whose_bytes_carry_a_badly_shaped_path_does_not_decode() {
    let batch = Batch {
        stamp_ms: 0,
        commands: vec![command(put("repo/abcd", "1", None))],
    };
    let mut bytes = encode_batch(&batch).unwrap();
    assert_eq!(decode_batch(&bytes).unwrap(), batch);
    let at = find(&bytes, b"repo/abcd").expect("the path is in the bytes");
    for bad in [b"repo//bcd", b"repo/./cd", b"repo/../d", b"repo/ab\x07d"] {
        bytes[at..at + bad.len()].copy_from_slice(bad);
        assert!(
            decode_batch(&bytes).is_err(),
            "{:?} decoded",
            String::from_utf8_lossy(bad)
        );
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

fn name(text: &str) -> Name {
    Name::new("name", text).expect("a well-formed name")
}

fn enqueue(id: &str, priority: i32, depends_on: &[&str]) -> Op {
    Op::Enqueue {
        queue: name("q"),
        task: TaskSpec {
            task_id: name(id),
            payload: "{}".to_owned(),
            priority,
            depends_on: depends_on.iter().map(|id| name(id)).collect(),
            max_attempts: 3,
            delay_ms: 0,
            on_dead: None,
        },
    }
}

fn enqueue_with(id: &str, max_attempts: u32, delay_ms: u64) -> Op {
    Op::Enqueue {
        queue: name("q"),
        task: TaskSpec {
            task_id: name(id),
            payload: "{}".to_owned(),
            priority: 0,
            depends_on: Vec::new(),
            max_attempts,
            delay_ms,
            on_dead: None,
        },
    }
}

fn claim(session: u128) -> Op {
    Op::Claim {
        queue: name("q"),
        owner: Owner::Session(SessionId(session)),
    }
}

fn task_claim(session: u128, fence: u64) -> TaskFence {
    TaskFence {
        session_id: SessionId(session),
        fence,
    }
}

fn complete(id: &str, session: u128, fence: u64) -> Op {
    Op::Complete {
        queue: name("q"),
        task_id: name(id),
        claim: task_claim(session, fence),
        result: Some("\"ok\"".to_owned()),
    }
}

fn fail(id: &str, session: u128, fence: u64, retry: bool) -> Op {
    Op::Fail {
        queue: name("q"),
        task_id: name(id),
        claim: task_claim(session, fence),
        reason: "boom".to_owned(),
        retry,
    }
}

fn release_task(id: &str, session: u128, fence: u64) -> Op {
    Op::ReleaseTask {
        queue: name("q"),
        task_id: name(id),
        claim: task_claim(session, fence),
        note: Some("half done".to_owned()),
    }
}

#[test]
fn claims_follow_priority_then_enqueue_order() {
    let machine = check(vec![
        (0, create(A, "worker", 10_000), "session expires_in=10000"),
        (0, enqueue("low", 0, &[]), "enqueued low"),
        (0, enqueue("high-1", 5, &[]), "enqueued high-1"),
        (0, enqueue("high-2", 5, &[]), "enqueued high-2"),
        (0, enqueue("negative", -1, &[]), "enqueued negative"),
        (0, claim(A), "claimed high-1 fence=1 attempt=1"),
        (0, claim(A), "claimed high-2 fence=2 attempt=1"),
        (0, claim(A), "claimed low fence=3 attempt=1"),
        (0, claim(A), "claimed negative fence=4 attempt=1"),
        (0, claim(A), "empty"),
    ]);
    let counts = machine.queue_counts(&namespace(), &name("q"));
    assert_eq!((counts.ready, counts.claimed), (0, 4));
}

#[test]
fn dependencies_hold_a_task_until_every_one_is_done() {
    check(vec![
        (0, create(A, "worker", 10_000), "session expires_in=10000"),
        (0, enqueue("build", 0, &[]), "enqueued build"),
        (0, enqueue("lint", 0, &[]), "enqueued lint"),
        (
            0,
            enqueue("deploy", 9, &["build", "lint"]),
            "enqueued deploy",
        ),
        (0, enqueue("ghost", 0, &["missing"]), "INVALID_ARGUMENT"),
        (0, enqueue("build", 0, &[]), "INVALID_ARGUMENT"),
        (0, claim(A), "claimed build fence=1 attempt=1"),
        (0, complete("build", A, 1), "task build Done attempt=1"),
        (0, claim(A), "claimed lint fence=2 attempt=1"),
        (0, claim(A), "empty"),
        (0, complete("lint", A, 2), "task lint Done attempt=1"),
        (0, claim(A), "claimed deploy fence=3 attempt=1"),
        (
            0,
            enqueue("after-deploy", 0, &["build"]),
            "enqueued after-deploy",
        ),
        (0, claim(A), "claimed after-deploy fence=4 attempt=1"),
    ]);
}

#[test]
fn a_delayed_task_becomes_claimable_at_its_time() {
    check(vec![
        (0, create(A, "worker", 10_000), "session expires_in=10000"),
        (100, enqueue_with("later", 3, 500), "enqueued later"),
        (599, claim(A), "empty"),
        (600, claim(A), "claimed later fence=1 attempt=1"),
    ]);
}

#[test]
fn a_stalled_worker_loses_its_claim_and_its_late_complete_is_refused() {
    let machine = check(vec![
        (0, create(A, "slow", 1_000), "session expires_in=1000"),
        (0, create(B, "fast", 10_000), "session expires_in=10000"),
        (0, enqueue("t", 0, &[]), "enqueued t"),
        (0, claim(A), "claimed t fence=1 attempt=1"),
        (999, claim(B), "empty"),
        (1_000, claim(B), "claimed t fence=2 attempt=2"),
        (1_001, complete("t", A, 1), "STALE_FENCE current=2"),
        (1_001, complete("t", A, 2), "STALE_FENCE current=2"),
        (1_002, complete("t", B, 2), "task t Done attempt=2"),
        (1_003, complete("t", B, 2), "STALE_FENCE current=none"),
        (1_003, complete("nope", B, 2), "STALE_FENCE current=none"),
    ]);
    let counts = machine.queue_counts(&namespace(), &name("q"));
    assert_eq!(
        (counts.ready, counts.claimed, counts.done, counts.dead),
        (0, 0, 1, 0)
    );
}

#[test]
fn the_claim_after_the_last_attempt_lapses_makes_the_task_dead_with_its_dependents() {
    check(vec![
        (0, enqueue_with("flaky", 2, 0), "enqueued flaky"),
        (
            0,
            enqueue("needs-flaky", 0, &["flaky"]),
            "enqueued needs-flaky",
        ),
        (0, create(A, "w1", 1_000), "session expires_in=1000"),
        (0, claim(A), "claimed flaky fence=1 attempt=1"),
        (1_000, create(B, "w2", 1_000), "session expires_in=1000"),
        (1_000, claim(B), "claimed flaky fence=2 attempt=2"),
        (2_000, create(C, "w3", 1_000), "session expires_in=1000"),
        (2_000, claim(C), "empty"),
        (
            2_000,
            enqueue("needs-dead", 0, &["flaky"]),
            "INVALID_ARGUMENT",
        ),
    ]);
}

#[test]
fn fail_retries_or_kills_and_release_keeps_the_attempt() {
    let machine = check(vec![
        (0, create(A, "worker", 10_000), "session expires_in=10000"),
        (0, enqueue_with("t", 2, 0), "enqueued t"),
        (0, claim(A), "claimed t fence=1 attempt=1"),
        (0, release_task("t", A, 1), "task t Ready attempt=0"),
        (0, release_task("t", A, 1), "STALE_FENCE current=none"),
        (0, claim(A), "claimed t fence=2 attempt=1"),
        (0, fail("t", A, 2, true), "task t Ready attempt=1"),
        (0, claim(A), "claimed t fence=3 attempt=2"),
        (0, fail("t", A, 3, true), "task t Dead attempt=2"),
        (0, enqueue("u", 0, &[]), "enqueued u"),
        (0, claim(A), "claimed u fence=4 attempt=1"),
        (0, fail("u", A, 4, false), "task u Dead attempt=1"),
    ]);
    let task = machine
        .task(&namespace(), &name("q"), &name("t"))
        .expect("kept");
    assert_eq!(task.note.as_deref(), Some("half done"));
    assert_eq!(task.reason.as_deref(), Some("boom"));
}

#[test]
fn ending_a_session_gives_its_claims_back_and_an_empty_claim_creates_no_session() {
    let mut machine = check(vec![
        (0, create(A, "worker", 10_000), "session expires_in=10000"),
        (0, enqueue("t", 0, &[]), "enqueued t"),
        (0, claim(A), "claimed t fence=1 attempt=1"),
        (0, end(A), "ended []"),
        (
            0,
            Op::Claim {
                queue: name("q"),
                owner: Owner::NewSession(new_session(B, "w2", 1_000)),
            },
            "claimed t fence=2 attempt=2",
        ),
        (0, claim(B), "empty"),
    ]);
    assert_eq!(machine.counts().0, 1);
    let empty_claim = Op::Claim {
        queue: name("q"),
        owner: Owner::NewSession(new_session(C, "w3", 1_000)),
    };
    check_on(&mut machine, vec![(0, empty_claim, "empty")]);
    assert_eq!(
        machine.counts().0,
        1,
        "no session was created for an empty claim"
    );
    let key = "claim-on-empty-queue-0001";
    assert_eq!(step(&mut machine, 0, tagged(key, 1, claim(B))), "empty");
    check_on(&mut machine, vec![(0, enqueue("u", 0, &[]), "enqueued u")]);
    assert_eq!(
        step(&mut machine, 0, tagged(key, 1, claim(B))),
        "claimed u fence=3 attempt=1",
        "an empty answer is not replayed"
    );
    assert_eq!(
        step(&mut machine, 0, tagged(key, 1, claim(B))),
        "replay claimed u fence=3 attempt=1"
    );
}

#[test]
fn queue_limits_are_refused_and_change_nothing() {
    let big_payload = format!("\"{}\"", "p".repeat(256 * 1024));
    let too_many: Vec<String> = (0..65).map(|index| format!("d{index}")).collect();
    let table: Vec<(Op, &str)> = vec![
        (
            Op::Enqueue {
                queue: name("q"),
                task: TaskSpec {
                    task_id: name("t"),
                    payload: big_payload,
                    priority: 0,
                    depends_on: vec![],
                    max_attempts: 3,
                    delay_ms: 0,
                    on_dead: None,
                },
            },
            "PAYLOAD_TOO_LARGE",
        ),
        (enqueue_with("t", 0, 0), "INVALID_ARGUMENT"),
        (enqueue_with("t", 101, 0), "INVALID_ARGUMENT"),
        (
            enqueue_with("t", 3, 30 * 24 * 60 * 60 * 1_000 + 1),
            "INVALID_ARGUMENT",
        ),
        (
            Op::Enqueue {
                queue: name("q"),
                task: TaskSpec {
                    task_id: name("t"),
                    payload: "1".to_owned(),
                    priority: 0,
                    depends_on: too_many.iter().map(|id| name(id)).collect(),
                    max_attempts: 3,
                    delay_ms: 0,
                    on_dead: None,
                },
            },
            "INVALID_ARGUMENT",
        ),
        (claim(A), "LEASE_LOST"),
    ];
    for (op, expected) in table {
        let mut machine = Machine::default();
        machine.apply(&Batch::tick(5));
        let before = machine.encode_snapshot().expect("encode");
        assert_eq!(
            step(&mut machine, 5, command(op.clone())),
            expected,
            "{op:?}"
        );
        assert_eq!(
            machine.encode_snapshot().expect("encode"),
            before,
            "state untouched by {op:?}"
        );
    }
    let mut machine = with_limits(|limits| limits.tasks_per_queue_max = 1);
    check_on(
        &mut machine,
        vec![
            (0, enqueue("a", 0, &[]), "enqueued a"),
            (0, enqueue("b", 0, &[]), "RESOURCE_EXHAUSTED"),
        ],
    );
    let mut machine = with_limits(|limits| limits.queues_per_namespace_max = 1);
    let in_other_queue = Op::Enqueue {
        queue: name("other"),
        task: TaskSpec {
            task_id: name("x"),
            payload: "1".to_owned(),
            priority: 0,
            depends_on: vec![],
            max_attempts: 3,
            delay_ms: 0,
            on_dead: None,
        },
    };
    check_on(
        &mut machine,
        vec![
            (0, enqueue("a", 0, &[]), "enqueued a"),
            (0, in_other_queue, "RESOURCE_EXHAUSTED"),
            (0, enqueue("b", 0, &[]), "enqueued b"),
        ],
    );
}

#[test]
fn queues_survive_a_snapshot_round_trip_with_their_indexes() {
    let machine = check(vec![
        (0, create(A, "worker", 5_000), "session expires_in=5000"),
        (0, enqueue("a", 1, &[]), "enqueued a"),
        (0, enqueue("b", 2, &["a"]), "enqueued b"),
        (0, enqueue_with("c", 3, 900), "enqueued c"),
        (0, enqueue("d", 0, &[]), "enqueued d"),
        (0, claim(A), "claimed a fence=1 attempt=1"),
    ]);
    let decoded =
        Machine::decode_snapshot(&machine.encode_snapshot().expect("encode")).expect("decode");
    assert_eq!(decoded, machine);
    let mut decoded = decoded;
    check_on(
        &mut decoded,
        vec![
            (0, complete("a", A, 1), "task a Done attempt=1"),
            (0, claim(A), "claimed b fence=2 attempt=1"),
            (0, claim(A), "claimed d fence=3 attempt=1"),
            (900, claim(A), "claimed c fence=4 attempt=1"),
        ],
    );
}

/// `ready` means claim-next could take it now; a task held back by a dependency or a delay is
/// `waiting`, in counts and in the `state` filter alike.
#[test]
fn tasks_held_back_by_dependencies_or_delays_are_waiting() {
    let mut machine = check(vec![
        (0, create(A, "worker", 10_000), "session expires_in=10000"),
        (0, enqueue("build", 0, &[]), "enqueued build"),
        (0, enqueue("deploy", 0, &["build"]), "enqueued deploy"),
        (0, enqueue_with("later", 3, 500), "enqueued later"),
    ]);
    let queue = name("q");
    let counts = machine.queue_counts(&namespace(), &queue);
    assert_eq!((counts.ready, counts.waiting, counts.claimed), (1, 2, 0));
    let waiting: Vec<String> = machine
        .tasks(&namespace(), &queue, Some(TaskState::Waiting), None, 10)
        .items
        .iter()
        .map(|task| task.id.to_string())
        .collect();
    assert_eq!(waiting, ["deploy", "later"]);
    machine.apply(&Batch {
        stamp_ms: 500,
        commands: vec![command(claim(A))],
    });
    let counts = machine.queue_counts(&namespace(), &queue);
    assert_eq!(
        (counts.ready, counts.waiting, counts.claimed),
        (1, 1, 1),
        "the delay passed: later is ready, deploy still waits for build"
    );
    let ready = machine.tasks(&namespace(), &queue, Some(TaskState::Ready), None, 10);
    assert_eq!(ready.items.len(), 1);
    assert_eq!(ready.items[0].state, TaskState::Ready);
}

// ---- access control ----

fn token(name: &str, role: Role, scope: &[&str], secret: u8) -> Command {
    let scope = if scope == ["*"] {
        Scope::All
    } else {
        Scope::Only(
            scope
                .iter()
                .map(|namespace| Namespace::new(*namespace).expect("a namespace"))
                .collect(),
        )
    };
    Command::CreateToken(NewToken {
        name: Name::new("token name", name).expect("a name"),
        role,
        scope,
        quotas: Quotas::default(),
        secret_sha256: [secret; 32],
    })
}

fn by(name: &str, op: Op) -> Command {
    by_in(name, "default", op)
}

fn by_in(name: &str, namespace: &str, op: Op) -> Command {
    Command::Authorized {
        token: Name::new("token name", name).expect("a name"),
        command: Box::new(Command::Namespaced {
            namespace: Namespace::new(namespace).expect("a namespace"),
            idempotency: None,
            op,
        }),
    }
}

#[test]
fn tokens_allow_by_role_namespace_and_session_owner() {
    let mut machine = Machine::default();
    for (command, expected) in [
        (token("ops", Role::Admin, &["*"], 1), "token ops admin"),
        (
            token("team-a", Role::Agent, &["default"], 2),
            "token team-a agent",
        ),
        (
            token("team-b", Role::Agent, &["default"], 3),
            "token team-b agent",
        ),
        (
            token("watcher", Role::Reader, &["*"], 4),
            "token watcher reader",
        ),
        (token("team-a", Role::Agent, &["x"], 5), "INVALID_ARGUMENT"),
        (
            token("dup-secret", Role::Agent, &["x"], 2),
            "INVALID_ARGUMENT",
        ),
        (token("nowhere", Role::Agent, &[], 6), "INVALID_ARGUMENT"),
        (
            by("team-a", create(A, "agent-a", 1_000)),
            "session expires_in=1000",
        ),
        (
            by("team-a", acquire(A, "src/auth.rs")),
            "granted fence=1 expires_in=1000",
        ),
        // Another agent token may not use team-a's session, even knowing its id.
        (by("team-b", keepalive(A)), "PERMISSION_DENIED"),
        (
            by("team-b", acquire(A, "src/other.rs")),
            "PERMISSION_DENIED",
        ),
        // An admin may.
        (by("ops", keepalive(A)), "kept_alive expires_in=1000"),
        (
            by("watcher", create(B, "reader", 1_000)),
            "PERMISSION_DENIED",
        ),
        (
            by_in("team-a", "team-b", create(B, "agent-a", 1_000)),
            "PERMISSION_DENIED",
        ),
        (by("nobody", create(B, "agent-a", 1_000)), "UNAUTHENTICATED"),
        // Tokens and limits need admin.
        (
            Command::Authorized {
                token: Name::new("token name", "team-a").unwrap(),
                command: Box::new(token("sneaky", Role::Admin, &["*"], 7)),
            },
            "PERMISSION_DENIED",
        ),
        (
            Command::RevokeToken {
                name: Name::new("token name", "team-a").unwrap(),
            },
            "revoked team-a",
        ),
        // Revoked: refused from the entry that revoked it on.
        (by("team-a", keepalive(A)), "UNAUTHENTICATED"),
        (
            Command::RevokeToken {
                name: Name::new("token name", "team-a").unwrap(),
            },
            "NOT_FOUND",
        ),
    ] {
        assert_eq!(
            step(&mut machine, 0, command.clone()),
            expected,
            "{command:?}"
        );
    }
    let owner = machine.auth().owner(&namespace(), SessionId(A));
    assert_eq!(
        owner.map(Name::as_str),
        Some("team-a"),
        "the owner outlives its token"
    );
    assert_eq!(
        machine
            .auth()
            .authenticate(&[3; 32])
            .map(|caller| caller.name.as_str().to_owned()),
        Some("team-b".to_owned())
    );
    assert!(machine.auth().authenticate(&[2; 32]).is_none(), "revoked");

    // Ending the session forgets its owner; a snapshot keeps tokens and owners, and the hash
    // index is rebuilt.
    step(&mut machine, 0, by("team-b", create(B, "agent-b", 1_000)));
    assert_eq!(
        step(&mut machine, 0, by("ops", end(A))),
        "ended [src/auth.rs]"
    );
    assert_eq!(machine.auth().owner(&namespace(), SessionId(A)), None);
    let decoded = Machine::decode_snapshot(&machine.encode_snapshot().unwrap()).unwrap();
    assert_eq!(decoded, machine);
    assert!(decoded.auth().authenticate(&[3; 32]).is_some());
    assert_eq!(
        decoded
            .auth()
            .owner(&namespace(), SessionId(B))
            .map(Name::as_str),
        Some("team-b")
    );
}

#[test]
fn the_bootstrap_token_is_created_once_in_the_clusters_life() {
    let mut machine = Machine::default();
    let bootstrap = |secret| Command::BootstrapToken {
        secret_sha256: [secret; 32],
    };
    assert_eq!(
        step(&mut machine, 0, bootstrap(9)),
        "bootstrapped created=true"
    );
    assert_eq!(
        step(&mut machine, 0, bootstrap(8)),
        "bootstrapped created=false"
    );
    let caller = machine
        .auth()
        .authenticate(&[9; 32])
        .expect("the first secret");
    assert_eq!(
        (caller.name.as_str(), caller.role),
        (BOOTSTRAP_TOKEN_NAME, Role::Admin)
    );
    assert!(machine.auth().authenticate(&[8; 32]).is_none());
    let revoke = Command::RevokeToken {
        name: Name::new("token name", BOOTSTRAP_TOKEN_NAME).unwrap(),
    };
    assert_eq!(step(&mut machine, 0, revoke), "revoked bootstrap");
    assert_eq!(
        step(&mut machine, 0, bootstrap(9)),
        "bootstrapped created=false",
        "a node restarted with the old secret does not bring it back"
    );
    assert!(machine.auth().authenticate(&[9; 32]).is_none());
}

#[test]
fn quotas_bound_a_tokens_live_sessions_and_leases() {
    let mut machine = Machine::default();
    let Command::CreateToken(mut limited) = token("small", Role::Agent, &["*"], 1) else {
        unreachable!()
    };
    limited.quotas = Quotas {
        sessions_max: Some(2),
        leases_max: Some(2),
    };
    assert_eq!(
        step(&mut machine, 0, Command::CreateToken(limited)),
        "token small agent"
    );
    for (command, expected) in [
        (
            by("small", create(A, "a", 10_000)),
            "session expires_in=10000",
        ),
        (
            by("small", create(B, "b", 10_000)),
            "session expires_in=10000",
        ),
        (by("small", create(C, "c", 10_000)), "RESOURCE_EXHAUSTED"),
        (
            by("small", acquire(A, "x")),
            "granted fence=1 expires_in=10000",
        ),
        (
            by("small", acquire(B, "y")),
            "granted fence=2 expires_in=10000",
        ),
        (by("small", acquire(A, "z")), "RESOURCE_EXHAUSTED"),
        // Freeing one makes room again.
        (
            by(
                "small",
                Op::Release {
                    session_id: SessionId(A),
                    resource: path("x"),
                },
            ),
            "released fence=1",
        ),
        (
            by("small", acquire(A, "z")),
            "granted fence=3 expires_in=10000",
        ),
        (by("small", end(B)), "ended [y]"),
        (
            by("small", create(C, "c", 10_000)),
            "session expires_in=10000",
        ),
    ] {
        assert_eq!(
            step(&mut machine, 0, command.clone()),
            expected,
            "{command:?}"
        );
    }
    // Expired sessions stop counting once swept.
    step(&mut machine, 20_000, Command::Sweep { max: 100 });
    assert_eq!(
        step(&mut machine, 20_000, by("small", create(B, "b", 10_000))),
        "session expires_in=10000"
    );
    let decoded = Machine::decode_snapshot(&machine.encode_snapshot().unwrap()).unwrap();
    assert_eq!(
        decoded
            .auth()
            .sessions_of(&Name::new("t", "small").unwrap())
            .count(),
        1
    );
}

/// The paths `session` holds leases on, in path order.
fn held_by_session(machine: &Machine, session: u128) -> Vec<String> {
    let (_, leases) = machine
        .session(&namespace(), SessionId(session), None, 100)
        .expect("the session lives");
    leases
        .items
        .iter()
        .map(|lease| lease.resource.as_str().to_owned())
        .collect()
}

#[test]
fn places_in_line_count_toward_a_tokens_leases_max() {
    // Found in an attack pass: a token with leases_max 2 queued five waiting acquires and
    // was granted all five when their paths freed.
    let mut machine = Machine::default();
    let Command::CreateToken(mut limited) = token("small", Role::Agent, &["*"], 1) else {
        unreachable!()
    };
    limited.quotas = Quotas {
        sessions_max: None,
        leases_max: Some(2),
    };
    step(&mut machine, 0, Command::CreateToken(limited));
    step(&mut machine, 0, command(create(B, "holder", 10_000)));
    for resource in ["p1", "p2", "p3", "p4", "p5"] {
        step(&mut machine, 0, command(acquire(B, resource)));
    }
    step(&mut machine, 0, by("small", create(A, "a", 10_000)));
    for (resource, expected) in [
        ("p1", "queued position=1"),
        ("p2", "queued position=1"),
        ("p3", "RESOURCE_EXHAUSTED"),
        ("p4", "RESOURCE_EXHAUSTED"),
        ("p5", "RESOURCE_EXHAUSTED"),
        // A session asking again for a place it has keeps it.
        ("p1", "still queued position=1"),
    ] {
        assert_eq!(
            step(&mut machine, 0, by("small", wait(A, resource))),
            expected,
            "{resource}"
        );
    }
    assert_eq!(
        step(&mut machine, 0, command(end(B))),
        "ended [p1,p2,p3,p4,p5]"
    );
    assert_eq!(held_by_session(&machine, A), ["p1", "p2"]);
    assert_eq!(
        step(&mut machine, 0, by("small", acquire(A, "p3"))),
        "RESOURCE_EXHAUSTED"
    );
}

#[test]
fn a_grant_from_the_line_past_the_tokens_quota_leaves_the_line_instead() {
    // The token's quota is checked again when the line grants: a token revoked and made
    // again under the same name with a smaller quota owns the old sessions and their places.
    let mut machine = Machine::default();
    let quota = |leases_max| {
        let Command::CreateToken(mut limited) = token("small", Role::Agent, &["*"], 1) else {
            unreachable!()
        };
        limited.quotas = Quotas {
            sessions_max: None,
            leases_max: Some(leases_max),
        };
        Command::CreateToken(limited)
    };
    step(&mut machine, 0, quota(3));
    step(&mut machine, 0, command(create(B, "holder", 10_000)));
    step(&mut machine, 0, command(acquire(B, "p1")));
    step(&mut machine, 0, command(acquire(B, "p2")));
    step(&mut machine, 0, by("small", create(A, "a", 10_000)));
    step(&mut machine, 0, by("small", acquire(A, "own")));
    step(&mut machine, 0, by("small", wait(A, "p1")));
    step(&mut machine, 0, by("small", wait(A, "p2")));
    let small = Name::new("token name", "small").unwrap();
    step(&mut machine, 0, Command::RevokeToken { name: small });
    step(&mut machine, 0, quota(2));
    step(&mut machine, 0, command(end(B)));
    assert_eq!(held_by_session(&machine, A), ["own", "p1"]);
    assert!(machine.waiters(&namespace(), &path("p2")).is_empty());
    let left = machine
        .events_after(&namespace(), 0, 100)
        .expect("all kept")
        .into_iter()
        .filter(|event| matches!(&event.kind, EventKind::LeftLine { resource, .. } if resource.as_str() == "p2"))
        .count();
    assert_eq!(
        left, 1,
        "the place past the quota is given up with an event"
    );
}

#[test]
fn events_name_the_token_whose_request_made_them() {
    let mut machine = Machine::default();
    step(&mut machine, 0, token("team-a", Role::Agent, &["*"], 1));
    step(&mut machine, 0, by("team-a", create(A, "agent-a", 1_000)));
    step(&mut machine, 0, by("team-a", acquire(A, "src/auth.rs")));
    step(&mut machine, 0, command(create(B, "open", 1_000)));
    step(&mut machine, 0, command(acquire(B, "src/open.rs")));
    step(&mut machine, 2_000, Command::Sweep { max: 10 });
    let events = machine.events_after(&namespace(), 0, 10).expect("all kept");
    let by: Vec<(String, Option<&str>)> = events
        .iter()
        .map(|event| {
            let kind = match &event.kind {
                EventKind::Granted { resource, .. } => format!("granted {resource}"),
                EventKind::Expired { resource, .. } => format!("expired {resource}"),
                other => format!("{other:?}"),
            };
            (kind, event.by.as_ref().map(Name::as_str))
        })
        .collect();
    assert_eq!(
        by,
        [
            ("granted src/auth.rs".to_owned(), Some("team-a")),
            ("granted src/open.rs".to_owned(), None),
            ("expired src/auth.rs".to_owned(), None),
            ("expired src/open.rs".to_owned(), None),
        ]
    );
}

fn put_in(namespace: &str, key: &str) -> Command {
    Command::Namespaced {
        namespace: Namespace::new(namespace).unwrap(),
        idempotency: None,
        op: put(key, "1", None),
    }
}

fn revisions_kept(machine: &Machine, namespace: &str) -> Vec<u64> {
    let namespace = Namespace::new(namespace).unwrap();
    let oldest = machine.oldest_event_revision(&namespace);
    machine
        .events_after(&namespace, oldest.saturating_sub(1), 1_000)
        .expect("from the oldest kept")
        .iter()
        .map(|event| event.revision)
        .collect()
}

#[test]
fn each_namespace_counts_its_own_revisions_and_keeps_its_own_window() {
    // Found in an attack pass: with one window for all, 250 writes in team-b pushed team-a's
    // `after=0` out of it, and team-a's revisions showed how busy team-b was.
    let mut machine = Machine::default();
    let limits = Limits {
        events_kept_max: 200,
        ..Limits::default()
    };
    step(&mut machine, 0, Command::SetLimits(limits));
    for index in 0..10 {
        step(&mut machine, 0, put_in("team-a", &format!("a{index}")));
    }
    for index in 0..250 {
        step(&mut machine, 0, put_in("team-b", &format!("b{index}")));
    }
    assert_eq!(
        revisions_kept(&machine, "team-a"),
        (1..=10).collect::<Vec<_>>()
    );
    assert_eq!(
        revisions_kept(&machine, "team-b"),
        (51..=250).collect::<Vec<_>>()
    );
    let team_a = Namespace::new("team-a").unwrap();
    assert_eq!(machine.revision(&team_a), 10);
    assert_eq!(
        machine
            .events_after(&team_a, 0, 1_000)
            .map(|events| events.len()),
        Some(10)
    );
    assert_eq!(
        step(&mut machine, 0, put_in("team-a", "next")),
        "written rev=11",
        "a value's revision is its namespace's"
    );
    let team_b = Namespace::new("team-b").unwrap();
    assert!(
        machine.events_after(&team_b, 0, 10).is_none(),
        "team-b fell out of its own window"
    );
    assert_eq!(machine.applied_events().len(), 1);
}

#[test]
fn all_windows_together_keep_at_most_ten_times_a_window_and_the_largest_gives_first() {
    let mut machine = Machine::default();
    let limits = Limits {
        events_kept_max: 5,
        ..Limits::default()
    };
    step(&mut machine, 0, Command::SetLimits(limits));
    step(&mut machine, 0, put_in("quiet", "k"));
    for tenant in 0..12 {
        for index in 0..5 {
            step(
                &mut machine,
                0,
                put_in(&format!("busy-{tenant:02}"), &format!("k{index}")),
            );
        }
    }
    let kept: usize = (0..12)
        .map(|tenant| revisions_kept(&machine, &format!("busy-{tenant:02}")).len())
        .sum::<usize>()
        + revisions_kept(&machine, "quiet").len();
    assert_eq!(kept, 50);
    assert_eq!(
        revisions_kept(&machine, "quiet"),
        [1],
        "the smallest window is left alone"
    );
    for tenant in 0..12 {
        let kept = revisions_kept(&machine, &format!("busy-{tenant:02}"));
        assert!((3..=5).contains(&kept.len()), "busy-{tenant:02}: {kept:?}");
        assert_eq!(kept.last(), Some(&5));
    }
}

/// A version 4 snapshot (one event window for all namespaces, one revision across them)
/// decodes with each namespace's events numbered by its own revision, ending at the shared
/// log's last one, so no revision a value or a reader holds from before passes its
/// namespace's last. Written by the build before the change: team-b wrote 8 values, team-a
/// wrote `k` twice (global revisions 2 and 7), 10 events in all.
#[test]
fn a_snapshot_with_one_event_window_for_all_namespaces_decodes_into_windows_of_their_own() {
    let machine = Machine::decode_snapshot(include_bytes!("../tests/fixtures/snapshot-v4.bin"))
        .expect("a version 4 snapshot decodes");
    assert_eq!(revisions_kept(&machine, "team-a"), [9, 10]);
    assert_eq!(
        revisions_kept(&machine, "team-b"),
        (3..=10).collect::<Vec<_>>()
    );
    let team_a = Namespace::new("team-a").unwrap();
    assert_eq!(
        machine.kv_get(&team_a, &path("k")).map(|kv| kv.revision),
        Some(7)
    );
    let mut machine = machine;
    assert_eq!(
        step(&mut machine, 20, put_in("team-a", "k")),
        "written rev=11"
    );
    let reencoded = machine.encode_snapshot().expect("encode");
    assert_eq!(
        Machine::decode_snapshot(&reencoded).expect("decode"),
        machine
    );
}

/// Snapshots and log entries written by earlier builds (tests/fixtures, made by the build
/// before each format change) still decode: version 1 (before access control), 2 (before
/// compensations and retention) and 3 (before lines) snapshots, and `V1` batches.
#[test]
fn earlier_formats_still_decode() {
    for bytes in [
        &include_bytes!("../tests/fixtures/snapshot-v1.bin")[..],
        &include_bytes!("../tests/fixtures/snapshot-v2.bin")[..],
        &include_bytes!("../tests/fixtures/snapshot-v3.bin")[..],
    ] {
        let machine = Machine::decode_snapshot(bytes).expect("an earlier snapshot decodes");
        assert_eq!(machine.limits().ttl_ms_max, 600_000);
        assert_eq!(
            machine.limits().task_retention_ms,
            Limits::default().task_retention_ms
        );
        assert_eq!(machine.limits().txn_ops_max, Limits::default().txn_ops_max);
        assert!(machine.lease(&namespace(), &path("a")).is_some());
        assert_eq!(
            machine
                .kv_get(&namespace(), &path("k"))
                .map(|kv| kv.revision),
            Some(2)
        );
        let state = |id: &str| {
            machine
                .task(&namespace(), &name("q"), &name(id))
                .map(|task| task.state)
        };
        assert_eq!(state("finished"), Some(TaskState::Done));
        assert_eq!(state("doomed"), Some(TaskState::Dead));
        assert_eq!(state("claimed"), Some(TaskState::Claimed));
        assert_eq!(state("waiting"), Some(TaskState::Waiting));
        assert_eq!(state("delayed"), Some(TaskState::Waiting));
        // Finished tasks count as finished when the snapshot was read: retention starts then.
        let mut later = machine.clone();
        let retention = later.limits().task_retention_ms;
        assert_eq!(
            step(
                &mut later,
                1_000 + retention - 1,
                Command::Sweep { max: 100 }
            ),
            "swept leases=1 sessions=1 tasks=0"
        );
        assert_eq!(
            step(&mut later, 1_000 + retention, Command::Sweep { max: 100 }),
            "swept leases=0 sessions=0 tasks=2"
        );
        let left: Vec<String> = later
            .tasks(&namespace(), &name("q"), None, None, 10)
            .items
            .iter()
            .map(|task| task.id.to_string())
            .collect();
        assert_eq!(left, ["claimed", "delayed", "waiting"]);
        let reencoded = machine.encode_snapshot().expect("encode");
        assert_eq!(
            Machine::decode_snapshot(&reencoded).expect("decode"),
            machine
        );
    }
    let batch =
        decode_batch(include_bytes!("../tests/fixtures/batch-v1.bin")).expect("a V1 batch decodes");
    assert_eq!(batch.stamp_ms, 5);
    assert_eq!(batch.commands.len(), 14);
    assert!(matches!(
        &batch.commands[0],
        Command::SetLimits(limits) if limits.ttl_ms_max == 600_000
            && limits.txn_ops_max == Limits::default().txn_ops_max
    ));
    assert_eq!(batch.commands[6], command(enqueue("t", 2, &["u"])));
    assert_eq!(batch.commands[13], Command::Sweep { max: 9 });
    // And a batch written now is V2, which an earlier build would refuse, not misread.
    assert_eq!(encode_batch(&batch).expect("encode")[0], 1);
}

// ---- transactions, compensation, retention ----

fn txn(
    session: Option<u128>,
    compare: Vec<Compare>,
    success: Vec<TxnOp>,
    failure: Vec<TxnOp>,
) -> Op {
    Op::Txn(Txn {
        session_id: session.map(SessionId),
        compare,
        success,
        failure,
    })
}

fn txn_put(key: &str, value: &str) -> TxnOp {
    TxnOp::Put {
        key: path(key),
        value: value.to_owned(),
    }
}

fn txn_add(id: &str, depends_on: &[&str]) -> TxnOp {
    let Op::Enqueue { queue, task } = enqueue(id, 0, depends_on) else {
        unreachable!()
    };
    TxnOp::AddTask { queue, task }
}

fn txn_complete(id: &str, fence: u64) -> TxnOp {
    TxnOp::CompleteTask {
        queue: name("q"),
        task_id: name(id),
        fence,
        result: Some("\"ok\"".to_owned()),
    }
}

fn txn_fail(id: &str, fence: u64) -> TxnOp {
    TxnOp::FailTask {
        queue: name("q"),
        task_id: name(id),
        fence,
        reason: "boom".to_owned(),
        retry: false,
    }
}

/// Applies `op` at the machine's cluster time and asserts it was refused with `expected` and
/// left the state byte for byte as it was.
fn refused_unchanged(machine: &mut Machine, op: Op, expected: &str) {
    let before = machine.encode_snapshot().expect("encode");
    let time_ms = machine.time_ms();
    assert_eq!(step(machine, time_ms, command(op)), expected);
    assert!(
        machine.encode_snapshot().expect("encode") == before,
        "{expected}: the state changed"
    );
}

#[test]
fn a_transaction_applies_all_its_ops_or_none() {
    let mut machine = check(vec![
        (0, create(A, "agent-a", 10_000), "session expires_in=10000"),
        (0, create(B, "agent-b", 10_000), "session expires_in=10000"),
        (0, acquire(A, "repo/a"), "granted fence=1 expires_in=10000"),
        (0, enqueue("job", 0, &[]), "enqueued job"),
        (0, claim(A), "claimed job fence=2 attempt=1"),
    ]);
    // The outbox: complete my task, enqueue its follow-ups (one waiting on the other), record
    // the result and release my lease, if my fence is still live.
    let outbox = txn(
        Some(A),
        vec![Compare::Fence {
            resource: path("repo/a"),
            fence: 1,
        }],
        vec![
            txn_complete("job", 2),
            txn_add("next", &[]),
            txn_add("after-next", &["next"]),
            txn_put("results/job", "{\"ok\":true}"),
            TxnOp::Release {
                resource: path("repo/a"),
            },
        ],
        vec![],
    );
    assert_eq!(
        step(&mut machine, 1, command(outbox)),
        "txn succeeded=true [task job Done attempt=1; enqueued next; enqueued after-next; written rev=7; released fence=1]"
    );
    let state = |machine: &Machine, id: &str| {
        machine
            .task(&namespace(), &name("q"), &name(id))
            .map(|task| task.state)
    };
    assert_eq!(state(&machine, "after-next"), Some(TaskState::Waiting));
    assert!(machine.lease(&namespace(), &path("repo/a")).is_none());

    // A compare that fails runs the failure ops instead.
    let guarded = txn(
        None,
        vec![Compare::KvRevision {
            key: path("results/job"),
            revision: 0,
        }],
        vec![txn_put("results/job", "1")],
        vec![txn_put("conflicts/job", "1")],
    );
    assert_eq!(
        step(&mut machine, 2, command(guarded)),
        "txn succeeded=false [written rev=9]"
    );
    assert!(machine
        .kv_get(&namespace(), &path("conflicts/job"))
        .is_some());

    // An op that would be refused refuses the whole transaction: nothing changes, not even
    // the ops before it.
    step(&mut machine, 3, command(acquire(A, "repo/b")));
    step(&mut machine, 3, command(claim(A)));
    let cases = [
        (
            txn(
                Some(A),
                vec![],
                vec![
                    txn_put("x", "1"),
                    TxnOp::Release {
                        resource: path("repo/a"),
                    },
                ],
                vec![],
            ),
            "LEASE_LOST",
        ),
        (
            txn(
                Some(B),
                vec![],
                vec![txn_put("x", "1"), txn_complete("next", 4)],
                vec![],
            ),
            "STALE_FENCE current=4",
        ),
        (
            txn(
                Some(A),
                vec![],
                vec![txn_put("x", "1"), txn_complete("next", 3)],
                vec![],
            ),
            "STALE_FENCE current=4",
        ),
        (
            txn(
                None,
                vec![],
                vec![txn_put("x", "1"), txn_put("x", "2")],
                vec![],
            ),
            "INVALID_ARGUMENT",
        ),
        (
            txn(
                None,
                vec![],
                vec![
                    txn_put("x", "1"),
                    TxnOp::Delete {
                        key: path("nothing"),
                    },
                ],
                vec![],
            ),
            "NOT_FOUND",
        ),
        (
            txn(
                None,
                vec![],
                vec![txn_add("y", &[]), txn_add("y", &[])],
                vec![],
            ),
            "INVALID_ARGUMENT",
        ),
        (
            txn(None, vec![], vec![txn_add("job", &[])], vec![]),
            "INVALID_ARGUMENT",
        ),
        // A task may not depend on one this transaction makes dead, or on its dependents.
        (
            txn(
                Some(A),
                vec![],
                vec![
                    txn_add("z", &["next"]),
                    txn_fail("next", 4),
                    txn_add("w", &["z"]),
                ],
                vec![],
            ),
            "INVALID_ARGUMENT",
        ),
        // Fenced parts need the transaction's session; bounds are the limits'.
        (
            txn(None, vec![], vec![txn_complete("next", 4)], vec![]),
            "INVALID_ARGUMENT",
        ),
        (
            txn(
                None,
                vec![Compare::Fence {
                    resource: path("repo/b"),
                    fence: 3,
                }],
                vec![],
                vec![],
            ),
            "INVALID_ARGUMENT",
        ),
        (
            txn(
                None,
                vec![],
                (0..65).map(|n| txn_put(&format!("k/{n}"), "1")).collect(),
                vec![],
            ),
            "INVALID_ARGUMENT",
        ),
    ];
    for (op, expected) in cases {
        refused_unchanged(&mut machine, op, expected);
    }
    // Failing and adding in one transaction works when nothing depends on the dead task; its
    // dependents die with it.
    assert_eq!(
        step(
            &mut machine,
            5,
            command(txn(
                Some(A),
                vec![],
                vec![
                    txn_add("z", &["next"]),
                    txn_fail("next", 4),
                    txn_add("w", &[])
                ],
                vec![],
            ))
        ),
        "txn succeeded=true [enqueued z; task next Dead attempt=1; enqueued w]"
    );
    assert_eq!(state(&machine, "z"), Some(TaskState::Dead));
    assert_eq!(state(&machine, "after-next"), Some(TaskState::Dead));
}

#[test]
fn a_full_namespace_counts_the_keys_a_transaction_deletes() {
    let mut machine = with_limits(|limits| limits.kv_keys_per_namespace_max = 2);
    step(&mut machine, 0, command(put("a", "1", None)));
    step(&mut machine, 0, command(put("b", "1", None)));
    refused_unchanged(
        &mut machine,
        txn(None, vec![], vec![txn_put("c", "1")], vec![]),
        "RESOURCE_EXHAUSTED",
    );
    assert_eq!(
        step(
            &mut machine,
            0,
            command(txn(
                None,
                vec![],
                vec![TxnOp::Delete { key: path("a") }, txn_put("c", "1")],
                vec![]
            ))
        ),
        "txn succeeded=true [deleted rev=3; written rev=4]"
    );
}

fn enqueue_compensated(id: &str, max_attempts: u32, depends_on: &[&str]) -> Op {
    let Op::Enqueue { queue, mut task } = enqueue(id, 0, depends_on) else {
        unreachable!()
    };
    task.max_attempts = max_attempts;
    task.on_dead = Some(Compensation {
        queue: name("undo"),
        payload: format!("{{\"undo\":\"{id}\"}}"),
        max_attempts: 3,
    });
    Op::Enqueue { queue, task }
}

#[test]
fn a_dead_task_enqueues_its_compensation_once() {
    let mut machine = check(vec![
        (0, create(A, "agent-a", 1_000), "session expires_in=1000"),
        (0, enqueue_compensated("charge", 1, &[]), "enqueued charge"),
        (
            0,
            enqueue_compensated("ship", 1, &["charge"]),
            "enqueued ship",
        ),
        (0, enqueue_compensated("lapse", 1, &[]), "enqueued lapse"),
        (0, claim(A), "claimed charge fence=1 attempt=1"),
        // The failed step and its dependent each leave their undo, in the same apply.
        (0, fail("charge", A, 1, false), "task charge Dead attempt=1"),
    ]);
    let undo = |machine: &Machine| -> Vec<(String, String)> {
        machine
            .tasks(&namespace(), &name("undo"), None, None, 100)
            .items
            .into_iter()
            .map(|task| (task.id.to_string(), task.payload))
            .collect()
    };
    assert_eq!(
        undo(&machine),
        [
            ("on-dead-6".to_owned(), "{\"undo\":\"charge\"}".to_owned()),
            ("on-dead-7".to_owned(), "{\"undo\":\"ship\"}".to_owned()),
        ]
    );
    // A claim that lapses on the last attempt compensates too, at the entry that sees it.
    step(&mut machine, 0, command(claim(A)));
    step(&mut machine, 1_000, command(keepalive(B)));
    assert_eq!(undo(&machine).len(), 3);
    assert!(undo(&machine)
        .iter()
        .any(|(_, payload)| payload == "{\"undo\":\"lapse\"}"));
    // Once: nothing later adds another.
    step(&mut machine, 5_000, Command::Sweep { max: 100 });
    assert_eq!(undo(&machine).len(), 3);
    // A compensation's queue name is checked like any queue's.
    let Op::Enqueue { queue, mut task } = enqueue_compensated("bad", 1, &[]) else {
        unreachable!()
    };
    task.on_dead.as_mut().unwrap().queue = Name::new("queue", "q".repeat(129)).unwrap();
    refused_unchanged(
        &mut machine,
        Op::Enqueue { queue, task },
        "INVALID_ARGUMENT",
    );
}

#[test]
fn finished_tasks_are_removed_after_their_retention() {
    let mut machine = with_limits(|limits| limits.task_retention_ms = 10_000);
    let steps: Vec<(u64, Op, &str)> = vec![
        (0, create(A, "agent-a", 60_000), "session expires_in=60000"),
        (0, enqueue("a", 1, &[]), "enqueued a"),
        (0, enqueue("b", 0, &[]), "enqueued b"),
        (0, enqueue("c", 0, &["a"]), "enqueued c"),
        (0, claim(A), "claimed a fence=1 attempt=1"),
        (0, complete("a", A, 1), "task a Done attempt=1"),
        (1_000, claim(A), "claimed b fence=2 attempt=1"),
        (1_000, fail("b", A, 2, false), "task b Dead attempt=1"),
    ];
    check_on(&mut machine, steps);
    let revision = machine.revision(&namespace());
    assert!(!machine.sweep_due());
    assert_eq!(
        step(&mut machine, 9_999, Command::Sweep { max: 100 }),
        "swept leases=0 sessions=0 tasks=0"
    );
    step(&mut machine, 10_000, command(keepalive(A)));
    assert!(machine.sweep_due());
    assert_eq!(
        step(&mut machine, 10_000, Command::Sweep { max: 100 }),
        "swept leases=0 sessions=0 tasks=1"
    );
    let ids = |machine: &Machine| -> Vec<String> {
        machine
            .tasks(&namespace(), &name("q"), None, None, 100)
            .items
            .iter()
            .map(|task| task.id.to_string())
            .collect()
    };
    assert_eq!(ids(&machine), ["b", "c"]);
    // The dependent of the removed task is unaffected: its dependency was done.
    assert_eq!(
        machine
            .task(&namespace(), &name("q"), &name("c"))
            .map(|task| task.state),
        Some(TaskState::Ready)
    );
    assert_eq!(machine.queue_counts(&namespace(), &name("q")).done, 0);
    assert_eq!(
        step(&mut machine, 11_000, Command::Sweep { max: 100 }),
        "swept leases=0 sessions=0 tasks=1"
    );
    assert_eq!(ids(&machine), ["c"]);
    // Their events stay.
    let events = machine
        .events_after(&namespace(), 0, 100)
        .expect("in the window");
    assert!(events
        .iter()
        .any(|event| matches!(&event.kind, EventKind::TaskCompleted { task_id, .. } if task_id.as_str() == "a")));
    // Removal is clean-up, not a change anyone waits for: no event.
    assert_eq!(machine.revision(&namespace()), revision);
}

#[test]
fn retention_removal_is_bounded_per_sweep() {
    let mut machine = with_limits(|limits| {
        limits.task_retention_ms = 1_000;
        limits.sweep_batch_max = 2;
    });
    step(&mut machine, 0, command(create(A, "agent-a", 60_000)));
    for n in 0..5 {
        step(&mut machine, 0, command(enqueue(&format!("t{n}"), 0, &[])));
        let claimed = step(&mut machine, 0, command(claim(A)));
        let fence: u64 = claimed
            .split("fence=")
            .nth(1)
            .and_then(|rest| rest.split(' ').next())
            .and_then(|fence| fence.parse().ok())
            .expect("a fence");
        step(
            &mut machine,
            0,
            command(complete(&format!("t{n}"), A, fence)),
        );
    }
    let sweeps: Vec<String> = (0..4)
        .map(|_| step(&mut machine, 1_000, Command::Sweep { max: 100 }))
        .collect();
    assert_eq!(
        sweeps,
        [
            "swept leases=0 sessions=0 tasks=2",
            "swept leases=0 sessions=0 tasks=2",
            "swept leases=0 sessions=0 tasks=1",
            "swept leases=0 sessions=0 tasks=0",
        ]
    );
    assert!(machine
        .tasks(&namespace(), &name("q"), None, None, 100)
        .items
        .is_empty());
}

/// A task that died through one dependency stays listed by its others; once retention removed
/// it and a new task took its id, completing (or killing) that other dependency must not
/// touch the newcomer.
#[test]
fn a_retired_task_id_taken_again_is_a_new_task() {
    let mut machine = with_limits(|limits| limits.task_retention_ms = 1_000);
    let steps: Vec<(u64, Op, &str)> = vec![
        (0, create(A, "agent-a", 60_000), "session expires_in=60000"),
        (0, enqueue("t", 0, &[]), "enqueued t"),
        (0, enqueue("u", 1, &[]), "enqueued u"),
        (0, enqueue("w", 0, &["t", "u"]), "enqueued w"),
        (0, claim(A), "claimed u fence=1 attempt=1"),
        (0, fail("u", A, 1, false), "task u Dead attempt=1"),
    ];
    check_on(&mut machine, steps);
    assert_eq!(
        step(&mut machine, 1_000, Command::Sweep { max: 100 }),
        "swept leases=0 sessions=0 tasks=2"
    );
    let steps: Vec<(u64, Op, &str)> = vec![
        (1_000, enqueue("w", 0, &[]), "enqueued w"),
        (1_000, claim(A), "claimed t fence=2 attempt=1"),
        (1_000, complete("t", A, 2), "task t Done attempt=1"),
        (1_000, claim(A), "claimed w fence=3 attempt=1"),
    ];
    check_on(&mut machine, steps);
}

// ---- shared leases ----

const D: u128 = 4;
const E: u128 = 5;

fn acquire_shared(session: u128, resource: &str, limit: u32) -> Op {
    acquire_as(session, resource, LeaseMode::Shared { limit })
}

#[test]
fn a_shared_lease_admits_up_to_its_limit_and_conflicts_like_one_lease() {
    let mut machine = check(vec![
        (0, create(A, "agent-a", 1_000), "session expires_in=1000"),
        (0, create(B, "agent-b", 10_000), "session expires_in=10000"),
        (0, create(C, "agent-c", 10_000), "session expires_in=10000"),
        (0, create(D, "agent-d", 10_000), "session expires_in=10000"),
        (0, create(E, "agent-e", 10_000), "session expires_in=10000"),
        (
            0,
            acquire_shared(A, "team/ci", 3),
            "granted fence=1 expires_in=1000",
        ),
        (
            0,
            acquire_shared(B, "team/ci", 3),
            "granted fence=2 expires_in=10000",
        ),
        // Its own session again: refused, and it recognises itself.
        (
            0,
            acquire_shared(B, "team/ci", 3),
            "LEASE_HELD agent-b fence=2 expires_in=10000",
        ),
        (
            0,
            acquire_shared(C, "team/ci", 3),
            "granted fence=3 expires_in=10000",
        ),
        // Full: the oldest holder is named, and every holder listed.
        (
            0,
            acquire_shared(D, "team/ci", 3),
            "LEASE_HELD agent-a fence=1 expires_in=1000",
        ),
        // Every holder gives the same limit.
        (0, acquire_shared(D, "team/ci", 4), "INVALID_ARGUMENT"),
        (0, acquire_shared(D, "team/ci", 0), "INVALID_ARGUMENT"),
        (0, acquire_shared(D, "team/ci", 1_025), "INVALID_ARGUMENT"),
        // Shared holders are one conflicting set for exclusive and subtree leases...
        (
            0,
            acquire(D, "team/ci"),
            "LEASE_HELD agent-a fence=1 expires_in=1000",
        ),
        (
            0,
            acquire_subtree(D, "team"),
            "LEASE_HELD agent-a fence=1 expires_in=1000",
        ),
        // ... and not for the paths below or beside them.
        (
            0,
            acquire(D, "team/ci/cache"),
            "granted fence=4 expires_in=10000",
        ),
        (
            0,
            acquire_subtree(D, "other"),
            "granted fence=5 expires_in=10000",
        ),
        (
            0,
            acquire_shared(E, "other/x", 2),
            "LEASE_HELD agent-d fence=5 expires_in=10000",
        ),
        (0, acquire(E, "solo"), "granted fence=6 expires_in=10000"),
        (
            0,
            acquire_shared(D, "solo", 2),
            "LEASE_HELD agent-e fence=6 expires_in=10000",
        ),
    ]);
    let refusal = machine
        .apply(&Batch {
            stamp_ms: 0,
            commands: vec![command(acquire_shared(D, "team/ci", 3))],
        })
        .pop()
        .expect("one response");
    match refusal.outcome {
        Err(Rejection::LeaseHeld {
            holders,
            holders_total,
            message,
            ..
        }) => {
            let fences: Vec<u64> = holders.iter().map(|view| view.fence).collect();
            assert_eq!((fences, holders_total), (vec![1, 2, 3], 3));
            assert!(message.contains("shared by 3 of 3 holders"), "{message}");
        }
        other => panic!("expected LEASE_HELD, got {other:?}"),
    }
    // Each holder's fence is live: fence checks and fenced writes take any of them, with its
    // own session.
    assert!(
        machine
            .fence_status(&namespace(), &path("team/ci"), 2)
            .current
    );
    assert!(
        !machine
            .fence_status(&namespace(), &path("team/ci"), 4)
            .current
    );
    let holders: Vec<u64> = machine
        .leases(&namespace(), "team/ci", None, 100)
        .items
        .iter()
        .filter(|view| view.resource.as_str() == "team/ci")
        .map(|view| view.fence)
        .collect();
    assert_eq!(holders, [1, 2, 3]);
    check_on(
        &mut machine,
        vec![
            (0, put("k", "1", fence(C, "team/ci", 3)), "written rev=7"),
            (
                0,
                put("k", "2", fence(D, "team/ci", 3)),
                "STALE_FENCE current=3",
            ),
            // A release frees one place at once.
            (0, release(B, "team/ci"), "released fence=2"),
            (
                0,
                acquire_shared(D, "team/ci", 3),
                "granted fence=7 expires_in=10000",
            ),
            (
                0,
                acquire_shared(E, "team/ci", 3),
                "LEASE_HELD agent-a fence=1 expires_in=1000",
            ),
            // A holder whose session expired makes room, cleared by the grant that takes it.
            (
                1_000,
                acquire_shared(E, "team/ci", 3),
                "granted fence=8 expires_in=9000",
            ),
            (1_000, end(C), "ended [team/ci]"),
            (1_000, end(D), "ended [other,team/ci,team/ci/cache]"),
            (1_000, end(E), "ended [solo,team/ci]"),
            // The last holder gone, the path takes another limit.
            (
                1_000,
                acquire_shared(B, "team/ci", 5),
                "granted fence=9 expires_in=9000",
            ),
        ],
    );
    assert!(
        machine
            .fence_status(&namespace(), &path("team/ci"), 9)
            .current
    );
}

#[test]
fn shared_holds_expire_with_their_session_or_max_hold_and_are_swept() {
    let mut machine = check(vec![
        (0, create(A, "agent-a", 1_000), "session expires_in=1000"),
        (0, create(B, "agent-b", 10_000), "session expires_in=10000"),
        (
            0,
            acquire_shared(A, "pool", 2),
            "granted fence=1 expires_in=1000",
        ),
        (
            0,
            Op::Acquire {
                resource: path("pool"),
                mode: LeaseMode::Shared { limit: 2 },
                owner: Owner::Session(SessionId(B)),
                max_hold_ms: Some(2_000),
                labels: Labels::new(),
            },
            "granted fence=2 expires_in=2000",
        ),
    ]);
    assert!(!machine.sweep_due());
    assert_eq!(
        step(&mut machine, 1_000, Command::Sweep { max: 100 }),
        "swept leases=1 sessions=1 tasks=0"
    );
    assert_eq!(
        machine
            .lease(&namespace(), &path("pool"))
            .map(|view| view.fence),
        Some(2)
    );
    assert_eq!(
        step(&mut machine, 2_000, Command::Sweep { max: 100 }),
        "swept leases=1 sessions=0 tasks=0"
    );
    assert!(machine.lease(&namespace(), &path("pool")).is_none());
    let events: Vec<String> = machine
        .events_after(&namespace(), 0, 100)
        .expect("kept")
        .iter()
        .map(|event| format!("{:?}", event.kind))
        .collect();
    assert_eq!(events.len(), 4, "{events:?}");
    assert!(events[2].starts_with("Expired") && events[3].starts_with("Expired"));
}

// ---- the line ----

fn wait_as(session: u128, resource: &str, mode: LeaseMode) -> Op {
    Op::AcquireOrWait {
        resource: path(resource),
        mode,
        owner: Owner::Session(SessionId(session)),
        max_hold_ms: None,
        labels: Labels::new(),
    }
}

fn wait(session: u128, resource: &str) -> Op {
    wait_as(session, resource, LeaseMode::Exclusive)
}

fn leave(session: u128, resource: &str) -> Op {
    Op::LeaveOrRelease {
        session_id: SessionId(session),
        resource: path(resource),
    }
}

/// The lease events after `after`, as `granted a bob`, `queued a carol`, `expired a`, ...
fn lease_events(machine: &Machine, after: u64) -> Vec<String> {
    machine
        .events_after(&namespace(), after, 1_000)
        .expect("within the window")
        .into_iter()
        .filter_map(|event| match event.kind {
            EventKind::Granted {
                resource, holder, ..
            } => Some(format!("granted {resource} {holder}")),
            EventKind::Queued {
                resource, holder, ..
            } => Some(format!("queued {resource} {holder}")),
            EventKind::LeftLine { resource, holder } => Some(format!("left {resource} {holder}")),
            EventKind::Released { resource, .. } => Some(format!("released {resource}")),
            EventKind::Expired { resource, .. } => Some(format!("expired {resource}")),
            _ => None,
        })
        .collect()
}

fn holder_of(machine: &Machine, resource: &str) -> Option<String> {
    machine
        .lease(&namespace(), &path(resource))
        .map(|view| view.holder)
}

#[test]
fn the_line_grants_in_arrival_order_in_the_apply_that_frees_the_resource() {
    let mut machine = check(vec![
        (0, create(A, "alice", 1_000), "session expires_in=1000"),
        (0, create(B, "bob", 1_000), "session expires_in=1000"),
        (0, create(C, "carol", 5_000), "session expires_in=5000"),
        (1, acquire(A, "a"), "granted fence=1 expires_in=999"),
        (2, wait(B, "a"), "queued position=1"),
        (3, wait(C, "a"), "queued position=2"),
        // Asking again keeps the place and changes nothing.
        (4, wait(B, "a"), "still queued position=1"),
        (4, wait(C, "a"), "still queued position=2"),
        // The release grants bob in the same apply: a new fence, a new holder.
        (5, release(A, "a"), "released fence=1"),
    ]);
    assert_eq!(holder_of(&machine, "a").as_deref(), Some("bob"));
    assert_eq!(
        machine.line_position(&namespace(), &path("a"), SessionId(C)),
        Some(1)
    );
    // Bob falls silent: his session dies at 1000, and the first entry at or after it hands
    // the resource to carol before any of its commands runs.
    assert_eq!(
        step(&mut machine, 1_000, command(acquire(A, "b"))),
        "LEASE_LOST"
    );
    assert_eq!(holder_of(&machine, "a").as_deref(), Some("carol"));
    assert_eq!(
        lease_events(&machine, 0),
        [
            "granted a alice",
            "queued a bob",
            "queued a carol",
            "released a",
            "granted a bob",
            "expired a",
            "granted a carol",
        ]
    );
    assert_eq!(machine.fence_counter(), 3);
}

#[test]
fn nobody_overtakes_the_line_and_shared_waiters_in_a_row_are_granted_together() {
    let shared = LeaseMode::Shared { limit: 3 };
    let machine = check(vec![
        (0, create(A, "alice", 10_000), "session expires_in=10000"),
        (0, create(B, "bob", 10_000), "session expires_in=10000"),
        (0, create(C, "carol", 10_000), "session expires_in=10000"),
        (0, create(4, "dave", 10_000), "session expires_in=10000"),
        (0, create(5, "erin", 10_000), "session expires_in=10000"),
        (1, acquire(A, "s"), "granted fence=1 expires_in=9999"),
        (2, wait_as(B, "s", shared), "queued position=1"),
        (2, wait_as(C, "s", shared), "queued position=2"),
        (2, wait(4, "s"), "queued position=3"),
        (2, wait_as(5, "s", shared), "queued position=4"),
        // A try-lock does not overtake the line either.
        (
            3,
            acquire_as(5, "t", shared),
            "granted fence=2 expires_in=9997",
        ),
        (
            3,
            acquire_as(4, "s", shared),
            "LEASE_HELD alice fence=1 expires_in=9997",
        ),
        // Bob and carol are granted together; dave (exclusive) waits for them, and erin
        // waits behind dave although her shared acquire would fit.
        (4, release(A, "s"), "released fence=1"),
        (5, wait_as(A, "s", shared), "queued position=3"),
        (6, release(B, "s"), "released fence=3"),
        (7, leave(C, "s"), "released fence=4"),
    ]);
    assert_eq!(holder_of(&machine, "s").as_deref(), Some("dave"));
    assert_eq!(
        lease_events(&machine, 0)[6..],
        [
            "released s",
            "granted s bob",
            "granted s carol",
            "queued s alice",
            "released s",
            "released s",
            "granted s dave",
        ]
    );
    let mut machine = machine;
    check_on(&mut machine, vec![(8, release(4, "s"), "released fence=5")]);
    let holders: Vec<String> = machine
        .leases(&namespace(), "s", None, 10)
        .items
        .into_iter()
        .filter(|view| view.resource == path("s"))
        .map(|view| view.holder)
        .collect();
    assert_eq!(holders, ["erin", "alice"]);
}

#[test]
fn a_waiter_leaves_the_line_on_request_or_with_its_session() {
    let machine = check(vec![
        (0, create(A, "alice", 10_000), "session expires_in=10000"),
        (0, create(B, "bob", 10_000), "session expires_in=10000"),
        (0, create(C, "carol", 10_000), "session expires_in=10000"),
        (0, create(4, "dave", 1_000), "session expires_in=1000"),
        (1, acquire(A, "a"), "granted fence=1 expires_in=9999"),
        (2, wait(4, "a"), "queued position=1"),
        (2, wait(B, "a"), "queued position=2"),
        (2, wait(C, "a"), "queued position=3"),
        (3, leave(B, "a"), "left the line of a"),
        (3, leave(B, "a"), "LEASE_LOST"),
        (3, wait(C, "a"), "still queued position=2"),
        // Dave's session dies: he no longer counts, and the sweep takes him out.
        (1_000, wait(C, "a"), "still queued position=1"),
    ]);
    let mut machine = machine;
    assert_eq!(
        step(&mut machine, 1_001, Command::Sweep { max: 10 }),
        "swept leases=0 sessions=1 tasks=0"
    );
    check_on(
        &mut machine,
        vec![
            (1_002, end(C), "ended []"),
            (1_003, release(A, "a"), "released fence=1"),
        ],
    );
    assert_eq!(holder_of(&machine, "a"), None);
    assert_eq!(
        lease_events(&machine, 0),
        [
            "granted a alice",
            "queued a dave",
            "queued a bob",
            "queued a carol",
            "left a bob",
            "left a dave",
            "left a carol",
            "released a",
        ]
    );
}

#[test]
fn a_session_never_waits_for_itself_and_its_places_count_towards_its_limit() {
    let mut machine = with_limits(|limits| limits.leases_per_session_max = 2);
    check_on(
        &mut machine,
        vec![
            (0, create(A, "alice", 10_000), "session expires_in=10000"),
            (0, create(B, "bob", 10_000), "session expires_in=10000"),
            (1, acquire(A, "a"), "granted fence=1 expires_in=9999"),
            (
                1,
                acquire_subtree(A, "t"),
                "granted fence=2 expires_in=9999",
            ),
            (2, wait(A, "b"), "RESOURCE_EXHAUSTED"),
            // Asking again for what it holds answers with its grant; another mode is refused.
            (2, wait(A, "a"), "still granted fence=1 expires_in=9998"),
            (2, release(A, "t"), "released fence=2"),
            (
                2,
                wait_as(A, "a", LeaseMode::Shared { limit: 2 }),
                "LEASE_HELD alice fence=1 expires_in=9998",
            ),
            (
                2,
                acquire_subtree(A, "t"),
                "granted fence=3 expires_in=9998",
            ),
            (2, wait(A, "t/x"), "RESOURCE_EXHAUSTED"),
            (3, wait(B, "a"), "queued position=1"),
            (3, wait_as(B, "t", LeaseMode::Subtree), "queued position=1"),
            (3, wait(B, "u"), "RESOURCE_EXHAUSTED"),
            // Bob gets t from the line, and alice waits below it.
            (4, release(A, "t"), "released fence=3"),
            (4, wait(A, "t/x"), "queued position=1"),
            // A new session can be created to wait.
            (
                5,
                Op::AcquireOrWait {
                    resource: path("a"),
                    mode: LeaseMode::Exclusive,
                    owner: Owner::NewSession(new_session(C, "carol", 1_000)),
                    max_hold_ms: None,
                    labels: Labels::new(),
                },
                "queued position=2",
            ),
        ],
    );
    // A refused wait changes nothing.
    let before = machine.encode_snapshot().expect("encode");
    assert_eq!(
        step(&mut machine, 5, command(wait(B, "b"))),
        "RESOURCE_EXHAUSTED"
    );
    assert_eq!(machine.encode_snapshot().expect("encode"), before);
}

#[test]
fn subtree_waiters_are_served_when_a_lease_below_them_dies_or_reaches_its_max_hold() {
    let mut machine = check(vec![
        (0, create(A, "alice", 1_000), "session expires_in=1000"),
        (0, create(B, "bob", 10_000), "session expires_in=10000"),
        (0, create(C, "carol", 10_000), "session expires_in=10000"),
        (1, acquire(A, "a/b"), "granted fence=1 expires_in=999"),
        (
            1,
            acquire_max_hold(C, "x/y", 50),
            "granted fence=2 expires_in=50",
        ),
        (2, wait_as(B, "a", LeaseMode::Subtree), "queued position=1"),
        (2, wait_as(A, "x", LeaseMode::Subtree), "queued position=1"),
        // Carol's max hold on x/y ends at 51: alice gets x.
        (51, keepalive(B), "kept_alive expires_in=10000"),
    ]);
    assert_eq!(holder_of(&machine, "x").as_deref(), Some("alice"));
    assert_eq!(holder_of(&machine, "a"), None);
    // Alice's session (holding a/b and now x) dies at 1000: bob gets the subtree a.
    assert_eq!(
        step(&mut machine, 1_000, command(keepalive(B))),
        "kept_alive expires_in=10000"
    );
    assert_eq!(holder_of(&machine, "a").as_deref(), Some("bob"));
    let snapshot = machine.encode_snapshot().expect("encode");
    assert_eq!(
        Machine::decode_snapshot(&snapshot).expect("decode"),
        machine
    );
}

#[test]
fn lines_survive_a_snapshot_with_their_order() {
    let mut machine = check(vec![
        (0, create(A, "alice", 10_000), "session expires_in=10000"),
        (0, create(B, "bob", 10_000), "session expires_in=10000"),
        (0, create(C, "carol", 10_000), "session expires_in=10000"),
        (1, acquire(A, "a"), "granted fence=1 expires_in=9999"),
        (2, wait(C, "a"), "queued position=1"),
        (3, wait(B, "a"), "queued position=2"),
    ]);
    let mut restored =
        Machine::decode_snapshot(&machine.encode_snapshot().expect("encode")).expect("decode");
    assert_eq!(restored, machine);
    for machine in [&mut machine, &mut restored] {
        assert_eq!(
            step(machine, 4, command(release(A, "a"))),
            "released fence=1"
        );
        assert_eq!(holder_of(machine, "a").as_deref(), Some("carol"));
        assert_eq!(step(machine, 5, command(end(C))), "ended [a]");
        assert_eq!(holder_of(machine, "a").as_deref(), Some("bob"));
    }
    assert_eq!(restored, machine);
}

/// Replies recorded for idempotency by format 3 (task views without `on_dead`; written by the
/// build before format 4) decode, and a retry still gets its recorded answer; the task's own
/// view shows its `on_dead`.
#[test]
fn replies_recorded_by_format_3_still_replay() {
    let mut machine =
        Machine::decode_snapshot(include_bytes!("../tests/fixtures/snapshot-v3-replies.bin"))
            .expect("a format 3 snapshot with recorded task replies decodes");
    let retry = |key: &str| Command::Namespaced {
        namespace: namespace(),
        idempotency: Some(IdempotencyTag {
            key: key.to_owned(),
            fingerprint: [7; 32],
            wall_ms: 1,
        }),
        // A retry is recognised by its key and fingerprint before its op is looked at.
        op: keepalive(9),
    };
    let responses = machine.apply(&Batch {
        stamp_ms: 20,
        commands: vec![
            retry("key-enqueue-0000001"),
            retry("key-claim-00000001"),
            retry("key-txn-0000000001"),
        ],
    });
    assert!(responses.iter().all(|response| response.replayed.is_some()));
    let ids: Vec<String> = responses
        .iter()
        .map(|response| match &response.outcome {
            Ok(Reply::TaskEnqueued(task)) => format!("enqueued {} {:?}", task.id, task.on_dead),
            Ok(Reply::TaskClaimed(claimed)) => format!("claimed {}", claimed.task.id),
            Ok(Reply::TxnDone { results, .. }) => match &results[..] {
                [Reply::TaskEnqueued(task)] => format!("txn enqueued {}", task.id),
                other => format!("{other:?}"),
            },
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(ids, ["enqueued t1 None", "claimed t1", "txn enqueued t2"]);
    let task = machine
        .task(&namespace(), &name("q"), &name("t1"))
        .expect("t1");
    assert_eq!(
        task.on_dead
            .map(|compensation| compensation.queue.to_string()),
        Some("undo".to_owned())
    );
    let reencoded = machine.encode_snapshot().expect("encode");
    assert_eq!(
        Machine::decode_snapshot(&reencoded).expect("decode"),
        machine
    );
}

#[test]
fn a_new_fence_epoch_grants_above_every_fence_of_the_old_one() {
    let mut machine = check(vec![
        (0, create(A, "alice", 10_000), "session expires_in=10000"),
        (1, acquire(A, "a"), "granted fence=1 expires_in=9999"),
    ]);
    // What a restore seeds: the copy at fence 1, whatever the old cluster granted after it.
    let mut restored = machine.clone();
    assert_eq!(restored.begin_fence_epoch(), 1);
    assert_eq!(restored.fence_counter(), 1 << FENCE_EPOCH_SHIFT);
    check_on(
        &mut restored,
        vec![(
            2,
            acquire(A, "b"),
            "granted fence=1099511627777 expires_in=9998",
        )],
    );
    // The old cluster after the copy: every fence it grants stays below the new epoch.
    for stamp in 2..100 {
        step(&mut machine, stamp, command(release(A, "a")));
        step(&mut machine, stamp, command(acquire(A, "a")));
    }
    assert!(machine.fence_counter() < restored.fence_counter());
    // A restore of a restored cluster raises the epoch again; the holder's lease keeps its
    // fence (it was granted, and fences are checked against a resource's highest seen).
    assert_eq!(restored.begin_fence_epoch(), 2);
    assert_eq!(restored.fence_counter(), 2 << FENCE_EPOCH_SHIFT);
    assert_eq!(
        restored.lease(&namespace(), &path("b")).unwrap().fence,
        (1 << 40) + 1
    );
}

// ---- the snapshot format's bytes ----

/// A machine holding some of everything a snapshot carries: a token, sessions, exclusive,
/// subtree and shared leases, a max hold, a waiter in line, fenced and idempotent writes,
/// tasks ready, waiting on a dependency, delayed and claimed, and their events.
fn some_of_everything() -> Machine {
    let key = "0f5e7a8c-2222-4222-8333-944455556666";
    let mut machine = Machine::default();
    let steps = [
        (0, token("ops", Role::Admin, &["*"], 1), "token ops admin"),
        (
            0,
            command(create(A, "agent-a", 10_000)),
            "session expires_in=10000",
        ),
        (
            0,
            command(create(B, "agent-b", 10_000)),
            "session expires_in=10000",
        ),
        (
            0,
            command(create(C, "agent-c", 10_000)),
            "session expires_in=10000",
        ),
        (
            1,
            command(acquire_max_hold(A, "a/b", 5_000)),
            "granted fence=1 expires_in=5000",
        ),
        (
            1,
            command(acquire_subtree(A, "c")),
            "granted fence=2 expires_in=9999",
        ),
        (
            2,
            command(acquire_shared(B, "s", 2)),
            "granted fence=3 expires_in=9998",
        ),
        (
            2,
            command(acquire_shared(C, "s", 2)),
            "granted fence=4 expires_in=9998",
        ),
        (3, command(wait(B, "a/b")), "queued position=1"),
        (
            3,
            command(put("c/k", "{\"x\":1}", fence(A, "c", 2))),
            "written rev=6",
        ),
        (4, command(enqueue("t1", 1, &[])), "enqueued t1"),
        (4, command(enqueue("t2", 0, &["t1"])), "enqueued t2"),
        (4, command(enqueue_with("t3", 3, 1_000)), "enqueued t3"),
        (5, command(claim(C)), "claimed t1 fence=5 attempt=1"),
        (6, tagged(key, 7, put("j", "2", None)), "written rev=11"),
    ];
    for (stamp_ms, command, answer) in steps {
        assert_eq!(step(&mut machine, stamp_ms, command), answer);
    }
    machine
}

/// The current format's bytes do not depend on how the machine keeps its maps: the build
/// before persistent maps (`BTreeMap`s) wrote tests/fixtures/snapshot-v5.bin from
/// `some_of_everything`, and this build writes the same bytes and reads them back. Releases
/// rely on it: a rolling upgrade compares replicas' digests across builds, and a follower of
/// either build installs the other's snapshots.
#[test]
fn the_current_format_writes_the_bytes_the_build_before_wrote() {
    let machine = some_of_everything();
    let bytes = machine.encode_snapshot().expect("encode");
    assert_eq!(
        bytes,
        include_bytes!("../tests/fixtures/snapshot-v5.bin"),
        "the snapshot bytes changed"
    );
    assert_eq!(Machine::decode_snapshot(&bytes).expect("decode"), machine);
}

/// A copy of the machine is what a snapshot encodes while applies go on: taking one shares
/// every map with the original (no entry is copied, so the copy costs the same at a million
/// leases as at one), and what the original applies afterwards never shows in the copy.
#[test]
fn a_copy_shares_the_state_and_never_sees_what_is_applied_after_it() {
    let mut machine = some_of_everything();
    let copy = machine.clone();
    assert!(copy.namespaces.ptr_eq(&machine.namespaces));
    assert!(copy.session_deadlines.ptr_eq(&machine.session_deadlines));
    let before = copy.encode_snapshot().expect("encode");
    assert_eq!(
        step(&mut machine, 7, command(release(A, "a/b"))),
        "released fence=1"
    );
    assert_eq!(
        step(&mut machine, 7, command(put("j", "3", None))),
        "written rev=14"
    );
    assert!(!copy.namespaces.ptr_eq(&machine.namespaces));
    assert_eq!(copy.encode_snapshot().expect("encode"), before);
    assert_ne!(machine.encode_snapshot().expect("encode"), before);
}
