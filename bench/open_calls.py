"""What a call in flight costs a node: memory and descriptors, measured on ``cronlog serve`` as
its calls pile up.

    python -m bench.open_calls [--steps 1000,4000,8000] [--rounds 3]

One node with its defaults (bench.common.LIMITS aside) and a target that holds every call
(the recorder's ``/hold/<ms>``, longer than the run). Step by step, HTTP jobs due at once are
added until the calls in flight reach each figure of ``--steps``; once the target has seen
every one of them arrive (they are all open), and a heartbeat period has passed, the node's
process tree is read: resident memory (RSS, and PSS where the kernel gives it) and open
descriptors, summed over the node and its executor processes. A call's cost is the slope
between the first reading (no call) and the last. One team's calls fill at most the room
that is not kept for the others (nine tenths of it), so the steps stay below 9,000.

Appends one JSON line per round to bench/results/open_calls.jsonl.
"""

from __future__ import annotations

import argparse
import os
import secrets
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import (
    Recorder,
    Serve,
    append_result,
    descendants,
    find_batch_endpoint,
    iso_ms,
    loadavg,
    log,
    now_ms,
    register,
    stamp,
)

HOLD_MS = 600_000  # longer than a round: every call stays open until the node stops
SETTLE_S = 12.0  # a heartbeat period (a third of the 30 s lease) after the last call arrived


def reading(pid: int) -> dict[str, int]:
    """Resident memory and open descriptors of ``pid``'s process tree."""
    rss = pss = fds = 0
    processes = descendants(pid)
    for p in processes:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    rss += int(line.split()[1]) * 1024
            for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    pss += int(line.split()[1]) * 1024
            fds += len(os.listdir(f"/proc/{p}/fd"))
        except OSError:
            continue
    return {"rss": rss, "pss": pss, "fds": fds, "processes": len(processes)}


def one_round(steps: list[int], recorder: Recorder, tmp: Path) -> dict[str, Any]:
    data = tmp / f"serve-{secrets.token_hex(3)}"
    load = loadavg()
    readings: list[dict[str, Any]] = []
    with Serve(data) as serve:
        batch = find_batch_endpoint(serve.openapi())
        recorder.take()
        time.sleep(SETTLE_S)  # the node as it idles, after its start
        readings.append({"calls": 0, **reading(serve.pid)})
        url = f"{recorder.base}/hold/{HOLD_MS}"
        held = 0
        for target in steps:
            at = iso_ms(now_ms() + 3000)
            jobs = [
                {
                    "job_id": f"open-{i:06d}",
                    "name": f"open call {i}",
                    "run_at": at,
                    "target": url,
                    "timeout_sec": HOLD_MS / 1000,
                }
                for i in range(held, target)
            ]
            register(serve, jobs, batch=batch)
            if not recorder.wait_for(target, timeout_s=120, poll_s=0.2):
                raise RuntimeError(f"only {recorder.count()} of {target} calls arrived")
            held = target
            time.sleep(SETTLE_S)
            readings.append({"calls": target, **reading(serve.pid)})
            log(f"{target} calls open: {readings[-1]}")
    first, last = readings[0], readings[-1]
    calls = last["calls"] - first["calls"]
    return {
        "timestamp": stamp(),
        "scenario": "open-calls",
        "load_at_start": load,
        "readings": readings,
        "per_call": {
            "rss_bytes": round((last["rss"] - first["rss"]) / calls),
            "pss_bytes": round((last["pss"] - first["pss"]) / calls),
            "fds": round((last["fds"] - first["fds"]) / calls, 3),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", default="1000,4000,8000")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    steps = sorted(int(s) for s in args.steps.split(",") if s)
    with tempfile.TemporaryDirectory(prefix="open-calls-") as tmp, Recorder() as recorder:
        for r in range(args.rounds):
            record = one_round(steps, recorder, Path(tmp))
            record["round"] = r
            append_result("open_calls", record)
            log(f"round {r}: a call in flight costs {record['per_call']}")


if __name__ == "__main__":
    main()
