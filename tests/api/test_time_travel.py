"""``GET /v1/operator/state``: time travel for the operator, answered as the replay tool does."""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from api.time_travel import PastStates
from core import events as ev
from eventlog.embedded import EmbeddedLog
from eventlog.port import partition_for
from eventlog.snapshots import FileSnapshots
from tests.api.conftest import TOKENS, serve
from tests.api.fakes import FakeScheduler
from tests.tools.test_replay import HOURLY, PARTITIONS, DataDir, make_data_dir, run
from tests.tools.test_replay_snapshots import leave_snapshot

pytestmark = pytest.mark.anyio
OPERATOR = "token-of-the-operator"
PATH = "/v1/operator/state"
Q = 1 - partition_for(HOURLY, PARTITIONS)  # one history, its instants in order


@pytest.fixture
def data_dir(tmp_path: Path) -> DataDir:
    data = make_data_dir(tmp_path / "data")
    leave_snapshot(data, Q, 30)
    leave_snapshot(data, Q, 90)
    return data


@pytest.fixture
def past(data_dir: DataDir, tmp_path: Path) -> Iterator[PastStates]:
    # A copy: the replay tool refuses a log a process holds open.
    served = tmp_path / "served"
    shutil.copytree(data_dir.path, served)
    with EmbeddedLog.open(served / "log", PARTITIONS) as log:
        snapshots = FileSnapshots(served / "snapshots")
        yield PastStates(log, snapshots)
        snapshots.close()


@pytest.fixture
async def client(fake: FakeScheduler, past: PastStates) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        serve(fake, operator_token=OPERATOR, past_states=past) as transport,
        httpx.AsyncClient(transport=transport, base_url="http://cronlog") as client,
    ):
        yield client


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_a_teams_token_is_refused_and_no_token_is_unauthorized(
    client: httpx.AsyncClient,
) -> None:
    for token in TOKENS:
        response = await client.get(PATH, params={"partition": "0"}, headers=bearer(token))
        assert response.status_code == 403, token
        assert "jobs" not in response.json()
    assert (await client.get(PATH, params={"partition": "0"})).status_code == 401
    wrong = await client.get(PATH, params={"partition": "0"}, headers=bearer("nonsense"))
    assert wrong.status_code == 401


async def test_the_operators_answer_is_the_replay_tools(
    client: httpx.AsyncClient, data_dir: DataDir, capsys: pytest.CaptureFixture[str]
) -> None:
    p = partition_for(HOURLY, PARTITIONS)
    for params, argv in (
        ({"partition": str(Q), "offset": "50"}, ["--partition", str(Q), "--offset", "50"]),
        ({"partition": str(Q), "offset": "120"}, ["--partition", str(Q), "--offset", "120"]),
        ({"partition": str(p), "tenant": "t1"}, ["--partition", str(p), "--tenant", "t1"]),
    ):
        response = await client.get(PATH, params=params, headers=bearer(OPERATOR))
        assert response.status_code == 200, response.text
        code, out, _ = run(capsys, data_dir.args("state", *argv))
        assert code == 0
        assert response.json() == json.loads(out)
    params = {"partition": str(Q), "offset": "50"}
    answer = (await client.get(PATH, params=params, headers=bearer(OPERATOR))).json()
    assert answer["from_snapshot"] == 30 and answer["events_folded"] == 20


async def test_an_instant_holds_the_events_decided_by_then(
    client: httpx.AsyncClient, data_dir: DataDir, capsys: pytest.CaptureFixture[str]
) -> None:
    events = [ev.decode(v) for v in data_dir.logs[Q]]
    instant = events[60].at
    response = await client.get(
        PATH,
        params={"partition": str(Q), "at": _rfc3339(instant)},
        headers=bearer(OPERATOR),
    )
    assert response.status_code == 200, response.text
    code, out, _ = run(capsys, data_dir.args("state", "--partition", str(Q), "--at", str(instant)))
    assert code == 0
    assert response.json() == json.loads(out)
    answer = response.json()
    # Both snapshots claim to be taken at 0; the one at 90 holds events after the instant.
    assert answer["from_snapshot"] == 30
    assert all(e.at <= instant for e in events[: answer["as_of"]["offset"]])
    assert events[answer["as_of"]["offset"]].at > instant


async def test_bad_input_is_a_400_naming_the_field(client: httpx.AsyncClient) -> None:
    for params, field in (
        ({}, "partition"),
        ({"partition": "x"}, "partition"),
        ({"partition": "-1"}, "partition"),
        ({"partition": str(PARTITIONS)}, "partition"),
        ({"partition": "0", "offset": "1.5"}, "offset"),
        ({"partition": "0", "at": "yesterday"}, "at"),
        ({"partition": "0", "offset": "3", "at": "2026-11-30T02:00:00Z"}, "at"),
        ({"job": "nightly"}, "tenant"),
        ({"job": "no spaces", "tenant": "t1"}, "job"),
        ({"partition": "0", "tenant": "no spaces"}, "tenant"),
    ):
        response = await client.get(PATH, params=params, headers=bearer(OPERATOR))
        assert response.status_code == 400, (params, response.text)
        assert response.json()["field"] == field, params


async def test_a_fold_longer_than_the_bound_is_refused_naming_the_point(
    fake: FakeScheduler, past: PastStates, data_dir: DataDir
) -> None:
    bounded = dataclasses.replace(past, max_events=100)
    # The partition's end is more than 100 events after its newest snapshot (at 90).
    end = len(data_dir.logs[Q])
    assert end > 190
    late = _rfc3339(ev.decode(data_dir.logs[Q][-1]).at)
    async with (
        serve(fake, operator_token=OPERATOR, past_states=bounded) as transport,
        httpx.AsyncClient(transport=transport, base_url="http://cronlog") as client,
    ):
        for params, field in (({"offset": str(end)}, "offset"), ({"at": late}, "at")):
            response = await client.get(
                PATH, params={"partition": str(Q), **params}, headers=bearer(OPERATOR)
            )
            assert response.status_code == 422, response.text
            assert response.json()["field"] == field
        near = {"partition": str(Q), "offset": "120"}  # 30 events after the snapshot at 90
        assert (await client.get(PATH, params=near, headers=bearer(OPERATOR))).status_code == 200


async def test_the_endpoint_is_in_the_openapi_document_with_its_token(
    client: httpx.AsyncClient,
) -> None:
    document = (await client.get("/openapi.json")).json()
    operation = document["paths"][PATH]["get"]
    assert operation["security"] == [{"bearer": []}]
    assert {p["name"] for p in operation["parameters"]} >= {"partition", "offset", "at"}


async def test_without_past_states_there_is_no_endpoint(fake: FakeScheduler) -> None:
    async with (
        serve(fake, operator_token=OPERATOR) as transport,
        httpx.AsyncClient(transport=transport, base_url="http://cronlog") as client,
    ):
        response = await client.get(PATH, params={"partition": "0"}, headers=bearer(OPERATOR))
        assert response.status_code == 404


def _rfc3339(ms: int) -> str:
    from api.instants import to_rfc3339

    return to_rfc3339(ms)


async def test_a_damaged_snapshot_is_passed_over_for_the_one_before_it(
    client: httpx.AsyncClient, past: PastStates, data_dir: DataDir
) -> None:
    assert isinstance(past.snapshots, FileSnapshots)
    newest = past.snapshots.latest(Q)
    assert newest is not None and newest.offset == 90
    path = next((data_dir.path.parent / "served" / "snapshots" / f"p{Q}").glob("*090.snap"))
    blob = bytearray(path.read_bytes())
    blob[-5] ^= 0x55
    path.write_bytes(bytes(blob))
    params = {"partition": str(Q), "offset": "120"}
    response = await client.get(PATH, params=params, headers=bearer(OPERATOR))
    assert response.status_code == 200, response.text
    assert response.json()["from_snapshot"] == 30
    assert response.json()["events_folded"] == 90
