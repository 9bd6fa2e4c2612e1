"""What the API answers when it refuses, as exceptions: one tree, rooted in :class:`CronlogError`.

=========================  ======  ==============================================
exception                  status  meaning
=========================  ======  ==============================================
:class:`InvalidRequest`    400     the request does not match the API's document
                           413     (``field`` names the part, when there is one)
                           415
:class:`Refused`           422     well-formed, refused by a rule (``field``)
:class:`Unauthorized`      401     no token, or not one the node knows
:class:`Forbidden`         403     the team's quota, or another team's events
:class:`NotFound`          404     no such job or run (or another team's)
:class:`LeaseLost`         409     the fencing token does not hold the lease: stop
:class:`Conflict`          409     a version, a run's state
:class:`RateLimited`       429     wait ``retry_after`` seconds
:class:`Unavailable`       503     nothing was decided; try again
:class:`Unreachable`       --      no answer at all (connection refused, timeout)
=========================  ======  ==============================================
"""

from __future__ import annotations

from typing import Any


class CronlogError(Exception):
    """Every error of this package."""


class Unreachable(CronlogError):
    """The node could not be asked: no connection, or no answer in time."""


class ApiError(CronlogError):
    """The API's refusal: ``status``, its ``error`` code, its ``message``, and the ``field``
    it names when it names one."""

    def __init__(
        self,
        status: int,
        error: str,
        message: str,
        *,
        field: str | None = None,
        retry_after: float | None = None,
        body: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(f"{status} {error}: {message}" + (f" (field {field})" if field else ""))
        self.status = status
        self.error = error
        self.message = message
        self.field = field
        self.retry_after = retry_after
        self.body = body or {}


class InvalidRequest(ApiError):
    """400, 413, 415: the request does not match the API's document."""


class Refused(ApiError):
    """422: the request is well-formed, and a rule beyond the schema refuses it."""


class Unauthorized(ApiError):
    """401."""


class Forbidden(ApiError):
    """403."""


class NotFound(ApiError):
    """404."""


class Conflict(ApiError):
    """409: conflicts with the current state."""


class LeaseLost(Conflict):
    """409 ``lease_lost``: the run was reclaimed or cancelled; the worker must stop working on
    it and not complete it. ``cancelled`` says which."""

    @property
    def cancelled(self) -> bool:
        return bool(self.body.get("cancelled"))


class RateLimited(ApiError):
    """429: the token spent its requests, or its team holds as many waiting requests open as it
    may; ``retry_after`` says when to try again."""


class Unavailable(ApiError):
    """503: the partition could not decide now; nothing was decided, so a retry is safe."""


_BY_STATUS: dict[int, type[ApiError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: InvalidRequest,
    415: InvalidRequest,
    422: Refused,
    429: RateLimited,
    503: Unavailable,
}


def from_response(status: int, body: Any, retry_after: str | None) -> ApiError:
    """The exception for an error answer (``body``: its decoded JSON, if any)."""
    fields = body if isinstance(body, dict) else {}
    error = str(fields.get("error") or "http")
    message = str(fields.get("message") or body or f"HTTP {status}")
    kind = LeaseLost if error == "lease_lost" else _BY_STATUS.get(status, ApiError)
    wait = None
    if retry_after is not None and retry_after.strip().isdigit():
        wait = float(retry_after.strip())
    return kind(status, error, message, field=fields.get("field"), retry_after=wait, body=fields)
