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

Where the guard keeps what it knows is a :class:`GuardStore`: :class:`MemoryStore` (the
default; one process) or :class:`SQLiteStore` (the processes of one host, through one file).
Several hosts share a store of their own making: the protocol is two atomic operations.
Kept answers expire after ``ttl_s`` (a day by default; keep it longer than the job's retry
window), and an answer over ``max_body`` bytes is sent but not kept.
"""

from __future__ import annotations

import contextlib
import enum
import json
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

IDEMPOTENCY_KEY = "idempotency-key"
FENCING_TOKEN = "x-cronlog-fencing-token"
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


@dataclass(slots=True)
class _Entry:
    newest: int | None = None
    busy_since: float | None = None
    reply: Reply | None = None
    stamp: float = 0.0


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

    def begin(self, key: str, token: int | None, now: float) -> tuple[Decision, Reply | None]:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or now - entry.stamp > self._ttl_s:
                entry = self._entries[key] = _Entry()
            self._entries.move_to_end(key)
            entry.stamp = now
            if token is not None:
                if entry.newest is not None and token < entry.newest:
                    return Decision.STALE, None
                entry.newest = token
            if entry.reply is not None:
                return Decision.REPLAY, entry.reply
            if entry.busy_since is not None and now - entry.busy_since < self._busy_s:
                return Decision.BUSY, None
            entry.busy_since = now
            while len(self._entries) > self._max_keys:  # evict the least recently used
                self._entries.popitem(last=False)
            return Decision.PROCEED, None

    def finish(self, key: str, reply: Reply | None, now: float) -> None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return
            entry.busy_since, entry.stamp = None, now
            if reply is not None:
                entry.reply = reply

    def newest(self, key: str) -> int | None:
        with self._lock:
            entry = self._entries.get(key)
            return None if entry is None else entry.newest


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
                " busy_since = excluded.busy_since, stamp = excluded.stamp",
                (key, newest, now, now),
            )
            return Decision.PROCEED, None

    def finish(self, key: str, reply: Reply | None, now: float) -> None:
        with self._db() as db:
            if reply is None:
                db.execute("UPDATE runs SET busy_since = NULL, stamp = ? WHERE key = ?", (now, key))
                return
            headers = json.dumps([[k.decode(), v.decode()] for k, v in reply.headers])
            db.execute(
                "UPDATE runs SET busy_since = NULL, status = ?, headers = ?, body = ?, stamp = ?"
                " WHERE key = ?",
                (reply.status, headers, reply.body, now, key),
            )

    def newest(self, key: str) -> int | None:
        with self._db() as db:
            row = db.execute("SELECT newest FROM runs WHERE key = ?", (key,)).fetchone()
            return None if row is None else row[0]


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

    def finish(self, admission: Admission, reply: Reply | None) -> None:
        """The admitted request was handled; ``reply`` its answer (None: it failed or was
        not completed). A successful answer is kept for repeats of the key."""
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
        self.store.finish(admission.key, keep, self._clock())

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
    ``scope["cronlog.run"]``."""

    def __init__(self, app: ASGIApp, guard: RunGuard | None = None) -> None:
        self.app = app
        self.guard = guard if guard is not None else RunGuard()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
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
            self.guard.finish(admission, answer.reply())


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


async def _send(send: Send, reply: Reply) -> None:
    headers = [(k, v) for k, v in reply.headers if k.lower() not in _NOT_KEPT]
    headers.append((b"content-length", str(len(reply.body)).encode()))
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    await send({"type": "http.response.body", "body": reply.body})
