/**
 * Every route the client sends, as a `Call` builder: one place that names each method, path
 * template and body field (the OpenAPI conformance test checks this table). Bodies are typed
 * with the types generated from docs/openapi.json.
 */

import { WAIT_MS_MAX, call, encodeName, encodePath, queryString, type Call } from "./core.js";
import { InvalidArgument } from "./errors.js";
import type { components } from "./generated/openapi.js";

type Schemas = components["schemas"];
export type LeaseMode = Schemas["LeaseMode"];
export type TaskState = Schemas["TaskState"];
export type AcquireRequest = Schemas["AcquireRequest"];
export type EnqueueRequest = Schemas["EnqueueRequest"];
export type OnDead = Schemas["OnDead"];
export type TxnCompare = Schemas["TxnCompare"];
export type TxnOp = Schemas["TxnOp"];
export type TokenRole = Schemas["TokenRole"];
export type TokenQuotas = Schemas["TokenQuotas"];
/** A fence on the wire: `{resource, token}`. */
export type FenceRef = Schemas["FenceRef"];

const MODES: readonly LeaseMode[] = ["exclusive", "subtree", "shared"];

const sessionPath = (id: string): string => `/v1/sessions/${encodeName(id, "session id")}`;

function checkWait(waitMs: number | undefined): void {
  if (waitMs !== undefined && !(Number.isInteger(waitMs) && waitMs >= 0 && waitMs <= WAIT_MS_MAX)) {
    throw new InvalidArgument(`waitMs must be an integer from 0 to ${WAIT_MS_MAX}, not ${waitMs}`);
  }
}

// Sessions ------------------------------------------------------------------------------------

export function createSession(holder: string, ttlMs: number, labels?: Record<string, string>): Call {
  const body: Schemas["CreateSessionRequest"] = { holder, ttl_ms: ttlMs };
  if (labels !== undefined && Object.keys(labels).length > 0) body.labels = labels;
  return call("POST", "/v1/sessions", "/v1/sessions", { body, mutation: true });
}

export function keepalive(sessionId: string): Call {
  return call("POST", "/v1/sessions/{id}/keepalive", `${sessionPath(sessionId)}/keepalive`, { mutation: true });
}

export function release(sessionId: string, resource: string): Call {
  const body: Schemas["ReleaseRequest"] = { resource };
  return call("POST", "/v1/sessions/{id}/release", `${sessionPath(sessionId)}/release`, { body, mutation: true });
}

export function getSession(sessionId: string, limit?: number, cursor?: string): Call {
  return call("GET", "/v1/sessions/{id}", sessionPath(sessionId) + queryString({ limit, cursor }));
}

export function endSession(sessionId: string): Call {
  return call("DELETE", "/v1/sessions/{id}", sessionPath(sessionId), { mutation: true });
}

// Leases --------------------------------------------------------------------------------------

export interface AcquireFields {
  sessionId?: string | undefined;
  holder?: string | undefined;
  ttlMs?: number | undefined;
  mode?: LeaseMode | undefined;
  limit?: number | undefined;
  maxHoldMs?: number | undefined;
  labels?: Record<string, string> | undefined;
  reason?: string | undefined;
  waitMs?: number | undefined;
}

export function acquireBody(resource: string, f: AcquireFields): AcquireRequest {
  const mode = f.mode ?? "exclusive";
  if (!MODES.includes(mode)) {
    throw new InvalidArgument(`mode must be one of ${MODES.join(", ")}, not ${JSON.stringify(mode)}`);
  }
  if ((mode === "shared") !== (f.limit !== undefined)) {
    throw new InvalidArgument("limit goes with mode 'shared', and only with it");
  }
  if ((f.sessionId === undefined) === (f.holder === undefined || f.ttlMs === undefined)) {
    throw new InvalidArgument("give either sessionId, or both holder and ttlMs");
  }
  checkWait(f.waitMs);
  const body: AcquireRequest = { resource };
  if (f.sessionId !== undefined) {
    body.session_id = f.sessionId;
  } else {
    body.holder = f.holder!;
    body.ttl_ms = f.ttlMs!;
  }
  if (mode !== "exclusive") body.mode = mode;
  if (f.limit !== undefined) body.limit = f.limit;
  if (f.maxHoldMs !== undefined) body.max_hold_ms = f.maxHoldMs;
  if (f.labels !== undefined && Object.keys(f.labels).length > 0) body.labels = f.labels;
  if (f.reason !== undefined) body.reason = f.reason;
  if (f.waitMs !== undefined) body.wait_ms = f.waitMs;
  return body;
}

export function acquire(body: AcquireRequest): Call {
  const heldMs = body.wait_ms ?? 0;
  return call("POST", "/v1/leases", "/v1/leases", { body: { ...body }, mutation: true, heldMs });
}

export function getLease(resource: string): Call {
  return call("GET", "/v1/leases/{resource}", `/v1/leases/${encodePath(resource)}`);
}

export function listLeases(prefix?: string, limit?: number, cursor?: string): Call {
  return call("GET", "/v1/leases", "/v1/leases" + queryString({ prefix, limit, cursor }));
}

export function fenceCheck(resource: string, fence: number): Call {
  const body: Schemas["FenceCheckRequest"] = { resource, fence };
  return call("POST", "/v1/fence/check", "/v1/fence/check", { body });
}

// Key-value store -----------------------------------------------------------------------------

/** A fenced write's fence and the session that holds it (give both or neither). */
export interface Fenced {
  fence?: FenceRef | undefined;
  sessionId?: string | undefined;
}

function fenceFields(fenced: Fenced): { fence?: FenceRef; session_id?: string } {
  if ((fenced.fence === undefined) !== (fenced.sessionId === undefined)) {
    throw new InvalidArgument("a fenced write needs both the fence and its sessionId");
  }
  if (fenced.fence === undefined) return {};
  return { fence: { resource: fenced.fence.resource, token: fenced.fence.token }, session_id: fenced.sessionId! };
}

const kvPath = (key: string): string => `/v1/kv/${encodePath(key, "key")}`;

export function kvGet(key: string): Call {
  return call("GET", "/v1/kv/{key}", kvPath(key));
}

export function kvPut(key: string, value: unknown, fenced: Fenced = {}): Call {
  if (value === undefined) throw new InvalidArgument("a kv value must be JSON, not undefined");
  const body: Schemas["KvPutRequest"] = { value, ...fenceFields(fenced) };
  return call("PUT", "/v1/kv/{key}", kvPath(key), { body, mutation: true });
}

export function kvDelete(key: string, fenced: Fenced = {}): Call {
  const fields: Schemas["KvDeleteRequest"] = fenceFields(fenced);
  const body = fields.fence === undefined ? undefined : fields;
  return call("DELETE", "/v1/kv/{key}", kvPath(key), { body, mutation: true });
}

// Work queues ---------------------------------------------------------------------------------

export interface EnqueueFields {
  id?: string | undefined;
  priority?: number | undefined;
  dependsOn?: string[] | undefined;
  maxAttempts?: number | undefined;
  notBeforeMs?: number | undefined;
  onDead?: OnDead | undefined;
}

export function enqueueBody(payload: unknown, f: EnqueueFields = {}): EnqueueRequest {
  if (payload === undefined) throw new InvalidArgument("a task payload must be JSON, not undefined");
  const body: EnqueueRequest = { payload };
  if (f.id !== undefined) body.id = f.id;
  if (f.priority !== undefined) body.priority = f.priority;
  if (f.dependsOn !== undefined && f.dependsOn.length > 0) body.depends_on = [...f.dependsOn];
  if (f.maxAttempts !== undefined) body.max_attempts = f.maxAttempts;
  if (f.notBeforeMs !== undefined) body.not_before_ms = f.notBeforeMs;
  if (f.onDead !== undefined) {
    const unknown = Object.keys(f.onDead).filter((k) => !["queue", "payload", "max_attempts"].includes(k));
    if (unknown.length > 0 || typeof f.onDead.queue !== "string" || !("payload" in f.onDead)) {
      throw new InvalidArgument("onDead is {queue, payload, max_attempts?}");
    }
    body.on_dead = { ...f.onDead };
  }
  return body;
}

const queuePath = (queue: string): string => `/v1/queues/${encodeName(queue, "queue")}`;

export function enqueue(queue: string, body: EnqueueRequest): Call {
  return call("POST", "/v1/queues/{queue}/tasks", `${queuePath(queue)}/tasks`, { body: { ...body }, mutation: true });
}

export function claim(
  queue: string,
  f: { sessionId?: string | undefined; holder?: string | undefined; ttlMs?: number | undefined; waitMs?: number | undefined },
): Call {
  if ((f.sessionId === undefined) === (f.holder === undefined || f.ttlMs === undefined)) {
    throw new InvalidArgument("give either sessionId, or both holder and ttlMs");
  }
  checkWait(f.waitMs);
  const body: Schemas["ClaimRequest"] =
    f.sessionId !== undefined ? { session_id: f.sessionId } : { holder: f.holder!, ttl_ms: f.ttlMs! };
  if (f.waitMs !== undefined) body.wait_ms = f.waitMs;
  return call("POST", "/v1/queues/{queue}/claim", `${queuePath(queue)}/claim`, {
    body,
    mutation: true,
    heldMs: f.waitMs ?? 0,
  });
}

const taskPath = (queue: string, id: string, action: string): string =>
  `${queuePath(queue)}/tasks/${encodeName(id, "task id")}/${action}`;

export function completeTask(queue: string, id: string, sessionId: string, fence: number, result?: unknown): Call {
  const body: Schemas["CompleteRequest"] = { session_id: sessionId, fence };
  if (result !== undefined) body.result = result;
  return call("POST", "/v1/queues/{queue}/tasks/{id}/complete", taskPath(queue, id, "complete"), { body, mutation: true });
}

export function failTask(
  queue: string,
  id: string,
  sessionId: string,
  fence: number,
  reason: string,
  retry?: boolean,
): Call {
  const body: Schemas["FailRequest"] = { session_id: sessionId, fence, reason };
  if (retry !== undefined) body.retry = retry;
  return call("POST", "/v1/queues/{queue}/tasks/{id}/fail", taskPath(queue, id, "fail"), { body, mutation: true });
}

export function releaseTask(queue: string, id: string, sessionId: string, fence: number, note?: string): Call {
  const body: Schemas["TaskReleaseRequest"] = { session_id: sessionId, fence };
  if (note !== undefined) body.note = note;
  return call("POST", "/v1/queues/{queue}/tasks/{id}/release", taskPath(queue, id, "release"), { body, mutation: true });
}

export function queueInfo(queue: string): Call {
  return call("GET", "/v1/queues/{queue}", queuePath(queue));
}

export function listQueues(limit?: number, cursor?: string): Call {
  return call("GET", "/v1/queues", "/v1/queues" + queryString({ limit, cursor }));
}

export function listTasks(queue: string, state?: TaskState, limit?: number, cursor?: string): Call {
  return call("GET", "/v1/queues/{queue}/tasks", `${queuePath(queue)}/tasks` + queryString({ state, limit, cursor }));
}

// Transactions --------------------------------------------------------------------------------

export function txn(sessionId: string | undefined, compare: TxnCompare[], success: TxnOp[], failure: TxnOp[]): Call {
  const body: Schemas["TxnRequest"] = {};
  if (sessionId !== undefined) body.session_id = sessionId;
  if (compare.length > 0) body.compare = compare;
  if (success.length > 0) body.success = success;
  if (failure.length > 0) body.failure = failure;
  return call("POST", "/v1/txn", "/v1/txn", { body, mutation: true });
}

// Events --------------------------------------------------------------------------------------

export function events(after?: number, limit?: number): Call {
  return call("GET", "/v1/events", "/v1/events" + queryString({ after, limit }));
}

// Access control, limits, cluster -------------------------------------------------------------

export function createToken(name: string, role: TokenRole, namespaces: string[], quotas?: TokenQuotas): Call {
  const body: Schemas["CreateTokenRequest"] = { name, role, namespaces: [...namespaces] };
  if (quotas !== undefined) body.quotas = { ...quotas };
  return call("POST", "/v1/auth/tokens", "/v1/auth/tokens", { body, mutation: true });
}

export function listTokens(): Call {
  return call("GET", "/v1/auth/tokens", "/v1/auth/tokens");
}

export function revokeToken(name: string): Call {
  return call("DELETE", "/v1/auth/tokens/{name}", `/v1/auth/tokens/${encodeName(name, "token name")}`, {
    mutation: true,
  });
}

export function getLimits(): Call {
  return call("GET", "/v1/limits", "/v1/limits");
}

export function setLimits(changes: Record<string, number>): Call {
  if (Object.keys(changes).length === 0) throw new InvalidArgument("give at least one limit to change");
  return call("PUT", "/v1/limits", "/v1/limits", { body: { ...changes }, mutation: true });
}

export function clusterStatus(): Call {
  return call("GET", "/v1/cluster", "/v1/cluster");
}

export function addMember(id: number, apiAddr: string, peerAddr: string, voter?: boolean): Call {
  const body: Schemas["AddMemberRequest"] = { id, api_addr: apiAddr, peer_addr: peerAddr };
  if (voter !== undefined) body.voter = voter;
  return call("POST", "/v1/cluster/members", "/v1/cluster/members", { body, mutation: true });
}

export function removeMember(id: number): Call {
  if (!Number.isSafeInteger(id) || id <= 0) throw new InvalidArgument(`a member id is a positive integer, not ${id}`);
  return call("DELETE", "/v1/cluster/members/{id}", `/v1/cluster/members/${id}`, { mutation: true });
}
