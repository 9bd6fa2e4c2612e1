"""Teams' secrets for target headers, kept by the operator outside the log.

A job's header may say ``{"from_file": "billing-token"}`` instead of a value: the log then holds
that name only, and the executor reads the value at each call from
``<secrets dir>/<tenant>/billing-token`` (the data directory's ``secrets/`` unless the node was
given ``--secrets-dir``). A team can name only its own secrets: the directory is chosen by the
tenant of the run's lease, never by the job. The file's content is the value; one trailing line
break is dropped. A file replaced is used from the next call on, so rotating a secret is writing
its new value (atomically: write a temporary file and rename it over the old one).
"""

from __future__ import annotations

from pathlib import Path

from core.errors import CronlogError, InvalidDefinition
from core.jobs import MAX_HEADER_VALUE, SECRET_NAME, check_header_value


class SecretUnavailable(CronlogError):
    """A secret a job names cannot be used. The message names the secret, never its value."""


class Secrets:
    """The secrets directory of one node (``None``: the node offers no secrets)."""

    def __init__(self, root: Path | None) -> None:
        self.root = root

    def read(self, tenant: str, name: str) -> str:
        if self.root is None:
            raise SecretUnavailable(f"secret {name!r}: this node has no secrets directory")
        # Both parts are checked, so a path can never leave the team's own directory.
        if not SECRET_NAME.fullmatch(name) or tenant in ("", ".", "..") or "/" in tenant:
            raise SecretUnavailable(f"secret {name!r} is not a secret name")
        try:
            with (self.root / tenant / name).open("rb") as f:
                raw = f.read(MAX_HEADER_VALUE + 3)
        except OSError:
            raise SecretUnavailable(
                f"secret {name!r} is not set for this team (the node's operator provides it)"
            ) from None
        try:
            value = raw.decode("ascii")
        except UnicodeDecodeError:
            raise SecretUnavailable(f"secret {name!r} is not printable ASCII") from None
        value = value.removesuffix("\n").removesuffix("\r")
        try:
            check_header_value(name, value)
        except InvalidDefinition:
            raise SecretUnavailable(
                f"secret {name!r} cannot be sent as a header value (control characters, white"
                f" space at either end, or over {MAX_HEADER_VALUE} characters)"
            ) from None
        return value
