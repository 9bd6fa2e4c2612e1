"""Where the replay tools read from: a node's embedded data directory, or a Kafka log.

A data directory, as ``cronlog serve`` lays it out::

    <data>/partitions          the partition count, fixed on the first start
    <data>/log                 the embedded event log (RocksDB)
    <data>/node/state/p<N>     partition N's state store
    <data>/node/read_model     the read model
    <data>/archive             events retention removed from the log (``archive.files``)

The embedded log has one owner: its RocksDB ``LOCK`` refuses a second opener. The tools lean on
that to refuse a directory a node is serving, since rebuilding or verifying under a live owner
would race it. Opening never creates anything: a mistyped path is an error, not a new log.
With ``--kafka`` the log is read from the brokers (a running cluster is fine to read), and
``--data-dir`` names the node directory whose stores ``verify``, ``rebuild`` and ``stats`` use.

Every tool reads the events stream through :class:`archive.reading.ArchivedLog` when there is an
archive (``<data>/archive``, or ``--archive-dir``), so "from offset 0" still means from the
first event ever written after retention has pruned the log.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from core.errors import CronlogError
from eventlog.port import EventLog
from eventlog.rocks import is_damage


class ReplayError(CronlogError):
    """A replay tool refused to go on; the message says why and what to do."""


@dataclass(frozen=True, slots=True)
class Layout:
    """The paths of a node's data directory (see the module docstring)."""

    data_dir: Path

    @property
    def partitions_file(self) -> Path:
        return self.data_dir / "partitions"

    @property
    def log_dir(self) -> Path:
        return self.data_dir / "log"

    @property
    def node_dir(self) -> Path:
        """What ``Node`` calls its data directory: ``RocksStateStore.open`` and
        ``ReadModel.open`` take this one."""
        return self.data_dir / "node"

    def state_dir(self, partition: int) -> Path:
        return self.node_dir / "state" / f"p{partition}"

    @property
    def read_model_dir(self) -> Path:
        return self.node_dir / "read_model"

    @property
    def archive_dir(self) -> Path:
        return self.data_dir / "archive"


def add_source_arguments(parser: argparse.ArgumentParser, default_data_dir: Path) -> None:
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=default_data_dir,
        help=f"the directory `cronlog serve` uses (default {default_data_dir})",
    )
    parser.add_argument("--kafka", metavar="HOST:PORT", help="read the log from this Kafka")
    parser.add_argument("--topic-prefix", default="cronlog", help="with --kafka (default cronlog)")
    parser.add_argument("--partitions", type=int, help="with --kafka: the topics' partition count")
    parser.add_argument(
        "--archive-dir",
        type=Path,
        help="the archive `cronlog serve` writes (default DATA_DIR/archive when it exists)",
    )


def open_log(args: argparse.Namespace) -> EventLog:
    """The log ``args`` name: Kafka with ``--kafka``, else the data directory's embedded log;
    read through the archive when there is one."""
    log = _open_bare(args)
    archive_dir = args.archive_dir or Layout(args.data_dir).archive_dir
    if args.archive_dir is None and (args.kafka or not archive_dir.is_dir()):
        return log
    if not archive_dir.is_dir():
        log.close()
        raise ReplayError(f"--archive-dir {archive_dir} is not a directory")
    from archive.archive import Archive
    from archive.reading import ArchivedLog
    from archive.store import DirectoryStore

    return ArchivedLog(log, Archive(DirectoryStore(archive_dir)))


def _open_bare(args: argparse.Namespace) -> EventLog:
    if args.kafka:
        if args.partitions is None:
            raise ReplayError("--kafka needs --partitions (the topics' partition count)")
        from eventlog.kafka import KafkaLog

        # Broker defaults for anything that would be created: the tools only read topics that
        # a cluster made already (a mismatched partition count is refused by open). The tools
        # only read (num_partitions, read_events, end_offset), so the port's other members,
        # still growing on the Kafka adapter, do not matter here.
        return cast(
            EventLog,
            KafkaLog.open(
                args.kafka,
                args.partitions,
                prefix=args.topic_prefix,
                replication_factor=-1,
                min_insync_replicas=None,
            ),
        )
    return open_embedded(Layout(args.data_dir))


def open_embedded(layout: Layout) -> EventLog:
    from eventlog.embedded import EmbeddedLog

    if not layout.partitions_file.is_file() or not layout.log_dir.is_dir():
        raise ReplayError(
            f"{layout.data_dir} is not a cronlog data directory (no {layout.partitions_file.name} "
            f"file or {layout.log_dir.name}/ directory); pass the --data-dir `cronlog serve` uses"
        )
    try:
        partitions = int(layout.partitions_file.read_text().strip())
    except ValueError as exc:
        raise ReplayError(f"{layout.partitions_file} does not hold a partition count") from exc
    try:
        return EmbeddedLog.open(layout.log_dir, partitions)
    except CronlogError as exc:
        if "already open" in str(exc):
            raise ReplayError(
                f"the event log in {layout.data_dir} is in use: a node (or another tool) is "
                "running on this data directory. Stop it first; the embedded log has one owner."
            ) from exc
        raise


def check_unused(path: Path, what: str) -> None:
    """Refuse when a RocksDB at ``path`` is open elsewhere (its ``LOCK`` is held).

    With Kafka the log itself takes no lock, so the stores are what tells a running node apart.
    """
    if not path.exists():
        return
    from rocksdict import Options, Rdict

    try:
        db = Rdict(str(path), options=Options(raw_mode=True))
    except Exception as exc:
        if "lock" in str(exc).lower():
            raise ReplayError(
                f"{what} {path} is in use: a node is running on this data directory; stop it first"
            ) from exc
        if is_damage(exc):
            return  # not in use, only damaged: the command that reads it says so
        raise
    db.close()
