// The README's JavaScript examples run, in order, as one module, against a test cluster (the
// package name resolved to this build, the endpoint to the cluster's); so does the repository
// README's example.

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { promisify } from "node:util";

import { PACKAGE, namespace, useCluster } from "./cluster.js";

const cluster = useCluster();

/** The `js` blocks of `readme`, relative to this package. */
function jsBlocks(readme: string): string[] {
  const text = readFileSync(join(PACKAGE, readme), "utf8");
  return [...text.matchAll(/```js\n([\s\S]*?)```/g)].map((m) => m[1]!);
}

/**
 * Runs `code` as one module in a fresh directory, the package name resolved to this build and
 * the endpoint to the cluster's; `check` sees its stdout and the directory.
 */
async function runModule(code: string, check: (stdout: string, dir: string) => void): Promise<void> {
  const entry = JSON.stringify(join(PACKAGE, "dist", "src", "index.js"));
  const module = code
    .replaceAll('from "@baton/client"', `from ${entry}`)
    .replaceAll('["http://127.0.0.1:7420"]', 'process.env.BATON_ENDPOINTS.split(",")');
  assert.notEqual(module, code, "the example names the package and the endpoint");
  const dir = mkdtempSync(join(tmpdir(), "baton-ts-readme-"));
  try {
    writeFileSync(join(dir, "readme.mjs"), module);
    const { stdout } = await promisify(execFile)(process.execPath, [join(dir, "readme.mjs")], {
      cwd: dir,
      env: { ...process.env, BATON_ENDPOINTS: cluster.endpoints.join(","), BATON_NAMESPACE: namespace() },
      timeout: 30_000,
    });
    check(stdout, dir);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

test("the README's examples run as written", async () => {
  const blocks = jsBlocks("README.md");
  assert.ok(blocks.length >= 4);
  await runModule(blocks.join("\n"), (stdout, dir) => {
    assert.match(stdout, /^fence \d+$/m);
    assert.match(stdout, /completed: 1, failed: 0, stopped: 'queue_empty'/);
    assert.match(stdout, /^wrote notes\.txt$/m);
    assert.equal(readFileSync(join(dir, "notes.txt"), "utf8"), "...");
  });
});

test("the repository README's example prints the tool's result, then agent-b's denial", async () => {
  const blocks = jsBlocks(join("..", "..", "README.md"));
  assert.equal(blocks.length, 1);
  await runModule(blocks[0]!, (stdout) => {
    const lines = stdout.trim().split("\n");
    assert.equal(lines[0], "edited src/auth.rs");
    assert.match(lines[1]!, /^denied: agent-b holds src\/auth\.rs for \d+ s more$/);
  });
});
