"""Typed clients for cronlog's HTTP API: :class:`Client` (blocking) and :class:`AsyncClient`.

::

    from cronlog_client import Client, NewJob

    with Client("http://127.0.0.1:8080", token="...") as cronlog:
        job = cronlog.create_job(NewJob(name="report", schedule="0 9 * * 1-5",
                                        timezone="Europe/London", target="pull://reports"))
        for run in cronlog.iter_job_runs(job.job_id):
            print(run.run_id, run.state)

Both speak the same operations (each request is described once, in :class:`_Requests`) over
httpx. ``url`` and ``token`` default to ``CRONLOG_URL`` and ``CRONLOG_TOKEN``. A refusal raises
the :mod:`cronlog_client.errors` exception for its status. A 429 or a 503 (nothing was decided:
the API says so) is tried again after its ``Retry-After``, at most ``retries`` times. A request
that failed on its way is tried again when it never left (no connection could be made, or
none was free in time), and otherwise only when repeating it is harmless (reads, and writes
that carry an idempotency key or a fencing token).

Connections are kept open between requests for ``KEEPALIVE_S`` (30 s), less than a node keeps
an idle connection (75 s): the client lets go of a connection before the node would close
it, so a request is never written to a connection the node is closing. At most
``MAX_CONNECTIONS`` requests are in flight at once; more wait their turn in the client, first
come first served, at no cost per waiter (httpx's own pool looks over every waiting request
each time a connection frees: a thousand runs heartbeating together spent a core there).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar
from urllib.parse import quote

import httpx
import msgspec
from httpx_sse import SSEError, aconnect_sse, connect_sse

from cronlog_client import errors
from cronlog_client.models import (
    Beat,
    ChangePreview,
    ClaimedRun,
    ClaimOut,
    Completion,
    CompletionBatch,
    CompletionResult,
    Event,
    Health,
    HeartbeatBatch,
    HeartbeatOut,
    HeartbeatResult,
    Job,
    JobBatch,
    JobDefinition,
    JobPage,
    JobPatch,
    JobResult,
    NewJob,
    Preview,
    ReplayOut,
    Run,
    RunPage,
    Slots,
    Stats,
    Team,
)

T = TypeVar("T")
ItemResult = TypeVar("ItemResult", CompletionResult, HeartbeatResult)
DEFAULT_URL = "http://127.0.0.1:8080"
DEFAULT_TIMEOUT_S = 30.0
MAX_RETRY_WAIT_S = 30.0
# How long an idle connection stays in the pool: less than ``cronlog serve`` keeps one open
# (cli.serve.KEEP_ALIVE_S, 75 s), by a margin wider than any answer's way back.
KEEPALIVE_S = 30.0
MAX_CONNECTIONS = 100  # open at once, each kept while it is idle less than KEEPALIVE_S
MAX_BATCH_JOBS = 1000  # the most jobs POST /v1/jobs:batch takes at once
MAX_BATCH_RUNS = 1000  # the most outcomes POST /v1/runs:complete takes at once
MAX_BATCH_BEATS = 1000  # the most heartbeats POST /v1/runs:heartbeat takes at once
RECONNECTS = 10  # a following event stream gives up after this many failures in a row
RunStateName = Literal[
    "blocked", "pending", "running", "succeeded", "failed", "retrying", "dead", "cancelled"
]

_encoder = msgspec.json.Encoder()


def _instant(value: dt.datetime | str) -> str:
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            raise ValueError(f"{value!r} has no timezone: give an aware datetime")
        return value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")
    return value


def _path(*parts: str) -> str:
    return "/" + "/".join(quote(part, safe="") for part in parts)


@dataclass(frozen=True, slots=True)
class _Request(Generic[T]):
    """One operation: what to send, and what its answer decodes to (None: nothing)."""

    method: str
    path: str
    out: type[T] | None
    params: dict[str, Any] | None = None
    body: Any = msgspec.UNSET
    headers: dict[str, str] = field(default_factory=dict)
    repeatable: bool = False  # harmless to send again if it may not have arrived


class _Requests:
    """Every operation of the API, described once for both clients."""

    @staticmethod
    def create_job(job: NewJob) -> _Request[Job]:
        repeatable = job.idempotency_key is not msgspec.UNSET or job.job_id is not msgspec.UNSET
        return _Request("POST", "/v1/jobs", Job, body=job, repeatable=repeatable)

    @staticmethod
    def create_jobs(jobs: Sequence[NewJob]) -> _Request[JobBatch]:
        repeatable = all(
            job.idempotency_key is not msgspec.UNSET or job.job_id is not msgspec.UNSET
            for job in jobs
        )
        return _Request(
            "POST", "/v1/jobs:batch", JobBatch, body={"jobs": list(jobs)}, repeatable=repeatable
        )

    @staticmethod
    def put_job(job_id: str, job: JobDefinition, if_version: int | None) -> _Request[Job]:
        headers = {} if if_version is None else {"If-Match": str(if_version)}
        return _Request(
            "PUT", _path("v1", "jobs", job_id), Job, body=job, headers=headers, repeatable=True
        )

    @staticmethod
    def patch_job(job_id: str, patch: JobPatch) -> _Request[Job]:
        return _Request("PATCH", _path("v1", "jobs", job_id), Job, body=patch)

    @staticmethod
    def get_job(job_id: str) -> _Request[Job]:
        return _Request("GET", _path("v1", "jobs", job_id), Job)

    @staticmethod
    def list_jobs(
        status: str | None,
        limit: int | None,
        cursor: str | None,
        q: str | None,
        tag: str | None,
        name: str | None = None,
    ) -> _Request[JobPage]:
        params = {
            "status": status,
            "limit": limit,
            "cursor": cursor,
            "q": q,
            "tag": tag,
            "name": name,
        }
        return _Request("GET", "/v1/jobs", JobPage, params=params)

    @staticmethod
    def preview_change(job_id: str, change: JobPatch, n: int) -> _Request[ChangePreview]:
        fields = msgspec.structs.replace(change, status=msgspec.UNSET, version=msgspec.UNSET)
        return _Request(
            "POST",
            _path("v1", "jobs", job_id, "preview"),
            ChangePreview,
            params={"n": n},
            body=fields,
            repeatable=True,
        )

    @staticmethod
    def replay_dead(
        job_id: str | None,
        reason: str | None,
        scheduled_after: dt.datetime | str | None,
        scheduled_before: dt.datetime | str | None,
        limit: int,
        dry_run: bool,
        cursor: str | None,
    ) -> _Request[ReplayOut]:
        body: dict[str, Any] = {"limit": limit, "dry_run": dry_run}
        for name, value in (("job_id", job_id), ("reason", reason), ("cursor", cursor)):
            if value is not None:
                body[name] = value
        for name, at in (
            ("scheduled_after", scheduled_after),
            ("scheduled_before", scheduled_before),
        ):
            if at is not None:
                body[name] = _instant(at)
        return _Request("POST", "/v1/runs/replay", ReplayOut, body=body, repeatable=dry_run)

    @staticmethod
    def stats(window_min: int | None, step_min: int | None) -> _Request[Stats]:
        params = {"window_min": window_min, "step_min": step_min}
        return _Request("GET", "/v1/stats", Stats, params=params)

    @staticmethod
    def team() -> _Request[Team]:
        return _Request("GET", "/v1/team", Team)

    @staticmethod
    def cancel_job(job_id: str, if_version: int | None) -> _Request[Job]:
        headers = {} if if_version is None else {"If-Match": str(if_version)}
        return _Request(
            "DELETE", _path("v1", "jobs", job_id), Job, headers=headers, repeatable=True
        )

    @staticmethod
    def job_runs(job_id: str, limit: int | None, cursor: str | None) -> _Request[RunPage]:
        params = {"limit": limit, "cursor": cursor}
        return _Request("GET", _path("v1", "jobs", job_id, "runs"), RunPage, params=params)

    @staticmethod
    def trigger(
        job_id: str, scheduled_for: dt.datetime | str | None, idempotency_key: str | None
    ) -> _Request[Run]:
        body = {} if scheduled_for is None else {"scheduled_for": _instant(scheduled_for)}
        headers = {} if idempotency_key is None else {"Idempotency-Key": idempotency_key}
        return _Request(
            "POST",
            _path("v1", "jobs", job_id, "runs"),
            Run,
            body=body,
            headers=headers,
            repeatable=idempotency_key is not None or scheduled_for is not None,
        )

    @staticmethod
    def preview_job(job_id: str, n: int) -> _Request[Preview]:
        return _Request("GET", _path("v1", "jobs", job_id, "preview"), Preview, params={"n": n})

    @staticmethod
    def job_slots(
        job_id: str, start: dt.datetime | str, end: dt.datetime | str, limit: int | None
    ) -> _Request[Slots]:
        params = {"from": _instant(start), "to": _instant(end), "limit": limit}
        return _Request("GET", _path("v1", "jobs", job_id, "slots"), Slots, params=params)

    @staticmethod
    def preview_schedule(
        schedule: str,
        seconds: str | None,
        timezone: str,
        n: int,
        after: dt.datetime | str | None,
    ) -> _Request[Preview]:
        body: dict[str, Any] = {"schedule": schedule, "timezone": timezone, "n": n}
        if seconds is not None:
            body["seconds"] = seconds
        if after is not None:
            body["after"] = _instant(after)
        return _Request("POST", "/v1/schedules/preview", Preview, body=body, repeatable=True)

    @staticmethod
    def list_runs(state: str, limit: int | None, cursor: str | None) -> _Request[RunPage]:
        params = {"state": state, "limit": limit, "cursor": cursor}
        return _Request("GET", "/v1/runs", RunPage, params=params)

    @staticmethod
    def get_run(run_id: str) -> _Request[Run]:
        return _Request("GET", _path("v1", "runs", run_id), Run)

    @staticmethod
    def cancel_run(run_id: str) -> _Request[Run]:
        return _Request("POST", _path("v1", "runs", run_id, "cancel"), Run, repeatable=True)

    @staticmethod
    def replay_run(run_id: str) -> _Request[Run]:
        return _Request("POST", _path("v1", "runs", run_id, "replay"), Run)

    @staticmethod
    def claim(
        pool: str, worker_id: str, limit: int, wait_sec: float, ahead_sec: float = 0.0
    ) -> _Request[ClaimOut]:
        body: dict[str, Any] = {
            "pool": pool,
            "worker_id": worker_id,
            "limit": limit,
            "wait_sec": wait_sec,
        }
        if ahead_sec:
            body["ahead_sec"] = ahead_sec
        return _Request("POST", "/v1/workers/claim", ClaimOut, body=body)

    @staticmethod
    def heartbeat(
        run_id: str, fencing_token: int, check: bool = False, started_late_ms: int | None = None
    ) -> _Request[HeartbeatOut]:
        body: dict[str, Any] = {"fencing_token": fencing_token}
        if check:
            body["check"] = True
        if started_late_ms is not None:
            body["started_late_ms"] = started_late_ms
        return _Request(
            "POST",
            _path("v1", "runs", run_id, "heartbeat"),
            HeartbeatOut,
            body=body,
            repeatable=True,
        )

    @staticmethod
    def complete(
        run_id: str,
        fencing_token: int,
        status: Literal["succeeded", "failed"],
        error: str,
        permanent: bool,
        ambiguous: bool,
        retry_after_sec: float | None,
        started_late_ms: int | None = None,
    ) -> _Request[Run]:
        body: dict[str, Any] = {
            "fencing_token": fencing_token,
            "status": status,
            "error": error,
            "permanent": permanent,
            "ambiguous": ambiguous,
        }
        if retry_after_sec is not None:
            body["retry_after_sec"] = retry_after_sec
        if started_late_ms is not None:
            body["started_late_ms"] = started_late_ms
        return _Request(
            "POST", _path("v1", "runs", run_id, "complete"), Run, body=body, repeatable=True
        )

    @staticmethod
    def complete_many(completions: Sequence[Completion]) -> _Request[CompletionBatch]:
        # A repeated outcome is refused (409: its lease is gone), never recorded twice.
        return _Request(
            "POST",
            "/v1/runs:complete",
            CompletionBatch,
            body={"runs": [_completion_body(c) for c in completions]},
            repeatable=True,
        )

    @staticmethod
    def heartbeat_many(beats: Sequence[Beat]) -> _Request[HeartbeatBatch]:
        # A repeated heartbeat extends the same lease again: its fencing token still holds it.
        return _Request(
            "POST",
            "/v1/runs:heartbeat",
            HeartbeatBatch,
            body={"runs": list(beats)},
            repeatable=True,
        )

    @staticmethod
    def health(path: str) -> _Request[Health]:
        return _Request("GET", path, Health)

    @staticmethod
    def events_params(
        start: dt.datetime | str | None,
        cursor: str | None,
        job: str | None,
        tenant: str | None,
        follow: bool,
        max_events: int | None,
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"follow": "true" if follow else "false"}
        if cursor is not None:
            params["cursor"] = cursor
        elif start is not None:
            params["from"] = _instant(start)
        for name, value in (("job", job), ("tenant", tenant), ("max_events", max_events)):
            if value is not None:
                params[name] = value
        return params


def _query(params: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if params is None else {k: v for k, v in params.items() if v is not None}


def _content(request: _Request[Any]) -> tuple[bytes | None, dict[str, str]]:
    if request.body is msgspec.UNSET:
        return None, dict(request.headers)
    return _encoder.encode(request.body), {"Content-Type": "application/json", **request.headers}


def _answer(request: _Request[T], response: httpx.Response) -> T:
    if response.is_success:
        if request.out is None:
            return None  # type: ignore[return-value]
        return msgspec.json.decode(response.content, type=request.out)
    raise _refusal(response)


def _refusal(response: httpx.Response) -> errors.ApiError:
    try:
        body: Any = response.json()
    except ValueError:
        body = response.text[:500]
    return errors.from_response(response.status_code, body, response.headers.get("Retry-After"))


def _limits() -> httpx.Limits:
    return httpx.Limits(
        max_connections=MAX_CONNECTIONS,
        max_keepalive_connections=MAX_CONNECTIONS,
        keepalive_expiry=KEEPALIVE_S,
    )


def _may_send_again(request: _Request[Any], error: httpx.TransportError) -> bool:
    """A request that failed on its way may go again: it never left (no connection, or no
    free one in time), or repeating it is harmless."""
    never_sent = isinstance(error, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout)
    return never_sent or request.repeatable or request.method == "GET"


def _retry_wait(error: errors.ApiError, attempt: int) -> float | None:
    """How long to wait before sending again after ``error`` (None: do not)."""
    if not isinstance(error, errors.RateLimited | errors.Unavailable):
        return None
    wait = error.retry_after if error.retry_after is not None else 0.2 * 2**attempt
    return min(wait, MAX_RETRY_WAIT_S)


class _Batches:
    """``create_jobs``'s plan: the jobs keyed (with ``idempotency_key``), cut into requests of
    at most ``MAX_BATCH_JOBS``, and the results put back together in the order given. Items
    the node answered 429 (the token's rate ran out part way) were not tried: they are sent
    again, alone, after a wait."""

    def __init__(self, jobs: Sequence[NewJob], idempotency_key: str | None) -> None:
        if idempotency_key is not None:
            jobs = [
                job
                if job.job_id is not msgspec.UNSET or job.idempotency_key is not msgspec.UNSET
                else msgspec.structs.replace(job, idempotency_key=f"{idempotency_key}#{i}")
                for i, job in enumerate(jobs)
            ]
        self.jobs = list(jobs)
        self.results: list[JobResult | None] = [None] * len(self.jobs)
        self.todo = list(range(len(self.jobs)))

    def requests(self) -> Iterator[tuple[list[int], _Request[JobBatch]]]:
        todo, self.todo = self.todo, []
        for start in range(0, len(todo), MAX_BATCH_JOBS):
            indices = todo[start : start + MAX_BATCH_JOBS]
            yield indices, _Requests.create_jobs([self.jobs[i] for i in indices])

    def take(self, indices: list[int], answer: JobBatch) -> None:
        for result in answer.results:
            i = indices[result.index]
            error = result.error
            sent_as = f"jobs[{result.index}]"
            if error is not None and error.field is not None and error.field.startswith(sent_as):
                error.field = f"jobs[{i}]" + error.field[len(sent_as) :]  # as given, not as sent
            result.index = i
            self.results[i] = result
            if result.status == 429:
                self.todo.append(i)

    def wait(self, attempt: int) -> float | None:
        """Seconds to wait before sending the rate-limited items again (None: stop)."""
        return min(2.0**attempt, MAX_RETRY_WAIT_S) if self.todo else None

    def outcome(self) -> JobBatch:
        results = [r for r in self.results if r is not None]
        created = sum(1 for r in results if r.status == 201)
        existing = sum(1 for r in results if r.status == 200)
        return JobBatch(
            results=results,
            created=created,
            existing=existing,
            failed=len(results) - created - existing,
        )


def _completion_body(completion: Completion) -> dict[str, Any]:
    """An outcome as sent: ``started_late_ms`` only when there is one, so a node older than it
    takes the outcomes of runs that were not leased ahead."""
    body: dict[str, Any] = msgspec.structs.asdict(completion)
    if body["started_late_ms"] is None:
        del body["started_late_ms"]
    return body


def _completion_requests(
    completions: Sequence[Completion],
) -> Iterator[tuple[int, _Request[CompletionBatch]]]:
    """``complete_many``'s requests, at most ``MAX_BATCH_RUNS`` outcomes each, with the place
    of each one's first outcome in the whole."""
    for start in range(0, len(completions), MAX_BATCH_RUNS):
        yield start, _Requests.complete_many(completions[start : start + MAX_BATCH_RUNS])


def _as_given(start: int, result: ItemResult) -> ItemResult:
    """A result of a request that held the items from ``start`` on, its index and the field
    it names as in the whole list given, not as in that request."""
    error = result.error
    sent_as = f"runs[{result.index}]"
    if error is not None and error.field is not None and error.field.startswith(sent_as):
        error.field = f"runs[{start + result.index}]" + error.field[len(sent_as) :]
    result.index += start
    return result


def _completions_joined(parts: list[tuple[int, CompletionBatch]]) -> CompletionBatch:
    """The answers of ``complete_many``'s requests as one, indices and fields as given."""
    results = [_as_given(start, result) for start, answer in parts for result in answer.results]
    completed = sum(1 for r in results if r.ok)
    return CompletionBatch(results=results, completed=completed, failed=len(results) - completed)


def _heartbeat_requests(
    beats: Sequence[Beat],
) -> Iterator[tuple[int, _Request[HeartbeatBatch]]]:
    """``heartbeat_many``'s requests, at most ``MAX_BATCH_BEATS`` heartbeats each, with the
    place of each one's first heartbeat in the whole."""
    for start in range(0, len(beats), MAX_BATCH_BEATS):
        yield start, _Requests.heartbeat_many(beats[start : start + MAX_BATCH_BEATS])


def _heartbeats_joined(parts: list[tuple[int, HeartbeatBatch]]) -> HeartbeatBatch:
    """The answers of ``heartbeat_many``'s requests as one, indices and fields as given."""
    results = [_as_given(start, result) for start, answer in parts for result in answer.results]
    extended = sum(1 for r in results if r.ok)
    return HeartbeatBatch(results=results, extended=extended, failed=len(results) - extended)


def _token(token: str | None) -> str:
    found = token or os.environ.get("CRONLOG_TOKEN")
    if not found:
        raise errors.CronlogError("no token: pass token= or set CRONLOG_TOKEN")
    return found


def _event(sse: Any) -> Event | None:
    if not sse.data:
        return None
    event = msgspec.json.decode(sse.data, type=Event)
    event.cursor = sse.id or ""
    return event


class Client:
    """The API, blocking. ``with Client(...) as cronlog:`` closes its connections at the end.

    ``transport`` replaces httpx's (tests run the app in process); ``retries`` bounds the
    retries of a 429, a 503 or a request that could not be sent."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        retries: int = 3,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.url = url or os.environ.get("CRONLOG_URL") or DEFAULT_URL
        self._retries = retries
        self._sleep = sleep
        self._turns = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._http = httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {_token(token)}"},
            timeout=timeout_s,
            transport=transport,
            limits=_limits(),
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _send(self, request: _Request[T], timeout_s: float | None = None) -> T:
        content, headers = _content(request)
        for attempt in range(self._retries + 1):
            try:
                with self._turns:
                    response = self._http.request(
                        request.method,
                        request.path,
                        params=_query(request.params),
                        content=content,
                        headers=headers,
                        timeout=timeout_s if timeout_s is not None else httpx.USE_CLIENT_DEFAULT,
                    )
            except httpx.TransportError as e:
                if attempt < self._retries and _may_send_again(request, e):
                    self._sleep(min(0.2 * 2**attempt, MAX_RETRY_WAIT_S))
                    continue
                raise errors.Unreachable(f"{self.url}: {e!r}") from e
            try:
                return _answer(request, response)
            except errors.ApiError as refusal:
                wait = _retry_wait(refusal, attempt)
                if wait is None or attempt >= self._retries:
                    raise
                self._sleep(wait)
        raise AssertionError("unreachable")  # the loop returns or raises

    # -- jobs -----------------------------------------------------------------------------------

    def create_job(self, job: NewJob) -> Job:
        return self._send(_Requests.create_job(job))

    def create_jobs(
        self, jobs: Sequence[NewJob], *, idempotency_key: str | None = None
    ) -> JobBatch:
        """Create many jobs (``POST /v1/jobs:batch``, 1,000 a request): one result per job, in
        order, each 201, 200 or the refusal a single create would get. ``idempotency_key``
        makes the whole call safe to repeat: a job that names neither ``job_id`` nor its own
        key gets the job of ``<idempotency_key>#<its index>``. Jobs refused for the token's
        rate are sent again after a wait, up to ``retries`` times."""
        batches = _Batches(jobs, idempotency_key)
        for attempt in range(self._retries + 1):
            for indices, request in batches.requests():
                batches.take(indices, self._send(request))
            wait = batches.wait(attempt)
            if wait is None or attempt >= self._retries:
                break
            self._sleep(wait)
        return batches.outcome()

    def put_job(self, job_id: str, job: JobDefinition, *, if_version: int | None = None) -> Job:
        return self._send(_Requests.put_job(job_id, job, if_version))

    def patch_job(self, job_id: str, patch: JobPatch) -> Job:
        return self._send(_Requests.patch_job(job_id, patch))

    def pause_job(self, job_id: str) -> Job:
        return self.patch_job(job_id, JobPatch(status="paused"))

    def resume_job(self, job_id: str) -> Job:
        return self.patch_job(job_id, JobPatch(status="active"))

    def get_job(self, job_id: str) -> Job:
        return self._send(_Requests.get_job(job_id))

    def list_jobs(
        self,
        status: str | None = None,
        *,
        limit: int | None = None,
        cursor: str | None = None,
        q: str | None = None,
        tag: str | None = None,
        name: str | None = None,
    ) -> JobPage:
        """A page of the team's jobs; ``q``: only those whose name or id holds it; ``tag``:
        only those labelled with it; ``name``: only those called exactly that (a page may hold
        fewer than ``limit`` and still have a next one)."""
        return self._send(_Requests.list_jobs(status, limit, cursor, q, tag, name))

    def iter_jobs(
        self,
        status: str | None = None,
        *,
        page_size: int | None = None,
        q: str | None = None,
        tag: str | None = None,
        name: str | None = None,
    ) -> Iterator[Job]:
        cursor = None
        while True:  # each page moves the cursor on; the last has none
            page = self.list_jobs(status, limit=page_size, cursor=cursor, q=q, tag=tag, name=name)
            yield from page.jobs
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def cancel_job(self, job_id: str, *, if_version: int | None = None) -> Job:
        return self._send(_Requests.cancel_job(job_id, if_version))

    def job_runs(
        self, job_id: str, *, limit: int | None = None, cursor: str | None = None
    ) -> RunPage:
        return self._send(_Requests.job_runs(job_id, limit, cursor))

    def iter_job_runs(self, job_id: str, *, page_size: int | None = None) -> Iterator[Run]:
        cursor = None
        while True:
            page = self.job_runs(job_id, limit=page_size, cursor=cursor)
            yield from page.runs
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def trigger(
        self,
        job_id: str,
        *,
        scheduled_for: dt.datetime | str | None = None,
        idempotency_key: str | None = None,
    ) -> Run:
        """Run the job now, or run a past slot (a backfill of one)."""
        return self._send(_Requests.trigger(job_id, scheduled_for, idempotency_key))

    def preview_job(self, job_id: str, n: int = 10) -> Preview:
        return self._send(_Requests.preview_job(job_id, n))

    def preview_change(self, job_id: str, change: JobPatch, n: int = 10) -> ChangePreview:
        """What ``change`` would do to the job's fire times: before, after, the slots it adds
        and drops. Nothing is changed."""
        return self._send(_Requests.preview_change(job_id, change, n))

    def job_slots(
        self,
        job_id: str,
        start: dt.datetime | str,
        end: dt.datetime | str,
        *,
        limit: int | None = None,
    ) -> Slots:
        return self._send(_Requests.job_slots(job_id, start, end, limit))

    def preview_schedule(
        self,
        schedule: str,
        *,
        seconds: str | None = None,
        timezone: str = "UTC",
        n: int = 10,
        after: dt.datetime | str | None = None,
    ) -> Preview:
        return self._send(_Requests.preview_schedule(schedule, seconds, timezone, n, after))

    # -- runs -----------------------------------------------------------------------------------

    def list_runs(
        self, state: RunStateName = "dead", *, limit: int | None = None, cursor: str | None = None
    ) -> RunPage:
        return self._send(_Requests.list_runs(state, limit, cursor))

    def iter_runs(
        self, state: RunStateName = "dead", *, page_size: int | None = None
    ) -> Iterator[Run]:
        cursor = None
        while True:
            page = self.list_runs(state, limit=page_size, cursor=cursor)
            yield from page.runs
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def get_run(self, run_id: str) -> Run:
        return self._send(_Requests.get_run(run_id))

    def cancel_run(self, run_id: str) -> Run:
        return self._send(_Requests.cancel_run(run_id))

    def replay_run(self, run_id: str) -> Run:
        return self._send(_Requests.replay_run(run_id))

    def replay_dead(
        self,
        *,
        job_id: str | None = None,
        reason: str | None = None,
        scheduled_after: dt.datetime | str | None = None,
        scheduled_before: dt.datetime | str | None = None,
        limit: int = 100,
        dry_run: bool = False,
        cursor: str | None = None,
    ) -> ReplayOut:
        """Replay (or, dry, count) up to ``limit`` dead runs the filter names; pass the
        answer's ``next_cursor`` back to go on."""
        return self._send(
            _Requests.replay_dead(
                job_id, reason, scheduled_after, scheduled_before, limit, dry_run, cursor
            )
        )

    def stats(self, *, window_min: int | None = None, step_min: int | None = None) -> Stats:
        """The team's scheduling delay and outcomes by step over a window."""
        return self._send(_Requests.stats(window_min, step_min))

    def team(self) -> Team:
        """The team this token speaks for, its job count and its limits."""
        return self._send(_Requests.team())

    # -- pull workers ---------------------------------------------------------------------------

    def claim(
        self,
        pool: str,
        worker_id: str,
        *,
        limit: int = 1,
        wait_sec: float = 0.0,
        ahead_sec: float = 0.0,
    ) -> list[ClaimedRun]:
        """Lease up to ``limit`` ready runs of ``pool`` (``wait_sec``: long-poll for one).
        ``ahead_sec``: also runs that become ready within that long, each leased ahead: start
        it ``start_in_ms`` after the answer came, never before (:class:`Worker` does)."""
        out = self._send(
            _Requests.claim(pool, worker_id, limit, wait_sec, ahead_sec), timeout_s=wait_sec + 30
        )
        return out.runs

    def heartbeat(
        self,
        run_id: str,
        fencing_token: int,
        *,
        check: bool = False,
        started_late_ms: int | None = None,
    ) -> HeartbeatOut:
        """Extend the run's lease. ``check``: only ask whether it holds (a run leased ahead,
        about to start; nothing is extended). ``started_late_ms``: the run leased ahead started
        this long after its ``start_at`` (the first heartbeat after the start says so)."""
        return self._send(_Requests.heartbeat(run_id, fencing_token, check, started_late_ms))

    def complete(
        self,
        run_id: str,
        fencing_token: int,
        status: Literal["succeeded", "failed"] = "succeeded",
        *,
        error: str = "",
        permanent: bool = False,
        ambiguous: bool = False,
        retry_after_sec: float | None = None,
        started_late_ms: int | None = None,
    ) -> Run:
        return self._send(
            _Requests.complete(
                run_id,
                fencing_token,
                status,
                error,
                permanent,
                ambiguous,
                retry_after_sec,
                started_late_ms,
            )
        )

    def complete_many(self, completions: Sequence[Completion]) -> CompletionBatch:
        """Report many attempts' outcomes (``POST /v1/runs:complete``, 1,000 a request): one
        result per outcome, in order, each 200 or the refusal a single ``complete`` would get
        (409 ``lease_lost``, 404, 429 past the token's rate: look at ``refused``). One
        partition's outcomes are recorded in one write, so a worker that finishes runs by the
        hundred pays one request, not one each."""
        return _completions_joined(
            [(start, self._send(request)) for start, request in _completion_requests(completions)]
        )

    def heartbeat_many(self, beats: Sequence[Beat]) -> HeartbeatBatch:
        """Extend many runs' leases (``POST /v1/runs:heartbeat``, 1,000 a request): one result
        per heartbeat, in order, each 200 with the new ``lease_expires_at`` or the refusal a
        single ``heartbeat`` would get (409 ``lease_lost``: stop working on that run; 404; 429
        past the token's rate: look at ``refused``). A worker holding thousands of runs pays
        a request for the heartbeats that come due together, not one a run."""
        return _heartbeats_joined(
            [(start, self._send(request)) for start, request in _heartbeat_requests(beats)]
        )

    # -- the audit stream -----------------------------------------------------------------------

    def events(
        self,
        *,
        start: dt.datetime | str | None = None,
        cursor: str | None = None,
        job: str | None = None,
        tenant: str | None = None,
        follow: bool = False,
        max_events: int | None = None,
    ) -> Iterator[Event]:
        """The team's events (the operator's token: every team's) from ``cursor``, or from
        ``start`` ("start", "end" or an instant). With ``follow`` it keeps going, reconnecting
        from the last cursor when the connection drops (give up: :class:`Unreachable` after
        ``RECONNECTS`` failures in a row)."""
        params = _Requests.events_params(start, cursor, job, tenant, follow, max_events)
        failures = 0
        sent = 0
        while True:  # a reconnect per pass; bounded by RECONNECTS failures in a row
            try:
                with connect_sse(
                    self._http, "GET", "/v1/events", params=params, timeout=None
                ) as source:
                    if not source.response.is_success:
                        source.response.read()
                        raise _refusal(source.response)
                    for sse in source.iter_sse():
                        if sse.id:
                            params = {**params, "cursor": sse.id}
                            params.pop("from", None)
                        event = _event(sse)
                        if event is not None:
                            failures = 0
                            yield event
                            sent += 1
                            if max_events is not None and sent >= max_events:
                                return
            except (httpx.TransportError, SSEError) as e:
                failures += 1
                if not follow or failures >= RECONNECTS:
                    raise errors.Unreachable(f"{self.url}: the event stream broke: {e!r}") from e
                self._sleep(min(0.5 * 2 ** (failures - 1), MAX_RETRY_WAIT_S))
                continue
            if not follow:
                return
            # The server ended the stream (it is stopping): come back, as many times in a row
            # as a broken connection.
            failures += 1
            if failures >= RECONNECTS:
                raise errors.Unreachable(f"{self.url}: the event stream keeps ending")
            self._sleep(0.5)

    def backfill_plan(
        self, job_id: str, start: dt.datetime | str, end: dt.datetime | str, *, limit: int = 1000
    ) -> Slots:
        """The job's slots in ``[start, end]``: a backfill triggers those ``due`` with no run."""
        return self.job_slots(job_id, start, end, limit=limit)

    def backfill(
        self,
        job_id: str,
        start: dt.datetime | str,
        end: dt.datetime | str,
        *,
        limit: int = 1000,
        progress: Callable[[int, int, Run], None] | None = None,
    ) -> list[Run]:
        """Trigger every due slot of ``[start, end]`` that has no run, oldest first; returns the
        runs. Each trigger carries the key ``backfill:<job>:<slot>``, so running the same
        backfill again (after it stopped half-way, say) triggers each slot once.
        ``progress(done, total, run)`` is called after each one."""
        plan = self.backfill_plan(job_id, start, end, limit=limit)
        if plan.more:
            raise errors.CronlogError(
                f"job {job_id} has more than {limit} slots in the range; narrow it or raise limit"
            )
        todo = [s for s in plan.slots if s.due and s.state is None]
        runs = []
        for done, slot in enumerate(todo, 1):
            ms = int(slot.scheduled_for.timestamp() * 1000)
            run = self.trigger(
                job_id, scheduled_for=slot.scheduled_for, idempotency_key=f"backfill:{job_id}:{ms}"
            )
            runs.append(run)
            if progress is not None:
                progress(done, len(todo), run)
        return runs

    # -- the service ----------------------------------------------------------------------------

    def health(self) -> bool:
        return self._send(_Requests.health("/healthz")).status == "ok"

    def ready(self) -> bool:
        try:
            return self._send(_Requests.health("/readyz")).status == "ready"
        except errors.Unavailable:
            return False


class AsyncClient:
    """The API for asyncio; the same operations as :class:`Client`."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        retries: int = 3,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = url or os.environ.get("CRONLOG_URL") or DEFAULT_URL
        self._retries = retries
        self._turns = asyncio.Semaphore(MAX_CONNECTIONS)
        self._http = httpx.AsyncClient(
            base_url=self.url,
            headers={"Authorization": f"Bearer {_token(token)}"},
            timeout=timeout_s,
            transport=transport,
            limits=_limits(),
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _send(self, request: _Request[T], timeout_s: float | None = None) -> T:
        content, headers = _content(request)
        for attempt in range(self._retries + 1):
            try:
                async with self._turns:
                    response = await self._http.request(
                        request.method,
                        request.path,
                        params=_query(request.params),
                        content=content,
                        headers=headers,
                        timeout=timeout_s if timeout_s is not None else httpx.USE_CLIENT_DEFAULT,
                    )
            except httpx.TransportError as e:
                if attempt < self._retries and _may_send_again(request, e):
                    await asyncio.sleep(min(0.2 * 2**attempt, MAX_RETRY_WAIT_S))
                    continue
                raise errors.Unreachable(f"{self.url}: {e!r}") from e
            try:
                return _answer(request, response)
            except errors.ApiError as refusal:
                wait = _retry_wait(refusal, attempt)
                if wait is None or attempt >= self._retries:
                    raise
                await asyncio.sleep(wait)
        raise AssertionError("unreachable")

    # -- jobs -----------------------------------------------------------------------------------

    async def create_job(self, job: NewJob) -> Job:
        return await self._send(_Requests.create_job(job))

    async def create_jobs(
        self, jobs: Sequence[NewJob], *, idempotency_key: str | None = None
    ) -> JobBatch:
        """As :meth:`Client.create_jobs`."""
        batches = _Batches(jobs, idempotency_key)
        for attempt in range(self._retries + 1):
            for indices, request in batches.requests():
                batches.take(indices, await self._send(request))
            wait = batches.wait(attempt)
            if wait is None or attempt >= self._retries:
                break
            await asyncio.sleep(wait)
        return batches.outcome()

    async def put_job(
        self, job_id: str, job: JobDefinition, *, if_version: int | None = None
    ) -> Job:
        return await self._send(_Requests.put_job(job_id, job, if_version))

    async def patch_job(self, job_id: str, patch: JobPatch) -> Job:
        return await self._send(_Requests.patch_job(job_id, patch))

    async def pause_job(self, job_id: str) -> Job:
        return await self.patch_job(job_id, JobPatch(status="paused"))

    async def resume_job(self, job_id: str) -> Job:
        return await self.patch_job(job_id, JobPatch(status="active"))

    async def get_job(self, job_id: str) -> Job:
        return await self._send(_Requests.get_job(job_id))

    async def list_jobs(
        self,
        status: str | None = None,
        *,
        limit: int | None = None,
        cursor: str | None = None,
        q: str | None = None,
        tag: str | None = None,
        name: str | None = None,
    ) -> JobPage:
        return await self._send(_Requests.list_jobs(status, limit, cursor, q, tag, name))

    async def iter_jobs(
        self,
        status: str | None = None,
        *,
        page_size: int | None = None,
        q: str | None = None,
        tag: str | None = None,
        name: str | None = None,
    ) -> AsyncIterator[Job]:
        cursor = None
        while True:
            page = await self.list_jobs(
                status, limit=page_size, cursor=cursor, q=q, tag=tag, name=name
            )
            for job in page.jobs:
                yield job
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    async def cancel_job(self, job_id: str, *, if_version: int | None = None) -> Job:
        return await self._send(_Requests.cancel_job(job_id, if_version))

    async def job_runs(
        self, job_id: str, *, limit: int | None = None, cursor: str | None = None
    ) -> RunPage:
        return await self._send(_Requests.job_runs(job_id, limit, cursor))

    async def iter_job_runs(
        self, job_id: str, *, page_size: int | None = None
    ) -> AsyncIterator[Run]:
        cursor = None
        while True:
            page = await self.job_runs(job_id, limit=page_size, cursor=cursor)
            for run in page.runs:
                yield run
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    async def trigger(
        self,
        job_id: str,
        *,
        scheduled_for: dt.datetime | str | None = None,
        idempotency_key: str | None = None,
    ) -> Run:
        return await self._send(_Requests.trigger(job_id, scheduled_for, idempotency_key))

    async def preview_job(self, job_id: str, n: int = 10) -> Preview:
        return await self._send(_Requests.preview_job(job_id, n))

    async def preview_change(self, job_id: str, change: JobPatch, n: int = 10) -> ChangePreview:
        return await self._send(_Requests.preview_change(job_id, change, n))

    async def job_slots(
        self,
        job_id: str,
        start: dt.datetime | str,
        end: dt.datetime | str,
        *,
        limit: int | None = None,
    ) -> Slots:
        return await self._send(_Requests.job_slots(job_id, start, end, limit))

    async def preview_schedule(
        self,
        schedule: str,
        *,
        seconds: str | None = None,
        timezone: str = "UTC",
        n: int = 10,
        after: dt.datetime | str | None = None,
    ) -> Preview:
        return await self._send(_Requests.preview_schedule(schedule, seconds, timezone, n, after))

    # -- runs -----------------------------------------------------------------------------------

    async def list_runs(
        self, state: RunStateName = "dead", *, limit: int | None = None, cursor: str | None = None
    ) -> RunPage:
        return await self._send(_Requests.list_runs(state, limit, cursor))

    async def iter_runs(
        self, state: RunStateName = "dead", *, page_size: int | None = None
    ) -> AsyncIterator[Run]:
        cursor = None
        while True:
            page = await self.list_runs(state, limit=page_size, cursor=cursor)
            for run in page.runs:
                yield run
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    async def get_run(self, run_id: str) -> Run:
        return await self._send(_Requests.get_run(run_id))

    async def cancel_run(self, run_id: str) -> Run:
        return await self._send(_Requests.cancel_run(run_id))

    async def replay_run(self, run_id: str) -> Run:
        return await self._send(_Requests.replay_run(run_id))

    async def replay_dead(
        self,
        *,
        job_id: str | None = None,
        reason: str | None = None,
        scheduled_after: dt.datetime | str | None = None,
        scheduled_before: dt.datetime | str | None = None,
        limit: int = 100,
        dry_run: bool = False,
        cursor: str | None = None,
    ) -> ReplayOut:
        return await self._send(
            _Requests.replay_dead(
                job_id, reason, scheduled_after, scheduled_before, limit, dry_run, cursor
            )
        )

    async def stats(self, *, window_min: int | None = None, step_min: int | None = None) -> Stats:
        return await self._send(_Requests.stats(window_min, step_min))

    async def team(self) -> Team:
        return await self._send(_Requests.team())

    # -- pull workers ---------------------------------------------------------------------------

    async def claim(
        self,
        pool: str,
        worker_id: str,
        *,
        limit: int = 1,
        wait_sec: float = 0.0,
        ahead_sec: float = 0.0,
    ) -> list[ClaimedRun]:
        """As :meth:`Client.claim`."""
        out = await self._send(
            _Requests.claim(pool, worker_id, limit, wait_sec, ahead_sec), timeout_s=wait_sec + 30
        )
        return out.runs

    async def heartbeat(
        self,
        run_id: str,
        fencing_token: int,
        *,
        check: bool = False,
        started_late_ms: int | None = None,
    ) -> HeartbeatOut:
        """As :meth:`Client.heartbeat`."""
        return await self._send(_Requests.heartbeat(run_id, fencing_token, check, started_late_ms))

    async def complete(
        self,
        run_id: str,
        fencing_token: int,
        status: Literal["succeeded", "failed"] = "succeeded",
        *,
        error: str = "",
        permanent: bool = False,
        ambiguous: bool = False,
        retry_after_sec: float | None = None,
        started_late_ms: int | None = None,
    ) -> Run:
        return await self._send(
            _Requests.complete(
                run_id,
                fencing_token,
                status,
                error,
                permanent,
                ambiguous,
                retry_after_sec,
                started_late_ms,
            )
        )

    async def complete_many(self, completions: Sequence[Completion]) -> CompletionBatch:
        """As :meth:`Client.complete_many`."""
        return _completions_joined(
            [
                (start, await self._send(request))
                for start, request in _completion_requests(completions)
            ]
        )

    async def heartbeat_many(self, beats: Sequence[Beat]) -> HeartbeatBatch:
        """As :meth:`Client.heartbeat_many`."""
        return _heartbeats_joined(
            [(start, await self._send(request)) for start, request in _heartbeat_requests(beats)]
        )

    # -- the audit stream -----------------------------------------------------------------------

    async def events(
        self,
        *,
        start: dt.datetime | str | None = None,
        cursor: str | None = None,
        job: str | None = None,
        tenant: str | None = None,
        follow: bool = False,
        max_events: int | None = None,
    ) -> AsyncIterator[Event]:
        """As :meth:`Client.events`."""
        params = _Requests.events_params(start, cursor, job, tenant, follow, max_events)
        failures = 0
        sent = 0
        while True:
            try:
                async with aconnect_sse(
                    self._http, "GET", "/v1/events", params=params, timeout=None
                ) as source:
                    if not source.response.is_success:
                        await source.response.aread()
                        raise _refusal(source.response)
                    async for sse in source.aiter_sse():
                        if sse.id:
                            params = {**params, "cursor": sse.id}
                            params.pop("from", None)
                        event = _event(sse)
                        if event is not None:
                            failures = 0
                            yield event
                            sent += 1
                            if max_events is not None and sent >= max_events:
                                return
            except (httpx.TransportError, SSEError) as e:
                failures += 1
                if not follow or failures >= RECONNECTS:
                    raise errors.Unreachable(f"{self.url}: the event stream broke: {e!r}") from e
                await asyncio.sleep(min(0.5 * 2 ** (failures - 1), MAX_RETRY_WAIT_S))
                continue
            if not follow:
                return
            failures += 1
            if failures >= RECONNECTS:
                raise errors.Unreachable(f"{self.url}: the event stream keeps ending")
            await asyncio.sleep(0.5)

    # -- the service ----------------------------------------------------------------------------

    async def health(self) -> bool:
        return (await self._send(_Requests.health("/healthz"))).status == "ok"

    async def ready(self) -> bool:
        try:
            return (await self._send(_Requests.health("/readyz"))).status == "ready"
        except errors.Unavailable:
            return False
