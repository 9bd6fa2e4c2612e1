"""The archive's format: gzip-compressed JSON lines, one file per range, and a manifest.

Layout in the object store, for the events stream of partition 7::

    events/p00007/00000000000000000000-00000000000000004096.jsonl.gz   offsets [0, 4096)
    events/p00007/00000000000000004096-00000000000000009000.jsonl.gz   offsets [4096, 9000)
    events/p00007/manifest.json

A file holds the records of ``[from_offset, end_offset)`` in offset order, one JSON object a
line. An event (the events stream is JSON) is embedded as it is, byte for byte::

    {"offset":4096,"event":{"type":"JobRegistered","at":1767225600000,"job_id":"j1",...}}

A record whose value is not one JSON document (something other than cronlog wrote it) keeps its
bytes as ``"value_b64"``; a record key, if any, is ``"key_b64"``. ``zcat file | jq .event`` reads
an archive with no cronlog installed. gzip (the standard library's) rather than zstd: no new
dependency, every machine can read it, and the archive is written in the background, where
gzip's cost does not matter (measured in docs/operations.md).

The manifest lists every file: its range, its record count, the ``at`` of its first and last
event, its size and its SHA-256, which a reader checks before it trusts a file::

    {"format": 1, "stream": "events", "partition": 7, "files": [
      {"key": "events/p00007/...-...4096.jsonl.gz", "from_offset": 0, "end_offset": 4096,
       "records": 4096, "first_at_ms": 1767225600000, "last_at_ms": 1767229199000,
       "bytes": 81234, "sha256": "9f2c..."}, ...]}

Ranges are contiguous (a file starts where the one before it ended) except after a ``gap``
entry, which records that ``[from_offset, end_offset)`` left the log before anything archived
it. Offsets within a range need not be contiguous (Kafka's transaction markers take offsets).
"""

from __future__ import annotations

import base64
import gzip
import hashlib
from collections.abc import Sequence

import msgspec

from core.errors import CronlogError
from eventlog.port import Record

FORMAT = 1


class ArchiveDamaged(CronlogError):
    """An archive file or manifest is not what the archive wrote (checksum, format)."""


class ArchivedFile(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    key: str
    from_offset: int
    end_offset: int
    records: int
    first_at_ms: int | None = None
    last_at_ms: int | None = None
    bytes: int = 0
    sha256: str = ""
    gap: bool = False  # a range nobody archived before it left the log: no file


class Manifest(msgspec.Struct, frozen=True, kw_only=True):
    format: int
    stream: str
    partition: int
    files: list[ArchivedFile]


class _Line(msgspec.Struct, kw_only=True, omit_defaults=True):
    offset: int
    event: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)  # empty when absent
    value_b64: str | None = None
    key_b64: str | None = None


class _At(msgspec.Struct):
    at: int | None = None


_manifest_decoder = msgspec.json.Decoder(Manifest)
_line_decoder = msgspec.json.Decoder(_Line)
_at_decoder = msgspec.json.Decoder(_At)
_encoder = msgspec.json.Encoder()


def partition_prefix(stream: str, partition: int) -> str:
    return f"{stream}/p{partition:05d}/"


def manifest_key(stream: str, partition: int) -> str:
    return partition_prefix(stream, partition) + "manifest.json"


def file_key(stream: str, partition: int, from_offset: int, end_offset: int) -> str:
    return f"{partition_prefix(stream, partition)}{from_offset:020d}-{end_offset:020d}.jsonl.gz"


def _is_json_document(value: bytes) -> bool:
    if b"\n" in value or b"\r" in value:
        return False
    try:
        msgspec.json.decode(value)
    except msgspec.DecodeError:
        return False
    return True


def at_of(value: bytes) -> int | None:
    """The ``at`` of an event's JSON (every event has one), None for anything else."""
    try:
        found = _at_decoder.decode(value).at
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return found


def encode_records(records: Sequence[Record]) -> bytes:
    """The compressed file for ``records`` (one partition's, in offset order). Deterministic:
    the same records give the same bytes (gzip's header time is fixed at 0)."""
    lines = []
    for record in records:
        head = b'{"offset":%d' % record.offset
        if record.key is not None:
            head += b',"key_b64":"' + base64.b64encode(record.key) + b'"'
        if _is_json_document(record.value):
            lines.append(head + b',"event":' + record.value + b"}\n")
        else:
            lines.append(head + b',"value_b64":"' + base64.b64encode(record.value) + b'"}\n')
    return gzip.compress(b"".join(lines), compresslevel=6, mtime=0)


def decode_records(data: bytes, partition: int, key: str) -> list[Record]:
    try:
        text = gzip.decompress(data)
    except (OSError, EOFError) as exc:
        raise ArchiveDamaged(f"archive file {key} does not decompress: {exc}") from None
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        try:
            parsed = _line_decoder.decode(line)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise ArchiveDamaged(f"archive file {key} line {number}: {exc}") from None
        if len(parsed.event):
            value = bytes(parsed.event)
        elif parsed.value_b64 is not None:
            value = base64.b64decode(parsed.value_b64)
        else:
            raise ArchiveDamaged(f"archive file {key} line {number} has no event and no value")
        record_key = None if parsed.key_b64 is None else base64.b64decode(parsed.key_b64)
        records.append(Record(partition, parsed.offset, value, record_key))
    return records


def checksum(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def encode_manifest(manifest: Manifest) -> bytes:
    return msgspec.json.format(_encoder.encode(manifest), indent=1)


def decode_manifest(data: bytes, key: str) -> Manifest:
    try:
        manifest = _manifest_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ArchiveDamaged(f"archive manifest {key} does not decode: {exc}") from None
    if manifest.format != FORMAT:
        raise ArchiveDamaged(f"archive manifest {key} has format {manifest.format}, not {FORMAT}")
    return manifest
