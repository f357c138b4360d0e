"""The ``claims`` tool decorator: granted, denied as a result string, fail closed."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import pytest

import baton

from .conftest import ClientFactory, free_ports

DENIAL = re.compile(r"^denied: agent-b holds src/auth\.rs for (\d+) s more$")


def test_a_tool_runs_under_its_claim_and_renews(make_client: ClientFactory) -> None:
    a = make_client(holder="agent-a")
    watcher = make_client(holder="watcher")
    ran: list[dict[str, Any]] = []

    @a.claims(lambda path, **_: path, ttl=1.5)
    def edit(path: str, text: str) -> str:
        ran.append(watcher.get_lease(path))
        time.sleep(2.5)  # longer than the TTL: renewals keep the claim
        ran.append(watcher.get_lease(path))
        return f"wrote {len(text)} bytes to {path}"

    assert edit.__name__ == "edit"
    assert edit("src/auth.rs", text="hello") == "wrote 5 bytes to src/auth.rs"
    assert [lease["holder"] for lease in ran] == ["agent-a", "agent-a"]
    assert ran[0]["fence"] == ran[1]["fence"]
    with pytest.raises(baton.NotFound):  # released after the tool
        watcher.get_lease("src/auth.rs")


def test_a_denial_is_the_tools_result_and_the_tool_does_not_run(
    make_client: ClientFactory,
) -> None:
    a = make_client(holder="agent-a")
    b = make_client(holder="agent-b")
    ran: list[str] = []

    @a.claims(lambda path, **_: path)
    def edit(path: str) -> str:
        ran.append(path)
        return "edited"

    with b.lease("src/auth.rs", ttl=40):
        result = edit("src/auth.rs")
        match = DENIAL.match(result)
        assert match, result
        assert 35 <= int(match.group(1)) <= 40
        assert ran == []
    assert edit("src/auth.rs") == "edited"


async def test_async_tools_with_both_clients(make_client: ClientFactory,
                                             aclient: baton.AsyncClient) -> None:
    sync_client = make_client(holder="agent-b")

    @aclient.claims(lambda path: path)
    async def edit(path: str) -> str:
        await asyncio.sleep(0.1)
        return f"edited {path}"

    @sync_client.claims(lambda path: path)
    async def edit_b(path: str) -> str:
        return f"b edited {path}"

    assert await edit("src/auth.rs") == "edited src/auth.rs"
    assert await edit_b("src/auth.rs") == "b edited src/auth.rs"
    async with aclient.lease("src/auth.rs", ttl=40):
        result = await edit_b("src/auth.rs")
        assert result.startswith("denied: agent-async holds src/auth.rs for "), result
    with pytest.raises(TypeError):
        aclient.claims(lambda path: path)(lambda path: path)


class Garbage(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "9")
        self.end_headers()
        self.wfile.write(b"not json!")


@pytest.fixture
def garbage_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Garbage)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_fail_closed(make_client: ClientFactory, garbage_server: str) -> None:
    ran: list[str] = []

    def tool(path: str) -> str:
        ran.append(path)
        return "ran"

    (port,) = free_ports(1)
    unreachable = make_client(endpoints=[f"127.0.0.1:{port}"], timeout=0.3, retry_budget=0.8)
    result = unreachable.claims(lambda path: path)(tool)("src/a.rs")
    assert result.startswith("error: could not claim src/a.rs: Baton is unreachable"), result
    assert result.endswith("the tool did not run")
    malformed = make_client(endpoints=[garbage_server], timeout=0.5, retry_budget=1.0)
    result = malformed.claims(lambda path: path)(tool)("src/a.rs")
    assert result.startswith("error: could not claim src/a.rs: Baton's answer was malformed"), \
        result
    good = make_client(holder="agent-a")
    assert good.claims(lambda path: path[99])(tool)("src/a.rs").startswith(
        "error: cannot tell which path tool works on")
    assert good.claims(lambda path: "")(tool)("src/a.rs").startswith(
        "error: tool names no path to claim")
    result = good.claims(lambda path: path)(tool)("bad//path")
    assert result.startswith("error: could not claim bad//path: INVALID_ARGUMENT"), result
    assert ran == []
