// The event stream: server-sent events, and resuming without gaps when the node serving the
// stream is killed and restarted.

import assert from "node:assert/strict";
import { test } from "node:test";

import { InvalidArgument, type BatonEvent, type EventStream } from "../src/index.js";
import { makeClient, namespace, useCluster } from "./cluster.js";

const cluster = useCluster();

async function take(stream: EventStream, count: number, timeoutMs = 20_000): Promise<BatonEvent[]> {
  const events: BatonEvent[] = [];
  const deadline = performance.now() + timeoutMs;
  while (events.length < count) {
    assert.ok(performance.now() < deadline, `only ${events.length} of ${count} events in time`);
    const next = await stream.next();
    assert.equal(next.done, false);
    events.push(next.value as BatonEvent);
  }
  return events;
}

test("server-sent events follow the namespace's changes in order", async () => {
  const a = makeClient(cluster, { namespace: namespace(), holder: "agent-a" });
  for (let i = 0; i < 3; i += 1) await a.kvPut(`sse/${i}`, i);
  const stream = a.followEvents({ after: 1 });
  const got = await take(stream, 2);
  assert.deepEqual(got.map((e) => e.revision), [2, 3]);
  await a.kvPut("sse/3", 3);
  const [event] = await take(stream, 1);
  assert.equal(event!.revision, 4);
  assert.deepEqual(event!.kind, { type: "kv_written", key: "sse/3", revision: 4 });
  assert.equal(stream.lastRevision, 4);
  stream.close();
  assert.deepEqual(await stream.next(), { done: true, value: undefined });
  // for await works too, and breaking out of it closes the stream.
  for await (const e of a.followEvents({ after: 0 })) {
    assert.equal(e.revision, 1);
    break;
  }
  // A revision in the future is refused at once.
  await assert.rejects(a.followEvents({ after: 1000 }).next(), InvalidArgument);
});

test("a stream resumes on another node when its node is killed, and on the restarted node", async () => {
  const ns = namespace();
  const client = makeClient(cluster, { namespace: ns, holder: "reader", retryBudgetMs: 15_000 });
  const writer = makeClient(cluster, { namespace: ns, holder: "writer", retryBudgetMs: 15_000 });
  await writer.kvPut("move/0", 0);
  // Stream from a follower, so that killing it leaves the cluster its leader.
  const leader = await cluster.leader();
  const follower = cluster.nodes.find((n) => n.id !== leader.id)!;
  client.transport.routes.preferred = cluster.nodes.indexOf(follower);
  const stream = client.followEvents();
  assert.equal((await take(stream, 1))[0]!.revision, 1);
  assert.equal(stream.endpoint, follower.url);

  await follower.kill();
  const written: number[] = [];
  for (let i = 1; i <= 5; i += 1) written.push((await writer.kvPut(`move/${i}`, i)).revision);
  const resumed = await take(stream, 5);
  assert.deepEqual(resumed.map((e) => e.revision), written);
  assert.deepEqual(written, [2, 3, 4, 5, 6]);
  assert.notEqual(stream.endpoint, follower.url);

  // The killed node restarts from its data dir and rejoins; a stream there resumes where the
  // first one stands, with nothing missed and nothing repeated.
  cluster.spawn(follower);
  await cluster.waitReady([follower], 30_000);
  for (let i = 6; i <= 8; i += 1) written.push((await writer.kvPut(`move/${i}`, i)).revision);
  assert.deepEqual((await take(stream, 3)).map((e) => e.revision), written.slice(5));
  const onRestarted = makeClient([follower.url], { namespace: ns });
  const again = onRestarted.followEvents({ after: stream.lastRevision! });
  written.push((await writer.kvPut("move/9", 9)).revision);
  const [next] = await take(again, 1);
  assert.equal(next!.revision, written.at(-1));
  assert.equal(again.endpoint, follower.url);
  again.close();
  stream.close();
});
