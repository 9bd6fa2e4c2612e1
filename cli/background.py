"""What ``cronlog serve`` runs beside the node: services it adds to the node's supervisor.

:func:`services` says which, in the order they start (after the node's own; they stop before
them, in the reverse order):

- ``log-watch`` (embedded log): waits for a read to find the log damaged, then stops serving
  (``serve`` exits 3). Required: a node that would not notice damage is not ready.
- ``log-check`` (embedded log, unless ``--skip-log-check``): the start's check of what was
  written since the previous check, once the partitions have recovered. A required one-shot
  service: the node is ready only once it is done. A check that fails for another reason than
  damage ends its thread; the supervisor says so and runs it again after its backoff.
- ``log-check-serving`` (embedded log, with the start's check): once the start's check is done,
  every ``LOG_CHECK_EVERY_S`` the same check of what was appended since, so the next start's
  check reads seconds of records, not everything a long run appended. Not required: a check
  that finds damage fails the log, and the log watch stops the node as for any read.
- ``retention``: the embedded log's archive-then-prune loop, or on Kafka the loop that trims
  the commands topic and archives (:mod:`node.retention`).
- ``gc-freeze``: once the node is first ready, moves what recovery loaded (it lives as long as
  the node) out of the collector's sight and hands freed pages back to the system. A one-shot
  service that completes, not folded into the log check: on Kafka, or with
  ``--skip-log-check``, there is no check to fold it into, and it must wait for readiness as a
  whole (every partition recovered), which only the node knows. Not required: readiness does
  not wait for it (it waits for readiness).
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from node.worker import OneShot, Service, Worker

if TYPE_CHECKING:
    from archive.archive import Archive
    from eventlog.port import EventLog
    from eventlog.remote import RemoteLog
    from eventlog.retention import Retention
    from node.node import Node
    from node.retention import EmbeddedRetention, KafkaRetention

log = logging.getLogger("cronlog")

LOG_CHECK_AFTER_S = 60.0  # the start's check waits this long at most for the partitions
LOG_CHECK_EVERY_S = 10.0  # then what was appended is checked this often while serving
FREEZE_WITHIN_S = 600.0  # no freeze for a node not ready by then
LOOK_S = 1.0  # how long a wait lasts before it looks whether its service is stopping


def services(
    args: argparse.Namespace,
    raw_log: EventLog,
    archive: Archive | None,
    retention: Retention,
    node: Node,
    server: Any,
    damaged: list[BaseException],
) -> list[Service]:
    """serve's services, in the order they start (``damaged`` receives the damage the log
    watch saw; ``server.should_exit`` is how it stops serving)."""
    from eventlog.embedded import EmbeddedLog

    found: list[Service] = []
    if isinstance(raw_log, EmbeddedLog):
        found.append(log_watch(raw_log, server, damaged))
        if not args.skip_log_check:
            start_check = log_check(raw_log, node, full=args.full_log_check)
            found.append(start_check)
            found.append(log_check_serving(raw_log, start_check))
    if getattr(args, "worker_index", None) is not None:
        from cli.workers import (
            FloorReport,
            all_joined,
            all_up,
            floor_path,
            metrics_path,
            ready_path,
        )
        from node.worker_metrics import MetricsSocket, Readiness, siblings_not_ready

        # A worker process: the parent checks, watches and prunes the log; the worker says
        # what retention must keep for it, and stops should the parent go.
        index = args.worker_index
        found.append(parent_watch(server))
        found.append(MetricsSocket(node.metrics, metrics_path(args.data_dir, index)))
        # /readyz answers for every worker of the node (node.worker_metrics)
        readiness = Readiness(node.not_ready)
        found.append(MetricsSocket(readiness, ready_path(args.data_dir, index), "ready-socket"))
        node.siblings_not_ready = siblings_not_ready(
            {i: ready_path(args.data_dir, i) for i in range(args.workers) if i != index}
        )
        if args.kafka:  # each worker is a node of the brokers' group; the brokers prune
            found.append(all_up(args.data_dir, index, args.workers))
        else:
            found.append(all_joined(cast("RemoteLog", raw_log), args.workers))
            found.append(FloorReport(node, floor_path(args.data_dir, index)))
    loop = retention_loop(args, raw_log, archive, retention, node)
    if loop is not None:
        found.append(loop)
    found.append(gc_freeze(node))
    return found


def log_watch(log_: Any, server: Any, damaged: list[BaseException]) -> Worker:
    """Wait for a read to find the log damaged; then stop serving (``serve`` exits 3)."""

    def watch(stopping: threading.Event) -> None:
        while not stopping.is_set():
            damage = log_.wait_damaged(LOOK_S)
            if damage is not None:
                damaged.append(damage)
                server.should_exit = True
                return
            if log_.closed:
                return

    return Worker("log-watch", watch, required=True)


def log_check(log_: Any, node: Node, *, full: bool) -> OneShot:
    """The start's check of the embedded log, once the partitions have recovered (or after
    ``LOG_CHECK_AFTER_S`` whatever they do): their recovery reads only the tail after a
    snapshot and checks what it reads, so the first fires need not wait for a check whose
    length grows with everything appended since the previous start. Readiness waits for it;
    damage found fails the log, and the log watch stops the node (exit 3)."""

    def check(stopping: threading.Event) -> bool:
        give_up_at = time.monotonic() + LOG_CHECK_AFTER_S
        while not node.wait_recovered(LOOK_S):
            if stopping.is_set():
                return False
            if time.monotonic() >= give_up_at:
                break
        if stopping.is_set():
            return False
        return _checked(log_, lambda: check_log(log_, full=full))

    return OneShot("log-check", check, required=True)


def log_check_serving(
    log_: Any, start_check: OneShot, every_s: float = LOG_CHECK_EVERY_S
) -> Worker:
    """Once ``start_check`` is done, check what the log appended since the previous check
    every ``every_s`` (where a check ended is kept in the log, so the next start's check
    begins there). Damage found fails the log: the log watch stops the node (exit 3)."""

    def check(stopping: threading.Event) -> None:
        while not start_check.done.wait(LOOK_S):
            if stopping.is_set():
                return
        while not stopping.wait(every_s):
            if not _checked(log_, lambda: log_.verify(since_last=True)):
                return

    return Worker("log-check-serving", check)


def log_check_now(log_: Any, *, full: bool) -> OneShot:
    """The start's check of the embedded log in the parent of worker processes (which has no
    partitions to wait for); damage found fails the log, and the parent's log watch stops every
    worker (exit 3)."""

    def check(stopping: threading.Event) -> bool:
        return _checked(log_, lambda: check_log(log_, full=full))

    return OneShot("log-check", check, required=True)


def _checked(log_: Any, check: Callable[[], object]) -> bool:
    """Run one check of the log: False once the log has failed (damage: the log watch stops
    the node and serve exits 3) or was closed meanwhile; any other error is raised, and the
    supervisor says so and starts the check's thread again after its backoff."""
    from core.errors import LogCorrupted

    try:
        check()
    except LogCorrupted:
        return False
    except Exception:
        if log_.closed:
            return False
        raise
    return True


def parent_watch(server: Any) -> Worker:
    """A worker process's watch of its parent: should the parent end (even killed), the worker
    stops serving; nothing is left running on a log nobody serves."""
    from cli.workers import parent_pid

    parent = parent_pid()

    def watch(stopping: threading.Event) -> None:
        while not stopping.wait(LOOK_S):
            if os.getppid() != parent:
                log.error("the parent process %d is gone: stopping", parent)
                server.should_exit = True
                return

    return Worker("parent-watch", watch, required=True)


def check_log(log_: Any, *, full: bool) -> None:
    """Check the embedded log before serving anything from it: what was written since the
    previous check, or all of it (``--full-log-check``); ``--skip-log-check`` skips this, and
    reads still check what they read."""
    started = time.monotonic()
    records = log_.verify(since_last=not full)
    log.info(
        "checked the event log: %d records%s in %.2f s",
        records,
        "" if full else " written since the previous check",
        time.monotonic() - started,
    )


def retention_loop(
    args: argparse.Namespace,
    raw_log: EventLog,
    archive: Archive | None,
    retention: Retention,
    node: Node,
) -> EmbeddedRetention | KafkaRetention | None:
    """What archives and prunes: the embedded log's retention loop, or in Kafka mode (where
    the brokers prune events by time and size) the loop that trims the commands topic and
    archives, if there is an archive."""
    from archive.archiver import Archiver
    from eventlog.embedded import EmbeddedLog
    from eventlog.kafka import KafkaLog
    from node.retention import EmbeddedRetention, KafkaRetention, RetentionMetrics, gap_counter

    metrics = RetentionMetrics(node.metrics.registry)
    archiver = None if archive is None else Archiver(raw_log, archive, on_gap=gap_counter(metrics))
    interval_s = args.retention_check / 1000
    if isinstance(raw_log, EmbeddedLog):
        if archiver is None:
            print(
                "cronlog: --no-archive: retention deletes events for good; history and replay"
                " from offset 0 start at the log's start",
                flush=True,
            )
        else:
            kept = (
                "every event"
                if retention.retention_ms is None
                else f"{retention.retention_ms / 86_400_000:g} days of events"
            )
            print(
                f"cronlog: the log keeps {kept}{_describe_bytes(retention.retention_bytes)};"
                f" older ones are archived in {args.archive_dir or args.data_dir / 'archive'}",
                flush=True,
            )
        return EmbeddedRetention(
            raw_log,
            retention,
            node.recovery_floor,
            metrics,
            archiver=archiver,
            interval_s=interval_s,
        )
    if not isinstance(raw_log, KafkaLog):
        return None
    if archiver is None:
        print(
            "cronlog: no --archive-dir: events the brokers' retention removes"
            f" ({_describe_ms(retention.retention_ms)}) are gone for good",
            flush=True,
        )
    return KafkaRetention(
        raw_log,
        node.owned,
        metrics,
        archiver=archiver,
        retention_ms=retention.retention_ms,
        max_delay_ms=args.archive_delay,
        interval_s=interval_s,
    )


def gc_freeze(node: Node) -> OneShot:
    """Once the node is first ready, keep the collector off what recovery loaded (it lives as
    long as the node) and hand the pages recovery freed back to the system."""

    def freeze(stopping: threading.Event) -> bool:
        give_up_at = time.monotonic() + FREEZE_WITHIN_S
        while not node.wait_ready(LOOK_S):
            if stopping.is_set() or time.monotonic() >= give_up_at:
                return False
        gc.freeze()
        _release_free_memory()
        return True

    return OneShot("gc-freeze", freeze)


def _release_free_memory() -> None:
    """Hand the pages a recovery freed back to the system (glibc keeps them otherwise: each
    partition's thread decoded its store in an arena of its own). A no-op elsewhere."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if name is None:
        return
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None)
    if trim is not None:
        trim(0)


def _describe_ms(ms: int | None) -> str:
    return "never" if ms is None else f"after {ms / 86_400_000:g} days"


def _describe_bytes(size: int | None) -> str:
    return "" if size is None else f" (at most {size / 2**30:g} GiB a partition)"
