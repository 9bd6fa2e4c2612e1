"""A backfill: a job's missed past slots, shown first, then run (each once, however often
the backfill is run).

    CRONLOG_URL=... CRONLOG_TOKEN=... python examples/backfill.py
"""

from __future__ import annotations

import datetime as dt
import uuid

from cronlog_client import Client, JobDefinition


def main() -> None:
    with Client() as cronlog:
        job_id = f"rollup-{uuid.uuid4().hex[:8]}"
        cronlog.put_job(
            job_id, JobDefinition(name="rollup", schedule="0 * * * *", target="pull://rollups")
        )
        end = dt.datetime.now(dt.UTC).replace(minute=0, second=0, microsecond=0)
        start = end - dt.timedelta(hours=4)  # five slots: both ends count
        plan = cronlog.backfill_plan(job_id, start, end)
        for slot in plan.slots:
            print(f"{slot.scheduled_for:%Y-%m-%d %H:%M} {slot.state or 'to trigger'}")
        runs = cronlog.backfill(
            job_id, start, end, progress=lambda done, total, run: print(f"  {done}/{total}")
        )
        print(f"triggered {len(runs)} runs; again: {len(cronlog.backfill(job_id, start, end))}")
        cronlog.cancel_job(job_id)


if __name__ == "__main__":
    main()
