"""A dead node's group members removed at once, not a session later (cluster mode).

A node killed with ``kill -9`` (or by the OOM killer, or a crash) leaves the consumer group only
when its session runs out (``--group-session-ms``, 6 s): until then its partitions have no
owner and their slots wait. Its machine, though, is usually alive, and says so at once: the
node's port refuses connections, or answers as the node's next boot. The watch asks.

Each member's ``client.id`` names its node, the node's boot (a random id each ``cronlog serve``
draws at start and passes to its worker processes) and the node's advertised address
(``cronlog/<node id>/<boot>@<host:port>``, :func:`member_name`). Every ``PROBE_S`` a node
reads the group's members (DescribeGroups, through kafka-python: :class:`GroupAdmin`) and
asks the next ``WATCHED`` nodes after its own address, in the ring of the members' addresses,
``GET /healthz`` (which answers the node's boot):

- **refused** ``STRIKES`` times in a row: no process listens at the address; the members
  there of a boot seen answering before are removed from the group (a LeaveGroup sent on
  their behalf, through kafka-python's admin client: confluent-kafka's has no such call). A
  boot never seen answering is a node starting again, which joins the group before its port
  listens: left alone;
- **answered by another boot**: the node was started again; the old boot's members are
  removed (the new boot's joins on its own);
- **no answer in time** (a node paused, its machine gone, a network cut): nothing; the
  group's session decides, as without the watch.

Removing a member that is in fact alive is safe: it learns at its next heartbeat that it is no
longer in the group, gives its partitions up, and any append it still tries is fenced by the
transactional id its successor took over. The watch only makes a death known sooner. A node
watches ``WATCHED`` others, whatever the cluster's size: a 30-node cluster probes 60 times
every ``PROBE_S``, not 870.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from node.worker import PeriodicWorker

log = logging.getLogger(__name__)

PROBE_S = 0.25  # how often each watched node is asked
FAILING_TOLD_S = 10.0  # while rounds keep failing, how often the watch says so
PROBE_TIMEOUT_S = 0.5  # an answer later than this is no answer: the session decides
STRIKES = 2  # refusals in a row before a node's members are removed
WATCHED = 2  # the nodes after one's own, in the ring of addresses, that each node watches
PREFIX = "cronlog/"


def member_name(node_id: str, boot: str, address: str) -> str:
    """The ``client.id`` of a node's group member: what the watch reads back."""
    return f"{PREFIX}{node_id}/{boot}@{address}"


@dataclass(frozen=True, slots=True)
class Member:
    member_id: str
    node_id: str
    boot: str
    address: str


def parse(member_id: str, client_id: str) -> Member | None:
    """The member named by ``client_id`` (:func:`member_name`); None for another client."""
    if not client_id.startswith(PREFIX) or "@" not in client_id:
        return None
    who, _, address = client_id[len(PREFIX) :].rpartition("@")
    node_id, _, boot = who.rpartition("/")
    if not node_id or not boot or not address:
        return None
    return Member(member_id, node_id, boot, address)


def watched(addresses: Sequence[str], own: str, count: int = WATCHED) -> list[str]:
    """The ``count`` addresses after ``own`` in the sorted ring of ``addresses``."""
    ring = sorted(set(addresses) | {own})
    at = ring.index(own)
    others = ring[at + 1 :] + ring[:at]
    return others[:count]


REFUSED = "refused"


def probe(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """The boot answering at ``address``; ``REFUSED`` when nothing listens there; None when
    there was no answer in time (or an answer that names no boot). The standard library's
    HTTP client: a probe costs about 0.1 ms of CPU (an httpx client made per probe, 28 ms)."""
    host, _, port = address.rpartition(":")
    connection = http.client.HTTPConnection(host.strip("[]"), int(port), timeout=timeout_s)
    try:
        connection.request("GET", "/healthz")
        answer = connection.getresponse()
        body = answer.read(4096)
    except ConnectionRefusedError:
        return REFUSED
    except (OSError, http.client.HTTPException):
        return None
    finally:
        connection.close()
    try:
        boot = json.loads(body).get("boot")
    except (ValueError, AttributeError):
        return None
    return boot if isinstance(boot, str) and boot else None


class PeerWatch(PeriodicWorker):
    """Removes the group members of dead nodes (see the module's text), a round every
    ``probe_s``, as a service of the node's supervisor. ``members`` reads the group's members,
    ``remove`` removes members by id, ``ask`` is :func:`probe`: each injectable, so the rule
    is tested without a cluster."""

    _thread_name = "peer-watch"

    def __init__(
        self,
        own_address: str,
        own_boot: str,
        members: Callable[[], list[Member]],
        remove: Callable[[list[Member]], None],
        ask: Callable[[str], str | None] = probe,
        probe_s: float = PROBE_S,
        closing: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._closing = closing
        self._clock = clock
        self._failures = 0  # rounds failed in a row
        self._told_at = 0.0  # when the last of them was logged
        self._address = own_address
        self._boot = own_boot
        self._members = members
        self._remove = remove
        self._ask = ask
        self._probe_s = probe_s
        self._strikes: dict[str, int] = {}
        # address -> the boots seen answering there: only those can be found dead by a
        # refusal (a node just started again joins the group before its port listens)
        self._answered: dict[str, set[str]] = {}

    def _pass(self) -> object:
        removed = self.round()
        if self._failures:
            log.info("peer watch: rounds work again, after %d failed", self._failures)
            self._failures = 0
        return removed

    def stop(self, timeout_s: float | None = None) -> None:
        super().stop(timeout_s)
        if self._closing is not None and not self.alive:
            self._closing()

    def _interval_s(self) -> float:
        return self._probe_s

    def _failed(self) -> None:
        # The watch only speeds things up: the session still decides meanwhile. A broker that
        # is down fails every round, four a second: the first is logged whole, the rest once
        # every FAILING_TOLD_S (a traceback each round once made most of a node's log).
        self._failures += 1
        now = self._clock()
        if self._failures == 1:
            self._told_at = now
            log.exception("peer watch: a round failed; the next comes at its time")
        elif now - self._told_at >= FAILING_TOLD_S:
            self._told_at = now
            log.warning(
                "peer watch: %d rounds in a row failed, the last with %r; the next comes at its"
                " time",
                self._failures,
                sys.exc_info()[1],
            )

    def round(self) -> list[Member]:
        """One round: ask the watched nodes, remove the members of those found dead; return
        the members removed."""
        members = [m for m in self._members() if m.boot != self._boot]
        by_address: dict[str, list[Member]] = {}
        for member in members:
            by_address.setdefault(member.address, []).append(member)
        dead: list[Member] = []
        why: dict[str, str] = {}
        for address in watched(list(by_address), self._address):
            answer = self._ask(address)
            if answer == REFUSED:
                strikes = self._strikes[address] = self._strikes.get(address, 0) + 1
                seen = self._answered.get(address, set())
                gone = [m for m in by_address[address] if m.boot in seen]
                if strikes >= STRIKES and gone:
                    dead += gone
                    why[address] = f"its address refused {strikes} connections in a row"
                continue
            self._strikes.pop(address, None)
            if answer is not None:
                self._answered[address] = {answer}  # an older boot cannot answer again
                old = [m for m in by_address[address] if m.boot != answer]
                if old:
                    dead += old
                    why[address] = f"its node was started again (boot {answer} answers there)"
        for address in list(self._strikes):
            if address not in by_address:
                del self._strikes[address]
        for address in list(self._answered):
            if address not in by_address:
                del self._answered[address]
        if dead:
            self._remove(dead)
            for member in dead:
                log.warning(
                    "removed node %s's group member %s (boot %s at %s): %s",
                    member.node_id,
                    member.member_id,
                    member.boot,
                    member.address,
                    why[member.address],
                )
                self._strikes.pop(member.address, None)
        return dead


class GroupAdmin:
    """The scheduler group's members read and removed through kafka-python's admin client (pure
    Python), not confluent-kafka's: librdkafka's admin requests to a group's coordinator
    (DescribeConsumerGroups among them) can abort the whole process when a broker goes away
    mid-request, an assertion in its own thread (``rd_kafka_enq_once_del_source_return:
    Assertion `eonce->refcnt > 0'``, librdkafka 2.16.0; confluentinc/librdkafka#3663 reports
    it for ListConsumerGroupOffsets). Asked four times a second, it killed 2 and 3 of the 3
    nodes in two chaos runs with broker faults (2026-12-05). A Python exception here fails one
    round and the next comes; nothing else can go wrong."""

    def __init__(self, bootstrap_servers: str, group: str) -> None:
        self._bootstrap = bootstrap_servers
        self.group = group
        self._client: Any = None
        # one call at a time: the client is made, used and closed (after a failure) by
        # whichever thread asks, the watch's or a worker process's service in the parent
        self._lock = threading.RLock()

    def warm(self) -> None:
        """Make the client and find the group's coordinator now, so the first removal costs two
        requests and not a bootstrap (seconds on a loaded machine, by when the session may have
        ended anyway). A failure here is only logged: the first real call tries again."""
        try:
            self.members()
        except Exception as err:
            log.warning("the group's admin client is not ready yet: %s", err)

    def _admin(self) -> Any:
        if self._client is None:
            from kafka.admin import KafkaAdminClient

            self._client = KafkaAdminClient(
                bootstrap_servers=self._bootstrap,
                request_timeout_ms=int(PROBE_TIMEOUT_S * 4000),
                client_id="cronlog-peer-watch",
            )
        return self._client

    def _described(self) -> list[dict[str, Any]]:
        """The group's members as DescribeGroups gives them (none before anyone joined)."""
        with self._lock, self._fresh_on_failure():
            described = self._admin().describe_groups([self.group])[self.group]
            error = described.get("error")
            if error and "GroupIdNotFound" in str(error):
                return []  # nobody has joined yet: no members, not a failure
            if error:
                raise RuntimeError(f"group {self.group} not described: {error}")
        members: list[dict[str, Any]] = described["members"]
        return members

    def members(self) -> list[Member]:
        found = [parse(m["member_id"], m["client_id"]) for m in self._described()]
        return [m for m in found if m is not None]

    def holdings(self, topic: str) -> list[frozenset[int]]:
        """The partitions of ``topic`` each member of the group holds now (one set a member,
        empty for a member given nothing), from the group's description: the assignment the
        coordinator last handed out."""
        return [_partitions_of(m.get("member_assignment"), topic) for m in self._described()]

    def remove(self, dead: list[Member]) -> None:
        from kafka.admin import MemberToRemove

        with self._lock, self._fresh_on_failure():
            self._admin().remove_group_members(
                self.group, [MemberToRemove(member_id=m.member_id) for m in dead]
            )

    @contextlib.contextmanager
    def _fresh_on_failure(self) -> Iterator[None]:
        """A failed call closes the client: the next round finds the group's coordinator anew.
        kafka-python caches the coordinator and keeps it through a ``NOT_COORDINATOR`` answer,
        so after the coordinator moved (its broker restarted) every round failed for as long as
        the client lived (40 s in a chaos run, 2026-12-05)."""
        try:
            yield
        except Exception:
            self.close()
            raise

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None


def group_admin(
    bootstrap_servers: str, group: str, client_config: dict[str, Any], *, say_why: bool = True
) -> GroupAdmin | None:
    """A :class:`GroupAdmin` of ``group``; None (and, with ``say_why``, a line saying why) when
    kafka-python's client cannot be made with the node's Kafka settings (``--kafka-config``:
    librdkafka's names, which kafka-python does not read)."""
    plain = {k: v for k, v in client_config.items() if k != "client.id"}
    if plain:
        if not say_why:
            return None
        log.info(
            "peer watch off: the node's Kafka settings (%s) are not passed to kafka-python;"
            " a dead node's members leave the group when their session ends",
            ", ".join(sorted(plain)),
        )
        return None
    return GroupAdmin(bootstrap_servers, group)


def _partitions_of(assignment: Any, topic: str) -> frozenset[int]:
    """The partitions of ``topic`` in a member's assignment as kafka-python describes it (the
    consumer protocol's assignment, decoded into a dict); nothing when the member has none
    (between rebalances) or it could not be decoded (left as bytes)."""
    if not isinstance(assignment, dict):
        return frozenset()
    return frozenset(
        p for a in assignment["assigned_partitions"] if a["topic"] == topic for p in a["partitions"]
    )


def kafka_watch(admin: GroupAdmin, own_address: str, own_boot: str) -> PeerWatch:
    """The watch over the scheduler group on a real cluster, through ``admin``
    (:func:`group_admin`), which it closes when it stops."""
    return PeerWatch(own_address, own_boot, admin.members, admin.remove, closing=admin.close)


def remove_process(admin: GroupAdmin, node_id: str, boot: str) -> list[Member]:
    """Remove the group members of one dead process of a node of several (``--workers``): those
    named ``node_id`` (the worker's own, :func:`cli.workers.worker_node_id`) of ``boot``. Its
    parent calls this when the process has exited and before it starts it again, so those
    members are the dead process's alone. The members removed."""
    dead = [m for m in admin.members() if m.node_id == node_id and m.boot == boot]
    if not dead:
        log.warning("worker %s's process exited; no member of it is in the group", node_id)
    else:
        admin.remove(dead)
        for member in dead:
            log.warning(
                "removed worker %s's group member %s (boot %s): its process exited",
                node_id,
                member.member_id,
                boot,
            )
    return dead


def advertised(host: str, port: int, advertise: str | None) -> str:
    """The address other nodes reach this one at: ``--advertise``, else ``host:port`` (the
    machine's name for a wildcard host)."""
    if advertise:
        return advertise
    if host in ("", "0.0.0.0", "::"):
        import socket

        host = socket.gethostname()
    return f"{host}:{port}"
