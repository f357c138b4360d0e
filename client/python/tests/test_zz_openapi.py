"""OpenAPI conformance: every (method, path template), query parameter and request body field
the client sends exists in docs/openapi.json.

Two checks: the client's route table, built with every optional field set; and every request
the test clients actually sent during this run (recorded by an httpx event hook; this file runs
last). A request the document does not have fails the test."""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest

import baton
from baton import _routes as routes
from baton import txn

from .conftest import RECORDED, REPO, ClientFactory

OPENAPI = json.loads((REPO / "docs" / "openapi.json").read_text())
MULTI_SEGMENT = {"key", "resource"}  # {key...} and {resource...} in docs/api.md


def _template_regex(template: str) -> re.Pattern[str]:
    pattern = ""
    for part in re.split(r"(\{[^}]+\})", template):
        if part.startswith("{"):
            name = part[1:-1]
            pattern += ".+" if name in MULTI_SEGMENT else "[^/]+"
        else:
            pattern += re.escape(part)
    return re.compile(f"^{pattern}$")


ROUTES = [
    (method.upper(), template, _template_regex(template), operation)
    for template, item in OPENAPI["paths"].items()
    for method, operation in item.items()
    if method in ("get", "put", "post", "delete", "head", "patch")
]


def _resolve(schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        schema = OPENAPI["components"]["schemas"][name]
    return schema


def _check_value(value: Any, schema: dict[str, Any], where: str, problems: list[str]) -> None:
    schema = _resolve(schema)
    if not schema:
        return  # any JSON (a kv value, a payload, a result)
    if "oneOf" in schema:
        variants = [_resolve(v) for v in schema["oneOf"]]
        if value is None:
            return
        objects = [v for v in variants if v.get("type") != "null"]
        if isinstance(value, dict) and all("op" in v.get("properties", {}) for v in objects):
            tagged = [v for v in objects if value.get("op") in v["properties"]["op"].get("enum", [])]
            if not tagged:
                problems.append(f"{where}: op {value.get('op')!r} is not documented")
                return
            objects = tagged
        candidates = []
        for variant in objects:
            found: list[str] = []
            _check_value(value, variant, where, found)
            if not found:
                return
            candidates.append(found)
        problems.extend(candidates[0] if candidates else [f"{where}: matches no variant"])
        return
    kind = schema.get("type")
    if kind == "array" or (isinstance(kind, list) and "array" in kind):
        if isinstance(value, list):
            for i, item in enumerate(value):
                _check_value(item, schema.get("items", {}), f"{where}[{i}]", problems)
        return
    if isinstance(value, dict) and ("properties" in schema or kind == "object"):
        properties = schema.get("properties")
        if properties is None:
            if schema.get("additionalProperties") is False:
                problems.extend(f"{where}.{name}: not documented" for name in value)
            elif isinstance(schema.get("additionalProperties"), dict):
                for name, item in value.items():
                    _check_value(item, schema["additionalProperties"], f"{where}.{name}",
                                  problems)
            return
        for name, item in value.items():
            if name not in properties:
                problems.append(f"{where}.{name}: not a documented field")
            else:
                _check_value(item, properties[name], f"{where}.{name}", problems)


def check_request(method: str, raw_path: str, body: Any) -> list[str]:
    """What in this request the OpenAPI document does not have."""
    split = urlsplit(raw_path)
    matches = [r for r in ROUTES if r[0] == method and r[2].match(split.path)]
    if not matches:
        return [f"{method} {split.path}: no such route in docs/openapi.json"]
    # The most specific template: the one with the fewest parameters.
    _, template, _, operation = min(matches, key=lambda r: r[1].count("{"))
    problems = []
    query_names = {p["name"] for p in operation.get("parameters", []) if p.get("in") == "query"}
    for name, _ in parse_qsl(split.query, keep_blank_values=True):
        if name not in query_names:
            problems.append(f"{method} {template}: query parameter {name!r} not documented")
    if body is not None:
        content = operation.get("requestBody", {}).get("content", {})
        schema = content.get("application/json", {}).get("schema")
        if schema is None:
            problems.append(f"{method} {template}: sends a body the route does not document")
        else:
            _check_value(body, schema, f"{method} {template} body", problems)
    return problems


def _every_call() -> list[routes.Call]:
    """Every route builder with every optional field set."""
    sid = "0123456789abcdef0123456789abcdef"
    op_all = [
        txn.put("k", {"v": 1}),
        txn.delete("k2"),
        txn.release("r"),
        txn.add_task("q", {"p": 1}, id="t", priority=2, depends_on=["t0"], max_attempts=3,
                     not_before_ms=10, on_dead={"queue": "undo", "payload": {}, "max_attempts": 2}),
        txn.complete_task("q", "t", 5, {"r": 1}),
        txn.fail_task("q", "t", 5, "why", retry=True),
    ]
    return [
        routes.create_session("h", 1000, {"a": "b"}),
        routes.keepalive(sid),
        routes.release(sid, "a/b"),
        routes.get_session(sid, 10, "c"),
        routes.end_session(sid),
        routes.acquire(routes.acquire_body("a/b", holder="h", ttl_ms=1000, mode="shared",
                                           limit=2, max_hold_ms=5, labels={"x": "y"},
                                           reason="r", wait_ms=5)),
        routes.acquire(routes.acquire_body("a/b", session_id=sid)),
        routes.get_lease("a/b/c"),
        routes.list_leases("a/", 10, "c"),
        routes.fence_check("a/b", 1),
        routes.kv_get("a/b"),
        routes.kv_put("a/b", {"v": 1}, ("a", 1), sid),
        routes.kv_delete("a/b", ("a", 1), sid),
        routes.kv_delete("a/b"),
        routes.enqueue("q", routes.enqueue_body(
            {"p": 1}, id="t", priority=1, depends_on=["t0"], max_attempts=2, not_before_ms=5,
            on_dead={"queue": "undo", "payload": 1, "max_attempts": 1})),
        routes.claim("q", holder="h", ttl_ms=1000, wait_ms=5),
        routes.claim("q", session_id=sid),
        routes.complete_task("q", "t", sid, 1, {"r": 1}),
        routes.fail_task("q", "t", sid, 1, "why", False),
        routes.release_task("q", "t", sid, 1, "note"),
        routes.queue_info("q"),
        routes.list_queues(10, "c"),
        routes.list_tasks("q", "ready", 10, "c"),
        routes.txn(sid, [txn.fence("r", 1), txn.kv_revision("k", 0)], op_all, op_all),
        routes.events(3, 10),
        routes.create_token("n", "agent", ["ns"], {"sessions_max": 1, "leases_max": 2}),
        routes.list_tokens(),
        routes.revoke_token("n"),
        routes.get_limits(),
        routes.set_limits({"txn_ops_max": 32}),
        routes.cluster_status(),
        routes.add_member(4, "127.0.0.1:1", "127.0.0.1:2", True),
        routes.remove_member(4),
    ]


def test_the_checker_catches_undocumented_routes_and_fields() -> None:
    assert check_request("GET", "/v1/leases/a/b", None) == []
    assert check_request("GET", "/v1/nope", None)
    assert check_request("PATCH", "/v1/leases", None)
    assert check_request("GET", "/v1/leases?bogus=1", None)
    assert check_request("POST", "/v1/leases", {"resource": "a", "ttl": 5})
    assert check_request("POST", "/v1/txn", {"success": [{"op": "put", "key": "k",
                                                          "value": 1}]}) == []
    assert check_request("POST", "/v1/txn", {"success": [{"op": "frobnicate"}]})
    assert check_request("PUT", "/v1/kv/a", {"value": 1, "fence": {"resource": "a",
                                                                   "token": 1, "x": 2}})
    assert check_request("GET", "/v1/kv/a", {"value": 1})


def test_the_route_table_conforms() -> None:
    calls = _every_call()
    problems = []
    for call in calls:
        body = None if call.content() is None else json.loads(call.content() or b"null")
        problems += check_request(call.method, call.path, body)
        template_ok = [r for r in ROUTES if r[0] == call.method and r[1] == call.route]
        if not template_ok:
            problems.append(f"{call.method} {call.route}: the route's template is not documented")
    assert problems == []
    documented = {(m, t) for m, t, _, _ in ROUTES if t.startswith("/v1/")}
    used = {(c.method, c.route) for c in calls}
    # Every client route, and (for the record) which documented routes the client leaves out.
    assert used <= documented
    assert documented - used == {("GET", "/v1/snapshot"), ("GET", "/v1/openapi.json"),
                                 ("GET", "/v1/debug/digest"), ("POST", "/v1/debug/clock")}


def test_every_request_sent_during_the_run_conforms(make_client: ClientFactory) -> None:
    # A few requests of its own, so that this test checks something even when run alone.
    client = make_client(holder="conformance")
    with client.lease("conf/x", ttl=5) as guard:
        client.kv_put("conf/k", 1, guard=guard)
        client.fence_check("conf/x", guard.fence)
    client.events(after=0, limit=5)
    assert RECORDED, "nothing was recorded"
    problems = sorted({p for method, path, body in RECORDED
                       for p in check_request(method, path, body)})
    assert problems == [], problems
    methods_paths = {(m, urlsplit(p).path.split("/")[2]) for m, p, _ in RECORDED
                     if p.startswith("/v1/")}
    assert ("POST", "leases") in methods_paths and ("PUT", "kv") in methods_paths


@pytest.mark.parametrize("name", sorted(OPENAPI["components"]["schemas"]["ErrorCode"]["enum"]))
def test_every_openapi_error_code_has_a_class(name: str) -> None:
    assert baton.ERROR_CLASSES[name].code == name
