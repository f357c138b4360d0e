/**
 * The `claims` tool wrapper's core: run a tool under a lease, and turn every way the claim can
 * fail into a one-line result for the model (docs/agents.md: the model only ever sees the
 * tool's own result or "denied: ..."; fail closed).
 */

import {
  BatonError,
  LeaseHeld,
  NoLeader,
  OutcomeUnknown,
  PermissionDenied,
  ProtocolError,
  TLSError,
  Unauthenticated,
  Unavailable,
} from "./errors.js";
import type { LeaseMode } from "./routes.js";

/** What a claimed tool gets besides its arguments: its guard, and the guard's loss signal. */
export interface ToolContext {
  guard: ClaimGuard;
  /** Aborted when the claim is lost while the tool runs: stop, the result will not count. */
  signal: AbortSignal;
}

/** What the wrapper needs of a lease guard. */
export interface ClaimGuard {
  readonly signal: AbortSignal;
  lostReason(): string | undefined;
  release(): Promise<void>;
}

export type Tool<A, R> = (args: A, context: ToolContext) => R | Promise<R>;
/** A wrapped tool: its own result, or one line saying why it did not run (or did not count). */
export type ClaimedTool<A, R> = (args: A) => Promise<R | string>;

export interface ClaimOptions {
  ttlMs?: number;
  mode?: LeaseMode;
  /** Wait in the path's line up to this long before answering with the denial. */
  waitMs?: number;
  /** Why the agent wants the path; shown to others in their denials' `held_by.labels`. */
  reason?: string;
}

const DID_NOT_RUN = "; the tool did not run";

/** The tool result for a claim that could not be made or checked. */
export function claimFailure(resource: string, error: unknown): string {
  if (error instanceof LeaseHeld) return error.denial(resource);
  const head = `error: could not claim ${resource}`;
  if (error instanceof Unauthenticated || error instanceof PermissionDenied) {
    return `${head}: Baton refused the token (${error})${DID_NOT_RUN}`;
  }
  if (error instanceof TLSError) return `${head}: TLS is misconfigured (${error})${DID_NOT_RUN}`;
  if (error instanceof ProtocolError) return `${head}: Baton's answer was malformed (${error})${DID_NOT_RUN}`;
  if (
    error instanceof Unavailable ||
    error instanceof NoLeader ||
    error instanceof OutcomeUnknown ||
    (error instanceof BatonError && error.isIndeterminate)
  ) {
    return `${head}: Baton is unreachable or did not answer in time (${error})${DID_NOT_RUN}`;
  }
  if (error instanceof BatonError) return `${head}: ${error}${DID_NOT_RUN}`;
  const name = error instanceof Error ? error.name : typeof error;
  const message = error instanceof Error ? error.message : String(error);
  return `${head}: ${name}: ${message}${DID_NOT_RUN}`;
}

function lostText(resource: string, reason: string): string {
  return (
    `error: the claim on ${resource} was lost while the tool ran (${reason}); another agent ` +
    "may hold it now: check its state before going on"
  );
}

/** Runs `tool(args)` under a claim on `resourceOf(args)`, failing closed. */
export async function runClaimed<A, R>(
  open: (resource: string) => Promise<ClaimGuard>,
  resourceOf: (args: A) => string,
  tool: Tool<A, R>,
  args: A,
): Promise<R | string> {
  const name = tool.name || "the tool";
  let resource: unknown;
  try {
    resource = resourceOf(args);
  } catch (error) {
    const why = error instanceof Error ? `${error.name}: ${error.message}` : String(error);
    return `error: cannot tell which path ${name} works on (${why})${DID_NOT_RUN}`;
  }
  if (typeof resource !== "string" || resource === "") {
    return `error: ${name} names no path to claim (${JSON.stringify(resource) ?? String(resource)})${DID_NOT_RUN}`;
  }
  let guard: ClaimGuard;
  try {
    guard = await open(resource);
  } catch (error) {
    return claimFailure(resource, error);
  }
  let lost: string | undefined;
  let result: R;
  try {
    lost = guard.lostReason();
    if (lost !== undefined) return lostText(resource, lost);
    result = await tool(args, { guard, signal: guard.signal });
    lost = guard.lostReason();
  } finally {
    await guard.release().catch(() => undefined); // the lease lapses with its TTL
  }
  return lost !== undefined ? lostText(resource, lost) : result;
}
