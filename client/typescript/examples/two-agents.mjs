// Two agents race for one file. The winner works under a lease guard and writes through its
// fence. The loser's tool call is denied, and the denial is the tool's result ("denied:
// agent-a holds src/auth.rs for 2 s more"). Then the winner is paused past its TTL (its
// renewals stop, as in a long GC pause): its guard reports the loss, and its late write is
// refused with STALE_FENCE. The loser's next tool call is granted and its write lands.
//
//     npm run build
//     BATON_ENDPOINTS=http://127.0.0.1:7420 node examples/two-agents.mjs

import { BatonClient, LeaseHeld, StaleFence } from "../dist/src/index.js";

const PATH = "src/auth.rs";
const KEY = "files/src/auth.rs";
const TTL_MS = 2_000;
const namespace = process.env.BATON_NAMESPACE || "two-agents";

let resolveHolding;
const holding = new Promise((resolve) => (resolveHolding = resolve));
let resolveLoserDone;
const loserDone = new Promise((resolve) => (resolveLoserDone = resolve));
let resolveWinnerStale;
const winnerStale = new Promise((resolve) => (resolveWinnerStale = resolve));
const log = { denial: undefined, winner: undefined, loser: undefined, lateWrite: undefined };

async function agent(name) {
  const client = new BatonClient({ namespace, holder: name, timeoutMs: 2_000 });
  const editFile = client.claims(
    (args) => args.path,
    async ({ path, text }) => {
      await client.kvPut(KEY, text);
      return `${name} wrote ${path}`;
    },
    { ttlMs: TTL_MS },
  );
  let guard;
  try {
    guard = await client.lease(PATH, { ttlMs: TTL_MS }).acquire();
  } catch (error) {
    if (!(error instanceof LeaseHeld)) throw error;
    // Lost the race: the model calls its tool and reads the denial.
    log.loser = name;
    await holding;
    const result = await editFile({ path: PATH, text: `${name}'s version` });
    console.log(`${name}: tool result: ${result}`);
    log.denial = result;
    resolveLoserDone();
    // Later, once the winner's lease has lapsed, the same call is granted.
    await winnerStale;
    console.log(`${name}: tool result: ${await editFile({ path: PATH, text: `${name}'s version` })}`);
    return;
  }
  log.winner = name;
  console.log(`${name}: holds ${PATH} with fence ${guard.fence}`);
  await client.kvPut(KEY, `${name}'s version`, { guard });
  console.log(`${name}: wrote ${KEY} through fence ${guard.fence}`);
  resolveHolding();
  await loserDone;
  // Paused past the TTL: no keepalive goes out.
  guard.pauseRenewals();
  const lost = await guard.waitLost(TTL_MS + 2_000);
  console.log(`${name}: guard reports: ${lost}`);
  await new Promise((resolve) => setTimeout(resolve, 500)); // the server's deadline passes too
  try {
    await client.kvPut(KEY, `${name}'s late write`, {
      fence: { resource: guard.resource, token: guard.fence },
      sessionId: guard.sessionId,
    });
    log.lateWrite = "applied";
  } catch (error) {
    if (!(error instanceof StaleFence)) throw error;
    console.log(`${name}: late write refused: ${error.code}`);
    log.lateWrite = error.code;
  }
  resolveWinnerStale();
  await guard.release();
}

await Promise.all([agent("agent-a"), agent("agent-b")]);
const final = (await new BatonClient({ namespace }).kvGet(KEY)).value;
console.log(`final value of ${KEY}: ${JSON.stringify(final)}`);
const ok =
  String(log.denial).startsWith(`denied: ${log.winner} holds ${PATH} for `) &&
  log.lateWrite === "STALE_FENCE" &&
  final === `${log.loser}'s version`;
process.exitCode = ok ? 0 : 1;
