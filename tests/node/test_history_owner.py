"""History kept with its partition (``history_on="owner"``): each node folds only the partitions
it owns, and answers the rest by asking their owners through the log.

Two nodes are members of one embedded log's group (the log server, as ``cronlog serve
--workers 2`` runs them), so each owns half of the four partitions.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest

import node.node as node_module
from archive.store import DirectoryStore
from core.commands import CompleteRun, Outcome, PauseJob, PutJob, TriggerRun
from core.errors import HistoryRefilling, Unavailable
from core.jobs import JobSpec, PullTarget
from eventlog.embedded import EmbeddedLog
from eventlog.log_server import LogServer
from eventlog.port import partition_for
from eventlog.remote import RemoteLog
from node.node import Node
from node.owned_history import HistoryOn
from node.standby import standby_targets
from projections import history_checkpoint

PARTITIONS = 4
TENANT = "team-a"


@dataclass
class Pair:
    a: Node
    b: Node
    log: EmbeddedLog
    server: LogServer
    tmp: Path


def spec(name: str) -> JobSpec:
    return JobSpec(
        name=name,
        tenant=TENANT,
        target=PullTarget(pool="p"),  # type: ignore[arg-type]
        schedule="0 0 * * *",
    )


_clients: list[RemoteLog] = []


def _node(server: LogServer, tmp: Path, name: str, history_on: HistoryOn = "owner") -> Node:
    client = RemoteLog(server.path, name)
    _clients.append(client)
    node = Node(client, tmp / name, node_id=name, history_on=history_on)
    node.start()
    return node


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Pair]:
    log = EmbeddedLog.open(tmp_path / "log", PARTITIONS)
    server = LogServer(log, tmp_path / "log.sock")
    a = _node(server, tmp_path, "w0")
    b = _node(server, tmp_path, "w1")
    assert a.wait_owned(lambda owned: len(owned) == 2, 20)
    assert b.wait_owned(lambda owned: len(owned) == 2, 20)
    assert a.wait_ready(20) and b.wait_ready(20)
    pair = Pair(a, b, log, server, tmp_path)
    yield pair
    for node in (pair.a, pair.b):
        node.stop(drain_s=0)
    while _clients:
        _clients.pop().close()
    server.close()
    log.close()


def ids_over_every_partition(n: int) -> list[str]:
    return [f"{TENANT}/job-{i:03d}" for i in range(n)]


async def _eventually(check, timeout_s: float = 10.0):  # type: ignore[no-untyped-def]
    """``check()``'s answer once it stops saying the history is not ready (refilling, or its
    owner not answering yet)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        try:
            return await check()
        except (HistoryRefilling, Unavailable):
            if loop.time() > deadline:
                raise
            await asyncio.sleep(0.05)


def test_each_node_folds_only_its_own_partitions_and_answers_for_all(pair: Pair) -> None:
    ids = ids_over_every_partition(24)
    assert {partition_for(i, PARTITIONS) for i in ids} == set(range(PARTITIONS))

    async def scenario() -> None:
        for job_id in ids:  # created through node a: half forwarded to b
            await pair.a.execute(PutJob(job_id=job_id, spec=spec(job_id)))
        for node in (pair.a, pair.b):
            # every job, from either node, whichever keeps it
            for job_id in ids:
                view = await node.reader.job(TENANT, job_id)
                assert view is not None and view.name == job_id
            assert await node.reader.job_count(TENANT) == len(ids)
            # a listing merged from both nodes' models, paged: each job once, in order
            listed: list[str] = []
            cursor = None
            while True:
                page = await node.reader.jobs(TENANT, limit=5, cursor=cursor)
                listed += [view.job_id for view in page.items]
                if page.next_cursor is None:
                    break
                cursor = page.next_cursor
            assert listed == sorted(ids)

    asyncio.run(scenario())
    # and each model holds its own partitions' jobs only
    for node in (pair.a, pair.b):
        owned = node.owned()
        for p, position in node.history_positions().items():
            assert p in owned and position > 0
        assert set(node.history_positions()) == set(owned)


def test_a_team_s_listings_ask_the_other_node_once_for_all_its_partitions(pair: Pair) -> None:
    ids = ids_over_every_partition(24)
    asked = pair.a.metrics.history_questions

    async def scenario() -> None:
        for job_id in ids:
            await pair.a.execute(PutJob(job_id=job_id, spec=spec(job_id)))
        before = asked.labels("job_count", "asked")._value.get()
        assert await pair.a.reader.job_count(TENANT) == len(ids)
        # not known yet which node keeps b's partitions: each asked alone, answered by b
        first = asked.labels("job_count", "asked")._value.get() - before
        assert first == len(pair.b.owned()) == 2
        for _ in range(3):
            assert await pair.a.reader.job_count(TENANT) == len(ids)
            page = await pair.a.reader.jobs(TENANT, limit=100)
            assert [view.job_id for view in page.items] == sorted(ids)
        # then one question to b for both, each time
        assert asked.labels("job_count", "asked")._value.get() - before == first + 3
        assert asked.labels("jobs", "asked")._value.get() == 3

    asyncio.run(scenario())


def test_a_write_through_a_node_is_read_back_there_at_once(pair: Pair) -> None:
    elsewhere = next(
        i for i in ids_over_every_partition(40) if partition_for(i, PARTITIONS) in pair.b.owned()
    )

    async def scenario() -> None:
        await pair.a.execute(PutJob(job_id=elsewhere, spec=spec("x")))
        for _ in range(5):  # a pause through a, read back at once through a (kept by b)
            await pair.a.execute(PauseJob(job_id=elsewhere, tenant=TENANT))
            view = await pair.a.reader.job(TENANT, elsewhere)
            assert view is not None and view.status == "paused"
            await pair.a.execute(PutJob(job_id=elsewhere, spec=spec("x")))  # no change
            await pair.a.execute(
                PutJob(job_id=elsewhere, spec=spec("y"))
            )  # a new definition resumes nothing, but changes the name
            view = await pair.a.reader.job(TENANT, elsewhere)
            assert view is not None and view.name == "y"
            await pair.a.execute(PutJob(job_id=elsewhere, spec=spec("x")))

    asyncio.run(scenario())


def test_a_partition_that_moves_is_answered_by_its_new_owner(pair: Pair) -> None:
    ids = ids_over_every_partition(24)

    async def created() -> None:
        for job_id in ids:
            await pair.a.execute(PutJob(job_id=job_id, spec=spec(job_id)))

    asyncio.run(created())
    pair.b.stop(drain_s=0)  # its partitions move to a, which has never folded them
    assert pair.a.wait_owned(lambda owned: len(owned) == PARTITIONS, 20)

    async def after() -> None:
        assert await _eventually(lambda: pair.a.reader.job_count(TENANT)) == len(ids)
        page = await _eventually(lambda: pair.a.reader.jobs(TENANT, limit=100))
        assert [view.job_id for view in page.items] == sorted(ids)

    asyncio.run(after())
    assert set(pair.a.history_positions()) == set(range(PARTITIONS))
    assert all(position > 0 for position in pair.a.history_positions().values())


def test_a_waiting_claim_wakes_for_a_run_ready_on_a_partition_kept_elsewhere(pair: Pair) -> None:
    """Node a folds nothing of b's partitions, so no fold of its own can wake a claim waiting
    there for b's runs: its watch does (node.ready_watch), and the claim then gets the run."""
    job_id = next(
        i for i in ids_over_every_partition(40) if partition_for(i, PARTITIONS) in pair.b.owned()
    )

    async def scenario() -> None:
        await pair.a.execute(PutJob(job_id=job_id, spec=spec("pulled")))
        assert await pair.a.claim(TENANT, "p", "worker-1", 10) == []  # nothing ready yet
        with pair.a.wakeups.pool(TENANT, "p") as signal:
            seen = signal.version
            pair.a.watch_elsewhere(TENANT, "p", 10.0)
            await pair.a.execute(TriggerRun(job_id=job_id, tenant=TENANT))
            assert await pair.a.wakeups.sleep(signal, seen, 10.0)  # woken, not timed out
        leases = await pair.a.claim(TENANT, "p", "worker-1", 10)
        assert [lease.job_id for lease in leases] == [job_id]

    asyncio.run(scenario())


def test_a_listing_an_owner_does_not_answer_is_unavailable_never_partial(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = ids_over_every_partition(12)

    async def created() -> None:
        for job_id in ids:
            await pair.a.execute(PutJob(job_id=job_id, spec=spec(job_id)))
        newest = await pair.a.reader.latest_runs(TENANT, ids)  # one question a partition
        assert newest == [None] * len(ids)

    asyncio.run(created())
    monkeypatch.setattr(node_module, "QUERY_TIMEOUT_S", 0.5)
    monkeypatch.setattr(pair.b, "_answer", lambda *args: None)  # b stops answering

    async def asked() -> None:
        with pytest.raises(Unavailable):
            await pair.a.reader.jobs(TENANT, limit=100)
        with pytest.raises(Unavailable):
            await pair.a.reader.job_count(TENANT)
        # what a keeps itself still answers
        mine = next(i for i in ids if partition_for(i, PARTITIONS) in pair.a.owned())
        assert await pair.a.reader.job(TENANT, mine) is not None

    asyncio.run(asked())


def test_a_node_keeping_every_partition_refuses_to_answer_for_one(tmp_path: Path) -> None:
    """Its model's counts and figures are sums over every partition: answering a node that
    adds each owner's answer up would count them again. A mixed cluster says so (503)."""
    log = EmbeddedLog.open(tmp_path / "log", PARTITIONS)
    server = LogServer(log, tmp_path / "log.sock")
    every = _node(server, tmp_path, "w0", "every-node")
    owner = _node(server, tmp_path, "w1")
    try:
        assert every.wait_owned(lambda owned: len(owned) == 2, 20)
        assert owner.wait_owned(lambda owned: len(owned) == 2, 20)
        job_id = next(
            i for i in ids_over_every_partition(40) if partition_for(i, PARTITIONS) in every.owned()
        )

        async def scenario() -> None:
            await owner.execute(PutJob(job_id=job_id, spec=spec("x")))
            with pytest.raises(Unavailable, match="every node of a cluster"):
                await owner.reader.job_count(TENANT)
            assert await every.reader.job_count(TENANT) == 1

        asyncio.run(scenario())
    finally:
        for node in (every, owner):
            node.stop(drain_s=0)
        while _clients:
            _clients.pop().close()
        server.close()
        log.close()


def test_a_success_reaches_a_dependant_kept_by_the_other_node(pair: Pair) -> None:
    """The relay finds dependants in every partition's history: its own, and by asking the
    other node about the partitions it keeps (node.relay, one question a batch)."""
    ids = ids_over_every_partition(60)
    upstream = next(i for i in ids if partition_for(i, PARTITIONS) in pair.a.owned())
    dependant = next(i for i in ids if partition_for(i, PARTITIONS) in pair.b.owned())

    async def scenario() -> None:
        await pair.a.execute(PutJob(job_id=upstream, spec=spec("up")))
        after = msgspec.structs.replace(
            spec("down"), schedule=None, depends_on=(upstream,), target=PullTarget(pool="q")
        )
        await pair.a.execute(PutJob(job_id=dependant, spec=after))
        await pair.a.execute(TriggerRun(job_id=upstream, tenant=TENANT))
        [lease] = await pair.a.claim(TENANT, "p", "worker-1", 1)
        await pair.a.execute(
            CompleteRun(
                run_id=lease.run_id,
                fencing_token=lease.fencing_token,
                outcome=Outcome.SUCCEEDED,
                tenant=TENANT,
            )
        )
        with pair.a.wakeups.pool(TENANT, "q") as signal:  # the dependant's run, on b
            for _ in range(50):
                leases = await pair.a.claim(TENANT, "q", "worker-1", 1)
                if leases:
                    break
                seen = signal.version
                pair.a.watch_elsewhere(TENANT, "q", 10.0)
                await pair.a.wakeups.sleep(signal, seen, 10.0)
        assert [lease.job_id for lease in leases] == [dependant]

    asyncio.run(scenario())


def test_a_partition_taken_over_restores_its_own_checkpoint(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Each owner checkpoints its partitions' models, each under a prefix of its own; a node
    taking a partition over with no model of it restores that partition's newest checkpoint
    and folds only the tail after it."""
    store = DirectoryStore(tmp_path / "archive")
    log = EmbeddedLog.open(tmp_path / "log", PARTITIONS)
    server = LogServer(log, tmp_path / "log.sock")

    def node(name: str) -> Node:
        client = RemoteLog(server.path, name)
        _clients.append(client)
        made = Node(client, tmp_path / name, node_id=name, history_on="owner", history_store=store)
        made.start()
        return made

    a, b = node("w0"), node("w1")
    c: Node | None = None
    try:
        assert a.wait_owned(lambda owned: len(owned) == 2, 20)
        assert b.wait_owned(lambda owned: len(owned) == 2, 20)
        ids = ids_over_every_partition(24)

        async def created() -> None:
            for job_id in ids:
                await a.execute(PutJob(job_id=job_id, spec=spec(job_id)))
            await _eventually(lambda: b.reader.jobs(TENANT, limit=100))

        asyncio.run(created())
        for one in (a, b):  # every partition's owner checkpoints it
            assert one._owned_history is not None
            taken = [c.tick() for c in one._owned_history.checkpointers()]
            assert len(taken) == 2 and all(t is not None for t in taken)
        for p in range(PARTITIONS):  # each partition's own, under its prefix
            assert history_checkpoint.newest(history_checkpoint.partition_store(store, p))
        b.stop(drain_s=0)
        with caplog.at_level(logging.INFO, logger="node.owned_history"):
            c = node("w2")  # a new node, with no model of any partition
            assert c.wait_owned(lambda owned: len(owned) == 2, 20)

            async def after() -> None:
                page = await _eventually(lambda: c.reader.jobs(TENANT, limit=100))
                assert [view.job_id for view in page.items] == sorted(ids)

            asyncio.run(after())
        restored = [r.getMessage() for r in caplog.records if "restored from" in r.getMessage()]
        assert sorted(int(m.split()[1].rstrip(":")) for m in restored) == c.owned()
    finally:
        for one in (a, b, c):
            if one is not None:
                one.stop(drain_s=0)
        while _clients:
            _clients.pop().close()
        server.close()
        log.close()


def test_a_standby_of_a_partition_s_history_takes_it_over_warm(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With --standby-replicas a node follows the history of the partitions it stands by for
    (folded, answering nothing); one assigned to it answers with nothing to open or restore."""
    log = EmbeddedLog.open(tmp_path / "log", PARTITIONS)
    server = LogServer(log, tmp_path / "log.sock")

    def node(name: str) -> Node:
        client = RemoteLog(server.path, name)
        _clients.append(client)
        made = Node(client, tmp_path / name, node_id=name, history_on="owner", standby_replicas=1)
        made.start()
        return made

    a, b = node("w0"), node("w1")
    try:
        assert a.wait_owned(lambda owned: len(owned) == 2, 20)
        assert b.wait_owned(lambda owned: len(owned) == 2, 20)
        ids = ids_over_every_partition(24)

        async def created() -> None:
            for job_id in ids:
                await a.execute(PutJob(job_id=job_id, spec=spec(job_id)))

        asyncio.run(created())
        assert a._owned_history is not None
        assert a._owned_history.wait_opened(10)
        followed = a._owned_history.standbys()
        assert followed == standby_targets(frozenset(a.owned()), PARTITIONS, 1)
        assert not set(followed) & set(a.owned())
        for p in followed:  # folded there, though a answers nothing for it
            model = a._owned_history.model(p)
            assert model is None  # not kept: questions about it go to its owner
        with caplog.at_level(logging.INFO, logger="node.owned_history"):
            b.stop(drain_s=0)
            assert a.wait_owned(lambda owned: len(owned) == PARTITIONS, 20)

            async def after() -> None:
                page = await _eventually(lambda: a.reader.jobs(TENANT, limit=100))
                assert [view.job_id for view in page.items] == sorted(ids)

            asyncio.run(after())
        warm = [r.getMessage() for r in caplog.records if "warm standby" in r.getMessage()]
        assert sorted(int(m.split()[1].rstrip(":")) for m in warm) == followed
    finally:
        for one in (a, b):
            one.stop(drain_s=0)
        while _clients:
            _clients.pop().close()
        server.close()
        log.close()


def test_what_the_node_says_of_its_window_and_archive_holds_with_no_partition_kept(
    tmp_path: Path,
) -> None:
    """A node keeping no partition's history yet (just started, or all elsewhere) still knows
    its hot window and whether it archives: a run past the window is 'left for the archive',
    not 'gone'."""
    from archive.archive import Archive
    from eventlog.memory import MemoryLog

    log = MemoryLog(PARTITIONS)
    archive = Archive(DirectoryStore(tmp_path / "archive"))
    node = Node(log, tmp_path / "n", history_on="owner", archive=archive)
    try:  # before it starts: no partition is kept here
        assert node.reader.archived
        assert node.reader.past_window(f"{TENANT}/job.1000")  # the slot of 1970
        assert not node.reader.past_window(f"{TENANT}/job.{2**62}")
    finally:
        node.start()  # started and stopped, so its threads and loops close
        node.stop(drain_s=0)
        log.close()


def test_a_model_that_cannot_be_opened_is_opened_again_never_left_unkept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partition whose history failed to open would otherwise be owned here and kept
    nowhere: every question about it refused for good, and nobody told."""
    from eventlog.memory import MemoryLog
    from node import owned_history

    monkeypatch.setattr(owned_history, "OPEN_RETRY_S", 0.05)
    opened = owned_history.OwnedHistory._opened
    failed: list[int] = []

    def flaky(self: owned_history.OwnedHistory, partition: int) -> object:
        if partition == 0 and not failed:
            failed.append(partition)
            raise OSError("the disk said no, once")
        return opened(self, partition)

    monkeypatch.setattr(owned_history.OwnedHistory, "_opened", flaky)
    log = MemoryLog(PARTITIONS)
    node = Node(log, tmp_path / "n", history_on="owner")
    node.start()
    try:
        assert node.wait_owned(lambda owned: len(owned) == PARTITIONS, 10)
        assert node._owned_history is not None and node._owned_history.wait_opened(10)
        assert failed == [0] and node._owned_history.partitions() == list(range(PARTITIONS))
        failures = node.metrics.thread_failures.labels("read-model")._value.get()
        assert failures >= 1  # said, and counted
    finally:
        node.stop(drain_s=0)
        log.close()


def test_a_question_goes_past_the_runner_and_an_old_one_is_passed_over(pair: Pair) -> None:
    """Questions never reach the partition's runner (moving its command position past one
    would cost an append each), and one read again long after it was asked is not answered."""
    from node import wire

    p = pair.b.owned()[0]
    stale = node_module.STALE_QUERY_MS
    runner = pair.b._runners[p]
    submitted: list[object] = []
    runner_submit = runner.submit
    runner.submit = lambda request: (submitted.append(request), runner_submit(request))[1]  # type: ignore[method-assign]
    old = wire.Query(name="job_count", args=[TENANT], asked_at=pair.b._clock.now_ms() - stale - 1)
    for query in (old, wire.Query(name="job_count", args=[TENANT])):
        envelope = wire.Envelope(query=query, request_id="r", reply_to="nobody")
        pair.log.submit(p, wire.encode(envelope))
    counted = pair.b.metrics.history_questions
    deadline = time.monotonic() + 10
    while counted.labels("job_count", "answered")._value.get() < 1:  # read by b's poll
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert counted.labels("job_count", "stale")._value.get() == 1
    assert submitted == []
