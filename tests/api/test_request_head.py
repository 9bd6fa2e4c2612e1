"""A request's head is bounded before the app sees it (``api/request_head.py``): over 64 KiB or
100 header fields is a 431 and a closed connection, and the app is never called.

The server is uvicorn with the protocol ``cronlog serve`` gives it, over a real socket: the
bound is on bytes as they arrive, which only a socket shows."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import msgspec
import pytest
import uvicorn
from starlette.types import Receive, Scope, Send

from api.request_head import MAX_HEAD_BYTES, MAX_HEADER_FIELDS, BoundedHttpToolsProtocol

called: list[str] = []


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    size = 0
    while True:
        message = await receive()
        size += len(message.get("body", b""))
        if not message.get("more_body"):
            break
    called.append(scope["path"])
    body = b"%d" % size
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, http=BoundedHttpToolsProtocol, lifespan="off", log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    yield sock.getsockname()[1]
    server.should_exit = True
    thread.join(10)
    sock.close()


def head(*fields: bytes, path: bytes = b"/", last: bool = True) -> bytes:
    """A GET's head without its final blank line: two fields (Host, Connection) and
    ``fields``; the last request of a connection asks the server to close it."""
    connection = b"close" if last else b"keep-alive"
    start = b"GET " + path + b" HTTP/1.1\r\nHost: x\r\nConnection: " + connection + b"\r\n"
    return start + b"".join(f + b"\r\n" for f in fields)


def ask(port: int, *pieces: bytes) -> list[bytes]:
    """Send ``pieces`` one by one (stopping where the server closed) and read what it said:
    each answer's status line."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        for piece in pieces:
            try:
                conn.sendall(piece)
            except OSError:  # closed by the server: what it answered is still to be read
                break
        answer = b""
        try:
            while chunk := conn.recv(65536):
                answer += chunk
        except ConnectionResetError:
            pass
    return [line for line in answer.split(b"\r\n") if line.startswith(b"HTTP/1.1 ")]


def test_a_64_mib_header_is_refused_after_a_little_of_it(port: int) -> None:
    called.clear()
    chunk = b"a" * (1024 * 1024)
    statuses = ask(port, head(b"X-Big: "), *([chunk] * 64), b"\r\n\r\n")
    assert statuses == [b"HTTP/1.1 431 Request Header Fields Too Large"]
    assert called == []
    assert ask(port, head(path=b"/after") + b"\r\n") == [b"HTTP/1.1 200 OK"]  # still serving


def test_the_refusal_says_why_as_every_api_error_does(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(head(b"X-Big: " + b"a" * MAX_HEAD_BYTES) + b"\r\n")
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    status, _, body = answer.partition(b"\r\n\r\n")
    assert b"connection: close" in status
    assert msgspec.json.decode(body) == {
        "error": "headers_too_large",
        "message": f"the request's head is over {MAX_HEAD_BYTES} bytes",
    }


def test_a_head_just_under_the_bound_is_served(port: int) -> None:
    request = head(b"X-Big: " + b"a" * (MAX_HEAD_BYTES - 200)) + b"\r\n"
    assert len(request) < MAX_HEAD_BYTES
    assert ask(port, request) == [b"HTTP/1.1 200 OK"]


def test_a_head_over_the_bound_in_small_pieces_is_refused(port: int) -> None:
    called.clear()
    statuses = ask(port, head(b"X-Big: " + b"a" * 1000), *[b"b" * 1000] * 100, b"\r\n\r\n")
    assert statuses == [b"HTTP/1.1 431 Request Header Fields Too Large"]
    assert called == []


def test_a_head_over_the_bound_is_refused_for_its_size_in_one_read_too(port: int) -> None:
    # The same head sent whole, so that reads bring its malformed end together with the bytes
    # that take it over the bound: still refused for its size (431), not as malformed (400).
    called.clear()
    whole = head(b"X-Big: " + b"a" * 1000) + b"b" * 100_000 + b"\r\n\r\n"
    for _ in range(5):
        assert ask(port, whole) == [b"HTTP/1.1 431 Request Header Fields Too Large"]
    assert called == []


@pytest.mark.parametrize(
    ("fields", "status"),
    [
        (MAX_HEADER_FIELDS - 2, b"HTTP/1.1 200 OK"),  # with Host and Connection: the bound
        (MAX_HEADER_FIELDS - 1, b"HTTP/1.1 431 Request Header Fields Too Large"),
        (100_000, b"HTTP/1.1 431 Request Header Fields Too Large"),
    ],
)
def test_header_fields_are_counted(port: int, fields: int, status: bytes) -> None:
    called.clear()
    request = head(*(b"X-H%d: v" % i for i in range(fields))) + b"\r\n"
    assert ask(port, request) == [status]
    assert called == ([] if status.endswith(b"Large") else ["/"])


def test_a_body_is_not_counted_as_head(port: int) -> None:
    body = b"x" * (4 * MAX_HEAD_BYTES)
    request = head(b"Content-Length: %d" % len(body)).replace(b"GET", b"POST") + b"\r\n"
    assert ask(port, request + body) == [b"HTTP/1.1 200 OK"]  # one read: head, then body


def test_each_request_on_a_connection_has_its_own_bound(port: int) -> None:
    big = head(b"X-Big: " + b"a" * (MAX_HEAD_BYTES * 3 // 4), last=False) + b"\r\n"
    many = head(*(b"X-H%d: v" % i for i in range(MAX_HEADER_FIELDS - 2)), last=False) + b"\r\n"
    statuses = ask(port, big, big, many, many.replace(b"keep-alive", b"close"))
    assert statuses == [b"HTTP/1.1 200 OK"] * 4


def test_a_long_head_after_a_request_on_the_same_connection_is_refused(port: int) -> None:
    first = head(path=b"/first", last=False) + b"\r\n"
    chunk = b"a" * (256 * 1024)
    statuses = ask(port, first, head(b"X-Big: "), *([chunk] * 16), b"\r\n\r\n")
    assert statuses == [b"HTTP/1.1 200 OK", b"HTTP/1.1 431 Request Header Fields Too Large"]
