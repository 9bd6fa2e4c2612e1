"""``POST /v1/jobs/{job_id}/preview``: what a change to a job would do to when it fires, before
it is made.

The body is a PATCH's (the fields given replace the job's); nothing is written. The answer holds
the next fire times as the job stands (``before``) and as it would stand (``after``), and the
slots the change would add and drop. The next slot after the change is the one an update would
decide (:func:`core.decide.next_slot_after_update`), so the preview cannot promise what the
update then does otherwise. An invalid change is refused as the PATCH would refuse it: 400 or
422 naming the field.

The two lists are compared up to the earlier of their last fire times when both are full (``n``
each): past it, one list has stopped and the other has not, and a slot absent from the shorter
list is not dropped, only not shown. ``compared_until`` says where the comparison stops (null:
both lists hold every fire time the job has).
"""

from __future__ import annotations

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from api.edge import authenticate, decode, job_view, json_response, query_int
from api.instants import to_rfc3339
from api.jobs import fire_list, fire_times
from api.translate import spec_of
from api.wire import MAX_PREVIEW, FireTime, JobFields, PreviewOut
from core.decide import next_slot_after_update
from core.ids import team_id


class ChangePreviewOut(msgspec.Struct, kw_only=True):
    job_id: str
    before: PreviewOut
    after: PreviewOut
    added: list[FireTime]
    dropped: list[FireTime]
    compared_until: str | None


def compared_until(before: list[int], after: list[int], n: int) -> int | None:
    """Where two lists of the next ``n`` fire times can be compared up to (None: anywhere)."""
    ends = [fires[-1] for fires in (before, after) if len(fires) == n]
    return min(ends) if ends else None


async def preview_change(request: Request) -> Response:
    call = authenticate(request)
    job_id = call.job_id(request.path_params["job_id"])
    body = await decode(request, JobFields)
    n = query_int(request, 10, MAX_PREVIEW, "n")
    view = await job_view(call, job_id)
    spec = spec_of(body, call.tenant, base=view.spec, scope=call.job_id)
    now = call.scheduler.now_ms()
    changed = msgspec.structs.replace(
        view, spec=spec, next_slot=next_slot_after_update(view.spec, spec, view.next_slot, now)
    )
    before, after = fire_times(view, now, n), fire_times(changed, now, n)
    until = compared_until(before, after, n)
    kept_before, kept_after = set(before), set(after)

    def within(slot: int) -> bool:
        return until is None or slot <= until

    added = [s for s in after if s not in kept_before and within(s)]
    dropped = [s for s in before if s not in kept_after and within(s)]
    return json_response(
        ChangePreviewOut(
            job_id=team_id(job_id),
            before=PreviewOut(
                job_id=team_id(job_id),
                schedule=view.spec.schedule,
                timezone=view.spec.timezone,
                fires=fire_list(view.spec.timezone, before),
            ),
            after=PreviewOut(
                job_id=team_id(job_id),
                schedule=spec.schedule,
                timezone=spec.timezone,
                fires=fire_list(spec.timezone, after),
            ),
            added=fire_list(spec.timezone, added),
            dropped=fire_list(view.spec.timezone, dropped),
            compared_until=None if until is None else to_rfc3339(until),
        )
    )
