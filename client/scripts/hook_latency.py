#!/usr/bin/env python3
"""Times `baton hook claude-code` the way Claude Code calls it: N PreToolUse events for Edit,
each a fresh process, against a running node; prints the median, p90 and max in ms.

    python3 client/scripts/hook_latency.py target/release/baton http://127.0.0.1:7420 50

The events share one Claude session and cycle over five files under a temporary root, so the
first call creates the Baton session and claims, and later ones renew and re-claim. A
SessionEnd at the end releases everything.
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def event(root, name, **fields):
    return json.dumps({"session_id": "hook-latency", "transcript_path": "/dev/null",
                       "cwd": root, "hook_event_name": name, **fields}).encode()


def main():
    baton, endpoint, calls = sys.argv[1], sys.argv[2], int(sys.argv[3])
    root = tempfile.mkdtemp(prefix="hook-latency-")
    env = dict(os.environ, BATON_ENDPOINTS=endpoint, HOME=root)
    hook = [baton, "hook", "claude-code", "--root", root]
    took_ms = []
    for i in range(calls):
        edit = event(root, "PreToolUse", tool_name="Edit",
                     tool_input={"file_path": f"{root}/src/f{i % 5}.rs",
                                 "old_string": "a", "new_string": "b"})
        started = time.perf_counter()
        answer = subprocess.run(hook, input=edit, capture_output=True, env=env)
        took_ms.append((time.perf_counter() - started) * 1000)
        if answer.returncode != 0 or b"deny" in answer.stdout:
            sys.exit(f"call {i} was not allowed: {answer}")
    subprocess.run(hook, input=event(root, "SessionEnd", reason="exit"), env=env, check=True)
    took_ms.sort()
    print(f"{calls} PreToolUse calls: p50 {statistics.median(took_ms):.1f} ms, "
          f"p90 {took_ms[int(calls * 0.9)]:.1f} ms, max {took_ms[-1]:.1f} ms")


if __name__ == "__main__":
    main()
