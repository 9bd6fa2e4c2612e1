"""A partition's end offset is asked again while the cluster settles: a topic another node has
just created, or a broker that went away with the request in flight (a node starting while one
of three brokers is down once exited here)."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from eventlog.kafka import _end_offset


class Settling:
    """A consumer whose first answers are the given errors."""

    def __init__(self, *errors: int) -> None:
        self.errors = list(errors)
        self.asked = 0

    def get_watermark_offsets(self, partition: TopicPartition, timeout: float) -> tuple[int, int]:
        self.asked += 1
        if self.errors:
            raise KafkaException(KafkaError(self.errors.pop(0)))
        return (0, 42)


@pytest.mark.parametrize(
    "code",
    [
        KafkaError._UNKNOWN_PARTITION,  # the client has no metadata for the new topic yet
        KafkaError._DESTROY_BROKER,  # the broker asked went away with the request
        KafkaError._TRANSPORT,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
    ],
)
def test_an_end_offset_is_asked_again_while_the_cluster_settles(code: int) -> None:
    consumer: Any = Settling(code, code)
    assert _end_offset(consumer, TopicPartition("t", 0), timeout_s=10) == 42
    assert consumer.asked == 3


def test_an_error_that_will_not_pass_is_raised_at_once() -> None:
    consumer: Any = Settling(KafkaError.TOPIC_AUTHORIZATION_FAILED)
    with pytest.raises(KafkaException):
        _end_offset(consumer, TopicPartition("t", 0), timeout_s=10)
    assert consumer.asked == 1
