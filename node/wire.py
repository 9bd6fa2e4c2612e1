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


class Query(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A question for the partition's history: its name and arguments (``QUESTIONS`` of
    :mod:`node.history_reader`), answered once the history has folded past ``after`` (the
    asking node's last write to the partition; -1: none)."""

    name: str
    args: list[Any]
    after: int = -1
    asked_at: int = 0  # the asker's wall clock, ms (0: not said)
    # Other partitions the asker believes the same node owns, each with the asker's last write
    # to it: one question for every partition of an owner (a team's listings and sums), each
    # answered in the reply's ``answers`` or refused in its ``refused``.
    also: dict[int, int] = {}


class Refused(msgspec.Struct, frozen=True, kw_only=True):
    """One partition of a question asked of several that could not be answered: the
    ``core.errors`` class name (``HistoryMoved``: not owned by the answering node) and why."""

    error: str
    message: str = ""


class Envelope(msgspec.Struct, frozen=True, kw_only=True):
    command: AnyCommand | None = None  # None: a query
    query: Query | None = None
    request_id: str | None = None
    reply_to: str | None = None  # the node waiting for the outcome
    # Commands of the same partition decided after ``command``, in order, and answered in the
    # same reply's ``more`` (a batch of heartbeats or completions asked of another owner: one
    # record and one reply, not one of each a command). An owner built before ``more`` decides
    # ``command`` alone and replies without ``more``; the asker then sends the rest one by one.
    more: list[AnyCommand] = []


class Outcome(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What one command of a request's ``more`` came to: its events and their offsets, or a
    refusal named as a :class:`Reply` names one."""

    events: list[AnyEvent] = []
    offsets: list[int] = []
    error: str | None = None  # the core.errors class name of a refusal
    message: str = ""
    field: str | None = None  # of an InvalidDefinition


class Reply(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    request_id: str
    events: list[AnyEvent] = []
    offsets: list[int] = []
    error: str | None = None  # the core.errors class name of a refusal
    message: str = ""
    field: str | None = None  # of an InvalidDefinition
    answer: msgspec.Raw = msgspec.Raw(b"null")  # a query's, as JSON
    by: str = ""  # the answering node (a query's): where to ask about its partitions next
    answers: dict[int, msgspec.Raw] = {}  # a query's ``also``, and its own partition, each
    refused: dict[int, Refused] = {}  # the partitions of such a query left unanswered
    more: list[Outcome] = []  # the outcomes of the request's ``more``, in order


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
    return answered(request_id, [outcome(err)])


def outcome(result: errors.CronlogError | tuple[list[AnyEvent], list[int]]) -> Outcome:
    """One command's outcome: a refusal, or the events it decided and their offsets."""
    if isinstance(result, errors.CronlogError):
        field = result.field if isinstance(result, errors.InvalidDefinition) else None
        message = result.message if isinstance(result, errors.InvalidDefinition) else str(result)
        return Outcome(error=type(result).__name__, message=message, field=field)
    events, offsets = result
    return Outcome(events=events, offsets=offsets)


def answered(request_id: str, outcomes: list[Outcome]) -> Reply:
    """The reply to a request of several commands: the first's outcome in the reply's own
    fields (all an owner built before ``more`` would send), the others in ``more``."""
    first, *more = outcomes
    return Reply(request_id=request_id, more=more, **msgspec.structs.asdict(first))


def outcomes(reply: Reply) -> list[Outcome]:
    """Each command's outcome, in the order they were asked (the first's alone when the
    owner predates ``more``)."""
    first = Outcome(**{name: getattr(reply, name) for name in Outcome.__struct_fields__})
    return [first, *reply.more]


def error_of(reply: Reply | Outcome) -> errors.CronlogError | None:
    """The refusal a reply (or one outcome of it) carries, rebuilt as the error the owner
    raised (or None)."""
    if reply.error is None:
        return None
    if reply.error == "InvalidDefinition":
        return errors.InvalidDefinition(reply.field or "request", reply.message)
    return _REFUSALS.get(reply.error, errors.CronlogError)(reply.message)


def refused(err: errors.CronlogError) -> Refused:
    return Refused(error=type(err).__name__, message=str(err))


def error_of_refused(part: Refused) -> errors.CronlogError:
    """One partition's refusal of a question asked of several, as the error the owner raised."""
    return _REFUSALS.get(part.error, errors.CronlogError)(part.message)
