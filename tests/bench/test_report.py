"""bench/RESULTS.md names, for each of issue 8's goals, the profile that shows where its time
goes: those links point at headings that exist (bench.report)."""

from __future__ import annotations

import pytest

from bench import report


@pytest.mark.parametrize("goal", sorted(report.WHERE))
def test_every_goal_links_to_a_heading_that_is_there(goal: str) -> None:
    links = report.where(goal)
    assert links.count("](results/") == len(report.WHERE[goal])


def test_a_heading_that_is_not_there_is_an_error() -> None:
    with pytest.raises(ValueError, match="no heading"):
        report.anchor("perfherd.md", "A section nobody wrote")


@pytest.mark.parametrize(
    ("heading", "expected"),
    [
        ("Profiles: where the time goes", "profiles-where-the-time-goes"),
        (
            "The goals (issue 8): 1,000,000 jobs, ≤ 1 KB per job, `/readyz` ≤ 5 s",
            "the-goals-issue-8-1000000-jobs--1-kb-per-job-readyz--5-s",
        ),
        ("At the goal's size, 2026-12-01/02", "at-the-goals-size-2026-12-0102"),
    ],
)
def test_anchors_are_the_renderers(heading: str, expected: str) -> None:
    assert report.slug(heading) == expected
