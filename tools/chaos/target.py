"""The recording HTTP target: a process of its own that notes every call it receives.

``python -m tools.chaos target --port P --record calls.jsonl`` serves ``POST /hook``. Each
call is recorded as it arrives, before it is answered, and again once answered::

    {"kind": "call", "job": ..., "run": ..., "slot": <ms>, "attempt": n, "token": t,
     "key": "<job>:<slot>", "at": <ms>}
    {"kind": "answer", "key": ..., "token": t, "status": 200, "at": <ms>, "ok": true}

``ok`` is false when the answer could not be written (the caller had gone). What it answers
and how long it holds the call is the job's payload's to say (:mod:`tools.chaos.behaviour`).
Records go through :class:`tools.chaos.records.Recorder`, so they survive the target, and the
checker reads them from the file. Times are this machine's true wall clock: the target is
never run under a skewed clock, so its ``at`` is the reference for "early" and "late".
"""

from __future__ import annotations

import json
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tools.chaos.behaviour import answer
from tools.chaos.records import Recorder


def _ms() -> int:
    return time.time_ns() // 1_000_000


class _Server(ThreadingHTTPServer):
    # A herd of calls connects at once: with socketserver's backlog of 5 the kernel drops SYNs
    # and the client's retransmit makes a call a second late.
    request_queue_size = 1024
    daemon_threads = True


def serve(port: int, record: Path, max_seconds: float) -> None:
    """Serve until ``max_seconds`` have passed (the harness kills it sooner)."""
    recorder = Recorder(record)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # the harness's "is it up?"
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_POST(self) -> None:
            arrived = _ms()
            length = int(self.headers.get("Content-Length", 0))
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                body = {}
            key = self.headers.get("Idempotency-Key", "")
            token = int(self.headers.get("X-Cronlog-Fencing-Token", "-1"))
            attempt = int(self.headers.get("X-Cronlog-Attempt", "0"))
            recorder.write(
                {
                    "kind": "call",
                    "job": body.get("job_id"),
                    "run": self.headers.get("X-Cronlog-Run-Id"),
                    "slot": body.get("scheduled_for_ms"),
                    "attempt": attempt,
                    "token": token,
                    "key": key,
                    "at": arrived,
                }
            )
            told = answer(body.get("payload"), key, attempt)
            if told.hold_ms:
                time.sleep(told.hold_ms / 1000)  # the target is slow on purpose
            ok = True
            try:
                self.send_response(told.status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")
                self.wfile.flush()
            except OSError:
                ok = False
            recorder.write(
                {
                    "kind": "answer",
                    "key": key,
                    "token": token,
                    "status": told.status,
                    "at": _ms(),
                    "ok": ok,
                }
            )

        def log_message(self, *args: object) -> None:
            pass

    server = _Server(("127.0.0.1", port), Handler)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    threading.Thread(target=server.serve_forever, name="target", daemon=True).start()
    try:
        done.wait(max_seconds)
    finally:
        server.shutdown()
        server.server_close()
        recorder.close()
