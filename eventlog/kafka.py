"""The log port on Kafka, through confluent-kafka (librdkafka).

Layout, for a log with prefix ``cronlog`` and N partitions::

    cronlog.commands   N partitions   anyone appends (idempotent producer, acks=all)
    cronlog.events     N partitions   partition p written only by transactional.id cronlog.p<p>
    cronlog.positions  N partitions   p's command position, a record in each of p's transactions
                                      that carries one; compacted
    cronlog.replies    4 partitions   replies to forwarded requests, keyed by node id; kept an hour
    group cronlog.scheduler           members consume cronlog.commands: the group assigns the
                                      partitions

Ownership comes from the consumer group. When partition p is assigned to a member, the member
opens p's writer: a producer with ``transactional.id=<prefix>.p<p>``, whose
``init_transactions()`` bumps the producer epoch. That fences the previous owner at once (its
next transactional call fails with ``_FENCED``) and aborts whatever transaction it left open.
Only then does the member read p's command position, which is now final, and start consuming
commands from it. The sequence is the reason the writer is opened inside the
assignment callback rather than lazily.

An append is one transaction: the events go to ``events[p]`` and the command position (the
offset of ``commands[p]`` below which every command is decided) goes to ``positions[p]`` as a
record, so both commit or neither does. The position is read back as the last committed record
of ``positions[p]`` (:meth:`KafkaLog.command_position`); a log from before this topic, whose
positions went in as the scheduler group's offsets (``send_offsets_to_transaction``), is read
from the group until its first append here. The group's coordinator is then on no append's
path: a transactional offset commit needs it, and librdkafka could wait inside
``send_offsets_to_transaction`` for as long as a broker that hosted it was gone
(confluentinc/librdkafka#5456 and #5511, open at 2.16: partitions dark 12-16 s after a broker
kill, and once for over six minutes, docs/reliability.md).

Kafka acknowledges the commit before the commit markers reach the partition, so
a ``read_committed`` reader could miss events for a moment after ``append`` returned; ``append``
therefore waits until its last event is readable, which keeps read-your-writes for callers. A
caller that waits for readability itself opens the log with ``readable_appends=False``: the node
answers a request only once its read model, which folds committed events only, holds the
request's events, so the writer's own wait would only hold the partition's next transaction
back (a reader's round trip per append, on the path every write of the partition waits on).

The next transaction waits for the last one's markers too, for another reason: the transaction
coordinator refuses to add the partition to a new transaction of the same transactional id
until it has written the last one's markers (``CONCURRENT_TRANSACTIONS``), and librdkafka asks
again only after a fixed 20 ms (``AddPartitionsToTxn``; it speaks no KIP-890 "transactions
v2", in which the broker adds the partition itself). So the runner calls
:meth:`KafkaPartitionWriter.wait_until_readable` before it takes its next batch: it returns as
soon as a read_committed read of the partition (the read model's follower, usually) has seen
the last event, or the broker's stable end (its last stable offset) has passed it, and the
commands that arrived meanwhile go into one transaction instead of waiting behind a stalled
one.

The commands topic is trimmed, not only expired: :meth:`KafkaLog.trim_commands` deletes (the
admin API's DeleteRecords) the records of ``commands[p]`` below p's committed command position,
which it reads back from the broker (``positions[p]``). Nothing below it is read again: a new
owner starts there, and a fenced owner's transactions can no longer commit. An owner's
in-memory position is never used, since its consumer may have fetched past what it committed.
Kafka Streams purges its repartition topics up to the committed offset in the same way. The
topic's ``retention.ms`` stays, as the backstop for commands no owner ever decided.

Errors from a transaction follow librdkafka's flags: ``fatal()`` (``_FENCED`` among them) and
unflagged errors close the writer and raise :class:`core.errors.Fenced`;
``txn_requires_abort()`` aborts and raises :class:`AppendAborted` (nothing of the append will
be read; retry it); ``retriable()`` retries the same call while the append's deadline allows.
An append has the log's timeout in all, every call and retry of its transaction included: past
it the writer closes and raises ``Fenced``, and its runner recovers from the log with a new
writer. Closing never waits for a transaction in flight (the rebalance callback closes the
writers it gives up, and the group waits for that callback); the append closes the producer
itself when its call returns.

Replies (invariant 7) are plain idempotent ``acks=all`` records, outside any transaction:
``send_reply`` produces to the partition ``partition_for(node_id, 4)`` and does not wait for the
broker (a reply is best effort; a lost one times the caller out, and it may retry). A node's
:class:`KafkaMailbox` is a consumer without a group, assigned to its node's replies partition
from the end offset read when it opens, that keeps only the records keyed by its node id:
other nodes share the partition, and nothing sent before it opened is delivered.

A member that stops polling keeps its partitions until ``max.poll.interval.ms`` passes (then
librdkafka leaves the group for it, 10 s here: the node's poll loop must come round well within
``max_poll_interval_ms``); a member that dies loses them after ``session.timeout.ms``, 6 s here
(Kafka's floor by default), unless it is removed sooner: a node killed on a live machine is
removed by the others' peer watch within a second (``node/peer_watch.py``), a dead worker
process by its node's parent. So the session decides only for a node that stops answering
(paused, its machine or network gone). A session shorter than the brokers allow
(``group.min.session.timeout.ms``) is refused at the join: the member then joins with 6 s and
says so once.

The session also bounds how long a member may go without reaching the group's coordinator:
librdkafka gives its partitions up after that long. A broker that dies takes the coordinators it
hosts with it until the controller fences it (``broker.session.timeout.ms``; after a controller
election first when it was the active controller), so a session shorter than that move makes
every member give up every partition at each such death and join again: the group then deals
every partition out afresh, nearly all to new owners, cold. ``tools/kafka`` fences in 2 s, and
its coordinators moved 3.4-4.4 s after a kill under load, past the 3 s session of before
(docs/reliability.md, "A session that outlasts a coordinator's move"); docs/operations.md says
what to set on a cluster of one's own.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_INVALID,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from core.errors import CronlogError, Fenced, Pruned, Unavailable
from eventlog.port import Outbound, OwnershipListener, Record, partition_for
from eventlog.retention import Retention, commands_may_go_below

if TYPE_CHECKING:
    from eventlog.port import EventLog

logger = logging.getLogger(__name__)
# Closing a fenced producer left inside a transaction tries to abort it and warns that it
# cannot (its fenced commit is "in progress"); the broker aborted it already, so the warning
# says nothing. Filtered once here, since warnings.catch_warnings around each close is not
# thread-safe and writers close from the rebalance callback and from their appends.
warnings.filterwarnings("ignore", "Producer abort_transaction failed", RuntimeWarning)

STREAMS = ("commands", "events")
POSITIONS = "positions"  # the command positions' topic (the module's docstring)
# Its records are one a transaction: compacted (each partition's one key), in segments that
# roll hourly so the compaction keeps about an hour of them.
POSITIONS_CONFIG = {
    "cleanup.policy": "compact",
    "segment.ms": str(3_600_000),
    "min.cleanable.dirty.ratio": "0.1",
}
# How many records from a positions partition's end a reader looks back at first, for the last
# committed one (aborted records and transaction markers come after it); then sixteen times more.
POSITION_LOOKBACK = 32
REPLY_PARTITIONS = 4  # fixed, so every node finds a node id's replies in the same partition
_LEADERSHIP_SETTLING = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        # Local errors librdkafka does not flag retriable, though they pass: no metadata yet
        # for a topic another node has just created, a broker gone with the request in flight.
        KafkaError._UNKNOWN_PARTITION,
        KafkaError._DESTROY_BROKER,
        KafkaError._TRANSPORT,
    }
)


def _passes(err: KafkaError) -> bool:
    """An error a later ask may not meet: flagged retriable, leadership settling, or a broker
    that did not answer in time (one that died with the request queued for it)."""
    code = err.code()
    return err.retriable() or code in _LEADERSHIP_SETTLING or code == KafkaError._TIMED_OUT


# How long the broker may hold a reader's fetch that found nothing new. A read that does not
# wait (a catch-up, a recovery) learns it reached a partition's end only from the empty answer,
# after the whole wait: so its wait is short.
READ_WAIT_MS = 10
# The same for a reader that waits for records: a follower at a partition's tail (the read
# model's, one per events partition in every node), left assigned there between its reads and
# fetching all the while. A read_committed fetch waiting at the end is answered when a commit
# makes records readable (Kafka 4.1.1: 2.6-7.2 ms after the commit with a 500 ms wait, as with
# 10 ms), so the long wait costs a parked follower nothing, and its idle fetches, which at 10 ms
# were most of a cluster's requests to its brokers, come 25 times less often
# (docs/reliability.md, "Where the two cores go"). What it costs: a waiting read that does not
# start where a parked follower stands reaches the end after two held fetches (measured: twice
# the wait), so it is kept short of a second.
TAIL_WAIT_MS = 250
# How many followers of one partition a process keeps assigned at the tail between their reads
# (:meth:`KafkaLog._park`): a follower whose consumer went to another pays the cost above.
PARKED_PER_PARTITION = 2
# The group session: how long after a node stops answering its partitions move to the others
# (a killed one is removed sooner, by the peer watch). Longer than a coordinator's move after a
# broker's death, or that death takes every member's partitions away (the module's docstring).
# Kafka brokers refuse anything below their ``group.min.session.timeout.ms`` (6 s unless set
# lower): a member refused joins with ``STOCK_MIN_SESSION_TIMEOUT_MS`` instead.
SESSION_TIMEOUT_MS = 6000
STOCK_MIN_SESSION_TIMEOUT_MS = 6000
# Heartbeats: the members hear of a rebalance at their next one. Every move of a partition
# waits for it: a dead node's, a leaving node's, and a joining node's twice (the cooperative
# protocol revokes in one round and assigns in the next). At a tenth of the session (600 ms)
# that was up to 1.2 s of every hand-over to a node that joined; a heartbeat costs the group's
# coordinator one small request, so four a second a member are nothing to a broker. Never more
# than a third of the session (Kafka's advice), for a short one.
HEARTBEAT_MS = 250
# Client settings that shorten a broker's death for cronlog's clients, unless the operator's
# own (``--kafka-config``) say otherwise. librdkafka backs off reconnecting to a broker up to
# 10 s and retrying a request up to 1 s by default: a coordinator that moved was found seconds
# after it was ready.
FAST_FAILOVER = {"reconnect.backoff.max.ms": 1000, "retry.backoff.max.ms": 250}
# How long a writer waits for its last transaction to be readable before it begins the next
# (:meth:`KafkaPartitionWriter.wait_until_readable`), and how long it listens for a reader to
# tell before it asks the broker (then twice as long before asking again). Only speed depends on
# them: beginning earlier is safe. On one local broker a read_committed reader at the tail had
# the records 0.6 ms after the commit returned, and the markers beat a ListOffsets round trip.
SETTLE_WAIT_S = 0.05
PROBE_AFTER_S = 0.002
# Errors of a topic creation that pass once the cluster settles (librdkafka flags some of them
# not retriable): the broker asked went away, the controller moved, no broker answered in time.
_CREATE_SETTLING = frozenset(
    {
        KafkaError._DESTROY_BROKER,
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NOT_CONTROLLER,
        KafkaError.BROKER_NOT_AVAILABLE,
    }
)
# A transactional call that failed retriably is asked again after this, doubling up to the
# maximum, while its deadline allows; each attempt is given the time left, never less than the
# minimum. An abort after a failed append is given ABORT_MIN_S even past the append's deadline.
RETRY_BACKOFF_S = 0.05
MAX_RETRY_BACKOFF_S = 1.0
MIN_CALL_S = 0.1
ABORT_MIN_S = 5.0
# A topic's configs are set once it exists: its creation's settling errors, and the topic
# unknown to the broker asked while another node has just created it.
_CONFIGS_SETTLING = _CREATE_SETTLING | {KafkaError.UNKNOWN_TOPIC_OR_PART}
REPLY_RETENTION_MS = 3_600_000  # replies are ephemeral: a node reads them within seconds
T = TypeVar("T")


class AppendAborted(CronlogError):
    """The append's transaction was aborted: nothing of it will ever be read. Retry it."""


class KafkaLog:
    """``KafkaLog.open(bootstrap_servers, num_partitions, prefix=...)``: the log port on Kafka."""

    def __init__(
        self,
        bootstrap_servers: str,
        num_partitions: int,
        *,
        prefix: str,
        client_config: dict[str, Any],
        session_timeout_ms: int,
        max_poll_interval_ms: int,
        timeout_s: float,
        readable_appends: bool = True,
    ) -> None:
        self._num_partitions = num_partitions
        self._readable_appends = readable_appends
        self.prefix = prefix
        self.topics = {stream: f"{prefix}.{stream}" for stream in (*STREAMS, POSITIONS)}
        self.replies_topic = f"{prefix}.replies"
        self._base = {"bootstrap.servers": bootstrap_servers, **FAST_FAILOVER, **client_config}
        self._session_timeout_ms = session_timeout_ms
        self._max_poll_interval_ms = max_poll_interval_ms
        self._timeout_s = timeout_s
        self._producer = Producer(
            {**self._base, "enable.idempotence": True, "acks": "all", "linger.ms": 1}
        )
        self._readers: list[Consumer] = []  # unassigned, for reads that do not wait
        self._followers: list[Consumer] = []  # unassigned, for reads that wait (TAIL_WAIT_MS)
        # (topic, partition) -> consumers left assigned at the end, each with the offset it is
        # at, oldest first (PARKED_PER_PARTITION at most)
        self._parked: dict[tuple[str, int], list[tuple[Consumer, int]]] = {}
        self._readers_lock = threading.Lock()
        # events partition -> an offset every event below which is known readable (its
        # transaction's markers are written), as reads and the writers' probes found it
        self._stable: dict[int, int] = {}
        self._stable_changed = threading.Condition()
        self._admin: AdminClient | None = None  # opened by the first trim
        # reads the scheduler group's committed offsets (the command positions of a log from
        # before the positions topic); opened by the first read
        self._group_reader: Consumer | None = None
        self._group_reader_lock = threading.Lock()
        self._members: list[KafkaMembership] = []
        # The members' client.id (node.peer_watch reads it back); librdkafka's default if None
        self.member_name: str | None = None
        # Reads the scheduler group's members (:meth:`read_members_with`); None: librdkafka's
        # admin client asks
        self._members_reader: Callable[[], Sequence[object]] | None = None
        self._mailboxes: list[KafkaMailbox] = []
        self._closed = threading.Event()
        # Delivery reports are served here, so a submit waits on its own report, not on a flush
        # of everyone else's records.
        self._reporter = threading.Thread(
            target=self._serve_reports, name=f"{prefix}-reports", daemon=True
        )
        self._reporter.start()

    @classmethod
    def open(
        cls,
        bootstrap_servers: str,
        num_partitions: int,
        *,
        prefix: str = "cronlog",
        replication_factor: int = 3,
        min_insync_replicas: int | None = 2,
        topic_config: dict[str, str] | None = None,
        retention: Retention | None = None,
        client_config: dict[str, Any] | None = None,
        session_timeout_ms: int = SESSION_TIMEOUT_MS,
        max_poll_interval_ms: int = 10000,
        timeout_s: float = 30.0,
        readable_appends: bool = True,
    ) -> KafkaLog:
        """Create (or check) the topics and return the log.

        Topics that exist already are accepted when their partition count matches; any other
        count is an error, since it would move jobs between partitions. The log is the source
        of truth, so the commands and events topics keep records forever unless ``retention``
        or ``topic_config`` says otherwise; the replies topic keeps them an hour.
        ``replication_factor=-1`` and ``min_insync_replicas=None`` take the broker's defaults.

        ``retention`` (what ``cronlog serve`` passes) sets the events topic's ``retention.ms``
        and ``retention.bytes`` and the commands topic's ``retention.ms`` (never a size bound:
        that could delete commands nobody consumed yet; decided ones go by
        :meth:`trim_commands`), at creation and, when an existing topic says otherwise, by
        altering it: the nodes' settings are the source of truth.
        """
        if num_partitions < 1:
            raise ValueError(f"num_partitions must be at least 1, got {num_partitions}")
        config = {
            "unclean.leader.election.enable": "false",
            "retention.ms": "-1",
            "retention.bytes": "-1",
        }
        if min_insync_replicas is not None:
            config["min.insync.replicas"] = str(min_insync_replicas)
        config.update(topic_config or {})

        def fresh() -> AdminClient:
            return AdminClient({"bootstrap.servers": bootstrap_servers, **(client_config or {})})

        admin = fresh()
        per_topic = retention_configs(retention) if retention is not None else {}
        for stream in STREAMS:
            name = f"{prefix}.{stream}"
            wanted = per_topic.get(stream, {})
            topic = {**config, **wanted}
            _ensure_topics(
                admin, [name], num_partitions, replication_factor, topic, timeout_s, fresh
            )
            if wanted:
                _align_configs(admin, name, wanted, timeout_s, fresh)
        positions = f"{prefix}.{POSITIONS}"
        _ensure_topics(
            admin,
            [positions],
            num_partitions,
            replication_factor,
            {**config, **POSITIONS_CONFIG},
            timeout_s,
            fresh,
        )
        _align_configs(admin, positions, POSITIONS_CONFIG, timeout_s, fresh)
        replies = {**config, "retention.ms": str(REPLY_RETENTION_MS)}
        _ensure_topics(
            admin,
            [f"{prefix}.replies"],
            REPLY_PARTITIONS,
            replication_factor,
            replies,
            timeout_s,
            fresh,
        )
        return cls(
            bootstrap_servers,
            num_partitions,
            prefix=prefix,
            client_config=client_config or {},
            session_timeout_ms=session_timeout_ms,
            max_poll_interval_ms=max_poll_interval_ms,
            timeout_s=timeout_s,
            readable_appends=readable_appends,
        )

    @property
    def num_partitions(self) -> int:
        return self._num_partitions

    def submit(self, partition: int, value: bytes, key: bytes | None = None) -> int:
        self._check_partition(partition)
        self._check_open()
        delivered = threading.Event()
        report: list[tuple[KafkaError | None, int]] = []

        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            report.append((err, _offset(msg) if err is None else -1))
            delivered.set()

        self._produce(self.topics["commands"], partition, value, key, on_delivery)
        if not delivered.wait(self._timeout_s):
            raise CronlogError(f"command to partition {partition} not acknowledged in time")
        [(err, offset)] = report
        if err is not None:
            raise CronlogError(f"command to partition {partition} failed: {err}")
        return offset

    def read_events(
        self, partition: int, from_offset: int, max_records: int = 1000, timeout_s: float = 0.0
    ) -> list[Record]:
        return self._read("events", partition, from_offset, max_records, timeout_s)

    def read_commands(
        self, partition: int, from_offset: int, max_records: int = 1000, timeout_s: float = 0.0
    ) -> list[Record]:
        return self._read("commands", partition, from_offset, max_records, timeout_s)

    def end_offset(self, stream: str, partition: int) -> int:
        self._check_partition(partition)
        with self._reader() as consumer:
            tp = TopicPartition(self._topic(stream), partition)
            return _end_offset(consumer, tp, self._timeout_s)

    def start_offset(self, stream: str, partition: int) -> int:
        """The partition's low watermark: Kafka's log start offset, which retention moves."""
        self._check_partition(partition)
        with self._reader() as consumer:
            tp = TopicPartition(self._topic(stream), partition)
            return _start_offset(consumer, tp, self._timeout_s)

    def command_position(self, partition: int) -> int:
        """The partition's command position as the broker holds it: the last committed record
        of ``positions[partition]``, written in the transaction of the events that decided the
        commands below it, and where a new owner starts (0 when none is)."""
        self._check_partition(partition)
        return self._found_positions([partition])[partition] or 0

    def _found_positions(self, partitions: list[int]) -> dict[int, int | None]:
        """The command positions of ``partitions`` (:meth:`command_position`), None where the
        log holds none. A partition whose positions topic has no record yet (a log written
        before the topic, or never appended to) is read from the scheduler group's committed
        offsets, where positions went before. Also what a new owner asks in the group's
        rebalance callback, once its writers have fenced every predecessor."""
        found: dict[int, int | None]
        if len(partitions) > 1:  # a takeover's partitions read side by side, as their writers open
            with ThreadPoolExecutor(len(partitions), thread_name_prefix="read-position") as pool:
                read = pool.map(self._last_position, partitions)
                found = dict(zip(partitions, read, strict=True))
        else:
            found = {p: self._last_position(p) for p in partitions}
        missing = [p for p, position in found.items() if position is None]
        if missing:
            for tp in self._committed(missing):
                # OFFSET_INVALID (-1001): nothing committed there either
                found[tp.partition] = int(tp.offset) if tp.offset >= 0 else None
        return found

    def _last_position(self, partition: int) -> int | None:
        """The value of the last committed record of ``positions[partition]``, None if it has
        none. Read back from the end (``POSITION_LOOKBACK`` records, then more): only aborted
        records and transaction markers can follow it."""
        with self._reader() as consumer:  # both watermarks in one request
            tp = TopicPartition(self.topics[POSITIONS], partition)
            start, end = _watermarks(consumer, tp, self._timeout_s)
        back = POSITION_LOOKBACK
        while end > start:
            since = max(start, end - back)
            records = self._read(POSITIONS, partition, since, end - since + 1, 0.0)
            if records:
                return _position_value(records[-1].value, partition)
            if since == start:
                return None
            back *= 16
        return None

    def _committed(self, partitions: list[int]) -> list[TopicPartition]:
        """The scheduler group's committed offsets of ``commands[partitions]``, asked in one
        request (offset ``OFFSET_INVALID`` where none is): the command positions of a log
        written before ``positions`` (:meth:`_found_positions`). Asked through a consumer of the
        group's id that never joins the group (``committed()``), not through the admin API's
        ListConsumerGroupOffsets: in librdkafka (2.4 to at least 2.16) an admin client that
        meets ``NOT_COORDINATOR`` in that answer, as after the group's coordinator moved with a
        broker restart, hands a coordinator query to a consumer group it does not have and
        crashes the process in its own thread (librdkafka issue 5040; seen here by the chaos
        runs). Nor of the group's own consumer inside its rebalance callback: some of its
        blocking calls (``list_topics`` in confluent-kafka 2.16, reproduced) clear its
        per-thread call state there, and the next callback of the same poll aborts the process
        (``CallState_get: Assertion 'cs != NULL' failed``)."""
        topic = self.topics["commands"]
        with self._group_reader_lock:
            committed = self._unjoined().committed(
                [TopicPartition(topic, p) for p in partitions], timeout=self._timeout_s
            )
        for tp in committed:
            if tp.error is not None:
                raise CronlogError(f"committed offset of {topic}[{tp.partition}]: {tp.error}")
        return list(committed)

    def topic_names(self, timeout_s: float) -> frozenset[str]:
        """The topics the cluster has now (the admin API's metadata: asking creates none)."""
        topics = self._admin_client().list_topics(timeout=timeout_s).topics
        return frozenset(name for name, meta in topics.items() if meta.error is None)

    def trim_commands(self, partition: int) -> tuple[int, int] | None:
        """Delete the commands of ``partition`` that every owner, present or future, is done
        with: those below the command position read back from the broker (never an owner's
        in-memory one, which can be ahead of what it committed), through the admin API's
        DeleteRecords, as Kafka Streams purges its repartition topics. Returns the partition's
        start before and after, or None when nothing was left to delete."""
        start = self.start_offset("commands", partition)
        to = commands_may_go_below(self.command_position(partition), start)
        if to is None:
            return None
        tp = TopicPartition(self.topics["commands"], partition, to)
        admin = self._admin_client()
        try:
            futures = admin.delete_records(
                [tp], request_timeout=self._timeout_s, operation_timeout=self._timeout_s
            )
            [deleted] = [f.result() for f in futures.values()]
        except KafkaException as e:
            err = e.args[0]
            if _passes(err):  # a broker away or a leader moving: the next pass trims it
                raise Unavailable(f"{tp.topic}[{partition}] not trimmed now: {err.str()}") from e
            raise
        return start, int(deleted.low_watermark)

    @property
    def group(self) -> str:
        """The scheduler group: its members own the partitions."""
        return scheduler_group(self.prefix)

    def read_members_with(self, reader: Callable[[], Sequence[object]]) -> None:
        """Have :meth:`KafkaMembership.others` count the group's members with ``reader`` (the
        node's kafka-python admin, :class:`node.peer_watch.GroupAdmin`) rather than librdkafka's
        DescribeConsumerGroups, which can abort the process when a broker goes away with the
        request in flight (node/peer_watch.py says how it was found). A graceful stop asks it
        once, and a rolling restart during a broker's death is just when it would."""
        self._members_reader = reader

    def join(self, listener: OwnershipListener) -> KafkaMembership:
        self._check_open()
        member = KafkaMembership(self, listener)
        self._members.append(member)
        return member

    def send_reply(self, node_id: str, value: bytes) -> None:
        """Produce a reply to ``node_id``'s partition of the replies topic; do not wait for it."""
        self._check_open()

        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                logger.warning("reply to %s lost: %s", node_id, err)

        self._produce(
            self.replies_topic, _reply_partition(node_id), value, node_id.encode(), on_delivery
        )

    def mailbox(self, node_id: str) -> KafkaMailbox:
        self._check_open()
        box = KafkaMailbox(self, node_id)
        self._mailboxes.append(box)
        return box

    def close(self) -> None:
        if self._closed.is_set():
            return
        for member in self._members:
            member.close()
        for box in self._mailboxes:
            box.close()
        self._closed.set()
        self._reporter.join()
        self._producer.flush(self._timeout_s)
        # Closed, not left to the garbage collector: a producer alive after its cluster went
        # away keeps reconnecting and logging until the process ends.
        with contextlib.suppress(KafkaException):
            self._producer.close()
        with self._readers_lock:
            readers, self._readers = self._readers + self._followers, []
            self._followers = []
            readers += [consumer for parked in self._parked.values() for consumer, _ in parked]
            self._parked = {}
        for consumer in readers:
            consumer.close()
        with self._group_reader_lock:
            group_reader, self._group_reader = self._group_reader, None
        if group_reader is not None:
            group_reader.close()

    def __enter__(self) -> KafkaLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- internals shared with memberships and writers ------------------------------------------

    def _admin_client(self) -> AdminClient:
        self._check_open()
        with self._readers_lock:
            if self._admin is None:
                self._admin = AdminClient(self._base)
            return self._admin

    def _client_config(self, **settings: Any) -> dict[str, Any]:
        return {**self._base, **settings}

    def _unjoined(self) -> Consumer:
        """The consumer of the scheduler group's id that never joins it (made at first use;
        the caller holds ``_group_reader_lock``): the group's committed offsets."""
        self._check_open()
        if self._group_reader is None:
            self._group_reader = Consumer(
                self._client_config(
                    **{
                        "group.id": self.group,  # read, never joined
                        "enable.auto.commit": False,
                        "enable.auto.offset.store": False,
                    }
                )
            )
        return self._group_reader

    def _member_config(self) -> dict[str, Any]:
        named = {} if self.member_name is None else {"client.id": self.member_name}
        return self._client_config(
            **named,
            **{
                "group.id": self.group,
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
                "partition.assignment.strategy": "cooperative-sticky",
                "session.timeout.ms": self._session_timeout_ms,
                "heartbeat.interval.ms": min(HEARTBEAT_MS, self._session_timeout_ms // 3),
                # librdkafka refuses a poll interval shorter than the session
                "max.poll.interval.ms": max(self._max_poll_interval_ms, self._session_timeout_ms),
            },
        )

    def _wait_readable(self, partition: int, offset: int) -> None:
        """Wait until a read_committed reader sees event ``offset`` (its markers are written)."""
        deadline = time.monotonic() + self._timeout_s
        while time.monotonic() < deadline:
            got = self._read("events", partition, offset, 1, deadline - time.monotonic())
            if got and got[0].offset >= offset:
                return
        raise CronlogError(f"event {offset} of partition {partition} not readable in time")

    def _saw_readable(self, partition: int, end: int) -> None:
        """Every event of ``partition`` below ``end`` is readable: tell the writer waiting."""
        with self._stable_changed:
            if end > self._stable.get(partition, 0):
                self._stable[partition] = end
                self._stable_changed.notify_all()

    def _wait_stable(self, partition: int, end: int, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` until every event of ``partition`` below ``end`` is readable.

        The node's read model follows every partition's tail, and its fetch is answered as
        soon as the markers are written, so a reader usually tells (:meth:`_saw_readable`)
        at no cost; when none has within ``PROBE_AFTER_S`` (no follower, or one held up),
        ask the broker for the partition's stable end (a ListOffsets of a read_committed
        consumer answers the last stable offset), then listen twice as long before asking
        again. False when it was not readable in time."""
        deadline = time.monotonic() + timeout_s
        wait_s = PROBE_AFTER_S
        while True:
            with self._stable_changed:
                if self._stable_changed.wait_for(
                    lambda: self._stable.get(partition, 0) >= end,
                    max(0.0, min(wait_s, deadline - time.monotonic())),
                ):
                    return True
            left_s = deadline - time.monotonic()
            if left_s <= 0:
                return False
            # The question is bounded by the wait, never by the log's timeout: while the
            # partition's leader is away it goes unanswered, and a writer that asked for as
            # long as the log allows held its partition 30 s before each transaction.
            with self._reader() as consumer:
                stable = _end_offset(
                    consumer, TopicPartition(self.topics["events"], partition), left_s
                )
            self._saw_readable(partition, stable)
            wait_s *= 2  # markers late (a broker busy, replicas slow): ask less often

    def _serve_reports(self) -> None:
        while not self._closed.is_set():
            self._producer.poll(0.1)

    def _produce(
        self,
        topic: str,
        partition: int,
        value: bytes,
        key: bytes | None,
        on_delivery: Callable[[KafkaError | None, Message], None],
    ) -> None:
        while True:
            try:
                self._producer.produce(
                    topic, value, key=key, partition=partition, on_delivery=on_delivery
                )
                return
            except BufferError:  # the local queue is full: let the reporter drain it
                self._producer.flush(0.1)

    def _read(
        self, stream: str, partition: int, from_offset: int, max_records: int, timeout_s: float
    ) -> list[Record]:
        """Read committed records from ``from_offset``.

        Reads up to the partition's stable end (librdkafka reports it as ``_PARTITION_EOF``),
        then returns what it has, or waits up to ``timeout_s`` for the first record.

        A waiting read that ended at the stable end leaves its consumer assigned where it
        stopped (:meth:`_park`), and the next waiting read from there takes it back: a follower
        at the tail (the read model's, one per partition) then reads what its consumer has
        already fetched, instead of assigning a consumer, starting a fetch from the offset and
        unassigning it again on every read. A parked consumer is used only from the exact
        offset it stopped before, and every record it returns is checked against
        ``from_offset`` as before. A read that does not wait (``timeout_s`` 0: a catch-up, a
        recovery) promises everything up to the end as it is now, which a consumer that was
        at the end a moment ago cannot tell without fetching: it assigns a consumer at
        ``from_offset`` and reads to the end, as before. A waiting read on a parked consumer
        gets what its fetches brought within the wait: the broker answers a follower's fetch
        when a commit makes records readable, or after ``TAIL_WAIT_MS`` with none.
        """
        self._check_partition(partition)
        topic = self._topic(stream)
        deadline = time.monotonic() + timeout_s
        give_up = deadline + self._timeout_s  # a broker that never answers
        records: list[Record] = []
        follow = timeout_s > 0  # a follower's read: a consumer of the long wait (TAIL_WAIT_MS)
        consumer, at_end = self._take_reader(topic if follow else None, partition,
                                             from_offset)  # fmt: skip
        parked = False  # the events stream's only: its followers read every partition's tail
        stable = -1  # where the partition's stable end was found (read_committed: its LSO)
        try:
            if not at_end:
                consumer.assign([TopicPartition(topic, partition, from_offset)])
            while len(records) < max_records:
                now = time.monotonic()
                if at_end and not records and now >= deadline:
                    break
                if now >= give_up:
                    raise CronlogError(f"no end of {topic}[{partition}] from the broker in time")
                # At the end with records in hand, take only what has arrived with them: the
                # rest of a fetch is already here, and an append's events arrive together, so
                # a reader that stopped at the first would fetch once per event.
                if at_end:
                    msg = consumer.poll(0.0 if records else max(deadline - now, 0.0))
                else:
                    msg = consumer.poll(0.5)
                if msg is None:
                    if at_end and records:
                        break
                    continue
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        at_end = True
                        stable = max(stable, _offset(msg))
                        continue
                    if err.code() == KafkaError._AUTO_OFFSET_RESET:
                        # Out of range: past the end (nothing there yet), or below the log's
                        # start (retention deleted it): say so, never skip ahead.
                        consumer.unassign()
                        start = _start_offset(consumer, TopicPartition(topic, partition), 5.0)
                        if from_offset >= start:
                            return records
                        raise Pruned(
                            f"{topic}[{partition}] starts at offset {start} (retention deleted "
                            f"what was before it); offset {from_offset} is in the archive, if any",
                            stream=stream,
                            partition=partition,
                            start=start,
                        )
                    raise CronlogError(f"reading {topic}[{partition}]: {err}")
                offset = _offset(msg)
                if offset >= from_offset and (not records or offset > records[-1].offset):
                    records.append(_record(msg))
            if stream == "events":
                # A committed record read, or the stable end reached, proves that every
                # transaction below it has its markers written: the partition's writer waits
                # for that before it begins its next transaction.
                self._saw_readable(partition, max(stable, records[-1].offset + 1 if records else 0))
            if at_end and len(records) < max_records and stream == "events" and follow:
                # Every record polled was returned: the consumer stands just past the last. Only
                # a follower's (a waiting read's) is left there: a reader's short wait would
                # have it fetch a hundred times a second while nobody reads.
                parked = self._park(
                    consumer, topic, partition, records[-1].offset + 1 if records else from_offset
                )
        finally:
            if not parked:
                with contextlib.suppress(KafkaException):
                    consumer.unassign()
                self._put_reader(consumer, follow)
        return records

    @contextlib.contextmanager
    def _reader(self) -> Iterator[Consumer]:
        """A plain consumer (no group membership) from a small pool, unassigned."""
        consumer, _ = self._take_reader(None, 0, 0)
        try:
            yield consumer
        finally:
            self._put_reader(consumer, follow=False)

    def _take_reader(
        self, topic: str | None, partition: int, from_offset: int
    ) -> tuple[Consumer, bool]:
        """A consumer for a read: for a read that waits (``topic`` given), the one parked at
        ``from_offset`` of the partition (True: assigned there, at the end when it was
        parked), or an unassigned follower (False); for one that does not, an unassigned
        reader (False)."""
        self._check_open()
        follow = topic is not None
        with self._readers_lock:
            parked = [] if topic is None else self._parked.get((topic, partition), [])
            for i, (standing, at) in enumerate(parked):
                if at == from_offset:
                    del parked[i]
                    return standing, True
            pool = self._followers if follow else self._readers
            consumer = pool.pop() if pool else None
        if consumer is None:
            consumer = Consumer(
                self._client_config(
                    **{
                        "group.id": f"{self.prefix}.reader",  # required; never joined or committed
                        "enable.auto.commit": False,
                        "isolation.level": "read_committed",
                        "enable.partition.eof": True,
                        # An offset retention deleted is an error to report, not a reset.
                        "auto.offset.reset": "error",
                        "fetch.wait.max.ms": TAIL_WAIT_MS if follow else READ_WAIT_MS,
                    }
                )
            )
        return consumer, False

    def _park(self, consumer: Consumer, topic: str, partition: int, next_offset: int) -> bool:
        """Keep ``consumer`` assigned at ``next_offset`` for the partition's next read. A few per
        partition: each of a process's followers of it (the read model's, a warm standby's)
        keeps its own, and the oldest goes when one more would exceed PARKED_PER_PARTITION."""
        with self._readers_lock:
            if self._closed.is_set():
                return False
            parked = self._parked.setdefault((topic, partition), [])
            parked.append((consumer, next_offset))
            dropped = parked[:-PARKED_PER_PARTITION]
            del parked[:-PARKED_PER_PARTITION]
        for old, _ in dropped:
            with contextlib.suppress(KafkaException):
                old.unassign()
            self._put_reader(old, follow=True)  # only followers are parked
        return True

    def _put_reader(self, consumer: Consumer, follow: bool) -> None:
        """Return ``consumer`` (unassigned) to the pool it was taken from: the followers' or
        the readers' (``follow``); closed if the log is."""
        with self._readers_lock:
            if not self._closed.is_set():
                (self._followers if follow else self._readers).append(consumer)
                return
        consumer.close()

    def _topic(self, stream: str) -> str:
        if stream not in self.topics:
            raise ValueError(f"unknown stream {stream!r}; expected one of {STREAMS}")
        return self.topics[stream]

    def _check_partition(self, partition: int) -> None:
        if not 0 <= partition < self._num_partitions:
            raise ValueError(f"partition {partition} is out of range 0..{self._num_partitions - 1}")

    def _check_open(self) -> None:
        if self._closed.is_set():
            raise CronlogError(f"the Kafka event log {self.prefix} is closed")


class KafkaMailbox:
    """The replies to one node: its partition of ``<prefix>.replies`` from where it ended when
    the mailbox opened, filtered by the node's key."""

    def __init__(self, log_: KafkaLog, node_id: str) -> None:
        self._key = node_id.encode()
        self._lock = threading.Lock()
        self._closed = False
        self._consumer = Consumer(
            log_._client_config(
                **{
                    "group.id": f"{log_.prefix}.mailbox",  # required; never joined or committed
                    "enable.auto.commit": False,
                    "enable.auto.offset.store": False,
                    "auto.offset.reset": "latest",
                    "fetch.wait.max.ms": 100,
                }
            )
        )
        partition = TopicPartition(log_.replies_topic, _reply_partition(node_id))
        # An explicit offset, read now: a logical "end" would be resolved at the first fetch
        # and lose replies sent between opening and that fetch.
        try:
            end = _end_offset(self._consumer, partition, log_._timeout_s)
        except KafkaException as e:
            self._consumer.close()
            raise CronlogError(f"mailbox of {node_id}: no end offset: {e.args[0]}") from e
        partition.offset = end
        self._consumer.assign([partition])

    def poll(self, timeout_s: float) -> list[bytes]:
        deadline = time.monotonic() + timeout_s
        replies: list[bytes] = []
        with self._lock:
            if self._closed:
                raise CronlogError("poll on a closed mailbox")
            while True:
                # consume() would wait for its whole count: wait for one, then take what is there
                first = self._consumer.poll(max(deadline - time.monotonic(), 0.0))
                batch = [] if first is None else [first, *self._consumer.consume(499, 0)]
                for msg in batch:
                    err = msg.error()
                    if err is not None:
                        if err.fatal():
                            raise CronlogError(f"mailbox consumer failed: {err}")
                        continue  # informational (e.g. a broker connection came and went)
                    if msg.key() == self._key:
                        replies.append(msg.value() or b"")
                if replies or time.monotonic() >= deadline:
                    return replies

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._consumer.close()


class KafkaMembership:
    """A member of ``<prefix>.scheduler``; owns the partitions the group assigns it."""

    def __init__(self, log: KafkaLog, listener: OwnershipListener) -> None:
        self._log = log
        self._listener = listener
        self._commands = log.topics["commands"]
        self._lock = threading.Lock()
        self._writers: dict[int, KafkaPartitionWriter] = {}
        self._closed = False
        self._in_callback = threading.Event()  # a revocation callback is running (close waits)
        # the assignments' checks for deleted commands still running (tests join them)
        self.checks: list[threading.Thread] = []
        self._consumer = self._new_consumer()

    def _new_consumer(self) -> Consumer:
        consumer = Consumer(self._log._member_config())
        consumer.subscribe(
            [self._commands],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_revoke,
        )
        return consumer

    def poll(self, timeout_s: float, max_records: int = 500) -> list[Record]:
        if self._closed:
            raise CronlogError("poll on a closed membership")
        deadline = time.monotonic() + timeout_s
        while True:
            consumer = self._consumer
            first = consumer.poll(max(deadline - time.monotonic(), 0.0))
            if first is None:
                return []
            batch = [first, *consumer.consume(max_records - 1, 0)] if max_records > 1 else [first]
            records = [_record(msg) for msg in batch if self._accept(msg, consumer)]
            if records or time.monotonic() >= deadline:
                return records

    def writer(self, partition: int) -> KafkaPartitionWriter:
        with self._lock:
            writer = self._writers.get(partition)
        if writer is None:
            raise Fenced(f"partition {partition} is not owned by this member")
        return writer

    def owned(self) -> frozenset[int]:
        with self._lock:
            return frozenset(self._writers)

    def others(self, timeout_s: float) -> int | None:
        group = self._log.group
        reader = self._log._members_reader
        try:
            if reader is not None:
                return max(0, len(reader()) - 1)
            [future] = (
                self._log._admin_client()
                .describe_consumer_groups([group], request_timeout=timeout_s)
                .values()
            )
            members = future.result(timeout=timeout_s).members
        except Exception as err:  # unknown: the caller takes the cautious way
            logger.warning("the members of group %s are unknown: %s", group, err)
            return None
        return max(0, len(members) - 1)

    def renew(self, partition: int) -> KafkaPartitionWriter:
        with self._lock:
            old = self._writers.get(partition)
        if old is None:
            raise Fenced(f"partition {partition} is not owned by this member")
        old.close()
        # The new producer's init_transactions fences the old one and settles its open
        # transaction (committed if its commit was under way, aborted otherwise).
        new = KafkaPartitionWriter.open(self._log, partition)
        new._position = old.command_position()
        with self._lock:
            if self._writers.get(partition) is not old:  # revoked meanwhile
                new.close()
                raise Fenced(f"partition {partition} is not owned by this member")
            self._writers[partition] = new
        return new

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Revokes through the callback and leaves the group. Leaving is best effort: a broker
        # that does not answer must not keep the writers open, so errors end here, and so
        # does a close that librdkafka never lets go of (:meth:`_close_consumer`).
        self._close_consumer()
        with self._lock:
            left = sorted(self._writers)
        if left:  # the revocation callback did not run: give them up here
            self._give_up(left)

    def _close_consumer(self) -> None:
        """Close the group's consumer on a thread of its own, waiting while the revocation
        callback runs (this node's own work) and at most ``CLOSE_STUCK_S`` once it is not:
        librdkafka has stayed inside a close for good, in the unassign it makes after the
        callback returned, waiting for an answer that never came (a member closed while the
        group rebalanced; a test hung CI on it). Such a consumer is left behind, said."""
        consumer = self._consumer
        closed = threading.Event()

        def close() -> None:
            try:
                consumer.close()
            except Exception as err:  # best effort, as leaving the group is
                logger.warning("the group's consumer: closing it failed: %s", err)
            finally:
                closed.set()

        threading.Thread(target=close, name="group-consumer-close", daemon=True).start()
        idle_since = time.monotonic()
        while not closed.wait(0.1):
            if self._in_callback.is_set():
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since >= CLOSE_STUCK_S:
                logger.error(
                    "the group's consumer did not close within %.0f s of its last callback"
                    " (librdkafka holds it); it is left behind, and its partitions are given"
                    " up here",
                    CLOSE_STUCK_S,
                )
                return

    def _accept(self, msg: Message, consumer: Consumer) -> bool:
        err = msg.error()
        if err is None:
            return True
        if err.fatal():
            raise CronlogError(f"consumer of {self._commands} failed: {err}")
        # (A refusal reported again by a consumer already replaced says nothing of the new one.)
        if err.code() == KafkaError.INVALID_SESSION_TIMEOUT and consumer is self._consumer:
            self._widen_session(err)
        return False  # informational (e.g. a broker connection came and went)

    def _widen_session(self, err: KafkaError) -> None:
        """The brokers refused the group session (below their ``group.min.session.timeout.ms``):
        join again with Kafka's stock floor, once, and say what it costs."""
        log = self._log
        refused = log._session_timeout_ms
        if refused >= STOCK_MIN_SESSION_TIMEOUT_MS:
            raise CronlogError(
                f"the brokers refuse a group session of {refused} ms ({err}): lower their"
                " group.min.session.timeout.ms"
            )
        logger.warning(
            "the brokers refuse a group session of %d ms (their group.min.session.timeout.ms is"
            " higher): joining with %d ms, so a dead node's partitions move only after that"
            " long. Set group.min.session.timeout.ms=%d or lower on the brokers for the faster"
            " failover (docs/operations.md)",
            refused,
            STOCK_MIN_SESSION_TIMEOUT_MS,
            refused,
        )
        log._session_timeout_ms = STOCK_MIN_SESSION_TIMEOUT_MS
        old, self._consumer = self._consumer, self._new_consumer()
        with contextlib.suppress(Exception):
            old.close()

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if self._closed or not partitions:
            return  # an assignment served while leaving is revoked right after; open nothing
        log = self._log
        # Fence every predecessor first: after that no transaction can move a command position.
        writers = _open_writers(log, [tp.partition for tp in partitions])
        found = log._found_positions(sorted(writers))
        committed = [
            TopicPartition(self._commands, p, OFFSET_INVALID if position is None else position)
            for p, position in sorted(found.items())
        ]
        starts = []
        for p, position in sorted(found.items()):
            writers[p]._position = position or 0
            starts.append(TopicPartition(self._commands, p, position or OFFSET_BEGINNING))
        consumer.incremental_assign(starts)
        # The check for deleted commands only warns: it runs beside the assignment, never
        # before it (a watermark query can take the log's whole timeout while the cluster
        # settles, and the partitions would stay without an owner that long).
        check = threading.Thread(
            target=self._check_starts, args=(committed,), name="commands-start-check", daemon=True
        )
        check.start()
        self.checks = [t for t in self.checks if t.is_alive()] + [check]
        with self._lock:
            self._writers.update(writers)
        self._listener.assigned(sorted(writers))

    def _check_starts(self, committed: list[TopicPartition]) -> None:
        log = self._log
        for tp in committed:
            if log._closed.is_set():
                return
            try:
                with log._reader() as reader:
                    _warn_if_commands_were_deleted(reader, tp, max(tp.offset, 0), log._timeout_s)
            except Exception:  # a warning that could not be given is said, never raised
                logger.exception("checking %s[%d] for deleted commands failed", tp.topic,
                                 tp.partition)  # fmt: skip

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # confluent-kafka unassigns them once this returns.
        self._in_callback.set()
        try:
            self._give_up([tp.partition for tp in partitions])
        finally:
            self._in_callback.clear()

    def _give_up(self, partitions: list[int]) -> None:
        with self._lock:
            writers = [self._writers.pop(p) for p in partitions if p in self._writers]
        for writer in writers:
            writer.close()
        if writers:
            self._listener.revoked(sorted(w.partition for w in writers))


def _open_writers(log: KafkaLog, partitions: list[int]) -> dict[int, KafkaPartitionWriter]:
    """The writers of ``partitions``, each opened (its predecessor fenced) at the same time as
    the others: opening one is round trips to the transaction coordinator, longer when the
    predecessor died inside a transaction, which the coordinator aborts first. One at a time,
    a node taking over a dead node's three partitions started deciding the last of them only
    after all three had been opened in turn. Returns once every one is open; when one cannot
    be opened, those that were are closed and its error is raised."""
    started = time.monotonic()
    with ThreadPoolExecutor(len(partitions), thread_name_prefix="open-writer") as pool:
        futures = {p: pool.submit(KafkaPartitionWriter.open, log, p) for p in partitions}
    writers = {}
    failure: BaseException | None = None
    for p, future in futures.items():
        try:
            writers[p] = future.result()
        except BaseException as err:  # raised below, after the cleanup
            failure = failure or err
    if failure is not None:
        for writer in writers.values():
            writer.close()
        raise failure
    logger.info(
        "partitions %s: writers opened, predecessors fenced, in %.2f s",
        sorted(partitions),
        time.monotonic() - started,
    )
    return writers


class KafkaPartitionWriter:
    """The transactional producer ``<prefix>.p<N>``: the single writer of partition N."""

    def __init__(
        self,
        log: KafkaLog,
        partition: int,
        producer: Producer,
    ) -> None:
        self._log = log
        self._partition = partition
        self._producer: Producer | None = producer
        self._position = 0
        # The end of the last append's events, until they are known readable (its markers
        # written): the next transaction waits for that (:meth:`wait_until_readable`).
        self._unsettled: int | None = None
        # ``_lock`` guards the fields, never held across a call to the broker; ``_appending``
        # lets one transaction run at a time. ``close`` takes only the first, so giving the
        # partition up never waits for a transaction in flight.
        self._lock = threading.Lock()
        self._appending = threading.Lock()
        self._in_flight = False  # a transaction is running: its append closes the producer
        self._transactional_id = f"{log.prefix}.p{partition}"

    @classmethod
    def open(cls, log: KafkaLog, partition: int) -> KafkaPartitionWriter:
        """Open the writer, fencing the partition's previous writer."""
        producer = Producer(
            log._client_config(
                **{
                    "transactional.id": f"{log.prefix}.p{partition}",
                    "acks": "all",
                    "linger.ms": 0,  # appends flush anyway; do not wait to batch
                    "transaction.timeout.ms": max(60000, int(log._timeout_s * 2000)),
                }
            )
        )
        _retrying(producer.init_transactions, time.monotonic() + log._timeout_s)
        return cls(log, partition, producer)

    @property
    def partition(self) -> int:
        return self._partition

    def append(
        self,
        events: Sequence[bytes],
        *,
        commands_through: int | None = None,
        outbound: Sequence[Outbound] = (),
    ) -> list[int]:
        """One transaction, within the log's timeout in all (every retry of every call to the
        broker included): past it the writer closes and raises ``Fenced``, and the runner
        recovers from the log with a new writer, rather than hold its partition while a broker
        that stopped answering is asked again and again. ``outbound`` records go into the same
        transaction (invariant 9): one that cannot be delivered (no such topic, say) aborts it,
        and the append raises ``AppendAborted``."""
        with self._appending:
            with self._lock:
                producer = self._producer
                if producer is None:
                    raise Fenced(f"writer {self._transactional_id} is closed")
                if not events and commands_through is None:
                    return []
                self._in_flight = True
            deadline = time.monotonic() + self._log._timeout_s
            try:
                offsets = self._transaction(producer, events, commands_through, outbound, deadline)
            except KafkaException as e:
                if self._closed():  # given up meanwhile: whatever it did, the next owner reads
                    raise Fenced(f"writer {self._transactional_id} closed: {e.args[0]}") from e
                self._fail(producer, e.args[0], deadline)
            finally:
                with self._lock:
                    self._in_flight = False
                    closed = self._producer is None
                if closed:  # closed while it ran (or by its failure): now
                    _close_producer(producer)
            with self._lock:
                if commands_through is not None:
                    self._position = commands_through
                self._unsettled = offsets[-1] + 1 if offsets else None
        if offsets and self._log._readable_appends:
            self._log._wait_readable(self._partition, offsets[-1])
        return offsets

    def wait_until_readable(self) -> None:
        """Return once the last append's events are readable, or after ``SETTLE_WAIT_S``.

        Kafka acknowledges a commit before its markers are written, and the transaction
        coordinator refuses the partition's next transaction until they are
        (``CONCURRENT_TRANSACTIONS``), which librdkafka asks again only after a fixed 20 ms:
        a transaction begun at once after the last commit paid that, and the commands that
        arrived meanwhile waited for the next one. The runner calls this before it takes its
        next batch, so those commands gather into it instead. Nothing but speed depends on
        it: a transaction may begin at any time, so a wait that fails or runs out only lets
        it begin (a transaction of only a command position leaves no marker that a reader
        sees, and is not waited for)."""
        with self._lock:
            end, self._unsettled = self._unsettled, None
        if end is None:
            return
        try:
            if not self._log._wait_stable(self._partition, end, SETTLE_WAIT_S):
                logger.debug("partition %d: events below %d not readable yet", self._partition, end)
        except (KafkaException, CronlogError) as err:
            logger.debug("partition %d: stable end unknown: %s", self._partition, err)

    def command_position(self) -> int:
        """The position read from the group when the partition was assigned, or last appended."""
        with self._lock:
            return self._position

    def close(self) -> None:
        """Give the partition up, at once. The rebalance callback calls this, and the group's
        rebalance waits for it, so it never waits for a transaction in flight: that append
        closes the producer when its call returns, and raises ``Fenced`` unless it committed
        (its events are then in the log, and the next owner reads them)."""
        with self._lock:
            producer, self._producer = self._producer, None
            if self._in_flight:
                return
        if producer is not None:
            _close_producer(producer)

    def _closed(self) -> bool:
        with self._lock:
            return self._producer is None

    def _transaction(
        self,
        producer: Producer,
        events: Sequence[bytes],
        commands_through: int | None,
        outbound: Sequence[Outbound],
        deadline: float,
    ) -> list[int]:
        reports: list[tuple[KafkaError | None, int]] = []

        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            reports.append((err, _offset(msg) if err is None else -1))

        producer.begin_transaction()
        topic = self._log.topics["events"]
        for value in events:
            producer.produce(topic, value, partition=self._partition, on_delivery=on_delivery)
        # Others' records: a delivery that fails fails the commit as abortable, so nothing of
        # the append is read (their reports are not the events' offsets, and are not kept).
        for record in outbound:
            producer.produce(
                record.topic, record.value, key=record.key, headers=list(record.headers)
            )
        if commands_through is not None:  # committed with the events, or neither is
            producer.produce(
                self._log.topics[POSITIONS],
                str(commands_through).encode(),
                key=POSITION_KEY,
                partition=self._partition,
            )
        # The commit flushes the events first and serves their delivery reports on this thread;
        # a delivery that failed fails the commit as abortable. A flush of its own before it
        # served them too, but cost this thread one more wait for the GIL, which the event loop
        # holds most of the time (up to the 5 ms switch interval each time).
        _retrying(producer.commit_transaction, deadline)
        if len(reports) < len(events):  # served by the commit: not expected
            producer.flush(max(deadline - time.monotonic(), 0.0))
        failed = [err for err, _ in reports if err is not None]
        if len(reports) < len(events) or failed:
            raise CronlogError(
                f"partition {self._partition}: transaction committed, but the offsets of "
                f"{len(events) - len(reports)} of its {len(events)} events are unknown and "
                f"{len(failed)} reported failures ({failed[:1]}); recover from the log"
            )
        return [offset for _, offset in reports]  # reports come back in produce order

    def _fail(self, producer: Producer, err: KafkaError, deadline: float) -> NoReturn:
        if not err.fatal() and err.txn_requires_abort():
            try:
                # Within the append's deadline, but given a moment even past it: an abort that
                # fails too closes the writer, and a new one is opened.
                _retrying(producer.abort_transaction, max(deadline, time.monotonic() + ABORT_MIN_S))
            except KafkaException as abort_failed:
                err = abort_failed.args[0]
            else:
                raise AppendAborted(
                    f"append to partition {self._partition} aborted, nothing written: {err}"
                )
        self.close()
        raise Fenced(f"writer {self._transactional_id} gave up partition {self._partition}: {err}")


def _reply_partition(node_id: str) -> int:
    return partition_for(node_id, REPLY_PARTITIONS)


def _offset(msg: Message) -> int:
    offset = msg.offset()
    return -1 if offset is None else offset


def _record(msg: Message) -> Record:
    partition = msg.partition()
    return Record(
        -1 if partition is None else partition, _offset(msg), msg.value() or b"", msg.key()
    )


def _end_offset(consumer: Consumer, partition: TopicPartition, timeout_s: float) -> int:
    """The partition's high watermark (see :func:`_watermarks`)."""
    return _watermarks(consumer, partition, timeout_s)[1]


# The first round of a watermark query waits this long; each round after waits twice as long.
WATERMARK_ROUND_S = 2.0


def _watermarks(consumer: Consumer, partition: TopicPartition, timeout_s: float) -> tuple[int, int]:
    """The partition's low and high watermarks, asked again while the cluster settles: a new
    topic's leader can be in the metadata before it serves offsets, and a leader that died
    keeps a query waiting on it until it times out. librdkafka sends the query to the leader
    its metadata names and does not look again, so a node that started as a broker was
    killed once spent all of its start's 30 s on the dead broker and exited (CI's chaos run,
    seed 12), though the partition had a new leader 2 s later. Each round therefore waits
    for a part of the time only (``WATERMARK_ROUND_S``, doubled each round), and the
    topic's metadata is asked for anew before the next round. The same after any error that
    passes: a reader whose metadata had the partition unknown (``_UNKNOWN_PARTITION``) kept
    answering so for the whole 30 s, and a new owner waited that long (CI's chaos run)."""
    began = time.monotonic()
    deadline = began + timeout_s
    round_s = WATERMARK_ROUND_S
    failed, first_error = 0, ""
    while True:
        left_s = max(0.001, deadline - time.monotonic())
        try:
            low, high = consumer.get_watermark_offsets(partition, timeout=min(round_s, left_s))
            waited_s = time.monotonic() - began
            if failed:  # a wait is never silent: a long one warns (a new topic settles quicker)
                logger.log(
                    logging.WARNING if waited_s >= WATERMARK_ROUND_S else logging.DEBUG,
                    "watermarks of %s[%d] answered after %d failed asks over %.1f s (first: %s)",
                    partition.topic,
                    partition.partition,
                    failed,
                    waited_s,
                    first_error,
                )
            return int(low), int(high)
        except KafkaException as e:
            err = e.args[0]
            failed += 1
            first_error = first_error or err.str()
            left_s = deadline - time.monotonic()
            if not _passes(err) or left_s <= 0:
                raise
            if err.code() == KafkaError._TIMED_OUT:
                round_s *= 2
            else:
                time.sleep(min(0.1, left_s))  # leadership settling has no event to wait on
            # A refresh that fails leaves the next round to find out.
            with contextlib.suppress(KafkaException):
                consumer.list_topics(partition.topic, timeout=min(1.0, max(0.001, left_s)))


def _warn_if_commands_were_deleted(
    consumer: Consumer, partition: TopicPartition, position: int, timeout_s: float
) -> None:
    """Say so loudly when the commands topic's retention deleted commands nobody decided:
    consuming goes on from the topic's start (``auto.offset.reset``), which is all that can
    be done, but it must not pass unnoticed. The commands' retention (7 days by default) is
    meant to make this impossible short of a week without an owner; trimming
    (:meth:`KafkaLog.trim_commands`) never deletes past the committed position."""
    try:
        start = _start_offset(
            consumer, TopicPartition(partition.topic, partition.partition), timeout_s
        )
    except KafkaException as e:
        logger.warning("start of %s[%d] unknown: %s", partition.topic, partition.partition, e)
        return
    if position < start and partition.offset < 0:
        # No position anywhere, yet the topic no longer starts at 0: either no owner ever
        # decided these commands, or the positions were lost after owners had (a positions
        # topic not compacted; a log from before it, whose positions were the group's offsets,
        # which the broker drops after offsets.retention.minutes); the log cannot tell which.
        logger.error(
            "%s[%d]: commands 0..%d were deleted and the log holds no command position for "
            "them: either the topic's retention deleted them before any owner decided them "
            "(they are lost: raise --command-retention), or the positions were lost (the "
            "positions topic's cleanup.policy must be compact; a log from before it kept them "
            "as the group's offsets, which the broker expires after offsets.retention.minutes) "
            "and the commands decided since the last trim are decided again from %d (see "
            "docs/operations.md)",
            partition.topic,
            partition.partition,
            start - 1,
            start,
        )
    elif position < start:
        logger.error(
            "%s[%d]: commands %d..%d were deleted by the topic's retention before any owner "
            "decided them; they are lost (raise --command-retention)",
            partition.topic,
            partition.partition,
            position,
            start - 1,
        )


def _start_offset(consumer: Consumer, partition: TopicPartition, timeout_s: float) -> int:
    """The partition's low watermark (see :func:`_watermarks`)."""
    return _watermarks(consumer, partition, timeout_s)[0]


def _retrying(call: Callable[[float], T], deadline: float) -> T:
    """Run a transactional call, given the time left before ``deadline`` (``time.monotonic``),
    and repeat it while librdkafka flags its error retriable and time is left: a broker that
    stops answering fails the call at the deadline, not after a full timeout per attempt."""
    backoff = RETRY_BACKOFF_S
    while True:
        try:
            return call(max(deadline - time.monotonic(), MIN_CALL_S))
        except KafkaException as e:
            err = e.args[0]
            plain_retry = err.retriable() and not (err.fatal() or err.txn_requires_abort())
            if not plain_retry or time.monotonic() + backoff >= deadline:
                raise
        time.sleep(backoff)  # an error that came back at once is not asked again at once
        backoff = min(backoff * 2, MAX_RETRY_BACKOFF_S)


POSITION_KEY = b"commands-through"  # each positions partition's one key (compacted)
# How long a closing group consumer may stay inside librdkafka after its last callback
# (:meth:`KafkaMembership._close_consumer`).
CLOSE_STUCK_S = 10.0


def _position_value(value: bytes | None, partition: int) -> int:
    """A ``positions`` record's command position (its value is the offset in decimal)."""
    try:
        position = int((value or b"").decode())
    except (UnicodeDecodeError, ValueError):
        raise CronlogError(
            f"positions[{partition}]: the last record is not a command position: {value!r}"
        ) from None
    if position < 0:
        raise CronlogError(f"positions[{partition}]: a negative command position: {position}")
    return position


def _close_producer(producer: Producer) -> None:
    # A fenced producer reports its fence again on close; nothing is left to undo.
    with contextlib.suppress(KafkaException):
        producer.purge()
        producer.close()


def retention_configs(retention: Retention) -> dict[str, dict[str, str]]:
    """The topic configs ``retention`` means, per stream (``-1`` is Kafka's "no bound")."""

    def bound(value: int | None) -> str:
        return "-1" if value is None else str(value)

    return {
        "events": {
            "retention.ms": bound(retention.retention_ms),
            "retention.bytes": bound(retention.retention_bytes),
        },
        "commands": {
            "retention.ms": bound(retention.command_retention_ms),
            "retention.bytes": "-1",
        },
    }


def scheduler_group(prefix: str) -> str:
    """The consumer group of a cluster's nodes (topic prefix ``prefix``): its members own the
    partitions."""
    return f"{prefix}.scheduler"


def topic_configs(admin: AdminClient, name: str, timeout_s: float) -> dict[str, str]:
    """The topic's current configs (every one the broker reports)."""
    resource = ConfigResource(ResourceType.TOPIC, name)
    [future] = admin.describe_configs([resource], request_timeout=timeout_s).values()
    return {key: entry.value for key, entry in future.result().items()}


def _align_configs(
    admin: AdminClient,
    name: str,
    wanted: dict[str, str],
    timeout_s: float,
    fresh: Callable[[], AdminClient] | None = None,
) -> None:
    """Set the configs of ``wanted`` that the existing topic ``name`` has otherwise. Asked
    again while the error passes (a controller moving), as topic creation is, and while the
    broker asked does not know the topic yet: another node has just created it, and not every
    broker has its metadata (a node once exited here with UNKNOWN_TOPIC_OR_PART). Each round
    asks for a part of the time, as topic creation does, and through a ``fresh()`` client
    when there is one: a node started just as a broker was killed spent its whole 30 s
    waiting for that broker as its controller, and exited ("Timed out waiting for
    controller") while the other two answered. A new client reads the cluster's metadata
    anew, from a broker that is up."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            attempt_s = max(0.5, min(_CREATE_ATTEMPT_S, deadline - time.monotonic()))
            _align_once(admin, name, wanted, attempt_s)
            return
        except KafkaException as e:
            err = e.args[0]
            passing = err.retriable() or err.code() in _CONFIGS_SETTLING
            if not passing or time.monotonic() >= deadline:
                raise CronlogError(f"cannot set the retention of topic {name}: {err}") from e
            logger.warning("setting the retention of topic %s: %s; asking again", name, err)
            if fresh is not None:
                admin = fresh()
        time.sleep(0.2)  # a broker's failover has no event to wait on


def _align_once(admin: AdminClient, name: str, wanted: dict[str, str], timeout_s: float) -> None:
    current = topic_configs(admin, name, timeout_s)
    changes = {k: v for k, v in wanted.items() if current.get(k) != v}
    if not changes:
        return
    resource = ConfigResource(
        ResourceType.TOPIC,
        name,
        incremental_configs=[
            ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
            for k, v in changes.items()
        ],
    )
    [future] = admin.incremental_alter_configs([resource], request_timeout=timeout_s).values()
    future.result()
    logger.info(
        "topic %s: %s",
        name,
        ", ".join(f"{k} {current.get(k)} -> {v}" for k, v in changes.items()),
    )


_CREATE_ATTEMPT_S = 5.0
"""How long one round of topic creation (or the metadata read before it) may take."""


def _missing(admin: AdminClient, names: list[str], timeout_s: float) -> list[str]:
    """The ``names`` the cluster's metadata does not hold; all of them when it cannot be read
    (creating them then answers both questions, and is asked again while the error passes)."""
    try:
        topics = admin.list_topics(timeout=timeout_s).topics
    except KafkaException as e:
        logger.warning("reading the topics before creating them: %s", e.args[0])
        return list(names)
    return [n for n in names if n not in topics or topics[n].error is not None]


def _ensure_topics(
    admin: AdminClient,
    names: list[str],
    num_partitions: int,
    replication_factor: int,
    config: dict[str, str],
    timeout_s: float,
    fresh: Callable[[], AdminClient] | None = None,
) -> None:
    """Create those of ``names`` the cluster lacks and wait until each has its partitions'
    leaders. A round whose creation fails while the cluster settles is followed by another,
    through a ``fresh()`` client when there is one (see :func:`_align_configs`)."""
    deadline = time.monotonic() + timeout_s
    # Only a topic nobody has made yet is created: creating asks the controller, while reading
    # the metadata asks any broker, so a node starting again while the controller is down
    # starts (one once exited here: "Failed while waiting for controller").
    pending = _missing(admin, names, min(timeout_s, _CREATE_ATTEMPT_S))
    while pending:
        # Each round asks for at most a part of the time, so a controller that is gone when
        # the first is sent leaves time for the next to reach its successor.
        attempt_s = max(0.5, min(_CREATE_ATTEMPT_S, deadline - time.monotonic()))
        futures = admin.create_topics(
            [NewTopic(n, num_partitions, replication_factor, config=config) for n in pending],
            operation_timeout=attempt_s,
            request_timeout=attempt_s,
        )
        pending = []
        for name, future in futures.items():
            try:
                future.result()
            except KafkaException as e:
                err = e.args[0]
                if err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                    continue
                # A broker that dies with the request in flight, or a controller moving, passes:
                # ask again rather than fail the node's start (it once exited here).
                passing = err.retriable() or err.code() in _CREATE_SETTLING
                if not passing or time.monotonic() >= deadline:
                    raise CronlogError(f"cannot create topic {name}: {err}") from e
                logger.warning("creating topic %s: %s; asking again", name, err)
                pending.append(name)
        if pending:
            if fresh is not None:
                admin = fresh()
            time.sleep(0.2)  # a broker's failover has no event to wait on
    # Wait until every partition has a leader, so the first produce does not race the metadata.
    while True:
        try:
            topics = admin.list_topics(timeout=max(0.5, deadline - time.monotonic())).topics
        except KafkaException as e:
            if time.monotonic() >= deadline:
                raise CronlogError(f"cannot read the metadata of topics {names}: {e}") from e
            topics = {}
        ready = True
        for name in names:
            meta = topics.get(name)
            if meta is None or meta.error is not None:
                ready = False
                continue
            if len(meta.partitions) != num_partitions:
                raise CronlogError(
                    f"topic {name} has {len(meta.partitions)} partitions, the log expects "
                    f"{num_partitions}; jobs would hash to other partitions"
                )
            ready = ready and all(p.leader >= 0 for p in meta.partitions.values())
        if ready:
            return
        if time.monotonic() >= deadline:
            raise CronlogError(f"topics {names} have no leaders after {timeout_s:.0f}s")
        time.sleep(0.1)  # metadata propagation has no event to wait on


if TYPE_CHECKING:

    def _implements_the_port(log_: KafkaLog) -> EventLog:  # mypy checks KafkaLog against it
        return log_
