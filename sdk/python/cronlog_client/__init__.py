"""cronlog's client SDK: a typed client for the HTTP API (blocking and asyncio), a pull worker,
and a middleware that makes a target service handle each run once.

- :class:`Client`, :class:`AsyncClient`: every operation of the API (``client.py``);
- :class:`Worker`: claim, heartbeat, complete, with the fencing token handled (``worker.py``);
- :class:`RunGuard`, :class:`CronlogTargetMiddleware`: honour ``Idempotency-Key`` and refuse a
  fencing token older than the newest seen for the run (``target.py``);
- :mod:`cronlog_client.errors`: the API's refusals as exceptions.

It depends on httpx, httpx-sse and msgspec only, and never on the service's own packages.
"""

from cronlog_client.client import AsyncClient, Client
from cronlog_client.errors import (
    ApiError,
    Conflict,
    CronlogError,
    Forbidden,
    InvalidRequest,
    LeaseLost,
    NotFound,
    RateLimited,
    Refused,
    Unauthorized,
    Unavailable,
    Unreachable,
)
from cronlog_client.models import (
    UNSET,
    BackoffIn,
    Beat,
    ClaimedRun,
    Completion,
    CompletionBatch,
    CompletionResult,
    Event,
    HeartbeatBatch,
    HeartbeatResult,
    HttpTarget,
    Job,
    JobBatch,
    JobDefinition,
    JobPatch,
    JobResult,
    KafkaTarget,
    NewJob,
    Preview,
    PullTarget,
    Run,
    SecretRef,
    Slots,
)
from cronlog_client.target import (
    CronlogTargetMiddleware,
    MemoryStore,
    Reply,
    RunGuard,
    SQLiteStore,
    bearer_token,
)
from cronlog_client.worker import PermanentFailure, RetryLater, RunContext, RunLost, Worker

__version__ = "0.1.0"

__all__ = [
    "UNSET",
    "ApiError",
    "AsyncClient",
    "BackoffIn",
    "Beat",
    "ClaimedRun",
    "Client",
    "Completion",
    "CompletionBatch",
    "CompletionResult",
    "Conflict",
    "CronlogError",
    "CronlogTargetMiddleware",
    "Event",
    "Forbidden",
    "HeartbeatBatch",
    "HeartbeatResult",
    "HttpTarget",
    "InvalidRequest",
    "Job",
    "JobBatch",
    "JobDefinition",
    "JobPatch",
    "JobResult",
    "KafkaTarget",
    "LeaseLost",
    "MemoryStore",
    "NewJob",
    "NotFound",
    "PermanentFailure",
    "Preview",
    "PullTarget",
    "RateLimited",
    "Refused",
    "Reply",
    "RetryLater",
    "Run",
    "RunContext",
    "RunGuard",
    "RunLost",
    "SQLiteStore",
    "SecretRef",
    "Slots",
    "Unauthorized",
    "Unavailable",
    "Unreachable",
    "Worker",
    "__version__",
    "bearer_token",
]
