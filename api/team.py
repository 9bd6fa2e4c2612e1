"""``GET /v1/team``: who a token speaks for and what that team may do.

A client (the status UI's sign-in) learns from it that a token is good, the team's name, how
many jobs it holds and its limits, without having to read a job first.
"""

from __future__ import annotations

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from api.edge import authenticate, json_response
from api.limits import TenantLimits


class TeamOut(msgspec.Struct, kw_only=True):
    tenant: str
    jobs: int
    limits: TenantLimits


async def get_team(request: Request) -> Response:
    call = authenticate(request)
    jobs = await call.scheduler.reader.job_count(call.tenant)
    return json_response(TeamOut(tenant=call.tenant, jobs=jobs, limits=call.limits))
