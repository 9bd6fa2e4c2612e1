"""A job's state is held compactly (``core.state.compact_spec``/``compact_job``) without changing
what it is: equal values, equal encodings, the same decisions."""

from __future__ import annotations

import msgspec

from core.commands import PutJob
from core.jobs import Backoff, HttpTarget, JobSpec, payload_of
from core.state import JobState, PartitionState, compact_job
from tests.core.harness import Sim
from tests.core.test_determinism import T0


def spec(n: int, **fields: object) -> JobSpec:
    return JobSpec(
        name=f"export {n}",
        tenant="team-a",
        target=HttpTarget(url="http://127.0.0.1:9/hook"),
        schedule="0 3 * * *",
        timezone="Europe/Paris",
        payload={"n": n, "kind": "daily", "tags": ["a", "b"]},
        backoff=Backoff(base_sec=5.0),
        **fields,  # type: ignore[arg-type]
    )


def test_jobs_share_their_repeated_values_and_hold_payloads_encoded() -> None:
    sim = Sim(T0)
    for n in range(3):
        sim.do(PutJob(job_id=f"j{n}", spec=spec(n)))
    a, b = sim.state.jobs["j0"].spec, sim.state.jobs["j1"].spec
    assert a.tenant is b.tenant and a.timezone is b.timezone and a.schedule is b.schedule
    assert a.target is b.target and a.backoff is b.backoff and a.lease_sec is b.lease_sec
    assert sim.state.jobs["j0"].upstream is sim.state.jobs["j1"].upstream
    assert isinstance(a.payload, msgspec.Raw)
    assert payload_of(a) == {"n": 0, "kind": "daily", "tags": ["a", "b"]}


def test_the_compact_form_encodes_as_the_definition_does() -> None:
    sim = Sim(T0)
    sim.do(PutJob(job_id="j0", spec=spec(0)))
    job = sim.state.jobs["j0"]
    plain = msgspec.msgpack.encode(msgspec.structs.replace(job, spec=spec(0), upstream={}))
    assert msgspec.msgpack.encode(job) == plain
    # Decoded (a store's load, a snapshot's restore), it is compacted the same way.
    again = compact_job(msgspec.msgpack.decode(plain, type=JobState))
    assert again == job and again.spec.tenant is job.spec.tenant
    assert PartitionState.restore(sim.state.snapshot()).snapshot() == sim.state.snapshot()


def test_an_upsert_of_the_same_definition_still_decides_nothing() -> None:
    sim = Sim(T0)
    sim.do(PutJob(job_id="j0", spec=spec(0)))
    assert sim.do(PutJob(job_id="j0", spec=spec(0))) == []
    [updated] = sim.do(PutJob(job_id="j0", spec=spec(1)))  # another payload is a change
    assert payload_of(sim.state.jobs["j0"].spec) == {"n": 1, "kind": "daily", "tags": ["a", "b"]}
    assert updated.version == 2  # type: ignore[union-attr]


def test_values_that_compare_equal_but_encode_apart_are_not_shared() -> None:
    sim = Sim(T0)
    sim.do(PutJob(job_id="j0", spec=spec(0, allow_jitter_sec=0.0)))
    sim.do(PutJob(job_id="j1", spec=spec(1, allow_jitter_sec=-0.0)))
    assert msgspec.msgpack.encode(sim.state.jobs["j1"].spec.allow_jitter_sec) == (
        msgspec.msgpack.encode(-0.0)
    )


def test_jobs_loaded_share_their_equal_instants() -> None:
    sim = Sim(T0)
    for n in range(2):
        sim.do(PutJob(job_id=f"j{n}", spec=spec(n)))
    loaded = [
        compact_job(msgspec.msgpack.decode(msgspec.msgpack.encode(job), type=JobState))
        for job in sim.state.jobs.values()
    ]
    a, b = loaded
    assert a.registered_at == b.registered_at and a.registered_at is b.registered_at
    assert a.next_slot is not None and a.next_slot is b.next_slot and a.anchor is a.next_slot
    assert [msgspec.msgpack.encode(j) for j in loaded] == [
        msgspec.msgpack.encode(j) for j in sim.state.jobs.values()
    ]
