"""The recording HTTP target: a process of its own that notes every call it receives.

``python -m tools.chaos target --port P --record calls.jsonl --guard-secret S`` serves
``POST /hook``, ``POST /guarded`` and ``GET /cronlog/status``. Each call is recorded as it
arrives, before it is answered, and again once answered::

    {"kind": "call", "job": ..., "run": ..., "slot": <ms>, "attempt": n, "token": t,
     "key": "<job>:<slot>", "at": <ms>}
    {"kind": "answer", "key": ..., "token": t, "status": 200, "at": <ms>, "ok": true}

``ok`` is false when the answer could not be written (the caller had gone). What it answers
and how long it holds the call is the job's payload's to say (:mod:`tools.chaos.behaviour`).
Records go through :class:`tools.chaos.records.Recorder`, so they survive the target, and the
checker reads them from the file. Times are this machine's true wall clock: the target is
never run under a skewed clock, so its ``at`` is the reference for "early" and "late".

**The guarded path.** ``/guarded`` is the same handling behind the SDK's real
:class:`cronlog_client.target.RunGuard` (the workload's guarded critical jobs call it, and
name ``/cronlog/status`` as their ``status_url``): its call record says what the guard decided
(``"guard": "proceed" | "replay" | "stale" | "busy" | "invalid"``); only ``proceed`` runs the
behaviour, whose status ends the handling (``finish``, a success kept) whether or not the
answer could still be written: the work was done, even if cronlog had given up on the call.
The others are answered as the guard says (a replay of the kept answer, 409, 503, 400).
Each ask at the status path is recorded with the guard's answer::

    {"kind": "status", "key": K, "token": T, "outcome": "never_seen", "status": null,
     "at": <ms>, "authorized": true}

(``outcome`` null when the ask was refused: unauthorized, 401). Asks are authorized as the SDK
offers, :func:`cronlog_client.target.bearer_token`: the jobs send the secret in their target's
headers (a secret reference, which the nodes read from their secrets directories). Each
decision of the guard and its record are made under one lock, so the records of ``/guarded``
calls and asks are in the order the guard decided them (the checker's ``fence_broken`` reads
that order). The guard keeps its state in memory (:class:`MemoryStore`): the target process
lives through the whole run (no fault touches it), so nothing it keeps is lost before the
checker reads the records.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from cronlog_client.target import ASK_KEY, ASK_TOKEN, Decision, Reply, RunGuard, bearer_token

from tools.chaos.behaviour import answer
from tools.chaos.records import Recorder

HOOK = "/hook"
GUARDED = "/guarded"
STATUS = "/cronlog/status"


def _ms() -> int:
    return time.time_ns() // 1_000_000


class _Server(ThreadingHTTPServer):
    # A herd of calls connects at once: with socketserver's backlog of 5 the kernel drops SYNs
    # and the client's retransmit makes a call a second late.
    request_queue_size = 1024
    daemon_threads = True


def serve(port: int, record: Path, max_seconds: float, guard_secret: str = "") -> None:
    """Serve until ``max_seconds`` have passed (the harness kills it sooner). Without a
    ``guard_secret`` every ask is refused (401)."""
    recorder = Recorder(record)
    guard = RunGuard()
    authorize = bearer_token(guard_secret) if guard_secret else (lambda _headers: False)
    deciding = threading.Lock()  # a guard's decision and its record, in one order

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] == STATUS:
                self._status()
                return
            self._send(200, b"")  # the harness's "is it up?"

        def _status(self) -> None:
            headers = dict(self.headers.items())
            lower = {k.lower(): v for k, v in headers.items()}
            token = lower.get(ASK_TOKEN, "")
            ok = authorize(headers)
            outcome = status = None
            with deciding:
                if ok:
                    reply = guard.answer(headers)
                    if reply.status == 200:
                        said = json.loads(reply.body)
                        outcome, status = said.get("outcome"), said.get("status")
                else:
                    reply = Reply.json({"error": "unauthorized"}, 401)
                recorder.write(
                    {
                        "kind": "status",
                        "key": lower.get(ASK_KEY, ""),
                        "token": int(token) if token.isdigit() else -1,
                        "outcome": outcome,
                        "status": status,
                        "at": _ms(),
                        "authorized": ok,
                    }
                )
            self._send(reply.status, reply.body, reply.headers)

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
            call: dict[str, Any] = {
                "kind": "call",
                "job": body.get("job_id"),
                "run": self.headers.get("X-Cronlog-Run-Id"),
                "slot": body.get("scheduled_for_ms"),
                "attempt": attempt,
                "token": token,
                "key": key,
                "at": arrived,
            }
            if self.path.split("?")[0] != GUARDED:
                recorder.write(call)
                status = self._handle(body, key, attempt)
                ok = self._send(status, b"ok")
            else:
                with deciding:
                    admission = guard.admit(dict(self.headers.items()))
                    recorder.write({**call, "guard": admission.decision.value})
                if admission.decision in (Decision.PROCEED, Decision.UNTRACKED):
                    status = self._handle(body, key, attempt)
                    # Ended by the behaviour's status: done, whether or not the caller waited.
                    guard.finish(admission, Reply(status, b"ok"))
                    ok = self._send(status, b"ok")
                else:
                    assert admission.reply is not None
                    status = admission.reply.status
                    ok = self._send(status, admission.reply.body, admission.reply.headers)
            recorder.write(
                {
                    "kind": "answer",
                    "key": key,
                    "token": token,
                    "status": status,
                    "at": _ms(),
                    "ok": ok,
                }
            )

        def _handle(self, body: dict[str, Any], key: str, attempt: int) -> int:
            told = answer(body.get("payload"), key, attempt)
            if told.hold_ms:
                time.sleep(told.hold_ms / 1000)  # the target is slow on purpose
            return told.status

        def _send(
            self, status: int, body: bytes, headers: tuple[tuple[bytes, bytes], ...] = ()
        ) -> bool:
            try:
                self.send_response(status)
                for name, value in headers:
                    if name.lower() != b"content-length":
                        self.send_header(name.decode("latin-1"), value.decode("latin-1"))
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                self.wfile.flush()
            except OSError:
                return False
            return True

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
