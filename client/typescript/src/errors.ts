/**
 * Errors: one class per error code of docs/api.md, "Error codes", plus the client's own.
 *
 * Every error answers one question first: was the request surely not applied, or is the
 * outcome unknown (`isIndeterminate`)? Decide on the class (or `code`), never on `message`.
 */

import type { components } from "./generated/openapi.js";

export type ErrorCode = components["schemas"]["ErrorCode"];
export type HeldBy = components["schemas"]["HeldBy"];
export type SharedHolder = components["schemas"]["SharedHolder"];
/** A problem+json body, as the server sends it (fields unknown to this client are kept). */
export type Problem = { code: string; message: string } & Record<string, unknown>;

export interface BatonErrorOptions {
  code?: string;
  status?: number;
  isIndeterminate?: boolean;
  problem?: Record<string, unknown>;
  cause?: unknown;
}

/**
 * Base class of every error this client throws.
 *
 * `code` is the server's error code (`"LEASE_HELD"`, ...) or one of the client's own
 * (`"UNAVAILABLE"`, `"PROTOCOL"`, `"TLS"`); `status` the HTTP status, when an answer came;
 * `isIndeterminate` is true when the request may or may not have been applied (the client
 * already retried it with the same `Idempotency-Key` within its retry budget); `problem` the
 * raw problem body, when there was one.
 */
export class BatonError extends Error {
  readonly code: string;
  readonly status: number | undefined;
  isIndeterminate: boolean;
  readonly problem: Record<string, unknown>;
  /** The leader's node id, with `NO_LEADER` and `OUTCOME_UNKNOWN`, when known. */
  readonly leader: number | undefined;
  /** How long to wait before sending the same request again (`NO_LEADER`, `RESOURCE_EXHAUSTED`). */
  readonly retryAfterMs: number | undefined;

  static readonly CODE: string = "UNKNOWN";
  static readonly INDETERMINATE: boolean = false;

  constructor(message: string, options: BatonErrorOptions = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    const own = new.target as typeof BatonError;
    this.name = own.name;
    this.code = options.code ?? own.CODE;
    this.status = options.status;
    this.isIndeterminate = options.isIndeterminate ?? own.INDETERMINATE;
    this.problem = options.problem ?? {};
    this.leader = integer(this.problem.leader);
    this.retryAfterMs = integer(this.problem.retry_after_ms);
  }

  override toString(): string {
    return `${this.code}: ${this.message}`;
  }
}

/** 400 (405 for a wrong method): fix the request. Surely not applied. */
export class InvalidArgument extends BatonError {
  static override readonly CODE = "INVALID_ARGUMENT";
}

/** 401: no token, a malformed, unknown or revoked one. Surely not applied. */
export class Unauthenticated extends BatonError {
  static override readonly CODE = "UNAUTHENTICATED";
}

/** 403: the token's role or namespaces do not allow it. Surely not applied. */
export class PermissionDenied extends BatonError {
  static override readonly CODE = "PERMISSION_DENIED";
}

/** 404: no such route, lease, session, key or member, or an event revision too old. */
export class NotFound extends BatonError {
  static override readonly CODE = "NOT_FOUND";
}

/**
 * 409: a live lease conflicts. `holder`, `resource`, `mode`, `fence` and `expiresIn`
 * (seconds) describe it; `heldBy` is the raw object.
 */
export class LeaseHeld extends BatonError {
  static override readonly CODE = "LEASE_HELD";
  readonly heldBy: Partial<HeldBy>;
  readonly holder: string | undefined;
  readonly resource: string | undefined;
  readonly mode: string | undefined;
  readonly fence: number | undefined;
  readonly expiresInMs: number | undefined;
  /** Seconds the lease in the way has left, as of the refusal. */
  readonly expiresIn: number | undefined;
  /** With a shared lease: how many may hold it at once. */
  readonly limit: number | undefined;
  /** With a shared lease: up to ten of its live holders, oldest grant first. */
  readonly holders: SharedHolder[];

  constructor(message: string, options: BatonErrorOptions = {}) {
    super(message, options);
    const raw = this.problem.held_by;
    const heldBy = isObject(raw) ? (raw as Partial<HeldBy>) : {};
    this.heldBy = heldBy;
    this.holder = text(heldBy.holder);
    this.resource = text(heldBy.resource);
    this.mode = text(heldBy.mode);
    this.fence = integer(heldBy.fence);
    this.expiresInMs = integer(heldBy.expires_in_ms);
    this.expiresIn = this.expiresInMs === undefined ? undefined : this.expiresInMs / 1000;
    this.limit = integer(heldBy.limit);
    this.holders = Array.isArray(heldBy.holders) ? heldBy.holders.filter(isObject) : [];
  }

  /**
   * The one line an agent's model reads: `denied: agent-b holds src/auth.rs for 38 s more`.
   * `asked` is the path that was asked for (the lease in the way may cover it).
   */
  denial(asked?: string): string {
    const seconds = Math.ceil((this.expiresInMs ?? 0) / 1000);
    const holder = this.holder ?? "another holder";
    const resource = this.resource ?? asked ?? "the resource";
    if (this.mode === "shared" && this.limit !== undefined) {
      const names = this.holders.map((h) => String(h.holder)).join(", ") || holder;
      const total = integer(this.heldBy.holders_total) ?? this.holders.length;
      return (
        `denied: ${resource} is shared by ${total} of ${this.limit} holders ` +
        `(${names}); the first frees up in ${seconds} s`
      );
    }
    if (asked !== undefined && resource !== asked) {
      return (
        `denied: ${holder} holds ${resource} (${this.mode ?? "lease"}), ` +
        `which covers ${asked}, for ${seconds} s more`
      );
    }
    return `denied: ${holder} holds ${resource} for ${seconds} s more`;
  }
}

/** 409: the session is gone, or it does not hold the lease named: stop acting as holder. */
export class LeaseLost extends BatonError {
  static override readonly CODE = "LEASE_LOST";
}

/**
 * 409: the fence sent is not the live one; the fenced write was refused. `currentFence` is
 * the live fence, when the resource has a live lease.
 */
export class StaleFence extends BatonError {
  static override readonly CODE = "STALE_FENCE";
  readonly currentFence: number | undefined;

  constructor(message: string, options: BatonErrorOptions = {}) {
    super(message, options);
    this.currentFence = integer(this.problem.current_fence);
  }
}

/** 413: the body is over 1 MiB, or a value or payload over 256 KiB. */
export class PayloadTooLarge extends BatonError {
  static override readonly CODE = "PAYLOAD_TOO_LARGE";
}

/** 422: the `Idempotency-Key` was used for a different request. */
export class IdempotencyKeyReused extends BatonError {
  static override readonly CODE = "IDEMPOTENCY_KEY_REUSED";
}

/** 429: a count limit was reached or the node is overloaded. Surely not applied. */
export class ResourceExhausted extends BatonError {
  static override readonly CODE = "RESOURCE_EXHAUSTED";
}

/** 503: no leader could be reached in time. Surely not applied. */
export class NoLeader extends BatonError {
  static override readonly CODE = "NO_LEADER";
}

/**
 * 504, or a timeout or dropped connection after the request was sent: it may or may not have
 * been applied.
 */
export class OutcomeUnknown extends BatonError {
  static override readonly CODE = "OUTCOME_UNKNOWN";
  static override readonly INDETERMINATE = true;
}

/** 500: a server fault, possibly after the write was applied: outcome unknown. */
export class InternalError extends BatonError {
  static override readonly CODE = "INTERNAL";
  static override readonly INDETERMINATE = true;
}

/**
 * No endpoint took the request (connection refused everywhere, or every endpoint said
 * `NO_LEADER`/`RESOURCE_EXHAUSTED`) within the retry budget: surely not applied.
 */
export class Unavailable extends BatonError {
  static override readonly CODE = "UNAVAILABLE";
}

/**
 * The answer was not what the API promises (not problem+json, a body that does not parse, a
 * field missing). `isIndeterminate` tells whether the request may have been applied.
 */
export class ProtocolError extends BatonError {
  static override readonly CODE = "PROTOCOL";
}

/**
 * The TLS handshake failed: a configuration error (trust the cluster's CA, see the README,
 * "TLS"); never retried.
 */
export class TLSError extends BatonError {
  static override readonly CODE = "TLS";
}

/**
 * A guard or task claim is no longer valid (G7 deadline passed, max hold reached, or the
 * server said the session is gone); thrown by the client before it sends anything. A
 * `LeaseLost`, so one `instanceof LeaseLost` covers both.
 */
export class ClaimLost extends LeaseLost {}

/** Every error code of docs/api.md, "Error codes", and its class. */
export const ERROR_CLASSES: Readonly<Record<ErrorCode, typeof BatonError>> = Object.freeze({
  INVALID_ARGUMENT: InvalidArgument,
  UNAUTHENTICATED: Unauthenticated,
  PERMISSION_DENIED: PermissionDenied,
  NOT_FOUND: NotFound,
  LEASE_HELD: LeaseHeld,
  LEASE_LOST: LeaseLost,
  STALE_FENCE: StaleFence,
  PAYLOAD_TOO_LARGE: PayloadTooLarge,
  IDEMPOTENCY_KEY_REUSED: IdempotencyKeyReused,
  RESOURCE_EXHAUSTED: ResourceExhausted,
  NO_LEADER: NoLeader,
  OUTCOME_UNKNOWN: OutcomeUnknown,
  INTERNAL: InternalError,
});

/** Codes after which the same request may be sent again elsewhere (surely not applied). */
export const RETRYABLE_CODES: ReadonlySet<string> = new Set(["NO_LEADER", "RESOURCE_EXHAUSTED"]);
/** Codes that leave the outcome unknown. */
export const INDETERMINATE_CODES: ReadonlySet<string> = new Set(["OUTCOME_UNKNOWN", "INTERNAL"]);

/**
 * The error for a problem+json body answered with `status`.
 *
 * A code this client does not know is a plain `BatonError` carrying it, read as "surely not
 * applied" for a 4xx and "unknown" otherwise (docs/api.md, "Error codes"). A problem without a
 * string `code` and `message`, or a `LEASE_HELD` without `held_by`, is a `ProtocolError`.
 */
export function errorFromProblem(status: number, problem: unknown): BatonError {
  const body = isObject(problem) ? problem : {};
  const { code, message } = body;
  if (typeof code !== "string" || typeof message !== "string") {
    return new ProtocolError(
      `HTTP ${status}: an error body without a string code and message: ${excerpt(problem)}`,
      { status, isIndeterminate: !(status >= 400 && status < 500) },
    );
  }
  const known = Object.prototype.hasOwnProperty.call(ERROR_CLASSES, code)
    ? ERROR_CLASSES[code as ErrorCode]
    : undefined;
  if (known === undefined) {
    return new BatonError(message, {
      code,
      status,
      isIndeterminate: !(status >= 400 && status < 500),
      problem: body,
    });
  }
  if (known === LeaseHeld && !isObject(body.held_by)) {
    return new ProtocolError(`LEASE_HELD without held_by: ${message}`, { status, problem: body });
  }
  return new known(message, { status, problem: body });
}

export function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function integer(value: unknown): number | undefined {
  return Number.isSafeInteger(value) ? (value as number) : undefined;
}

function text(value: unknown): string | undefined {
  return typeof value === "string" ? value : undefined;
}

export function excerpt(value: unknown): string {
  let rendered: string;
  try {
    rendered = typeof value === "string" ? value : JSON.stringify(value) ?? String(value);
  } catch {
    rendered = String(value);
  }
  return rendered.length <= 200 ? rendered : `${rendered.slice(0, 200)}...`;
}
