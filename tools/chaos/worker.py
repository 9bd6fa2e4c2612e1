"""A pull worker: a process of its own that claims runs of a pool, works on them while it
heartbeats, completes them with its fencing token, and records everything it did.

``python -m tools.chaos worker --worker-id w1 --pool chaos --node URL ... --record w1.jsonl``
runs ``--threads`` loops, each ``claim (reaching 3 s ahead) → wait for the start, checking
the lease 1 s before it → work (heartbeat every third of the lease) → complete``. Records
(:mod:`tools.chaos.records`, so a SIGKILL loses none)::

    {"kind": "work", "worker": id, "run": ..., "job": ..., "slot": ms, "attempt": n,
     "token": t, "key": ..., "at": ms}                       # the work began: the delivery
    {"kind": "heartbeat", "run": ..., "token": t, "status": 200|409|..., "at": ms}
    {"kind": "abandon", "run": ..., "token": t, "at": ms}    # a heartbeat said the lease is gone
    {"kind": "withdrawn", "run": ..., "token": t, "at": ms}  # the check before the start: gone
    {"kind": "complete", "run": ..., "token": t, "outcome": "succeeded"|"failed",
     "status": 200|409|..., "at": ms}

How long the work takes and whether it fails is the job's payload's to say
(:mod:`tools.chaos.behaviour`). Every loop is bounded by ``--max-seconds``; SIGTERM lets each
thread finish the run in hand and stop.
"""

from __future__ import annotations

import itertools
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from tools.chaos.behaviour import answer
from tools.chaos.records import Recorder

# A claim that found nothing: ask again after this long. An empty claim is dear: the node asks
# every partition it does not own through the log.
CLAIM_IDLE_S = 1.0
RETRY_S = 0.2  # a node that did not answer: try the next one after this long
COMPLETE_TRIES = 3
# Claims reach this far ahead (leases granted ahead, as the SDK's Worker asks for them); the
# lease is checked this long before the start.
AHEAD_SEC = 3
CHECK_S = 1.0


def _ms() -> int:
    return time.time_ns() // 1_000_000


class PullWorker:
    def __init__(
        self,
        worker_id: str,
        pool: str,
        nodes: list[str],
        token: str,
        record: Path,
        *,
        threads: int = 4,
        max_seconds: float = 3600.0,
    ) -> None:
        self.worker_id = worker_id
        self.pool = pool
        self.recorder = Recorder(record)
        self.threads = threads
        self.deadline = time.monotonic() + max_seconds
        self.done = threading.Event()
        self._clients = [
            httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=15.0)
            for url in nodes
        ]
        self._turn = itertools.count()

    def _client(self) -> httpx.Client:
        return self._clients[next(self._turn) % len(self._clients)]

    def _over(self) -> bool:
        return self.done.is_set() or time.monotonic() >= self.deadline

    def run(self) -> None:
        loops = [
            threading.Thread(target=self._loop, name=f"{self.worker_id}-{i}", daemon=True)
            for i in range(self.threads)
        ]
        for t in loops:
            t.start()
        for t in loops:
            t.join(max(0.0, self.deadline - time.monotonic()) + 60)
        self.recorder.close()

    def _post(self, path: str, body: dict[str, Any]) -> httpx.Response | None:
        try:
            return self._client().post(path, json=body)
        except httpx.HTTPError:
            return None

    def _loop(self) -> None:
        while not self._over():
            response = self._post(
                "/v1/workers/claim",
                {
                    "pool": self.pool,
                    "worker_id": self.worker_id,
                    "limit": 1,
                    "ahead_sec": AHEAD_SEC,
                },
            )
            received = time.monotonic()
            if response is None or response.status_code != 200:
                self.done.wait(RETRY_S)
                continue
            runs = response.json()["runs"]
            if not runs:
                self.done.wait(CLAIM_IDLE_S)
                continue
            for run in runs:
                if self._until_start(run, received):
                    self._work(run)

    def _until_start(self, run: dict[str, Any], received: float) -> bool:
        """A run leased ahead (``start_in_ms``): wait for its start by this process's monotonic
        clock from the answer's arrival, never reading the wall clock against the node's,
        checking the lease ``CHECK_S`` before it as the SDK's Worker does; False when the check
        says it was withdrawn or cancelled meanwhile."""
        start_in = run.get("start_in_ms")
        if not start_in:
            return True
        start = received + start_in / 1000
        if (wait := start - CHECK_S - time.monotonic()) > 0:
            time.sleep(wait)  # the worker's own timer: nothing else to wait on
        check = self._post(
            f"/v1/runs/{run['run_id']}/heartbeat",
            {"fencing_token": run["fencing_token"], "check": True},
        )
        if check is not None and check.status_code == 409:
            self.recorder.write(
                {"kind": "withdrawn", "run": run["run_id"], "token": run["fencing_token"],
                 "at": _ms()}
            )  # fmt: skip
            return False
        if (wait := start - time.monotonic()) > 0:
            time.sleep(wait)
        return True

    def _work(self, run: dict[str, Any]) -> None:
        key = run["idempotency_key"]
        token = run["fencing_token"]
        run_id = run["run_id"]
        self.recorder.write(
            {
                "kind": "work",
                "worker": self.worker_id,
                "run": run_id,
                "job": run["job_id"],
                "slot": int(key.rpartition(":")[2]),
                "attempt": run["attempt"],
                "token": token,
                "key": key,
                "at": _ms(),
            }
        )
        told = answer(run["payload"], key, run["attempt"])
        interval = max(0.2, float(run["lease_sec"]) / 3)
        finish = time.monotonic() + told.hold_ms / 1000
        while (left := finish - time.monotonic()) > 0:
            # The work is the wait; a worker told to stop still finishes the run in hand.
            time.sleep(min(left, interval))
            if finish - time.monotonic() <= 0:
                break
            beat = self._post(f"/v1/runs/{run_id}/heartbeat", {"fencing_token": token})
            status = beat.status_code if beat is not None else 0
            self.recorder.write(
                {"kind": "heartbeat", "run": run_id, "token": token, "status": status, "at": _ms()}
            )
            if status == 409:
                self.recorder.write({"kind": "abandon", "run": run_id, "token": token, "at": _ms()})
                return
        outcome = "succeeded" if told.status < 300 else "failed"
        for _ in range(COMPLETE_TRIES):
            done = self._post(
                f"/v1/runs/{run_id}/complete",
                {"fencing_token": token, "status": outcome, "error": f"told {told.status}"},
            )
            status = done.status_code if done is not None else 0
            self.recorder.write(
                {
                    "kind": "complete",
                    "run": run_id,
                    "token": token,
                    "outcome": outcome,
                    "status": status,
                    "at": _ms(),
                }
            )
            if status in (200, 409) or 400 <= status < 500:
                return


def main(
    worker_id: str,
    pool: str,
    nodes: list[str],
    token: str,
    record: Path,
    threads: int,
    max_seconds: float,
) -> None:
    worker = PullWorker(
        worker_id, pool, nodes, token, record, threads=threads, max_seconds=max_seconds
    )
    signal.signal(signal.SIGTERM, lambda *_: worker.done.set())
    worker.run()
