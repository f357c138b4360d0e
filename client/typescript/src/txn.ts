/**
 * Builders of the compares and ops of `POST /v1/txn` (docs/api.md, "Transactions").
 *
 *     await client.txn({
 *       compare: [txn.fence("repo/build", guard.fence)],
 *       success: [txn.put("results/build", { ok: true }), txn.release("repo/build")],
 *       guard,
 *     });
 */

import { enqueueBody, type EnqueueFields, type TxnCompare, type TxnOp } from "./routes.js";

/** Holds when `token` is the live fence of `resource` held by the transaction's session. */
export function fence(resource: string, token: number): TxnCompare {
  return { fence: { resource, token } };
}

/** Holds when `key`'s revision is `revision` (0: the key is absent). */
export function kvRevision(key: string, revision: number): TxnCompare {
  return { kv: key, revision };
}

export function put(key: string, value: unknown): TxnOp {
  return { op: "put", key, value };
}

export function del(key: string): TxnOp {
  return { op: "delete", key };
}

export function release(resource: string): TxnOp {
  return { op: "release", resource };
}

export function addTask(queue: string, payload: unknown, fields: EnqueueFields = {}): TxnOp {
  return { op: "add_task", queue, task: enqueueBody(payload, fields) };
}

export function completeTask(queue: string, id: string, fence: number, result?: unknown): TxnOp {
  const op: Extract<TxnOp, { op: "complete_task" }> = { op: "complete_task", queue, id, fence };
  if (result !== undefined) op.result = result;
  return op;
}

/** Fails a task; without `retry: true` it goes dead (a transaction's default, unlike the route). */
export function failTask(queue: string, id: string, fence: number, reason: string, retry?: boolean): TxnOp {
  const op: Extract<TxnOp, { op: "fail_task" }> = { op: "fail_task", queue, id, fence, reason };
  if (retry !== undefined) op.retry = retry;
  return op;
}
