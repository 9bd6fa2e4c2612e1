"""The operator's egress configuration: the config file and the command line's entries made
the node's :class:`~core.egress.EgressPolicy`, which ``node/egress.py`` applies where calls are
made. Apart from it, so that a node starting reads its policy without importing the HTTP
client (an executor process imports that: ``node/call_process.py``)."""

from __future__ import annotations

import socket
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from core.egress import Address, EgressPolicy, topics_from_mapping


def is_local_address(address: Address) -> bool:
    """Whether ``address`` is one of this machine's: the kernel lets a socket bind to it."""
    if address.is_loopback or address.is_unspecified:
        return True
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind((str(address), 0))
        except OSError:
            return False
    return True


def read_config(path: Path) -> dict[str, Any]:
    """An egress config file (TOML; docs/security.md has an example): ``allow_targets`` and
    ``deny_targets`` (lists of entries as on the command line), ``allow_topics`` (a table from
    a team, or ``*``, to a list of topic prefixes), ``error_excerpt_bytes``. ValueError says
    what is wrong with it."""
    with path.open("rb") as f:
        config = tomllib.load(f)
    known = {"allow_targets", "deny_targets", "allow_topics", "error_excerpt_bytes"}
    unknown = sorted(set(config) - known)
    if unknown:
        raise ValueError(f"{path}: unknown settings {', '.join(unknown)}")
    for key in ("allow_targets", "deny_targets"):
        if not _strings(config.get(key, [])):
            raise ValueError(f"{path}: {key} must be a list of strings")
    topics = config.get("allow_topics", {})
    if not isinstance(topics, dict) or not all(_strings(v) for v in topics.values()):
        raise ValueError(f"{path}: allow_topics maps a team (or *) to a list of prefixes")
    excerpt = config.get("error_excerpt_bytes")
    if excerpt is not None and (not isinstance(excerpt, int) or excerpt < 0):
        raise ValueError(f"{path}: error_excerpt_bytes must be a whole number, 0 or more")
    return config


def _strings(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def policy_from(
    config: dict[str, Any],
    *,
    allow: Iterable[str] = (),
    deny: Iterable[str] = (),
    topics: Iterable[str] = (),
    api_port: int | None = None,
    kafka_bootstrap: Iterable[str] = (),
    topic_prefix: str = "cronlog",
) -> EgressPolicy:
    """The node's policy: a config file's entries and the command line's, together; this node's
    API port and the cluster's Kafka brokers are never reachable. ValueError names a bad entry."""
    return EgressPolicy.build(
        allow=[*config.get("allow_targets", []), *allow],
        deny=[*config.get("deny_targets", []), *deny],
        topics=[*topics_from_mapping(config.get("allow_topics", {})), *topics],
        never=[server for servers in kafka_bootstrap for server in servers.split(",")],
        own_ports=() if api_port is None else (api_port,),
        topic_prefix=topic_prefix,
        is_local=is_local_address,
    )
