"""An outcome a pull worker sends again, because the answer to it was lost, is answered as the
first was.

A worker that did not hear the answer to its completion (a timeout, a connection dropped, a
node that died between the append and the answer) sends the same outcome again with the same
fencing token. The partition refuses it and decides nothing (``LeaseLost``: the token holds no
live lease any more, since the outcome ended it), so an outcome is never recorded twice. What
the repeat is answered is decided here, from the run's history, which holds every attempt's
fencing token and how it ended:

- the attempt of that token ended with that very outcome (``succeeded`` after ``succeeded``,
  ``failed`` after ``failed``): the outcome is recorded, and the repeat is answered as the
  first was, 200 with the run (a batch's item: 200). It stays recorded whatever the run did
  since (a retry leased again, a replay), so it is answered so then too;
- anything else is the refusal :func:`api.edge.lease_refusal` says: 409 ``lease_lost`` when the
  attempt ended otherwise (its lease expired, the run was cancelled, the other outcome was
  recorded) or the token is none of the run's attempts'; 404 for a run the team does not have.

Why the history and not the partition's state: a run that succeeded leaves the state, and a
memory of outcomes folded from the events already in the log would make the state an earlier
build stored or snapshotted differ from this build's fold of the same log
(``tests/projections/test_format1.py``, ``tests/corpus``). The history holds the attempts of
every build's log, through the history window (30 days by default).

The history may trail the partition (a repeat sent while the node that recorded the first is
still folding it, or after it died): while the attempt shows no outcome yet, it is asked again
as it folds, for ``CATCH_UP_S`` at most (a batch: once for all its items), then refused as
before.

Worked example: run ``nightly.1796097600000``, attempt 1 leased with token 7, ``succeeded``
recorded and its answer lost. ``{"fencing_token": 7, "status": "succeeded"}`` sent again: the
partition refuses it, the history shows token 7's attempt ``succeeded``, and the answer is 200
with the run. ``"status": "failed"`` with token 7 is 409 ``lease_lost``, and so is token 6 (an
earlier attempt whose lease expired).
"""

from __future__ import annotations

from api.edge import Call, lease_refusal
from api.errors import ApiError
from core.commands import CompleteRun
from core.decide import job_id_of_run
from core.errors import LeaseLost
from projections.views import RunView

CATCH_UP_S = 5.0  # how long a refused outcome waits for the history to show its attempt's end


def recorded_as(run: RunView, command: CompleteRun) -> bool | None:
    """Whether ``run`` holds ``command``'s outcome for its lease: True when the attempt of its
    fencing token ended with that outcome; False when it ended otherwise, or no attempt has
    that token; None while that attempt shows no end yet."""
    for attempt in run.attempts:
        if attempt.fencing_token == command.fencing_token:
            return None if attempt.outcome is None else attempt.outcome == command.outcome
    return False


async def outcome_refused(
    call: Call, command: CompleteRun, err: LeaseLost, wait_s: float | None = None
) -> ApiError | None:
    """What an outcome the partition refused (``err``) answers: None when it repeats the
    outcome recorded for its lease (answer it as that was answered), else the refusal. The
    history is waited for ``wait_s`` at most (``CATCH_UP_S`` when None)."""
    history = call.scheduler.reader
    now: RunView | None = None

    async def settled() -> bool:
        nonlocal now
        now = await history.run(call.tenant, command.run_id)
        return now is None or recorded_as(now, command) is not None

    await history.until(
        job_id_of_run(command.run_id), settled, CATCH_UP_S if wait_s is None else wait_s
    )
    if now is not None and recorded_as(now, command):
        return None
    return lease_refusal(now, command.run_id, err)
