"""Where a job's memory goes in a running node: a breakdown by structure, per job.

    python -m bench.memory --data-dir DIR [--jobs 50000]

Opens a node in this process on ``DIR`` (a data directory as ``bench.restart`` builds it: the
embedded log in ``DIR/log``, the node's stores in ``DIR/node``), waits until it is ready, then:

- walks the partitions' structures and sums the bytes each holds (``sys.getsizeof`` over the
  object graph, every object counted once): the jobs (``JobState``), their definitions
  (``JobSpec``: target, payload, strings), the live runs, the timing wheel's timers and buckets,
  the derived ``ready`` index;
- takes a ``tracemalloc`` snapshot of what Python allocated while the node opened, grouped by
  the source file that allocated it (so what lives outside the partition state shows too: the
  read model's followers, the API, caches);
- reads the process's RSS before the node opened and after, so what Python did not allocate
  (RocksDB's block caches and memtables, the allocator's slack) is the difference.

Prints the table and appends a JSON line to bench/results/memory.jsonl.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
import tracemalloc
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec

from bench.common import append_result, loadavg, log, rss_bytes, stamp

RAW_OBJECT = 48  # PyObject header, buffer pointer, length, and the reference to its bytes


def deep_size(root: object, seen: set[int]) -> int:
    """Bytes held by ``root`` and everything it reaches that ``seen`` does not hold yet."""
    total = 0
    stack = [root]
    while stack:  # bounded by the object graph: each object is visited once
        obj = stack.pop()
        if id(obj) in seen or obj is None or isinstance(obj, (bool, type)):
            continue
        seen.add(id(obj))
        if isinstance(obj, msgspec.Raw):
            # Its own __sizeof__ is wrong; it is a small object holding a bytes object.
            total += RAW_OBJECT + sys.getsizeof(b"") + len(memoryview(obj))
            continue
        total += sys.getsizeof(obj)
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(obj)
        elif isinstance(obj, msgspec.Struct):
            stack.extend(getattr(obj, f) for f in obj.__struct_fields__)
        elif not isinstance(obj, (str, bytes, int, float)):
            for cls in type(obj).__mro__:
                slots = cls.__dict__.get("__slots__", ())
                stack.extend(getattr(obj, s) for s in slots if hasattr(obj, s))
            if hasattr(obj, "__dict__"):
                stack.append(vars(obj))
    return total


def partition_breakdown(cores: Iterable[Any]) -> dict[str, int]:
    """Bytes per structure of the partitions, each object counted where it is first reached."""
    seen: set[int] = set()
    out = {"job_specs": 0, "jobs_other": 0, "jobs_index": 0, "runs": 0, "ready_index": 0,
           "wheel": 0, "specs_decoded": 0}  # fmt: skip
    for core in cores:
        state = core.state
        # The specs first, so a job's own size excludes its definition: as the job holds it
        # (encoded, since the held definitions; reading ``spec`` would decode it).
        for job in state.jobs.values():
            held = getattr(job, "encoded_spec", None)
            out["job_specs"] += deep_size(job.spec if held is None else held, seen)
        for job in state.jobs.values():
            out["jobs_other"] += deep_size(job, seen)
        out["jobs_index"] += deep_size(state.jobs, seen)
        out["runs"] += deep_size(state.runs, seen)
        out["ready_index"] += deep_size(state.ready, seen)
        out["wheel"] += deep_size(core.wheel, seen)
        # The slots a recovery parked (``core.partition``): timers too, held outside the wheel.
        out["wheel"] += deep_size(getattr(core, "_parked", None), seen)
    # The definitions decoded and kept for reading again (``core.state.held_spec``): bounded.
    from core import state as core_state

    kept = [getattr(core_state, name, None) for name in ("_young", "_old")]
    out["specs_decoded"] += deep_size(kept, seen)
    return out


def by_file(snapshot: tracemalloc.Snapshot, top: int = 15) -> list[tuple[str, int]]:
    root = str(Path(__file__).resolve().parent.parent)
    stats = snapshot.statistics("filename")
    rows = []
    for stat in stats[:top]:
        name = stat.traceback[0].filename
        rows.append((name.replace(root + "/", ""), stat.size))
    return rows


def measure(data_dir: Path, jobs: int, settle_s: float, trace: bool = True) -> dict[str, Any]:
    from eventlog.embedded import EmbeddedLog
    from node.node import Node

    gc.collect()
    rss_before, _ = rss_bytes_self()
    if trace:
        tracemalloc.start(1)
    log_ = EmbeddedLog.open(data_dir / "log", 8)
    node = Node(log_, data_dir / "node", node_id="memory")
    began = time.monotonic()
    node.start()
    try:
        if not node.wait_ready(600):
            raise RuntimeError("the node did not become ready in 600 s")
        ready_s = time.monotonic() - began
        time.sleep(settle_s)
        gc.collect()
        snapshot = tracemalloc.take_snapshot() if trace else None
        traced, _ = tracemalloc.get_traced_memory() if trace else (0, 0)
        tracemalloc.stop()
        rss_after, _ = rss_bytes_self()
        rocks = rocks_memory(node)
        trimmed = malloc_trim()
        rss_trimmed, _ = rss_bytes_self()
        cores = [runner.core for runner in node._runners.values()]
        counted = sum(len(c.state.jobs) for c in cores)
        parts = partition_breakdown(cores)
    finally:
        node.stop()
        log_.close()
    per_job = {k: round(v / max(1, counted)) for k, v in parts.items()}
    files = by_file(snapshot) if snapshot is not None else []
    return {
        "jobs": jobs,
        "jobs_in_state": counted,
        "ready_s": round(ready_s, 2),
        "rss_delta_per_job": round((rss_after - rss_before) / max(1, jobs)),
        "python_traced_per_job": round(traced / max(1, jobs)),
        "outside_python_per_job": round((rss_after - rss_before - traced) / max(1, jobs)),
        "rss_per_job_after_malloc_trim": round((rss_trimmed - rss_before) / max(1, jobs))
        if trimmed
        else None,
        "rocksdb_bytes_per_job": {k: round(v / max(1, jobs)) for k, v in rocks.items()},
        "partition_state_per_job": per_job,
        "partition_state_total_per_job": sum(per_job.values()),
        "traced_by_file_per_job": {name: round(size / max(1, jobs)) for name, size in files},
    }


def rocks_memory(node: Any) -> dict[str, int]:
    """What RocksDB says it holds: the process's one block cache (the memtables charged to it,
    ``eventlog.rocks``), and each kind of store's index and filter blocks."""
    from eventlog import rocks

    out: dict[str, int] = {}
    if hasattr(rocks, "cache_usage"):  # a build before the one budget has none to report
        out["shared block cache (memtables included)"] = rocks.cache_usage()
    stores = [r._store._db for r in node._runners.values() if r._store is not None]
    for name, handles in (("state stores", stores), ("read model", [node._history._db])):
        out[f"{name}: table readers"] = sum(
            db.property_int_value("rocksdb.estimate-table-readers-mem") or 0 for db in handles
        )
    return out


def malloc_trim() -> bool:
    """Give the allocator's free pages back (glibc), so what RSS still holds is in use."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if name is None:
        return False
    return bool(ctypes.CDLL(name).malloc_trim(0) or True)


def rss_bytes_self() -> tuple[int, int]:
    import os

    return rss_bytes(os.getpid())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--settle", type=float, default=2.0)
    parser.add_argument(
        "--no-trace", action="store_true", help="without tracemalloc (whose records cost RSS)"
    )
    args = parser.parse_args()
    load = loadavg()
    figures = measure(args.data_dir, args.jobs, args.settle, trace=not args.no_trace)
    for key, value in figures.items():
        if isinstance(value, dict):
            log(f"{key}:")
            for name, size in value.items():
                log(f"    {size:>8,} B  {name}")
        else:
            log(f"{key}: {value}")
    append_result("memory", {"timestamp": stamp(), "scenario": "memory", "jobs": args.jobs,
                             "load_at_start": load, "figures": figures})  # fmt: skip


if __name__ == "__main__":
    main()
