"""A partition's snapshot: its state store's keys and values as of an offset, in one blob.

Why the store's key/values and not ``Partition.snapshot()``: the store already holds every job
and run encoded, consistent with its offset, and RocksDB gives a point-in-time view of it for
free. So the owner's pause to take a snapshot is opening that view (microseconds); reading,
compressing and writing it happen on another thread while the owner goes on deciding. And a
new owner writes the restored key/values into its own store as they are, without re-encoding:
its store is byte-identical to the one the snapshot was taken from (``state_store``'s
invariant 4 holds across a takeover).

Layout (format 1)::

    b"CLSN"  format:u8  header_len:u32  header (msgpack)  payload

    header   state_format   core.partition.SNAPSHOT_FORMAT of the build that wrote it
             partition      the partition
             offset         the next event offset: every event below it is in the state
             taken_at       the owner's clock when the view was opened (ms)
             items          how many key/values
             raw_bytes      the payload's size before compression
             crc32          of the payload as stored
    payload  zlib (level 1) of msgpack [[key, value], ...] in key order

``state_format`` is the version of the encoded jobs and runs inside: a build refuses a
snapshot of a format it does not read (``core.partition.READABLE_SNAPSHOT_FORMATS``) as
:class:`SnapshotUnusable`, and recovery falls back to the log, so changing the state types
means bumping that number. Format 2 holds each job's definition encoded
(``core.state.hold_spec``); a format-1 snapshot (a node upgraded in place, or a snapshot
another node of the previous build wrote) is still read: ``state_store.build`` converts its
jobs (``core.state.JobStateV1``), and the store it is restored into holds them converted.

zlib level 1 turns 100,000 synthetic jobs' 60 MB into under 2 MB in about 0.3 s (on another
thread: zlib lets go of the GIL while it compresses); reading it back costs about as much.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass

import msgspec

from core.clock import Millis
from core.errors import CronlogError
from core.partition import READABLE_SNAPSHOT_FORMATS, SNAPSHOT_FORMAT

MAGIC = b"CLSN"
FORMAT = 1
_U32 = struct.Struct(">I")


class SnapshotUnusable(CronlogError):
    """A snapshot that cannot be restored by this build: damaged, of another format, or of
    another partition. Recovery passes over it to the log."""


class _Header(msgspec.Struct, array_like=True):
    state_format: int
    partition: int
    offset: int
    taken_at: int
    items: int
    raw_bytes: int
    crc32: int


@dataclass(frozen=True, slots=True)
class Snapshot:
    partition: int
    offset: int
    taken_at: Millis
    items: list[tuple[bytes, bytes]]  # a state store's (``projections.state_store.build``)


_header_encoder = msgspec.msgpack.Encoder()
_header_decoder = msgspec.msgpack.Decoder(_Header)
_items_decoder = msgspec.msgpack.Decoder(list[tuple[bytes, bytes]])


def encode(
    partition: int, offset: int, taken_at: Millis, items: Iterable[tuple[bytes, bytes]]
) -> bytes:
    """The blob of a snapshot (its items in the order given; a store gives key order)."""
    pairs = list(items)
    raw = _header_encoder.encode(pairs)
    payload = zlib.compress(raw, 1)
    header = _header_encoder.encode(
        _Header(
            SNAPSHOT_FORMAT, partition, offset, taken_at, len(pairs), len(raw), zlib.crc32(payload)
        )
    )
    return MAGIC + bytes([FORMAT]) + _U32.pack(len(header)) + header + payload


def read_header(data: bytes) -> tuple[int, int, Millis]:
    """(partition, offset, taken_at) of a blob, without decompressing it."""
    header, _ = _split(data)
    return header.partition, header.offset, header.taken_at


def decode(data: bytes, partition: int | None = None) -> Snapshot:
    """The snapshot in ``data``; SnapshotUnusable if it is damaged, of another format, or (when
    ``partition`` is given) of another partition."""
    header, payload = _split(data)
    if partition is not None and header.partition != partition:
        raise SnapshotUnusable(
            f"snapshot of partition {header.partition} found where {partition}'s belongs"
        )
    if zlib.crc32(payload) != header.crc32:
        raise SnapshotUnusable(
            f"snapshot of partition {header.partition} at offset {header.offset}: checksum mismatch"
        )
    try:
        raw = zlib.decompress(payload)
        items = _items_decoder.decode(raw)
    except (zlib.error, msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise SnapshotUnusable(
            f"snapshot of partition {header.partition} at offset {header.offset}: {exc}"
        ) from exc
    if len(raw) != header.raw_bytes or len(items) != header.items:
        raise SnapshotUnusable(
            f"snapshot of partition {header.partition} at offset {header.offset}: "
            f"{len(items)} items in {len(raw)} bytes, the header says {header.items} in "
            f"{header.raw_bytes}"
        )
    return Snapshot(header.partition, header.offset, header.taken_at, items)


def _split(data: bytes) -> tuple[_Header, bytes]:
    if data[:4] != MAGIC or len(data) < 9:
        raise SnapshotUnusable("not a cronlog snapshot")
    if data[4] != FORMAT:
        raise SnapshotUnusable(f"snapshot format {data[4]}, this build reads {FORMAT}")
    (length,) = _U32.unpack_from(data, 5)
    try:
        header = _header_decoder.decode(data[9 : 9 + length])
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise SnapshotUnusable(f"snapshot header: {exc}") from exc
    if header.state_format not in READABLE_SNAPSHOT_FORMATS:
        raise SnapshotUnusable(
            f"snapshot of partition {header.partition} holds state format "
            f"{header.state_format}, this build reads {READABLE_SNAPSHOT_FORMATS}"
        )
    return header, data[9 + length :]
