"""The egress policy: which hosts, addresses and Kafka topics a team's job may call.

cronlog calls targets on its teams' behalf from inside the operator's network, so a target is a
way into that network (server-side request forgery). The operator sets the policy; a team can
only live within it. The same rules are applied twice:

- **at registration**, on the host as the job spells it, normalised first (any spelling of an
  address: ``0xa9fea9fe``, ``2852039166``, ``0251.0376.0251.0376``, ``127.1``, ``0``,
  ``[::ffff:169.254.169.254]``; upper case, trailing dots and internationalised names of a host;
  and every Unicode spelling (full-width digits, the ideographic full stop U+3002, ...), read in
  ASCII as the HTTP executor's URL parser reads it before it connects: :func:`parse_host`);
- **at call time**, on every address a host name resolves to, and only those that pass are
  connected to (``node/egress.py``), so a name that resolves to a denied address, or that
  rebinds between the check and the connection, gets nowhere.

How an address is decided, first match wins:

====  ===========================================================  ==========================
1     cloud metadata addresses, ``0.0.0.0/8`` and ``::``,            always denied
      multicast and broadcast, this node's own API port on any
      of its addresses, the cluster's own Kafka brokers
2     the operator's ``--deny-targets`` (addresses or host names)   denied
3     the operator's ``--allow-targets`` (addresses or host names)  allowed
4     loopback, private, link-local, shared (100.64/10), reserved   denied unless step 3 said
      and documentation ranges: anything not globally routable     otherwise
5     everything else (the public internet)                        allowed
====  ===========================================================  ==========================

Host names are decided before they are resolved: cloud metadata names (``metadata.google.internal``
...) are always denied, the operator's deny and allow patterns match names too, and
``localhost`` is decided as the loopback addresses it stands for. An allowed host pattern lets its
names resolve to addresses of step 4 (an internal service named by the operator), never to those
of step 1. An IPv4-mapped IPv6 address is decided as the IPv4 address it maps; one that embeds an
IPv4 address (NAT64, 6to4, Teredo) must pass for that address too.

Kafka topics: a team may produce only to topics the operator granted it a prefix of
(``--allow-topics team-a=team-a.``), and never to the cluster's own topics (``<prefix>.events``,
``<prefix>.commands``, ...) or Kafka's internal ones (``__consumer_offsets``, anything ``__``).

Everything here is pure; whether an address belongs to this machine is asked of ``is_local``,
which the node provides.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Never, NoReturn, Union
from urllib.parse import urlsplit

import idna

from core.errors import EgressDenied
from core.jobs import HttpTarget, KafkaTarget, PullTarget, Target

Address = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]  # noqa: UP007 (a runtime alias)
Network = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]  # noqa: UP007

METADATA_ADDRESSES: tuple[str, ...] = (
    "169.254.169.254",  # AWS, GCP, Azure, OpenStack, DigitalOcean, Oracle, ...
    "169.254.170.2",  # AWS ECS task metadata and credentials
    "169.254.169.253",  # AWS's DNS resolver
    "169.254.0.23",  # Tencent Cloud
    "fd00:ec2::254",  # AWS IMDS over IPv6
    "fd00:ec2::23",  # AWS's DNS resolver over IPv6
    "100.100.100.200",  # Alibaba Cloud
    "192.0.0.192",  # Oracle Cloud (classic)
    "168.63.129.16",  # Azure's wire server: a public address, so no range below catches it
)
METADATA_NAMES: tuple[str, ...] = (
    "metadata.google.internal",
    "metadata.goog",
    "metadata",
    "instance-data",
    "instance-data.ec2.internal",
    "metadata.tencentyun.com",
    "metadata.azure.internal",
)
# Kafka keeps its own state in topics whose names start with this.
KAFKA_INTERNAL = "__"

_LEGACY_IPV4 = re.compile(r"[0-9a-fA-FxX.]+")  # what inet_aton may read as an address
_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_SITE_LOCAL = ipaddress.ip_network("fec0::/10")
_THIS_NETWORK = ipaddress.ip_network("0.0.0.0/8")
_BROADCAST = ipaddress.ip_address("255.255.255.255")
_LOOPBACK = (ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1"))


def canonical(address: Address) -> Address:
    """An IPv4-mapped IPv6 address (``::ffff:a.b.c.d``) as the IPv4 address it reaches."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def parse_host(text: str) -> Address | str:
    """A URL's host as what it names: an address (any spelling the system resolver would take
    for one) or a host name in lower-case ASCII without the trailing dot. Raises ValueError for
    a host that is neither.

    A host beyond ASCII is first written in ASCII as the HTTP executor's URL parser (yarl)
    writes it before it connects (:func:`ascii_host`), so ``127.0.0.1`` in full-width digits and
    full stops is decided as the address ``127.0.0.1`` it will be called as, not as a name."""
    host = text if text.isascii() else ascii_host(text)
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        if ":" not in host:
            raise ValueError(f"{text!r} is not an IPv6 address")
    if ":" in host:
        try:
            return canonical(ipaddress.IPv6Address(host))
        except ValueError:
            raise ValueError(f"{text!r} is not an IPv6 address") from None
    # A trailing dot is an absolute name; on a number it reads as the same address.
    bare = host[:-1] if host.endswith(".") else host
    if bare and _LEGACY_IPV4.fullmatch(bare):
        # inet_aton is what getaddrinfo reads numbers with: hex, octal, decimal, 127.1, 0.
        try:
            return ipaddress.IPv4Address(socket.inet_aton(bare))
        except OSError:
            pass
    return _host_name(bare)


def ascii_host(text: str) -> str:
    """``text``, a host with characters beyond ASCII, in ASCII as yarl's ``_encode_host``
    writes it (the URL an aiohttp call connects to): IDNA 2008 with the UTS #46 mapping (NFKC,
    case folded, the full stops U+3002, U+FF0E and U+FF61 read as "."), and the standard
    library's IDNA 2003 codec (nameprep: NFKC too) for a host that refuses. Either reads the
    full-width and other compatibility digits as ASCII ones, so the result may be an address."""
    try:
        return idna.encode(text, uts46=True).decode("ascii")
    except UnicodeError:  # idna.IDNAError is one
        pass
    try:
        return text.encode("idna").decode("ascii")
    except UnicodeError:
        raise ValueError(f"{text!r} is not a valid host name") from None


def _host_name(text: str) -> str:
    try:
        name = text.lower().encode("idna").decode("ascii").lower()
    except UnicodeError:
        raise ValueError(f"{text!r} is not a valid host name") from None
    labels = name.split(".")
    if not name or len(name) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        raise ValueError(f"{text!r} is not a valid host name")
    return name


def _is_loopback_name(name: str) -> bool:
    # RFC 6761: localhost and every name under it are the loopback addresses.
    return name == "localhost" or name.endswith(".localhost")


def _embedded_ipv4(address: Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address a NAT64, 6to4 or Teredo address carries (and would reach)."""
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    return None


def restricted_kind(address: Address) -> str | None:
    """What keeps ``address`` off the public internet, or None if it is globally routable."""
    a = canonical(address)
    if a.is_loopback:
        return "a loopback address"
    if a.is_link_local:
        return "a link-local address"
    if isinstance(a, ipaddress.IPv6Address) and a in _SITE_LOCAL:
        return "a site-local address"
    if a.is_private:
        return "a private address"
    if a.is_reserved or a.is_multicast or a.is_unspecified or not a.is_global:
        return "an address that is not globally routable"
    return None


@dataclass(frozen=True, slots=True)
class Rule:
    """One entry of an allow or deny list: an address or CIDR range, a host name, or a host
    pattern ``*.example.com`` (every name under example.com), each optionally with a port
    (``10.0.0.0/8:443``, ``[fd00::/8]:443``, ``api.internal:8443``)."""

    text: str
    network: Network | None = None
    name: str | None = None
    wildcard: bool = False
    port: int | None = None

    @classmethod
    def parse(cls, text: str) -> Rule:
        entry = text.strip()
        if not entry:
            raise ValueError("an empty entry")
        host, port = entry, None
        if entry.startswith("["):
            close = entry.find("]")
            if close < 0:
                raise ValueError(f"{text!r}: an unclosed [")
            host, rest = entry[1:close], entry[close + 1 :]
            if rest:
                if not rest.startswith(":"):
                    raise ValueError(f"{text!r}: expected :PORT after ]")
                port = _port(text, rest[1:])
        elif entry.count(":") == 1:
            host, _, port_text = entry.partition(":")
            port = _port(text, port_text)
        if host.startswith("*."):
            try:
                name = _host_name(host[2:])
            except ValueError:
                raise ValueError(f"{text!r}: not a host pattern") from None
            return cls(entry, name=name, wildcard=True, port=port)
        try:
            return cls(entry, network=_network(host), port=port)
        except ValueError:
            pass
        try:
            parsed = parse_host(host)
        except ValueError:
            raise ValueError(f"{text!r}: not an address, range, host name or *.pattern") from None
        if isinstance(parsed, str):
            return cls(entry, name=parsed, port=port)
        return cls(entry, network=ipaddress.ip_network(parsed), port=port)

    def matches_address(self, address: Address, port: int) -> bool:
        if self.network is None or (self.port is not None and self.port != port):
            return False
        return address.version == self.network.version and address in self.network

    def matches_name(self, name: str, port: int) -> bool:
        if self.name is None or (self.port is not None and self.port != port):
            return False
        if self.wildcard:
            return name.endswith("." + self.name)
        return name == self.name


def _port(text: str, value: str) -> int:
    if not value.isascii() or not value.isdigit() or not 0 < int(value) < 65536:
        raise ValueError(f"{text!r}: the port must be 1-65535")
    return int(value)


def _network(text: str) -> Network:
    network = ipaddress.ip_network(text, strict=False)
    if isinstance(network, ipaddress.IPv6Network) and network.network_address.ipv4_mapped:
        # Mapped addresses are decided as IPv4, so a mapped range is kept as its IPv4 range.
        v4 = network.network_address.ipv4_mapped
        return ipaddress.ip_network(f"{v4}/{max(0, network.prefixlen - 96)}", strict=False)
    return network


@dataclass(frozen=True, slots=True)
class TopicGrant:
    """``tenant=prefix``: ``tenant`` (``*``: every team) may produce to topics that start with
    ``prefix`` (``{tenant}`` in it stands for the team's own name; ``*`` alone: any topic)."""

    tenant: str
    prefix: str

    @classmethod
    def parse(cls, text: str) -> TopicGrant:
        tenant, sep, prefix = text.strip().partition("=")
        if not sep or not tenant.strip() or not prefix.strip():
            raise ValueError(f"{text!r}: expected TENANT=PREFIX (TENANT may be *)")
        return cls(tenant.strip(), prefix.strip())

    def allows(self, tenant: str, topic: str) -> bool:
        if self.tenant not in ("*", tenant):
            return False
        return self.prefix == "*" or topic.startswith(self.prefix.replace("{tenant}", tenant))


def _is_local_default(address: Address) -> bool:
    return address.is_loopback or address.is_unspecified


@dataclass(frozen=True)
class EgressPolicy:
    """The operator's policy. ``EgressPolicy()`` is the default: the public internet only.

    ``own_ports``: the ports this node's API listens on; they are denied on every address
    ``is_local`` says is this machine's. ``never``: further endpoints no team may reach (the
    cluster's Kafka brokers). ``topic_prefix``: the cluster's own topics' prefix.
    """

    allow: tuple[Rule, ...] = ()
    deny: tuple[Rule, ...] = ()
    never: tuple[Rule, ...] = ()
    own_ports: frozenset[int] = frozenset()
    topics: tuple[TopicGrant, ...] = ()
    topic_prefix: str = "cronlog"
    is_local: Callable[[Address], bool] = field(default=_is_local_default, compare=False)

    @classmethod
    def build(
        cls,
        *,
        allow: Iterable[str] = (),
        deny: Iterable[str] = (),
        topics: Iterable[str] = (),
        never: Iterable[str] = (),
        own_ports: Iterable[int] = (),
        topic_prefix: str = "cronlog",
        is_local: Callable[[Address], bool] = _is_local_default,
    ) -> EgressPolicy:
        """A policy from the operator's words; ValueError names an entry it cannot read."""
        return cls(
            allow=tuple(Rule.parse(e) for e in _entries(allow)),
            deny=tuple(Rule.parse(e) for e in _entries(deny)),
            never=tuple(Rule.parse(e) for e in _entries(never)),
            own_ports=frozenset(own_ports),
            topics=tuple(TopicGrant.parse(e) for e in _entries(topics)),
            topic_prefix=topic_prefix,
            is_local=is_local,
        )

    # -- addresses and names -------------------------------------------------------------------

    def check_address(self, address: Address, port: int, name: str | None = None) -> str | None:
        """Why a connection to ``address``:``port`` (reached through host ``name``, if any) is
        refused, or None if it may be made."""
        address = canonical(address)
        embedded = _embedded_ipv4(address)
        if embedded is not None:
            reason = self.check_address(embedded, port)
            if reason is not None:
                return f"{address} carries {embedded}: {reason}"
        reason = self.absolute(address, port)
        if reason is not None:
            return reason
        for rule in self.deny:
            if rule.matches_address(address, port) or (
                name is not None and rule.matches_name(name, port)
            ):
                return f"{name or address} is denied by the operator ({rule.text})"
        for rule in self.allow:
            if rule.matches_address(address, port) or (
                name is not None and rule.matches_name(name, port)
            ):
                return None
        kind = restricted_kind(address)
        if kind is not None:
            return f"{address} is {kind}, which the operator has not allowed (--allow-targets)"
        return None

    def absolute(self, address: Address, port: int) -> str | None:
        """Why ``address``:``port`` is refused whatever any allow-list says (step 1), or None.
        The last check before a socket connects uses only this and the operator's denials."""
        address = canonical(address)
        if str(address) in METADATA_ADDRESSES:
            return f"{address} is a cloud metadata address"
        if address.is_unspecified or address in _THIS_NETWORK or address == _BROADCAST:
            return f"{address} is not an address a call can go to"
        if address.is_multicast:
            return f"{address} is a multicast address"
        if port in self.own_ports and self.is_local(address):
            return f"{address}:{port} is this node's own API"
        for rule in self.never:
            if rule.matches_address(address, port):
                return f"{address}:{port} is the cluster's own Kafka"
        return None

    def denied_outright(self, address: Address, port: int) -> str | None:
        """Steps 1 and 2 only: what no host name can make reachable."""
        reason = self.absolute(address, port)
        if reason is not None:
            return reason
        address = canonical(address)
        for rule in self.deny:
            if rule.matches_address(address, port):
                return f"{address} is denied by the operator ({rule.text})"
        return None

    def check_name(self, name: str, port: int) -> str | None:
        """Why host ``name`` is refused before it is even resolved, or None. The addresses it
        resolves to are then checked one by one with :meth:`check_address`."""
        if name in METADATA_NAMES:
            return f"{name} is a cloud metadata host"
        for rule in self.never:
            if rule.matches_name(name, port):
                return f"{name}:{port} is the cluster's own Kafka"
        for rule in self.deny:
            if rule.matches_name(name, port):
                return f"{name} is denied by the operator ({rule.text})"
        if _is_loopback_name(name):
            reasons = [self.check_address(a, port, name) for a in _LOOPBACK]
            if all(reasons):
                return f"{name} names this machine: {reasons[0]}"
        return None

    def check_host(self, host: str, port: int) -> str | None:
        """:meth:`check_address` or :meth:`check_name` on a host as a URL spells it."""
        try:
            parsed = parse_host(host)
        except ValueError as err:
            return str(err)
        if isinstance(parsed, str):
            return self.check_name(parsed, port)
        return self.check_address(parsed, port)

    def check_url(self, url: str) -> str | None:
        """Why an HTTP target's URL is refused at registration, or None."""
        # Every white-space character but " " is unprintable: one scan in C, not one call a
        # character (every create asks this).
        if not url.isprintable() or " " in url:
            # URL parsers drop or keep these differently; the one that calls must read what
            # was checked.
            return "the URL holds white space or control characters"
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as err:
            return f"the URL cannot be read: {err}"
        if "\\" in parts.netloc:
            return "the URL's authority holds a backslash"
        if parts.username is not None or "@" in parts.netloc:
            return "the URL holds credentials; send them in a header (a secret reference)"
        host = parts.netloc.rpartition(":")[0] if port is not None else parts.netloc
        if host.endswith(":"):  # "host:" with no port after it
            host = host[:-1]
        if not host:
            return "the URL has no host"
        default = 443 if parts.scheme == "https" else 80
        return self.check_host(host, port if port is not None else default)

    # -- Kafka topics --------------------------------------------------------------------------

    def check_topic(self, tenant: str, topic: str) -> str | None:
        """Why ``tenant`` may not produce to ``topic``, or None."""
        if topic.startswith(KAFKA_INTERNAL):
            return f"{topic!r} is one of Kafka's internal topics"
        # Kafka lets "." and "_" collide in topic names, so the two are read alike here.
        own = self.topic_prefix.replace("_", ".")
        folded = topic.replace("_", ".")
        if folded == own or folded.startswith(own + "."):
            return f"{topic!r} is one of this cluster's own topics ({self.topic_prefix}.*)"
        if any(grant.allows(tenant, topic) for grant in self.topics):
            return None
        return (
            f"team {tenant!r} may not produce to {topic!r}; the operator grants topic prefixes"
            " per team (--allow-topics)"
        )

    # -- targets -------------------------------------------------------------------------------

    def check_target(self, tenant: str, target: Target) -> None:
        """Raise :class:`EgressDenied` if ``tenant``'s ``target`` is outside the policy, or of
        a kind the policy does not know."""
        match target:
            case HttpTarget(url=url, status_url=status):
                reason = self.check_url(url)
                if reason is None and status is not None:
                    # asked with the job's credentials: held to the same policy as its calls
                    refused = self.check_url(status)
                    if refused is not None:
                        raise EgressDenied(refused, field="target.status_url")
            case KafkaTarget(topic=topic):
                reason = self.check_topic(tenant, topic)
            case PullTarget():
                reason = None  # the pool's workers come to cronlog: nothing is called
            case _:
                refuse_unknown_kind(target)
        if reason is not None:
            raise EgressDenied(reason)

    def describe(self) -> str:
        """One line for the node's startup: what its outbound calls may reach."""
        allowed = ", ".join(r.text for r in self.allow) or "none"
        denied = ", ".join(r.text for r in self.deny) or "none"
        topics = ", ".join(f"{g.tenant}={g.prefix}" for g in self.topics)
        return (
            "egress policy: public addresses; loopback, private and link-local ranges only as"
            f" allowed ({allowed}); denied by the operator: {denied}; never cloud metadata or"
            " this node's API; kafka:// topics: "
            + (topics or "none (kafka:// targets are refused)")
        )


def refuse_unknown_kind(target: Never) -> NoReturn:
    """The end of a branch over target kinds that decides egress: typed as
    :func:`typing.assert_never` is, so mypy fails the branch when a kind added to ``Target`` is
    not matched; at run time a refusal (``EgressDenied``: a 422 naming ``target``) instead of an
    assertion, since letting an unchecked kind through is what the policy exists to prevent."""
    raise EgressDenied(f"{type(target).__name__} is not a target kind the egress policy knows")


def _entries(values: Iterable[str]) -> list[str]:
    """Comma-separated lists, one or several, as single entries."""
    out: list[str] = []
    for value in values:
        out += [e.strip() for e in value.split(",") if e.strip()]
    return out


def topics_from_mapping(grants: Mapping[str, Iterable[str]]) -> list[str]:
    """A config file's ``{tenant: [prefix, ...]}`` as ``tenant=prefix`` entries."""
    return [f"{tenant}={prefix}" for tenant, prefixes in grants.items() for prefix in prefixes]
