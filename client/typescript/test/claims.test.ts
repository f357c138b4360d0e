// The claims tool wrapper: runs under a renewed lease, a denial is the tool's result, and it
// fails closed when the claim cannot be made or checked.

import assert from "node:assert/strict";
import { createServer } from "node:http";
import { test } from "node:test";

import { NotFound } from "../src/index.js";
import { delay, freePorts, makeClient, namespace, useCluster, useDevNode } from "./cluster.js";

const cluster = useCluster();
const authNode = useDevNode(["--auth", "--cluster-secret", "ts-claims-secret"], { BATON_BOOTSTRAP_TOKEN: "baton_admin_bootstrap_claims_0123" });

test("a tool runs under its claim, renewed while it runs, released after", async () => {
  const ns = namespace();
  const a = makeClient(cluster, { namespace: ns, holder: "agent-a" });
  const watcher = makeClient(cluster, { namespace: ns, holder: "watcher" });
  const seen: Array<{ holder: string; fence: number }> = [];
  const edit = a.claims(
    (args: { path: string; text: string }) => args.path,
    async ({ path, text }, { signal }) => {
      seen.push(await watcher.getLease(path));
      await delay(2_500); // longer than the TTL: renewals keep the claim
      seen.push(await watcher.getLease(path));
      assert.equal(signal.aborted, false);
      return `wrote ${text.length} bytes to ${path}`;
    },
    { ttlMs: 1_500 },
  );
  assert.equal(await edit({ path: "src/auth.rs", text: "hello" }), "wrote 5 bytes to src/auth.rs");
  assert.deepEqual(seen.map((l) => l.holder), ["agent-a", "agent-a"]);
  assert.equal(seen[0]!.fence, seen[1]!.fence);
  await assert.rejects(watcher.getLease("src/auth.rs"), NotFound);
});

test("a denial is the tool's result, and the tool does not run", async () => {
  const ns = namespace();
  const a = makeClient(cluster, { namespace: ns, holder: "agent-a" });
  const b = makeClient(cluster, { namespace: ns, holder: "agent-b" });
  const ran: string[] = [];
  const edit = a.claims((path: string) => path, (path) => {
    ran.push(path);
    return "edited";
  });
  const held = await b.lease("src/auth.rs", { ttlMs: 40_000 }).acquire();
  const result = await edit("src/auth.rs");
  const match = /^denied: agent-b holds src\/auth\.rs for (\d+) s more$/.exec(String(result));
  assert.ok(match, String(result));
  assert.ok(Number(match[1]) >= 35 && Number(match[1]) <= 40);
  assert.deepEqual(ran, []);
  await held.release();
  assert.equal(await edit("src/auth.rs"), "edited");
});

test("fail closed: unreachable, unauthorized, malformed, or no path", async () => {
  const ran: string[] = [];
  const tool = (path: string): string => {
    ran.push(path);
    return "ran";
  };
  const [port] = await freePorts(1);
  const unreachable = makeClient([`127.0.0.1:${port}`], { timeoutMs: 300, retryBudgetMs: 800 });
  const r1 = String(await unreachable.claims((p: string) => p, tool)("src/a.rs"));
  assert.match(r1, /^error: could not claim src\/a\.rs: Baton is unreachable/);
  assert.match(r1, /the tool did not run$/);
  const unauthorized = makeClient([authNode.url], { token: "baton_not_a_token" });
  assert.match(String(await unauthorized.claims((p: string) => p, tool)("src/a.rs")), /^error: could not claim src\/a\.rs: Baton refused the token \(UNAUTHENTICATED/);
  const garbage = createServer((request, response) => {
    request.resume();
    response.writeHead(201, { "Content-Type": "application/json" });
    response.end("not json!");
  });
  await new Promise<void>((resolve) => garbage.listen(0, "127.0.0.1", resolve));
  try {
    const address = garbage.address() as import("node:net").AddressInfo;
    const malformed = makeClient([`127.0.0.1:${address.port}`], { timeoutMs: 500, retryBudgetMs: 1_000 });
    assert.match(String(await malformed.claims((p: string) => p, tool)("src/a.rs")), /^error: could not claim src\/a\.rs: Baton's answer was malformed/);
  } finally {
    await new Promise((resolve) => garbage.close(resolve));
  }
  const good = makeClient(cluster, { namespace: namespace(), holder: "agent-a" });
  assert.match(String(await good.claims((p: string) => p[99]!.toString(), tool)("src/a.rs")), /^error: cannot tell which path tool works on/);
  assert.match(String(await good.claims(() => "", tool)("src/a.rs")), /^error: tool names no path to claim/);
  assert.match(String(await good.claims((p: string) => p, tool)("bad//path")), /^error: could not claim bad\/\/path: INVALID_ARGUMENT/);
  assert.deepEqual(ran, []);
});
