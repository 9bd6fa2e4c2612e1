"""One ``/metrics`` for a node of several worker processes.

Each worker of ``cronlog serve --workers N`` keeps its own metrics (its partitions, its calls,
its requests). A scrape reaches whichever worker the kernel hands the connection to, so that
worker answers for all of them: it asks every sibling for its exposition on the sibling's
Unix socket (:class:`MetricsSocket`, ``metrics-<i>.sock`` in the data directory, mode 0600
in a 0700 directory), adds a ``worker`` label to every sample, its own included, and answers
the union (:class:`MergedMetrics`). Prometheus' ``sum without (worker)`` gives the node's
figure. A sibling that does not answer within :data:`ASK_TIMEOUT_S` (restarting, stopped) is
``cronlog_worker_up{worker} 0`` and its samples are missing from that scrape: never an answer
that hangs or fails as a whole for one worker.

``/readyz`` likewise: the worker a probe reaches is ready when it and every sibling is, each
sibling asked for its own reasons on ``ready-<i>.sock`` (:class:`Readiness`); one that does
not answer within :data:`READY_TIMEOUT_S` makes the node not ready, naming it.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from node.worker import Worker

log = logging.getLogger(__name__)

ASK_TIMEOUT_S = 2.0
READY_TIMEOUT_S = 1.0  # a sibling's readiness: /readyz answers within about this
LABEL = "worker"


class Rendering(Protocol):
    content_type: str

    def render(self) -> bytes: ...


class MetricsSocket(Worker):
    """Serve ``metrics.render()`` on the Unix socket ``path``: a connection gets the text and
    is closed (no request is read: whoever may open the socket may read the metrics)."""

    def __init__(self, metrics: Rendering, path: Path, name: str = "metrics-socket") -> None:
        self._metrics = metrics
        self._path = path
        self._listener: socket.socket | None = None
        super().__init__(name, self._serve, opens=self._open, closes=self._close)

    def _open(self) -> None:
        if self._listener is not None:
            return
        self._path.unlink(missing_ok=True)  # a predecessor's, killed before it removed it
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self._path))  # in the node's data directory, its owner's alone
        os.chmod(self._path, 0o600)
        listener.listen(16)
        listener.settimeout(0.5)
        self._listener = listener

    def _close(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
            self._path.unlink(missing_ok=True)

    def _serve(self, stopping: threading.Event) -> None:
        listener = self._listener
        assert listener is not None
        while not stopping.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            with connection:
                connection.settimeout(ASK_TIMEOUT_S)
                try:
                    connection.sendall(self._metrics.render())
                except OSError as err:  # the asker gave up: its scrape says so
                    log.debug("metrics not delivered on %s: %s", self._path, err)


class Readiness:
    """A worker's own reasons not to be ready (``Node.not_ready``), as JSON, for a
    :class:`MetricsSocket` on ``ready-<i>.sock``: a sibling answering ``/readyz`` asks every
    other worker (:func:`siblings_not_ready`)."""

    content_type = "application/json"

    def __init__(self, not_ready: Callable[[], list[str]]) -> None:
        self._not_ready = not_ready

    def render(self) -> bytes:
        return json.dumps(self._not_ready()).encode()


def siblings_not_ready(siblings: dict[int, Path]) -> Callable[[], list[str]]:
    """Why the sibling workers at ``siblings`` (index -> ready socket) are not ready: each
    one's reasons, or that it did not answer within :data:`READY_TIMEOUT_S`."""

    def reasons() -> list[str]:
        found: list[str] = []
        for index, text in ask_all(siblings, READY_TIMEOUT_S).items():
            if text is None:
                found.append(f"worker {index} does not answer")
                continue
            try:
                said = json.loads(text)
            except ValueError:
                found.append(f"worker {index} answered what is not its readiness")
                continue
            found += [f"worker {index}: {reason}" for reason in said]
        return found

    return reasons


def ask(path: Path, timeout_s: float = ASK_TIMEOUT_S) -> str | None:
    """A sibling's exposition, or None when it does not answer in time."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout_s)
            sock.connect(str(path))
            chunks = []
            while chunk := sock.recv(1 << 16):
                chunks.append(chunk)
    except OSError:
        return None
    return b"".join(chunks).decode()


def ask_all(siblings: dict[int, Path], timeout_s: float = ASK_TIMEOUT_S) -> dict[int, str | None]:
    """Every sibling's answer (index -> :func:`ask`'s), by index, the siblings asked at once:
    siblings that do not answer cost ``timeout_s`` together, not ``timeout_s`` each."""
    if not siblings:
        return {}
    with ThreadPoolExecutor(len(siblings), thread_name_prefix="ask-sibling") as pool:
        asked = {i: pool.submit(ask, path, timeout_s) for i, path in sorted(siblings.items())}
        return {i: future.result() for i, future in asked.items()}


class MergedMetrics:
    """The metrics of worker ``index`` and of its ``siblings`` (index -> socket path), each
    sample labelled with its worker."""

    def __init__(self, own: Rendering, index: int, siblings: dict[int, Path]) -> None:
        self.content_type = own.content_type
        self._own = own
        self._index = index
        self._siblings = siblings

    def render(self) -> bytes:
        texts: dict[int, str | None] = {self._index: self._own.render().decode()}
        texts.update(ask_all(self._siblings))
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Merged(texts))
        return generate_latest(registry)


class _Merged:
    def __init__(self, texts: dict[int, str | None]) -> None:
        self._texts = texts

    def collect(self) -> Iterable[Metric]:
        return merge(self._texts)


def merge(texts: dict[int, str | None]) -> Sequence[Metric]:
    """The families of every worker's exposition, each sample labelled with its worker, and
    ``cronlog_worker_up`` (0 for a worker whose text is None)."""
    up = GaugeMetricFamily(
        "cronlog_worker_up", "1 when the worker answered this scrape, else 0.", labels=[LABEL]
    )
    families: dict[str, Metric] = {}
    for index, text in sorted(texts.items()):
        up.add_metric([str(index)], 0.0 if text is None else 1.0)
        if text is None:
            continue
        for family in text_string_to_metric_families(text):
            merged = families.get(family.name)
            if merged is None:
                merged = Metric(family.name, family.documentation, family.type, family.unit)
                families[family.name] = merged
            for sample in family.samples:
                labels = {**sample.labels, LABEL: str(index)}
                merged.samples.append(sample._replace(labels=labels))
    return [up, *families.values()]
