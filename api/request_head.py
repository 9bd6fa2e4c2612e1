"""Bounds on a request's head (its request line and header fields), kept before the app sees it.

uvicorn's httptools protocol bounds neither the size nor the number of header fields, and
httptools gathers each header value whole before handing it over (concatenating the pieces),
so one request with a 64 MiB header was read, answered 200, and cost the node 130 MB on the
way; nothing of cronlog runs before a request's head is complete, not even authentication.
:class:`BoundedHttpToolsProtocol` is uvicorn's protocol with the bounds that proxies keep:

- **at most** :data:`MAX_HEAD_BYTES` **of head**. Apache's ``LimitRequestLine`` and
  ``LimitRequestFieldSize`` are 8,190 bytes each; nginx's ``large_client_header_buffers`` (4
  buffers of 8 KiB) hold a head of 32 KiB, ``client_header_buffer_size`` 1 KiB before that.
  64 KiB is above both, so no head a proxy in front of the node lets through is refused here.
  Two counts keep it: the parts of the head the parser has handed over (the target, each
  complete field), and, while the head has not ended, the bytes read since it began, so at
  most this and one read of the socket (64-256 KiB) are ever held for a head that does not
  end. (A pipelined request's head that begins in the read where the request before it ends
  is counted by its parts alone until the next read: that read is not all head, and httptools
  does not say where the head began.);
- **at most** :data:`MAX_HEADER_FIELDS` **header fields**, Apache's ``LimitRequestFields``.

A request over either is answered ``431 Request Header Fields Too Large`` (RFC 6585, section 5)
and its connection closed; the app never sees it. ``cronlog serve`` passes this class to
``uvicorn.Config(http=...)``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from api.errors import ErrorBody

MAX_HEAD_BYTES = 64 * 1024
MAX_HEADER_FIELDS = 100


class HeadTooLarge(Exception):
    """Raised inside a parser callback to stop the parser at a head over its bounds."""


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol refusing, with 431, a head over :data:`MAX_HEAD_BYTES` or
    :data:`MAX_HEADER_FIELDS` header fields."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._in_head = True  # the bytes arriving belong to a head that has not ended
        self._head_bytes = 0  # read since the head began, while it has not ended
        self._head_parts = 0  # the target and the complete fields the parser handed over
        self._header_fields = 0
        self._ended_in_read = False  # a request ended within the read being parsed
        self._refusal: str | None = None

    def data_received(self, data: bytes) -> None:
        if self._refusal is not None:
            return
        # A read that would take a head past the bound is parsed only up to it: whatever
        # follows (the rest of a field too long, a line the parser would call malformed) is
        # refused for its size, whichever way the socket happened to split it.
        room = MAX_HEAD_BYTES + 1 - self._head_bytes
        if self._in_head and len(data) > room:
            self._read(data[:room])
            if self._refusal is None:  # the head ended within the bound: the rest is its own
                self._read(data[room:])
            return
        self._read(data)

    def _read(self, data: bytes) -> None:
        if not data or self._refusal is not None:
            return
        in_head, self._ended_in_read = self._in_head, False
        super().data_received(data)
        if self._refusal is not None or not (in_head and self._in_head) or self._ended_in_read:
            return  # refused in a callback, or this read is not all head
        # Counted after the parser saw the bytes, so that a read holding a head's end and a
        # body is not mistaken for a long head; httptools keeps at most this read beyond it.
        self._head_bytes += len(data)
        if self._head_bytes > MAX_HEAD_BYTES:
            self._refuse(f"the request's head is over {MAX_HEAD_BYTES} bytes")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._head_parts = 0
        self._header_fields = 0

    def on_url(self, url: bytes) -> None:
        self._head_parts += len(url)
        if self._head_parts > MAX_HEAD_BYTES:
            self._stop(f"the request's head is over {MAX_HEAD_BYTES} bytes")
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_fields += 1
        self._head_parts += len(name) + len(value) + 4  # ": " and CRLF
        if self._header_fields > MAX_HEADER_FIELDS:
            self._stop(f"the request has over {MAX_HEADER_FIELDS} header fields")
        if self._head_parts > MAX_HEAD_BYTES:
            self._stop(f"the request's head is over {MAX_HEAD_BYTES} bytes")
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head = True  # a pipelined request's head may follow in this read
        self._head_bytes = 0
        self._ended_in_read = True

    def _stop(self, refusal: str) -> None:
        self._refusal = refusal
        raise HeadTooLarge(refusal)  # the parser stops; uvicorn answers 400, see below

    def send_400_response(self, msg: str) -> None:
        # uvicorn answers every parser error with 400; a callback's refusal is ours.
        if self._refusal is not None:
            self._refuse(self._refusal)
        else:
            super().send_400_response(msg)

    def _refuse(self, message: str) -> None:
        self._refusal = message
        self.logger.info("refused a request: %s", message)
        body = msgspec.json.encode(ErrorBody(error="headers_too_large", message=message))
        head = [STATUS_LINE[431]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head += [
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"connection: close\r\n\r\n",
        ]
        self.transport.write(b"".join(head) + body)
        self.transport.close()
