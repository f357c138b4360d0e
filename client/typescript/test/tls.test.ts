// TLS: a batond serving its client API over HTTPS with a certificate of a private CA (made
// with openssl). A client that does not trust the CA gets TLSError, and a claimed tool fails
// closed; a process started with NODE_EXTRA_CA_CERTS holds leases over https.

import assert from "node:assert/strict";
import { execFile, execFileSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, test } from "node:test";
import { promisify } from "node:util";

import { BatonClient, TLSError } from "../src/index.js";
import { PACKAGE, namespace, useDevNode } from "./cluster.js";

const certs = mkdtempSync(join(tmpdir(), "baton-ts-tls-"));
after(() => rmSync(certs, { recursive: true, force: true }));
const openssl = (...args: string[]): void => {
  execFileSync("openssl", args, { cwd: certs, stdio: "ignore" });
};
openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=baton-test-ca");
openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "key.pem", "-out", "leaf.csr", "-subj", "/CN=127.0.0.1");
writeFileSync(join(certs, "leaf.ext"), "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n");
openssl("x509", "-req", "-in", "leaf.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", "chain.pem", "-days", "1", "-extfile", "leaf.ext");
const node = useDevNode(["--tls-cert", join(certs, "chain.pem"), "--tls-key", join(certs, "key.pem")], {}, "https");

test("a client that does not trust the CA gets TLSError, and a claimed tool fails closed", async () => {
  const client = new BatonClient({ endpoints: [node.url], timeoutMs: 2_000, retryBudgetMs: 3_000 });
  const error = await client.kvGet("k").catch((e: unknown) => e);
  assert.ok(error instanceof TLSError, String(error));
  assert.match(error.message, /NODE_EXTRA_CA_CERTS/);
  let ran = false;
  const result = await client.claims((path: string) => path, () => {
    ran = true;
    return "ran";
  })("src/a.rs");
  assert.match(String(result), /^error: could not claim src\/a\.rs: TLS is misconfigured/);
  assert.equal(ran, false);
});

test("a process trusting the CA through NODE_EXTRA_CA_CERTS holds a lease over https", async () => {
  const script = `
import { BatonClient } from ${JSON.stringify(join(PACKAGE, "dist", "src", "index.js"))};
const client = new BatonClient({ holder: "agent-a" });
await client.withLease("tls/src/auth.rs", async (guard) => {
  await client.kvPut("tls/owner", "agent-a", { guard });
}, { ttlMs: 10000 });
console.log("value", (await client.kvGet("tls/owner")).value);
`;
  const { stdout } = await promisify(execFile)(process.execPath, ["--input-type=module", "-e", script], {
    env: { ...process.env, NODE_EXTRA_CA_CERTS: join(certs, "ca.pem"), BATON_ENDPOINTS: node.url, BATON_NAMESPACE: namespace() },
    timeout: 20_000,
  });
  assert.equal(stdout.trim(), "value agent-a");
});
