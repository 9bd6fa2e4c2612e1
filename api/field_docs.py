# ruff: noqa: E501  (a table of sentences, one a line, reads better unwrapped)
"""What each field of the API's bodies means, for ``/openapi.json``.

The wire structs say a field's type, bounds and whether it is required; this table says what it
is for. :func:`api.openapi.document` adds each description to the field's schema, by field name
(:data:`FIELDS`), or by struct and field where one name means something else in one place
(:data:`BY_STRUCT`), and a description to each struct that has none (:data:`STRUCTS`).
``tests/api/test_openapi_docs.py`` fails when a field of the document has no description, so a
new field is described where it is added.
"""

from __future__ import annotations

_WHEN = (
    "Exactly one of schedule, run_at and interval_sec says when a job fires (none with depends_on)."
)

FIELDS: dict[str, str] = {
    # -- a job's definition
    "name": "A name people read; need not be unique.",
    "schedule": "A 5-field cron expression (minute hour day-of-month month day-of-week) read in `timezone`; a sixth field is refused (Quartz reads it first, croniter last): put seconds in `seconds`. "
    + _WHEN,
    "seconds": "The seconds of a per-second schedule, a cron field (0, */10, 0,30, 5-10); absent or null: second 0.",
    "run_at": "The one instant a one-shot job runs at (RFC 3339). " + _WHEN,
    "interval_sec": "Seconds between the slots of an interval job. " + _WHEN,
    "start_at": "No slot before this instant (RFC 3339), for every kind of schedule; an interval job's slots are start_at + k x interval_sec (by default from its registration).",
    "end_at": "No slot after this instant (RFC 3339); then the job has no next slot and, once nothing of it is live, is finished.",
    "allow_past": "Accept a run_at or end_at more than a minute in the past (refused otherwise); not kept with the job.",
    "timezone": "The IANA timezone a cron schedule is read in (e.g. Europe/London).",
    "payload": "Any JSON (at most 64 KiB), sent to the target with every attempt.",
    "target": "Where a run goes: https://... (POST), kafka://topic, pull://pool, or the object forms.",
    "retries": "Attempts after the first that a failing run may have (retries + 1 in all).",
    "timeout_sec": "How long an attempt may take before it counts as failed.",
    "lease_sec": "How long a pull worker's lease lasts between heartbeats.",
    "priority": "0-9: a higher priority is claimed first; waiting runs gain a level a minute.",
    "misfire_policy": "What happens to slots the scheduler reaches late: skip, fire_once, catch_up.",
    "misfire_grace_sec": "How late a slot may start and still count as on time.",
    "catch_up_limit": "With catch_up, how many of the latest late slots run.",
    "overlap_policy": "What a slot does while an earlier run is live: allow, skip, buffer_one, cancel_other.",
    "allow_jitter_sec": "Spreads each run's start over this many seconds after its slot.",
    "critical": "Never run twice automatically: an attempt whose outcome is unknown dead-letters.",
    "depends_on": "Job ids this job waits for: it runs each time all of them have succeeded.",
    "backoff": "The delays between retries.",
    "tags": "Labels to find the job by (GET /v1/jobs?tag=): at most 16, each 1-64 of A-Z a-z 0-9 _ . : = - (e.g. team=payments); a change replaces the whole list.",
    "day_rule": "How day-of-month and day-of-week combine. crontab (Vixie cron, cronie): a field starting with * (such as */2) leaves the day free, so the two are ANDed. either: croniter's reading, kept by schedules set before cronlog followed crontab. Read-only: a request that sets a schedule gets crontab.",
    "base_sec": "The first retry's delay bound.",
    "factor": "Each later retry's bound is the one before times this.",
    "cap_sec": "No retry's bound is longer than this.",
    "jitter": "Draw each delay uniformly below its bound (full jitter) rather than use the bound.",
    "job_id": "The job's id as its team names it (1-64 of A-Z a-z 0-9 _ -).",
    "idempotency_key": "Makes a retried create land on the same job (not with job_id).",
    "status": "The job's status: active, paused, cancelled, or finished (a one-shot that ran).",
    "next_run_at": "The job's next slot (RFC 3339, UTC); null when none is ahead.",
    "next_fire_at": "When that run will really be ready: the slot plus the job's jitter (RFC 3339, UTC).",
    "created_at": "When the job was registered.",
    "updated_at": "When the job last changed.",
    "version": "The job's version: it grows with each change; If-Match makes a change conditional on it.",
    # -- targets
    "type": "Which kind of object this is.",
    "url": "The http:// or https:// URL each attempt POSTs to.",
    "headers": 'Headers sent with each call: a value, or {"from_file": name} read from the node\'s secrets.',
    "max_calls_per_sec": "The team's calls to this URL's origin share a token bucket of this rate.",
    "status_url": "Where the target's guard (the SDK's RunGuard) answers what became of an attempt: a critical run whose outcome is unknown (a timeout, a lost lease) is asked about there, with the target's headers, instead of being dead-lettered as outcome_unknown. Never the job's own url.",
    "topic": "The Kafka topic each attempt produces the run to.",
    "pool": "The pull pool whose workers claim the job's runs.",
    "from_file": "A file in the team's secrets directory on the node, read at each call.",
    "from_env": "Not offered (the node's environment is shared by every team): refused with a reason.",
    # -- runs
    "run_id": "The run's id: <job id>.<slot in ms since the epoch>.",
    "state": "blocked, pending, running, succeeded, failed, retrying, dead or cancelled. A scheduled run is pending from up to the node's lead time (--lead-time) before its slot; one withdrawn before its slot (the job paused or rescheduled) is not listed at all.",
    "attempt": "The attempt's number, from 1.",
    "trigger": "What made the run: schedule, manual (a trigger or backfill) or dependency.",
    "scheduled_for": "The run's slot (RFC 3339, UTC).",
    "available_at": "When the run may start: its slot plus jitter, or a retry's time.",
    "started_at": "When its first attempt started.",
    "finished_at": "When it ended (succeeded, dead or cancelled); null while it is live.",
    "lateness_ms": "Its first start minus its slot, in milliseconds: the scheduling delay.",
    "error": "The last failure's text (an HTTP target's status and the start of its answer).",
    "dead_reason": "Why it is dead: attempts_exhausted, permanent_failure or outcome_unknown.",
    "attempts": "Every attempt the run had, oldest first.",
    "asks": "A critical run whose attempt's outcome was unknown, its target asked what became of it (its status_url), oldest ask first: the answer decides (succeeded: the run completes; failed or never_seen: a retry; in_progress or no_answer: asked again, at most 8 times; unknown, or out of asks: dead as outcome_unknown).",
    "ask": "The ask's number, from 1 for each attempt asked about.",
    "ask_at": "When the target was to be asked.",
    "answered_at": "When the answer was recorded; null while the ask waits.",
    "answer": "succeeded, failed, never_seen (the target now refuses that attempt should it arrive), in_progress, unknown, or no_answer (unreachable, an error, or nothing by the deadline); null while the ask waits.",
    "detail": "Why there was no answer (no_answer), or what the target added.",
    "fencing_token": "The lease's token: it grows with every lease of the partition; only the live one is heard.",
    "worker_id": "Who ran the attempt: a pull worker's id, or the node's executor.",
    "outcome": "How the attempt ended; null while it runs.",
    "lease_expires_at": "When the lease runs out unless a heartbeat extends it.",
    "ahead_sec": "Reach ahead: lease runs that become ready within this many seconds too (at most 300), each to be started at its start_at and never before; 0 leases only runs ready now.",
    "start_in_ms": "How long after this answer the run is to start, by the node's clock (0: now). Wait that long from receiving it: the run then never starts early, whatever the clocks say.",
    "check_ahead_ms": "A run leased ahead: how long before its start to check its lease (a heartbeat with check). The node holds a check sent earlier than 1.5 s before the start and answers it then, so any pause, schedule change or cancel decided until then is in the answer; 0 from a node that answers at once (then check at most 1 s before the start).",
    "check": "Only ask whether the lease still holds (a run leased ahead, about to start): nothing is extended; 409 lease_lost means do not start it (withdrawn: paused, rescheduled or cancelled).",
    "started_late_ms": "A run leased ahead: how long after its start_at it was started. Send it with the first heartbeat after the start, or with the outcome when no heartbeat came first; the run's start (and its scheduling delay) is recorded from it.",
    "next_cursor": "Pass it back as cursor for the next page; null on the last page.",
    "runs": "The runs of this page, newest slot first.",
    "source": "Where the answer came from: hot (the read model: runs of the history window, and"
    " every live or dead run) or archive (folded again from the archived events, slower). A"
    " page says archive when any of its runs came from there.",
    "gone_before": "With archiving off: runs of slots before this instant have left history for"
    " good (the history window), so none older is listed. Null otherwise.",
    "jobs": "The jobs of this page, by job id.",
    # -- instants and previews
    "at": "The instant, RFC 3339 in UTC.",
    "local": "The same instant on the timezone's wall clock, with its UTC offset.",
    "fires": "The next fire times, soonest first.",
    "n": "How many fire times to list.",
    "after": "List fire times after this instant (RFC 3339); by default, now.",
    # -- errors
    "message": "What is wrong, in words.",
    "field": "The field, parameter or header at fault, as a path (backoff.base_sec, target.url).",
    "cancelled": "With lease_lost: the run was cancelled (stop working on it), not reclaimed.",
    # -- figures
    "started": "Scheduled runs that started their first attempt (manual and dependency runs aside).",
    "delay_p50_ms": "The median scheduling delay (first start minus slot), ms; null without starts.",
    "delay_p99_ms": "The 99th percentile scheduling delay, ms; null without starts.",
    "delay_max_ms": "The longest scheduling delay, ms; null without starts.",
    "delay_mean_ms": "The mean scheduling delay, ms; null without starts.",
    "succeeded": "Runs that succeeded.",
    "failed": "Attempts that failed (a lease that ran out counts).",
    "retried": "Retries scheduled.",
    "dead": "Runs that went to the dead letters.",
    "skipped": "Slots recorded as not run (misfire, overlap, paused, a repeated DST hour).",
    "since": "The window's start (RFC 3339): the first point's time.",
    "until": "The window's end (RFC 3339): the end of the current minute.",
    "step_min": "Minutes each point adds up.",
    "points": "One point per step over the window, oldest first, those with nothing counted too.",
    "total": "The figures of the whole window.",
    "runs_by_state": "The team's runs in each state now.",
    # -- the team
    "tenant": "The team the job (or token) belongs to.",
    "limits": "The team's quotas and request rate.",
    "max_jobs": "Jobs (not cancelled) the team may hold.",
    "max_depends_on": "Upstream jobs one job may wait for.",
    "max_name_chars": "Characters a job's name may have.",
    "max_page_size": "Items one page of a listing holds at most.",
    "requests_per_sec": "Requests a second each of the team's tokens may make.",
    "request_burst": "Requests a token may make at once before the rate applies.",
    # -- replay by filter
    "reason": "Only runs dead for this reason.",
    "scheduled_after": "Only runs whose slot is at or after this instant.",
    "scheduled_before": "Only runs whose slot is before this instant.",
    "dry_run": "Only count the runs the filter names; replay none.",
    "cursor": "The next_cursor of the answer before: go on from there.",
    "matched": "Dead runs the filter named in this answer (replayed, refused, or counted).",
    "replayed": "The runs requeued.",
    "refused": "Runs named but not replayed, each with why (no longer dead, say).",
    "scanned": "Dead runs looked at to answer.",
    # -- the change preview
    "before": "The next fire times as the job stands.",
    "added": "Slots the change adds, up to compared_until.",
    "dropped": "Slots the change drops, up to compared_until.",
    "compared_until": "Where the comparison stops (the earlier list's last time); null: both lists are whole.",
    # -- workers
    "limit": "At most this many.",
    "permanent": "Retrying cannot help: dead-letter the run now.",
    "ambiguous": "The attempt may have taken effect (timed out after sending, say).",
    "retry_after_sec": "The target's own 'not before': the retry waits at least this long.",
    "wait_sec": "Long polling: with no run ready, wait up to this many seconds for one (answered the moment one is); 0 answers at once.",
    "max_waiting_claims": "Claims with wait_sec the team may hold open at once, across the cluster.",
    "max_event_streams": "Event streams (GET /v1/events) the team may hold open at once, across the cluster.",
    # -- a job's slots (backfills)
    "slots": "The job's slots in the range, oldest first.",
    "more": "The range holds more slots than were listed.",
    "due": "The slot has come: only a slot that has come can be triggered (backfilled).",
}

BY_STRUCT: dict[str, dict[str, str]] = {
    # GET /v1/operator/state (api/time_travel.py)
    "StateOut": {
        "partition": "The partition the state is of.",
        "as_of": "The point the state stands at: the offset it reflects and the instant asked for.",
        "from_snapshot": "The offset of the snapshot the answer started from; null: folded from offset 0.",
        "events_folded": "Events folded after that snapshot to reach the point.",
        "jobs": "The jobs the partition held then (of the tenant or job asked for).",
        "runs": "The runs the partition held then, each as its state held it: status (due, pending, leased, running, dead, ...), attempt, worker_id and lease.",
    },
    "JobAsOf": {
        "job_id": "The job's id in the log: <tenant>/<job id>.",
        "tenant": "The team the job belongs to.",
        "status": "The job's status then.",
        "version": "The job's version then.",
        "next_slot": "The next slot it was armed for then (epoch ms), null if none.",
        "live_runs": "The ids of its runs that were live then.",
    },
    "AsOf": {
        "offset": "The state holds the partition's events below this offset.",
        "instant": "The instant asked for (epoch ms), null when an offset was.",
    },
    "JobBatchIn": {
        "jobs": "The jobs to create, each a NewJob (the body of POST /v1/jobs), at most 1000; an item that is not one is refused in its result, not the request.",
        "idempotency_key": "Makes the batch safe to send again: an item naming neither job_id nor idempotency_key gets the job of <this key>#<its index>.",
    },
    "JobResult": {
        "index": "The item's place in the request's jobs, from 0.",
        "status": "What POST /v1/jobs would have answered: 201 created, 200 already there as given, else the error's status.",
        "job_id": "The job the item names (absent when the item was refused before it named one).",
        "version": "The job's version, when the item succeeded.",
        "error": "Why the item was refused: the body POST /v1/jobs would have answered, field prefixed with jobs[index].",
    },
    "JobBatchOut": {
        "results": "One result per item, in the request's order.",
        "created": "Items that created their job (201).",
        "existing": "Items whose job was already there as given (200).",
        "failed": "Items refused.",
    },
    "CompletionBatchIn": {
        "runs": "The outcomes to record, each the body of POST /v1/runs/{run_id}/complete with its run_id, at most 1000; an item that is not one is refused in its result, not the request.",
    },
    "CompletionResult": {
        "index": "The item's place in the request's runs, from 0.",
        "status": "What POST /v1/runs/{run_id}/complete would have answered: 200 recorded, else the error's status.",
        "run_id": "The run the item names (absent when the item was refused before it named one).",
        "error": "Why the item was refused: the body POST /v1/runs/{run_id}/complete would have answered (409 lease_lost says whether the run was cancelled), field prefixed with runs[index].",
    },
    "CompletionBatchOut": {
        "results": "One result per item, in the request's order.",
        "completed": "Items whose outcome was recorded (200).",
        "failed": "Items refused.",
    },
    "HeartbeatBatchIn": {
        "runs": "The leases to extend, each the body of POST /v1/runs/{run_id}/heartbeat with its run_id, at most 1000; an item that is not one is refused in its result, not the request.",
    },
    "HeartbeatResult": {
        "index": "The item's place in the request's runs, from 0.",
        "status": "What POST /v1/runs/{run_id}/heartbeat would have answered: 200 extended, else the error's status.",
        "run_id": "The run the item names (absent when the item was refused before it named one).",
        "lease_expires_at": "When 200: when the extended lease runs out unless another heartbeat extends it.",
        "error": "Why the item was refused: the body POST /v1/runs/{run_id}/heartbeat would have answered (409 lease_lost: stop working on the run; cancelled says whether it was cancelled), field prefixed with runs[index].",
    },
    "HeartbeatBatchOut": {
        "results": "One result per item, in the request's order.",
        "extended": "Items whose lease was extended (200).",
        "failed": "Items refused.",
    },
    "ChangePreviewOut": {"after": "The next fire times as the job would stand after the change."},
    "ClaimIn": {
        "limit": "Lease up to this many ready runs.",
        "worker_id": "The worker's own name, shown in each attempt's history.",
        "pool": "The pull pool to claim from.",
    },
    "ReplayFilterIn": {
        "limit": "Replay (or count) at most this many runs in this request.",
        "job_id": "Only runs of this job.",
    },
    "CompleteIn": {
        "status": "succeeded, or failed (retried while attempts remain, unless permanent).",
        "error": "What went wrong, kept with the attempt (at most 8192 characters).",
    },
    "JobPatch": {"status": "active resumes the job, paused pauses it."},
    "Health": {
        "status": "ok: the process is up; ready: it owns its partitions and caught up.",
        "boot": "This start of the node (GET /healthz): a random id each start draws, shared by its worker processes. Its peers tell a node started again from the one they knew by it.",
    },
    "ClaimedRun": {
        "start_at": "Leased ahead: the instant to start the run (RFC 3339); the lease counts from it. Null: start now.",
        "payload": "The job's payload.",
        "idempotency_key": "Names the slot, the same on every attempt: pass it to the target.",
        "lease_sec": "How long the lease lasts between heartbeats.",
        "timeout_sec": "How long the job allows an attempt.",
    },
    "RunSummary": {"state": "The run's state now."},
    "PreviewOut": {
        "schedule": "The cron expression previewed (5 fields); null for a job without one.",
        "seconds": "The seconds field of a per-second schedule; null without one.",
        "timezone": "The timezone the local times are read in.",
        "job_id": "The job previewed; null for a bare schedule.",
    },
    "ReplayRefused": {"error": "Why: conflict (no longer dead), not_found or unavailable."},
    "ErrorBody": {"error": "A word for the kind of error (bad_request, invalid, not_found, ...)."},
    "JobOut": {
        "last_run": "The run of the job's newest slot, whatever its state; null before the first."
    },
    "AttemptOut": {"error": "The attempt's failure, empty when it did not fail."},
    "AskOut": {
        "fencing_token": "The token of the attempt asked about.",
        "status": "succeeded: the HTTP status the target's handler answered; null otherwise.",
    },
    "HeartbeatOut": {
        "run_id": "The run whose lease was extended.",
        "lease_expires_at": "When the extended lease runs out unless another heartbeat extends it; null for a check, which extends nothing.",
    },
    "TeamOut": {"jobs": "The team's jobs that are not cancelled."},
    "TriggerIn": {"scheduled_for": "The slot to run (a backfill, RFC 3339); absent or null: now."},
    "SchedulePreviewIn": {
        "schedule": "The cron expression to preview (5 fields; the seconds in seconds)."
    },
    "SlotOut": {
        "state": "The slot's run's state; null when the slot has no run.",
        "run_id": "The run the slot has, or would have: <job id>.<slot ms>.",
    },
}

STRUCTS: dict[str, str] = {
    "HttpTargetIn": "An HTTP target: each attempt POSTs the run to url.",
    "KafkaTargetIn": "A Kafka target: each attempt produces the run to topic.",
    "PullTargetIn": "A pull target: the pool's workers claim the runs (POST /v1/workers/claim).",
    "HttpTarget": "An HTTP target: each attempt POSTs the run to url.",
    "KafkaTarget": "A Kafka target: each attempt produces the run to topic.",
    "PullTarget": "A pull target: the pool's workers claim the runs.",
    "BackoffIn": "Retry delays: min(cap, base x factor^(n-1)) before retry n, drawn below it with jitter.",
    "TriggerIn": "A manual run: now, or of a past slot.",
    "SchedulePreviewIn": "A cron expression and timezone whose fire times to list.",
    "ClaimIn": "A pull worker asking for ready runs of its pool.",
    "HeartbeatIn": "A worker extending its lease.",
    "CompleteIn": "A worker's report of its attempt.",
    "JobOut": "A job as stored, with its next fire time and its newest run.",
    "RunSummary": "A run, without its attempts.",
    "JobPage": "One page of the team's jobs.",
    "RunOut": "A run with every attempt.",
    "AttemptOut": "One attempt of a run: one lease.",
    "AskOut": "One ask of a run's target about what became of an attempt of unknown outcome.",
    "RunPage": "One page of runs.",
    "ClaimOut": "The runs leased to the worker (none when nothing is ready).",
    "HeartbeatOut": "The extended lease.",
    "PreviewOut": "Fire times, in UTC and on the timezone's wall clock.",
    "FireTime": "One fire time.",
    "Health": "Whether the node is up or ready.",
    "ChangePreviewOut": "What a change would do to the job's fire times.",
    "ReplayOut": "What a replay by filter did (or, dry, would do).",
    "ReplayRefused": "A run the filter named that was not replayed.",
    "TeamOut": "The team a token speaks for.",
    "SlotOut": "One slot of the job's schedule and its run, if it has one.",
    "SlotsOut": "A job's slots in a range: what a backfill of it would trigger.",
    "ErrorBody": "Every error's body.",
    "JobBatchIn": "Jobs to create at once (POST /v1/jobs:batch).",
    "JobResult": "One item's outcome.",
    "JobBatchOut": "Each item's outcome, and how many were created, already there, refused.",
    "CompletionBatchIn": "Attempts' outcomes to record at once (POST /v1/runs:complete).",
    "CompletionResult": "One item's outcome.",
    "CompletionBatchOut": "Each item's outcome, and how many were recorded and refused.",
    "HeartbeatBatchIn": "Leases to extend at once (POST /v1/runs:heartbeat).",
    "HeartbeatResult": "One item's outcome.",
    "HeartbeatBatchOut": "Each item's outcome, and how many leases were extended and refused.",
    "SecretRef": "A header value read from the node's secrets directory at each call.",
}


def describe(schemas: dict[str, dict[str, object]]) -> None:
    """Add the descriptions above to ``schemas`` (components of the document), in place."""
    for name, schema in schemas.items():
        if "description" not in schema and name in STRUCTS:
            schema["description"] = STRUCTS[name]
        properties = schema.get("properties")
        if not isinstance(properties, dict):
            continue
        for field, spec in properties.items():
            text = BY_STRUCT.get(name, {}).get(field) or FIELDS.get(field)
            if text and isinstance(spec, dict) and "description" not in spec:
                spec["description"] = text
