"""Asking a target what became of an attempt, instead of setting the run aside.

A critical job's attempt that may or may not have taken effect (its call timed out, its lease
ran out mid-call, its executor died after sending) used to be dead-lettered at once as
``outcome_unknown``: running it again could run it twice. A job whose HTTP target names a
``status_url`` says its target can answer "what became of Idempotency-Key K, fencing token T?"
(the SDK's guard serves that answer: ``cronlog_client.target``). Such a run is asked about
instead (``core.decide``):

=======================  ===================================================================
the answer               what follows
=======================  ===================================================================
``succeeded``            the run completes (``RunCompleted`` with ``by_asking``)
``failed``               a retry, as after any failure (or dead, its attempts exhausted)
``never_seen``           the same: the target has fenced T, so the late request is refused
                         should it still arrive, and the retry (a newer token) is safe
``unknown``              dead, ``outcome_unknown``: the target cannot tell
``in_progress``,         asked again after ``ask_delay_ms``, up to ``ASK_LIMIT`` asks in all;
``no_answer``            then dead, ``outcome_unknown``, as before
=======================  ===================================================================

Each ask is a ``RunOutcomeAsked`` event (its number, when the owner's executors ask, and the
deadline ``answer_by``), each answer a ``RunOutcomeAnswered``; an ask unanswered by its deadline
(its node died, its executor hung) is answered ``no_answer`` by the partition's own timer, and
a new owner's executors ask at once whatever is left to ask (the ``ask`` timer of
``core.timers`` is rebuilt from the state).

Worked example, a lease lost while the target was still handling the call::

    t=0     RunOutcomeAsked    ask 1, ask_at 0, answer_by 30 s
    t=0.1   RunOutcomeAnswered ask 1: in_progress
            RunOutcomeAsked    ask 2, ask_at 1.1 s (ASK_BASE_MS after ask 1's answer)
    t=1.2   RunOutcomeAnswered ask 2: succeeded (200)
            RunCompleted       by_asking
"""

from __future__ import annotations

from core.clock import Millis
from core.jobs import HttpTarget, JobSpec

ASK_LIMIT = 8  # asks of one attempt, in all
ASK_BASE_MS = 1_000  # the wait after the first unanswered ask, doubling after each
ASK_CAP_MS = 60_000  # ... up to this
# How long an ask may go unanswered: the executors' call to the status URL gives up well before
# (node.caller.ASK_TIMEOUT_S), so this only counts when nobody answers at all.
ASK_WAIT_MS = 30_000


def can_ask(spec: JobSpec) -> bool:
    """Whether ``spec``'s runs of unknown outcome are asked about rather than set aside: a
    critical job whose target serves the guard's status answer."""
    return spec.critical and isinstance(spec.target, HttpTarget) and bool(spec.target.status_url)


def ask_delay_ms(ask: int) -> Millis:
    """The wait before ask ``ask + 1`` after ask ``ask`` went unanswered (or answered "in
    progress"): 1 s, 2 s, 4 s ... at most a minute; all ``ASK_LIMIT`` asks take about 4
    minutes, besides the answers' own time."""
    return min(ASK_CAP_MS, ASK_BASE_MS << min(ask - 1, 16))
