"""A job whose target is a Kafka topic: the run is produced to the team's topic."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic

from core.commands import PutJob
from core.egress import EgressPolicy
from core.jobs import JobSpec, KafkaTarget
from eventlog.embedded import EmbeddedLog
from node.executors import Executors
from node.node import Node

pytestmark = pytest.mark.kafka


def test_a_run_is_produced_to_the_job_topic(kafka_bootstrap: str, tmp_path: Path) -> None:
    topic = f"team-a.jobs.{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(topic, 1, -1)])[topic].result(30)

    log = EmbeddedLog.open(tmp_path / "log", 2)
    node = Node(
        log,
        tmp_path / "node",
        node_id="n1",
        executors=Executors(
            "n1",
            kafka_bootstrap=kafka_bootstrap,
            egress=EgressPolicy.build(topics=["*={tenant}."]),  # team-a.jobs.* for team-a
        ),
    )
    node.start()
    consumer = Consumer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "group.id": f"g-{topic}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        assert node.wait_ready(10)
        slot = time.time_ns() // 1_000_000 + 200
        spec = JobSpec(
            name="to-topic",
            tenant="team-a",
            target=KafkaTarget(topic=topic),
            run_at=slot,
            payload={"n": 1},
        )
        asyncio.run(node.execute(PutJob(job_id="kt", spec=spec)))
        consumer.subscribe([topic])
        message = None
        deadline = time.monotonic() + 30
        while message is None and time.monotonic() < deadline:
            message = consumer.poll(0.5)  # the broker delivers when it has the record
            if message is not None and message.error():
                message = None
        assert message is not None
        body = json.loads(message.value())
        assert body["job_id"] == "kt" and body["scheduled_for_ms"] == slot
        assert body["payload"] == {"n": 1}
        headers = {k: v.decode() for k, v in message.headers()}
        assert headers["Idempotency-Key"] == f"kt:{slot}"
        assert message.key() == b"kt"
        run_id = f"kt.{slot}"

        def succeeded() -> bool:
            view = node.history.run("team-a", run_id)
            return view is not None and view.state == "succeeded"

        assert node.history.wait_until(succeeded, 10)
    finally:
        consumer.close()
        node.stop()
        log.close()
