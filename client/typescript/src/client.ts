/**
 * `BatonClient` and its sessions, lease guards, task claims and worker loop. Renewals run on
 * `unref()`ed timers: a process holding a guard exits by itself when it has nothing else to do.
 */

import {
  Transport,
  WAIT_MS_MAX,
  buildConfig,
  expectObject,
  now,
  require,
  type Answer,
  type Call,
  type ClientOptions,
} from "./core.js";
import { BatonError, ClaimLost, InvalidArgument, LeaseLost, NotFound, StaleFence } from "./errors.js";
import { EventStream } from "./events.js";
import type { components } from "./generated/openapi.js";
import { ENDED, Renewer, SessionState, Watch, validUntil, type LostCallback } from "./lease.js";
import * as routes from "./routes.js";
import { runClaimed, type ClaimOptions, type ClaimedTool, type Tool } from "./tools.js";

type Schemas = components["schemas"];
export type Grant = Schemas["Grant"];
export type Lease = Schemas["Lease"];
export type Task = Schemas["Task"];
export type ClaimResponse = Schemas["ClaimResponse"];
export type TxnResponse = Schemas["TxnResponse"];

/** The TTL of a session made for a guard, claim or session when none is given. */
export const TTL_MS_DEFAULT = 30_000;
/** The note a claim left unsettled is released with. */
export const DROPPED_NOTE = "the claimer let go of its claim without settling it";

export interface LeaseOptions {
  ttlMs?: number;
  mode?: routes.LeaseMode;
  /** With `mode: "shared"` (and only then): how many may hold the path at once. */
  limit?: number;
  maxHoldMs?: number;
  labels?: Record<string, string>;
  reason?: string;
  /** Wait in the path's line up to this long instead of being refused (the fair line). */
  waitMs?: number;
  /** Called once, with the reason, when the lease is lost. */
  onLost?: LostCallback;
}

/** Where a fenced write's fence comes from: a guard, or an explicit fence and session. */
export interface FenceOptions {
  guard?: LeaseGuard;
  fence?: routes.FenceRef;
  sessionId?: string;
}

export interface WorkOptions {
  ttlMs?: number;
  /** Stop after this many tasks were completed or failed. */
  maxTasks?: number;
  /** How long each claim waits for a ready task before the loop stops with `queue_empty`. */
  waitMs?: number;
}

/**
 * What `work` did: tasks completed and failed, and why it stopped (`"queue_empty"`,
 * `"max_tasks"` or `"claim_lost"`, then with `taskId` and `reason`).
 */
export interface WorkReport {
  completed: number;
  failed: number;
  stopped: "queue_empty" | "max_tasks" | "claim_lost";
  taskId?: string;
  reason?: string;
}

/**
 * A handle on a Baton cluster. Any node answers; calls fail over between the endpoints and
 * are retried only when that is safe (see the README, "Failover and retries").
 */
export class BatonClient {
  /** @internal */
  readonly transport: Transport;

  constructor(options: ClientOptions = {}) {
    this.transport = new Transport(buildConfig(options));
  }

  get holder(): string {
    return this.transport.config.holder;
  }

  get namespace(): string {
    return this.transport.config.namespace ?? "default";
  }

  get endpoints(): string[] {
    return this.transport.config.endpoints.map((e) => e.base);
  }

  /** @internal Sends one call with the retry rules. */
  async execute(c: Call): Promise<Answer> {
    return this.transport.execute(c);
  }

  private async object<T>(c: Call): Promise<T> {
    return expectObject(await this.execute(c), `${c.method} ${c.route}`) as T;
  }

  private get rateError(): number {
    return this.transport.config.clockRateError;
  }

  // -- sessions ------------------------------------------------------------------------------

  /** Creates a bare session (no renewals): the raw answer. */
  async createSession(options: { ttlMs?: number; labels?: Record<string, string> } = {}): Promise<Schemas["CreateSessionResponse"]> {
    return this.object(routes.createSession(this.holder, options.ttlMs ?? TTL_MS_DEFAULT, options.labels));
  }

  /** A session that renews itself; its leases and claims live and die with it. */
  async session(options: { ttlMs?: number; labels?: Record<string, string>; onLost?: LostCallback } = {}): Promise<Session> {
    const ttlMs = options.ttlMs ?? TTL_MS_DEFAULT;
    const answer = await this.execute(routes.createSession(this.holder, ttlMs, options.labels));
    const created = expectObject(answer, "POST /v1/sessions");
    const sessionId = require<string>(created, "session_id", "string", "POST /v1/sessions");
    const expiresInMs = require<number>(created, "expires_in_ms", "integer", "POST /v1/sessions");
    const state = new SessionState(sessionId, this.holder, ttlMs, validUntil(answer.sentAt, expiresInMs, this.rateError), this.rateError);
    return new Session(this, state, new Renewer(this.transport, state), options.onLost);
  }

  async keepalive(sessionId: string): Promise<Schemas["KeepaliveResponse"]> {
    return this.object(routes.keepalive(sessionId));
  }

  async release(sessionId: string, resource: string): Promise<Schemas["ReleaseResponse"]> {
    return this.object(routes.release(sessionId, resource));
  }

  async getSession(sessionId: string, page: { limit?: number; cursor?: string } = {}): Promise<Schemas["SessionInfo"]> {
    return this.object(routes.getSession(sessionId, page.limit, page.cursor));
  }

  async endSession(sessionId: string): Promise<Schemas["EndSessionResponse"]> {
    return this.object(routes.endSession(sessionId));
  }

  // -- leases --------------------------------------------------------------------------------

  /**
   * A guard for `resource` (not yet acquired): `const guard = await client.lease(path).acquire()`.
   * It renews its own session, tells from the local clock whether it may still act (G7), and
   * fires `guard.signal` when the lease is lost.
   */
  lease(resource: string, options: LeaseOptions = {}): LeaseGuard {
    return new LeaseGuard(this, undefined, resource, options);
  }

  /** Runs `fn` under a lease on `resource`, and releases it afterwards, whatever happens. */
  async withLease<T>(resource: string, fn: (guard: LeaseGuard) => Promise<T> | T, options: LeaseOptions = {}): Promise<T> {
    const guard = await this.lease(resource, options).acquire();
    try {
      return await fn(guard);
    } finally {
      await guard.release().catch(() => undefined); // the lease lapses with its TTL
    }
  }

  /** One acquire (no guard, no renewals): the raw grant. With `waitMs`, waits in the line. */
  async acquire(resource: string, options: Omit<LeaseOptions, "onLost"> & { sessionId?: string } = {}): Promise<Grant> {
    const body = routes.acquireBody(resource, {
      sessionId: options.sessionId,
      holder: options.sessionId === undefined ? this.holder : undefined,
      ttlMs: options.sessionId === undefined ? options.ttlMs ?? TTL_MS_DEFAULT : undefined,
      mode: options.mode,
      limit: options.limit,
      maxHoldMs: options.maxHoldMs,
      labels: options.labels,
      reason: options.reason,
    });
    return expectObject(await this.acquireWaiting(body, options.waitMs), "POST /v1/leases") as Grant;
  }

  /**
   * An acquire, waiting in the path's line for up to `waitMs`: rounds of at most a third of
   * the session's TTL, renewing the session between them, keeping its place; at the end, the
   * place is given up and one last plain acquire answers (the grant or `LEASE_HELD`).
   * @internal
   */
  async acquireWaiting(body: routes.AcquireRequest, waitMs: number | undefined): Promise<Answer> {
    if (waitMs === undefined) return this.execute(routes.acquire(body));
    if (!(Number.isFinite(waitMs) && waitMs >= 0)) throw new InvalidArgument(`waitMs must be a non-negative number, not ${waitMs}`);
    const deadline = now() + waitMs;
    let ttlMs: number;
    if (body.ttl_ms !== undefined && body.ttl_ms !== null) {
      ttlMs = body.ttl_ms;
    } else {
      const info = (await this.getSession(body.session_id!)) as unknown as Record<string, unknown>;
      ttlMs = require<number>(info, "ttl_ms", "integer", "GET /v1/sessions/{id}");
    }
    const roundMax = Math.min(Math.max(Math.floor(ttlMs / 3), 1), WAIT_MS_MAX);
    let waiting: routes.AcquireRequest = { ...body };
    let createdId: string | undefined;
    try {
      for (;;) {
        waiting.wait_ms = Math.floor(Math.max(0, Math.min(deadline - now(), roundMax)));
        try {
          const answer = await this.execute(routes.acquire(waiting));
          const value = expectObject(answer, "POST /v1/leases");
          if (answer.status !== 202) {
            require(value, "fence", "integer", "POST /v1/leases");
            return answer;
          }
          const sessionId = require<string>(value, "session_id", "string", "POST /v1/leases");
          if (value.session_created === true) createdId = sessionId;
          waiting.session_id = sessionId;
          delete waiting.holder;
          delete waiting.ttl_ms;
          if (now() < deadline) {
            await this.keepalive(sessionId);
            continue;
          }
          if (createdId === undefined) {
            await this.release(sessionId, body.resource);
          } else {
            await this.endOwnSession(createdId);
            createdId = undefined;
          }
        } catch (error) {
          // A session this acquire made for itself that died between rounds (renewed too
          // late, as on a loaded machine) loses its place, not the acquire: join again.
          if (!(error instanceof LeaseLost) || createdId === undefined) throw error;
          await this.endOwnSession(createdId);
          createdId = undefined;
          waiting = { ...body };
          if (now() < deadline) continue;
        }
        return await this.execute(routes.acquire(body));
      }
    } catch (error) {
      if (createdId !== undefined) await this.endSession(createdId).catch(() => undefined);
      throw error;
    }
  }

  /** Ends a session a waiting acquire made for itself; one already gone counts. */
  private async endOwnSession(sessionId: string): Promise<void> {
    try {
      await this.endSession(sessionId);
    } catch (error) {
      if (!(error instanceof NotFound)) throw error;
    }
  }

  async getLease(resource: string): Promise<Lease> {
    return this.object(routes.getLease(resource));
  }

  async listLeases(options: { prefix?: string; limit?: number; cursor?: string } = {}): Promise<Schemas["LeaseList"]> {
    return this.object(routes.listLeases(options.prefix, options.limit, options.cursor));
  }

  /** Every live lease under `prefix`, page after page. */
  async *iterLeases(prefix?: string): AsyncGenerator<Lease> {
    let cursor: string | undefined;
    do {
      const page = await this.listLeases({ prefix, cursor });
      yield* page.leases;
      cursor = page.next_cursor ?? undefined;
    } while (cursor !== undefined);
  }

  async fenceCheck(resource: string, fence: number): Promise<Schemas["FenceCheckResponse"]> {
    return this.object(routes.fenceCheck(resource, fence));
  }

  // -- key-value store -------------------------------------------------------------------------

  async kvGet(key: string): Promise<Schemas["KvEntry"]> {
    return this.object(routes.kvGet(key));
  }

  /** Stores `value`; fenced by `guard` (or `fence` and `sessionId`), it is applied only while that lease is live (G4). */
  async kvPut(key: string, value: unknown, options: FenceOptions = {}): Promise<Schemas["KvPutResponse"]> {
    return this.object(routes.kvPut(key, value, fencedBy(options)));
  }

  async kvDelete(key: string, options: FenceOptions = {}): Promise<Schemas["KvDeleteResponse"]> {
    return this.object(routes.kvDelete(key, fencedBy(options)));
  }

  // -- transactions ----------------------------------------------------------------------------

  /** Compares, then the `success` or the `failure` ops, as one write (see `txn` builders). */
  async txn(options: {
    compare?: routes.TxnCompare[];
    success?: routes.TxnOp[];
    failure?: routes.TxnOp[];
    sessionId?: string;
    guard?: LeaseGuard | TaskClaim;
  }): Promise<TxnResponse> {
    let sessionId = options.sessionId;
    if (options.guard !== undefined) {
      options.guard.ensureValid();
      sessionId = options.guard.sessionId;
    }
    return this.object(routes.txn(sessionId, options.compare ?? [], options.success ?? [], options.failure ?? []));
  }

  // -- work queues -----------------------------------------------------------------------------

  async enqueue(queue: string, payload: unknown, options: routes.EnqueueFields = {}): Promise<Task> {
    return this.object(routes.enqueue(queue, routes.enqueueBody(payload, options)));
  }

  /**
   * Claims the best ready task (waiting up to `waitMs` for one): a `TaskClaim` whose session
   * renews itself, or undefined when none is ready. With `session`, the claim lives on it.
   */
  async claim(
    queue: string,
    options: { ttlMs?: number; waitMs?: number; session?: Session; onLost?: LostCallback } = {},
  ): Promise<TaskClaim | undefined> {
    const { session } = options;
    const ttlMs = options.ttlMs ?? TTL_MS_DEFAULT;
    let c: Call;
    if (session !== undefined) {
      session.ensureValid();
      c = routes.claim(queue, { sessionId: session.id, waitMs: options.waitMs });
    } else {
      c = routes.claim(queue, { holder: this.holder, ttlMs, waitMs: options.waitMs });
    }
    let answer: Answer;
    try {
      answer = await this.execute(c);
    } catch (error) {
      if (error instanceof LeaseLost && session !== undefined) {
        session.state.markLost(`session ended (the server says: ${error.message})`);
      }
      throw error;
    }
    if (answer.status === 204 || answer.value === undefined) return undefined;
    const what = "POST /v1/queues/{queue}/claim";
    const value = expectObject(answer, what);
    const sessionId = require<string>(value, "session_id", "string", what);
    require(value, "fence", "integer", what);
    require(value, "task", "object", what);
    const expiresInMs = require<number>(value, "expires_in_ms", "integer", what);
    if (session !== undefined) {
      session.state.recordRenewal(answer.sentAt, expiresInMs);
      return new TaskClaim(this, queue, value as ClaimResponse, session.state, undefined, options.onLost);
    }
    const state = new SessionState(sessionId, this.holder, ttlMs, validUntil(answer.sentAt, expiresInMs, this.rateError), this.rateError);
    return new TaskClaim(this, queue, value as ClaimResponse, state, new Renewer(this.transport, state), options.onLost);
  }

  async completeTask(queue: string, id: string, f: { sessionId: string; fence: number; result?: unknown }): Promise<Task> {
    return this.object(routes.completeTask(queue, id, f.sessionId, f.fence, f.result));
  }

  async failTask(queue: string, id: string, f: { sessionId: string; fence: number; reason: string; retry?: boolean }): Promise<Task> {
    return this.object(routes.failTask(queue, id, f.sessionId, f.fence, f.reason, f.retry));
  }

  async releaseTask(queue: string, id: string, f: { sessionId: string; fence: number; note?: string }): Promise<Task> {
    return this.object(routes.releaseTask(queue, id, f.sessionId, f.fence, f.note));
  }

  async queueInfo(queue: string): Promise<Schemas["QueueInfo"]> {
    return this.object(routes.queueInfo(queue));
  }

  async listQueues(page: { limit?: number; cursor?: string } = {}): Promise<Schemas["QueueList"]> {
    return this.object(routes.listQueues(page.limit, page.cursor));
  }

  async listTasks(queue: string, options: { state?: routes.TaskState; limit?: number; cursor?: string } = {}): Promise<Schemas["TaskList"]> {
    return this.object(routes.listTasks(queue, options.state, options.limit, options.cursor));
  }

  /**
   * The worker loop: claims tasks of `queue` one at a time on one renewing session, runs
   * `handler` on each, completes it with the handler's result or fails it (to be retried)
   * with the error it threw. It stops when no task is ready (`queue_empty`, after `waitMs`),
   * after `maxTasks`, or when a claim is lost while its handler runs (`claim_lost`: the
   * handler's `claim.signal` is aborted and its result is ignored).
   */
  async work(queue: string, handler: (claim: TaskClaim) => Promise<unknown>, options: WorkOptions = {}): Promise<WorkReport> {
    const report: WorkReport = { completed: 0, failed: 0, stopped: "queue_empty" };
    let session: Session | undefined;
    try {
      while (options.maxTasks === undefined || report.completed + report.failed < options.maxTasks) {
        let claim: TaskClaim | undefined;
        if (session === undefined) {
          claim = await this.claim(queue, { ttlMs: options.ttlMs, waitMs: options.waitMs });
          if (claim !== undefined) session = claim.adoptSession();
        } else {
          claim = await this.claim(queue, { waitMs: options.waitMs, session });
        }
        if (claim === undefined) return report;
        const running = Promise.resolve()
          .then(() => handler(claim))
          .then(
            (result) => ({ ok: true as const, result }),
            (error: unknown) => ({ ok: false as const, error }),
          );
        const lost = new Promise<"lost">((resolve) => {
          if (claim.signal.aborted) resolve("lost");
          else claim.signal.addEventListener("abort", () => resolve("lost"), { once: true });
        });
        const outcome = await Promise.race([running, lost]);
        if (outcome === "lost") {
          return { ...report, stopped: "claim_lost", taskId: claim.id, reason: claim.lostReason() ?? "lost" };
        }
        try {
          if (outcome.ok) {
            await claim.complete(outcome.result);
            report.completed += 1;
          } else {
            const error = outcome.error;
            const why = error instanceof Error ? `${error.name}: ${error.message}` : String(error);
            await claim.fail(why, { retry: true });
            report.failed += 1;
          }
        } catch (error) {
          if (error instanceof StaleFence || error instanceof LeaseLost) {
            return { ...report, stopped: "claim_lost", taskId: claim.id, reason: error.toString() };
          }
          throw error;
        }
      }
      report.stopped = "max_tasks";
      return report;
    } finally {
      await session?.end({ quiet: true });
    }
  }

  // -- events ----------------------------------------------------------------------------------

  /** One page of events after `after`. */
  async events(options: { after?: number; limit?: number } = {}): Promise<Schemas["EventsPage"]> {
    return this.object(routes.events(options.after, options.limit));
  }

  /** Every event after `after` as it is applied (server-sent events), resumed across nodes. */
  followEvents(options: { after?: number } = {}): EventStream {
    return new EventStream(this.transport, options.after);
  }

  // -- access control, limits, cluster ---------------------------------------------------------

  async createToken(
    name: string,
    role: routes.TokenRole,
    namespaces: string[],
    quotas?: routes.TokenQuotas,
  ): Promise<Schemas["CreatedToken"]> {
    return this.object(routes.createToken(name, role, namespaces, quotas));
  }

  async listTokens(): Promise<Schemas["TokenList"]> {
    return this.object(routes.listTokens());
  }

  async revokeToken(name: string): Promise<Schemas["RevokedToken"]> {
    return this.object(routes.revokeToken(name));
  }

  async limits(): Promise<Record<string, number>> {
    return this.object(routes.getLimits());
  }

  async setLimits(changes: Record<string, number>): Promise<Record<string, number>> {
    return this.object(routes.setLimits(changes));
  }

  async clusterStatus(): Promise<Schemas["ClusterStatus"]> {
    return this.object(routes.clusterStatus());
  }

  async addMember(id: number, apiAddr: string, peerAddr: string, voter?: boolean): Promise<Schemas["ClusterStatus"]> {
    return this.object(routes.addMember(id, apiAddr, peerAddr, voter));
  }

  async removeMember(id: number): Promise<Schemas["ClusterStatus"]> {
    return this.object(routes.removeMember(id));
  }

  // -- agent tools -----------------------------------------------------------------------------

  /**
   * Wraps an agent's tool so that it runs under a lease on the path its arguments name
   * (`resourceOf(args)`), renewed while it runs. A denial is the tool's result, as one line
   * (`denied: agent-b holds src/auth.rs for 38 s more`); so is every other way the claim can
   * fail (it fails closed: the tool does not run unless the claim was granted).
   */
  claims<A, R>(resourceOf: (args: A) => string, tool: Tool<A, R>, options: ClaimOptions = {}): ClaimedTool<A, R> {
    return (args: A) =>
      runClaimed(
        (resource) =>
          this.lease(resource, {
            ttlMs: options.ttlMs,
            mode: options.mode,
            waitMs: options.waitMs,
            reason: options.reason,
          }).acquire(),
        resourceOf,
        tool,
        args,
      );
  }
}

function fencedBy(options: FenceOptions): routes.Fenced {
  const { guard } = options;
  if (guard === undefined) return { fence: options.fence, sessionId: options.sessionId };
  guard.ensureValid();
  return { fence: { resource: guard.resource, token: guard.fence }, sessionId: guard.sessionId };
}

// ---------------------------------------------------------------------------------------------

/** A session that renews itself; leases and claims made on it share its deadline. */
export class Session {
  private readonly watch: Watch;

  /** @internal */
  constructor(
    private readonly client: BatonClient,
    /** @internal */ readonly state: SessionState,
    private readonly renewer: Renewer,
    onLost: LostCallback | undefined,
  ) {
    this.watch = new Watch("the session", onLost, undefined);
    state.addWatch(this.watch);
  }

  get id(): string {
    return this.state.id;
  }

  /** Aborted, with a `ClaimLost` as its reason, when the session is lost. */
  get signal(): AbortSignal {
    return this.watch.signal;
  }

  lostReason(): string | undefined {
    return this.state.lostReason();
  }

  isValid(): boolean {
    return this.lostReason() === undefined;
  }

  ensureValid(): void {
    const reason = this.lostReason();
    if (reason !== undefined) throw new ClaimLost(`the session is lost: ${reason}`);
  }

  /** A guard for a lease held by this session (not yet acquired). */
  lease(resource: string, options: Omit<LeaseOptions, "ttlMs"> = {}): LeaseGuard {
    return new LeaseGuard(this.client, this, resource, options);
  }

  async claim(queue: string, options: { waitMs?: number; onLost?: LostCallback } = {}): Promise<TaskClaim | undefined> {
    return this.client.claim(queue, { ...options, session: this });
  }

  /** Ends the session: everything it holds is released. `quiet` swallows a failure to say so. */
  async end(options: { quiet?: boolean } = {}): Promise<void> {
    this.watch.retired = true;
    this.state.markLost(ENDED);
    this.renewer.stop();
    try {
      await this.client.endSession(this.state.id);
    } catch (error) {
      if (error instanceof NotFound || error instanceof LeaseLost) return;
      if (options.quiet !== true) throw error;
    }
  }
}

/**
 * A lease and the right to act on it. `isValid()` follows G7 from `performance.now()` alone;
 * `signal` is aborted once, with a `ClaimLost`, when the lease is lost (renewals failed until
 * the deadline, the max hold was reached, or the server said the session is gone), before
 * the G7 deadline.
 */
export class LeaseGuard {
  private state: SessionState | undefined;
  private watch: Watch | undefined;
  private renewer: Renewer | undefined;
  private granted: Grant | undefined;
  private released = false;
  private readonly what: string;
  private readonly placeholder = new AbortController();

  /** @internal */
  constructor(
    private readonly client: BatonClient,
    private readonly session: Session | undefined,
    private readonly asked: string,
    private readonly options: LeaseOptions,
  ) {
    this.what = `the lease on ${asked}`;
  }

  /** Acquires the lease (waiting in its line with `waitMs`); throws `LeaseHeld` when refused. */
  async acquire(): Promise<this> {
    if (this.state !== undefined) throw new InvalidArgument("this guard is already acquired");
    const { session, options } = this;
    session?.ensureValid();
    const ttlMs = options.ttlMs ?? TTL_MS_DEFAULT;
    const body = routes.acquireBody(this.asked, {
      sessionId: session?.id,
      holder: session === undefined ? this.client.holder : undefined,
      ttlMs: session === undefined ? ttlMs : undefined,
      mode: options.mode,
      limit: options.limit,
      maxHoldMs: options.maxHoldMs,
      labels: options.labels,
      reason: options.reason,
    });
    let answer: Answer;
    try {
      answer = await this.client.acquireWaiting(body, options.waitMs);
    } catch (error) {
      if (error instanceof LeaseLost && session !== undefined) {
        session.state.markLost(`session ended (the server says: ${error.message})`);
      }
      throw error;
    }
    const what = "POST /v1/leases";
    const grant = expectObject(answer, what);
    const sessionId = require<string>(grant, "session_id", "string", what);
    require(grant, "fence", "integer", what);
    require(grant, "resource", "string", what);
    const expiresInMs = require<number>(grant, "expires_in_ms", "integer", what);
    const rate = this.client.transport.config.clockRateError;
    const maxHoldUntil = Number.isSafeInteger(grant.max_hold_ms)
      ? validUntil(answer.sentAt, grant.max_hold_ms as number, rate)
      : undefined;
    const watch = new Watch(this.what, options.onLost, maxHoldUntil);
    let state: SessionState;
    if (session !== undefined) {
      state = session.state;
      state.addWatch(watch);
      state.recordRenewal(answer.sentAt, expiresInMs);
    } else {
      state = new SessionState(sessionId, this.client.holder, ttlMs, validUntil(answer.sentAt, expiresInMs, rate), rate);
      state.addWatch(watch);
      this.renewer = new Renewer(this.client.transport, state);
    }
    this.granted = grant as Grant;
    this.state = state;
    this.watch = watch;
    return this;
  }

  private held(): { state: SessionState; watch: Watch; grant: Grant } {
    if (this.state === undefined || this.watch === undefined || this.granted === undefined) {
      throw new ClaimLost(`${this.what} is not held`);
    }
    return { state: this.state, watch: this.watch, grant: this.granted };
  }

  /** The raw grant (the lease object plus `session_id`). */
  get grant(): Grant {
    return { ...this.held().grant };
  }

  get fence(): number {
    return this.held().grant.fence;
  }

  get resource(): string {
    return this.held().grant.resource;
  }

  get mode(): routes.LeaseMode {
    return this.held().grant.mode;
  }

  get holder(): string {
    return this.held().grant.holder;
  }

  get sessionId(): string {
    return this.held().state.id;
  }

  /** Aborted, with a `ClaimLost` as its reason, when the lease is lost. */
  get signal(): AbortSignal {
    return this.watch?.signal ?? this.placeholder.signal;
  }

  /** The G7 deadline, in `performance.now()` ms (0 when not held). */
  get validUntil(): number {
    if (this.state === undefined || this.watch === undefined) return 0;
    const until = this.state.validUntil;
    return this.watch.maxHoldUntil === undefined ? until : Math.min(until, this.watch.maxHoldUntil);
  }

  /** Why the holder may no longer act (undefined while it may). */
  lostReason(): string | undefined {
    if (this.state === undefined || this.watch === undefined) return "not held";
    return this.state.watchReason(this.watch);
  }

  /** Whether the holder may still act (G7, from `performance.now()` alone). */
  isValid(): boolean {
    return this.lostReason() === undefined;
  }

  /** Throws `ClaimLost` unless `isValid()`. */
  ensureValid(): void {
    const { state, watch } = this.held();
    state.ensureValid(watch, this.what);
  }

  /** Resolves with the reason once the lease is lost, or undefined after `timeoutMs`. */
  async waitLost(timeoutMs: number): Promise<string | undefined> {
    return this.held().watch.waitLost(timeoutMs);
  }

  /**
   * Sends no more keepalives: the lease lapses at its deadline, and its loss is reported as
   * when renewals fail. For tests and demonstrations.
   */
  pauseRenewals(): void {
    if (this.renewer !== undefined) this.renewer.paused = true;
  }

  /** Releases the lease (ends its own session, or releases it from the shared session). */
  async release(): Promise<void> {
    if (this.released || this.state === undefined || this.watch === undefined) return;
    this.released = true;
    this.watch.retired = true;
    if (this.renewer !== undefined) {
      this.state.markLost(ENDED);
      this.renewer.stop();
      try {
        await this.client.endSession(this.state.id);
      } catch (error) {
        if (!(error instanceof NotFound || error instanceof LeaseLost)) throw error;
      }
      return;
    }
    if (this.state.lost !== undefined) return;
    try {
      await this.client.release(this.state.id, this.resource);
    } catch (error) {
      if (!(error instanceof LeaseLost)) throw error;
    }
  }
}

/** A claimed task: its fence, payload and validity; settle it with complete, fail or release. */
export class TaskClaim {
  readonly task: Task;
  private readonly watch: Watch;
  private settled = false;

  /** @internal */
  constructor(
    private readonly client: BatonClient,
    readonly queue: string,
    readonly claim: ClaimResponse,
    private readonly state: SessionState,
    private renewer: Renewer | undefined,
    onLost: LostCallback | undefined,
  ) {
    this.task = { ...claim.task };
    this.watch = new Watch(`the claim on task ${queue}/${claim.task.id}`, onLost, undefined);
    state.addWatch(this.watch);
  }

  get id(): string {
    return this.task.id;
  }

  get payload(): unknown {
    return this.task.payload;
  }

  get fence(): number {
    return this.claim.fence;
  }

  get attempt(): number {
    return this.claim.attempt;
  }

  get sessionId(): string {
    return this.state.id;
  }

  /** Aborted, with a `ClaimLost` as its reason, when the claim is lost. */
  get signal(): AbortSignal {
    return this.watch.signal;
  }

  lostReason(): string | undefined {
    return this.state.watchReason(this.watch);
  }

  isValid(): boolean {
    return this.lostReason() === undefined;
  }

  ensureValid(): void {
    this.state.ensureValid(this.watch, `the claim on task ${this.queue}/${this.id}`);
  }

  /** Turns the claim's own session into a `Session` that further claims can use. @internal */
  adoptSession(): Session {
    const renewer = this.renewer;
    if (renewer === undefined) throw new InvalidArgument("this claim lives on a session already");
    this.renewer = undefined;
    return new Session(this.client, this.state, renewer, undefined);
  }

  private async settle(c: Call): Promise<Task> {
    this.settled = true;
    this.watch.retired = true;
    try {
      return expectObject(await this.client.execute(c), `${c.method} ${c.route}`) as Task;
    } finally {
      await this.finish();
    }
  }

  private async finish(): Promise<void> {
    const renewer = this.renewer;
    if (renewer === undefined) return;
    this.renewer = undefined;
    this.state.markLost(ENDED);
    renewer.stop();
    await this.client.endSession(this.state.id).catch((error: unknown) => {
      if (!(error instanceof BatonError)) throw error;
    });
  }

  async complete(result?: unknown): Promise<Task> {
    return this.settle(routes.completeTask(this.queue, this.id, this.sessionId, this.fence, result));
  }

  async fail(reason: string, options: { retry?: boolean } = {}): Promise<Task> {
    return this.settle(routes.failTask(this.queue, this.id, this.sessionId, this.fence, reason, options.retry));
  }

  async release(note?: string): Promise<Task> {
    return this.settle(routes.releaseTask(this.queue, this.id, this.sessionId, this.fence, note));
  }

  /** Gives the task back unsettled (with a note) if it was not settled, and ends its own session. */
  async drop(): Promise<void> {
    if (!this.settled) {
      await this.release(DROPPED_NOTE).catch(() => undefined);
    }
    await this.finish();
  }
}
