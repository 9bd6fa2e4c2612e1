"""Replay and backfill tooling over the log: dump, verify, rebuild, backfill, stats
(``python -m tools.replay``; ``docs/replay.md``)."""
