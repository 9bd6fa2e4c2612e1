"""The herd's target: an HTTP/1.1 server in a process of its own that notes when each call arrives.

    python -m bench.recorder [--port 0]        # prints the port it listens on, then serves

Every request is answered ``200`` with an empty body at once (keep-alive, pipelining
tolerated), except one to ``/hold/<ms>``, answered that many milliseconds after it arrived: a
target whose calls take a while, holding the caller's connection meanwhile. For each request
it keeps ``(arrival ns, key)``: the key is the ``Idempotency-Key`` header, which cronlog sends
as ``<tenant>/<job id>:<slot ms>`` and which the floor client and the APScheduler peer send in
the same form, so a call's start lag (arrival - slot) is read from the call itself and
repeated attempts of one slot are told apart from first calls. The arrival time is taken once
per read from the socket (a read may hold several requests): a few microseconds of error
against a recording that costs nothing.

Control, on the same port (never a job's path):

* ``GET /_bench/count``: how many calls have arrived since the last take;
* ``POST /_bench/take``: every ``"<ns> <key>"`` line since the last take, and forget them.

It is written on plain asyncio (no uvloop) on purpose: the floor and every peer call the same
recorder, so it must not change when the product's dependencies do.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import time

MAX_HEAD = 64 * 1024
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
BAD = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class Arrivals:
    def __init__(self) -> None:
        self.times: list[int] = []
        self.keys: list[bytes] = []
        self.refused = 0  # requests this server could not read (chunked bodies, huge heads)

    def take(self) -> bytes:
        lines = b"".join(
            b"%d %s\n" % (at, key) for at, key in zip(self.times, self.keys, strict=True)
        )
        self.times, self.keys = [], []
        return lines


class Recorder(asyncio.Protocol):
    def __init__(self, arrivals: Arrivals) -> None:
        self._arrivals = arrivals
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        at = time.time_ns()
        buffer = self._buffer
        buffer += data
        out = []
        while True:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(buffer) > MAX_HEAD:
                    self._refuse()
                    return
                break
            head = bytes(buffer[:end])
            length = 0
            key = b"-"
            lines = head.split(b"\r\n")
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    length = int(value)
                elif name == b"idempotency-key":
                    key = value.strip().replace(b" ", b"_")
                elif name == b"transfer-encoding":
                    self._refuse()
                    return
            if len(buffer) < end + 4 + length:
                break  # the body is still on its way
            body = bytes(buffer[end + 4 : end + 4 + length])
            del buffer[: end + 4 + length]
            request_line = lines[0]
            if request_line.startswith(b"GET /_bench/count"):
                count = str(len(self._arrivals.times)).encode()
                out.append(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(count), count))
            elif request_line.startswith(b"POST /_bench/take"):
                lines_out = self._arrivals.take()
                out.append(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(lines_out))
                out.append(lines_out)
            else:
                del body  # drained, not kept
                self._arrivals.times.append(at)
                self._arrivals.keys.append(key)
                hold = _held_ms(request_line)
                if hold and self._transport is not None:
                    # Answered later, in order: nothing else is written meanwhile (callers do
                    # not pipeline behind a call that has not answered).
                    if out:
                        self._transport.write(b"".join(out))
                        out = []
                    loop = asyncio.get_running_loop()
                    loop.call_later(hold / 1000, self._answer_held)
                else:
                    out.append(OK)
        if out and self._transport is not None:
            self._transport.write(b"".join(out))

    def _answer_held(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(OK)

    def _refuse(self) -> None:
        self._arrivals.refused += 1
        if self._transport is not None:
            self._transport.write(BAD)
            self._transport.close()


def _held_ms(request_line: bytes) -> int:
    """The hold a ``<METHOD> /hold/<ms> HTTP/1.1`` line asks for (0: none)."""
    parts = request_line.split(b" ")
    if len(parts) < 2 or not parts[1].startswith(b"/hold/"):
        return 0
    ms = parts[1][len(b"/hold/") :].split(b"?")[0]
    return int(ms) if ms.isdigit() else 0


def _raise_open_files() -> None:
    """Held calls keep their connections open: take every descriptor the system allows."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def serve(port: int) -> None:
    _raise_open_files()
    arrivals = Arrivals()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: Recorder(arrivals), "127.0.0.1", port, backlog=4096, reuse_address=True
    )
    print(server.sockets[0].getsockname()[1], flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0)
    asyncio.run(serve(parser.parse_args().port))


if __name__ == "__main__":
    main()
