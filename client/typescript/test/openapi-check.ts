/**
 * What in a request docs/openapi.json does not have: its route (method and path template),
 * a query parameter, or a body field (checked against the route's request schema, through
 * `$ref`s, `oneOf`s and `op`-tagged unions).
 */

import { existsSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

type Schema = Record<string, unknown>;
type Operation = {
  parameters?: Array<{ name: string; in: string }>;
  requestBody?: { content?: Record<string, { schema?: Schema }> };
};

const documentPath = (() => {
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, "package.json"))) dir = dirname(dir);
  return join(dir, "..", "..", "docs", "openapi.json"); // client/typescript -> the repository
})();

export const OPENAPI = JSON.parse(readFileSync(documentPath, "utf8")) as {
  paths: Record<string, Record<string, Operation>>;
  components: { schemas: Record<string, Schema> };
};

/** `{key}` and `{resource}` take several segments (`{key...}` in docs/api.md). */
const MULTI_SEGMENT = new Set(["key", "resource"]);
const METHODS = ["get", "put", "post", "delete", "head", "patch"];

function templateRegex(template: string): RegExp {
  const pattern = template
    .split(/(\{[^}]+\})/)
    .map((part) => {
      if (!part.startsWith("{")) return part.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
      return MULTI_SEGMENT.has(part.slice(1, -1)) ? ".+" : "[^/]+";
    })
    .join("");
  return new RegExp(`^${pattern}$`);
}

export const ROUTES = Object.entries(OPENAPI.paths).flatMap(([template, item]) =>
  Object.entries(item)
    .filter(([method]) => METHODS.includes(method))
    .map(([method, operation]) => ({ method: method.toUpperCase(), template, regex: templateRegex(template), operation })),
);

function resolve(schema: Schema): Schema {
  let current = schema;
  while (typeof current.$ref === "string") {
    const name = current.$ref.split("/").pop()!;
    current = OPENAPI.components.schemas[name]!;
  }
  return current;
}

function isPlainObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function checkValue(value: unknown, raw: Schema, where: string, problems: string[]): void {
  const schema = resolve(raw);
  if (Object.keys(schema).length === 0) return; // any JSON (a kv value, a payload, a result)
  const variantsRaw = (schema.oneOf ?? schema.anyOf) as Schema[] | undefined;
  if (variantsRaw !== undefined) {
    if (value === null) return;
    let variants = variantsRaw.map(resolve).filter((v) => v.type !== "null");
    const tagged = (v: Schema): boolean => isPlainObject(v.properties) && "op" in v.properties;
    if (isPlainObject(value) && variants.length > 0 && variants.every(tagged)) {
      variants = variants.filter((v) => {
        const op = (v.properties as Record<string, Schema>).op!;
        return Array.isArray(op.enum) && op.enum.includes(value.op);
      });
      if (variants.length === 0) {
        problems.push(`${where}: op ${JSON.stringify(value.op)} is not documented`);
        return;
      }
    }
    const candidates: string[][] = [];
    for (const variant of variants) {
      const found: string[] = [];
      checkValue(value, variant, where, found);
      if (found.length === 0) return;
      candidates.push(found);
    }
    problems.push(...(candidates[0] ?? [`${where}: matches no variant`]));
    return;
  }
  const type = schema.type;
  const types = Array.isArray(type) ? type : [type];
  if (types.includes("array")) {
    if (Array.isArray(value)) {
      value.forEach((item, i) => checkValue(item, (schema.items as Schema) ?? {}, `${where}[${i}]`, problems));
    }
    return;
  }
  if (isPlainObject(value) && (schema.properties !== undefined || types.includes("object"))) {
    const properties = schema.properties as Record<string, Schema> | undefined;
    if (properties === undefined) {
      const additional = schema.additionalProperties;
      if (additional === false) {
        problems.push(...Object.keys(value).map((name) => `${where}.${name}: not documented`));
      } else if (isPlainObject(additional)) {
        for (const [name, item] of Object.entries(value)) checkValue(item, additional, `${where}.${name}`, problems);
      }
      return;
    }
    for (const [name, item] of Object.entries(value)) {
      const property = properties[name];
      if (property === undefined) problems.push(`${where}.${name}: not a documented field`);
      else checkValue(item, property, `${where}.${name}`, problems);
    }
  }
}

/** What in this request the OpenAPI document does not have (empty when it conforms). */
export function checkRequest(method: string, rawPath: string, body: unknown): string[] {
  const url = new URL(rawPath, "http://x");
  const path = url.pathname;
  const matches = ROUTES.filter((r) => r.method === method && r.regex.test(path));
  if (matches.length === 0) return [`${method} ${path}: no such route in docs/openapi.json`];
  // The most specific template: the one with the fewest parameters.
  const count = (t: string): number => t.split("{").length;
  const route = matches.reduce((best, r) => (count(r.template) < count(best.template) ? r : best));
  const problems: string[] = [];
  const queryNames = new Set((route.operation.parameters ?? []).filter((p) => p.in === "query").map((p) => p.name));
  for (const name of url.searchParams.keys()) {
    if (!queryNames.has(name)) problems.push(`${method} ${route.template}: query parameter ${JSON.stringify(name)} not documented`);
  }
  if (body !== undefined) {
    const schema = route.operation.requestBody?.content?.["application/json"]?.schema;
    if (schema === undefined) problems.push(`${method} ${route.template}: sends a body the route does not document`);
    else checkValue(body, schema, `${method} ${route.template} body`, problems);
  }
  return problems;
}
