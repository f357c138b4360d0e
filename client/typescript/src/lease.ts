/**
 * Lease validity from the holder's own monotonic clock (docs/guarantees.md G7), and the
 * renewals that extend it.
 *
 * A holder that sent the first attempt of an acquire or keepalive at `t0` (`performance.now()`)
 * and got `expires_in_ms` back may act until
 *
 *     t0 + (expires_in_ms - 1) * (1 - 2 * clock_rate_error)
 *
 * and, with a max hold, never past `t_acquire + (max_hold_ms - 1) * (1 - 2 * clock_rate_error)`.
 * Once that instant passes, or the server says `LEASE_LOST`, the session is lost for good: a
 * late keepalive never revives it.
 *
 * Every timer here is `unref()`ed: a process holding a guard exits by itself when it has
 * nothing else to do.
 */

import { expectObject, now, require, unrefTimer, type Transport } from "./core.js";
import { ClaimLost, LeaseLost, NotFound } from "./errors.js";
import * as routes from "./routes.js";

/**
 * How long before its G7 deadline a session whose renewals keep failing declares itself lost
 * (at most; never more than a tenth of the TTL), so that the report comes before the deadline.
 */
const REPORT_MARGIN_MAX_MS = 250;
const KEEPALIVE_RETRY_INITIAL_MS = 50;
const KEEPALIVE_TIMEOUT_MIN_MS = 200;

export const EXPIRED = "expired: no keepalive succeeded before the local G7 deadline";
export const MAX_HOLD = "max hold reached";
export const ENDED = "session ended";

/** G7: the last instant (`performance.now()` ms) the holder may act. */
export function validUntil(sentAt: number, expiresInMs: number, rateError: number): number {
  return sentAt + Math.max(expiresInMs - 1, 0) * (1 - 2 * rateError);
}

/** Called once, with the reason, when a guard, claim or session is lost. */
export type LostCallback = (reason: string) => void;

/**
 * One thing that is lost once: a lease guard, a task claim or a session handle. Its report
 * (the callback and the `AbortSignal`) happens exactly once, whoever notices first.
 */
export class Watch {
  reason: string | undefined;
  /** Released or settled: no report any more. */
  retired = false;
  private readonly controller = new AbortController();

  constructor(
    private readonly what: string,
    private readonly onLost: LostCallback | undefined,
    readonly maxHoldUntil: number | undefined,
  ) {}

  get signal(): AbortSignal {
    return this.controller.signal;
  }

  report(reason: string): boolean {
    if (this.reason !== undefined || this.retired) return false;
    this.reason = reason;
    this.controller.abort(new ClaimLost(`${this.what} is lost: ${reason}`));
    if (this.onLost !== undefined) {
      try {
        this.onLost(reason);
      } catch {
        // A callback's failure must neither stop the renewals nor become an unhandled error
        // in a timer; the loss itself is recorded above.
      }
    }
    return true;
  }

  /** Resolves with the reason once lost, or `undefined` after `timeoutMs`; keeps the process alive meanwhile. */
  waitLost(timeoutMs: number): Promise<string | undefined> {
    if (this.reason !== undefined || this.retired) return Promise.resolve(this.reason);
    return new Promise((resolve) => {
      const done = (): void => {
        clearTimeout(timer);
        this.signal.removeEventListener("abort", done);
        resolve(this.reason);
      };
      const timer = setTimeout(done, Math.max(0, timeoutMs));
      this.signal.addEventListener("abort", done);
    });
  }
}

/** A session's G7 deadline, its loss, and the watches (guards, claims) that live on it. */
export class SessionState {
  validUntil: number;
  lost: string | undefined;
  readonly watches: Watch[] = [];
  readonly margin: number;
  private timer: ReturnType<typeof setTimeout> | undefined;

  constructor(
    readonly id: string,
    readonly holder: string,
    readonly ttlMs: number,
    until: number,
    readonly rateError: number,
  ) {
    this.validUntil = until;
    this.margin = Math.min(REPORT_MARGIN_MAX_MS, ttlMs / 10);
    this.schedule();
  }

  addWatch(watch: Watch): void {
    this.watches.push(watch);
    this.schedule();
  }

  /** Why the session may no longer act, from the clock alone; reports a loss it notices. */
  lostReason(): string | undefined {
    if (this.lost === undefined && now() >= this.validUntil) this.lost = EXPIRED;
    if (this.lost !== undefined) this.settle();
    return this.lost;
  }

  recordRenewal(sentAt: number, expiresInMs: number): void {
    if (this.lost !== undefined) return;
    if (now() >= this.validUntil) {
      this.lost = EXPIRED;
      this.settle();
      return;
    }
    this.validUntil = Math.max(this.validUntil, validUntil(sentAt, expiresInMs, this.rateError));
    this.schedule();
  }

  markLost(reason: string): void {
    if (this.lost === undefined) this.lost = reason;
    this.settle();
  }

  /** A watch's loss: its own max hold first, then its session's. */
  watchReason(watch: Watch): string | undefined {
    if (watch.reason !== undefined) return watch.reason;
    if (watch.maxHoldUntil !== undefined && now() >= watch.maxHoldUntil) {
      watch.report(MAX_HOLD);
      return watch.reason;
    }
    return this.lostReason();
  }

  ensureValid(watch: Watch, what: string): void {
    const reason = this.watchReason(watch);
    if (reason !== undefined) throw new ClaimLost(`${what} is lost: ${reason}`);
  }

  keepaliveTimeout(clientTimeoutMs: number): number {
    return Math.min(clientTimeoutMs, Math.max(this.ttlMs / 4, KEEPALIVE_TIMEOUT_MIN_MS));
  }

  private settle(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
    for (const watch of [...this.watches]) watch.report(this.lost!);
  }

  /** The reporter: one unref'd timer at the next report instant, moved by every renewal. */
  private schedule(): void {
    clearTimeout(this.timer);
    if (this.lost !== undefined) return;
    let at = this.validUntil - this.margin;
    for (const watch of this.watches) {
      if (watch.maxHoldUntil !== undefined && watch.reason === undefined && !watch.retired) {
        at = Math.min(at, watch.maxHoldUntil - this.margin);
      }
    }
    this.timer = setTimeout(() => {
      this.timer = undefined;
      this.checkReports();
      this.schedule();
    }, Math.max(0, at - now()));
    unrefTimer(this.timer);
  }

  /**
   * Declares lost what is within the report margin of its deadline (a watch's own max hold
   * first: a new lease's first deadline is capped by it, and that is the cause).
   */
  private checkReports(): void {
    const at = now();
    for (const watch of [...this.watches]) {
      if (watch.maxHoldUntil !== undefined && at >= watch.maxHoldUntil - this.margin) watch.report(MAX_HOLD);
    }
    if (this.lost === undefined && at >= this.validUntil - this.margin) this.lost = EXPIRED;
    if (this.lost !== undefined) this.settle();
  }
}

/**
 * The keepalive loop of one session: a renewal every third of the TTL, retried with backoff
 * across nodes until the G7 deadline, each attempt bounded by the time left. Never throws: a
 * failure it cannot explain (a malformed answer, say) is retried like a network error, and
 * the session is reported lost at its deadline if no renewal succeeds.
 */
export class Renewer {
  paused = false;
  private stopped = false;
  private wake: (() => void) | undefined;

  constructor(
    private readonly transport: Transport,
    private readonly state: SessionState,
  ) {
    void this.loop().catch((error: unknown) => {
      this.state.markLost(`the renewals stopped: ${String(error)}`);
    });
  }

  stop(): void {
    this.stopped = true;
    this.wake?.();
  }

  private until(at: number): Promise<void> {
    return new Promise((resolve) => {
      const timer = setTimeout(finish, Math.max(0, at - now()));
      unrefTimer(timer);
      this.wake = finish;
      function finish(): void {
        clearTimeout(timer);
        resolve();
      }
    });
  }

  private async loop(): Promise<void> {
    const state = this.state;
    const interval = state.ttlMs / 3;
    const retryMax = Math.max(state.ttlMs / 10, KEEPALIVE_RETRY_INITIAL_MS);
    let retry = KEEPALIVE_RETRY_INITIAL_MS;
    let nextRenewal = now() + interval;
    while (!this.stopped) {
      await this.until(nextRenewal);
      if (this.stopped || state.lostReason() !== undefined) return;
      if (this.paused) {
        nextRenewal = now() + interval;
        continue;
      }
      const c = routes.keepalive(state.id);
      const started = now();
      c.timeoutMs = state.keepaliveTimeout(this.transport.config.timeoutMs);
      c.budgetMs = Math.max(0, state.validUntil - state.margin - started);
      c.background = true;
      let sentAt: number;
      let expiresInMs: number;
      try {
        const answer = await this.transport.execute(c);
        sentAt = answer.sentAt;
        expiresInMs = require<number>(expectObject(answer, "keepalive"), "expires_in_ms", "integer", "keepalive");
      } catch (error) {
        if (error instanceof LeaseLost || error instanceof NotFound) {
          state.markLost(`session ended (the server says: ${error.message})`);
          return;
        }
        nextRenewal = now() + retry;
        retry = Math.min(retry * 2, retryMax);
        continue;
      }
      if (this.stopped) return;
      state.recordRenewal(sentAt, expiresInMs);
      retry = KEEPALIVE_RETRY_INITIAL_MS;
      nextRenewal = started + interval;
    }
  }
}
