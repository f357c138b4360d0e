"""Two agents race for one file.

The winner works under a lease guard and writes through its fence. The loser's tool call is
denied, and the denial is the tool's result ("denied: agent-a holds src/auth.rs for 2 s
more"). Then the winner is paused past its TTL (its renewals stop, as in a long GC pause or a
stopped laptop): its guard reports the loss, and its late write is refused with STALE_FENCE.
The loser's next tool call is granted and its write lands.

    BATON_ENDPOINTS=http://127.0.0.1:7431,http://127.0.0.1:7432 python examples/two_agents.py
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

import baton

PATH = "src/auth.rs"
KEY = "files/src/auth.rs"
TTL = 2.0


def run(endpoints: list[str], namespace: str = "two-agents") -> dict[str, Any]:
    log: dict[str, Any] = {"transcript": []}
    say = log["transcript"].append
    holding = threading.Event()
    loser_done = threading.Event()
    start = threading.Barrier(2)

    def agent(name: str) -> None:
        client = baton.Client(endpoints, namespace=namespace, holder=name, timeout=2.0)

        @client.claims(lambda path, **_: path, ttl=TTL)
        def edit_file(path: str, text: str) -> str:
            client.kv_put(KEY, text)
            return f"{name} wrote {path}"

        try:
            start.wait(10)
            try:
                guard = client.lease(PATH, ttl=TTL).acquire()
            except baton.LeaseHeld:
                # Lost the race: the model calls its tool and reads the denial.
                holding.wait(10)
                result = edit_file(PATH, text=f"{name}'s version")
                say(f"{name}: tool result: {result}")
                log["denial"] = result
                loser_done.set()
                # Later, once the winner's lease has lapsed, the same call is granted.
                log["winner_stale"].wait(15)
                result = edit_file(PATH, text=f"{name}'s version")
                say(f"{name}: tool result: {result}")
                log["second"] = result
                log["loser"] = name
                return
            log["winner"] = name
            say(f"{name}: holds {PATH} with fence {guard.fence}")
            client.kv_put(KEY, f"{name}'s version", guard=guard)
            say(f"{name}: wrote {KEY} through fence {guard.fence}")
            holding.set()
            loser_done.wait(10)
            # Paused past the TTL: no keepalive goes out.
            guard.pause_renewals()
            lost = guard.wait_lost(TTL + 2.0)
            say(f"{name}: guard reports: {lost}")
            log["lost"] = lost
            time.sleep(0.5)  # the server's deadline passes too
            try:
                client.kv_put(KEY, f"{name}'s late write",
                              fence=(guard.resource, guard.fence), session_id=guard.session_id)
                log["late_write"] = "applied"
            except baton.StaleFence as refused:
                say(f"{name}: late write refused: {refused.code}")
                log["late_write"] = refused.code
            log["winner_stale"].set()
            guard.release()
        finally:
            client.close()

    log["winner_stale"] = threading.Event()
    threads = [threading.Thread(target=agent, args=(name,)) for name in ("agent-a", "agent-b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(40)
    reader = baton.Client(endpoints, namespace=namespace, timeout=2.0)
    try:
        log["final"] = reader.kv_get(KEY)["value"]
    finally:
        reader.close()
    del log["winner_stale"]
    return log


def main() -> int:
    endpoints = [e for e in os.environ.get("BATON_ENDPOINTS", "http://127.0.0.1:7420").split(",")
                 if e.strip()]
    log = run(endpoints, os.environ.get("BATON_NAMESPACE") or "two-agents")
    for line in log["transcript"]:
        print(line)
    print(f"final value of {KEY}: {log['final']!r}")
    ok = (
        str(log.get("denial", "")).startswith(f"denied: {log.get('winner')} holds {PATH} for ")
        and log.get("late_write") == "STALE_FENCE"
        and log.get("final") == f"{log.get('loser')}'s version"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
