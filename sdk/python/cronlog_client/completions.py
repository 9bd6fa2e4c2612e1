"""The pull worker's outcomes, sent in batches: one ``POST /v1/runs:complete`` for the runs that
finished together, not one request a run.

An outcome waits at most ``linger_sec`` for others to join it; it goes at once when the batch is
full (``max_batch``), when every run the worker holds has finished (nothing else can join), or
when the worker is stopping. One request is in flight at a time; what finishes meanwhile makes
the next batch, so under load the batches grow by themselves and an idle worker pays no wait.

Each outcome is answered on its own, as a single ``complete`` would be:

- 200: recorded.
- 409 ``lease_lost``: the lease is gone (reclaimed, cancelled, expired) and the outcome is not
  recorded, as the single path reports it. A batch sent again after a transport failure may
  have been recorded by its first try: the node records nothing twice, and answers an outcome
  it holds already for that token 200, as the first try was answered. A node from before that
  rule answers such a repeat 409, so after a try whose answer was lost a 409 still has the run
  read back, and an outcome the node holds for this attempt counts as recorded (against a
  node of this version that read finds the lease really lost).
- 429, 503: not decided now; sent again (with the next batch) after the backoff.
- anything else (400, 404, 422): refused; logged with the run's id.

A batch that could not be sent (node unreachable, 503, 429 for the request) is sent again after
the single path's backoff, ``COMPLETE_TRIES`` times at most; after that its runs are logged as
undelivered and their leases run out (the runs are retried by their policy).

Worked example: a worker of ``concurrency=8`` whose eight handlers finish within a few
milliseconds sends one request with eight outcomes; if one of them was cancelled meanwhile its
item is answered 409 and only that run is logged ("completed too late"), the seven others are
recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

from cronlog_client import errors
from cronlog_client.client import AsyncClient
from cronlog_client.models import Completion, CompletionResult

log = logging.getLogger("cronlog_client.worker")

MAX_BACKOFF_S = 10.0
COMPLETE_TRIES = 5  # a completion that could not be sent is sent again (the token makes it safe)
READ_BACK_TRIES, READ_BACK_EVERY_S = 10, 0.1  # how long a run's view may trail its partition

Settled = Literal["completed", "lost", "refused", "undelivered"]
Sleep = Callable[[float], Awaitable[None]]


def backoff(attempt: int) -> float:
    """The wait before try ``attempt + 1`` of a completion (0.5 s doubling, at most 10 s)."""
    return min(MAX_BACKOFF_S, 0.5 * 2.0**attempt)


@dataclass
class _Outcome:
    completion: Completion
    settled: asyncio.Future[Settled]
    tries: int = 0
    maybe_recorded: bool = False  # a try went out and its answer was lost


@dataclass
class Completer:
    """Batches the worker's outcomes; :meth:`add` answers once the node has answered."""

    client: AsyncClient
    max_batch: int
    linger_sec: float
    held: Callable[[], int]  # runs the worker holds (running or waiting for their outcome)
    sleep: Sleep = asyncio.sleep
    _queue: list[_Outcome] = field(default_factory=list)
    _sending: int = 0
    _retrying: set[asyncio.Task[None]] = field(default_factory=set)
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _hurry: bool = False
    _closing: bool = False
    requests: int = 0  # complete_many calls made

    def add(self, completion: Completion) -> asyncio.Future[Settled]:
        outcome = _Outcome(completion, asyncio.get_running_loop().create_future())
        self._queue.append(outcome)
        self._wake.set()
        return outcome.settled

    def hurry(self) -> None:
        """Send what waits now, without lingering (the worker is stopping)."""
        self._hurry = True
        self._wake.set()

    async def close(self, sending: asyncio.Future[None]) -> None:
        """Send everything still waiting, then end :meth:`run` (``sending``)."""
        self._hurry = self._closing = True
        self._wake.set()
        await sending

    async def run(self) -> None:
        self._closing = False  # a worker run again after a stop
        try:
            while True:
                if not self._queue:
                    if self._closing and not self._retrying:
                        return
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                await self._linger()
                batch, self._queue = self._queue[: self.max_batch], self._queue[self.max_batch :]
                self._sending = len(batch)
                try:
                    await self._send(batch)
                finally:
                    self._sending = 0
        except BaseException:
            # A bug here must not leave handlers waiting for an answer that never comes.
            for outcome in self._queue:
                self._settle(outcome, "undelivered")
            raise

    async def _linger(self) -> None:
        loop = asyncio.get_running_loop()
        until = loop.time() + self.linger_sec
        while not self._full():
            left = until - loop.time()
            if left <= 0:
                return
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), left)

    def _full(self) -> bool:
        waiting = len(self._queue)
        return (
            self._hurry
            or waiting >= self.max_batch
            or waiting + self._sending + len(self._retrying) >= self.held()
        )

    async def _send(self, batch: list[_Outcome]) -> None:
        for attempt in range(COMPLETE_TRIES):
            try:
                self.requests += 1
                answer = await self.client.complete_many([o.completion for o in batch])
            except (errors.Unreachable, errors.Unavailable) as e:
                for outcome in batch:
                    outcome.maybe_recorded = True
                log.warning("%d completions not delivered (%s); again", len(batch), e)
                await self.sleep(backoff(attempt))
                continue
            except errors.RateLimited as e:
                await self.sleep(e.retry_after or 1.0)
                continue
            except errors.ApiError as e:  # the request itself refused: no retry changes it
                for outcome in batch:
                    log.error("run %s: completion refused: %s", outcome.completion.run_id, e)
                    self._settle(outcome, "refused")
                return
            for outcome, result in zip(batch, answer.results, strict=True):
                await self._take(outcome, result)
            return
        for outcome in batch:
            log.error(
                "run %s: completion not delivered after %d tries; the lease will run out",
                outcome.completion.run_id,
                COMPLETE_TRIES,
            )
            self._settle(outcome, "undelivered")

    async def _take(self, outcome: _Outcome, result: CompletionResult) -> None:
        run_id = outcome.completion.run_id
        error = result.error
        message = error.message if error is not None else f"status {result.status}"
        if result.ok:
            self._settle(outcome, "completed")
        elif result.status == 409:
            if outcome.maybe_recorded and await self._recorded(outcome.completion):
                log.info("run %s: the outcome was recorded by an earlier try", run_id)
                self._settle(outcome, "completed")
            else:
                log.warning("run %s: completed too late, the lease was lost: %s", run_id, message)
                self._settle(outcome, "lost")
        elif result.status in (429, 503) and outcome.tries + 1 < COMPLETE_TRIES:
            log.warning("run %s: completion not delivered (%s); again", run_id, message)
            retry = asyncio.ensure_future(self._again(outcome))
            self._retrying.add(retry)
            retry.add_done_callback(self._retrying.discard)
        else:
            log.error("run %s: completion refused (%d): %s", run_id, result.status, message)
            self._settle(outcome, "refused" if result.status not in (429, 503) else "undelivered")

    async def _again(self, outcome: _Outcome) -> None:
        await self.sleep(backoff(outcome.tries))
        outcome.tries += 1
        self._queue.append(outcome)
        self._wake.set()

    async def _recorded(self, completion: Completion) -> bool:
        """Whether the node holds this attempt's outcome as sent (by a try whose answer was
        lost), read from the run's attempts: for a node that answers such a repeat 409 (one
        from before it answered a repeat as the first). The node answered the first try once
        its outcome was durable, but the run's view may trail it a moment: read again while
        the attempt shows no outcome yet, for about a second."""
        for _ in range(READ_BACK_TRIES):
            try:
                run = await self.client.get_run(completion.run_id)
            except errors.CronlogError as e:
                log.warning("run %s: could not read it back: %s", completion.run_id, e)
                return False
            ours = [a for a in run.attempts if a.fencing_token == completion.fencing_token]
            if not ours or ours[0].outcome is not None:
                return bool(ours) and ours[0].outcome == completion.status
            await asyncio.sleep(READ_BACK_EVERY_S)
        return False

    @staticmethod
    def _settle(outcome: _Outcome, how: Settled) -> None:
        if not outcome.settled.done():
            outcome.settled.set_result(how)
