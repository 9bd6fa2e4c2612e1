"""For the services cronlog calls: handle each run once, and never let an old attempt win.

cronlog sends every attempt of a run with the same ``Idempotency-Key`` (``<tenant>/<job>:<slot
ms>``) and a fencing token that grows with every attempt (``X-Cronlog-Fencing-Token``). An
attempt cronlog gave up on (it timed out, its lease ran out) may still be running in the target
when the next one arrives, or arrive late through a proxy. :class:`RunGuard` keeps, per key,
the newest token seen and the answer of the attempt that succeeded, and decides each request:

==============================================  =====================================  ======
the request                                     answer                                 status
==============================================  =====================================  ======
no ``Idempotency-Key``                          passed through untouched               --
a token older than the newest seen for the key  refused: a newer attempt exists        409
an attempt of the key succeeded before          that answer again (the work not done   as
                                                again), ``Idempotent-Replayed: true``  stored
an attempt of the key is being handled now      "try again" with ``Retry-After: 1``    503
otherwise                                       handled; a 2xx answer is kept          --
==============================================  =====================================  ======

cronlog retries a 503 (honouring ``Retry-After``) and dead-letters on other 4xx; a 409 goes to
an attempt cronlog has already given up, so nobody acts on it. A handler that is about to
commit can ask whether a newer attempt has arrived since it started
(``scope["cronlog.run"].superseded()`` in ASGI, ``admission.superseded()`` otherwise) and back
off rather than write over the newer attempt.

One line for an ASGI app (Starlette, FastAPI, ...)::

    app = CronlogTargetMiddleware(app)

and a plain function for anything else (Flask, Django, a queue consumer)::

    guard = RunGuard()

    def hook(request):
        reply = guard.run(request.headers, lambda: Reply.json(do_the_work(request.json)))
        return reply.body, reply.status, dict(reply.headers)

**What became of an attempt.** When cronlog cannot tell whether a critical run's attempt took
effect (its call timed out, its lease ran out mid-call), it asks the job's ``status_url``
instead of setting the run aside: ``GET`` with ``X-Cronlog-Ask-Key: K`` (the attempt's
Idempotency-Key), ``X-Cronlog-Ask-Token: T`` (its fencing token) and the job's own headers.
The guard answers from what it keeps (:meth:`RunGuard.answer`), ``200 {"outcome": ...,
"status": ...}``:

==================================================  ==========================================
what the guard knows of K                           ``outcome``
==================================================  ==========================================
an attempt succeeded (its answer kept, or too       ``succeeded``, with the status it answered
large to keep)
an attempt is being handled now                     ``in_progress``: cronlog asks again later
T never arrived (nor a newer token)                 ``never_seen``, and T is **fenced**: the
                                                    key's newest token becomes T + 1, so T
                                                    arriving late is refused (409) and
                                                    cronlog's retry (a newer token) is handled
T (or a newer one) arrived; its handling answered   ``failed``: cronlog retries as after any
no success (or raised)                              failure
T arrived and its handling died midway, or its      ``unknown``: cronlog sets the run aside
answer was cut short
==================================================  ==========================================

Serve it with ``CronlogTargetMiddleware(app, status_path="/cronlog/status",
authorize=bearer_token(secret))`` (the job sends ``Authorization: Bearer <secret>`` in its
target's headers, a secret reference), or from any framework with
``guard.answer(request.headers)``. Authorize the asks as you authorize the calls: whoever may
ask may also fence a key. The answer needs a store that keeps outcomes (:class:`MemoryStore`
and :class:`SQLiteStore` do: :class:`AnsweringStore`); another store's answer is ``unknown``,
and cronlog sets the run aside as before. A fence lasts as long as the store keeps the key.

Where the guard keeps what it knows is a :class:`GuardStore`: :class:`MemoryStore` (the
default; one process) or :class:`SQLiteStore` (the processes of one host, through one file).
Several hosts share a store of their own making: the protocol is two atomic operations.
Kept answers expire after ``ttl_s`` (a day by default; keep it longer than the job's retry
window), and an answer over ``max_body`` bytes is sent but not kept.
"""

from __future__ import annotations

import contextlib
import enum
import hmac
import json
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

IDEMPOTENCY_KEY = "idempotency-key"
FENCING_TOKEN = "x-cronlog-fencing-token"
ASK_KEY = "x-cronlog-ask-key"  # an ask about an attempt: its Idempotency-Key ...
ASK_TOKEN = "x-cronlog-ask-token"  # ... and its fencing token
REPLAYED = "Idempotent-Replayed"
DEFAULT_TTL_S = 86_400.0
DEFAULT_BUSY_S = 600.0  # a handling older than this is taken for abandoned (its process died)
DEFAULT_MAX_BODY = 1 << 20
MAX_TOKEN_DIGITS = 18
# Headers that describe one transfer, not the answer: never replayed.
_NOT_KEPT = frozenset({b"content-length", b"transfer-encoding", b"connection", b"date"})


@dataclass(frozen=True, slots=True)
class Reply:
    """An HTTP answer: status, body, headers (as ASGI gives them: lower-case bytes pairs)."""

    status: int
    body: bytes = b""
    headers: tuple[tuple[bytes, bytes], ...] = ()

    @classmethod
    def json(cls, value: Any, status: int = 200) -> Reply:
        return cls(status, json.dumps(value).encode(), ((b"content-type", b"application/json"),))

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


class Decision(enum.Enum):
    UNTRACKED = "untracked"  # no Idempotency-Key: not cronlog's, or not guarded
    PROCEED = "proceed"  # handle it (and finish() with the answer)
    REPLAY = "replay"  # an earlier attempt succeeded: send its answer
    STALE = "stale"  # a newer attempt was seen: refuse
    BUSY = "busy"  # an attempt of the key is being handled: try again later
    INVALID = "invalid"  # a fencing token that is not a number


class Outcome(enum.Enum):
    """What became of an attempt, as :meth:`RunGuard.answer` tells cronlog (see the module)."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    NEVER_SEEN = "never_seen"
    IN_PROGRESS = "in_progress"
    UNKNOWN = "unknown"


class GuardStore(Protocol):
    """What a :class:`RunGuard` keeps, per key. Each method is atomic."""

    def begin(self, key: str, token: int | None, now: float) -> tuple[Decision, Reply | None]:
        """Decide a request: STALE if ``token`` is below the newest seen (else record it as
        the newest), REPLAY with the kept answer, BUSY while another is handled (unless that
        began before ``now - busy_s``), else PROCEED, marking the key as being handled."""
        ...

    def finish(self, key: str, reply: Reply | None, now: float) -> None:
        """The handling ended: keep ``reply`` (a success) or forget that one was underway."""
        ...

    def newest(self, key: str) -> int | None:
        """The newest token seen for ``key``."""
        ...


@runtime_checkable
class AnsweringStore(GuardStore, Protocol):
    """A :class:`GuardStore` that also keeps how each handling ended, and so can say what
    became of an attempt (:meth:`answer`). Each method is atomic."""

    def finish(
        self, key: str, reply: Reply | None, now: float, *, ended: int | None = None
    ) -> None:
        """:meth:`GuardStore.finish`, with the status the handling answered (None: it was cut
        short, so it cannot be told whether it took effect)."""
        ...

    def answer(self, key: str, token: int, now: float) -> tuple[Outcome, int | None]:
        """What became of the attempt of ``token`` (the module's table), with the status of a
        success; ``NEVER_SEEN`` fences ``token`` (the key's newest becomes ``token + 1``)."""
        ...


def _decide_answer(
    newest: int | None,
    busy: bool,
    kept: int | None,
    failed: bool,
    fenced: int | None,
    token: int,
) -> tuple[Outcome, int | None, int | None]:
    """The answer about ``token`` from what a store keeps of its key, and the key's newest
    token afterwards (a fence moves it past ``token``). ``kept``: the status of a success."""
    if kept is not None:
        return Outcome.SUCCEEDED, kept, newest
    if busy:
        return Outcome.IN_PROGRESS, None, newest
    if fenced is not None and token <= fenced:
        return Outcome.NEVER_SEEN, None, newest  # asked before: still fenced
    if newest is None or newest < token:
        return Outcome.NEVER_SEEN, None, token + 1
    return (Outcome.FAILED if failed else Outcome.UNKNOWN), None, newest


def _ended(ended: int | None) -> tuple[int | None, bool]:
    """A handling's end as a store keeps it: (the status of a success, whether it failed)."""
    if ended is None:
        return None, False
    return (ended, False) if 200 <= ended < 300 else (None, True)


@dataclass(slots=True)
class _Entry:
    newest: int | None = None
    busy_since: float | None = None
    reply: Reply | None = None
    stamp: float = 0.0
    succeeded: int | None = None  # the status of a success whose answer was not kept
    failed: bool = False  # the last handling ended without a success
    fenced: int | None = None  # the newest token an answer said was never seen


class MemoryStore:
    """A :class:`GuardStore` in this process's memory: at most ``max_keys`` keys (the least
    recently used go first), each forgotten ``ttl_s`` after its last use."""

    def __init__(
        self,
        *,
        ttl_s: float = DEFAULT_TTL_S,
        busy_s: float = DEFAULT_BUSY_S,
        max_keys: int = 100_000,
    ) -> None:
        self._ttl_s, self._busy_s, self._max_keys = ttl_s, busy_s, max_keys
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, _Entry] = OrderedDict()

    def _touch(self, key: str, now: float) -> _Entry:
        """``key``'s entry, new if none or expired, marked used now (under the lock)."""
        entry = self._entries.get(key)
        if entry is None or now - entry.stamp > self._ttl_s:
            entry = self._entries[key] = _Entry()
        self._entries.move_to_end(key)
        entry.stamp = now
        return entry

    def _evict(self) -> None:
        """Forget the least recently used keys past ``max_keys`` (under the lock)."""
        while len(self._entries) > self._max_keys:
            self._entries.popitem(last=False)

    def begin(self, key: str, token: int | None, now: float) -> tuple[Decision, Reply | None]:
        with self._lock:
            entry = self._touch(key, now)
            if token is not None:
                if entry.newest is not None and token < entry.newest:
                    return Decision.STALE, None
                entry.newest = token
            if entry.reply is not None:
                return Decision.REPLAY, entry.reply
            if entry.busy_since is not None and now - entry.busy_since < self._busy_s:
                return Decision.BUSY, None
            entry.busy_since, entry.failed = now, False
            self._evict()
            return Decision.PROCEED, None

    def finish(
        self, key: str, reply: Reply | None, now: float, *, ended: int | None = None
    ) -> None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return
            entry.busy_since, entry.stamp = None, now
            if reply is not None:
                entry.reply = reply
            succeeded, entry.failed = _ended(ended)
            if succeeded is not None:
                entry.succeeded = succeeded

    def newest(self, key: str) -> int | None:
        with self._lock:
            entry = self._entries.get(key)
            return None if entry is None else entry.newest

    def answer(self, key: str, token: int, now: float) -> tuple[Outcome, int | None]:
        with self._lock:
            entry = self._touch(key, now)
            busy = entry.busy_since is not None and now - entry.busy_since < self._busy_s
            kept = entry.reply.status if entry.reply is not None else entry.succeeded
            outcome, status, entry.newest = _decide_answer(
                entry.newest, busy, kept, entry.failed, entry.fenced, token
            )
            if outcome is Outcome.NEVER_SEEN:
                entry.fenced = max(token, entry.fenced or 0)
            self._evict()
            return outcome, status


class SQLiteStore:
    """A :class:`GuardStore` in one SQLite file, for the processes of one host (a web server's
    workers). Each decision is one ``BEGIN IMMEDIATE`` transaction."""

    def __init__(
        self, path: str | Path, *, ttl_s: float = DEFAULT_TTL_S, busy_s: float = DEFAULT_BUSY_S
    ) -> None:
        self._path = str(path)
        self._ttl_s, self._busy_s = ttl_s, busy_s
        self._local = threading.local()
        with self._db() as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS runs (key TEXT PRIMARY KEY, newest INTEGER,"
                " busy_since REAL, status INTEGER, headers TEXT, body BLOB, stamp REAL)"
            )
            # how handlings ended (AnsweringStore), added to files of earlier versions
            have = {row[1] for row in db.execute("PRAGMA table_info(runs)")}
            for column in ("succeeded INTEGER", "failed INTEGER", "fenced INTEGER"):
                if column.split()[0] not in have:
                    db.execute(f"ALTER TABLE runs ADD COLUMN {column}")

    @contextlib.contextmanager
    def _db(self) -> Any:
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(self._path, timeout=30, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            self._local.db = db
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def begin(self, key: str, token: int | None, now: float) -> tuple[Decision, Reply | None]:
        with self._db() as db:
            row = db.execute(
                "SELECT newest, busy_since, status, headers, body, stamp FROM runs WHERE key = ?",
                (key,),
            ).fetchone()
            if row is not None and now - row[5] > self._ttl_s:
                db.execute("DELETE FROM runs WHERE key = ?", (key,))
                row = None
            newest, busy_since = (None, None) if row is None else (row[0], row[1])
            if token is not None:
                if newest is not None and token < newest:
                    db.execute("UPDATE runs SET stamp = ? WHERE key = ?", (now, key))
                    return Decision.STALE, None
                newest = token
            if row is not None and row[2] is not None:
                db.execute(
                    "UPDATE runs SET newest = ?, stamp = ? WHERE key = ?", (newest, now, key)
                )
                headers = tuple((k.encode(), v.encode()) for k, v in json.loads(row[3]))
                return Decision.REPLAY, Reply(row[2], bytes(row[4]), headers)
            if busy_since is not None and now - busy_since < self._busy_s:
                db.execute(
                    "UPDATE runs SET newest = ?, stamp = ? WHERE key = ?", (newest, now, key)
                )
                return Decision.BUSY, None
            db.execute(
                "INSERT INTO runs (key, newest, busy_since, stamp) VALUES (?, ?, ?, ?)"
                " ON CONFLICT(key) DO UPDATE SET newest = excluded.newest,"
                " busy_since = excluded.busy_since, stamp = excluded.stamp, failed = NULL",
                (key, newest, now, now),
            )
            return Decision.PROCEED, None

    def finish(
        self, key: str, reply: Reply | None, now: float, *, ended: int | None = None
    ) -> None:
        succeeded, failed = _ended(ended)
        with self._db() as db:
            db.execute(
                "UPDATE runs SET busy_since = NULL, stamp = ?, failed = ?,"
                " succeeded = coalesce(?, succeeded) WHERE key = ?",
                (now, int(failed), succeeded, key),
            )
            if reply is None:
                return
            headers = json.dumps([[k.decode(), v.decode()] for k, v in reply.headers])
            db.execute(
                "UPDATE runs SET status = ?, headers = ?, body = ? WHERE key = ?",
                (reply.status, headers, reply.body, key),
            )

    def answer(self, key: str, token: int, now: float) -> tuple[Outcome, int | None]:
        with self._db() as db:
            row = db.execute(
                "SELECT newest, busy_since, status, succeeded, failed, fenced, stamp FROM runs"
                " WHERE key = ?",
                (key,),
            ).fetchone()
            if row is not None and now - row[6] > self._ttl_s:
                db.execute("DELETE FROM runs WHERE key = ?", (key,))
                row = None
            newest, busy_since, status, succeeded, failed, fenced, _ = (
                (None,) * 7 if row is None else row
            )
            busy = busy_since is not None and now - busy_since < self._busy_s
            kept = status if status is not None else succeeded
            outcome, answered, newest = _decide_answer(
                newest, busy, kept, bool(failed), fenced, token
            )
            if outcome is Outcome.NEVER_SEEN:
                fenced = max(token, fenced or 0)
            db.execute(
                "INSERT INTO runs (key, newest, fenced, stamp) VALUES (?, ?, ?, ?)"
                " ON CONFLICT(key) DO UPDATE SET newest = excluded.newest,"
                " fenced = excluded.fenced, stamp = excluded.stamp",
                (key, newest, fenced, now),
            )
            return outcome, answered

    def newest(self, key: str) -> int | None:
        with self._db() as db:
            row = db.execute("SELECT newest FROM runs WHERE key = ?", (key,)).fetchone()
            return None if row is None else row[0]


class _Unset(enum.Enum):
    UNSET = "unset"


_UNSET = _Unset.UNSET


def bearer_token(secret: str) -> Callable[[Mapping[str, str]], bool]:
    """An ``authorize`` for :class:`CronlogTargetMiddleware`'s status path: the ask carries
    ``Authorization: Bearer <secret>`` (put it in the job's target headers, a secret
    reference, and cronlog sends it with every call and ask)."""
    expected = f"Bearer {secret}".encode()

    def authorize(headers: Mapping[str, str]) -> bool:
        given = {k.lower(): v for k, v in headers.items()}.get("authorization", "")
        return hmac.compare_digest(given.encode(), expected)

    return authorize


@dataclass
class Admission:
    """The guard's decision on one request, and what it needs to finish it."""

    decision: Decision
    key: str = ""
    token: int | None = None
    reply: Reply | None = None  # the answer to send now (REPLAY, STALE, BUSY, INVALID)
    guard: RunGuard | None = field(default=None, repr=False)

    def superseded(self) -> bool:
        """Whether a newer attempt of the run arrived since this one was admitted: a handler
        about to commit should not."""
        if self.guard is None or self.token is None:
            return False
        newest = self.guard.store.newest(self.key)
        return newest is not None and newest > self.token


def _error(status: int, error: str, message: str, *extra: tuple[bytes, bytes]) -> Reply:
    body = json.dumps({"error": error, "message": message}).encode()
    return Reply(status, body, ((b"content-type", b"application/json"), *extra))


class RunGuard:
    """Decides requests by their ``Idempotency-Key`` and fencing token (see the module)."""

    def __init__(
        self,
        store: GuardStore | None = None,
        *,
        clock: Callable[[], float] = time.time,
        max_body: int = DEFAULT_MAX_BODY,
    ) -> None:
        self.store: GuardStore = store if store is not None else MemoryStore()
        # the store again if it keeps how handlings ended, and so can answer (asked once)
        self._answers = self.store if isinstance(self.store, AnsweringStore) else None
        self._clock = clock
        self.max_body = max_body

    def admit(self, headers: Mapping[str, str]) -> Admission:
        """Decide a request by its headers (any case of their names)."""
        lower = {name.lower(): value for name, value in headers.items()}
        key = lower.get(IDEMPOTENCY_KEY)
        if not key:
            return Admission(Decision.UNTRACKED)
        given = lower.get(FENCING_TOKEN)
        token = None
        if given is not None:
            given = given.strip()
            if not given.isascii() or not given.isdigit() or len(given) > MAX_TOKEN_DIGITS:
                return Admission(
                    Decision.INVALID,
                    key,
                    reply=_error(400, "bad_request", "X-Cronlog-Fencing-Token must be a number"),
                )
            token = int(given)
        decision, kept = self.store.begin(key, token, self._clock())
        reply: Reply | None = None
        if decision is Decision.REPLAY and kept is not None:
            reply = Reply(kept.status, kept.body, (*kept.headers, (REPLAYED.encode(), b"true")))
        elif decision is Decision.STALE:
            reply = _error(
                409,
                "stale_fencing_token",
                f"fencing token {token} is older than the newest seen for this run",
            )
        elif decision is Decision.BUSY:
            reply = _error(
                503,
                "in_progress",
                "an earlier attempt of this run is being handled; try again",
                (b"retry-after", b"1"),
            )
        return Admission(decision, key, token, reply, self)

    def finish(
        self, admission: Admission, reply: Reply | None, *, ended: int | _Unset | None = _UNSET
    ) -> None:
        """The admitted request was handled; ``reply`` its answer (None: it raised, or its
        answer was not kept whole). A successful answer is kept for repeats of the key.
        ``ended``: the status the handling answered, None if it was cut short (by default
        ``reply``'s, or 500 without one: a handler that raised)."""
        if admission.decision is not Decision.PROCEED:
            return
        keep = (
            reply if reply is not None and reply.ok and len(reply.body) <= self.max_body else None
        )
        if keep is not None:
            keep = Reply(
                keep.status,
                keep.body,
                tuple(h for h in keep.headers if h[0].lower() not in _NOT_KEPT),
            )
        if isinstance(ended, _Unset):
            ended = reply.status if reply is not None else 500
        if self._answers is not None:
            self._answers.finish(admission.key, keep, self._clock(), ended=ended)
        else:
            self.store.finish(admission.key, keep, self._clock())

    def answer(self, headers: Mapping[str, str]) -> Reply:
        """cronlog's ask "what became of the attempt of ``X-Cronlog-Ask-Key`` and
        ``X-Cronlog-Ask-Token``?" answered (see the module): ``200 {"outcome": ..., "status":
        ...}``. Authorize the ask before calling this: an answer may fence the key."""
        lower = {name.lower(): value for name, value in headers.items()}
        key, given = lower.get(ASK_KEY), (lower.get(ASK_TOKEN) or "").strip()
        if not key or not given.isascii() or not given.isdigit() or len(given) > MAX_TOKEN_DIGITS:
            return _error(
                400, "bad_request", "X-Cronlog-Ask-Key and a numeric X-Cronlog-Ask-Token are needed"
            )
        outcome, status = Outcome.UNKNOWN, None
        if self._answers is not None:
            outcome, status = self._answers.answer(key, int(given), self._clock())
        return Reply.json({"outcome": outcome.value, "status": status})

    def run(self, headers: Mapping[str, str], work: Callable[[], Reply]) -> Reply:
        """The plain function: decide, do ``work`` if the request is to be handled, keep its
        answer; returns the answer to send."""
        admission = self.admit(headers)
        if admission.decision is Decision.UNTRACKED:
            return work()
        if admission.reply is not None:
            return admission.reply
        reply: Reply | None = None
        try:
            reply = work()
            return reply
        finally:
            self.finish(admission, reply)

    async def arun(self, headers: Mapping[str, str], work: Callable[[], Awaitable[Reply]]) -> Reply:
        """:meth:`run` for a coroutine."""
        admission = self.admit(headers)
        if admission.decision is Decision.UNTRACKED:
            return await work()
        if admission.reply is not None:
            return admission.reply
        reply: Reply | None = None
        try:
            reply = await work()
            return reply
        finally:
            self.finish(admission, reply)


Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class CronlogTargetMiddleware:
    """ASGI middleware: every HTTP request goes through a :class:`RunGuard` (a new one with a
    :class:`MemoryStore` unless given). The handler finds the admission in
    ``scope["cronlog.run"]``.

    With ``status_path``, a ``GET`` of that path is cronlog asking what became of an attempt:
    answered by the guard (:meth:`RunGuard.answer`), never passed to the app, once
    ``authorize(headers)`` says the ask may be answered (else 401). ``authorize`` is required
    with a status path (:func:`bearer_token` checks a bearer secret): an unauthorized asker
    could fence the keys of runs to come."""

    def __init__(
        self,
        app: ASGIApp,
        guard: RunGuard | None = None,
        *,
        status_path: str | None = None,
        authorize: Callable[[Mapping[str, str]], bool] | None = None,
    ) -> None:
        if status_path is not None and authorize is None:
            raise ValueError("a status_path needs authorize: who may ask may fence (bearer_token)")
        self.app = app
        self.guard = guard if guard is not None else RunGuard()
        self.status_path = status_path
        self._authorize = authorize

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        if self.status_path is not None and scope["path"] == self.status_path:
            await _send(send, self._status(scope, headers))
            return
        admission = self.guard.admit(headers)
        if admission.decision is Decision.UNTRACKED:
            await self.app(scope, receive, send)
            return
        if admission.reply is not None:
            await _send(send, admission.reply)
            return
        answer = _Capture(send, self.guard.max_body)
        try:
            await self.app({**scope, "cronlog.run": admission}, receive, answer.send)
        finally:
            self.guard.finish(admission, answer.reply(), ended=answer.ended())

    def _status(self, scope: Scope, headers: dict[str, str]) -> Reply:
        if scope["method"] != "GET":
            return _error(405, "method_not_allowed", "ask with GET", (b"allow", b"GET"))
        assert self._authorize is not None  # required with a status path
        if not self._authorize(headers):
            return _error(401, "unauthorized", "this ask is not authorized")
        return self.guard.answer(headers)


class _Capture:
    """Passes an app's answer on, and keeps a copy of it (up to ``limit`` bytes of body)."""

    def __init__(self, send: Send, limit: int) -> None:
        self._send = send
        self._limit = limit
        self.status: int | None = None
        self.headers: tuple[tuple[bytes, bytes], ...] = ()
        self.body = bytearray()
        self.complete = False
        self.too_large = False

    async def send(self, message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = int(message["status"])
            self.headers = tuple(
                (bytes(k).lower(), bytes(v)) for k, v in message.get("headers", ())
            )
        elif message["type"] == "http.response.body":
            chunk = message.get("body", b"")
            if len(self.body) + len(chunk) > self._limit:
                self.too_large = True
            else:
                self.body += chunk
            if not message.get("more_body", False):
                self.complete = True
        await self._send(message)

    def reply(self) -> Reply | None:
        if self.status is None or not self.complete or self.too_large:
            return None
        return Reply(self.status, bytes(self.body), self.headers)

    def ended(self) -> int | None:
        """The status the app answered; 500 if it raised before answering; None if it was
        cut short once a success had begun (it may have taken effect)."""
        if self.status is None:
            return 500  # the server answers it so
        if not self.complete and 200 <= self.status < 300:
            return None
        return self.status


async def _send(send: Send, reply: Reply) -> None:
    headers = [(k, v) for k, v in reply.headers if k.lower() not in _NOT_KEPT]
    headers.append((b"content-length", str(len(reply.body)).encode()))
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    await send({"type": "http.response.body", "body": reply.body})
