"""A real Baton cluster for the tests: three `batond run` processes (the binary at $BATOND,
else the repository's target/release/batond), each with its own ports and data dir.

Every request any test client sends is recorded (an httpx event hook), for the OpenAPI
conformance test."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest

import baton

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]

#: (method, raw path with query, JSON body or None) of every request test clients sent.
RECORDED: list[tuple[str, str, Any]] = []


def _record(request: httpx.Request) -> None:
    body: Any = None
    try:
        content = request.content
    except httpx.RequestNotRead:  # a streamed body: the client sends none
        content = b""
    if content:
        body = json.loads(content)
    RECORDED.append((request.method, request.url.raw_path.decode("ascii"), body))


async def _record_async(request: httpx.Request) -> None:
    _record(request)


def batond_path() -> str:
    """The batond to test; a missing one fails the run (a skip would pass it untested)."""
    path = os.environ.get("BATOND") or str(REPO / "target" / "release" / "batond")
    if not Path(path).is_file():
        pytest.fail(f"no batond binary at {path}: build it or set BATOND", pytrace=False)
    return path


def free_ports(count: int) -> list[int]:
    sockets, ports = [], []
    for _ in range(count):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sockets.append(sock)
        ports.append(sock.getsockname()[1])
    for sock in sockets:
        sock.close()
    return ports


class Node:
    def __init__(self, node_id: int, api: int, peer: int, data_dir: Path, log: Path) -> None:
        self.id = node_id
        self.api = api
        self.peer = peer
        self.data_dir = data_dir
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.api}"

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL, by this process's own pid only."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)


class Cluster:
    def __init__(self, binary: str, size: int = 3, extra: list[str] | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.binary = binary
        self.root = Path(tempfile.mkdtemp(prefix="baton-py-"))
        ports = free_ports(2 * size)
        self.nodes = [
            Node(i + 1, ports[2 * i], ports[2 * i + 1], self.root / f"n{i + 1}",
                 self.root / f"n{i + 1}.log")
            for i in range(size)
        ]
        self.extra = extra or []
        self.env = env or {}

    def start(self) -> None:
        initial = ",".join(
            f"{n.id}=127.0.0.1:{n.api}@127.0.0.1:{n.peer}" for n in self.nodes
        )
        for node in self.nodes:
            node.data_dir.mkdir(parents=True, exist_ok=True)
            argv = [
                self.binary, "run", "--id", str(node.id), "--data-dir", str(node.data_dir),
                "--listen", f"127.0.0.1:{node.api}", "--peer-listen", f"127.0.0.1:{node.peer}",
                "--initial-cluster", initial, *self.extra,
            ]
            with open(node.log, "wb") as log:
                node.process = subprocess.Popen(
                    argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    env={**os.environ, "RUST_LOG": "warn", **self.env},
                )
        self.wait_ready(self.nodes, 30.0)

    def wait_ready(self, nodes: list[Node], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        pending = list(nodes)
        while pending:
            if time.monotonic() > deadline:
                logs = "\n".join(n.log.read_text(errors="replace")[-2000:] for n in pending)
                raise RuntimeError(f"nodes {[n.id for n in pending]} not ready:\n{logs}")
            for node in list(pending):
                if not node.alive():
                    raise RuntimeError(f"node {node.id} exited: {node.log.read_text()[-2000:]}")
                try:
                    if httpx.get(node.url + "/readyz", timeout=1.0).status_code == 200:
                        pending.remove(node)
                except httpx.HTTPError:
                    pass
            time.sleep(0.05)

    @property
    def endpoints(self) -> list[str]:
        return [n.url for n in self.nodes]

    def leader(self, timeout: float = 10.0) -> Node:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for node in self.nodes:
                if not node.alive():
                    continue
                try:
                    status = httpx.get(node.url + "/v1/cluster", timeout=1.0).json()
                except (httpx.HTTPError, ValueError):
                    continue
                leader = status.get("leader_id")
                if leader is not None:
                    match = [n for n in self.nodes if n.id == leader and n.alive()]
                    if match:
                        return match[0]
            time.sleep(0.05)
        raise RuntimeError("no leader")

    def stop(self) -> None:
        for node in self.nodes:
            node.kill()
        shutil.rmtree(self.root, ignore_errors=True)


TEST_SECONDS_MAX = 90


@pytest.fixture(autouse=True)
def bounded_test() -> Iterator[None]:
    """No test waits forever: SIGALRM interrupts one that runs past TEST_SECONDS_MAX."""

    def expire(signum: int, frame: object) -> None:
        raise TimeoutError(f"the test ran longer than {TEST_SECONDS_MAX} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(TEST_SECONDS_MAX)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture(scope="session")
def batond() -> str:
    return batond_path()


@pytest.fixture(scope="session")
def cluster(batond: str) -> Iterator[Cluster]:
    """One 3-node cluster for the whole run (tests isolate themselves by namespace)."""
    c = Cluster(batond)
    try:
        c.start()
        yield c
    finally:
        c.stop()


@pytest.fixture
def fresh_cluster(batond: str) -> Iterator[Cluster]:
    """A 3-node cluster of its own, for tests that kill nodes."""
    c = Cluster(batond)
    try:
        c.start()
        yield c
    finally:
        c.stop()


ClientFactory = Callable[..., baton.Client]


@pytest.fixture
def namespace() -> str:
    return "t-" + uuid.uuid4().hex[:12]


@pytest.fixture
def make_client(cluster: Cluster, namespace: str) -> Iterator[ClientFactory]:
    made: list[baton.Client] = []

    def make(**kwargs: Any) -> baton.Client:
        kwargs.setdefault("endpoints", cluster.endpoints)
        kwargs.setdefault("namespace", namespace)
        kwargs.setdefault("timeout", 3.0)
        kwargs.setdefault("retry_budget", 10.0)
        kwargs.setdefault("event_hooks", {"request": [_record]})
        client = baton.Client(**kwargs)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


@pytest.fixture
def client(make_client: ClientFactory) -> baton.Client:
    return make_client(holder="agent-a")


@pytest.fixture
async def aclient(cluster: Cluster, namespace: str) -> Any:
    client = baton.AsyncClient(
        cluster.endpoints,
        namespace=namespace,
        holder="agent-async",
        timeout=3.0,
        retry_budget=10.0,
        event_hooks={"request": [_record_async]},
    )
    yield client
    await client.aclose()
