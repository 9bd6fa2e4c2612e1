"""The local log server's wire: what a worker asks of the parent's log, and the answers.

A frame is a 4-byte big-endian length and a msgpack message (msgspec, as
``node.call_process``'s wire). Every message is a tagged, array-like struct whose first field is
the request's id, which its answer repeats. Records travel a batch to a frame, each as the
port's :class:`eventlog.port.Record` (a map of its four fields): msgspec writes the dataclass and
builds it again in C, 0.2 µs a record, where building a frozen dataclass in Python from an array
costs 0.5 µs. An error crosses as :class:`Failed`, naming its ``core.errors`` class, and
:func:`raised` makes it that class again on the client's side.

One connection carries one request at a time (see :mod:`eventlog.log_server` for why), so the
id is a check that an answer belongs to its question, not a way to match answers out of order.
"""

from __future__ import annotations

import struct
from typing import BinaryIO

import msgspec

from core.errors import (
    Conflict,
    CronlogError,
    Fenced,
    LeaseLost,
    LogCorrupted,
    NotFound,
    Pruned,
    StoreDamaged,
    Unavailable,
)
from eventlog.port import Record

VERSION = 1
MAX_FRAME = 1 << 26  # 64 MiB: a read of 1,000 records is well under a megabyte
_LENGTH = struct.Struct(">I")


# -- requests -------------------------------------------------------------------------------


class Hello(msgspec.Struct, tag="hello", array_like=True):
    id: int
    version: int


class Submit(msgspec.Struct, tag="sub", array_like=True):
    id: int
    partition: int
    value: bytes
    key: bytes | None


class Read(msgspec.Struct, tag="read", array_like=True):
    id: int
    stream: str
    partition: int
    from_offset: int
    max_records: int
    timeout_s: float


class EndOffset(msgspec.Struct, tag="end", array_like=True):
    id: int
    stream: str
    partition: int


class StartOffset(msgspec.Struct, tag="start", array_like=True):
    id: int
    stream: str
    partition: int


class SendReply(msgspec.Struct, tag="reply", array_like=True):
    id: int
    node_id: str
    value: bytes


class OpenMailbox(msgspec.Struct, tag="box", array_like=True):
    """Makes its connection the mailbox of ``node_id`` until the connection closes."""

    id: int
    node_id: str


class PollMailbox(msgspec.Struct, tag="mail", array_like=True):
    id: int
    timeout_s: float


class Join(msgspec.Struct, tag="join", array_like=True):
    """Makes its connection the member's session: the member leaves when it closes."""

    id: int
    member_id: str


class Leave(msgspec.Struct, tag="leave", array_like=True):
    id: int


class Poll(msgspec.Struct, tag="poll", array_like=True):
    id: int
    handle: int
    timeout_s: float
    max_records: int


class Renew(msgspec.Struct, tag="renew", array_like=True):
    id: int
    handle: int
    partition: int


class Append(msgspec.Struct, tag="app", array_like=True):
    id: int
    partition: int
    token: int
    events: list[bytes]
    commands_through: int | None


class WaitReadable(msgspec.Struct, tag="settle", array_like=True):
    id: int
    partition: int
    token: int


class CommandPosition(msgspec.Struct, tag="pos", array_like=True):
    id: int
    partition: int


class CloseWriter(msgspec.Struct, tag="close", array_like=True):
    id: int
    partition: int
    token: int


class Members(msgspec.Struct, tag="members", array_like=True):
    id: int


Request = (
    Hello
    | Submit
    | Read
    | EndOffset
    | StartOffset
    | SendReply
    | OpenMailbox
    | PollMailbox
    | Join
    | Leave
    | Poll
    | Renew
    | Append
    | WaitReadable
    | CommandPosition
    | CloseWriter
    | Members
)


# -- answers --------------------------------------------------------------------------------


class Welcome(msgspec.Struct, tag="welcome", array_like=True):
    id: int
    version: int
    num_partitions: int
    readable_on_return: bool  # appends are readable when they return: no need to ask


class Offsets(msgspec.Struct, tag="offsets", array_like=True):
    id: int
    offsets: list[int]


class Number(msgspec.Struct, tag="n", array_like=True):
    id: int
    value: int


class Records(msgspec.Struct, tag="records", array_like=True):
    id: int
    records: list[Record]


class Mail(msgspec.Struct, tag="replies", array_like=True):
    id: int
    replies: list[bytes]


class Done(msgspec.Struct, tag="done", array_like=True):
    id: int


class Joined(msgspec.Struct, tag="joined", array_like=True):
    id: int
    handle: int


class Polled(msgspec.Struct, tag="polled", array_like=True):
    id: int
    revoked: list[int]
    assigned: list[tuple[int, int]]  # partition, its writer's token
    records: list[Record]
    gone: bool


class Assignment(msgspec.Struct, tag="assignment", array_like=True):
    id: int
    members: dict[str, list[int]]  # live member id -> the partitions it is to own


class Failed(msgspec.Struct, tag="failed", array_like=True):
    id: int
    kind: str
    message: str
    stream: str | None = None
    partition: int | None = None
    offset: int | None = None
    file: str | None = None
    start: int | None = None


Answer = Welcome | Offsets | Number | Records | Mail | Done | Joined | Polled | Assignment | Failed

encoder = msgspec.msgpack.Encoder()
requests = msgspec.msgpack.Decoder(Request)
answers = msgspec.msgpack.Decoder(Answer)


# -- frames ---------------------------------------------------------------------------------


def frame(message: Request | Answer) -> bytearray:
    """The message as one frame, encoded in place behind its length (one buffer, one send)."""
    buffer = bytearray(_LENGTH.size)
    encoder.encode_into(message, buffer, _LENGTH.size)
    _LENGTH.pack_into(buffer, 0, len(buffer) - _LENGTH.size)
    return buffer


def read_frame(stream: BinaryIO) -> bytes | None:
    """The next frame's message from a buffered socket file; None when the other end closed
    between frames. A frame cut short or too long raises ``ConnectionError``."""
    header = stream.read(_LENGTH.size)
    if not header:
        return None
    if len(header) < _LENGTH.size:
        raise ConnectionError("connection closed inside a frame's length")
    (length,) = _LENGTH.unpack(header)
    if length > MAX_FRAME:
        raise ConnectionError(f"a frame of {length} bytes is over the limit of {MAX_FRAME}")
    payload = stream.read(length)
    if len(payload) < length:
        raise ConnectionError(f"connection closed inside a frame ({len(payload)} of {length})")
    return payload


# -- errors ---------------------------------------------------------------------------------

# Errors whose constructor takes the message alone; Pruned and LogCorrupted carry fields.
_PLAIN: dict[str, type[Exception]] = {
    cls.__name__: cls
    for cls in (CronlogError, NotFound, Conflict, LeaseLost, Fenced, Unavailable, StoreDamaged)
}
_PLAIN["ValueError"] = ValueError


def failure(request_id: int, exc: BaseException) -> Failed:
    """``exc`` as an answer: its own class when the client knows it, else its nearest base
    the client knows (a log error the client has no class for is still a ``CronlogError``)."""
    match exc:
        case Pruned():
            return Failed(
                request_id,
                "Pruned",
                str(exc),
                stream=exc.stream,
                partition=exc.partition,
                start=exc.start,
            )
        case LogCorrupted():
            return Failed(
                request_id,
                "LogCorrupted",
                str(exc),
                stream=exc.stream,
                partition=exc.partition,
                offset=exc.offset,
                file=exc.file,
            )
    for cls in type(exc).__mro__:
        if _PLAIN.get(cls.__name__) is cls:
            return Failed(request_id, cls.__name__, str(exc))
    return Failed(request_id, "CronlogError", f"the log server failed: {exc!r}")


def raised(failed: Failed) -> Exception:
    """The exception ``failed`` describes, to raise on the client's side."""
    if failed.kind == "Pruned":
        return Pruned(
            failed.message,
            stream=failed.stream or "",
            partition=failed.partition if failed.partition is not None else -1,
            start=failed.start if failed.start is not None else 0,
        )
    if failed.kind == "LogCorrupted":
        return LogCorrupted(
            failed.message,
            stream=failed.stream,
            partition=failed.partition,
            offset=failed.offset,
            file=failed.file,
        )
    return _PLAIN.get(failed.kind, CronlogError)(failed.message)
