"""Requests per bearer token: a token bucket each, refilled at the tenant's ``requests_per_sec``
up to its ``request_burst``.

Time is an argument (seconds on any monotonic scale), so the buckets are tested with a fake
clock. Worked example, 2 requests a second with a burst of 3: three requests at t=0 pass and
empty the bucket; a fourth at t=0 is told to wait 0.5 s (one token takes 1/2 s to come back);
at t=0.5 one request passes; at t=2.0 the bucket holds 3 again, never more.

Across a cluster the token's rate is the whole group's: each member refills its bucket at its
share of the rate, and its burst is the same part of the burst (``core.shares``; a member alone,
the embedded node of one process, has the whole rate).

Hand-written rather than a library's: the ones that fit read the clock themselves, and the
bucket is a few lines.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from core.shares import PERIOD_MS, Shares, key_of

# A member whose share of a token's rate is nothing waits for its next grant, a period away.
NO_SHARE_WAIT_S = PERIOD_MS / 1000


@dataclass(slots=True)
class TokenBucket:
    per_sec: float
    burst: float
    tokens: float
    stamp: float

    @classmethod
    def full(cls, per_sec: float, burst: float, now: float) -> TokenBucket:
        return cls(per_sec, burst, float(burst), now)

    def resize(self, per_sec: float, burst: float, now: float) -> None:
        """A new rate and burst (a share that moved): what was refilled stays, up to the new
        burst."""
        self._refill(now)
        self.per_sec, self.burst = per_sec, burst
        self.tokens = min(self.tokens, burst)

    def take(self, now: float) -> float:
        """Spend one token: 0.0 when there was one, else the seconds until there is one (and
        nothing is spent)."""
        self._refill(now)
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.per_sec

    def take_up_to(self, n: int, now: float) -> int:
        """Spend as many whole tokens as there are, up to ``n``; return how many."""
        self._refill(now)
        spent = min(n, int(self.tokens))
        self.tokens -= spent
        return spent

    def _refill(self, now: float) -> None:
        if now > self.stamp:  # a clock that steps back refills nothing
            self.tokens = min(float(self.burst), self.tokens + (now - self.stamp) * self.per_sec)
            self.stamp = now


class RequestRates:
    """One bucket per bearer token. Tokens are the configured ones (an unknown token is refused
    before it gets here), so the map is as small as the tokens file. With ``shares``, each
    bucket is this member's share of the token's rate; the token is named to the owner of the
    share by a digest, never by itself."""

    def __init__(self, shares: Shares | None = None) -> None:
        self._buckets: dict[str, TokenBucket] = {}
        self._shares = shares
        self._keys: dict[str, str] = {}

    def take(self, token: str, per_sec: float, burst: int, now: float, tenant: str = "") -> float:
        """0.0 if ``token`` may make a request at ``now``, else the seconds to wait."""
        bucket = self._bucket(token, tenant, per_sec, burst, now, 1)
        if bucket is None:
            return NO_SHARE_WAIT_S
        return bucket.take(now)

    def take_up_to(
        self, token: str, n: int, per_sec: float, burst: int, now: float, tenant: str = ""
    ) -> int:
        """How many of ``n`` more requests ``token`` may make at ``now`` (each spends its token):
        a batch counts each of its items as a request."""
        bucket = self._bucket(token, tenant, per_sec, burst, now, n)
        return 0 if bucket is None else bucket.take_up_to(n, now)

    def _bucket(
        self, token: str, tenant: str, per_sec: float, burst: int, now: float, asked: int
    ) -> TokenBucket | None:
        rate, size = per_sec, float(burst)
        if self._shares is not None:
            key = self._keys.get(token)
            if key is None:
                digest = hashlib.blake2b(token.encode(), digest_size=8).hexdigest()
                key = self._keys[token] = key_of(tenant, "requests", digest)
            rate = self._shares.rate(key, per_sec, round(now * 1000), asked)
            if rate <= 1e-9:
                return None
            size = max(1.0, burst * rate / per_sec)
        bucket = self._buckets.get(token)
        if bucket is None:
            bucket = self._buckets[token] = TokenBucket.full(rate, size, now)
        elif bucket.per_sec != rate or bucket.burst != size:
            bucket.resize(rate, size, now)
        return bucket
