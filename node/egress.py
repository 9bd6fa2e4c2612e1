"""The egress policy where calls are made: resolve once, check, connect to what was checked.

``core/egress.py`` decides; this module applies its decisions to the HTTP executor's aiohttp
session, at the two points where a host becomes a connection:

- :class:`PolicyResolver`, the connector's resolver. aiohttp asks it for every host name and
  connects only to the addresses it returns (``TCPConnector._create_direct_connection`` turns
  them straight into socket addresses; its DNS cache holds them, already checked). It resolves
  once through the system's resolver and returns only the addresses the policy allows, so a
  name that resolves to a denied address is refused, and a name that answers differently a
  moment later (DNS rebinding) cannot move the connection: there is no second lookup. TLS is
  unaffected: aiohttp sends the URL's host name as SNI and checks the certificate against it,
  whatever address it connected to.
- :func:`guarded_socket`, the connector's socket factory, the last step before ``connect()``.
  A host written as an address never reaches the resolver, so the executor checks those itself
  before the call; this guard then refuses, whatever the path, any socket to an address that no
  allow-list may open (metadata, this node's API, the operator's denials).

A refusal is an :class:`EgressRefused`, an ``OSError`` so that aiohttp carries it inside its own
connection errors; :func:`refusal_in` finds it there.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Callable
from typing import Any

from aiohttp.abc import AbstractResolver, ResolveResult

from core.egress import Address, EgressPolicy, parse_host

log = logging.getLogger(__name__)

_NUMERIC = socket.AI_NUMERICHOST | socket.AI_NUMERICSERV
# What aiohttp's connector hands a socket factory: getaddrinfo's (family, type, proto,
# canonname, sockaddr) for the address about to be connected to.
AddrInfo = tuple[int, int, int, str, tuple[Any, ...]]
SocketFactory = Callable[[AddrInfo], socket.socket]


class EgressRefused(OSError):
    """A connection the egress policy refuses; ``str()`` is the reason."""


class PolicyResolver(AbstractResolver):
    """Resolves through ``inner`` (the system's resolver unless given) and returns only the
    addresses ``policy`` allows; raises :class:`EgressRefused` when none is left."""

    def __init__(self, policy: EgressPolicy, inner: AbstractResolver | None = None) -> None:
        self._policy = policy
        self._inner = inner

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        try:
            parsed = parse_host(host)
        except ValueError as err:
            raise EgressRefused(str(err)) from None
        if not isinstance(parsed, str):
            # A spelling aiohttp does not take for an address (0xa9fea9fe): the system's
            # resolver would read it as one, so it is decided, and connected to, as one.
            reason = self._policy.check_address(parsed, port)
            if reason is not None:
                raise EgressRefused(reason)
            return [_result(host, parsed, port)]
        reason = self._policy.check_name(parsed, port)
        if reason is not None:
            raise EgressRefused(reason)
        if self._inner is None:
            from aiohttp.resolver import ThreadedResolver

            self._inner = ThreadedResolver()
        found = await self._inner.resolve(host, port, family)
        allowed: list[ResolveResult] = []
        refused: list[str] = []
        for result in found:
            address = ipaddress.ip_address(result["host"])
            why = self._policy.check_address(address, result["port"], parsed)
            if why is None:
                allowed.append(result)
            else:
                refused.append(why)
        if refused:
            log.info("egress policy: %s:%d: left out %s", host, port, "; ".join(refused))
        if not allowed:
            # The tenant learns only that the name led nowhere allowed, not where it led.
            raise EgressRefused(f"{parsed} resolves to no address this node may call")
        return allowed

    async def close(self) -> None:
        if self._inner is not None:
            await self._inner.close()


def _result(host: str, address: Address, port: int) -> ResolveResult:
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    return ResolveResult(
        hostname=host, host=str(address), port=port, family=family, proto=0, flags=_NUMERIC
    )


def guarded_socket(policy: EgressPolicy) -> SocketFactory:
    """A socket factory for aiohttp's connector that refuses what no host name may reach."""

    def factory(addr_info: AddrInfo) -> socket.socket:
        family, type_, proto, _, sockaddr = addr_info
        reason = policy.denied_outright(ipaddress.ip_address(sockaddr[0]), int(sockaddr[1]))
        if reason is not None:
            raise EgressRefused(reason)
        return socket.socket(family=family, type=type_, proto=proto)

    return factory


def refusal_in(error: BaseException) -> EgressRefused | None:
    """The :class:`EgressRefused` behind an aiohttp error, if that is what it was."""
    seen: BaseException | None = error
    for _ in range(8):  # a chain of causes is short; never follow a cycle
        if seen is None:
            return None
        if isinstance(seen, EgressRefused):
            return seen
        inner = getattr(seen, "os_error", None)
        if isinstance(inner, EgressRefused):
            return inner
        seen = seen.__cause__ or seen.__context__
    return None
