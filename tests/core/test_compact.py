"""A job's state is held compactly without changing what it is: its definition encoded
(``core.state.hold_spec``) and decoded when read, equal values, the same decisions; the state
of an earlier build (its definition a map in place) read as the same state."""

from __future__ import annotations

import math

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core import state as core_state
from core.commands import PutJob
from core.cron import DayRule
from core.jobs import (
    Backoff,
    HttpTarget,
    JobSpec,
    KafkaTarget,
    PullTarget,
    SecretRef,
    canonical,
    payload_of,
)
from core.partition import Partition
from core.state import (
    JobState,
    JobStateV1,
    PartitionState,
    compact_job,
    compact_spec,
    hold_spec,
    upgrade_job,
)
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


def in_place(spec: JobSpec) -> JobSpec:
    """The definition as builds before the held form kept it: every field, the payload
    encoded."""
    spec = canonical(spec)
    if isinstance(spec.payload, (dict, list)):
        spec = msgspec.structs.replace(
            spec, payload=msgspec.Raw(msgspec.msgpack.encode(spec.payload))
        )
    return spec


def test_a_job_holds_its_definition_encoded_and_gives_it_back_when_read() -> None:
    sim = Sim(T0)
    sim.do(PutJob(job_id="j0", spec=spec(0)))
    job = sim.state.jobs["j0"]
    assert type(job.encoded_spec) is bytes
    # The defaults are left out: a third of the definition's full encoding.
    assert len(job.encoded_spec) * 3 < len(msgspec.msgpack.encode(in_place(spec(0)))) + 100
    assert job.spec == in_place(spec(0))
    assert isinstance(job.spec.payload, msgspec.Raw)  # nothing in the partition reads inside it
    assert payload_of(job.spec) == {"n": 0, "kind": "daily", "tags": ["a", "b"]}
    assert sim.state.jobs["j0"].upstream is not None


texts = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
floats = st.floats(allow_nan=False, allow_infinity=False)
documents = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | floats | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)
targets = st.one_of(
    st.builds(
        HttpTarget,
        url=st.sampled_from(["http://127.0.0.1:9/", "https://example.com/a"]),
        headers=st.dictionaries(
            st.sampled_from(["A", "B", "x-c"]),
            st.one_of(texts, st.builds(SecretRef, from_file=st.just("key"))),
            max_size=2,
        ),
        max_calls_per_sec=st.none() | st.sampled_from([0.5, 10.0, 100_000.0]),
    ),
    st.builds(KafkaTarget, topic=st.just("t")),
    st.builds(PullTarget, pool=st.just("p")),
)
all_specs = st.builds(
    JobSpec,
    name=texts,
    tenant=st.sampled_from(["t1", "team-b"]),
    target=targets,
    schedule=st.none() | st.just("*/5 * * * *"),
    run_at=st.none() | st.integers(0, 2**40),
    interval_sec=st.none() | floats,
    start_at=st.none() | st.integers(0, 2**40),
    timezone=st.sampled_from(["UTC", "Europe/Paris"]),
    payload=documents,
    max_attempts=st.integers(1, 100),
    backoff=st.builds(
        Backoff, base_sec=floats, factor=floats, cap_sec=floats, jitter=st.booleans()
    ),
    timeout_sec=floats,
    lease_sec=floats,
    priority=st.integers(0, 9),
    misfire_policy=st.sampled_from(["skip", "fire_once", "catch_up"]),
    misfire_grace_sec=st.sampled_from([0.0, -0.0, 60.0, 61.5]),
    catch_up_limit=st.integers(1, 1000),
    overlap_policy=st.sampled_from(["allow", "skip", "buffer_one", "cancel_other"]),
    allow_jitter_sec=st.sampled_from([0.0, -0.0, 30.0]),
    critical=st.booleans(),
    depends_on=st.lists(st.sampled_from(["a", "t1/b"]), max_size=2, unique=True).map(tuple),
    end_at=st.none() | st.integers(0, 2**40),
    day_rule=st.sampled_from(list(DayRule)),
    tags=st.lists(st.sampled_from(["x", "env:prod"]), max_size=2, unique=True).map(tuple),
)


@settings(max_examples=300)
@given(all_specs)
def test_the_held_definition_is_the_definition_field_for_field(given_spec: JobSpec) -> None:
    """Held and read back, a definition encodes exactly as the whole definition does (so no
    value is lost, nor a -0.0 turned into a 0.0, nor a float into an int)."""
    whole = in_place(given_spec)
    again = compact_spec(given_spec)
    assert again == whole
    assert msgspec.msgpack.encode(again) == msgspec.msgpack.encode(whole)
    assert compact_spec(again) == again  # holding what was read back holds the same
    assert hold_spec(again) == hold_spec(whole)


def test_an_upsert_of_the_same_definition_still_decides_nothing() -> None:
    sim = Sim(T0)
    sim.do(PutJob(job_id="j0", spec=spec(0)))
    assert sim.do(PutJob(job_id="j0", spec=spec(0))) == []
    # The same definition given with ints for floats and lists for tuples is the same.
    same = msgspec.structs.replace(
        spec(0),
        lease_sec=30,
        tags=["a"],
        backoff=Backoff(base_sec=5, cap_sec=3600),  # type: ignore[arg-type]
    )
    sim.do(PutJob(job_id="j1", spec=msgspec.structs.replace(spec(0), tags=("a",))))
    assert sim.do(PutJob(job_id="j1", spec=same)) == []
    [updated] = sim.do(PutJob(job_id="j0", spec=spec(1)))  # another payload is a change
    assert payload_of(sim.state.jobs["j0"].spec) == {"n": 1, "kind": "daily", "tags": ["a", "b"]}
    assert updated.version == 2  # type: ignore[union-attr]
    [updated] = sim.do(PutJob(job_id="j0", spec=spec(1, allow_jitter_sec=5.0)))
    assert sim.state.jobs["j0"].spec.allow_jitter_sec == 5.0


def test_values_that_compare_equal_but_encode_apart_are_kept_apart() -> None:
    sim = Sim(T0)
    sim.do(PutJob(job_id="j0", spec=spec(0, allow_jitter_sec=0.0)))
    sim.do(PutJob(job_id="j1", spec=spec(1, allow_jitter_sec=-0.0)))
    assert math.copysign(1.0, sim.state.jobs["j1"].spec.allow_jitter_sec) == -1.0
    assert math.copysign(1.0, sim.state.jobs["j0"].spec.allow_jitter_sec) == 1.0


def test_jobs_loaded_share_their_equal_instants_and_encode_as_they_were() -> None:
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
    assert a.upstream is b.upstream and a.trigger_keys is b.upstream  # the one shared empty map
    assert [msgspec.msgpack.encode(j) for j in loaded] == [
        msgspec.msgpack.encode(j) for j in sim.state.jobs.values()
    ]
    assert PartitionState.restore(sim.state.snapshot()).snapshot() == sim.state.snapshot()


def _as_v1(job: JobState) -> JobStateV1:
    fields = msgspec.structs.asdict(job)
    fields["spec"] = fields.pop("encoded_spec") and job.spec
    return JobStateV1(**fields)


def test_a_job_of_the_earlier_format_reads_as_the_same_job() -> None:
    sim = Sim(T0)
    sim.do(PutJob(job_id="j0", spec=spec(0, allow_jitter_sec=-0.0)))
    job = sim.state.jobs["j0"]
    stored = msgspec.msgpack.encode(_as_v1(job))
    with pytest.raises(msgspec.ValidationError):  # not the format this build writes
        msgspec.msgpack.decode(stored, type=JobState)
    again = upgrade_job(msgspec.msgpack.decode(stored, type=JobStateV1))
    assert again == job
    assert msgspec.msgpack.encode(again) == msgspec.msgpack.encode(job)


def test_a_partition_snapshot_of_format_1_restores_the_same_partition() -> None:
    sim = Sim(T0)
    for n in range(3):
        sim.do(PutJob(job_id=f"j{n}", spec=spec(n)))
    state = sim.state
    old = msgspec.msgpack.encode(
        core_state._SnapshotV1(
            state.partition,
            state.last_token,
            [_as_v1(j) for j in state.jobs.values()],
            list(state.runs.values()),
        )
    )
    restored = Partition.restore(bytes([1]) + old, sim.now)
    assert restored.snapshot() == sim.partition.snapshot()
    assert restored.snapshot()[0] == 2
    new = Partition.restore(sim.partition.snapshot(), sim.now)
    assert restored.parked() == new.parked() and len(new.parked()) == 3


def test_the_decoded_definitions_kept_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(core_state, "SPECS_KEPT", 4)
    monkeypatch.setattr(core_state, "_young", {})
    monkeypatch.setattr(core_state, "_old", {})
    sim = Sim(T0)
    for n in range(20):
        sim.do(PutJob(job_id=f"j{n}", spec=spec(n)))
    for job in sim.state.jobs.values():
        assert payload_of(job.spec)["n"] == int(job.job_id[1:])
    assert len(core_state._young) + len(core_state._old) <= 8
    # Read again soon, a definition is the one decoded before.
    job = sim.state.jobs["j19"]
    assert job.spec is job.spec


def test_a_recovery_decodes_no_definition(monkeypatch: pytest.MonkeyPatch) -> None:
    """Restored and armed, a partition reads its jobs' ids, statuses and next slots only: no
    definition is decoded until one is read."""
    sim = Sim(T0)
    for n in range(5):
        sim.do(PutJob(job_id=f"j{n}", spec=spec(n)))
    sim.do(PutJob(job_id="soon", spec=msgspec.structs.replace(spec(9), schedule="*/5 * * * *")))
    decoded: list[bytes] = []
    real = core_state._decode_held

    def counted(data: bytes) -> JobSpec:
        decoded.append(data)
        return real(data)

    monkeypatch.setattr(core_state, "_decode_held", counted)
    monkeypatch.setattr(core_state, "_young", {})
    monkeypatch.setattr(core_state, "_old", {})
    restored = Partition.restore(sim.partition.snapshot(), sim.now)
    assert len(restored.parked()) == 5 and restored.next_deadline() is not None
    assert decoded == []
    assert restored.state.jobs["j3"].spec.name == "export 3"  # decoded when read
    assert decoded == [restored.state.jobs["j3"].encoded_spec]
