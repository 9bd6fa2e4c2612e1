"""Token configuration: the environment form, the file form, and the generated default."""

from __future__ import annotations

import argparse
import stat
from pathlib import Path

import pytest

from api.auth import (
    DEFAULT_TENANT,
    TokenError,
    Tokens,
    create_default_token,
    create_token_file,
    new_token,
    parse_tokens,
    read_tokens_file,
)


def test_parse_the_environment_form() -> None:
    assert parse_tokens("team-a=token-a, team-b=token-b,") == {
        "token-a": "team-a",
        "token-b": "team-b",
    }
    assert parse_tokens("") == {}


@pytest.mark.parametrize("text", ["team-a", "=tok", "team-a=", "bad tenant=tok", "a=t,b=t"])
def test_refuses_unreadable_items(text: str) -> None:
    with pytest.raises(TokenError):
        parse_tokens(text)


def test_read_a_tokens_file(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text("# who may call\n\nteam-a = secret-a\n  # indented comment\nteam-b=secret-b\n")
    assert read_tokens_file(path) == {"secret-a": "team-a", "secret-b": "team-b"}
    path.write_text("team-a=secret-a\nnonsense\n")
    with pytest.raises(TokenError, match=":2:"):
        read_tokens_file(path)


def test_create_the_default_token_readable_only_by_its_owner(tmp_path: Path) -> None:
    path = tmp_path / "conf" / "tokens"
    token = create_default_token(path)
    assert len(token) >= 40
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_tokens_file(path) == {token: DEFAULT_TENANT}
    with pytest.raises(FileExistsError):
        create_default_token(path)
    assert read_tokens_file(path) == {token: DEFAULT_TENANT}


def test_a_bare_token_file_is_private_and_never_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "metrics_token"
    token = create_token_file(path)
    assert len(token) >= 40 and path.read_text() == f"{token}\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with pytest.raises(FileExistsError):
        create_token_file(path)
    assert path.read_text() == f"{token}\n"


def test_tenant_of_a_bearer_header() -> None:
    tokens = Tokens({"token-a": "team-a", "token-b": "team-b"})
    assert tokens.tenant_of("Bearer token-b") == "team-b"
    assert tokens.tenant_of("bearer token-a") == "team-a"
    for header in (None, "", "Bearer", "Bearer ", "Bearer token-c", "Basic token-a", "token-a"):
        assert tokens.tenant_of(header) is None


def test_a_new_token_can_follow_an_option_on_a_command_line() -> None:
    # one draw of token_urlsafe in 64 begins with "-", which argparse reads as an option
    parser = argparse.ArgumentParser()
    parser.add_argument("--token")
    parser.add_argument("pool")
    for _ in range(2_000):
        token = new_token()
        assert len(token) >= 40
        assert parser.parse_args(["--token", token, "p"]).token == token
        assert parser.parse_args([token, "--token", token]).pool == token
