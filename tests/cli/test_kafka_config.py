"""``serve --kafka-config FILE``: librdkafka settings (security, client ids) for every client."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from cli.main import read_kafka_config, target_producer_config
from eventlog.kafka import KafkaLog

REPO = Path(__file__).resolve().parents[2]


def test_the_file_is_key_value_lines(tmp_path: Path) -> None:
    path = tmp_path / "kafka.properties"
    path.write_text(
        "# how cronlog reaches the cluster\n\nsecurity.protocol = SASL_SSL\nsasl.password=a=b\n"
    )
    assert read_kafka_config(path) == {"security.protocol": "SASL_SSL", "sasl.password": "a=b"}
    path.write_text("security.protocol SASL_SSL\n")
    with pytest.raises(SystemExit, match=r"kafka.properties:1: expected key=value"):
        read_kafka_config(path)


def test_serve_refuses_a_setting_librdkafka_does_not_know(tmp_path: Path) -> None:
    config = tmp_path / "kafka.properties"
    config.write_text("no.such.setting=1\n")
    done = subprocess.run(
        [
            sys.executable, "-m", "cli.main", "serve", "--kafka", "127.0.0.1:1",
            "--kafka-config", str(config), "--data-dir", str(tmp_path / "data"),
        ],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert "cannot open the Kafka log at 127.0.0.1:1" in done.stderr
    assert "no.such.setting" in done.stderr


class Owner:
    def __init__(self) -> None:
        self.owned: list[int] = []

    def assigned(self, partitions: list[int]) -> None:
        self.owned += partitions

    def revoked(self, partitions: list[int]) -> None:
        self.owned = [p for p in self.owned if p not in partitions]


def test_every_client_gets_the_settings(kafka_bootstrap: str, tmp_path: Path) -> None:
    config = tmp_path / "kafka.properties"
    config.write_text("client.id=cronlog-ops-7\n")
    prefix = f"kafkacfg-{uuid.uuid4().hex[:12]}"
    log = KafkaLog.open(
        kafka_bootstrap,
        2,
        prefix=prefix,
        replication_factor=-1,
        min_insync_replicas=None,
        client_config=read_kafka_config(config),
    )
    try:
        owner = Owner()
        member = log.join(owner)
        deadline = time.monotonic() + 30
        while len(owner.owned) < 2:
            assert time.monotonic() < deadline, "never assigned"
            member.poll(0.1)
        group = f"{prefix}.scheduler"
        admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
        described = admin.describe_consumer_groups([group])[group].result(timeout=10)
        assert [m.client_id for m in described.members] == ["cronlog-ops-7"]
        member.close()
    finally:
        log.close()


def test_kafka_targets_can_have_credentials_of_their_own(tmp_path: Path) -> None:
    cluster = {"sasl.username": "cronlog", "sasl.password": "writes-the-events-topic"}
    own = tmp_path / "targets.properties"
    own.write_text("sasl.username=cronlog-targets\nsasl.password=team-topics-only\n")
    assert target_producer_config(own, cluster) == {
        "sasl.username": "cronlog-targets",
        "sasl.password": "team-topics-only",
    }
    assert target_producer_config(None, cluster) == cluster
    with pytest.raises(SystemExit, match=r"cannot read .*missing.properties"):
        target_producer_config(tmp_path / "missing.properties", cluster)
