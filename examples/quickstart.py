"""The client in five calls: create a job, preview it, trigger it, read its runs, cancel it.

CRONLOG_URL=http://127.0.0.1:8080 CRONLOG_TOKEN=... python examples/quickstart.py
"""

from __future__ import annotations

from cronlog_client import Client, NewJob


def main() -> None:
    with Client() as cronlog:  # CRONLOG_URL and CRONLOG_TOKEN
        job = cronlog.create_job(
            NewJob(
                name="nightly-report",
                schedule="30 2 * * *",
                timezone="Europe/London",
                target="pull://reports",
                payload={"report": "daily"},
                retries=3,
                idempotency_key="quickstart-nightly-report",  # run it twice: one job
            )
        )
        print(f"job {job.job_id}: next run {job.next_run_at:%Y-%m-%d %H:%M} UTC")
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
