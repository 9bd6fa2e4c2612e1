"""A partition's end offset and a topic's creation are asked again while the cluster settles:
a topic another node has just created, or a broker that went away with the request in flight
(a node starting while one of three brokers is down once exited here)."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from core.errors import CronlogError, Unavailable
from eventlog.kafka import (
    KafkaLog,
    _align_configs,
    _end_offset,
    _ensure_topics,
    _start_offset,
)


class Settling:
    """A consumer whose first answers are the given errors."""

    def __init__(self, *errors: int) -> None:
        self.errors = list(errors)
        self.asked = 0
        self.refreshed = False

    def get_watermark_offsets(self, partition: TopicPartition, timeout: float) -> tuple[int, int]:
        self.asked += 1
        if self.errors:
            raise KafkaException(KafkaError(self.errors.pop(0)))
        return (0, 42)

    def list_topics(self, topic: str, timeout: float) -> None:
        self.refreshed = True


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


class DeadLeader:
    """A consumer whose metadata names a leader that died: its queries time out (each after
    the whole wait it was given) until it asks for the topic's metadata again, which names
    the new leader."""

    def __init__(self) -> None:
        self.waits: list[float] = []
        self.refreshed = False

    def get_watermark_offsets(self, partition: TopicPartition, timeout: float) -> tuple[int, int]:
        self.waits.append(timeout)
        if not self.refreshed:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT))
        return (7, 42)

    def list_topics(self, topic: str, timeout: float) -> None:
        self.refreshed = True


@pytest.mark.parametrize("ask", [_end_offset, _start_offset])
def test_a_query_held_by_a_dead_leader_is_asked_again_of_the_new_one(ask: Any) -> None:
    # A node started just as the leader of a partition was killed asked that leader for its
    # watermarks for all of its start's 30 s and exited (CI's chaos run, seed 12).
    consumer: Any = DeadLeader()
    assert ask(consumer, TopicPartition("t", 0), timeout_s=30) in (7, 42)
    assert len(consumer.waits) == 2
    assert consumer.waits[0] <= 30 / 10


class StaleMetadata:
    """A consumer whose metadata has the partition unknown until it asks for the topic's
    metadata again (a reader of a new owner's check kept answering so for 30 s)."""

    def __init__(self) -> None:
        self.asked = 0
        self.refreshed = False

    def get_watermark_offsets(self, partition: TopicPartition, timeout: float) -> tuple[int, int]:
        self.asked += 1
        if not self.refreshed:
            raise KafkaException(KafkaError(KafkaError._UNKNOWN_PARTITION))
        return (7, 42)

    def list_topics(self, topic: str, timeout: float) -> None:
        self.refreshed = True


def test_a_partition_the_metadata_has_unknown_is_asked_again_after_a_refresh(
    caplog: pytest.LogCaptureFixture,
) -> None:
    consumer: Any = StaleMetadata()
    with caplog.at_level("DEBUG", logger="eventlog.kafka"):
        assert _start_offset(consumer, TopicPartition("t", 0), timeout_s=30) == 7
    assert consumer.asked == 2
    # The wait is said (at DEBUG when short, as here; a warning from WATERMARK_ROUND_S on).
    assert "watermarks of t[0] answered after 1 failed asks" in caplog.text


class Future:
    def __init__(self, error: int | None) -> None:
        self.error = error

    def result(self) -> None:
        if self.error is not None:
            raise KafkaException(KafkaError(self.error))


class Partition:
    leader = 1


class Topic:
    error = None

    def __init__(self, partitions: int) -> None:
        self.partitions = {p: Partition() for p in range(partitions)}


class Metadata:
    def __init__(self, topics: dict[str, Topic]) -> None:
        self.topics = topics


class FlakyAdmin:
    """An admin client whose first creations fail with the given errors, topic by topic."""

    def __init__(self, errors: dict[str, list[int]], existing: tuple[str, ...] = ()) -> None:
        self.errors = errors
        self.asked: list[list[str]] = []
        self.waits: list[float] = []
        self.created: set[str] = set(existing)

    def create_topics(self, topics: list[Any], **options: Any) -> dict[str, Future]:
        self.asked.append([t.topic for t in topics])
        self.waits.append(options["request_timeout"])
        futures = {}
        for t in topics:
            queue = self.errors.get(t.topic, [])
            error = queue.pop(0) if queue else None
            if error is None:
                self.created.add(t.topic)
            futures[t.topic] = Future(error)
        return futures

    def list_topics(self, timeout: float) -> Metadata:
        return Metadata({name: Topic(3) for name in self.created})


def test_a_topic_creation_a_dying_broker_interrupted_is_asked_again() -> None:
    """A node starting while a broker died during its topic check once exited with
    'cannot create topic ...: _DESTROY_BROKER'."""
    admin: Any = FlakyAdmin({"P.events": [KafkaError._DESTROY_BROKER, KafkaError.NOT_CONTROLLER]})
    _ensure_topics(admin, ["P.events", "P.commands"], 3, 3, {}, timeout_s=10)
    assert admin.asked == [["P.events", "P.commands"], ["P.events"], ["P.events"]]
    assert admin.created == {"P.events", "P.commands"}


def test_a_node_starting_again_does_not_ask_the_controller_for_topics_that_exist() -> None:
    """A node started again while the controller was down once exited with 'cannot create
    topic ...: Failed while waiting for controller': its topics were there all along."""
    gone = [KafkaError._TIMED_OUT] * 100
    admin: Any = FlakyAdmin({"P.events": gone, "P.commands": gone}, existing=("P.events",))
    with pytest.raises(CronlogError, match=r"cannot create topic P\.commands"):
        _ensure_topics(admin, ["P.commands"], 3, 3, {}, timeout_s=1)
    admin.asked.clear()
    _ensure_topics(admin, ["P.events"], 3, 3, {}, timeout_s=1)
    assert admin.asked == []


def test_a_creation_the_controller_does_not_answer_leaves_time_to_ask_again() -> None:
    """One round once took the whole start's 30 s, so a controller that moved meanwhile was
    never asked: each round now asks for a part of it."""
    admin: Any = FlakyAdmin({"P.events": [KafkaError._TIMED_OUT, KafkaError._TIMED_OUT]})
    _ensure_topics(admin, ["P.events"], 3, 3, {}, timeout_s=30)
    assert admin.asked == [["P.events"]] * 3
    assert max(admin.waits) <= 30 / 3


def test_a_topic_creation_refused_for_good_fails_at_once() -> None:
    admin: Any = FlakyAdmin({"P.events": [KafkaError.TOPIC_AUTHORIZATION_FAILED]})
    with pytest.raises(CronlogError, match=r"cannot create topic P\.events"):
        _ensure_topics(admin, ["P.events"], 3, 3, {}, timeout_s=10)
    assert len(admin.asked) == 1


class Configs:
    """An admin client whose first config reads fail with the given errors."""

    def __init__(self, *errors: int) -> None:
        self.errors = list(errors)
        self.current = {"retention.ms": "604800000"}
        self.reads = 0
        self.waits: list[float] = []

    def describe_configs(
        self, resources: list[Any], request_timeout: float, **_: Any
    ) -> dict[Any, Any]:
        self.reads += 1
        self.waits.append(request_timeout)
        error = self.errors.pop(0) if self.errors else None
        current = self.current

        class Entry:
            def __init__(self, value: str) -> None:
                self.value = value

        class Answer:
            def result(self) -> dict[str, Entry]:
                if error is not None:
                    raise KafkaException(KafkaError(error))
                return {k: Entry(v) for k, v in current.items()}

        return {resources[0]: Answer()}

    def incremental_alter_configs(self, resources: list[Any], **_: Any) -> dict[Any, Any]:
        for entry in resources[0].incremental_configs:
            self.current[entry.name] = entry.value
        return {resources[0]: Future(None)}


def test_a_topic_another_node_just_created_is_configured_once_the_broker_knows_it() -> None:
    # Three nodes starting together: one created the topic, another asked a broker that had
    # not its metadata yet for its configs, and exited with UNKNOWN_TOPIC_OR_PART.
    admin: Any = Configs(KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.UNKNOWN_TOPIC_OR_PART)
    _align_configs(admin, "P.events", {"retention.ms": "2592000000"}, timeout_s=10)
    assert admin.reads == 3
    assert admin.current == {"retention.ms": "2592000000"}


def test_a_config_read_the_controller_does_not_answer_leaves_time_to_ask_again() -> None:
    # A node restarted while a broker was down spent its whole start's 30 s on the first read
    # ("Timed out waiting for controller") and exited: each round now asks for a part of it.
    admin: Any = Configs(KafkaError._TIMED_OUT, KafkaError._TIMED_OUT)
    _align_configs(admin, "P.events", {"retention.ms": "2592000000"}, timeout_s=30)
    assert admin.reads == 3
    assert max(admin.waits) <= 30 / 3
    assert admin.current == {"retention.ms": "2592000000"}


def test_a_client_that_waits_on_a_dead_controller_is_replaced_by_a_fresh_one() -> None:
    # A node started just as a broker was killed: its client took that broker for the
    # controller and every round timed out waiting for it (CI's chaos run, seed 12), while a
    # client made anew reads the metadata from a broker that is up and is answered.
    stale: Any = Configs(*[KafkaError._TIMED_OUT] * 1000)
    answering: Any = Configs()
    made: list[Any] = []

    def fresh() -> Any:
        made.append(answering)
        return answering

    _align_configs(stale, "P.events", {"retention.ms": "2592000000"}, timeout_s=1, fresh=fresh)
    assert stale.reads == 1 and len(made) == 1
    assert answering.current == {"retention.ms": "2592000000"}


def test_a_creation_through_a_client_waiting_on_a_dead_controller_asks_a_fresh_one() -> None:
    stale: Any = FlakyAdmin({"P.events": [KafkaError._TIMED_OUT] * 1000})
    answering: Any = FlakyAdmin({})
    _ensure_topics(stale, ["P.events"], 3, 3, {}, timeout_s=1, fresh=lambda: answering)
    assert stale.asked == [["P.events"]]
    assert answering.asked == [["P.events"]]


def test_a_config_refused_for_good_fails_at_once() -> None:
    admin: Any = Configs(KafkaError.TOPIC_AUTHORIZATION_FAILED)
    with pytest.raises(CronlogError, match=r"cannot set the retention of topic P\.events"):
        _align_configs(admin, "P.events", {"retention.ms": "1"}, timeout_s=10)
    assert admin.reads == 1


class DeleteRecords:
    """An admin client whose DeleteRecords fails with the given error."""

    def __init__(self, code: int) -> None:
        self.code = code

    def delete_records(self, partitions: list[Any], **_: Any) -> dict[Any, Future]:
        return {partitions[0]: Future(self.code)}


def _trimming_log(code: int) -> Any:
    log: Any = object.__new__(KafkaLog)
    log.topics = {"commands": "P.commands"}
    log._timeout_s = 1.0
    log.start_offset = lambda stream, partition: 0
    log.command_position = lambda partition: 10
    log._admin_client = lambda: DeleteRecords(code)
    return log


def test_a_trim_a_broker_away_stopped_says_so_as_unavailable() -> None:
    # The retention loop logs Unavailable as one warning line; anything else with a traceback.
    with pytest.raises(Unavailable, match=r"P\.commands\[3\] not trimmed now"):
        _trimming_log(KafkaError._TIMED_OUT).trim_commands(3)
    with pytest.raises(Unavailable):
        _trimming_log(KafkaError.NOT_LEADER_FOR_PARTITION).trim_commands(3)


def test_a_trim_refused_for_good_is_raised_as_it_is() -> None:
    with pytest.raises(KafkaException):
        _trimming_log(KafkaError.TOPIC_AUTHORIZATION_FAILED).trim_commands(3)
