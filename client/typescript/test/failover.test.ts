// Failover: SIGKILL the leader while a guard is held and fenced writes are running; the client
// carries on through the other nodes and no acknowledged write is lost. Then lose the quorum:
// the guard reports its loss once, before its G7 deadline.

import assert from "node:assert/strict";
import { test } from "node:test";

import { BatonError, ClaimLost, LeaseHeld } from "../src/index.js";
import { delay, makeClient, useCluster } from "./cluster.js";

const cluster = useCluster();

test("the client carries on when the leader is killed, and a guard reports a lost quorum once", async () => {
  const options = { namespace: "failover", timeoutMs: 1_000, retryBudgetMs: 12_000 };
  const client = makeClient(cluster, { ...options, holder: "agent-a" });
  const other = makeClient(cluster, { ...options, holder: "agent-b" });
  const reports: Array<[number, string]> = [];
  const guard = await client.lease("fo/resource", { ttlMs: 3_000, onLost: (why) => reports.push([performance.now(), why]) }).acquire();
  const firstFence = guard.fence;
  const acknowledged = new Map<string, number>();
  const errors: unknown[] = [];
  let stop = false;
  const writer = (async () => {
    for (let i = 1; !stop; i += 1) {
      try {
        await client.kvPut(`fo/k${i % 5}`, i, { guard });
        acknowledged.set(`fo/k${i % 5}`, i);
      } catch (error) {
        errors.push(error);
      }
      await delay(20);
    }
  })();
  try {
    await delay(500);
    const before = acknowledged.size;
    assert.ok(before > 0, String(errors));
    const leader = await cluster.leader();
    await leader.kill();
    const killedAt = performance.now();
    await delay(4_000); // more than two keepalive intervals and a TTL
    assert.deepEqual(errors, []);
    assert.ok(guard.isValid(), guard.lostReason());
    assert.deepEqual(reports, []);
    assert.ok(guard.validUntil > killedAt + 2_000); // renewed after the kill
    assert.notEqual((await cluster.leader(10_000)).id, leader.id);
    // Leases still exclude, and fences still rise across the leader change (G3).
    const held = await other.lease("fo/resource", { ttlMs: 3_000 }).acquire().catch((e: unknown) => e);
    assert.ok(held instanceof LeaseHeld && held.fence === firstFence);
    await other.withLease("fo/other", (newer) => assert.ok(newer.fence > firstFence), { ttlMs: 3_000 });
  } finally {
    stop = true;
    await writer;
  }
  // No acknowledged write was lost.
  for (const [key, value] of acknowledged) assert.equal((await client.kvGet(key)).value, value, key);

  // Lose the quorum: no renewal can succeed any more.
  await cluster.nodes.find((n) => n.alive())!.kill();
  const deadline = guard.validUntil;
  assert.match((await guard.waitLost(deadline - performance.now() + 1_000)) ?? "", /^expired/);
  assert.equal(reports.length, 1);
  assert.ok(reports[0]![0] <= deadline, `reported at ${reports[0]![0]}, deadline ${deadline}`);
  assert.ok(!guard.isValid());
  await assert.rejects(client.kvPut("fo/late", 1, { guard }), ClaimLost);
  await delay(500);
  assert.equal(reports.length, 1); // exactly once
  const ending = await guard.release().catch((e: unknown) => e); // no quorum to end the session with
  assert.ok(ending instanceof BatonError && ["OUTCOME_UNKNOWN", "UNAVAILABLE", "NO_LEADER"].includes(ending.code), String(ending));
  assert.equal(reports.length, 1);
});
