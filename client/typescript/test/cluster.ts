/**
 * A real Baton cluster for the tests: three `batond run` processes (the binary at $BATOND),
 * each with its own ports and data dir in a temp dir, killed by pid when the test file ends.
 *
 * Every request any test client sends is recorded (through the client's `fetch` option) and
 * checked against docs/openapi.json when the test file ends (see openapi-check.ts).
 */

import { spawn, type ChildProcess } from "node:child_process";
import { randomUUID } from "node:crypto";
import { closeSync, existsSync, mkdirSync, mkdtempSync, openSync, readFileSync, rmSync, statSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { after, before } from "node:test";
import { fileURLToPath } from "node:url";

import { BatonClient, type ClientOptions, type FetchLike } from "../src/index.js";
import { checkRequest } from "./openapi-check.js";

/** client/typescript, whether running from test/ or dist/test/. */
export const PACKAGE = (() => {
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, "package.json"))) dir = dirname(dir);
  return dir;
})();
export const REPO = join(PACKAGE, "..", "..");

export function batondPath(): string {
  const path = process.env.BATOND;
  if (path === undefined || path === "") throw new Error("BATOND is not set: point it at a batond binary");
  if (!existsSync(path) || !statSync(path).isFile()) throw new Error(`BATOND=${path} is not a file`);
  return path;
}

export async function freePorts(count: number): Promise<number[]> {
  const servers = await Promise.all(
    Array.from({ length: count }, () =>
      new Promise<import("node:net").Server>((resolve, reject) => {
        const server = createServer();
        server.once("error", reject);
        server.listen(0, "127.0.0.1", () => resolve(server));
      }),
    ),
  );
  const ports = servers.map((s) => (s.address() as import("node:net").AddressInfo).port);
  await Promise.all(servers.map((s) => new Promise((resolve) => s.close(resolve))));
  return ports;
}

export const delay = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

/** A process this test run started, killed by its own pid only. */
export class Started {
  private exited: Promise<void>;

  constructor(readonly child: ChildProcess) {
    this.exited = new Promise((resolve) => {
      if (child.exitCode !== null || child.signalCode !== null) resolve();
      else child.once("exit", () => resolve());
    });
  }

  alive(): boolean {
    return this.child.exitCode === null && this.child.signalCode === null;
  }

  async kill(): Promise<void> {
    if (this.alive() && this.child.pid !== undefined) process.kill(this.child.pid, "SIGKILL");
    await this.exited;
  }
}

export class Node {
  process: Started | undefined;

  constructor(
    readonly id: number,
    readonly api: number,
    readonly peer: number,
    readonly dataDir: string,
    readonly log: string,
  ) {}

  get url(): string {
    return `http://127.0.0.1:${this.api}`;
  }

  alive(): boolean {
    return this.process?.alive() ?? false;
  }

  async kill(): Promise<void> {
    await this.process?.kill();
  }

  logTail(): string {
    return existsSync(this.log) ? readFileSync(this.log, "utf8").slice(-2000) : "";
  }
}

export async function isReady(url: string): Promise<boolean> {
  try {
    const response = await fetch(`${url}/readyz`, { signal: AbortSignal.timeout(1000) });
    await response.arrayBuffer();
    return response.status === 200;
  } catch {
    return false;
  }
}

export class Cluster {
  readonly root: string;
  nodes: Node[] = [];

  constructor(
    readonly binary: string,
    readonly extra: string[] = [],
  ) {
    this.root = mkdtempSync(join(tmpdir(), "baton-ts-"));
  }

  async start(size = 3): Promise<void> {
    const ports = await freePorts(2 * size);
    this.nodes = Array.from(
      { length: size },
      (_, i) => new Node(i + 1, ports[2 * i]!, ports[2 * i + 1]!, join(this.root, `n${i + 1}`), join(this.root, `n${i + 1}.log`)),
    );
    for (const node of this.nodes) this.spawn(node);
    await this.waitReady(this.nodes, 30_000);
  }

  /** Starts `node`'s process (again: its data dir is kept, so it rejoins). */
  spawn(node: Node): void {
    const initial = this.nodes.map((n) => `${n.id}=127.0.0.1:${n.api}@127.0.0.1:${n.peer}`).join(",");
    mkdirSync(node.dataDir, { recursive: true });
    const log = openSync(node.log, "a");
    const argv = [
      "run", "--id", String(node.id), "--data-dir", node.dataDir,
      "--listen", `127.0.0.1:${node.api}`, "--peer-listen", `127.0.0.1:${node.peer}`,
      "--initial-cluster", initial, ...this.extra,
    ];
    const child = spawn(this.binary, argv, {
      stdio: ["ignore", log, log],
      env: { ...process.env, RUST_LOG: "warn" },
    });
    closeSync(log);
    node.process = new Started(child);
  }

  async waitReady(nodes: Node[], timeoutMs: number): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    const pending = new Set(nodes);
    while (pending.size > 0) {
      if (Date.now() > deadline) {
        throw new Error(`nodes ${[...pending].map((n) => n.id)} not ready:\n${[...pending].map((n) => n.logTail()).join("\n")}`);
      }
      for (const node of [...pending]) {
        if (!node.alive()) throw new Error(`node ${node.id} exited:\n${node.logTail()}`);
        if (await isReady(node.url)) pending.delete(node);
      }
      await delay(50);
    }
  }

  get endpoints(): string[] {
    return this.nodes.map((n) => n.url);
  }

  async leader(timeoutMs = 10_000): Promise<Node> {
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      for (const node of this.nodes.filter((n) => n.alive())) {
        try {
          const response = await fetch(`${node.url}/v1/cluster`, { signal: AbortSignal.timeout(1000) });
          const status = (await response.json()) as { leader_id: number | null };
          const leader = this.nodes.find((n) => n.id === status.leader_id && n.alive());
          if (leader !== undefined) return leader;
        } catch {
          // this node is down or busy: ask the next
        }
      }
      await delay(50);
    }
    throw new Error("no leader");
  }

  async stop(): Promise<void> {
    await Promise.all(this.nodes.map((n) => n.kill()));
    rmSync(this.root, { recursive: true, force: true });
  }
}

/**
 * A cluster for this test file: started before its first test, stopped (its processes killed)
 * after its last one, also when a test fails. Call at the top level of the file.
 */
export function useCluster(extra: string[] = []): Cluster {
  const cluster = new Cluster(batondPath(), extra);
  before(() => cluster.start());
  after(() => cluster.stop());
  return cluster;
}

// ---------------------------------------------------------------------------------------------
// Recording every request, checked against docs/openapi.json
// ---------------------------------------------------------------------------------------------

export interface Recorded {
  method: string;
  path: string;
  body: unknown;
}

export const RECORDED: Recorded[] = [];

/** A fetch that records each request (method, path with query, JSON body) before sending it. */
export const recordingFetch: FetchLike = (input, init) => {
  const url = new URL(input);
  const body = typeof init.body === "string" && init.body !== "" ? (JSON.parse(init.body) as unknown) : undefined;
  RECORDED.push({ method: init.method ?? "GET", path: url.pathname + url.search, body });
  return fetch(input, init);
};

after(() => {
  const problems = [...new Set(RECORDED.flatMap((r) => checkRequest(r.method, r.path, r.body)))].sort();
  if (problems.length > 0) {
    throw new Error(`requests docs/openapi.json does not have:\n${problems.join("\n")}`);
  }
});

/** No test may leave a promise rejected with nobody to handle it (a renewal timer's, say). */
const UNHANDLED: unknown[] = [];
process.on("unhandledRejection", (reason) => UNHANDLED.push(reason));
after(() => {
  if (UNHANDLED.length > 0) throw new Error(`unhandled rejections: ${UNHANDLED.map(String).join("; ")}`);
});

/**
 * A lone `batond dev` node with extra flags and environment, for this test file (started
 * before its first test, killed after its last). Call at the top level of the file.
 */
export function useDevNode(extra: string[], env: Record<string, string> = {}, scheme = "http"): { url: string } {
  const node = { url: "" };
  const root = mkdtempSync(join(tmpdir(), "baton-ts-dev-"));
  let started: Started | undefined;
  before(async () => {
    const [api, peer] = await freePorts(2);
    node.url = `${scheme}://127.0.0.1:${api}`;
    const log = openSync(join(root, "log"), "a");
    const child = spawn(
      batondPath(),
      ["dev", "--listen", `127.0.0.1:${api}`, "--peer-listen", `127.0.0.1:${peer}`, "--data-dir", join(root, "data"), ...extra],
      { stdio: ["ignore", log, log], env: { ...process.env, RUST_LOG: "warn", ...env } },
    );
    closeSync(log);
    started = new Started(child);
    const deadline = Date.now() + 20_000;
    const probe = `http://127.0.0.1:${api}`;
    for (;;) {
      if (!started.alive()) throw new Error(`batond dev exited: ${readFileSync(join(root, "log"), "utf8")}`);
      if (scheme === "http" ? await isReady(probe) : await isListening(api)) break;
      if (Date.now() > deadline) throw new Error("batond dev never got ready");
      await delay(50);
    }
  });
  after(async () => {
    await started?.kill();
    rmSync(root, { recursive: true, force: true });
  });
  return node;
}

async function isListening(port: number): Promise<boolean> {
  const { connect } = await import("node:net");
  return new Promise((resolve) => {
    const socket = connect(port, "127.0.0.1");
    socket.once("connect", () => {
      socket.destroy();
      resolve(true);
    });
    socket.once("error", () => resolve(false));
  });
}

export function namespace(): string {
  return `t-${randomUUID().slice(0, 12)}`;
}

/** A client on `cluster` in its own namespace, recording its requests. */
export function makeClient(cluster: Cluster | string[], options: ClientOptions = {}): BatonClient {
  return new BatonClient({
    endpoints: Array.isArray(cluster) ? cluster : cluster.endpoints,
    timeoutMs: 3_000,
    retryBudgetMs: 10_000,
    fetch: recordingFetch,
    ...options,
  });
}
