"""The pull worker's heartbeats, sent in batches: one ``POST /v1/runs:heartbeat`` for the beats
that come due together, not one request a run.

Each run the worker holds beats every third of its lease. One request a beat is what a worker
holding thousands of runs cannot afford: at 5,000 runs and a lease of 15 s that is a thousand
requests a second, a whole core of the worker spent in the HTTP client, heartbeats answered
seconds late and leases running out under running handlers. Here a beat waits for the
request in flight to be answered (``linger_sec`` at most), and the beats that came due meanwhile
go together in one request (``max_batch`` at most). With no request in flight a beat waits
only ``GATHER_S`` (5 ms) for others: longer would only make its run's answer late. So the
batches follow the node's round trip: a node answering in 20 ms gets a request of what came
due in some 25 ms, a slower one fewer and larger requests. A batch that
waited ``linger_sec`` goes beside the ones in flight, ``IN_FLIGHT`` (4) at most. (Several, not
one: the checks of a herd's runs leased ahead come due together, tens of thousands, and must
be answered before their start.)

Each beat is answered for its run alone, as a single ``heartbeat`` would be:

- 200: ``extended``.
- 409 ``lease_lost``: ``lost``, with the node's message and whether the run was cancelled
  (not reclaimed); the worker stops working on the run. A 404 is ``lost`` too: the run is
  gone (withdrawn before its start, which leaves no record, or forgotten).
- 429, 503: not decided now; the beat goes again in a later batch after a short pause, while
  its lease lasts (after that a beat cannot save it), then it is ``undelivered``.
- anything else: ``undelivered``, with why (the worker logs it and beats again next period).

A batch that could not be sent (node unreachable, 503 or 429 for the request) is sent again
after a short backoff, ``BEAT_TRIES`` times at most: a heartbeat carries its fencing token, so
a repeat extends the same lease again and nothing else. A node without the endpoint (older
than it: the request answered 404 or 405) is asked one run a request, as before, for the rest
of the worker's life.

Worked example: a worker holding 5,000 runs of a 15 s lease beats about 1,000 runs a second;
answered in 20 ms, that is some forty requests a second of about twenty-five beats each. If
one of those runs was cancelled meanwhile, its item is answered 409 and only its handler is
told; the others' leases are extended.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Literal

from cronlog_client import errors
from cronlog_client.client import MAX_BATCH_BEATS, AsyncClient
from cronlog_client.completions import Sleep
from cronlog_client.models import Beat, HeartbeatResult

log = logging.getLogger("cronlog_client.worker")

MAX_BACKOFF_S = 2.0
BEAT_TRIES = 5  # a batch that could not be sent is sent again (a heartbeat is repeatable)
IN_FLIGHT = 4  # heartbeat requests in flight at once
GATHER_S = 0.005  # the least a batch waits for others, when no request is in flight
NO_ENDPOINT = (404, 405)  # what a node older than POST /v1/runs:heartbeat answers it

How = Literal["extended", "lost", "undelivered"]


@dataclass(frozen=True)
class Answer:
    """What became of one beat: ``reason`` is the node's message when ``lost`` and why when
    ``undelivered``; ``cancelled`` (when ``lost``) says the run was cancelled, not reclaimed."""

    how: How
    reason: str = ""
    cancelled: bool = False


EXTENDED = Answer("extended")


def backoff(attempt: int) -> float:
    """The wait before try ``attempt + 1`` of a heartbeat (0.25 s doubling, at most 2 s): short,
    as a lease lasts only three periods."""
    return min(MAX_BACKOFF_S, 0.25 * 2.0**attempt)


@dataclass(eq=False)
class _Waiting:
    beat: Beat
    until: float  # the loop's time when the run's lease runs out: no use sending it after
    since: float  # the loop's time it joined the queue
    answer: asyncio.Future[Answer]
    tries: int = 0
    reason: str = ""  # why its last try was not delivered


@dataclass
class Beater:
    """Batches the worker's heartbeats; :meth:`beat` answers once the node has answered."""

    client: AsyncClient
    linger_sec: float
    max_batch: int = MAX_BATCH_BEATS
    sleep: Sleep = asyncio.sleep
    _queue: list[_Waiting] = field(default_factory=list)
    _held: dict[_Waiting, asyncio.TimerHandle] = field(default_factory=dict)  # sent again later
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _closing: bool = False
    _alone: bool = False  # the node has no POST /v1/runs:heartbeat: one request a run
    _sending: set[asyncio.Future[None]] = field(default_factory=set)  # requests in flight
    requests: int = 0  # heartbeat_many calls made

    async def beat(
        self,
        run_id: str,
        fencing_token: int,
        *,
        until: float,
        check: bool = False,
        started_late_ms: int | None = None,
    ) -> Answer:
        """Extend the run's lease; ``until`` (the loop's time) is when it runs out, after which
        a beat not yet delivered is given up as ``undelivered``. ``check``: only ask whether
        the lease holds (a run leased ahead, about to start); ``started_late_ms``: the run
        leased ahead started this long after its ``start_at``."""
        beat = Beat(
            run_id=run_id,
            fencing_token=fencing_token,
            check=check,
            started_late_ms=started_late_ms,
        )
        if self._alone:
            return await self._one(beat)
        loop = asyncio.get_running_loop()
        waiting = _Waiting(beat, until, loop.time(), loop.create_future())
        self._queue.append(waiting)
        # The sender wakes for the first beat of a batch and for a full one; those between
        # only wait (a thousand wakes a second would cost what the batches save).
        if len(self._queue) == 1 or len(self._queue) >= self.max_batch:
            self._wake.set()
        return await waiting.answer  # a cancelled caller cancels it: it is then not sent

    async def check_many(
        self, leases: list[tuple[str, int, float]], *, held: bool = False
    ) -> list[Answer]:
        """Whether each lease still holds, for runs leased ahead about to start: ``leases``
        are (run id, fencing token, when the lease runs out, the loop's time), answered in
        their order. The checks join the queue together (a herd's runs held to one instant are
        tens of thousands), sent in batches of ``max_batch`` like any beats. ``held``: the node
        holds each check until the start is 1.5 s away, so the batches go all at once, beside
        the queue and its few requests in flight (which they would hold up meanwhile); a check
        it could not answer then goes again through the queue."""
        if not leases:
            return []
        beats = [
            Beat(run_id=run_id, fencing_token=token, check=True) for run_id, token, _ in leases
        ]
        if self._alone:
            return list(await asyncio.gather(*(self._one(beat) for beat in beats)))
        loop = asyncio.get_running_loop()
        now = loop.time()
        waiting = [
            _Waiting(beat, until, now, loop.create_future())
            for beat, (_, _, until) in zip(beats, leases, strict=True)
        ]
        if held:
            chunks = [
                waiting[i : i + self.max_batch] for i in range(0, len(waiting), self.max_batch)
            ]
            sends = [asyncio.ensure_future(self._send_settled(chunk)) for chunk in chunks]
            try:
                return list(await asyncio.gather(*(w.answer for w in waiting)))
            finally:
                for send in sends:
                    if not send.done():
                        send.cancel()
                for w in waiting:
                    if not w.answer.done():
                        w.answer.cancel()
        self._queue.extend(waiting)
        self._wake.set()
        try:
            return list(await asyncio.gather(*(w.answer for w in waiting)))
        finally:
            for w in waiting:  # a cancelled caller: those not sent yet are not sent
                if not w.answer.done():
                    w.answer.cancel()

    async def close(self, sending: asyncio.Future[None]) -> None:
        """Send what still waits, then end :meth:`run` (``sending``)."""
        self._closing = True
        self._wake.set()
        await sending

    async def run(self) -> None:
        self._closing = False  # a worker run again after a stop
        try:
            while True:
                self._queue = [w for w in self._queue if not w.answer.done()]
                if not self._queue:
                    if self._closing:
                        if self._sending:
                            await asyncio.wait(self._sending)
                        return
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                await self._linger()
                live = [w for w in self._queue if not w.answer.done()]
                batch, self._queue = live[: self.max_batch], live[self.max_batch :]
                if not batch:
                    continue
                if self._alone:  # beats that were queued before the node was found out
                    await asyncio.gather(*(self._settle_alone(w) for w in batch))
                    continue
                # A few requests in flight: the checks of a herd's runs leased ahead come due
                # together, tens of thousands of them, and must be answered before the start.
                while len(self._sending) >= IN_FLIGHT:
                    await asyncio.wait(self._sending, return_when=asyncio.FIRST_COMPLETED)
                sent = asyncio.ensure_future(self._send_settled(batch))
                self._sending.add(sent)
                sent.add_done_callback(self._answered)
        finally:
            for unsent in list(self._sending):
                unsent.cancel()
            # A bug here, or the worker's end, must not leave a run's loop waiting forever.
            for handle in self._held.values():
                handle.cancel()
            for waiting in [*self._queue, *self._held]:
                self._settle(waiting, Answer("undelivered", "the worker stopped"))
            self._held.clear()

    def _answered(self, sent: asyncio.Future[None]) -> None:
        self._sending.discard(sent)
        self._wake.set()  # a batch lingering behind it may go now

    async def _linger(self) -> None:
        """Gather beats until the batch is full, or its first beat has waited ``GATHER_S`` and
        no request is in flight, or it has waited ``linger_sec``."""
        loop = asyncio.get_running_loop()
        since = self._queue[0].since
        until, soonest = since + self.linger_sec, since + min(GATHER_S, self.linger_sec)
        while len(self._queue) < self.max_batch and not self._closing:
            now = loop.time()
            if now >= until or (now >= soonest and not self._sending):
                return
            self._wake.clear()  # a beat joining or a request answered wakes it
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._wake.wait(), (until if self._sending else soonest) - now
                )

    async def _send_settled(self, batch: list[_Waiting]) -> None:
        """:meth:`_send`; a bug in it leaves no beat unanswered (it is logged)."""
        try:
            await self._send(batch)
        except BaseException as e:
            if not isinstance(e, asyncio.CancelledError):
                log.exception("%d heartbeats: sending them failed", len(batch))
            for waiting in batch:
                self._settle(waiting, Answer("undelivered", f"sending failed: {e!r}"))
            raise

    async def _send(self, batch: list[_Waiting]) -> None:
        reason = ""
        for attempt in range(BEAT_TRIES):
            if attempt:  # a beat whose lease ran out meanwhile is no use sent again
                batch = [w for w in batch if not w.answer.done() and not self._past(w, reason)]
                if not batch:
                    return
            try:
                self.requests += 1
                answer = await self.client.heartbeat_many([w.beat for w in batch])
            except (errors.Unreachable, errors.Unavailable) as e:
                reason = str(e)
                log.warning("%d heartbeats not delivered (%s); again", len(batch), e)
                await self.sleep(backoff(attempt))
                continue
            except errors.RateLimited as e:
                reason = str(e)
                await self.sleep(e.retry_after or 1.0)
                continue
            except errors.ApiError as e:
                if e.status in NO_ENDPOINT:
                    self._alone = True
                    log.info(
                        "the node does not take heartbeats in batches (%s): one request a run"
                        " from now on",
                        e,
                    )
                    await asyncio.gather(*(self._settle_alone(w) for w in batch))
                    return
                for waiting in batch:  # the request itself refused: no retry changes it
                    self._settle(waiting, Answer("undelivered", str(e)))
                return
            for waiting, result in zip(batch, answer.results, strict=True):
                self._take(waiting, result)
            return
        for waiting in batch:
            self._settle(waiting, Answer("undelivered", f"{reason} (after {BEAT_TRIES} tries)"))

    def _take(self, waiting: _Waiting, result: HeartbeatResult) -> None:
        error = result.error
        if result.ok:
            self._settle(waiting, EXTENDED)
        elif error is not None and error.error == "lease_lost":
            self._settle(waiting, Answer("lost", error.message, bool(error.cancelled)))
        elif result.status == 404:
            # the run is gone (withdrawn before its start, or forgotten): no lease to keep
            self._settle(waiting, Answer("lost", error.message if error else "not found"))
        else:
            reason = f"{result.status} {error.error}: {error.message}" if error else "no answer"
            if result.status in (429, 503):
                self._again(waiting, reason)
            else:
                self._settle(waiting, Answer("undelivered", reason))

    def _again(self, waiting: _Waiting, reason: str) -> None:
        """Send the beat in a later batch, after a pause, if its lease lasts that long."""
        loop = asyncio.get_running_loop()
        pause = backoff(waiting.tries)
        waiting.tries += 1
        waiting.reason = reason
        if waiting.answer.done() or self._past(waiting, reason, loop.time() + pause):
            return
        self._held[waiting] = loop.call_later(pause, self._requeue, waiting)

    def _requeue(self, waiting: _Waiting) -> None:
        self._held.pop(waiting, None)
        if not waiting.answer.done():
            waiting.since = asyncio.get_running_loop().time()
            self._queue.append(waiting)
            self._wake.set()

    def _past(self, waiting: _Waiting, reason: str, at: float | None = None) -> bool:
        """Whether the beat's lease has run out by ``at`` (now); then it is ``undelivered``."""
        if (at if at is not None else asyncio.get_running_loop().time()) < waiting.until:
            return False
        self._settle(waiting, Answer("undelivered", reason or waiting.reason))
        return True

    async def _settle_alone(self, waiting: _Waiting) -> None:
        if not waiting.answer.done():
            self._settle(waiting, await self._one(waiting.beat))

    async def _one(self, beat: Beat) -> Answer:
        """One beat, one request: ``POST /v1/runs/{run_id}/heartbeat``."""
        try:
            await self.client.heartbeat(
                beat.run_id,
                beat.fencing_token,
                check=beat.check,
                started_late_ms=beat.started_late_ms,
            )
        except errors.LeaseLost as e:
            return Answer("lost", e.message, e.cancelled)
        except errors.NotFound as e:  # the run is gone: no lease to keep
            return Answer("lost", e.message)
        except errors.CronlogError as e:
            return Answer("undelivered", str(e))
        return EXTENDED

    @staticmethod
    def _settle(waiting: _Waiting, answer: Answer) -> None:
        if not waiting.answer.done():
            waiting.answer.set_result(answer)
