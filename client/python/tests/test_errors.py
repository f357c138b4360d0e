"""Error codes: the mapping table, each code provoked for real where it can be, access control
on a node started with --auth, and malformed answers from a broken (non-Baton) server."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

import baton
from baton import _routes as routes
from baton.errors import ERROR_CLASSES, error_from_problem

from .conftest import REPO, ClientFactory, free_ports

API_MD = REPO / "docs" / "api.md"


def documented_codes() -> dict[str, int]:
    """The code -> status table of docs/api.md, "Error codes"."""
    text = API_MD.read_text()
    section = text[text.index("## Error codes"):text.index("## Routes")]
    table = {}
    for code, status in re.findall(r"^\| `([A-Z_]+)` \| (\d+)", section, re.MULTILINE):
        table[code] = int(status)
    return table


def test_every_documented_code_has_its_class() -> None:
    documented = documented_codes()
    assert len(documented) == 13
    assert set(ERROR_CLASSES) == set(documented)
    for code, status in documented.items():
        cls = ERROR_CLASSES[code]
        problem: dict[str, Any] = {"code": code, "message": "the server's words"}
        if code == "LEASE_HELD":
            problem["held_by"] = {"holder": "agent-b", "resource": "src/auth.rs",
                                  "mode": "exclusive", "fence": 41, "labels": {},
                                  "acquired_at": "x", "expires_in_ms": 37_200,
                                  "expires_at": "y"}
        if code == "STALE_FENCE":
            problem["current_fence"] = 9
        error = error_from_problem(status, problem)
        assert type(error) is cls, code
        assert isinstance(error, baton.BatonError)
        assert error.code == code and error.status == status
        assert error.message == "the server's words"
        assert str(error) == f"{code}: the server's words"
        assert error.is_indeterminate == (code in ("OUTCOME_UNKNOWN", "INTERNAL")), code
    held = error_from_problem(409, {"code": "LEASE_HELD", "message": "m", "held_by": {
        "holder": "agent-b", "resource": "src/auth.rs", "mode": "exclusive", "fence": 41,
        "expires_in_ms": 37_200, "acquired_at": "", "expires_at": ""}})
    assert isinstance(held, baton.LeaseHeld)
    assert (held.holder, held.fence, held.expires_in) == ("agent-b", 41, 37.2)
    assert held.denial("src/auth.rs") == "denied: agent-b holds src/auth.rs for 38 s more"
    stale = error_from_problem(409, {"code": "STALE_FENCE", "message": "m", "current_fence": 9})
    assert isinstance(stale, baton.StaleFence) and stale.current_fence == 9
    # Malformed problems and unknown codes never crash.
    assert isinstance(error_from_problem(409, {"code": "LEASE_HELD", "message": "m"}),
                      baton.ProtocolError)
    assert isinstance(error_from_problem(400, {"code": 7}), baton.ProtocolError)
    future = error_from_problem(418, {"code": "SOMETHING_NEW", "message": "m"})
    assert type(future) is baton.BatonError and future.code == "SOMETHING_NEW"
    assert not future.is_indeterminate
    assert error_from_problem(502, {"code": "SOMETHING_NEW", "message": "m"}).is_indeterminate


def test_codes_provoked_on_a_real_cluster(make_client: ClientFactory) -> None:
    a = make_client(holder="agent-a")
    with pytest.raises(baton.InvalidArgument) as invalid:
        a.lease("bad/ttl", ttl=0.01).acquire()  # below ttl_ms_min
    assert invalid.value.status == 400 and not invalid.value.is_indeterminate
    with pytest.raises(baton.InvalidArgument):
        a.lease("a//b", ttl=5).acquire()
    with pytest.raises(baton.NotFound):
        a.get_lease("nobody/holds/this")
    with pytest.raises(baton.NotFound):
        a.end_session("0" * 32)
    with pytest.raises(baton.LeaseLost) as lost:
        a.keepalive("0" * 32)
    assert lost.value.status == 409
    with a.lease("err/held", ttl=5) as guard:
        with pytest.raises(baton.LeaseHeld):
            make_client(holder="agent-b").acquire("err/held", ttl=5)
        with pytest.raises(baton.StaleFence):
            a.kv_put("err/k", 1, fence=("err/held", guard.fence + 1000),
                     session_id=guard.session_id)
    with pytest.raises(baton.PayloadTooLarge) as large:
        a.kv_put("err/big", "x" * (300 * 1024))
    assert large.value.status == 413
    # One key, one request: a retry is replayed; another request with it is refused.
    call = routes.kv_put("err/idem", 1)
    call.idempotency_key = "fixed-key-0123456789"
    first = a._execute(call)
    again = a._execute(call)
    assert again.replayed and not first.replayed
    assert again.value == first.value
    other = routes.kv_put("err/idem", 2)
    other.idempotency_key = call.idempotency_key
    with pytest.raises(baton.IdempotencyKeyReused) as reused:
        a._execute(other)
    assert reused.value.status == 422
    assert a.kv_get("err/idem")["value"] == 1


# ---------------------------------------------------------------------------------------------
# Access control: one `batond dev --auth` node
# ---------------------------------------------------------------------------------------------

ADMIN = "baton_admin_bootstrap_0123456789"


@pytest.fixture(scope="module")
def auth_node(batond: str) -> Iterator[str]:
    api, peer = free_ports(2)
    root = Path(tempfile.mkdtemp(prefix="baton-py-auth-"))
    log = open(root / "log", "wb")
    process = subprocess.Popen(
        [batond, "dev", "--auth", "--cluster-secret", "py-test-secret",
         "--listen", f"127.0.0.1:{api}", "--peer-listen", f"127.0.0.1:{peer}",
         "--data-dir", str(root / "data")],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        env={**os.environ, "BATON_BOOTSTRAP_TOKEN": ADMIN},
    )
    url = f"http://127.0.0.1:{api}"
    try:
        deadline = time.monotonic() + 20
        while True:
            assert process.poll() is None, (root / "log").read_text()
            try:
                if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the auth node never got ready"
            time.sleep(0.05)
        yield url
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
        log.close()
        shutil.rmtree(root, ignore_errors=True)


def test_tokens_limits_and_the_auth_codes(auth_node: str, make_client: ClientFactory) -> None:
    admin = make_client(endpoints=[auth_node], token=ADMIN, namespace="team-a")
    names = [t["name"] for t in admin.list_tokens()["tokens"]]
    assert "bootstrap" in names
    created = admin.create_token("agent-a", "agent", ["team-a"], quotas={"sessions_max": 1})
    assert created["secret"].startswith("baton_") and created["role"] == "agent"
    reader = admin.create_token("reader-a", "reader", ["team-a"])
    agent = make_client(endpoints=[auth_node], token=created["secret"], namespace="team-a",
                        holder="agent-a", retry_budget=2.0)
    with agent.lease("x/y", ttl=5) as guard:
        assert guard.is_valid()
        # The token's quota is one session: a second is refused.
        with pytest.raises(baton.ResourceExhausted) as exhausted:
            agent.create_session(ttl=5)
        assert exhausted.value.status == 429 and not exhausted.value.is_indeterminate
    with pytest.raises(baton.Unauthenticated) as unauthenticated:
        make_client(endpoints=[auth_node], token="baton_wrong", namespace="team-a").kv_get("k")
    assert unauthenticated.value.status == 401
    with pytest.raises(baton.Unauthenticated):
        make_client(endpoints=[auth_node], token="", namespace="team-a").kv_get("k")
    wrong_namespace = make_client(endpoints=[auth_node], token=created["secret"],
                                  namespace="team-b")
    with pytest.raises(baton.PermissionDenied) as denied:
        wrong_namespace.kv_put("k", 1)
    assert denied.value.status == 403
    with pytest.raises(baton.PermissionDenied):
        make_client(endpoints=[auth_node], token=reader["secret"], namespace="team-a").kv_put(
            "k", 1)
    with pytest.raises(baton.PermissionDenied):
        agent.create_token("sneaky", "admin", ["*"])
    limits = admin.limits()
    assert limits["txn_ops_max"] == 64
    changed = admin.set_limits(txn_ops_max=32)
    assert changed["txn_ops_max"] == 32
    with pytest.raises(baton.InvalidArgument):
        admin.set_limits(no_such_limit=1)
    assert admin.revoke_token("agent-a") == {"name": "agent-a"}
    with pytest.raises(baton.Unauthenticated):
        agent.kv_get("k")
    with pytest.raises(baton.NotFound):
        admin.revoke_token("agent-a")


# ---------------------------------------------------------------------------------------------
# A broken server (not Baton): malformed answers must be clear client errors
# ---------------------------------------------------------------------------------------------


class Broken(BaseHTTPRequestHandler):
    seen: list[tuple[str, str, str | None]] = []

    def log_message(self, *args: Any) -> None:
        pass

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        Broken.seen.append((self.command, self.path, self.headers.get("Idempotency-Key")))
        path = self.path
        if "notjson" in path:
            self._send(200, "application/json", b"<html>surprise</html>")
        elif "list" in path:
            self._send(200, "application/json", b"[1, 2, 3]")
        elif "teapot" in path:
            self._send(409, "text/html", b"<h1>a proxy says no</h1>")
        elif "gateway" in path:
            self._send(502, "text/html", b"bad gateway")
        elif "unknown" in path:
            body = json.dumps({"code": "OUTCOME_UNKNOWN", "message": "maybe"}).encode()
            self._send(504, "application/problem+json", body)
        elif "nomessage" in path:
            self._send(400, "application/problem+json", b'{"code": "INVALID_ARGUMENT"}')
        elif "truncated" in path:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "100")
            self.end_headers()
            self.wfile.write(b'{"revis')
            self.wfile.flush()
            self.close_connection = True
        else:
            self._send(200, "application/json", b"{}")

    def _send(self, status: int, kind: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PUT = do_POST = do_DELETE = _answer


@pytest.fixture
def broken_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Broken)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    Broken.seen.clear()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_malformed_answers_are_protocol_errors(broken_server: str) -> None:
    client = baton.Client([broken_server], timeout=1.0, retry_budget=1.5, attempts_max=3)
    try:
        with pytest.raises(baton.ProtocolError) as not_json:
            client.kv_get("notjson")
        assert not not_json.value.is_indeterminate and not_json.value.status == 200
        # A write whose 2xx answer cannot be read may have been applied.
        with pytest.raises(baton.ProtocolError) as write:
            client.kv_put("notjson", 1)
        assert write.value.is_indeterminate
        with pytest.raises(baton.ProtocolError) as listed:
            client.kv_get("list")
        assert "not a JSON object" in listed.value.message
        with pytest.raises(baton.ProtocolError) as teapot:
            client.kv_put("teapot", 1)
        assert teapot.value.status == 409 and not teapot.value.is_indeterminate
        with pytest.raises(baton.ProtocolError) as nomessage:
            client.kv_get("nomessage")
        assert not nomessage.value.is_indeterminate
        # An answer cut short is a broken connection: a read is retried, then unavailable;
        # a write may have been applied.
        with pytest.raises(baton.Unavailable) as cut:
            client.kv_get("truncated")
        assert "complete message body" in cut.value.message
        with pytest.raises(baton.OutcomeUnknown) as cut_write:
            client.kv_put("truncated", 1)
        assert cut_write.value.is_indeterminate
        # A 502 without a problem: retried, then unknown for a write.
        Broken.seen.clear()
        with pytest.raises(baton.ProtocolError) as gateway:
            client.kv_put("gateway", 1)
        assert gateway.value.is_indeterminate
        keys = {key for _, _, key in Broken.seen}
        assert len(Broken.seen) >= 2 and len(keys) == 1 and None not in keys
        # OUTCOME_UNKNOWN: every retry carries the operation's one key; the end is unknown.
        Broken.seen.clear()
        with pytest.raises(baton.OutcomeUnknown) as unknown:
            client.kv_put("unknown", 1)
        assert unknown.value.is_indeterminate
        keys = {key for _, _, key in Broken.seen}
        assert len(Broken.seen) == 3 and len(keys) == 1 and None not in keys
        # Reads carry no key.
        Broken.seen.clear()
        with pytest.raises(baton.Unavailable):
            client.get_lease("unknown")
        assert all(key is None for _, _, key in Broken.seen)
    finally:
        client.close()


def test_an_unreachable_cluster_is_unavailable_and_surely_not_applied() -> None:
    (port,) = free_ports(1)
    client = baton.Client([f"127.0.0.1:{port}"], timeout=0.5, retry_budget=1.0)
    try:
        started = time.monotonic()
        with pytest.raises(baton.Unavailable) as unavailable:
            client.kv_put("k", 1)
        assert not unavailable.value.is_indeterminate
        assert time.monotonic() - started < 3.0
    finally:
        client.close()


def test_configuration_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATON_ENDPOINTS", "127.0.0.1:1, http://127.0.0.1:2/")
    monkeypatch.setenv("BATON_TOKEN", "secret-token")
    monkeypatch.setenv("BATON_NAMESPACE", "ns1")
    client = baton.Client()
    assert client.endpoints == ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    assert client.namespace == "ns1"
    assert client._config.headers()["Authorization"] == "Bearer secret-token"
    with pytest.raises(baton.InvalidArgument):
        baton.Client(["ftp://x:1"])
    with pytest.raises(baton.TLSError):
        baton.Client(["https://127.0.0.1:1"], ca_file="/nonexistent/ca.pem")
