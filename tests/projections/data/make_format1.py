"""Writes ``format1.bin``: one partition's history and what the build before snapshot format 2
stored for it (its state store's keys and values, a snapshot of them, the core partition's
snapshot), for ``tests/projections/test_format1.py``. Run it with that build's checkout first
on the path, from that checkout::

    git -C REPO archive 9bb7e51 | tar -x -C /tmp/format1
    cd /tmp/format1 && python REPO/tests/projections/data/make_format1.py \
        REPO/tests/projections/data/format1.bin
"""

from __future__ import annotations

import sys
import zlib
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path.cwd()))

from core.commands import PauseJob, PutJob
from core.jobs import HttpTarget, JobSpec, KafkaTarget, SecretRef
from core.state import PartitionState, evolve
from projections import snapshot
from projections.state_store import MemoryStateStore
from tests.projections.histories import busy_partition

PARTITION = 1


def main(out: Path) -> None:
    sim = busy_partition(11, steps=150, partition=PARTITION)
    rich = JobSpec(
        name="rich",
        tenant="t1",
        target=HttpTarget(
            url="https://example.com/hook",
            headers={"X-Team": "a", "Authorization": SecretRef(from_file="token")},
            max_calls_per_sec=2.5,
        ),
        schedule="15 4 * * *",
        timezone="Europe/Paris",
        payload={"report": "daily", "n": [1, 2.5, None, {"deep": True}]},
        allow_jitter_sec=-0.0,
        tags=("env:prod", "x"),
    )
    sim.do(PutJob(job_id="t1/rich", spec=rich))
    sim.do(PutJob(job_id="t1/rich", spec=msgspec.structs.replace(rich, payload={"v": 2})))
    sim.do(
        PutJob(
            job_id="t2/topic",
            spec=JobSpec(
                name="to a topic",
                tenant="t2",
                target=KafkaTarget(topic="out"),
                interval_sec=3600.0,
                payload="plain text",
            ),
        )
    )
    sim.do(PauseJob(job_id="t2/topic", tenant="t2"))
    sim.advance(120_000)
    events = sim.events()
    store = MemoryStateStore(PARTITION)
    state = PartitionState(PARTITION)
    numbered = list(enumerate(events))
    for start in range(0, len(numbered), 40):
        batch = numbered[start : start + 40]
        for _, event in batch:
            evolve(state, event)
        store.save(state, batch)
    items = store.dump()
    blob = {
        "events": sim.log,
        "store": [list(item) for item in items],
        "snapshot": snapshot.encode(PARTITION, len(events), sim.now, items),
        "partition": sim.partition.snapshot(),
        "now": sim.now,
    }
    out.write_bytes(zlib.compress(msgspec.msgpack.encode(blob), 9))
    print(f"{out}: {len(events)} events, {len(items)} stored items")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
