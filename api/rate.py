"""Requests per bearer token: a token bucket each, refilled at the tenant's ``requests_per_sec``
up to its ``request_burst``.

Time is an argument (seconds on any monotonic scale), so the buckets are tested with a fake
clock. Worked example, 2 requests a second with a burst of 3: three requests at t=0 pass and
empty the bucket; a fourth at t=0 is told to wait 0.5 s (one token takes 1/2 s to come back);
at t=0.5 one request passes; at t=2.0 the bucket holds 3 again, never more.

Hand-written rather than a library's: the ones that fit read the clock themselves, and the
bucket is a few lines.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class TokenBucket:
    per_sec: float
    burst: int
    tokens: float
    stamp: float

    @classmethod
    def full(cls, per_sec: float, burst: int, now: float) -> TokenBucket:
        return cls(per_sec, burst, float(burst), now)

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
    before it gets here), so the map is as small as the tokens file."""

    def __init__(self) -> None:
        self._buckets: dict[str, TokenBucket] = {}

    def take(self, token: str, per_sec: float, burst: int, now: float) -> float:
        """0.0 if ``token`` may make a request at ``now``, else the seconds to wait."""
        return self._bucket(token, per_sec, burst, now).take(now)

    def take_up_to(self, token: str, n: int, per_sec: float, burst: int, now: float) -> int:
        """How many of ``n`` more requests ``token`` may make at ``now`` (each spends its token):
        a batch counts each of its items as a request."""
        return self._bucket(token, per_sec, burst, now).take_up_to(n, now)

    def _bucket(self, token: str, per_sec: float, burst: int, now: float) -> TokenBucket:
        bucket = self._buckets.get(token)
        if bucket is None:
            bucket = self._buckets[token] = TokenBucket.full(per_sec, burst, now)
        return bucket
