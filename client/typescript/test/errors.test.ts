// Error codes: the mapping table, each code provoked for real where it can be, access control
// on a node started with --auth, malformed answers from a broken (non-Baton) server, and a
// guard whose renewals get garbage.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { join } from "node:path";
import { after, before, test } from "node:test";

import {
  BatonClient,
  BatonError,
  ClaimLost,
  ERROR_CLASSES,
  IdempotencyKeyReused,
  InvalidArgument,
  LeaseHeld,
  LeaseLost,
  NotFound,
  OutcomeUnknown,
  PayloadTooLarge,
  PermissionDenied,
  ProtocolError,
  ResourceExhausted,
  StaleFence,
  Unauthenticated,
  Unavailable,
  errorFromProblem,
} from "../src/index.js";
import * as routes from "../src/routes.js";
import { REPO, freePorts, makeClient, namespace, useCluster, useDevNode } from "./cluster.js";

const cluster = useCluster();
export const ADMIN = "baton_admin_bootstrap_0123456789";
const authNode = useDevNode(["--auth", "--cluster-secret", "ts-test-secret"], { BATON_BOOTSTRAP_TOKEN: ADMIN });

/** The code -> status table of docs/api.md, "Error codes". */
function documentedCodes(): Map<string, number> {
  const text = readFileSync(join(REPO, "docs", "api.md"), "utf8");
  const section = text.slice(text.indexOf("## Error codes"), text.indexOf("## Routes"));
  return new Map([...section.matchAll(/^\| `([A-Z_]+)` \| (\d+)/gm)].map((m) => [m[1]!, Number(m[2])]));
}

test("every documented code maps to its class", () => {
  const documented = documentedCodes();
  assert.equal(documented.size, 13);
  assert.deepEqual(Object.keys(ERROR_CLASSES).sort(), [...documented.keys()].sort());
  for (const [code, status] of documented) {
    const problem: Record<string, unknown> = { code, message: "the server's words" };
    if (code === "LEASE_HELD") {
      problem.held_by = { holder: "agent-b", resource: "src/auth.rs", mode: "exclusive", fence: 41, labels: {}, acquired_at: "x", expires_in_ms: 37_200, expires_at: "y" };
    }
    if (code === "STALE_FENCE") problem.current_fence = 9;
    const error = errorFromProblem(status, problem);
    assert.equal(error.constructor, ERROR_CLASSES[code as keyof typeof ERROR_CLASSES], code);
    assert.ok(error instanceof BatonError && error instanceof Error);
    assert.equal(error.code, code);
    assert.equal(error.status, status);
    assert.equal(error.message, "the server's words");
    assert.equal(String(error), `${code}: the server's words`);
    assert.equal(error.isIndeterminate, code === "OUTCOME_UNKNOWN" || code === "INTERNAL", code);
  }
  const held = errorFromProblem(409, {
    code: "LEASE_HELD",
    message: "m",
    held_by: { holder: "agent-b", resource: "src/auth.rs", mode: "exclusive", fence: 41, expires_in_ms: 37_200, acquired_at: "", expires_at: "" },
  });
  assert.ok(held instanceof LeaseHeld);
  assert.deepEqual([held.holder, held.fence, held.expiresIn], ["agent-b", 41, 37.2]);
  assert.equal(held.denial("src/auth.rs"), "denied: agent-b holds src/auth.rs for 38 s more");
  const stale = errorFromProblem(409, { code: "STALE_FENCE", message: "m", current_fence: 9 });
  assert.ok(stale instanceof StaleFence && stale.currentFence === 9);
  const noLeader = errorFromProblem(503, { code: "NO_LEADER", message: "m", leader: 2, retry_after_ms: 20 });
  assert.deepEqual([noLeader.leader, noLeader.retryAfterMs], [2, 20]);
  // Malformed problems and unknown codes never crash.
  assert.ok(errorFromProblem(409, { code: "LEASE_HELD", message: "m" }) instanceof ProtocolError);
  assert.ok(errorFromProblem(400, { code: 7 }) instanceof ProtocolError);
  assert.ok(errorFromProblem(400, "not an object") instanceof ProtocolError);
  const future = errorFromProblem(418, { code: "SOMETHING_NEW", message: "m" });
  assert.equal(future.constructor, BatonError);
  assert.equal(future.code, "SOMETHING_NEW");
  assert.equal(future.isIndeterminate, false);
  assert.equal(errorFromProblem(502, { code: "SOMETHING_NEW", message: "m" }).isIndeterminate, true);
  assert.ok(new ClaimLost("x") instanceof LeaseLost);
});

test("codes provoked on a real cluster", async () => {
  const ns = namespace();
  const a = makeClient(cluster, { namespace: ns, holder: "agent-a" });
  const invalid = await a.lease("bad/ttl", { ttlMs: 10 }).acquire().catch((e: unknown) => e); // below ttl_ms_min
  assert.ok(invalid instanceof InvalidArgument);
  assert.equal(invalid.status, 400);
  assert.equal(invalid.isIndeterminate, false);
  await assert.rejects(a.lease("a//b", { ttlMs: 5_000 }).acquire(), InvalidArgument);
  await assert.rejects(a.listLeases({ limit: 0 }), InvalidArgument);
  await assert.rejects(a.getLease("nobody/holds/this"), NotFound);
  await assert.rejects(a.endSession("0".repeat(32)), NotFound);
  const lost = await a.keepalive("0".repeat(32)).catch((e: unknown) => e);
  assert.ok(lost instanceof LeaseLost && lost.status === 409);
  await a.withLease("err/held", async (guard) => {
    await assert.rejects(makeClient(cluster, { namespace: ns, holder: "agent-b" }).acquire("err/held", { ttlMs: 5_000 }), LeaseHeld);
    await assert.rejects(a.kvPut("err/k", 1, { fence: { resource: "err/held", token: guard.fence + 1000 }, sessionId: guard.sessionId }), StaleFence);
  }, { ttlMs: 5_000 });
  const large = await a.kvPut("err/big", "x".repeat(300 * 1024)).catch((e: unknown) => e);
  assert.ok(large instanceof PayloadTooLarge && large.status === 413);
  // One key, one request: a retry is replayed; another request with the key is refused.
  const c = routes.kvPut("err/idem", 1);
  c.idempotencyKey = "fixed-key-0123456789";
  const first = await a.execute(c);
  const again = await a.execute(c);
  assert.equal(first.replayed, false);
  assert.equal(again.replayed, true);
  assert.deepEqual(again.value, first.value);
  const other = routes.kvPut("err/idem", 2);
  other.idempotencyKey = c.idempotencyKey;
  const reused = await a.execute(other).catch((e: unknown) => e);
  assert.ok(reused instanceof IdempotencyKeyReused && reused.status === 422);
  assert.equal((await a.kvGet("err/idem")).value, 1);
  // Bad input caught before anything is sent.
  await assert.rejects(a.kvGet(""), InvalidArgument);
  await assert.rejects(a.lease("x", { mode: "shared" }).acquire(), InvalidArgument);
  await assert.rejects(a.claim("q", { waitMs: 60_001 }), InvalidArgument);
});

test("tokens, limits and the access-control codes on a node with --auth", async () => {
  const admin = makeClient([authNode.url], { token: ADMIN, namespace: "team-a" });
  assert.ok((await admin.listTokens()).tokens.some((t) => t.name === "bootstrap"));
  const created = await admin.createToken("agent-a", "agent", ["team-a"], { sessions_max: 1 });
  assert.match(created.secret, /^baton_/);
  assert.equal(created.role, "agent");
  const reader = await admin.createToken("reader-a", "reader", ["team-a"]);
  const agent = makeClient([authNode.url], { token: created.secret, namespace: "team-a", holder: "agent-a", retryBudgetMs: 2_000 });
  await agent.withLease("x/y", async (guard) => {
    assert.ok(guard.isValid());
    // The token's quota is one session: a second is refused.
    const exhausted = await agent.createSession({ ttlMs: 5_000 }).catch((e: unknown) => e);
    assert.ok(exhausted instanceof ResourceExhausted, String(exhausted));
    assert.equal(exhausted.status, 429);
    assert.equal(exhausted.isIndeterminate, false);
  }, { ttlMs: 5_000 });
  const wrong = await makeClient([authNode.url], { token: "baton_wrong", namespace: "team-a" }).kvGet("k").catch((e: unknown) => e);
  assert.ok(wrong instanceof Unauthenticated && wrong.status === 401);
  await assert.rejects(makeClient([authNode.url], { namespace: "team-a" }).kvGet("k"), Unauthenticated);
  const denied = await makeClient([authNode.url], { token: created.secret, namespace: "team-b" }).kvPut("k", 1).catch((e: unknown) => e);
  assert.ok(denied instanceof PermissionDenied && denied.status === 403);
  await assert.rejects(makeClient([authNode.url], { token: reader.secret, namespace: "team-a" }).kvPut("k", 1), PermissionDenied);
  await assert.rejects(agent.createToken("sneaky", "admin", ["*"]), PermissionDenied);
  assert.equal((await admin.limits()).txn_ops_max, 64);
  assert.equal((await admin.setLimits({ txn_ops_max: 32 })).txn_ops_max, 32);
  await assert.rejects(admin.setLimits({ no_such_limit: 1 }), InvalidArgument);
  assert.deepEqual(await admin.revokeToken("agent-a"), { name: "agent-a" });
  await assert.rejects(agent.kvGet("k"), Unauthenticated);
  await assert.rejects(admin.revokeToken("agent-a"), NotFound);
});

// ---------------------------------------------------------------------------------------------
// A broken server (not Baton): malformed answers must be clear client errors
// ---------------------------------------------------------------------------------------------

interface Seen {
  method: string;
  path: string;
  key: string | undefined;
}

const seen: Seen[] = [];
let broken: Server;
let brokenUrl = "";

function answer(response: ServerResponse, status: number, type: string, body: string): void {
  response.writeHead(status, { "Content-Type": type, "Content-Length": Buffer.byteLength(body) });
  response.end(body);
}

function brokenAnswer(request: IncomingMessage, response: ServerResponse): void {
  const path = request.url ?? "";
  const key = request.headers["idempotency-key"];
  seen.push({ method: request.method ?? "", path, key: typeof key === "string" ? key : undefined });
  if (path === "/v1/leases") {
    // A grant that looks right; every keepalive then gets garbage.
    const grant = { resource: "g/r", fence: 7, session_id: "a".repeat(32), holder: "h", mode: "exclusive", labels: {}, acquired_at: "", expires_in_ms: 1_500, expires_at: "" };
    return answer(response, 201, "application/json", JSON.stringify(grant));
  }
  if (path.includes("keepalive")) return answer(response, 200, "application/json", "<html>surprise</html>");
  if (path.includes("notjson")) return answer(response, 200, "application/json", "<html>surprise</html>");
  if (path.includes("list")) return answer(response, 200, "application/json", "[1, 2, 3]");
  if (path.includes("teapot")) return answer(response, 409, "text/html", "<h1>a proxy says no</h1>");
  if (path.includes("gateway")) return answer(response, 502, "text/html", "bad gateway");
  if (path.includes("unknown")) return answer(response, 504, "application/problem+json", JSON.stringify({ code: "OUTCOME_UNKNOWN", message: "maybe" }));
  if (path.includes("nomessage")) return answer(response, 400, "application/problem+json", '{"code": "INVALID_ARGUMENT"}');
  if (path.includes("truncated")) {
    response.writeHead(200, { "Content-Type": "application/json", "Content-Length": "100" });
    response.write('{"revis');
    setTimeout(() => response.destroy(), 20);
    return;
  }
  answer(response, 200, "application/json", "{}");
}

before(async () => {
  broken = createServer((request, response) => {
    request.resume();
    request.on("end", () => brokenAnswer(request, response));
  });
  await new Promise<void>((resolve) => broken.listen(0, "127.0.0.1", resolve));
  const address = broken.address();
  brokenUrl = `http://127.0.0.1:${typeof address === "object" && address !== null ? address.port : 0}`;
});
after(() => new Promise<void>((resolve) => broken.close(() => resolve())));

function brokenClient(): BatonClient {
  return new BatonClient({ endpoints: [brokenUrl], timeoutMs: 1_000, retryBudgetMs: 1_500, attemptsMax: 3 });
}

test("malformed answers are clear protocol errors", async () => {
  const client = brokenClient();
  const notJson = await client.kvGet("notjson").catch((e: unknown) => e);
  assert.ok(notJson instanceof ProtocolError);
  assert.equal(notJson.isIndeterminate, false);
  assert.equal(notJson.status, 200);
  assert.match(notJson.message, /the answer is not JSON/);
  // A write whose 2xx answer cannot be read may have been applied.
  const write = await client.kvPut("notjson", 1).catch((e: unknown) => e);
  assert.ok(write instanceof ProtocolError && write.isIndeterminate);
  const listed = await client.kvGet("list").catch((e: unknown) => e);
  assert.ok(listed instanceof ProtocolError);
  assert.match(listed.message, /not a JSON object/);
  const teapot = await client.kvPut("teapot", 1).catch((e: unknown) => e);
  assert.ok(teapot instanceof ProtocolError && teapot.status === 409 && !teapot.isIndeterminate);
  const noMessage = await client.kvGet("nomessage").catch((e: unknown) => e);
  assert.ok(noMessage instanceof ProtocolError && !noMessage.isIndeterminate);
  // An answer cut short is a broken connection: a read is retried, then unavailable; a write
  // may have been applied.
  const cut = await client.kvGet("truncated").catch((e: unknown) => e);
  assert.ok(cut instanceof Unavailable, String(cut));
  assert.match(cut.message, /while reading the answer/);
  const cutWrite = await client.kvPut("truncated", 1).catch((e: unknown) => e);
  assert.ok(cutWrite instanceof OutcomeUnknown && cutWrite.isIndeterminate);
  // A 502 without a problem: retried with the one key, then unknown for a write.
  seen.length = 0;
  const gateway = await client.kvPut("gateway", 1).catch((e: unknown) => e);
  assert.ok(gateway instanceof ProtocolError && gateway.isIndeterminate);
  assert.ok(seen.length >= 2);
  assert.equal(new Set(seen.map((s) => s.key)).size, 1);
  assert.ok(seen[0]!.key !== undefined && seen[0]!.key.length >= 16);
  // OUTCOME_UNKNOWN: every retry carries the operation's one key; the end is unknown.
  seen.length = 0;
  const unknown = await client.kvPut("unknown", 1).catch((e: unknown) => e);
  assert.ok(unknown instanceof OutcomeUnknown && unknown.isIndeterminate);
  assert.equal(seen.length, 3);
  assert.equal(new Set(seen.map((s) => s.key)).size, 1);
  assert.notEqual(seen[0]!.key, undefined);
  // Reads carry no key, and end "surely not applied".
  seen.length = 0;
  const read = await client.getLease("unknown").catch((e: unknown) => e);
  assert.ok(read instanceof Unavailable && !read.isIndeterminate);
  assert.ok(seen.every((s) => s.key === undefined));
});

test("a guard whose keepalives get garbage reports its loss once, before its deadline, without an unhandled rejection", async () => {
  const client = brokenClient();
  const reports: Array<[number, string]> = [];
  const guard = await client.lease("g/r", { ttlMs: 1_500, onLost: (why) => reports.push([performance.now(), why]) }).acquire();
  assert.equal(guard.fence, 7);
  const deadline = guard.validUntil;
  assert.match((await guard.waitLost(3_000)) ?? "", /^expired/);
  assert.equal(reports.length, 1);
  assert.ok(reports[0]![0] <= deadline, `reported at ${reports[0]![0]}, deadline ${deadline}`);
  assert.ok(seen.some((s) => s.path.endsWith("/keepalive")));
  await new Promise((resolve) => setTimeout(resolve, 300));
  assert.equal(reports.length, 1);
  assert.equal(guard.isValid(), false);
});

test("an unreachable cluster is unavailable, surely not applied", async () => {
  const [port] = await freePorts(1);
  const client = new BatonClient({ endpoints: [`127.0.0.1:${port}`], timeoutMs: 500, retryBudgetMs: 1_000 });
  const started = performance.now();
  const error = await client.kvPut("k", 1).catch((e: unknown) => e);
  assert.ok(error instanceof Unavailable && !error.isIndeterminate);
  assert.match(error.message, /ECONNREFUSED/);
  assert.ok(performance.now() - started < 3_000);
});

test("configuration from the environment and its checks", () => {
  const saved = { ...process.env };
  try {
    process.env.BATON_ENDPOINTS = "127.0.0.1:1, http://127.0.0.1:2/";
    process.env.BATON_TOKEN = "secret-token";
    process.env.BATON_NAMESPACE = "ns1";
    process.env.BATON_HOLDER = "me";
    const client = new BatonClient();
    assert.deepEqual(client.endpoints, ["http://127.0.0.1:1", "http://127.0.0.1:2"]);
    assert.equal(client.namespace, "ns1");
    assert.equal(client.holder, "me");
    assert.equal(client.transport.headers().Authorization, "Bearer secret-token");
    assert.equal(client.transport.headers()["Baton-Namespace"], "ns1");
  } finally {
    process.env = saved;
  }
  assert.throws(() => new BatonClient({ endpoints: ["ftp://x:1"] }), InvalidArgument);
  assert.throws(() => new BatonClient({ endpoints: ["http://x"] }), InvalidArgument);
  assert.throws(() => new BatonClient({ endpoints: [] }), InvalidArgument);
  assert.throws(() => new BatonClient({ clockRateError: 0.5 }), InvalidArgument);
  assert.equal(new BatonClient({ endpoints: "h:1" }).namespace, "default");
});
