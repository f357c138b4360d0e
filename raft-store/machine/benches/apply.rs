//! The cost of applying one command to the lease state machine as the state grows, and of a
//! whole-machine snapshot.
//!
//! For 1,000 and 1,000,000 live leases (spread over 1,000 sessions in one namespace, at paths
//! like `repo/dir{i % 100}/file{i}`), it measures:
//! - `acquire_release`: an exclusive acquire of a fresh path and its release, one entry each;
//! - `keepalive`: a keepalive of a session holding 1,000 (or 1) leases;
//! - `acquire_subtree_release`: a subtree acquire over an empty directory, and its release.
//!
//! Then `encode_snapshot` and `decode_snapshot` of the 1,000,000-lease machine, and
//! `events_after` on a namespace whose event window is full (100,000 events): what each event
//! stream reads after every entry that recorded an event (`at_the_head`: the newest event), and
//! a page of a reader that starts at the oldest.
//!
//! `cargo bench -p baton-machine --bench apply -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::time::Duration;

use baton_machine::{
    Batch, Command, Labels, LeaseMode, Limits, Machine, Namespace, NewSession, Op, Owner, Reply,
    ResourcePath, SessionId,
};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion};

const SESSIONS: u64 = 1_000;
/// Long enough that nothing expires while the benchmark runs (cluster time moves 1 ms an entry).
const TTL_MS: u64 = 3_600_000;

struct Fixture {
    machine: Machine,
    namespace: Namespace,
    limits: Limits,
    /// Cluster time: every measured entry is stamped one millisecond later.
    stamp_ms: u64,
}

impl Fixture {
    /// A machine holding `leases` live leases over `SESSIONS` sessions (or fewer, if smaller).
    fn new(leases: u64) -> Fixture {
        let limits = Limits::default();
        let namespace = Namespace::parse("bench", &limits).expect("a valid namespace");
        let mut fixture = Fixture {
            machine: Machine::new(limits.clone()),
            namespace,
            limits,
            stamp_ms: 1,
        };
        let sessions = SESSIONS.min(leases);
        let creates: Vec<Command> = (0..sessions)
            .map(|session| {
                fixture.on(Op::CreateSession(NewSession {
                    session_id: SessionId(u128::from(session) + 1),
                    holder: format!("agent-{session}"),
                    ttl_ms: TTL_MS,
                    labels: Labels::new(),
                }))
            })
            .collect();
        fixture.apply_all(creates);
        // Entries of 1,000 acquires, as a batching leader would propose them.
        let mut commands = Vec::with_capacity(1_000);
        for lease in 0..leases {
            commands.push(fixture.on(Op::Acquire {
                resource: fixture.path(&format!("repo/dir{}/file{lease}", lease % 100)),
                mode: LeaseMode::Exclusive,
                owner: Owner::Session(SessionId(u128::from(lease % sessions) + 1)),
                max_hold_ms: None,
                labels: Labels::new(),
            }));
            if commands.len() == 1_000 {
                fixture.apply_all(std::mem::take(&mut commands));
            }
        }
        fixture.apply_all(commands);
        assert_eq!(
            fixture.machine.counts(),
            (sessions as usize, leases as usize)
        );
        fixture
    }

    fn on(&self, op: Op) -> Command {
        Command::Namespaced {
            namespace: self.namespace.clone(),
            idempotency: None,
            op,
        }
    }

    fn path(&self, text: &str) -> ResourcePath {
        ResourcePath::parse(text, &self.limits).expect("a valid path")
    }

    fn apply_all(&mut self, commands: Vec<Command>) {
        if commands.is_empty() {
            return;
        }
        let responses = self.apply(commands);
        let refused = responses.iter().filter(|outcome| !**outcome).count();
        assert_eq!(
            refused, 0,
            "building the fixture: {refused} commands were refused"
        );
    }

    /// Applies one entry and says, per command, whether it succeeded.
    fn apply(&mut self, commands: Vec<Command>) -> Vec<bool> {
        self.stamp_ms += 1;
        let batch = Batch {
            stamp_ms: self.stamp_ms,
            commands,
        };
        self.machine
            .apply(&batch)
            .into_iter()
            .map(|response| response.outcome.is_ok())
            .collect()
    }

    fn apply_one(&mut self, op: Op) -> Reply {
        self.stamp_ms += 1;
        let batch = Batch {
            stamp_ms: self.stamp_ms,
            commands: vec![self.on(op)],
        };
        let mut responses = self.machine.apply(&batch);
        responses
            .pop()
            .expect("one response")
            .outcome
            .expect("the command succeeds")
    }
}

fn bench_size(c: &mut Criterion, leases: u64, label: &str) {
    let mut fixture = Fixture::new(leases);
    let session = SessionId(1);
    let mut group = c.benchmark_group(format!("apply/{label}"));

    let mut next = 0u64;
    group.bench_function("acquire_release", |b| {
        b.iter(|| {
            next += 1;
            let resource = fixture.path(&format!("repo/dir{}/fresh{next}", next % 100));
            let granted = fixture.apply_one(Op::Acquire {
                resource: resource.clone(),
                mode: LeaseMode::Exclusive,
                owner: Owner::Session(session),
                max_hold_ms: None,
                labels: Labels::new(),
            });
            black_box(granted);
            black_box(fixture.apply_one(Op::Release {
                session_id: session,
                resource,
            }));
        })
    });

    // Session 1 holds leases / SESSIONS leases: 1,000 in the big state, 1 in the small one.
    group.bench_function("keepalive", |b| {
        b.iter(|| {
            black_box(fixture.apply_one(Op::Keepalive {
                session_id: session,
            }))
        })
    });

    // A subtree over an empty directory must still look below its path for leases.
    group.bench_function("acquire_subtree_release", |b| {
        b.iter(|| {
            next += 1;
            let resource = fixture.path(&format!("repo/dir{}/tree{next}", next % 100));
            black_box(fixture.apply_one(Op::Acquire {
                resource: resource.clone(),
                mode: LeaseMode::Subtree,
                owner: Owner::Session(session),
                max_hold_ms: None,
                labels: Labels::new(),
            }));
            black_box(fixture.apply_one(Op::Release {
                session_id: session,
                resource,
            }));
        })
    });
    group.finish();
    assert_eq!(
        fixture.machine.counts().1,
        leases as usize,
        "the benchmark leaves the lease count as it was"
    );
}

fn apply_small(c: &mut Criterion) {
    bench_size(c, 1_000, "1k_leases");
}

fn apply_large(c: &mut Criterion) {
    bench_size(c, 1_000_000, "1m_leases");
}

fn snapshot(c: &mut Criterion) {
    let fixture = Fixture::new(1_000_000);
    let bytes = fixture
        .machine
        .encode_snapshot()
        .expect("the snapshot encodes");
    eprintln!(
        "snapshot of {} sessions and {} leases: {} bytes ({:.1} bytes a lease)",
        fixture.machine.counts().0,
        fixture.machine.counts().1,
        bytes.len(),
        bytes.len() as f64 / 1_000_000.0
    );
    let mut group = c.benchmark_group("snapshot/1m_leases");
    group.sample_size(10);
    group.bench_function("encode_snapshot", |b| {
        b.iter(|| {
            black_box(
                fixture
                    .machine
                    .encode_snapshot()
                    .expect("the snapshot encodes"),
            )
        })
    });
    // What a snapshot build holds the state's lock for: the rest runs on the copy.
    group.bench_function("copy", |b| b.iter(|| black_box(fixture.machine.clone())));
    group.bench_function("decode_snapshot", |b| {
        b.iter_batched(
            || (),
            |()| black_box(Machine::decode_snapshot(&bytes).expect("the snapshot decodes")),
            BatchSize::PerIteration,
        )
    });
    group.finish();
}

fn events(c: &mut Criterion) {
    let mut fixture = Fixture::new(1);
    let session = SessionId(1);
    let kept = fixture.limits.events_kept_max as u64;
    // An acquire and its release record an event each.
    for pair in 0..kept / 2 {
        let resource = fixture.path(&format!("events/{}", pair % 100));
        let ops = [
            Op::Acquire {
                resource: resource.clone(),
                mode: LeaseMode::Exclusive,
                owner: Owner::Session(session),
                max_hold_ms: None,
                labels: Labels::new(),
            },
            Op::Release {
                session_id: session,
                resource,
            },
        ];
        let commands = ops.into_iter().map(|op| fixture.on(op)).collect();
        fixture.apply_all(commands);
    }
    let namespace = fixture.namespace.clone();
    let newest = fixture.machine.revision(&namespace);
    let page = |after: u64| {
        fixture
            .machine
            .events_after(&namespace, after, 1_000)
            .expect("still in the window")
    };
    assert_eq!(page(newest - 1).len(), 1);
    assert_eq!(page(newest - kept).len(), 1_000, "the window is full");
    let mut group = c.benchmark_group("events/100k_kept");
    group.bench_function("at_the_head", |b| b.iter(|| black_box(page(newest - 1))));
    group.bench_function("a_page_from_the_oldest", |b| {
        b.iter(|| black_box(page(newest - kept)))
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = apply_small, apply_large, snapshot, events
}
criterion_main!(benches);
