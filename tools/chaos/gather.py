"""Gathering a chaos run's history for the checker, with clients that share no code with cronlog.

- The events topic is read ``read_committed`` by kafka-python (pure Python; cronlog writes with
  librdkafka), every partition from the beginning to its end offset, and decoded as plain JSON;
  the team's topic that the ``kafka://`` jobs produce to likewise (:func:`topic_records`).
- The target's and the workers' records are read from their files.
- Each node's read model is asked over HTTP for every run of every job; its readiness and
  metrics likewise.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from tools.chaos.checker import NodeHealth
from tools.chaos.nodes import REPO

log = logging.getLogger("chaos")

READ_TIMEOUT_S = 180.0
_METRIC = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?) ([-+0-9.eEinfNa]+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


class TopicReader:
    """The events topic, read ``read_committed`` by kafka-python from given offsets to the end
    offsets as they are when asked. It runs in a process of its own (:func:`read_to_file`):
    in the harness's process, crowded with the faults' clients, it once stopped answering."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        from kafka import KafkaConsumer, TopicPartition

        self._consumer = KafkaConsumer(
            bootstrap_servers=bootstrap,
            isolation_level="read_committed",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=8 * 1024 * 1024,
        )
        parts = None
        deadline = time.monotonic() + 60
        while parts is None and time.monotonic() < deadline:
            parts = self._consumer.partitions_for_topic(topic)
            if parts is None:
                time.sleep(0.5)  # metadata for the topic has not arrived yet
        if parts is None:
            raise RuntimeError(f"topic {topic} not found")
        self._tps = [TopicPartition(topic, p) for p in sorted(parts)]
        self._consumer.assign(self._tps)

    def read(
        self, start: dict[int, int], timeout_s: float = READ_TIMEOUT_S
    ) -> Iterator[tuple[int, int, bytes | None, int]]:
        """(partition, offset, value, timestamp ms) from ``start`` (default 0) to the end
        offsets."""
        for tp in self._tps:
            self._consumer.seek(tp, start.get(tp.partition, 0))
        end = self._consumer.end_offsets(self._tps)
        deadline = time.monotonic() + timeout_s
        while any(self._consumer.position(tp) < end[tp] for tp in self._tps):
            if time.monotonic() >= deadline:
                behind = {tp.partition: end[tp] - self._consumer.position(tp) for tp in self._tps}
                raise RuntimeError(f"events not read to the end in {timeout_s:.0f} s: {behind}")
            batch = self._consumer.poll(timeout_ms=500, max_records=5000)
            for tp, records in batch.items():
                for r in records:
                    yield tp.partition, r.offset, r.value, r.timestamp

    def close(self) -> None:
        self._consumer.close()


def read_to_file(bootstrap: str, topic: str, start: dict[int, int], out: Path) -> int:
    """Append the records from ``start`` to the end to ``out`` as ``{"p", "o", "e", "t"}``
    lines (``e`` the record as JSON, or null for one that is not; ``t`` its timestamp, ms);
    how many."""
    reader = TopicReader(bootstrap, topic)
    n = 0
    try:
        with out.open("a") as f:
            for partition, offset, value, at in reader.read(start):
                line = {"p": partition, "o": offset, "e": _decode(value), "t": at}
                f.write(json.dumps(line) + "\n")
                n += 1
    finally:
        reader.close()
    return n


class EventReader:
    """The events topic as read so far, kept up to date by :meth:`catch_up` (the drain waits on
    it), which has a child process read what is new into ``path``."""

    def __init__(self, bootstrap: str, topic: str, path: Path) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.path = path
        path.write_text("")
        self._read_to = 0  # bytes of the file already folded into events
        self.events: dict[int, list[tuple[int, dict[str, Any] | None]]] = {}

    def catch_up(self, timeout_s: float = READ_TIMEOUT_S, attempts: int = 3) -> int:
        start = ",".join(f"{p}:{records[-1][0] + 1}" for p, records in self.events.items())
        command = [
            sys.executable, "-m", "tools.chaos", "events", "--bootstrap", self.bootstrap,
            "--topic", self.topic, "--out", str(self.path), "--start", start or "-",
        ]  # fmt: skip
        for attempt in range(attempts):
            try:
                subprocess.run(
                    command, cwd=REPO, check=True, timeout=timeout_s + 60, capture_output=True
                )
                break
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
                err = getattr(e, "stderr", b"") or b""
                if attempt == attempts - 1:
                    raise RuntimeError(f"reading the events failed: {err.decode()[-2000:]}") from e
                log.warning("reading the events failed; again: %s", err.decode()[-300:])
                # The child may have appended part of it: fold that in first.
                self._fold_new()
                start = ",".join(f"{p}:{r[-1][0] + 1}" for p, r in self.events.items())
                command[-1] = start or "-"
        return self._fold_new()

    def _fold_new(self) -> int:
        n = 0
        with self.path.open("rb") as f:
            f.seek(self._read_to)
            for line in f:
                if not line.endswith(b"\n"):
                    break  # cut short: read it again next time
                self._read_to += len(line)
                r = json.loads(line)
                records = self.events.setdefault(r["p"], [])
                if not records or r["o"] > records[-1][0]:
                    records.append((r["o"], r["e"]))
                    n += 1
        return n

    def close(self) -> None:
        pass


def read_file(path: Path) -> dict[int, list[tuple[int, dict[str, Any] | None, int | None]]]:
    """What :func:`read_to_file` wrote to ``path`` (nothing if it is not there): per
    partition, (offset, record, timestamp) in offset order, each once (a read tried again may
    repeat some); a line cut short ends it."""
    records: dict[int, list[tuple[int, dict[str, Any] | None, int | None]]] = {}
    if not path.exists():
        return records
    with path.open() as f:
        for line in f:
            if not line.endswith("\n"):
                break
            r = json.loads(line)
            got = records.setdefault(r["p"], [])
            if not got or r["o"] > got[-1][0]:
                got.append((r["o"], r["e"], r.get("t")))
    return records


def topic_records(path: Path) -> list[dict[str, Any]]:
    """A team's topic as an :class:`EventReader` wrote it to ``path``:
    ``{"e": the record as JSON, "t": its timestamp}``, each once."""
    return [{"e": e, "t": t} for records in read_file(path).values() for _, e, t in records]


def _decode(value: bytes | None) -> dict[str, Any] | None:
    try:
        decoded = json.loads(value or b"")
    except ValueError:
        return None
    return decoded if isinstance(decoded, dict) else None


def live_runs(events: dict[int, list[tuple[int, dict[str, Any] | None]]]) -> set[str]:
    """Runs materialised and not yet ended, as far as ``events`` go (for the drain)."""
    live: set[str] = set()
    for records in events.values():
        for _, e in records:
            if e is None or "run_id" not in e:
                continue
            kind = e.get("type")
            if kind == "RunMaterialised" or kind == "RunReplayed":
                live.add(e["run_id"])
            elif kind in ("RunCompleted", "RunDeadLettered", "RunCancelled"):
                live.discard(e["run_id"])
    return live


# A node of several workers: these hold for the node when they hold for every worker (the
# least of them); every other sample is summed over the workers.
_ALL_OF = frozenset({"cronlog_node_ready", "cronlog_worker_up"})


def parse_metrics(text: str) -> dict[str, float]:
    """The node's samples by name (and labels); a node of several worker processes labels each
    sample with its worker, and the node's figure is their sum (or least, ``_ALL_OF``)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        m = _METRIC.match(line)
        if m:
            try:
                value = float(m.group(2))
            except ValueError:
                continue
            key = _without_worker(m.group(1))
            if key not in out:
                out[key] = value
            elif key in _ALL_OF:  # the node is ready when every worker is
                out[key] = min(out[key], value)
            else:
                out[key] += value
    return out


def _without_worker(key: str) -> str:
    """``name{a="1",worker="0"}`` as ``name{a="1"}``; ``name{worker="0"}`` as ``name``."""
    name, brace, labels = key.partition("{")
    if not brace:
        return key
    pairs = _LABEL.findall(labels)
    kept = [f'{label}="{value}"' for label, value in pairs if label != "worker"]
    return f"{name}{{{','.join(kept)}}}" if kept else name


def node_health(url: str, metrics_token: str) -> NodeHealth:
    try:
        ready = httpx.get(f"{url}/readyz", timeout=5.0).status_code == 200
        response = httpx.get(
            f"{url}/metrics", headers={"Authorization": f"Bearer {metrics_token}"}, timeout=10.0
        )
        response.raise_for_status()
        return NodeHealth(ready, parse_metrics(response.text))
    except httpx.HTTPError as e:
        return NodeHealth(False, {}, f"{type(e).__name__}: {e}")


def api_runs(url: str, token: str, job_ids: list[str]) -> dict[str, dict[str, Any]]:
    """Every run of ``job_ids`` as the node's read model shows it, by run id."""
    runs: dict[str, dict[str, Any]] = {}
    with httpx.Client(
        base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30.0
    ) as client:
        for job_id in job_ids:
            cursor: str | None = None
            for _ in range(10_000):
                params: dict[str, Any] = {"limit": 200}
                if cursor is not None:
                    params["cursor"] = cursor
                response = client.get(f"/v1/jobs/{job_id}/runs", params=params)
                if response.status_code == 404:
                    break
                response.raise_for_status()
                body = response.json()
                for run in body["runs"]:
                    runs[run["run_id"]] = run
                cursor = body["next_cursor"]
                if cursor is None:
                    break
    return runs


def records(paths: list[Path]) -> tuple[list[dict[str, Any]], int]:
    from tools.chaos.records import read_all

    return read_all(paths)
