"""The dependency relay rereads a partition's recent events when a node takes it over."""

from __future__ import annotations

import threading

from core import events as ev
from core.commands import AnyCommand, UpstreamSucceeded
from eventlog.memory import MemoryLog
from node.relay import DependencyRelay
from projections.decoding import EventDecoder, ForeignRecord
from tests.projections.histories import Writers


class Dependants:
    """The read model's dependants index, as the relay asks it."""

    def dependants(self, tenant: str, upstream_job_id: str) -> list[str]:
        return [f"after-{upstream_job_id}"]


def completed(job_id: str, slot: int, fencing_token: int = 0) -> bytes:
    return ev.encode(
        ev.RunCompleted(
            at=slot + 5,
            job_id=job_id,
            tenant="t1",
            run_id=f"{job_id}.{slot}",
            scheduled_for=slot,
            started_at=slot + 1,
            fencing_token=fencing_token,
        )
    )


def test_recovery_relays_past_a_foreign_record_and_reports_it() -> None:
    """A record that was not an event killed the relay's reread on every restart, so the
    successes after it never reached their dependants."""
    log = MemoryLog(1, gaps=True)
    writers = Writers(log)
    writers.append(0, [completed("a", 1000)])
    [foreign] = writers.append(0, [b'{"job_id": "a", "payload": null}'])
    writers.append(0, [completed("b", 2000)])
    sent: list[AnyCommand] = []
    both = threading.Event()

    async def execute(command: AnyCommand) -> list[ev.AnyEvent]:
        sent.append(command)
        if len(sent) == 2:
            both.set()
        return []

    seen: list[ForeignRecord] = []
    relay = DependencyRelay(
        log,
        Dependants(),  # type: ignore[arg-type]
        execute,
        EventDecoder("relay", seen.append),
    )
    relay.start()
    try:
        relay.recovered(0)
        assert both.wait(10), sent
    finally:
        relay.stop()
    assert sent == [
        UpstreamSucceeded(job_id="after-a", upstream_job_id="a", scheduled_for=1000),
        UpstreamSucceeded(job_id="after-b", upstream_job_id="b", scheduled_for=2000),
    ]
    assert [(f.reader, f.offset) for f in seen] == [("relay", foreign)]
    writers.close()
    log.close()
