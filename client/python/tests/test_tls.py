"""TLS: a batond serving its client API over HTTPS with a certificate of a private CA (made by
trustme). A client given that CA (``ca_file``) works; one without it gets ``TLSError`` naming
the fix, and a claimed tool fails closed: it does not run and its result says why."""

from __future__ import annotations

import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trustme

from baton import Client, TLSError

from .conftest import free_ports


class TlsNode:
    def __init__(self, url: str, ca_file: str) -> None:
        self.url = url
        self.ca_file = ca_file


@pytest.fixture(scope="module")
def tls_node(batond: str) -> Iterator[TlsNode]:
    root = Path(tempfile.mkdtemp(prefix="baton-py-tls-"))
    ca = trustme.CA()
    issued = ca.issue_cert("127.0.0.1", "localhost")
    ca.cert_pem.write_to_path(str(root / "ca.pem"))
    issued.private_key_pem.write_to_path(str(root / "key.pem"))
    for blob in issued.cert_chain_pems:
        blob.write_to_path(str(root / "chain.pem"), append=True)
    api, peer = free_ports(2)
    log = open(root / "batond.log", "wb")
    process = subprocess.Popen(
        [batond, "dev", "--data-dir", str(root / "data"),
         "--listen", f"127.0.0.1:{api}", "--peer-listen", f"127.0.0.1:{peer}",
         "--tls-cert", str(root / "chain.pem"), "--tls-key", str(root / "key.pem")],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        env={**os.environ, "RUST_LOG": "warn"},
    )
    url = f"https://127.0.0.1:{api}"
    trusting = ssl.create_default_context(cafile=str(root / "ca.pem"))
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, (root / "batond.log").read_text()
            try:
                if httpx.get(url + "/readyz", verify=trusting, timeout=1.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, (root / "batond.log").read_text()
            time.sleep(0.05)
        yield TlsNode(url, str(root / "ca.pem"))
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        log.close()
        shutil.rmtree(root, ignore_errors=True)


def test_a_client_trusting_the_clusters_ca_holds_leases_over_https(tls_node: TlsNode) -> None:
    with Client([tls_node.url], ca_file=tls_node.ca_file, holder="agent-a") as client:
        with client.lease("tls/src/auth.rs", ttl=10) as guard:
            assert guard.fence > 0
            assert guard.is_valid()
            client.kv_put("tls/owner", "agent-a", guard=guard)
        assert client.kv_get("tls/owner")["value"] == "agent-a"


def test_a_client_without_the_ca_is_refused_and_a_claimed_tool_fails_closed(
    tls_node: TlsNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BATON_CA_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    ran: list[str] = []
    with Client([tls_node.url], holder="agent-a", retry_budget=3) as client:
        with pytest.raises(TLSError) as refused:
            client.lease("tls/untrusted", ttl=10).acquire()
        assert "ca_file" in str(refused.value)

        @client.claims(lambda path, **_: path, ttl=10)
        def edit(path: str) -> str:
            ran.append(path)
            return "edited"

        result = edit("tls/untrusted")
    assert ran == []
    assert result.startswith("error: "), result
    assert "TLS" in result, result
