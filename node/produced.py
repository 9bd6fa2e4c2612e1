"""``kafka://`` targets produced in the events' own transaction: exactly once, in cluster mode.

On a Kafka cluster whose teams' topics are on the cluster itself, a run of a ``kafka://topic``
job is not a call. When it is due, the partition's runner decides its lease and its success at
once, and appends them with the team's record (:class:`eventlog.port.Outbound`) in one Kafka
transaction (invariant 9 of :mod:`eventlog.port`). A ``read_committed`` consumer of the topic
therefore sees the record exactly when the run's ``RunCompleted`` is in the log:

- **a node killed** before the commit left nothing: the run is still due, and the partition's
  next owner produces it;
- **a zombie** (an owner that lost the partition and does not know yet) is fenced at its next
  transactional call, and Kafka aborts what it had open: neither its events nor its record
  are read, and the new owner decides the run from the log;
- **a broker lost** aborts the transaction or delays it; an abort leaves nothing, so the run
  is decided again.

What the record is: the run's JSON body, keyed by the job id, with the run's headers
(``Idempotency-Key`` among them), as the at-least-once producer of ``node.caller`` sends it.

What can go wrong, and what it costs: a record that cannot be delivered aborts the whole
transaction, the other runs' events of the batch with it. So the topic is checked before the
run is decided: the team's grant (the egress policy, as for every call) and that the topic
exists (the cluster's metadata, learned at most every ``TOPICS_EVERY_S``; a topic unknown is
a failed attempt, retried with the job's backoff). An append that still fails is recovered
from the log, and the run tried once more; a run in two failed transactions in a row is
decided failed without its record (the abort left nothing, so the attempt is not ambiguous),
and the job's retries take it from there.

Embedded, or with a target Kafka of its own (``--target-kafka`` another cluster, or
``--target-kafka-config`` other credentials), a ``kafka://`` run is a call as before
(``node.caller``): at least once, its ``Idempotency-Key`` header the consumer's way to drop a
repeat.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from core import events as ev
from core.egress import EgressPolicy
from core.ids import team_id
from core.jobs import JobSpec
from eventlog.port import Outbound
from node.calls import run_body, run_headers

log = logging.getLogger(__name__)

TOPICS_EVERY_S = 2.0  # a topic not known yet makes the runner ask the cluster, this often at most
TOPICS_TIMEOUT_S = 1.0  # how long asking may hold the partition's loop


class ProducedTargets:
    """What a partition's runner asks before it decides a ``kafka://`` run in its transaction:
    may the team produce to the topic, and is it there; and the record it then produces."""

    def __init__(
        self,
        egress: EgressPolicy,
        topic_names: Callable[[float], frozenset[str]],
        *,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``topic_names(timeout_s)``: the cluster's topics now
        (:meth:`eventlog.kafka.KafkaLog.topic_names`)."""
        self._egress = egress
        self._topic_names = topic_names
        self._monotonic = monotonic
        self._lock = threading.Lock()  # runners of several partitions ask at once
        self._known: frozenset[str] = frozenset()
        self._asked_at: float | None = None

    def refusal(self, tenant: str, topic: str) -> tuple[str, bool] | None:
        """Why the run's record may not be produced now, and whether that is for good
        (permanent) or for this attempt; None when it may."""
        reason = self._egress.check_topic(tenant, topic)
        if reason is not None:
            return f"egress policy: {reason}", True
        if not self._exists(topic):
            return f"Kafka: topic {topic!r} does not exist on the cluster", False
        return None

    def record(self, lease: ev.LeaseGranted, spec: JobSpec, topic: str) -> Outbound:
        return Outbound(
            topic=topic,
            key=team_id(lease.job_id).encode(),
            value=run_body(lease, spec),
            headers=tuple(run_headers(lease).items()),
        )

    def _exists(self, topic: str) -> bool:
        # The cluster is asked outside the lock: the other partitions' runners go on deciding
        # runs to topics already known meanwhile; only this runner waits for the answer.
        with self._lock:
            if topic in self._known:
                return True
            now = self._monotonic()
            if self._asked_at is not None and now - self._asked_at < TOPICS_EVERY_S:
                return False
            self._asked_at = now
        try:
            known = self._topic_names(TOPICS_TIMEOUT_S)
        except Exception as err:
            # Unknown for now: let the transaction find out. A topic that is not there
            # aborts it, and the run's second try is decided failed.
            log.warning("the cluster's topics are unknown (%s); producing to %r", err, topic)
            return True
        with self._lock:
            self._known = known
        return topic in known
