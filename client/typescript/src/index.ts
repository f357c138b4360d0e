/**
 * TypeScript client for Baton, a replicated lease and fence-token coordination service.
 *
 *     import { BatonClient } from "@baton/client";
 *
 *     const client = new BatonClient({ endpoints: ["http://127.0.0.1:7420"], holder: "agent-a" });
 *     const guard = await client.lease("src/auth.rs", { ttlMs: 30_000 }).acquire();
 *     try {
 *       await client.kvPut("owners/src/auth.rs", "agent-a", { guard });
 *     } finally {
 *       await guard.release();
 *     }
 */

export * as txn from "./txn.js";
export {
  BatonClient,
  LeaseGuard,
  Session,
  TaskClaim,
  TTL_MS_DEFAULT,
  type ClaimResponse,
  type FenceOptions,
  type Grant,
  type Lease,
  type LeaseOptions,
  type Task,
  type TxnResponse,
  type WorkOptions,
  type WorkReport,
} from "./client.js";
export { type ClientOptions, type FetchLike } from "./core.js";
export { EventStream, type BatonEvent } from "./events.js";
export { type LostCallback } from "./lease.js";
export { type ClaimOptions, type ClaimedTool, type Tool, type ToolContext } from "./tools.js";
export {
  BatonError,
  ClaimLost,
  ERROR_CLASSES,
  IdempotencyKeyReused,
  InternalError,
  InvalidArgument,
  LeaseHeld,
  LeaseLost,
  NoLeader,
  NotFound,
  OutcomeUnknown,
  PayloadTooLarge,
  PermissionDenied,
  ProtocolError,
  ResourceExhausted,
  StaleFence,
  TLSError,
  Unauthenticated,
  Unavailable,
  errorFromProblem,
  type ErrorCode,
  type HeldBy,
} from "./errors.js";
export type { components, paths } from "./generated/openapi.js";
