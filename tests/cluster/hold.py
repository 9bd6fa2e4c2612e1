"""A target that holds every call open and notes when the caller hangs up."""

from __future__ import annotations

import select
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class HoldingTarget:
    """Answers 200 after ``hold_s`` unless the caller closes the connection first; ``hung_up``
    is set (and ``hung_up_at`` is its ``time.time()``) when one does, ``answered`` when a call
    was answered."""

    def __init__(self, hold_s: float = 10.0) -> None:
        self.hold_s = hold_s
        self.received = threading.Event()
        self.received_at = 0.0
        self.hung_up = threading.Event()
        self.hung_up_at = 0.0
        self.answered = threading.Event()  # set once a call was answered 200
        target = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                target.received_at = time.time()
                target.received.set()
                deadline = time.monotonic() + target.hold_s
                while time.monotonic() < deadline:
                    # Readable with nothing to read: the caller closed its end.
                    readable, _, _ = select.select([self.connection], [], [], 0.05)
                    if readable and not self.connection.recv(1, socket.MSG_PEEK):
                        target.hung_up_at = time.time()
                        target.hung_up.set()
                        return
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()
                target.answered.set()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}/hook"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
