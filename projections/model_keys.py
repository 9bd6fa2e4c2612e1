"""The read model's key layout: every key it stores, built and taken apart by the helpers here.

Each index's write (:mod:`projections.model_fold`, :mod:`projections.model_forget`, the
migrations of :mod:`projections.read_model`) and its read (:mod:`projections.model_queries`)
name its keys through the same helper, so the two cannot drift apart. A build that stores other
keys bumps ``projections.history_checkpoint.READ_MODEL_FORMAT``.

Layout (raw mode; ``inv(t)`` is ``2**64 - 1 - t`` as a big-endian u64, so a forward scan is
newest first)::

    j/<job_id>                                -> msgpack JobRecord (the JobView and counters)
    tj/<tenant>/<job_id>                      -> ""   jobs of a tenant, by job id (not deleted)
    tjs/<tenant>/<status>/<job_id>            -> ""   the same, by status (deleted ones too)
    tt/<tenant>/<tag>/<job_id>                -> ""   the same, by tag (a tag has no "/"; not
                                                      deleted)
    dp/<tenant>/<upstream>/<job_id>           -> ""   jobs whose depends_on names the upstream
                                                      job (not deleted)
    jf/<ended_at:u64><job_id>                 -> ""   jobs their partition forgot, by when they
                                                      ended: what forget_jobs looks at
    r/<run_id>                                -> msgpack RunView (with every attempt)
    jr/<job_id>/<inv(scheduled_for)><run_id>  -> ""   runs of a job, newest slot first
    jk/<job_id>/<idempotency_key>             -> run_id   the run a keyed manual trigger made
    rs/<tenant>/<state>/<inv(scheduled_for)><run_id>  -> ""  runs by state (the dead letters)
    c/<tenant>/<state>                        -> u64  runs by state the model holds (after the
                                                      history window: forget_runs)
    cj/<tenant>                               -> u64  jobs not cancelled (the jobs quota)
    sk/<job_id>/<inv(offset)>                 -> msgpack SkipView, newest first
    tf/<tenant>/<minute:u64>                  -> msgpack figures.Minute (projections/figures.py)
    tfp/<tenant>                              -> u64  figures before this minute are deleted
    m/pos/<partition:u32>                     -> u64  next event offset of the partition
    m/job-counts                              -> ""   the cj/ counters are kept (a model
                                                      written before them counts once on open)
    m/unlisted-cancelled                      -> ""   deleted jobs are out of tj/ and tt/ (a
                                                      model written before takes them out once)
    m/unscoped                                -> "1"  some job id is from before ids were
                                                      scoped (core.ids)

``<inv(scheduled_for)><run_id>`` is a run's key in a listing of runs (:func:`run_key`), the
same after ``jr/`` and ``rs/``: a run found in one listing is deleted from the other by it.

A page's cursor is the base64url of the last returned key after the listing's prefix (for
runs: the inverted slot and the run id), so the next page starts right after it, with no
duplicates or gaps however the listing changes in between.
"""

from __future__ import annotations

import base64
import binascii
import struct

import msgspec

from core.errors import InvalidDefinition
from projections.figures import Minute
from projections.views import JobStatusName, JobView, RunView, SkipView

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_TOP = 2**64 - 1

POSITIONS = b"m/pos/"
JOB_COUNTS = b"m/job-counts"
UNLISTED_CANCELLED = b"m/unlisted-cancelled"
UNSCOPED = b"m/unscoped"  # present once a job id from before ids were scoped was folded in
DEPENDANTS = b"dp/"  # dp/<tenant>/<upstream>/<job id>: the jobs that depend on an upstream
STATUSES = b"tjs/"
FORGOTTEN = b"jf/"
RUN_COUNTS = b"c/"
SKIPS = b"sk/"


# -- values ---------------------------------------------------------------------------------


class JobRecord(msgspec.Struct, kw_only=True, gc=False):
    """What ``j/<job_id>`` holds."""

    view: JobView  # ``view.status`` is the derived status, the one the status index holds
    base: JobStatusName  # active, paused or cancelled, as the job events say
    live: int = 0  # runs blocked, pending, running, failed or retrying
    runs: int = 0  # runs ever materialised
    ended_at: int | None = None  # when it ended, once its partition forgot it (JobForgotten)


encoder = msgspec.msgpack.Encoder()
job_decoder = msgspec.msgpack.Decoder(JobRecord)
run_decoder = msgspec.msgpack.Decoder(RunView)
skip_decoder = msgspec.msgpack.Decoder(SkipView)
minute_decoder = msgspec.msgpack.Decoder(Minute)


def u64(n: int) -> bytes:
    """A counter, position or instant as stored: a big-endian u64, so keys sort by it."""
    return _U64.pack(n)


def from_u64(stored: bytes) -> int:
    return int(_U64.unpack(stored)[0])


def inv(t: int) -> bytes:
    return _U64.pack(_TOP - t)


def prefix_end(prefix: bytes) -> bytes:
    """The first key after every key that starts with ``prefix`` (a scan's upper bound)."""
    return prefix[:-1] + bytes([prefix[-1] + 1])


# -- jobs -----------------------------------------------------------------------------------


def job_key(job_id: str | bytes) -> bytes:
    """``j/<job_id>``; ``job_id`` as folded (str) or as an index's key holds it (bytes)."""
    return b"j/" + (job_id if isinstance(job_id, bytes) else job_id.encode())


def tenant_jobs_prefix(tenant: str) -> bytes:
    return f"tj/{tenant}/".encode()


def tenant_job_key(tenant: str, job_id: str) -> bytes:
    return f"tj/{tenant}/{job_id}".encode()


def status_prefix(tenant: str, status: str) -> bytes:
    return f"tjs/{tenant}/{status}/".encode()


def status_key(tenant: str, status: str, job_id: str) -> bytes:
    return f"tjs/{tenant}/{status}/{job_id}".encode()


def status_entry(suffix: bytes) -> tuple[str, str, str]:
    """(tenant, status, job id) of a key after :data:`STATUSES`."""
    tenant, status, job_id = suffix.decode().split("/", 2)
    return tenant, status, job_id


def tag_prefix(tenant: str, tag: str) -> bytes:
    return f"tt/{tenant}/{tag}/".encode()


def tag_key(tenant: str, tag: str, job_id: str) -> bytes:
    return f"tt/{tenant}/{tag}/{job_id}".encode()


def dependants_prefix(tenant: str, upstream: str) -> bytes:
    return DEPENDANTS + f"{tenant}/{upstream}/".encode()


def dependant_key(tenant: str, upstream: str, job_id: str) -> bytes:
    return DEPENDANTS + f"{tenant}/{upstream}/{job_id}".encode()


def forgotten_key(at: int, job_id: str) -> bytes:
    return FORGOTTEN + _U64.pack(max(0, at)) + job_id.encode()


def forgotten_at(suffix: bytes) -> int:
    """When the job of a key after :data:`FORGOTTEN` ended."""
    return int(_U64.unpack(suffix[:8])[0])


def forgotten_job(suffix: bytes) -> str:
    return suffix[8:].decode()


def job_count_key(tenant: str) -> bytes:
    return f"cj/{tenant}".encode()


# -- runs -----------------------------------------------------------------------------------


def run_key(scheduled_for: int, run_id: str) -> bytes:
    """A run's key in a listing of runs (newest slot first); a cursor encodes one."""
    return inv(scheduled_for) + run_id.encode()


def slot_of(listed: bytes) -> int:
    """The slot of a run's key in a listing (:func:`run_key`)."""
    return _TOP - int(_U64.unpack(listed[:8])[0])


def run_id_of(listed: bytes) -> bytes:
    """The run id of a run's key in a listing (:func:`run_key`)."""
    return listed[8:]


def run_record_key(run_id: str | bytes) -> bytes:
    """``r/<run_id>``; ``run_id`` as folded (str) or as an index stores it (bytes)."""
    return b"r/" + (run_id if isinstance(run_id, bytes) else run_id.encode())


def job_runs_prefix(job_id: str) -> bytes:
    return f"jr/{job_id}/".encode()


def job_run_key(job_id: str, scheduled_for: int, run_id: str) -> bytes:
    return job_runs_prefix(job_id) + run_key(scheduled_for, run_id)


def state_prefix(tenant: str, state: str) -> bytes:
    return f"rs/{tenant}/{state}/".encode()


def state_key(run: RunView) -> bytes:
    return state_prefix(run.tenant, run.state) + run_key(run.scheduled_for, run.run_id)


def trigger_key(job_id: str, idempotency_key: str) -> bytes:
    # A job id has no "/", so the key after it may hold any character.
    return f"jk/{job_id}/{idempotency_key}".encode()


def triggers_range(job_id: str) -> tuple[bytes, bytes]:
    """[begin, end) of every key of a manual trigger of ``job_id``, for ``delete_range``."""
    begin = f"jk/{job_id}/".encode()
    return begin, prefix_end(begin)


def run_counts_prefix(tenant: str) -> bytes:
    return f"c/{tenant}/".encode()


def run_count_key(tenant: str, state: str) -> bytes:
    return f"c/{tenant}/{state}".encode()


def tenant_of_count(suffix: bytes) -> str:
    """The tenant of a key after :data:`RUN_COUNTS`."""
    return suffix.decode().partition("/")[0]


# -- skipped slots, figures, positions ------------------------------------------------------


def skips_prefix(job_id: str) -> bytes:
    return f"sk/{job_id}/".encode()


def skip_key(job_id: str, offset: int) -> bytes:
    return SKIPS + job_id.encode() + b"/" + inv(offset)


def figures_prefix(tenant: str) -> bytes:
    return f"tf/{tenant}/".encode()


def figures_kept_key(tenant: str) -> bytes:
    """``tfp/<tenant>``: the team's figures before the minute it holds are deleted."""
    return f"tfp/{tenant}".encode()


def position_key(partition: int) -> bytes:
    return POSITIONS + _U32.pack(partition)


def partition_of(suffix: bytes) -> int:
    """The partition of a key after :data:`POSITIONS`."""
    return int(_U32.unpack(suffix)[0])


# -- cursors --------------------------------------------------------------------------------


def encode_cursor(suffix: bytes) -> str:
    return base64.urlsafe_b64encode(suffix).rstrip(b"=").decode()


def decode_cursor(cursor: str) -> bytes:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        return base64.b64decode(padded, altchars=b"-_", validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidDefinition("cursor", "is not a cursor this listing gave out") from exc
