"""What nodes send each other through the log: requests on the commands stream, and replies.

A request is a command wrapped with who asked (``reply_to``) and a request id; the owner of the
partition decides it and, once the events are durable, sends a :class:`Reply` to the asking
node's mailbox. A request may instead carry a :class:`Query`, a question about the partition's
history (``node.history_reader``) for its owner, where that history is kept with the partition;
the reply's ``answer`` is the answer's JSON. Both are JSON, like events.
"""

from __future__ import annotations

from typing import Any

import msgspec

from core import errors
from core.commands import AnyCommand
from core.events import AnyEvent


class Query(msgspec.Struct, frozen=True, kw_only=True):
    """A question for the partition's history: its name and arguments (``QUESTIONS`` of
    :mod:`node.history_reader`), answered once the history has folded past ``after`` (the
    asking node's last write to the partition; -1: none)."""

    name: str
    args: list[Any]
    after: int = -1
    asked_at: int = 0  # the asker's wall clock, ms (0: not said)


class Envelope(msgspec.Struct, frozen=True, kw_only=True):
    command: AnyCommand | None = None  # None: a query
    query: Query | None = None
    request_id: str | None = None
    reply_to: str | None = None  # the node waiting for the outcome


class Reply(msgspec.Struct, frozen=True, kw_only=True):
    request_id: str
    events: list[AnyEvent] = []
    offsets: list[int] = []
    error: str | None = None  # the core.errors class name of a refusal
    message: str = ""
    field: str | None = None  # of an InvalidDefinition
    answer: msgspec.Raw = msgspec.Raw(b"null")  # a query's, as JSON


_envelopes = msgspec.json.Decoder(Envelope)
_replies = msgspec.json.Decoder(Reply)
_encoder = msgspec.json.Encoder()

_REFUSALS: dict[str, type[errors.CronlogError]] = {
    cls.__name__: cls
    for cls in (
        errors.NotFound,
        errors.Conflict,
        errors.LeaseLost,
        errors.Fenced,
        errors.Unavailable,
        errors.HistoryRefilling,
        errors.HistoryMoved,
        errors.CronlogError,
    )
}


def encode(message: Envelope | Reply) -> bytes:
    return _encoder.encode(message)


def decode_envelope(data: bytes) -> Envelope:
    return _envelopes.decode(data)


def decode_reply(data: bytes) -> Reply:
    return _replies.decode(data)


def refusal(request_id: str, err: errors.CronlogError) -> Reply:
    field = err.field if isinstance(err, errors.InvalidDefinition) else None
    message = err.message if isinstance(err, errors.InvalidDefinition) else str(err)
    return Reply(request_id=request_id, error=type(err).__name__, message=message, field=field)


def error_of(reply: Reply) -> errors.CronlogError | None:
    """The refusal a reply carries, rebuilt as the error the owner raised (or None)."""
    if reply.error is None:
        return None
    if reply.error == "InvalidDefinition":
        return errors.InvalidDefinition(reply.field or "request", reply.message)
    return _REFUSALS.get(reply.error, errors.CronlogError)(reply.message)
