"""The chaos harness and its checker (issue 12; ``docs/reliability.md`` tells what they found).

``python -m tools.chaos run --duration 600 --seed N`` starts a real cluster on loopback (three
KRaft brokers, three cronlog nodes, a recording HTTP target, pull workers), runs a workload of
cron and one-shot jobs through the HTTP API, strikes faults at seeded moments, drains, and
checks the whole history: :mod:`tools.chaos.run` (the run), :mod:`tools.chaos.faults` (the
faults), :mod:`tools.chaos.checker` (what must hold), :mod:`tools.chaos.gather` (reading the
history with clients independent of cronlog's).
"""
