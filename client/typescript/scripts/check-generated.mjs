// Fails when src/generated/openapi.ts differs from a fresh generation from
// ../../docs/openapi.json (run `npm run generate` and commit the result).
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const checkedIn = join(root, "src", "generated", "openapi.ts");
const scratch = mkdtempSync(join(tmpdir(), "baton-ts-generated-"));
const fresh = join(scratch, "openapi.ts");
try {
  execFileSync(
    process.execPath,
    [
      join(root, "node_modules", "openapi-typescript", "bin", "cli.js"),
      join(root, "..", "..", "docs", "openapi.json"),
      "--output",
      fresh,
    ],
    { cwd: root, stdio: ["ignore", "ignore", "inherit"] },
  );
  if (readFileSync(fresh, "utf8") !== readFileSync(checkedIn, "utf8")) {
    console.error(
      "src/generated/openapi.ts is out of date with docs/openapi.json: run `npm run generate`",
    );
    process.exit(1);
  }
  console.log("src/generated/openapi.ts matches docs/openapi.json");
} finally {
  rmSync(scratch, { recursive: true, force: true });
}
