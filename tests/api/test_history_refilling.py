"""While the read model refills (restored from a checkpoint, set aside, or folding from the
first event), history answers 503 with Retry-After for the partitions it is behind on, never a
404 for a job that exists nor an empty page of its runs (the finding: both, after a restart)."""

from __future__ import annotations

import pytest

from core.ids import log_job_id
from eventlog.port import partition_for
from tests.api.conftest import Api
from tests.api.fakes import PARTITIONS

pytestmark = pytest.mark.anyio

MINUTELY = {"schedule": "* * * * *", "target": "pull://rollups"}


def partition_of(name: str) -> int:
    return partition_for(log_job_id("team-a", name), PARTITIONS)


async def test_history_of_a_refilling_partition_answers_503_then_the_right_answer(
    api: Api,
) -> None:
    assert (await api.a.put("/v1/jobs/rollup", json=MINUTELY | {"name": "rollup"})).is_success
    api.fake.advance(3 * 60_000)
    behind = partition_of("rollup")
    other = next(f"job-{i}" for i in range(100) if partition_of(f"job-{i}") != behind)
    assert (await api.a.put(f"/v1/jobs/{other}", json=MINUTELY | {"name": other})).is_success
    api.fake.advance(60_000)
    history = api.fake.history
    # As a node starting with a model restored from a checkpoint: the log held one more event
    # of that partition than the model has folded.
    history.hold_until({behind: history.position(behind) + 1})

    for path in ("/v1/jobs/rollup", "/v1/jobs/rollup/runs", "/v1/jobs", "/v1/runs", "/v1/team"):
        answer = await api.a.get(path)
        assert answer.status_code == 503, (path, answer.text)
        assert answer.headers["Retry-After"]
        assert "history is refilling" in answer.json()["message"], path
        assert f"partition {behind}: " in answer.json()["message"]
    listed = await api.a.get(f"/v1/jobs/{other}/runs")
    assert listed.status_code == 200, listed.text
    run_id = listed.json()["runs"][0]["run_id"]
    assert (await api.a.get(f"/v1/runs/{run_id}")).status_code == 200  # its partition is whole
    assert (await api.a.get(f"/v1/jobs/{other}")).status_code == 200
    # Once it has folded that far, it answers again.
    api.fake.advance(60_000)
    assert history.refilling() == {}
    runs = (await api.a.get("/v1/jobs/rollup/runs")).json()["runs"]
    assert len(runs) == 5
    assert (await api.a.get("/v1/jobs")).status_code == 200
