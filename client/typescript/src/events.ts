/**
 * The event stream (docs/api.md, "Events"): server-sent events, resumed across nodes.
 *
 * A stream delivers every event of the namespace once, in revision order: after a lost
 * connection it reconnects (to the next endpoint when one is down) with `Last-Event-ID` set to
 * the last revision it delivered, and drops any event at or below it. It ends with an error
 * when the server says the revision is older than the kept window (`NOT_FOUND`) or another
 * definite refusal, or when no node took it back within the client's retry budget.
 */

import { backoff, isTlsFailure, now, parseProblem, queryString, sleep, unrefTimer, type Transport } from "./core.js";
import { BatonError, ProtocolError, TLSError, Unavailable, errorFromProblem, excerpt, isObject } from "./errors.js";
import type { components } from "./generated/openapi.js";

export type BatonEvent = components["schemas"]["Event"];

/** Longest silence (the server sends a comment now and then) before a stream is reopened. */
const STREAM_IDLE_MAX_MS = 40_000;

interface SseMessage {
  event: string;
  data: string;
  id: string | undefined;
}

/** The `text/event-stream` line parser. */
export class SseParser {
  private event: string | undefined;
  private data: string[] | undefined;
  private id: string | undefined;

  line(raw: string): SseMessage | undefined {
    const line = raw.endsWith("\r") ? raw.slice(0, -1) : raw;
    if (line === "") {
      const { data, event } = this;
      this.data = undefined;
      this.event = undefined;
      return data === undefined ? undefined : { event: event ?? "message", data: data.join("\n"), id: this.id };
    }
    if (line.startsWith(":")) return undefined; // a comment: the server's keep-alive
    const colon = line.indexOf(":");
    const name = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (name === "event") this.event = value;
    else if (name === "data") this.data = [...(this.data ?? []), value];
    else if (name === "id") this.id = value;
    return undefined;
  }
}

/** A stream error after which reopening elsewhere cannot help. */
function isFinal(error: BatonError): boolean {
  return ["NOT_FOUND", "INVALID_ARGUMENT", "UNAUTHENTICATED", "PERMISSION_DENIED"].includes(error.code);
}

/** `for await (const event of client.followEvents({ after }))`: every event once, in order. */
export class EventStream implements AsyncIterableIterator<BatonEvent> {
  /** The endpoint the stream currently reads from. */
  endpoint: string | undefined;
  private readonly startAfter: number | undefined;
  private delivered: number | undefined;
  private closed = false;
  private controller: AbortController | undefined;
  private reader: ReadableStreamDefaultReader<Uint8Array> | undefined;
  private buffer = "";
  private decoder = new TextDecoder();
  private parser = new SseParser();

  constructor(
    private readonly transport: Transport,
    after: number | undefined,
  ) {
    this.startAfter = after;
    this.delivered = after;
  }

  /** The revision of the last event delivered. */
  get lastRevision(): number | undefined {
    return this.delivered;
  }

  [Symbol.asyncIterator](): EventStream {
    return this;
  }

  async next(): Promise<IteratorResult<BatonEvent>> {
    let failingSince: number | undefined;
    let reconnects = 0;
    for (;;) {
      if (this.closed) return { done: true, value: undefined };
      if (this.reader === undefined) {
        const failure = await this.open();
        if (failure !== undefined) {
          const at = now();
          failingSince ??= at;
          const budget = this.transport.config.retryBudgetMs;
          if (at - failingSince >= budget) {
            this.close();
            throw new Unavailable(`the event stream could not be reopened within ${budget} ms; last failure: ${failure}`);
          }
          reconnects += 1;
          const retryAfter = failure.retryAfterMs;
          await sleep(retryAfter !== undefined ? Math.min(retryAfter, 2_000) : backoff(reconnects));
          continue;
        }
        failingSince = undefined;
        this.parser = new SseParser();
      }
      const line = await this.readLine();
      if (line === undefined) {
        this.drop();
        reconnects += 1;
        await sleep(backoff(reconnects));
        continue;
      }
      const message = this.parser.line(line);
      if (message === undefined) continue;
      let event: BatonEvent | undefined;
      try {
        event = this.accept(message);
      } catch (error) {
        this.drop();
        if (error instanceof BatonError && isFinal(error)) {
          this.close();
          throw error;
        }
        continue;
      }
      if (event !== undefined) return { done: false, value: event };
    }
  }

  async return(): Promise<IteratorResult<BatonEvent>> {
    this.close();
    return { done: true, value: undefined };
  }

  /** Stops the stream and closes its connection. */
  close(): void {
    this.closed = true;
    this.drop(false);
  }

  /** The event a message carries, if it is new; throws the error a stream ended with. */
  private accept(message: SseMessage): BatonEvent | undefined {
    if (message.event === "change" || message.event === "message") {
      let event: unknown;
      try {
        event = JSON.parse(message.data);
      } catch (error) {
        throw new ProtocolError(`an event does not parse: ${(error as Error).message}`);
      }
      if (!isObject(event) || !Number.isSafeInteger(event.revision)) {
        throw new ProtocolError(`an event without a revision: ${excerpt(message.data)}`);
      }
      const revision = event.revision as number;
      if (this.delivered !== undefined && revision <= this.delivered) return undefined; // seen before a reconnection
      this.delivered = revision;
      return event as BatonEvent;
    }
    if (message.event === "error") {
      let problem: unknown;
      try {
        problem = JSON.parse(message.data);
      } catch {
        throw new ProtocolError(`the stream ended with an error: ${excerpt(message.data)}`);
      }
      throw errorFromProblem(200, problem);
    }
    return undefined; // an event type this client does not know
  }

  /** Opens the stream on the preferred endpoint: undefined, or the failure to retry after. */
  private async open(): Promise<BatonError | undefined> {
    const transport = this.transport;
    const config = transport.config;
    const count = config.endpoints.length;
    const index = transport.routes.preferred % count;
    const base = config.endpoints[index]!.base;
    const rotate = (): void => {
      transport.routes.preferred = (index + 1) % count;
    };
    const extra: Record<string, string> = { Accept: "text/event-stream" };
    let path = "/v1/events";
    if (this.delivered !== undefined && this.delivered !== this.startAfter) {
      extra["Last-Event-ID"] = String(this.delivered);
    } else {
      path += queryString({ after: this.startAfter });
    }
    const controller = new AbortController();
    this.controller = controller;
    const timer = setTimeout(() => controller.abort(), config.timeoutMs);
    unrefTimer(timer);
    let response: Response;
    try {
      response = await config.fetch(base + path, {
        method: "GET",
        headers: transport.headers(extra),
        signal: controller.signal,
      });
    } catch (error) {
      clearTimeout(timer);
      if (this.closed) return undefined;
      if (isTlsFailure(error)) {
        this.close();
        throw new TLSError(`${base}: the TLS handshake failed: ${String((error as Error).cause ?? error)}`);
      }
      rotate();
      return new Unavailable(`${base}: ${String((error as Error).cause ?? error)}`);
    }
    clearTimeout(timer);
    if (response.status !== 200 || response.body === null) {
      let content = "";
      try {
        content = await response.text();
      } catch {
        // the connection dropped while reading the refusal: judged by the status alone
      }
      const problem = parseProblem(content);
      if (problem === undefined) {
        rotate();
        const malformed = new ProtocolError(`${base}: HTTP ${response.status} without a problem body`, {
          status: response.status,
        });
        if (response.status >= 400 && response.status < 500) {
          this.close();
          throw malformed;
        }
        return malformed;
      }
      const refusal = errorFromProblem(response.status, problem);
      if (isFinal(refusal)) {
        this.close();
        throw refusal;
      }
      rotate();
      return refusal;
    }
    this.reader = response.body.getReader();
    this.buffer = "";
    this.decoder = new TextDecoder();
    this.endpoint = base;
    return undefined;
  }

  /** The next line, or undefined when the connection ended, failed or stayed silent too long. */
  private async readLine(): Promise<string | undefined> {
    for (;;) {
      const newline = this.buffer.indexOf("\n");
      if (newline >= 0) {
        const line = this.buffer.slice(0, newline);
        this.buffer = this.buffer.slice(newline + 1);
        return line;
      }
      const reader = this.reader;
      const controller = this.controller;
      if (reader === undefined) return undefined;
      const idle = setTimeout(() => controller?.abort(), STREAM_IDLE_MAX_MS);
      unrefTimer(idle);
      try {
        const chunk = await reader.read();
        if (chunk.done) return undefined;
        this.buffer += this.decoder.decode(chunk.value, { stream: true });
      } catch {
        return undefined;
      } finally {
        clearTimeout(idle);
      }
    }
  }

  /** Drops the connection; the next read reopens it, on the next endpoint when `rotate`. */
  private drop(rotate = true): void {
    const controller = this.controller;
    this.controller = undefined;
    this.reader = undefined;
    controller?.abort();
    if (rotate) {
      const routes = this.transport.routes;
      routes.preferred = (routes.preferred + 1) % this.transport.config.endpoints.length;
    }
  }
}
