"""Bearer tokens: which tenant a request speaks for.

Tokens come from ``CRONLOG_TOKENS`` (``"team-a=token-a,team-b=token-b"``) or a tokens file, one
``tenant=token`` per line with ``#`` comments. Both parse into one mapping, token -> tenant.
When neither is configured, the command line calls :func:`create_default_token` once: a random
token for the tenant ``default``, stored in a file only its owner can read.

Lookups compare every known token in constant time, so response timing says nothing about how
much of a guess was right.
"""

from __future__ import annotations

import hmac
import os
import secrets
from collections.abc import Iterable, Mapping
from pathlib import Path

from core.jobs import TENANT

DEFAULT_TENANT = "default"


class TokenError(ValueError):
    """A token configuration line cannot be read; the message names the line."""


def _parse_pairs(pairs: Iterable[tuple[str, str]]) -> dict[str, str]:
    tokens: dict[str, str] = {}
    for where, pair in pairs:
        tenant, sep, token = pair.partition("=")
        tenant, token = tenant.strip(), token.strip()
        if not sep or not tenant or not token:
            raise TokenError(f"{where}: expected tenant=token")
        if not TENANT.match(tenant):
            raise TokenError(f"{where}: {tenant!r} is not a tenant name (A-Z a-z 0-9 _ . -)")
        if token in tokens and tokens[token] != tenant:
            raise TokenError(f"{where}: one token is given to two tenants")
        tokens[token] = tenant
    return tokens


def parse_tokens(text: str) -> dict[str, str]:
    """``"team-a=token-a,team-b=token-b"`` (the ``CRONLOG_TOKENS`` form) -> token -> tenant."""
    items = [item for item in text.split(",") if item.strip()]
    return _parse_pairs((f"CRONLOG_TOKENS item {i}", item) for i, item in enumerate(items, 1))


def read_tokens_file(path: Path) -> dict[str, str]:
    """``tenant=token`` lines (blank lines and ``#`` comments ignored) -> token -> tenant."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return _parse_pairs(
        (f"{path}:{n}", line)
        for n, line in enumerate(lines, 1)
        if line.strip() and not line.lstrip().startswith("#")
    )


def new_token() -> str:
    """A fresh random token (256 bits, URL-safe) that never begins with ``-``.

    One ``token_urlsafe`` draw in 64 begins with ``-``; given after ``--token`` on a command line,
    argparse takes such a value for an option and refuses it. Drawing again costs nothing.
    """
    while True:
        token = secrets.token_urlsafe(32)
        if not token.startswith("-"):
            return token


def create_default_token(path: Path) -> str:
    """Create ``path`` (mode 0600, never overwriting) holding a new token for ``default``.

    Returns the token. Raises ``FileExistsError`` if ``path`` exists: a second call must not
    silently lock out clients configured with the first token.
    """
    token = new_token()
    header = "# cronlog API tokens: tenant=token, one a line\n"
    _create_private(path, f"{header}{DEFAULT_TENANT}={token}\n")
    return token


def create_token_file(path: Path) -> str:
    """Create ``path`` (mode 0600, never overwriting) holding one new bare token, as the
    metrics endpoint's token is kept. Raises ``FileExistsError`` if ``path`` exists."""
    token = new_token()
    _create_private(path, f"{token}\n")
    return token


def _create_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


class Tokens:
    """token -> tenant, looked up in constant time."""

    def __init__(self, tokens: Mapping[str, str]) -> None:
        self._entries = [(token.encode(), tenant) for token, tenant in tokens.items()]

    def tenant_of(self, authorization: str | None) -> str | None:
        """The tenant of an ``Authorization: Bearer <token>`` header value, or None."""
        if authorization is None:
            return None
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        offered = token.strip().encode()
        found: str | None = None
        for known, tenant in self._entries:  # no early exit: every token is compared
            if hmac.compare_digest(known, offered):
                found = tenant
        return found
