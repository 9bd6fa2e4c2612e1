"""The limits file: defaults, per-tenant overrides, and refusals that name what is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from api.limits import Limits, LimitsError, TenantLimits, parse_limits, read_limits
from cli.main import main


def test_without_a_file_every_tenant_gets_the_built_in_defaults() -> None:
    limits = Limits()
    assert limits.of("anyone") == TenantLimits()
    assert TenantLimits().max_jobs == 10_000
    assert TenantLimits().requests_per_sec == 100.0


def test_an_override_takes_what_it_leaves_out_from_the_files_defaults() -> None:
    limits = parse_limits(
        """
        [defaults]
        max_jobs = 500
        requests_per_sec = 5

        [tenants.team-a]
        max_jobs = 50000
        """
    )
    assert limits.of("team-b") == TenantLimits(max_jobs=500, requests_per_sec=5)
    assert limits.of("team-a") == TenantLimits(max_jobs=50_000, requests_per_sec=5)
    assert limits.of("team-a").max_depends_on == TenantLimits().max_depends_on


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[defaults]\nmax_jbs = 3\n", "[defaults]: Object contains unknown field `max_jbs`"),
        ("[defaults]\nmax_jobs = 0\n", "[defaults]: Expected `int` >= 1 - at `max_jobs`"),
        ("[tenants.a]\nmax_depends_on = 5000\n", "[tenants.a]: Expected `int` <= 1000"),
        ("[tenants.a]\nrequests_per_sec = 'fast'\n", "[tenants.a]: Expected `float`"),
        ("[tenants.'a b']\nmax_jobs = 3\n", "[tenants.a b]: not a tenant name"),
        ("[limits]\nmax_jobs = 3\n", "unknown section [limits]"),
        ("tenants = 3\n", "tenants must be tables"),
        ("[defaults\n", "not TOML"),
    ],
)
def test_a_file_that_cannot_be_used_is_refused_naming_where(text: str, says: str) -> None:
    with pytest.raises(LimitsError) as e:
        parse_limits(text, "limits.toml")
    assert str(e.value).startswith("limits.toml")
    assert says in str(e.value)


def test_read_limits_names_a_file_it_cannot_read(tmp_path: Path) -> None:
    with pytest.raises(LimitsError, match="cannot be read"):
        read_limits(tmp_path / "absent.toml")


def test_serve_stops_with_one_line_on_a_bad_limits_file(tmp_path: Path) -> None:
    bad = tmp_path / "limits.toml"
    bad.write_text("[defaults]\nmax_jobs = -1\n")
    with pytest.raises(SystemExit) as e:
        main(["serve", "--data-dir", str(tmp_path / "data"), "--limits", str(bad)])
    assert str(e.value).startswith(f"cronlog: {bad} [defaults]: Expected `int` >= 1")
