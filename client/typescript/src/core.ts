/**
 * Configuration, endpoint choice, path encoding, and the retry loop of one operation.
 *
 * The retry rules (docs/api.md "Any node answers" and "Error codes", docs/guarantees.md G8):
 *
 * - a mutation carries one `Idempotency-Key`, made once per operation and sent with every
 *   attempt of it, so a retry after an unknown outcome applies at most once;
 * - a request that surely did not reach a leader (connection refused, `NO_LEADER`,
 *   `RESOURCE_EXHAUSTED`) is sent again, to the next endpoint, after `retry_after_ms` or a
 *   jittered backoff;
 * - after a timeout, a dropped connection, `OUTCOME_UNKNOWN`, `INTERNAL` or a 5xx without a
 *   problem body, the request may have been applied: reads and keyed mutations are sent
 *   again; if the budget runs out the error has `isIndeterminate === true`;
 * - every other refusal settles the operation at once.
 */

import { hostname } from "node:os";

import {
  BatonError,
  INDETERMINATE_CODES,
  InvalidArgument,
  NoLeader,
  OutcomeUnknown,
  ProtocolError,
  RETRYABLE_CODES,
  ResourceExhausted,
  TLSError,
  Unavailable,
  errorFromProblem,
  excerpt,
  isObject,
} from "./errors.js";

export const REQUEST_TIMEOUT_MS_DEFAULT = 5_000;
export const RETRY_BUDGET_MS_DEFAULT = 15_000;
export const ATTEMPTS_MAX_DEFAULT = 8;
export const CLOCK_RATE_ERROR_DEFAULT = 0.01;
export const WAIT_MS_MAX = 60_000;
const BACKOFF_INITIAL_MS = 50;
const BACKOFF_MAX_MS = 1_000;
const RETRY_AFTER_MAX_MS = 2_000;
const LEARN_MEMBERS_INTERVAL_MS = 5_000;
const ATTEMPT_MIN_MS = 100;

export const HEADER_NAMESPACE = "Baton-Namespace";
export const HEADER_IDEMPOTENCY_KEY = "Idempotency-Key";
const HEADER_LEADER = "Baton-Leader";
const HEADER_CLUSTER_TIME = "Baton-Cluster-Time";
const HEADER_REPLAYED = "Idempotent-Replayed";

/** The monotonic clock every G7 deadline is kept in (milliseconds). */
export const now: () => number = () => performance.now();

/** A fresh key: a UUIDv4, the form docs/api.md intends. */
export function idempotencyKey(): string {
  return crypto.randomUUID();
}

/** Exponential backoff with jitter: 50 ms doubling to 1 s, times 0.5..1. */
export function backoff(attempt: number): number {
  const base = Math.min(BACKOFF_INITIAL_MS * 2 ** Math.min(Math.max(attempt - 1, 0), 16), BACKOFF_MAX_MS);
  return base * (0.5 + Math.random() * 0.5);
}

/** Makes a timer not keep the process alive (Node, Bun: `unref()`; Deno: `Deno.unrefTimer`). */
export function unrefTimer(timer: unknown): void {
  if (typeof timer === "object" && timer !== null && "unref" in timer) {
    (timer as { unref: () => void }).unref();
    return;
  }
  const deno = (globalThis as { Deno?: { unrefTimer?: (id: number) => void } }).Deno;
  if (typeof timer === "number" && deno?.unrefTimer !== undefined) deno.unrefTimer(timer);
}

/** Resolves after `ms`; an `unref`ed sleep does not keep the process alive. */
export function sleep(ms: number, unref = false): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, Math.max(0, ms));
    if (unref) unrefTimer(timer);
  });
}

function env(name: string): string | undefined {
  const process = (globalThis as { process?: { env?: Record<string, string | undefined> } }).process;
  const value = process?.env?.[name];
  return value === undefined || value.trim() === "" ? undefined : value;
}

export function defaultHolder(): string {
  const user = (env("USER") ?? env("LOGNAME") ?? "agent").trim();
  let host = "localhost";
  try {
    host = hostname() || host;
  } catch {
    // no host name on this runtime: keep localhost
  }
  return `${user}@${host}`;
}

// ---------------------------------------------------------------------------------------------
// Names and paths
// ---------------------------------------------------------------------------------------------

function encodeSegment(text: string): string {
  // encodeURIComponent leaves ! ' ( ) * unencoded; the server takes them either way.
  return encodeURIComponent(text);
}

/** One path parameter (a session id, queue, task id, token name): `/` is encoded. */
export function encodeName(name: string, what = "name"): string {
  if (typeof name !== "string" || name === "") {
    throw new InvalidArgument(`${what} must be a non-empty string, not ${JSON.stringify(name)}`);
  }
  if (name === "." || name === "..") {
    throw new InvalidArgument(`${JSON.stringify(name)} is not a ${what}: it may not be . or ..`);
  }
  return encodeSegment(name);
}

/**
 * A resource path or kv key: each segment percent-encoded, sent as it is. When a segment is
 * `.` or `..` the whole path is sent with `%2F` between segments, so that no URL library
 * collapses it; the server then judges the name (docs/api.md, "Names").
 */
export function encodePath(path: string, what = "path"): string {
  if (typeof path !== "string" || path === "") {
    throw new InvalidArgument(`${what} must be a non-empty string, not ${JSON.stringify(path)}`);
  }
  const segments = path.split("/");
  if (segments.some((segment) => segment === "." || segment === "..")) {
    return encodeSegment(path);
  }
  return segments.map(encodeSegment).join("/");
}

export function queryString(parameters: Record<string, string | number | undefined>): string {
  const parts: string[] = [];
  for (const [name, value] of Object.entries(parameters)) {
    if (value !== undefined) parts.push(`${name}=${encodeSegment(String(value))}`);
  }
  return parts.length > 0 ? `?${parts.join("&")}` : "";
}

// ---------------------------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------------------------

export interface Endpoint {
  /** `http://host:port` or `https://host:port`, no trailing slash. */
  base: string;
  /** `host:port`, as `GET /v1/cluster` lists `api_addr`. */
  authority: string;
}

export function parseEndpoint(text: string): Endpoint {
  const trimmed = text.trim().replace(/\/+$/, "");
  const base = trimmed.includes("://") ? trimmed : `http://${trimmed}`;
  const scheme = ["http://", "https://"].find((s) => base.startsWith(s));
  if (scheme === undefined) {
    throw new InvalidArgument(
      `endpoint ${JSON.stringify(text)}: only http://host:port and https://host:port are supported`,
    );
  }
  const authority = base.slice(scheme.length);
  if (authority === "" || authority.includes("/") || !authority.includes(":")) {
    throw new InvalidArgument(`endpoint ${JSON.stringify(text)} is not http://host:port or https://host:port`);
  }
  return { base, authority };
}

export type FetchLike = (input: string, init: RequestInit) => Promise<Response>;

export interface ClientOptions {
  /** Endpoints (or a comma-separated string); `BATON_ENDPOINTS`; default `http://127.0.0.1:7420`. */
  endpoints?: string[] | string;
  /** Sent as `Authorization: Bearer <token>`; `BATON_TOKEN`. */
  token?: string;
  /** The `Baton-Namespace` header; `BATON_NAMESPACE`; default `default`. */
  namespace?: string;
  /** Your public name, shown to others in denials; `BATON_HOLDER`; default `user@host`. */
  holder?: string;
  /** One attempt, in ms (default 5,000). */
  timeoutMs?: number;
  /** All attempts of one operation, in ms (default 15,000). */
  retryBudgetMs?: number;
  /** Attempts of one operation at most (default 8). */
  attemptsMax?: number;
  /** The clock rate error G7 allows for (default 0.01, the server's default). */
  clockRateError?: number;
  /** The `fetch` to send requests with (default: the global one). */
  fetch?: FetchLike;
}

export interface Config {
  endpoints: Endpoint[];
  token: string | undefined;
  namespace: string | undefined;
  holder: string;
  timeoutMs: number;
  retryBudgetMs: number;
  attemptsMax: number;
  clockRateError: number;
  fetch: FetchLike;
}

export function buildConfig(options: ClientOptions): Config {
  let endpoints = options.endpoints ?? env("BATON_ENDPOINTS") ?? ["http://127.0.0.1:7420"];
  if (typeof endpoints === "string") endpoints = endpoints.split(",");
  endpoints = endpoints.filter((part) => part.trim() !== "");
  if (endpoints.length === 0) throw new InvalidArgument("give at least one endpoint");
  const clockRateError = options.clockRateError ?? CLOCK_RATE_ERROR_DEFAULT;
  if (!(clockRateError >= 0 && clockRateError < 0.5)) {
    throw new InvalidArgument(`clockRateError must be in 0..0.5, not ${clockRateError}`);
  }
  const timeoutMs = options.timeoutMs ?? REQUEST_TIMEOUT_MS_DEFAULT;
  const retryBudgetMs = options.retryBudgetMs ?? RETRY_BUDGET_MS_DEFAULT;
  if (!(timeoutMs > 0) || !(retryBudgetMs > 0)) {
    throw new InvalidArgument("timeoutMs and retryBudgetMs must be positive");
  }
  const fetchImpl = options.fetch ?? (globalThis.fetch as FetchLike | undefined);
  if (fetchImpl === undefined) throw new InvalidArgument("no fetch: pass options.fetch");
  return {
    endpoints: endpoints.map(parseEndpoint),
    token: options.token ?? env("BATON_TOKEN"),
    namespace: options.namespace ?? env("BATON_NAMESPACE"),
    holder: options.holder ?? env("BATON_HOLDER") ?? defaultHolder(),
    timeoutMs,
    retryBudgetMs,
    attemptsMax: Math.max(1, Math.floor(options.attemptsMax ?? ATTEMPTS_MAX_DEFAULT)),
    clockRateError,
    fetch: fetchImpl,
  };
}

function baseHeaders(config: Config): Record<string, string> {
  const headers: Record<string, string> = { Accept: "application/json" };
  if (config.namespace !== undefined) headers[HEADER_NAMESPACE] = config.namespace;
  if (config.token !== undefined) headers.Authorization = `Bearer ${config.token}`;
  return headers;
}

// ---------------------------------------------------------------------------------------------
// One operation and its attempts
// ---------------------------------------------------------------------------------------------

export type Method = "GET" | "POST" | "PUT" | "DELETE";

/** One logical operation: the same method, path, body and key on every attempt. */
export interface Call {
  method: Method;
  /** The OpenAPI path template, e.g. `/v1/leases/{resource}`. */
  route: string;
  /** The encoded path with its query string. */
  path: string;
  /** The JSON body; `undefined` sends none. */
  body?: unknown;
  /** Set for mutations: one key for every attempt of the operation. */
  idempotencyKey?: string;
  /** Extra time the server may hold the request (`wait_ms`). */
  heldMs?: number;
  /** Per-attempt timeout instead of the client's. */
  timeoutMs?: number;
  /** Time for all attempts instead of the client's retry budget. */
  budgetMs?: number;
  /** Sent by a background renewal: its pauses do not keep the process alive. */
  background?: boolean;
}

export function call(
  method: Method,
  route: string,
  path: string,
  options: { body?: unknown; mutation?: boolean; heldMs?: number } = {},
): Call {
  const made: Call = { method, route, path };
  if (options.body !== undefined) made.body = options.body;
  if (options.mutation === true) made.idempotencyKey = idempotencyKey();
  if (options.heldMs !== undefined) made.heldMs = options.heldMs;
  return made;
}

/** A successful answer and what G7 and G8 need to know about it. */
export interface Answer {
  value: unknown;
  status: number;
  /** `performance.now()` when the operation's first attempt was sent (G7's t0). */
  sentAt: number;
  replayed: boolean;
  leader: number | undefined;
  clusterTimeMs: number | undefined;
}

interface Received {
  kind: "answer";
  status: number;
  headers: Headers;
  content: string;
}

/**
 * An attempt that got no answer. `sent` is false when the request surely never left (a
 * refused connection), true when it may have reached a server.
 */
interface TransportFailure {
  kind: "failure";
  message: string;
  sent: boolean;
  tls: boolean;
}

const NOT_SENT_CODES = new Set([
  "ECONNREFUSED",
  "ENOTFOUND",
  "EAI_AGAIN",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "EADDRNOTAVAIL",
  "UND_ERR_CONNECT_TIMEOUT",
]);

const TLS_CODES = new Set([
  "DEPTH_ZERO_SELF_SIGNED_CERT",
  "SELF_SIGNED_CERT_IN_CHAIN",
  "UNABLE_TO_VERIFY_LEAF_SIGNATURE",
  "UNABLE_TO_GET_ISSUER_CERT",
  "UNABLE_TO_GET_ISSUER_CERT_LOCALLY",
  "CERT_HAS_EXPIRED",
  "CERT_NOT_YET_VALID",
  "CERT_UNTRUSTED",
  "CERT_REJECTED",
  "HOSTNAME_MISMATCH",
]);

function errorChain(error: unknown): Array<Record<string, unknown>> {
  const chain: Array<Record<string, unknown>> = [];
  let current: unknown = error;
  while (typeof current === "object" && current !== null && chain.length < 8) {
    chain.push(current as Record<string, unknown>);
    current = (current as { cause?: unknown }).cause;
  }
  return chain;
}

export function isTlsFailure(error: unknown): boolean {
  return errorChain(error).some((link) => {
    const code = typeof link.code === "string" ? link.code : "";
    const message = typeof link.message === "string" ? link.message : "";
    return (
      TLS_CODES.has(code) ||
      code.startsWith("ERR_TLS_") ||
      code.startsWith("ERR_SSL_") ||
      /certificate|SSL routines|wrong version number/i.test(message)
    );
  });
}

function describe(error: unknown): string {
  const chain = errorChain(error);
  const last = chain[chain.length - 1];
  if (last === undefined) return String(error);
  const code = typeof last.code === "string" ? `${last.code}: ` : "";
  return `${code}${String(last.message ?? error)}`;
}

function transportFailure(error: unknown, timeoutMs: number, answered: boolean): TransportFailure {
  const name = (error as { name?: unknown } | null)?.name;
  if (name === "TimeoutError" || name === "AbortError") {
    return { kind: "failure", message: `no answer within ${Math.round(timeoutMs)} ms`, sent: true, tls: false };
  }
  if (isTlsFailure(error)) {
    return { kind: "failure", message: describe(error), sent: false, tls: true };
  }
  const codes = errorChain(error).map((link) => link.code);
  if (!answered && codes.some((code) => typeof code === "string" && NOT_SENT_CODES.has(code))) {
    return { kind: "failure", message: `cannot connect: ${describe(error)}`, sent: false, tls: false };
  }
  const when = answered ? "while reading the answer" : "after it was sent";
  return { kind: "failure", message: `the request failed ${when}: ${describe(error)}`, sent: true, tls: false };
}

function headerInt(headers: Headers, name: string): number | undefined {
  const value = headers.get(name);
  if (value === null || !/^\s*\d+\s*$/.test(value)) return undefined;
  return Number.parseInt(value, 10);
}

export function parseProblem(content: string): Record<string, unknown> | undefined {
  try {
    const value: unknown = JSON.parse(content);
    return isObject(value) && typeof value.code === "string" ? value : undefined;
  } catch {
    return undefined;
  }
}

/** What is known of the members (node id -> endpoint index), and which endpoint to try first. */
export class RouteState {
  preferred = 0;
  readonly leaders = new Map<number, number>();
  learnedAt: number | undefined;
}

/** Sends calls with the retry rules above. One per client; shared by its guards and streams. */
export class Transport {
  readonly routes = new RouteState();

  constructor(readonly config: Config) {}

  headers(extra: Record<string, string> = {}): Record<string, string> {
    return { ...baseHeaders(this.config), ...extra };
  }

  /** Sends one attempt of `call` to endpoint `index`. */
  private async attempt(c: Call, index: number, timeoutMs: number): Promise<Received | TransportFailure> {
    const endpoint = this.config.endpoints[index]!;
    const headers: Record<string, string> = this.headers();
    if (c.idempotencyKey !== undefined) headers[HEADER_IDEMPOTENCY_KEY] = c.idempotencyKey;
    const init: RequestInit = { method: c.method, headers, signal: AbortSignal.timeout(Math.max(1, Math.ceil(timeoutMs))), redirect: "manual" };
    if (c.body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(c.body);
    }
    let response: Response;
    try {
      response = await this.config.fetch(endpoint.base + c.path, init);
    } catch (error) {
      return transportFailure(error, timeoutMs, false);
    }
    try {
      const content = await response.text();
      return { kind: "answer", status: response.status, headers: response.headers, content };
    } catch (error) {
      return transportFailure(error, timeoutMs, true);
    }
  }

  /** The retry loop of one operation: the answer, or the error that settles it. */
  async execute(c: Call): Promise<Answer> {
    const config = this.config;
    const sentAt = now();
    const heldMs = c.heldMs ?? 0;
    const deadline = sentAt + (c.budgetMs ?? config.retryBudgetMs) + heldMs;
    const attemptTimeout = c.timeoutMs ?? config.timeoutMs;
    const mutation = c.idempotencyKey !== undefined;
    const count = config.endpoints.length;
    let index = this.routes.preferred % count;
    let maybeApplied = false;
    const failures: Array<[string, string]> = [];
    let last: BatonError | undefined;
    for (let attempt = 1; attempt <= config.attemptsMax; attempt += 1) {
      const left = deadline - now();
      // An attempt with almost no time left would only time out, and turn a refusal that
      // surely applied nothing into an unknown outcome: the budget is spent.
      if (left <= 0 || (attempt > 1 && left < ATTEMPT_MIN_MS)) break;
      const base = config.endpoints[index]!.base;
      const outcome = await this.attempt(c, index, Math.min(attemptTimeout + heldMs, left));
      let retryAfterMs: number | undefined;
      if (outcome.kind === "failure") {
        if (outcome.tls) {
          throw new TLSError(
            `${base}: the TLS handshake failed: ${outcome.message}; trust the cluster's CA ` +
              "(NODE_EXTRA_CA_CERTS, or a fetch of your own: see the README, \"TLS\")",
            { isIndeterminate: maybeApplied && mutation },
          );
        }
        failures.push([base, outcome.message]);
        if (outcome.sent) {
          maybeApplied = true;
          last = new OutcomeUnknown(outcome.message);
        } else {
          last = new Unavailable(outcome.message);
        }
      } else {
        const learned = this.learnLeader(outcome.headers);
        this.routes.preferred = learned ?? index;
        if (outcome.status >= 200 && outcome.status < 300) {
          const answer = settle(outcome, sentAt, mutation);
          if (learned === undefined && this.mayLearnMembers(outcome.headers)) {
            await this.learnMembers(index);
          }
          return answer;
        }
        const problem = parseProblem(outcome.content);
        if (problem !== undefined) {
          const error = errorFromProblem(outcome.status, problem);
          const code = problem.code as string;
          if (INDETERMINATE_CODES.has(code)) {
            maybeApplied = true;
          } else if (RETRYABLE_CODES.has(code)) {
            retryAfterMs = error.retryAfterMs;
            if (retryAfterMs === undefined) {
              const header = headerInt(outcome.headers, "Retry-After");
              if (header !== undefined) retryAfterMs = header * 1000;
            }
          } else {
            throw error;
          }
          failures.push([base, error.toString()]);
          last = error;
        } else if (outcome.status >= 500 || outcome.status < 400) {
          maybeApplied = true;
          const message = `HTTP ${outcome.status} without a problem body: ${excerpt(outcome.content)}`;
          failures.push([base, message]);
          last = new ProtocolError(message, { status: outcome.status, isIndeterminate: true });
        } else {
          throw new ProtocolError(
            `${base}: HTTP ${outcome.status} without a problem body: ${excerpt(outcome.content)}`,
            { status: outcome.status, isIndeterminate: false },
          );
        }
      }
      index = (index + 1) % count;
      this.routes.preferred = index;
      if (attempt < config.attemptsMax) {
        let pause = retryAfterMs !== undefined ? Math.min(retryAfterMs, RETRY_AFTER_MAX_MS) : backoff(attempt);
        pause = Math.min(pause, Math.max(0, deadline - now()));
        if (pause > 0) await sleep(pause, c.background === true);
      }
    }
    throw finalError(mutation, failures, last, maybeApplied);
  }

  private learnLeader(headers: Headers): number | undefined {
    const leader = headerInt(headers, HEADER_LEADER);
    return leader === undefined ? undefined : this.routes.leaders.get(leader);
  }

  private mayLearnMembers(headers: Headers): boolean {
    if (this.config.endpoints.length < 2 || headerInt(headers, HEADER_LEADER) === undefined) return false;
    const at = now();
    if (this.routes.learnedAt !== undefined && at - this.routes.learnedAt < LEARN_MEMBERS_INTERVAL_MS) {
      return false;
    }
    this.routes.learnedAt = at;
    return true;
  }

  /** Maps node ids to endpoints from `GET /v1/cluster`, so `Baton-Leader` can be followed. */
  private async learnMembers(index: number): Promise<void> {
    const members = await this.attempt(call("GET", "/v1/cluster", "/v1/cluster"), index, this.config.timeoutMs);
    if (members.kind !== "answer" || members.status !== 200) return;
    let status: unknown;
    try {
      status = JSON.parse(members.content);
    } catch {
      return;
    }
    if (!isObject(status) || !Array.isArray(status.members)) return;
    for (const member of status.members) {
      if (!isObject(member) || !Number.isSafeInteger(member.id)) continue;
      const position = this.config.endpoints.findIndex((e) => e.authority === member.api_addr);
      if (position >= 0) this.routes.leaders.set(member.id as number, position);
    }
  }
}

/** The answer, or a `ProtocolError` (of unknown outcome for a mutation: reads never are). */
function settle(received: Received, sentAt: number, mutation: boolean): Answer {
  let value: unknown = undefined;
  if (received.content.trim() !== "") {
    try {
      value = JSON.parse(received.content);
    } catch (error) {
      throw new ProtocolError(
        `HTTP ${received.status}: the answer is not JSON (${(error as Error).message}): ${excerpt(received.content)}`,
        { status: received.status, isIndeterminate: mutation },
      );
    }
  }
  return {
    value,
    status: received.status,
    sentAt,
    replayed: (received.headers.get(HEADER_REPLAYED) ?? "").trim().toLowerCase() === "true",
    leader: headerInt(received.headers, HEADER_LEADER),
    clusterTimeMs: headerInt(received.headers, HEADER_CLUSTER_TIME),
  };
}

function finalError(
  mutation: boolean,
  failures: Array<[string, string]>,
  last: BatonError | undefined,
  maybeApplied: boolean,
): BatonError {
  const summary = summarize(failures);
  const unknown = mutation && (maybeApplied || (last?.isIndeterminate ?? false));
  if (last instanceof ProtocolError) {
    return new ProtocolError(`${last.message} (${summary})`, {
      status: last.status,
      isIndeterminate: unknown,
    });
  }
  const options = { status: last?.status, problem: last?.problem };
  if (unknown) return new OutcomeUnknown(`the outcome is unknown: ${summary}`, options);
  if (last instanceof NoLeader) return new NoLeader(`no endpoint could take the request (${summary})`, options);
  if (last instanceof ResourceExhausted) {
    return new ResourceExhausted(`no endpoint could take the request (${summary})`, options);
  }
  return new Unavailable(`no endpoint could take the request (${summary})`);
}

function summarize(failures: Array<[string, string]>): string {
  if (failures.length === 0) return "the retry budget was spent before any attempt";
  const last = new Map<string, string>();
  for (const [endpoint, message] of failures) last.set(endpoint, message);
  const details = [...last].map(([endpoint, message]) => `${endpoint}: ${message}`).join("; ");
  return `${failures.length} attempt(s); ${details}`;
}

/** The answer's body as an object, or a `ProtocolError`. */
export function expectObject(answer: Answer, what: string): Record<string, unknown> {
  if (!isObject(answer.value)) {
    throw new ProtocolError(`${what}: the answer is not a JSON object: ${excerpt(answer.value)}`, {
      status: answer.status,
    });
  }
  return answer.value;
}

type Kind = "string" | "integer" | "object" | "array" | "boolean";

function isKind(value: unknown, kind: Kind): boolean {
  switch (kind) {
    case "integer":
      return Number.isSafeInteger(value);
    case "object":
      return isObject(value);
    case "array":
      return Array.isArray(value);
    default:
      return typeof value === kind;
  }
}

/** A field the API promises, or a `ProtocolError` naming it. */
export function require<T>(obj: Record<string, unknown>, name: string, kind: Kind, what: string): T {
  const value = obj[name];
  if (!isKind(value, kind)) {
    throw new ProtocolError(`${what}: the answer has no valid ${JSON.stringify(name)}: ${excerpt(obj)}`);
  }
  return value as T;
}
