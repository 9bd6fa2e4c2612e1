"""The client in five calls: create a job, preview it, trigger it, read its runs, cancel it.

CRONLOG_URL=http://127.0.0.1:8080 CRONLOG_TOKEN=... python examples/quickstart.py
"""

from __future__ import annotations

import uuid

from cronlog_client import Client, NewJob


def main() -> None:
    # A job of its own, named apart from the README's `report` (a name the command line looks a
    # job up by), cancelled at the end: running this again leaves nothing behind.
    definition = NewJob(
        name="quickstart-nightly",
        schedule="30 2 * * *",
        timezone="Europe/London",
        target="pull://reports",
        payload={"report": "daily"},
        retries=3,
        idempotency_key=f"quickstart-{uuid.uuid4()}",  # one key per job, reused on a resend
    )
    with Client() as cronlog:  # CRONLOG_URL and CRONLOG_TOKEN
        job = cronlog.create_job(definition)
        print(f"job {job.job_id}: next run {job.next_run_at:%Y-%m-%d %H:%M} UTC")
        again = cronlog.create_job(definition)  # a resend after a lost answer, say
        print(f"sent again with its idempotency key: job {again.job_id}")
        for fire in cronlog.preview_job(job.job_id, n=3).fires:
            print(f"  fires at {fire.local} (London)")
        run = cronlog.trigger(job.job_id)
        print(f"triggered {run.run_id}: {run.state}")
        for run in cronlog.iter_job_runs(job.job_id):
            print(f"  run {run.run_id} {run.state} (attempt {run.attempt})")
        cronlog.cancel_job(job.job_id)
        print(f"cancelled {job.job_id}")


if __name__ == "__main__":
    main()
