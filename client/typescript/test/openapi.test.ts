// OpenAPI conformance of the client's route table: every builder, with every optional field
// set, names a documented route, query parameter and body field. (Every request the tests
// actually send is checked too, when each test file ends: see cluster.ts.)

import assert from "node:assert/strict";
import { test } from "node:test";

import { ERROR_CLASSES, txn } from "../src/index.js";
import * as routes from "../src/routes.js";
import { OPENAPI, ROUTES, checkRequest } from "./openapi-check.js";

const SID = "0123456789abcdef0123456789abcdef";

function everyCall() {
  const ops = [
    txn.put("k", { v: 1 }),
    txn.del("k2"),
    txn.release("r"),
    txn.addTask("q", { p: 1 }, { id: "t", priority: 2, dependsOn: ["t0"], maxAttempts: 3, notBeforeMs: 10, onDead: { queue: "undo", payload: {}, max_attempts: 2 } }),
    txn.completeTask("q", "t", 5, { r: 1 }),
    txn.failTask("q", "t", 5, "why", true),
  ];
  return [
    routes.createSession("h", 1000, { a: "b" }),
    routes.keepalive(SID),
    routes.release(SID, "a/b"),
    routes.getSession(SID, 10, "c"),
    routes.endSession(SID),
    routes.acquire(routes.acquireBody("a/b", { holder: "h", ttlMs: 1000, mode: "shared", limit: 2, maxHoldMs: 5, labels: { x: "y" }, reason: "r", waitMs: 5 })),
    routes.acquire(routes.acquireBody("a/b", { sessionId: SID })),
    routes.getLease("a/b/c"),
    routes.listLeases("a/", 10, "c"),
    routes.fenceCheck("a/b", 1),
    routes.kvGet("a/b"),
    routes.kvPut("a/b", { v: 1 }, { fence: { resource: "a", token: 1 }, sessionId: SID }),
    routes.kvDelete("a/b", { fence: { resource: "a", token: 1 }, sessionId: SID }),
    routes.kvDelete("a/b"),
    routes.enqueue("q", routes.enqueueBody({ p: 1 }, { id: "t", priority: 1, dependsOn: ["t0"], maxAttempts: 2, notBeforeMs: 5, onDead: { queue: "undo", payload: 1, max_attempts: 1 } })),
    routes.claim("q", { holder: "h", ttlMs: 1000, waitMs: 5 }),
    routes.claim("q", { sessionId: SID }),
    routes.completeTask("q", "t", SID, 1, { r: 1 }),
    routes.failTask("q", "t", SID, 1, "why", false),
    routes.releaseTask("q", "t", SID, 1, "note"),
    routes.queueInfo("q"),
    routes.listQueues(10, "c"),
    routes.listTasks("q", "ready", 10, "c"),
    routes.txn(SID, [txn.fence("r", 1), txn.kvRevision("k", 0)], ops, ops),
    routes.events(3, 10),
    routes.createToken("n", "agent", ["ns"], { sessions_max: 1, leases_max: 2 }),
    routes.listTokens(),
    routes.revokeToken("n"),
    routes.getLimits(),
    routes.setLimits({ txn_ops_max: 32 }),
    routes.clusterStatus(),
    routes.addMember(4, "127.0.0.1:1", "127.0.0.1:2", true),
    routes.removeMember(4),
  ];
}

test("the checker catches undocumented routes, parameters and fields", () => {
  assert.deepEqual(checkRequest("GET", "/v1/leases/a/b", undefined), []);
  assert.notDeepEqual(checkRequest("GET", "/v1/nope", undefined), []);
  assert.notDeepEqual(checkRequest("PATCH", "/v1/leases", undefined), []);
  assert.notDeepEqual(checkRequest("GET", "/v1/leases?bogus=1", undefined), []);
  assert.notDeepEqual(checkRequest("POST", "/v1/leases", { resource: "a", ttl: 5 }), []);
  assert.deepEqual(checkRequest("POST", "/v1/txn", { success: [{ op: "put", key: "k", value: 1 }] }), []);
  assert.notDeepEqual(checkRequest("POST", "/v1/txn", { success: [{ op: "frobnicate" }] }), []);
  assert.notDeepEqual(checkRequest("PUT", "/v1/kv/a", { value: 1, fence: { resource: "a", token: 1, x: 2 } }), []);
  assert.notDeepEqual(checkRequest("GET", "/v1/kv/a", { value: 1 }), []);
});

test("the route table conforms, and covers every documented /v1 route but four", () => {
  const calls = everyCall();
  const problems = calls.flatMap((c) => [
    ...checkRequest(c.method, c.path, c.body),
    ...(ROUTES.some((r) => r.method === c.method && r.template === c.route) ? [] : [`${c.method} ${c.route}: template not documented`]),
  ]);
  assert.deepEqual(problems, []);
  const documented = new Set(ROUTES.filter((r) => r.template.startsWith("/v1/")).map((r) => `${r.method} ${r.template}`));
  const used = new Set(calls.map((c) => `${c.method} ${c.route}`));
  assert.deepEqual([...used].filter((u) => !documented.has(u)), []);
  assert.deepEqual([...documented].filter((d) => !used.has(d)).sort(), ["GET /v1/debug/digest", "GET /v1/openapi.json", "GET /v1/snapshot", "POST /v1/debug/clock"]);
  // Mutations carry a key, reads none.
  for (const c of calls) assert.equal(c.idempotencyKey !== undefined, c.method !== "GET" && c.route !== "/v1/fence/check", c.route);
});

test("every error code of the OpenAPI document has its class", () => {
  const codes = (OPENAPI.components.schemas.ErrorCode as { enum: string[] }).enum;
  assert.deepEqual([...codes].sort(), Object.keys(ERROR_CLASSES).sort());
});
