"""Tags and the crontab day rule, through the SDK against a real ``cronlog serve``."""

from __future__ import annotations

import datetime as dt

import httpx
import pytest
from cronlog_client import Client, InvalidRequest, JobPatch, NewJob, Refused

from tests.cli.test_serve import Serve
from tests.sdk.conftest import unique

pytestmark = pytest.mark.slow
UTC = dt.UTC


def test_jobs_are_found_by_tag_and_by_tag_only_in_their_team(a: Client, b: Client) -> None:
    pay, ops = unique("team=payments"), unique("env:prod")
    first = a.create_job(NewJob(name="t1", schedule="0 9 * * *", target="pull://t", tags=[pay]))
    second = a.create_job(
        NewJob(name="t2", schedule="0 9 * * *", target="pull://t", tags=[pay, ops])
    )
    a.create_job(NewJob(name="t3", schedule="0 9 * * *", target="pull://t"))
    b.create_job(NewJob(name="theirs", schedule="0 9 * * *", target="pull://t", tags=[pay]))
    assert first.tags == [pay] and second.tags == [pay, ops]

    assert {j.job_id for j in a.iter_jobs(tag=pay)} == {first.job_id, second.job_id}
    assert [j.job_id for j in a.iter_jobs(tag=ops)] == [second.job_id]
    # Paging by tag goes on after the last one shown, with nothing twice.
    one = a.list_jobs(tag=pay, limit=1)
    assert len(one.jobs) == 1 and one.next_cursor is not None
    rest = a.list_jobs(tag=pay, limit=10, cursor=one.next_cursor)
    assert {j.job_id for j in one.jobs + rest.jobs} == {first.job_id, second.job_id}
    # With a status as well.
    a.pause_job(first.job_id)
    assert [j.job_id for j in a.iter_jobs("paused", tag=pay)] == [first.job_id]
    assert [j.job_id for j in a.iter_jobs("active", tag=pay)] == [second.job_id]

    # A change replaces the list: the job leaves the old tag's listing.
    a.patch_job(second.job_id, JobPatch(tags=[ops]))
    assert [j.job_id for j in a.iter_jobs(tag=pay)] == [first.job_id]
    assert a.get_job(second.job_id).tags == [ops]
    a.patch_job(second.job_id, JobPatch(tags=[]))
    assert list(a.iter_jobs(tag=ops)) == []


@pytest.mark.parametrize(
    "tags",
    [
        ["has space"],
        ["a/b"],  # would reach into another tag's index
        [""],
        ["x" * 65],
        [f"t{i}" for i in range(17)],
        ["dup", "dup"],
    ],
)
def test_bad_tags_are_refused_naming_the_field(a: Client, tags: list[str]) -> None:
    before = len(list(a.iter_jobs()))
    with pytest.raises((InvalidRequest, Refused)) as refused:
        a.create_job(NewJob(name="bad", schedule="0 9 * * *", target="pull://t", tags=tags))
    assert refused.value.status in (400, 422)
    assert refused.value.field is not None and refused.value.field.startswith("tags")
    assert len(list(a.iter_jobs())) == before


def test_a_bad_tag_filter_is_a_400_naming_tag(node: Serve) -> None:
    answer = httpx.get(
        f"{node.url}/v1/jobs", params={"tag": "a/b"}, headers={"Authorization": "Bearer token-a"}
    )
    assert answer.status_code == 400
    assert answer.json()["field"] == "tag"


def test_a_stepped_star_day_field_is_read_as_crontab_reads_it(a: Client) -> None:
    after = dt.datetime(2026, 11, 30, tzinfo=UTC)
    # 3 December 2026 is a Thursday, an even weekday: crontab fires on it and on no other day.
    fires = a.preview_schedule("30 1 3 12 */2", n=3, after=after)
    assert [f.at.date() for f in fires.fires] == [
        dt.date(2026, 12, 3),
        dt.date(2028, 12, 3),  # the next 3 December on a Sun, Tue, Thu or Sat (a Sunday)
        dt.date(2030, 12, 3),
    ]
    job = a.create_job(NewJob(name="crontab", schedule="30 1 3 12 */2", target="pull://t"))
    assert job.day_rule == "crontab"
    assert job.next_run_at is not None and job.next_run_at.day == 3
    assert [f.at.day for f in a.preview_job(job.job_id, 3).fires] == [3, 3, 3]
    # Where the two rules agree nothing is recorded: the job reads as before.
    plain = a.create_job(NewJob(name="plain", schedule="0 0 13 * fri", target="pull://t"))
    assert plain.day_rule == "either"
