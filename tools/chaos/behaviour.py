"""How the recording target and the pull workers treat a run: told by the job's payload.

A chaos job's payload carries its behaviour, so the target and the workers need no state and
no channel to the harness, and the same attempt is always treated the same way::

    {"chaos": {"hold_ms": [200, 400],   # answer after this long (uniform in the range)
               "slow_permille": 20,     # of attempts, held ``slow_ms`` instead
               "slow_ms": 2500,         # (past the job's timeout: an ambiguous failure)
               "fail_permille": 50}}    # of attempts, answered 503 (a definite failure)

The draw is a hash of the idempotency key and the attempt number.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Answer:
    status: int
    hold_ms: int


def answer(payload: Any, key: str, attempt: int) -> Answer:
    spec = payload.get("chaos") if isinstance(payload, dict) else None
    if not isinstance(spec, dict):
        return Answer(200, 0)
    h = zlib.crc32(f"{key}#{attempt}".encode())
    lo, hi = spec.get("hold_ms", [0, 0])
    if h % 1000 < int(spec.get("fail_permille", 0)):
        return Answer(503, int(lo))
    if (h // 1000) % 1000 < int(spec.get("slow_permille", 0)):
        return Answer(200, int(spec.get("slow_ms", hi)))
    return Answer(200, int(lo) + (h // 1_000_000) % (int(hi) - int(lo) + 1))
