"""A real HTTP target on loopback that records what it receives and answers as told."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from core.egress import EgressPolicy

# The egress policy a node needs to call these targets: loopback is refused unless allowed.
LOOPBACK_ALLOWED = EgressPolicy.build(allow=["127.0.0.0/8"])


@dataclass
class Call:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    received_at: float  # time.time()


@dataclass
class Target:
    """``answer(call) -> (status, headers, delay_s)`` decides each response."""

    answer: Callable[[Call], tuple[int, dict[str, str], float]] = lambda call: (200, {}, 0.0)
    calls: list[Call] = field(default_factory=list)
    _cv: threading.Condition = field(default_factory=threading.Condition)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}/hook"

    def start(self) -> Target:
        target = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                call = Call(
                    self.path,
                    dict(self.headers.items()),
                    json.loads(self.rfile.read(length) or b"null"),
                    time.time(),
                )
                status, headers, delay = target.answer(call)
                with target._cv:
                    target.calls.append(call)
                    target._cv.notify_all()
                if delay:
                    time.sleep(delay)  # the target is slow on purpose
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def wait_for(self, n: int, timeout_s: float) -> list[Call]:
        """Block until ``n`` calls arrived (or the timeout passed); return the calls so far."""
        return self.wait_until(lambda calls: len(calls) >= n, timeout_s)

    def wait_until(self, done: Callable[[list[Call]], bool], timeout_s: float) -> list[Call]:
        """Block until ``done(calls)`` holds (or the timeout passed); return the calls so far."""
        with self._cv:
            self._cv.wait_for(lambda: done(self.calls), timeout_s)
            return list(self.calls)
