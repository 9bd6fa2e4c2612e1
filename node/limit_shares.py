"""The node's side of its teams' limits across the cluster (``core.shares``): asking each team's
owner for this node's shares once a period, and answering the asks of the teams it owns.

A team's owner is the owner of the partition the team's name hashes to. An ask travels like a
history question: a record on that partition's commands (a :class:`~node.wire.Query` named
``"shares"``, the asks as its argument), answered into the asking node's mailbox with the
shares in order. One record a period for each owning partition of the teams the node served
lately, whatever the number of requests. A team whose partition this node owns is answered
here, without the log; a node that owns every partition asks nobody (its shares are whole).

An ask left unanswered for the period (the owner moving, the log slow) changes nothing: the
node keeps the shares it has and asks again at the next period, the new owner then.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from core.errors import CronlogError
from core.shares import PERIOD_MS, Ask, ShareBook, Shares, tenant_of
from eventlog.port import partition_for
from node import wire
from node.worker import PeriodicWorker

log = logging.getLogger(__name__)

QUERY = "shares"  # the question's name on the commands stream
ANSWER_WITHIN = 0.8  # of a period: an ask not answered by then is counted unanswered
URGENT_GAP_S = 0.1  # asks that cannot wait for the period go out at most this often
# An ask read this long after it was made (by the asker's clock: a new owner reading the
# commands again after a takeover) is passed over: its asker asked again since, and an old
# ask's wants would stand in the book for a member until its next one.
STALE_MS = 10_000
_asks = msgspec.json.Decoder(list[Ask])


def asks_of(query: wire.Query) -> list[Ask]:
    """The asks a ``shares`` question carries (``msgspec.ValidationError``: malformed)."""
    if len(query.args) != 1:
        raise msgspec.ValidationError("a shares question has one argument, its asks")
    return msgspec.convert(query.args[0], list[Ask])


def answer(book: ShareBook, member: str, query: wire.Query, now_ms: int) -> msgspec.Raw:
    """The owner's answer to a member's ``shares`` question: its shares, in the asks' order."""
    return msgspec.Raw(msgspec.json.encode(book.grant(member, asks_of(query), now_ms)))


@dataclass(slots=True)
class _Pending:
    """An ask sent through the log: until when its answer is awaited, and whether it came."""

    expires: float
    answered: threading.Event = field(default_factory=threading.Event)
    stop_waiting: Callable[[], None] = lambda: None


class ShareAsking(PeriodicWorker):
    """Once a period: this node's asks, to each team's owner; the grants, into its shares; and
    at once, the asks of counts waiting for their first grant (``Shares.first_grant``).

    ``ask(partition, query, on_reply)`` sends a question to a partition's owner and calls
    ``on_reply`` with its reply (from the mailbox thread); it returns a function that stops
    waiting for it. ``owned()`` are the partitions this node owns."""

    _thread_name = "limit-shares"

    def __init__(
        self,
        member: str,
        shares: Shares,
        book: ShareBook,
        *,
        num_partitions: int,
        owned: Callable[[], frozenset[int]],
        ask: Callable[[int, wire.Query, Callable[[wire.Reply], None]], Callable[[], None]],
        now_ms: Callable[[], int],
        wall_ms: Callable[[], int],
        on_failed: Callable[[], None] = lambda: None,
        on_unanswered: Callable[[int], None] = lambda n: None,
        period_ms: int = PERIOD_MS,
    ) -> None:
        self._member = member
        self._shares = shares
        self._book = book
        self._num_partitions = num_partitions
        self._owned = owned
        self._ask = ask
        self._now_ms = now_ms
        self._wall_ms = wall_ms
        self._on_failed = on_failed
        self._period_ms = period_ms
        self.unanswered = 0  # asks of a period whose answer did not come within it
        self._on_unanswered = on_unanswered
        self._woken = threading.Event()
        self._pending: list[_Pending] = []  # asks sent, waiting for their answers
        self._silent = False  # the last ask that ended went unanswered

    def _interval_s(self) -> float:
        return self._period_ms / 1000.0

    def _failed(self) -> None:
        self._on_failed()
        log.exception("%s: asking for the teams' limit shares failed", self._member)

    def start(self) -> None:
        self._woken = threading.Event()
        self._shares.asks_now_with(self._woken.set)
        super().start()

    def _wake(self) -> None:
        self._woken.set()

    def _work(self) -> None:
        """A pass every period; between them, at once (at most every ``URGENT_GAP_S``), the
        asks of counts that cannot wait for the period: a first share a request waits for, a
        holding given up, a refusal, a share that moved. The thread never waits for answers:
        they arrive on the mailbox's thread, and an ask unanswered within most of a period is
        counted and forgotten."""
        next_at = time.monotonic() + self._interval_s()
        urgent_after = 0.0
        while not self._stopping.is_set():
            now_s = time.monotonic()
            wake_at = min([next_at, *(p.expires for p in self._pending)])
            if self._woken.is_set():  # asked for at once: at the end of the gap, not before
                if self._stopping.wait(max(0.0, min(wake_at, urgent_after) - now_s)):
                    return
            elif self._woken.wait(max(0.0, wake_at - now_s)) and self._stopping.is_set():
                return
            try:
                now_s = time.monotonic()
                self._expire(now_s)
                if self._woken.is_set() and now_s >= urgent_after:
                    self._woken.clear()
                    urgent_after = now_s + URGENT_GAP_S
                    self._send(self._shares.urgent_asks(), self._now_ms())
                if now_s >= next_at:
                    next_at = now_s + self._interval_s()
                    self._pass()
            except Exception:
                self._failed()

    def _pass(self) -> None:
        now = self._now_ms()
        self._book.forget_silent(now)
        self._send(self._shares.due(now), now)

    def _send(self, asks: list[Ask], now: int) -> None:
        """``asks`` to their owners (those of teams owned here answered here); the answers
        come on the mailbox's thread."""
        if not asks or self._shares.alone():
            return
        by_partition: dict[int, list[Ask]] = {}
        for one in asks:
            p = partition_for(tenant_of(one.key), self._num_partitions)
            by_partition.setdefault(p, []).append(one)
        owned = self._owned()
        expires = time.monotonic() + self._period_ms / 1000.0 * ANSWER_WITHIN
        for p, of_p in by_partition.items():
            if p in owned:
                self._shares.granted(of_p, self._book.grant(self._member, of_p, now))
                continue
            query = wire.Query(name=QUERY, args=[of_p], asked_at=self._wall_ms())
            pending = _Pending(expires)
            try:
                pending.stop_waiting = self._ask(p, query, self._on_reply(of_p, pending))
            except CronlogError as err:  # the log is down: the shares stay as they are
                self._unanswered(1)
                log.info("%s: shares not asked of partition %d: %s", self._member, p, err)
                continue
            self._pending.append(pending)

    def _expire(self, now_s: float) -> None:
        """Forget the asks whose answer did not come in time (counted), and those answered."""
        kept: list[_Pending] = []
        for pending in self._pending:
            if pending.answered.is_set():
                if self._silent:
                    self._silent = False
                    log.info("%s: the owners answer asks for limit shares again", self._member)
                continue
            if now_s >= pending.expires:
                pending.stop_waiting()
                self._unanswered(1)
                if not self._silent:  # said once a spell, and counted every time
                    self._silent = True
                    log.warning(
                        "%s: an ask for limit shares went unanswered: the shares in force stay"
                        " (a count never granted: this node's part of the partitions)",
                        self._member,
                    )
                continue
            kept.append(pending)
        self._pending = kept

    def _unanswered(self, asks: int) -> None:
        """Asks whose answer did not come: the shares stay as they were, and it is counted."""
        self.unanswered += asks
        self._on_unanswered(asks)

    def _on_reply(self, asks: list[Ask], pending: _Pending) -> Callable[[wire.Reply], None]:
        def take(reply: wire.Reply) -> None:
            try:
                if reply.error is None:
                    shares = msgspec.json.decode(reply.answer, type=list[float])
                    self._shares.granted(asks, shares)
                else:
                    log.info("%s: shares not granted: %s", self._member, reply.message)
            except (msgspec.ValidationError, ValueError) as err:
                log.warning("%s: a malformed shares answer was passed over: %s", self._member, err)
            except Exception:  # on the mailbox's thread, which must go on: said and counted
                self._failed()
            finally:
                pending.answered.set()

        return take
