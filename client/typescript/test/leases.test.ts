// Leases against a real cluster: grants, denials, fences, guards (G7, loss reported once),
// max hold, sessions, semaphores (shared leases) and the fair line.

import assert from "node:assert/strict";
import { test } from "node:test";

import { BatonClient, ClaimLost, LeaseHeld, NotFound, StaleFence } from "../src/index.js";
import { delay, makeClient, namespace, useCluster } from "./cluster.js";

const cluster = useCluster();

function pair(): [BatonClient, BatonClient] {
  const ns = namespace();
  return [makeClient(cluster, { namespace: ns, holder: "agent-a" }), makeClient(cluster, { namespace: ns, holder: "agent-b" })];
}

test("a grant, then a denial naming the holder, its fence and the time left", async () => {
  const [a, b] = pair();
  const guard = await a.lease("src/auth.rs", { ttlMs: 20_000 }).acquire();
  assert.ok(guard.isValid());
  assert.ok(guard.fence > 0);
  assert.equal(guard.resource, "src/auth.rs");
  assert.equal(guard.holder, "agent-a");
  assert.equal(guard.mode, "exclusive");
  const denied = await b.lease("src/auth.rs", { ttlMs: 20_000 }).acquire().then(
    () => assert.fail("granted twice"),
    (error: unknown) => error,
  );
  assert.ok(denied instanceof LeaseHeld);
  assert.equal(denied.code, "LEASE_HELD");
  assert.equal(denied.status, 409);
  assert.equal(denied.isIndeterminate, false);
  assert.equal(denied.holder, "agent-a");
  assert.equal(denied.fence, guard.fence);
  assert.equal(denied.resource, "src/auth.rs");
  assert.ok(denied.expiresIn! > 15 && denied.expiresIn! <= 20, String(denied.expiresIn));
  assert.match(denied.denial("src/auth.rs"), /^denied: agent-a holds src\/auth\.rs for (19|20) s more$/);
  assert.equal((await a.getLease("src/auth.rs")).fence, guard.fence);
  await guard.release();
  assert.ok(!guard.isValid());
  const second = await b.lease("src/auth.rs", { ttlMs: 20_000 }).acquire();
  assert.ok(second.fence > guard.fence);
  await second.release();
  await assert.rejects(a.getLease("src/auth.rs"), NotFound);
  // A subtree lease covers the paths below it; the denial says so.
  await a.withLease("src", async () => {
    const covered = await b.acquire("src/db.rs", { ttlMs: 5_000 }).catch((e: unknown) => e);
    assert.ok(covered instanceof LeaseHeld);
    assert.match(covered.denial("src/db.rs"), /^denied: agent-a holds src \(subtree\), which covers src\/db\.rs, for \d+ s more$/);
  }, { ttlMs: 5_000, mode: "subtree" });
});

test("fences rise, a stale fence is refused, and the fence check tells which is live", async () => {
  const [a] = pair();
  const fences: number[] = [];
  let oldSession = "";
  for (let i = 0; i < 3; i += 1) {
    await a.withLease("db/row", async (guard) => {
      fences.push(guard.fence);
      oldSession = guard.sessionId;
      await a.kvPut("db/value", { n: guard.fence }, { guard });
    }, { ttlMs: 10_000 });
  }
  assert.deepEqual([...fences].sort((x, y) => x - y), fences);
  assert.equal(new Set(fences).size, 3);
  await a.withLease("db/row", async (guard) => {
    const stale = await a.kvPut("db/value", { n: 0 }, { fence: { resource: "db/row", token: fences[0]! }, sessionId: oldSession }).catch((e: unknown) => e);
    assert.ok(stale instanceof StaleFence);
    assert.equal(stale.currentFence, guard.fence);
    await assert.rejects(
      a.kvPut("db/value", { n: 0 }, { fence: { resource: "db/row", token: fences[0]! }, sessionId: guard.sessionId }),
      StaleFence,
    );
    assert.deepEqual(await a.fenceCheck("db/row", fences[0]!), { current: false, fence: guard.fence });
    assert.equal((await a.fenceCheck("db/row", guard.fence)).current, true);
  }, { ttlMs: 10_000 });
  assert.deepEqual((await a.kvGet("db/value")).value, { n: fences[2] });
});

test("a guard renews past its TTL", async () => {
  const [a] = pair();
  const lost: string[] = [];
  const guard = await a.lease("renew/me", { ttlMs: 1_500, onLost: (why) => lost.push(why) }).acquire();
  const first = guard.validUntil;
  assert.ok(first - performance.now() <= 1_500);
  await delay(4_000); // well past the TTL: only renewals keep it
  assert.ok(guard.isValid(), guard.lostReason());
  assert.ok(guard.validUntil > first + 2_000);
  assert.equal((await a.fenceCheck("renew/me", guard.fence)).current, true);
  await a.kvPut("renew/value", 1, { guard });
  await guard.release();
  assert.deepEqual(lost, []);
  assert.equal(guard.signal.aborted, false); // a release is not a loss
  assert.ok(!guard.isValid());
});

test("a guard whose renewals stop reports its loss once, before its G7 deadline", async () => {
  const [a, b] = pair();
  const reports: Array<[number, string]> = [];
  const guard = await a.lease("pause/me", { ttlMs: 1_500, onLost: (why) => reports.push([performance.now(), why]) }).acquire();
  const aborted = new Promise<number>((resolve) => guard.signal.addEventListener("abort", () => resolve(performance.now())));
  guard.pauseRenewals();
  const deadline = guard.validUntil;
  const reason = await guard.waitLost(3_000);
  assert.match(reason ?? "", /^expired/);
  assert.equal(reports.length, 1);
  assert.ok(reports[0]![0] <= deadline, `reported at ${reports[0]![0]}, deadline ${deadline}`);
  assert.ok((await aborted) <= deadline);
  assert.ok(guard.signal.reason instanceof ClaimLost);
  assert.ok(!guard.isValid());
  await assert.rejects(a.kvPut("pause/k", 1, { guard }), ClaimLost);
  // The server's deadline passes too; then another agent gets the lease.
  await delay(300);
  const next = await b.lease("pause/me", { ttlMs: 5_000 }).acquire();
  assert.ok(next.fence > guard.fence);
  await next.release();
  await guard.release();
  assert.equal(reports.length, 1);
});

test("a max hold ends a lease even while it is renewed", async () => {
  const [a] = pair();
  const reports: string[] = [];
  const guard = await a.lease("hold/me", { ttlMs: 3_000, maxHoldMs: 1_200, onLost: (why) => reports.push(why) }).acquire();
  assert.ok(guard.validUntil <= performance.now() + 1_200);
  assert.equal(await guard.waitLost(3_000), "max hold reached");
  assert.deepEqual(reports, ["max hold reached"]);
  assert.ok(!guard.isValid());
  await guard.release();
});

test("a session holds several leases, renewed together", async () => {
  const [a, b] = pair();
  const session = await a.session({ ttlMs: 1_500 });
  const one = await session.lease("s/a.rs").acquire();
  const two = await session.lease("s/b.rs").acquire();
  assert.equal(one.sessionId, session.id);
  assert.equal(two.sessionId, session.id);
  await delay(2_500);
  assert.ok(one.isValid() && two.isValid() && session.isValid());
  const info = await a.getSession(session.id);
  assert.deepEqual((info.leases ?? []).map((l) => l.resource), ["s/a.rs", "s/b.rs"]);
  await one.release(); // releases one lease; the session keeps the other
  await assert.rejects(a.getLease("s/a.rs"), NotFound);
  assert.equal((await b.getLease("s/b.rs")).fence, two.fence);
  await session.end();
  await assert.rejects(a.getLease("s/b.rs"), NotFound);
  assert.ok(!two.isValid());
});

test("a semaphore: a shared lease held by up to limit sessions, each with its own fence", async () => {
  const ns = namespace();
  const agents = ["agent-a", "agent-b", "agent-c", "agent-d"].map((holder) => makeClient(cluster, { namespace: ns, holder }));
  const slots = [];
  for (const agent of agents.slice(0, 3)) {
    slots.push(await agent.lease("ci/test-suite", { ttlMs: 10_000, mode: "shared", limit: 3 }).acquire());
  }
  assert.equal(new Set(slots.map((s) => s.fence)).size, 3);
  assert.ok(slots.every((s) => s.mode === "shared"));
  const full = await agents[3]!.lease("ci/test-suite", { ttlMs: 10_000, mode: "shared", limit: 3 }).acquire().catch((e: unknown) => e);
  assert.ok(full instanceof LeaseHeld);
  assert.equal(full.limit, 3);
  assert.deepEqual(full.holders.map((h) => h.holder), ["agent-a", "agent-b", "agent-c"]);
  assert.match(full.denial(), /^denied: ci\/test-suite is shared by 3 of 3 holders \(agent-a, agent-b, agent-c\); the first frees up in \d+ s$/);
  // Each holder writes through its own fence.
  await agents[1]!.kvPut("ci/last", "b", { guard: slots[1]! });
  await slots[0]!.release();
  const fourth = await agents[3]!.lease("ci/test-suite", { ttlMs: 10_000, mode: "shared", limit: 3 }).acquire();
  assert.ok(fourth.fence > slots[2]!.fence);
  const listed = await agents[0]!.listLeases({ prefix: "ci/" });
  assert.deepEqual(listed.leases.map((l) => l.holder), ["agent-b", "agent-c", "agent-d"]);
  const walked = [];
  for await (const lease of agents[0]!.iterLeases("ci/")) walked.push(lease.fence);
  assert.deepEqual(walked, listed.leases.map((l) => l.fence));
  for (const guard of [...slots.slice(1), fourth]) await guard.release();
});

test("a waiter whose own session dies between rounds joins the line again", async () => {
  // The session a waiting acquire made for itself can die when the client renews it late (a
  // loaded machine): the place is lost, not the acquire, which ends as every wait does.
  const [a, b] = pair();
  const renewed: string[] = [];
  const renew = b.keepalive.bind(b);
  b.keepalive = async (sessionId: string) => {
    renewed.push(sessionId);
    if (renewed.length === 1) await delay(1_500); // past the 1 s TTL: the session is gone
    return renew(sessionId);
  };
  const held = await a.lease("busy/path", { ttlMs: 10_000 }).acquire();
  const denied = await b.lease("busy/path", { ttlMs: 1_000, waitMs: 3_000 }).acquire().then(
    () => assert.fail("granted while held"),
    (error: unknown) => error,
  );
  assert.ok(denied instanceof LeaseHeld, String(denied));
  assert.equal(denied.holder, "agent-a");
  assert.ok(new Set(renewed).size >= 2, "the late renewal came, then a new session's");
  await held.release();
  const guard = await b.lease("busy/path", { ttlMs: 3_000 }).acquire();
  await guard.release();
});

test("the fair line: waiters are granted in order when the holder lets go", async () => {
  const ns = namespace();
  const [a, b, c] = ["agent-a", "agent-b", "agent-c"].map((holder) => makeClient(cluster, { namespace: ns, holder }));
  const held = await a!.lease("db/migrations", { ttlMs: 10_000 }).acquire();
  const order: string[] = [];
  const waitB = b!.lease("db/migrations", { ttlMs: 3_000, waitMs: 8_000 }).acquire().then((g) => {
    order.push("agent-b");
    return g;
  });
  await delay(300); // b is first in line
  const waitC = c!.lease("db/migrations", { ttlMs: 3_000, waitMs: 8_000 }).acquire().then((g) => {
    order.push("agent-c");
    return g;
  });
  await delay(1_500); // longer than a round (a third of the TTL): the waiters keep their places
  await held.release();
  const gotB = await waitB;
  assert.ok(gotB.fence > held.fence);
  await delay(200);
  assert.deepEqual(order, ["agent-b"]);
  await gotB.release();
  const gotC = await waitC;
  assert.deepEqual(order, ["agent-b", "agent-c"]);
  assert.ok(gotC.fence > gotB.fence);
  await gotC.release();
  // A wait that runs out leaves the line and answers the denial.
  const blocker = await a!.lease("db/migrations", { ttlMs: 10_000 }).acquire();
  const started = performance.now();
  await assert.rejects(b!.lease("db/migrations", { ttlMs: 3_000, waitMs: 1_200 }).acquire(), LeaseHeld);
  assert.ok(performance.now() - started >= 1_100);
  const events = await a!.events({ after: 0 });
  assert.ok(events.events.some((e) => e.kind.type === "left_line"));
  await blocker.release();
});
