#!/usr/bin/env node
// An independent load driver for the renewal table of docs/performance.md: Node's own HTTP
// client (node:http, keep-alive agents), none of Baton's code. It creates SESSIONS sessions
// spread over the endpoints, renews each once per PERIOD, spread evenly, for SECONDS, and beside
// them a probe acquires and releases a lease in a loop on a connection of its own. A renewal's
// latency runs from the moment it was due to the end of its answer, so a driver that falls
// behind shows it. The first PERIOD, which opens the connections, is a warm-up and not counted
// (the project's bench opens them before measuring too). Prints one JSON object.
//
//   node jepsen/scripts/sessions-driver.mjs --endpoints http://127.0.0.1:7431,... \
//     [--sessions 10000] [--period 3] [--seconds 20] [--max-sockets 512] [--leader-only]
//
// --max-sockets bounds the connections per endpoint (the Go driver of issue 29 used 512);
// --leader-only sends every renewal to the endpoint that answers `Baton-Leader` as itself.
import http from "node:http";
import { performance } from "node:perf_hooks";

const options = {
  endpoints: "",
  sessions: 10000,
  period: 3,
  seconds: 20,
  "max-sockets": 512,
  "leader-only": false,
};
const args = process.argv.slice(2);
for (let i = 0; i < args.length; i++) {
  const name = args[i].replace(/^--/, "");
  if (!(name in options)) {
    console.error(`unknown flag ${args[i]}`);
    process.exit(2);
  }
  if (typeof options[name] === "boolean") {
    options[name] = true;
  } else {
    const value = args[++i];
    options[name] = typeof options[name] === "number" ? Number(value) : value;
  }
}
let endpoints = options.endpoints.split(",").filter(Boolean);
if (endpoints.length === 0) {
  console.error("give --endpoints http://HOST:PORT,...");
  process.exit(2);
}

const agents = new Map();
function agentFor(endpoint) {
  if (!agents.has(endpoint)) {
    agents.set(endpoint, new http.Agent({ keepAlive: true, maxSockets: options["max-sockets"] }));
  }
  return agents.get(endpoint);
}
const probeAgent = new http.Agent({ keepAlive: true, maxSockets: 1 });

// One request; resolves with {status, headers, body} or rejects on a transport error.
function request(endpoint, method, path, body, agent = agentFor(endpoint)) {
  return new Promise((resolve, reject) => {
    const payload = body === undefined ? undefined : JSON.stringify(body);
    const req = http.request(
      `${endpoint}${path}`,
      {
        method,
        agent,
        headers: payload === undefined ? {} : { "content-type": "application/json", "content-length": Buffer.byteLength(payload) },
        timeout: 10000,
      },
      (res) => {
        const chunks = [];
        res.on("data", (chunk) => chunks.push(chunk));
        res.on("end", () => resolve({ status: res.statusCode, headers: res.headers, body: Buffer.concat(chunks).toString() }));
        res.on("error", reject);
      },
    );
    req.on("timeout", () => req.destroy(new Error("timed out")));
    req.on("error", reject);
    req.end(payload);
  });
}

function percentile(sorted, q) {
  if (sorted.length === 0) return 0;
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))];
}

async function leaderEndpoint() {
  for (const endpoint of endpoints) {
    const status = JSON.parse((await request(endpoint, "GET", "/v1/cluster")).body);
    if (status.leader_id !== null && status.leader_id === status.node_id) return endpoint;
  }
  throw new Error("no endpoint says it leads");
}

async function createSessions() {
  const sessions = new Array(options.sessions);
  let next = 0;
  async function worker() {
    while (next < options.sessions) {
      const index = next++;
      const endpoint = endpoints[index % endpoints.length];
      const answer = await request(endpoint, "POST", "/v1/sessions", {
        holder: `driver-${process.pid}-${index}`,
        ttl_ms: 30000,
      });
      if (answer.status !== 201) throw new Error(`create session: ${answer.status} ${answer.body}`);
      sessions[index] = { endpoint, id: JSON.parse(answer.body).session_id };
    }
  }
  await Promise.all(Array.from({ length: 64 }, worker));
  return sessions;
}

// Acquires and releases `bench/driver-probe/N` until `deadline`; the acquires' latencies.
async function probe(endpoint, deadline) {
  const latencies = [];
  let errors = 0;
  for (let n = 0; performance.now() < deadline; n++) {
    const started = performance.now();
    try {
      const acquired = await request(endpoint, "POST", "/v1/leases", {
        resource: `bench/driver-probe/${process.pid}/${n}`,
        holder: "driver-probe",
        ttl_ms: 30000,
      }, probeAgent);
      latencies.push(performance.now() - started);
      if (acquired.status !== 201) {
        errors++;
        continue;
      }
      const session = JSON.parse(acquired.body).session_id;
      const ended = await request(endpoint, "DELETE", `/v1/sessions/${session}`, undefined, probeAgent);
      if (ended.status >= 300) errors++;
    } catch {
      errors++;
    }
  }
  return { latencies, errors };
}

async function main() {
  if (options["leader-only"]) endpoints = [await leaderEndpoint()];
  const sessions = await createSessions();
  const periodMs = options.period * 1000;
  const latencies = [];
  let errors = 0;
  let inFlight = 0;
  const start = performance.now() + 200;
  const measured = start + periodMs;
  const end = measured + options.seconds * 1000;
  let probing;
  // Renewal k of session i is due at start + (i / sessions + k) * period.
  const renew = (session, due) => {
    inFlight++;
    request(session.endpoint, "POST", `/v1/sessions/${session.id}/keepalive`)
      .then((answer) => {
        if (due < measured) return;
        if (answer.status === 200) latencies.push(performance.now() - due);
        else errors++;
      })
      .catch(() => {
        if (due >= measured) errors++;
      })
      .finally(() => inFlight--);
  };
  let sent = 0;
  const total = Math.floor(((options.seconds * 1000 + periodMs) * options.sessions) / periodMs);
  await new Promise((resolve) => {
    const tick = () => {
      const now = performance.now();
      if (probing === undefined && now >= measured) probing = probe(endpoints[0], end);
      while (sent < total) {
        const index = sent % options.sessions;
        const due = start + (index / options.sessions + Math.floor(sent / options.sessions)) * periodMs;
        if (due > now) break;
        renew(sessions[index], due);
        sent++;
      }
      if (sent >= total) resolve();
      else setTimeout(tick, 1);
    };
    tick();
  });
  while (inFlight > 0) await new Promise((resolve) => setTimeout(resolve, 10));
  const probed = await probing;
  latencies.sort((a, b) => a - b);
  probed.latencies.sort((a, b) => a - b);
  const round = (ms) => Math.round(ms * 100) / 100;
  console.log(JSON.stringify({
    driver: `node ${process.version} node:http`,
    endpoints,
    sessions: options.sessions,
    period_s: options.period,
    seconds: options.seconds,
    max_sockets_per_endpoint: options["max-sockets"],
    keepalives: latencies.length,
    errors,
    keepalive_p50_ms: round(percentile(latencies, 0.5)),
    keepalive_p99_ms: round(percentile(latencies, 0.99)),
    keepalive_max_ms: round(latencies.at(-1) ?? 0),
    probe_acquire_p99_ms: round(percentile(probed.latencies, 0.99)),
    probe_cycles: probed.latencies.length,
    probe_errors: probed.errors,
  }));
  for (const agent of [...agents.values(), probeAgent]) agent.destroy();
}

main().catch((error) => {
  console.error(`sessions-driver: ${error.stack ?? error}`);
  process.exit(1);
});
