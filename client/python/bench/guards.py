"""Renewal overhead of many lease guards in one Python process.

Opens ``--guards`` lease guards (each with its session, renewed by its own keepalive thread
every third of ``--ttl``), holds them for ``--seconds``, and prints the process's CPU time over
the hold (user + system, and as a share of one core), its thread count, the keepalives sent and
their latency (request sent to answer's head, measured in this process, p50 / p99 / max), and
how many guards were still valid at the end. Every guard is released at the end.

    BATON_ENDPOINTS=http://127.0.0.1:7431,http://127.0.0.1:7432,http://127.0.0.1:7433 \\
        python3 client/python/bench/guards.py --guards 1000 --seconds 60
"""

from __future__ import annotations

import argparse
import os
import resource
import threading
import time
from contextlib import ExitStack
from typing import Any

import httpx

from baton import Client, LeaseGuard

KEEPALIVE_SUFFIX = "/keepalive"


class Latencies:
    """Each keepalive's time from its request to its answer's head."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seconds: list[float] = []

    def on_request(self, request: httpx.Request) -> None:
        request.extensions["baton_bench_sent"] = time.monotonic()

    def on_response(self, response: httpx.Response) -> None:
        if not response.request.url.path.endswith(KEEPALIVE_SUFFIX):
            return
        sent = response.request.extensions.get("baton_bench_sent")
        if isinstance(sent, float):
            with self.lock:
                self.seconds.append(time.monotonic() - sent)

    def take(self) -> list[float]:
        with self.lock:
            taken, self.seconds = self.seconds, []
        return sorted(taken)


def percentile_ms(sorted_seconds: list[float], fraction: float) -> float:
    if not sorted_seconds:
        return float("nan")
    index = round((len(sorted_seconds) - 1) * fraction)
    return sorted_seconds[index] * 1000.0


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--guards", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--ttl", type=float, default=30.0)
    args = parser.parse_args()
    latencies = Latencies()
    hooks: dict[str, list[Any]] = {
        "request": [latencies.on_request],
        "response": [latencies.on_response],
    }
    with Client(holder=f"guards-bench-{os.getpid()}", event_hooks=hooks) as client, ExitStack() as held:
        opening = time.monotonic()
        guards: list[LeaseGuard] = []
        for number in range(args.guards):
            guard = client.lease(f"bench/guards/{os.getpid()}/{number}", ttl=args.ttl)
            guards.append(held.enter_context(guard))
        print(f"{len(guards)} guards acquired in {time.monotonic() - opening:.1f} s")
        latencies.take()
        cpu_before, wall_before = cpu_seconds(), time.monotonic()
        time.sleep(args.seconds)
        cpu = cpu_seconds() - cpu_before
        wall = time.monotonic() - wall_before
        kept = latencies.take()
        valid = sum(1 for guard in guards if guard.is_valid())
        print(
            f"held {len(guards)} guards for {wall:.0f} s: CPU {cpu:.2f} s "
            f"({100.0 * cpu / wall:.1f}% of one core), {threading.active_count()} threads; "
            f"{len(kept)} keepalives ({len(kept) / wall:.1f}/s), latency p50 "
            f"{percentile_ms(kept, 0.5):.2f} ms, p99 {percentile_ms(kept, 0.99):.2f} ms, max "
            f"{percentile_ms(kept, 1.0):.2f} ms; {valid} of {len(guards)} still valid"
        )


if __name__ == "__main__":
    main()
