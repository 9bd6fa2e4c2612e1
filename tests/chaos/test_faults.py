"""The fault plan: drawn from the seed alone, every kind once when asked, and only faults that
touch different things combined."""

from __future__ import annotations

from collections import Counter

from tools.chaos import faults as fl

NODES = ["n1", "n2", "n3"]


def plan(seed: int, **kw: object) -> fl.Plan:
    args: dict[str, object] = dict(nodes=NODES, partitions=6, workers=2, episodes=40, combine_p=0.5)
    args.update(kw)
    return fl.plan(seed, list(fl.KINDS), **args)  # type: ignore[arg-type]


def test_a_seed_replays_the_same_plan_and_another_seed_does_not() -> None:
    assert plan(7).describe() == plan(7).describe()
    assert plan(7).describe() != plan(8).describe()


def test_each_once_uses_every_kind_exactly_once() -> None:
    for seed in range(20):
        p = plan(seed, each_once=True, combine_p=1.0)
        kinds = Counter(f.kind for e in p.episodes for f in e.faults)
        assert kinds == Counter(fl.KINDS), (seed, kinds)
        assert len(p.episodes) < len(fl.KINDS)  # some were combined


def test_combined_faults_never_touch_the_same_thing() -> None:
    for seed in range(50):
        for episode in plan(seed, combine_p=1.0).episodes:
            if len(episode.faults) == 2:
                a, b = episode.faults
                assert not a.resources() & b.resources(), (a, b)
                assert {a.kind, b.kind} != {"broker_leader", "broker_controller"}
                if "node:*" in a.resources() | b.resources():
                    assert not any(
                        r.startswith("node:") and r != "node:*"
                        for r in a.resources() | b.resources()
                    )


def test_a_pause_outlasts_the_session_timeout() -> None:
    pauses = [
        f for s in range(30) for e in plan(s).episodes for f in e.faults if f.kind == "node_pause"
    ]
    assert pauses and all(f.params["stopped_s"] > fl.SESSION_TIMEOUT_S for f in pauses)
