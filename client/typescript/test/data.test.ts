// The fenced key-value store, transactions, work queues and the worker loop, and event pages.

import assert from "node:assert/strict";
import { test } from "node:test";

import { InvalidArgument, NotFound, StaleFence, txn, type TaskClaim } from "../src/index.js";
import { delay, makeClient, namespace, useCluster } from "./cluster.js";

const cluster = useCluster();

test("the fenced key-value store", async () => {
  const a = makeClient(cluster, { namespace: namespace(), holder: "agent-a" });
  const guard = await a.lease("config", { ttlMs: 10_000 }).acquire();
  const put = await a.kvPut("config/flags", { new_ui: true }, { guard });
  const entry = await a.kvGet("config/flags");
  assert.deepEqual(entry, { key: "config/flags", value: { new_ui: true }, revision: put.revision, fence: { resource: "config", token: guard.fence } });
  const deleted = await a.kvDelete("config/flags", { guard });
  assert.equal(deleted.deleted, true);
  assert.ok(deleted.revision! > put.revision);
  await assert.rejects(a.kvGet("config/flags"), NotFound);
  await assert.rejects(a.kvDelete("config/flags"), NotFound);
  await guard.release();
  // Unfenced writes, odd names, and a fence given without its session.
  await a.kvPut("notes/plain", "unfenced");
  assert.equal((await a.kvGet("notes/plain")).fence, null);
  await a.kvPut("notes/with space/é?#", [1, 2]);
  assert.deepEqual((await a.kvGet("notes/with space/é?#")).value, [1, 2]);
  await assert.rejects(a.kvPut("notes/../x", 1), InvalidArgument); // refused by the server, not collapsed
  await assert.rejects(a.kvPut("k", 1, { fence: { resource: "config", token: 1 } }), InvalidArgument);
  await assert.rejects(a.kvPut("k", undefined), InvalidArgument);
});

test("a transaction: compares, then one branch, all or nothing", async () => {
  const a = makeClient(cluster, { namespace: namespace(), holder: "agent-a" });
  const guard = await a.lease("repo/build", { ttlMs: 10_000 }).acquire();
  await a.enqueue("pipeline", { target: "all" }, { id: "build" });
  const claim = (await a.claim("pipeline", { session: undefined, ttlMs: 10_000 }))!;
  const result = await a.txn({
    compare: [txn.fence("repo/build", guard.fence), txn.kvRevision("results/build", 0)],
    success: [
      txn.completeTask("pipeline", "build", claim.fence, { artifact: "build-1.tar" }),
      txn.addTask("pipeline", { suite: "all" }, { id: "test", dependsOn: ["build"] }),
      txn.put("results/build", { artifact: "build-1.tar" }),
    ],
    failure: [txn.put("results/conflict", true)],
    sessionId: guard.sessionId,
  }).catch((e: unknown) => e);
  // The claim belongs to another session than the guard: the whole transaction is refused.
  assert.ok(result instanceof StaleFence, String(result));
  await assert.rejects(a.kvGet("results/build"), NotFound);
  // The same, on one session: the claim and the lease are both the guard's session's.
  await claim.release("retry on the lease's session");
  const session = await a.session({ ttlMs: 10_000 });
  const lease = await session.lease("repo/build2").acquire();
  const mine = (await session.claim("pipeline"))!;
  const done = await a.txn({
    compare: [txn.fence("repo/build2", lease.fence), txn.kvRevision("results/build", 0)],
    success: [
      txn.completeTask("pipeline", "build", mine.fence, { artifact: "build-1.tar" }),
      txn.addTask("pipeline", { suite: "all" }, { id: "test", dependsOn: ["build"] }),
      txn.put("results/build", { artifact: "build-1.tar" }),
      txn.release("repo/build2"),
    ],
    guard: lease,
  });
  assert.equal(done.succeeded, true);
  assert.deepEqual(done.results.map((r) => r.op), ["complete_task", "add_task", "put", "release"]);
  assert.equal((await a.queueInfo("pipeline")).counts.ready, 1); // "test": its dependency is done
  await assert.rejects(a.getLease("repo/build2"), NotFound);
  // A compare that does not hold runs the failure branch.
  const other = await a.txn({ compare: [txn.kvRevision("results/build", 0)], success: [txn.del("results/build")], failure: [txn.put("results/seen", 1)] });
  assert.equal(other.succeeded, false);
  assert.deepEqual(other.results.map((r) => r.op), ["put"]);
  await session.end();
  await guard.release();
});

test("work queues: enqueue, claim, settle, and the worker loop", async () => {
  const a = makeClient(cluster, { namespace: namespace(), holder: "worker" });
  assert.equal(await a.claim("build", { ttlMs: 5_000 }), undefined); // nothing ready: 204
  await a.enqueue("build", { cmd: "make" }, { id: "t1", priority: 5, maxAttempts: 3 });
  await a.enqueue("build", { cmd: "test" }, { id: "t2", dependsOn: ["t1"] });
  await a.enqueue("build", { cmd: "lint" }, { id: "t3", priority: 1 });
  await a.enqueue("build", { cmd: "boom" }, { id: "t4", maxAttempts: 1, onDead: { queue: "undo", payload: { undo: "t4" } } });
  assert.deepEqual((await a.queueInfo("build")).counts, { ready: 3, waiting: 1, claimed: 0, done: 0, dead: 0 });
  const first = (await a.claim("build", { ttlMs: 5_000 }))!;
  assert.equal(first.id, "t1"); // the highest priority
  assert.deepEqual(first.payload, { cmd: "make" });
  assert.equal(first.attempt, 1);
  assert.ok(first.isValid());
  const released = await first.release("not now");
  assert.equal(released.state, "ready");
  assert.equal(released.note, "not now");
  await assert.rejects(a.completeTask("build", "t1", { sessionId: first.sessionId, fence: first.fence }), StaleFence);

  const seen: string[] = [];
  const report = await a.work(
    "build",
    async (claim: TaskClaim) => {
      seen.push(claim.id);
      if (claim.id === "t4") throw new Error("it blew up");
      return { built: (claim.payload as { cmd: string }).cmd };
    },
    { ttlMs: 5_000, waitMs: 200 },
  );
  assert.deepEqual(report, { completed: 3, failed: 1, stopped: "queue_empty" });
  // t2 became ready when t1 was done; equal priorities go in enqueue order.
  assert.deepEqual(seen, ["t1", "t3", "t2", "t4"]);
  const done = await a.listTasks("build", { state: "done" });
  assert.deepEqual(done.tasks.map((t) => [t.id, t.result]), [["t1", { built: "make" }], ["t2", { built: "test" }], ["t3", { built: "lint" }]]);
  const dead = (await a.listTasks("build", { state: "dead" })).tasks;
  assert.deepEqual(dead.map((t) => [t.id, t.reason]), [["t4", "Error: it blew up"]]);
  assert.equal((await a.queueInfo("undo")).counts.ready, 1); // the compensation
  assert.deepEqual((await a.listQueues()).queues.map((q) => q.queue), ["build", "undo"]);

  // max_tasks stops the loop; a claim lost while its handler runs stops it with claim_lost.
  await a.enqueue("slow", 1, { id: "s1" });
  await a.enqueue("slow", 2, { id: "s2" });
  const one = await a.work("slow", async () => "ok", { ttlMs: 5_000, maxTasks: 1 });
  assert.deepEqual(one, { completed: 1, failed: 0, stopped: "max_tasks" });
  let sawAbort = false;
  const lost = await a.work(
    "slow",
    async (claim) => {
      await a.endSession(claim.sessionId); // the claim's session is gone under it
      await new Promise<void>((resolve) => claim.signal.addEventListener("abort", () => resolve()));
      sawAbort = claim.signal.aborted;
      return "too late";
    },
    { ttlMs: 1_500 },
  );
  assert.equal(lost.stopped, "claim_lost");
  assert.equal(lost.taskId, "s2");
  assert.match(lost.reason ?? "", /session ended/);
  assert.ok(sawAbort);
  await delay(100);
  assert.equal((await a.queueInfo("slow")).counts.ready, 1); // s2 is claimable again
});

test("event pages", async () => {
  const a = makeClient(cluster, { namespace: namespace(), holder: "agent-a" });
  let fence = 0;
  await a.withLease("ev/a", async (guard) => {
    fence = guard.fence;
    await a.kvPut("ev/k", 1);
  }, { ttlMs: 5_000 });
  const page = await a.events({ after: 0 });
  assert.deepEqual(page.events.map((e) => e.kind.type), ["granted", "kv_written", "released"]);
  const granted = page.events[0]!.kind;
  assert.ok(granted.type === "granted" && granted.fence === fence && granted.holder === "agent-a");
  assert.equal(page.next, page.events.at(-1)!.revision);
  assert.deepEqual((await a.events({ after: page.next })).events, []);
  const one = await a.events({ after: 0, limit: 1 });
  assert.equal(one.events.length, 1);
  assert.equal(one.next, 1);
  await assert.rejects(a.events({ after: page.next + 10 }), InvalidArgument);
});
