"""The jobs a chaos run creates, drawn from its seed, and the record of which were acknowledged.

Cron jobs are created before the faults start; one-shot jobs in bursts while they run, each
burst due in one second. Every create goes through the HTTP API to some node; its answer is
recorded in ``creates.jsonl`` (``{"job": id, "status": 201, "at": ms, "node": n}``). A create
answered 201 (or 200: the same definition existed, so an earlier try was decided) is
*acknowledged*: the checker holds cronlog to running every slot of it.

Behaviours (:mod:`tools.chaos.behaviour`) are chosen to exercise the paths that matter:

- ``fast``: answered within 50 ms;
- ``beat``: held about a third of the lease, so the call often ends while its heartbeat is
  being decided (the race of issue 12);
- ``flaky``: one attempt in twenty answered 503 (definite: retried, even when critical);
- ``slow``: one attempt in fifty held past the job's timeout (ambiguous: retried, or, when
  critical, asked about or dead-lettered ``outcome_unknown``).

Critical push jobs come in two groups, told apart by their ids and their target:

- **guarded** (``sec-000-guarded``, ``once-00-007-guarded``): they call the target's
  ``/guarded``, the SDK's :class:`~cronlog_client.target.RunGuard` in front of the handling,
  and name its status path as their ``status_url``, with the guard's bearer secret in their
  target's headers (a secret reference, ``GUARD_SECRET_NAME``, which the harness writes into
  every node's secrets directory). A run whose outcome is unknown is asked about;
- **unguarded** (``sec-003-unguarded``): ``/hook`` and no ``status_url``: such a run is
  dead-lettered ``outcome_unknown``, as for any target that cannot say.

**Kafka-topic jobs** (``topic-000-critical``, ``topic-001``) produce every second to the team's
topic ``TEAM_TOPIC`` on the cluster, exactly once (``node.produced``): the checker reads the
topic ``read_committed`` and holds each run that succeeded to one record, and no record to a
run that did not.

The every-second critical jobs of each group take the behaviours ``slow``, ``flaky``, ``beat``
and ``fast`` in turn, so both groups meet the same ambiguity and the checker compares like
with like: an unguarded ``slow`` job's attempts held past the timeout are dead-lettered by
design (the checker's ``critical_outcome_unknown_target_slow``), a guarded one's are asked.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import httpx

from tools.chaos.procs import iso, now_ms
from tools.chaos.records import Recorder

LEASE_SEC = 5.0  # heartbeats every 1.67 s
TIMEOUT_SEC = 4.0
BACKOFF = {"base_sec": 0.2, "factor": 2, "cap_sec": 2, "jitter": False}
RETRIES = 3
POOL = "chaos"
CREATE_TRIES = 4
GUARD_SECRET_NAME = "chaos-guard"  # the secret the guarded jobs' headers name
TEAM_TOPIC = "team-chaos.ticks"  # where the kafka:// jobs produce (granted with --allow-topics)
# The every-second critical jobs' behaviours, in turn within each group (guarded, unguarded).
CRITICAL_TURNS = ("slow", "flaky", "beat", "fast")

BEHAVIOURS: dict[str, dict[str, Any]] = {
    "fast": {"hold_ms": [0, 50]},
    "beat": {"hold_ms": [1600, 1800]},
    "flaky": {"hold_ms": [20, 200], "fail_permille": 50},
    "slow": {"hold_ms": [20, 200], "slow_permille": 20, "slow_ms": 4600},
}


@dataclass(frozen=True)
class Shape:
    """How many jobs of each kind a run creates."""

    every_second: int = 24  # push (HTTP) jobs on "* * * * * *"
    every_second_critical: int = 6  # of those
    every_second_guarded: int = 3  # of the critical ones, behind the guard with a status_url
    every_five: int = 6  # push jobs on "* * * * * */5"
    pull: int = 4  # pull jobs on "* * * * * *"
    pull_critical: int = 1  # of those
    oneshot_bursts: int = 3
    oneshot_per_burst: int = 40
    topic: int = 2  # kafka:// jobs on "* * * * * *", producing to TEAM_TOPIC
    topic_critical: int = 1  # of those


@dataclass
class Workload:
    shape: Shape
    target_url: str  # the unguarded handling (/hook)
    rng: random.Random
    guarded_url: str = ""  # the handling behind the guard (/guarded)
    status_url: str = ""  # where the guard answers asks
    crons: list[dict[str, Any]] = field(default_factory=list)

    def cron_jobs(self) -> list[dict[str, Any]]:
        s = self.shape
        jobs: list[dict[str, Any]] = []
        kinds = list(BEHAVIOURS)
        for i in range(s.every_second):
            critical = i < s.every_second_critical
            guarded = i < min(s.every_second_guarded, s.every_second_critical)
            if critical:
                turn = i if guarded else i - min(s.every_second_guarded, s.every_second_critical)
                behaviour = CRITICAL_TURNS[turn % len(CRITICAL_TURNS)]
                job_id = f"sec-{i:03d}-{'guarded' if guarded else 'unguarded'}"
            else:
                behaviour = self.rng.choice(kinds)
                job_id = f"sec-{i:03d}"
            jobs.append(self._push(job_id, "*", behaviour, critical, guarded))
        for i in range(s.every_five):
            jobs.append(self._push(f"five-{i:03d}", "*/5", self.rng.choice(kinds), False))
        for i in range(s.pull):
            critical = i < s.pull_critical
            behaviour = self.rng.choice(["fast", "beat", "flaky"])
            body = self._body(f"pull-{i:03d}", behaviour, critical, f"pull://{POOL}")
            jobs.append({**body, "schedule": "* * * * *", "seconds": "*"})
        for i in range(s.topic):
            critical = i < s.topic_critical
            job_id = f"topic-{i:03d}{'-critical' if critical else ''}"
            body = self._body(job_id, "fast", critical, f"kafka://{TEAM_TOPIC}")
            jobs.append({**body, "schedule": "* * * * *", "seconds": "*"})
        self.crons = jobs
        return jobs

    def burst(self, index: int, due_ms: int, rng: random.Random) -> list[dict[str, Any]]:
        """``oneshot_per_burst`` one-shot jobs all due at ``due_ms``."""
        jobs = []
        for i in range(self.shape.oneshot_per_burst):
            critical = rng.random() < 0.25
            guarded = critical and rng.random() < 0.5
            behaviour = rng.choice(["fast", "beat", "flaky"])
            job_id = f"once-{index:02d}-{i:03d}"
            if critical:
                job_id += "-guarded" if guarded else "-unguarded"
            body = self._http(job_id, behaviour, critical, guarded)
            jobs.append({**body, "run_at": iso(due_ms)})
        return jobs

    def probe(self, job_id: str, run_at_ms: int) -> dict[str, Any]:
        """A one-shot job due at ``run_at_ms`` (to the millisecond)."""
        return {**self._body(job_id, "fast", False, self.target_url), "run_at": iso(run_at_ms)}

    def _push(
        self, job_id: str, seconds: str, behaviour: str, critical: bool, guarded: bool = False
    ) -> dict[str, Any]:
        """A push job of every minute at ``seconds`` (the API takes the seconds apart)."""
        body = self._http(job_id, behaviour, critical, guarded)
        return {**body, "schedule": "* * * * *", "seconds": seconds}

    def _http(self, job_id: str, behaviour: str, critical: bool, guarded: bool) -> dict[str, Any]:
        """A push job's body; a guarded one calls the guard and names its status path."""
        if not guarded:
            return self._body(job_id, behaviour, critical, self.target_url)
        target = {
            "type": "http",
            "url": self.guarded_url,
            "headers": {"Authorization": {"from_file": GUARD_SECRET_NAME}},
            "status_url": self.status_url,
        }
        body = self._body(job_id, behaviour, critical, target)
        return {**body, "name": f"chaos {behaviour} guarded"}

    @staticmethod
    def _body(
        job_id: str, behaviour: str, critical: bool, target: str | dict[str, Any]
    ) -> dict[str, Any]:
        return {
            "job_id": job_id,
            "name": f"chaos {behaviour}",
            "target": target,
            "payload": {"chaos": BEHAVIOURS[behaviour], "behaviour": behaviour},
            "critical": critical,
            "lease_sec": LEASE_SEC,
            "timeout_sec": TIMEOUT_SEC,
            "retries": RETRIES,
            "backoff": BACKOFF,
        }


def create(clients: list[httpx.Client], body: dict[str, Any], acks: Recorder) -> bool:
    """Create one job, trying each node in turn; True once a node acknowledged it."""
    for attempt in range(CREATE_TRIES):
        client = clients[attempt % len(clients)]
        try:
            response = client.post("/v1/jobs", json=body, timeout=15.0)
            status = response.status_code
        except httpx.HTTPError:
            status = 0
        acks.write(
            {"job": body["job_id"], "status": status, "at": now_ms(), "node": str(client.base_url)}
        )
        if status in (200, 201):
            return True
        if 400 <= status < 500:
            return False  # the harness sent something wrong: trying again will not help
    return False
