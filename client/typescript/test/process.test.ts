// Processes: a child holding a running guard exits by itself (the renewal timers are
// unref'd), and the two-agents example runs as a user would run it.

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { join } from "node:path";
import { test } from "node:test";
import { promisify } from "node:util";

import { PACKAGE, makeClient, namespace, useCluster } from "./cluster.js";

const cluster = useCluster();
const run = promisify(execFile);

const HOLDER = `
import { BatonClient } from ${JSON.stringify(join(PACKAGE, "dist", "src", "index.js"))};
const client = new BatonClient({ endpoints: process.argv[1].split(","), namespace: process.argv[2], holder: "exiter" });
const guard = await client.lease("exit/x", { ttlMs: 2000 }).acquire();
await new Promise((resolve) => setTimeout(resolve, 2500)); // past the TTL: the renewals kept it
console.log("valid", guard.isValid(), guard.fence);
// Falls off the end with the guard still held and its timers running.
`;

test("a process holding a guard exits by itself", async () => {
  const ns = namespace();
  const started = performance.now();
  const { stdout } = await run(process.execPath, ["--input-type=module", "-e", HOLDER, cluster.endpoints.join(","), ns], { timeout: 20_000 });
  const elapsed = performance.now() - started;
  const match = /^valid true (\d+)$/m.exec(stdout);
  assert.ok(match, stdout);
  assert.ok(elapsed < 6_000, `took ${elapsed} ms to exit`);
  // It never released: the lease is still there until its TTL runs out.
  const watcher = makeClient(cluster, { namespace: ns });
  assert.equal((await watcher.getLease("exit/x")).fence, Number(match[1]));
});

test("the two-agents example", async () => {
  const ns = namespace();
  const { stdout } = await run(process.execPath, [join(PACKAGE, "examples", "two-agents.mjs")], {
    env: { ...process.env, BATON_ENDPOINTS: cluster.endpoints.join(","), BATON_NAMESPACE: ns },
    timeout: 60_000,
  });
  const lines = stdout.trim().split("\n");
  const winner = lines.find((l) => l.includes(` holds src/auth.rs with fence `))!.split(":")[0]!;
  const loser = winner === "agent-a" ? "agent-b" : "agent-a";
  assert.match(stdout, new RegExp(`${loser}: tool result: denied: ${winner} holds src/auth\\.rs for \\d+ s more`));
  assert.match(stdout, new RegExp(`${winner}: guard reports: expired`));
  assert.match(stdout, new RegExp(`${winner}: late write refused: STALE_FENCE`));
  assert.ok(stdout.includes(`${loser}: tool result: ${loser} wrote src/auth.rs`), stdout);
  assert.equal(lines.at(-1), `final value of files/src/auth.rs: "${loser}'s version"`);
});
