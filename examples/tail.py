"""The live audit stream of one job: every event as it is decided, resumable from a cursor.

    CRONLOG_URL=... CRONLOG_TOKEN=... python examples/tail.py

It follows a job of its own while it triggers it once and pauses it, stops after those
events, and shows how to resume after the last one seen (the ``cursor``).
"""

from __future__ import annotations

import threading
import uuid

from cronlog_client import Client, JobDefinition


def main() -> None:
    with Client() as cronlog, Client() as other:
        job_id = f"tailed-{uuid.uuid4().hex[:8]}"

        def act() -> None:
            other.put_job(
                job_id, JobDefinition(name="tailed", schedule="0 0 1 1 *", target="pull://t")
            )
            other.trigger(job_id)
            other.pause_job(job_id)

        # From the start of the log: nothing the job does can come before the stream looks.
        events = cronlog.events(job=job_id, start="start", follow=True, max_events=3)
        threading.Thread(target=act, daemon=True).start()
        cursor = ""
        for event in events:
            print(f"{event.type:<16} offset {event.offset} of partition {event.partition}")
            cursor = event.cursor
        other.cancel_job(job_id)
        after = [e.type for e in cronlog.events(job=job_id, cursor=cursor)]
        print(f"after cursor {cursor}: {after}")


if __name__ == "__main__":
    main()
