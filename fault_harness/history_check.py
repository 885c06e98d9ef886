"""Each epoch's meta-store row against its history (``history_row``), after the crashes and recovery.

Every transition of an epoch's row appends its history event in the same database transaction
(``store/history.py``), so a task killed between the state change and anything after it must
leave both or neither. The table checks (``checker``) judge what is visible and never read the meta
store; this one reads only the meta store, and only to hold its two records of the same steps
against each other: a transition that wrote one without the other (a history row written in a
transaction of its own, a status changed by a path that records nothing) shows here, whatever the
table shows.

Per sink, for every epoch with a row or a history event:

- the row has events, the first of them one that creates a row (a persist, or the tombstone of a
  write aborted unpersisted), and no event belongs to an epoch without a row, except a failed
  task's error kept before the epoch had one (design.md D22: recorded with no status);
- every state-bearing event recorded a status its transition can leave (``IMPLIED``), and the last
  of them implies the row as it is: its status, its commit decision, a revision in flight or not,
  its revision number and its write id.

``IMPLIED`` is read off the transitions (``store/sql.py`` and
``history.py``); the events that change no status (a warning, an error, a clean-up, a revision
record carried over by migration 0014) are skipped.

And every epoch that was aborted says why, as an operator reads it (``uncaused``, ``check_causes``):
``eo-sink history --json`` holds, for each abort, a reason other than "an upstream step failed";
an abort by a task of the run names the task that failed, with its error as that task kept it
(design.md D22) or as the abort found it dead.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select

from airflow_provider_exactly_once.core.epochs import EpochEvent, EpochStatus, HistoryEntry
from airflow_provider_exactly_once.core.ports import EpochRecord
from airflow_provider_exactly_once.store.models import EpochHistory
from airflow_provider_exactly_once.store.sql import SqlSinkStateStore
from fault_harness.checker import Anomaly

PENDING, COMMITTED, ABORTED = EpochStatus.PENDING, EpochStatus.COMMITTED, EpochStatus.ABORTED


@dataclass(frozen=True)
class Implied:
    """What a state-bearing event's transition leaves on the row; ``None``: it may leave either."""

    statuses: frozenset[EpochStatus]
    #: ``commit_decided_at`` set.
    decided: bool | None
    #: ``replaces`` set: a revision in flight.
    revising: bool | None


IMPLIED: Mapping[EpochEvent, Implied] = {
    # insert_pending: a new row, no decision.
    EpochEvent.PERSISTED: Implied(frozenset({PENDING}), decided=False, revising=False),
    # replace_write: a Pending row only while undecided, an Aborted one has its decision cleared;
    # ``replaces`` is not touched.
    EpochEvent.REPLACED: Implied(frozenset({PENDING}), decided=False, revising=None),
    # reopen_committed: rows.new_write_values clears the decision; ``replaces`` is not touched.
    EpochEvent.REOPENED: Implied(frozenset({PENDING}), decided=False, revising=None),
    # open_revision: new_write_values, and ``replaces`` names the committed write.
    EpochEvent.REVISION_OPENED: Implied(frozenset({PENDING}), decided=False, revising=True),
    # decide_commit, decide_commits: still Pending, decided; of a first write or a revision.
    EpochEvent.COMMIT_DECIDED: Implied(frozenset({PENDING}), decided=True, revising=None),
    # mark_committed (a revision's clears ``replaces``), mark_committed_batch (never a revision);
    # the single mark does not require a decision, and clears none.
    EpochEvent.COMMITTED: Implied(frozenset({COMMITTED}), decided=None, revising=False),
    # mark_aborted: before or (files lost) after the decision; a revision is refused, but a
    # nothing-written row counts as no revision whatever ``replaces`` holds.
    EpochEvent.ABORTED: Implied(frozenset({ABORTED}), decided=None, revising=None),
    # insert_aborted: a new Aborted row.
    EpochEvent.ABORTED_UNPERSISTED: Implied(frozenset({ABORTED}), decided=False, revising=False),
    # abort_revision: the replaced write Committed again, ``replaces`` cleared, the decision kept.
    EpochEvent.REVISION_GIVEN_UP: Implied(frozenset({COMMITTED}), decided=None, revising=False),
    # record_audit (design.md D23): only on a Pending row while no commit is decided; an audit
    # committed, passed or failed; ``replaces`` is not touched.
    EpochEvent.AUDIT_COMMITTED: Implied(frozenset({PENDING}), decided=False, revising=None),
    EpochEvent.AUDIT_PASSED: Implied(frozenset({PENDING}), decided=False, revising=None),
    EpochEvent.AUDIT_FAILED: Implied(frozenset({PENDING}), decided=False, revising=None),
}
#: The events a row starts with: nothing else is recorded before the row exists...
CREATING = frozenset({EpochEvent.PERSISTED, EpochEvent.ABORTED_UNPERSISTED})
#: ...but a failed task's error, which an epoch keeps whether it has a row or not (D22).
FAILURES = frozenset({EpochEvent.ERROR, EpochEvent.TRY_FAILED})


def check_history_rows(store: SqlSinkStateStore, sink_id: str) -> tuple[list[Anomaly], int]:
    """Read the sink's rows and the history of every epoch with a row or an event, and ``judge``
    them; the anomalies, and how many epochs were judged."""
    rows = {r.epoch: r for status in EpochStatus for r in store.epochs_with_status(sink_id, status)}
    with store.reading(f"listing the epochs with history of sink {sink_id!r}") as session:
        found = session.scalars(select(EpochHistory.epoch).where(EpochHistory.sink_id == sink_id).distinct())
        with_history = {int(e) for e in found}
    events = {epoch: store.history.events(sink_id, epoch) for epoch in sorted(with_history)}
    return judge(rows, events), len(set(rows) | with_history)


def judge(rows: Mapping[int, EpochRecord], events: Mapping[int, Sequence[HistoryEntry]]) -> list[Anomaly]:
    """The ``history_row`` anomalies of one sink: ``rows`` and ``events`` (oldest first) by epoch."""
    anomalies: list[Anomaly] = []
    for epoch in sorted(set(rows) | set(events)):
        row, history = rows.get(epoch), list(events.get(epoch, ()))
        anomalies.extend(Anomaly("history_row", epoch, problem) for problem in _problems(row, history))
    return anomalies


def _problems(row: EpochRecord | None, history: list[HistoryEntry]) -> list[str]:
    history = [e for e in history if not (e.event in FAILURES and e.status is None)]
    if row is None and not history:
        return []
    if row is None:
        kinds = ", ".join(f"{e.event.value} (write {e.write_id})" for e in history)
        return [f"{len(history)} history event(s) but no row: {kinds}"]
    holds = f"the row ({row.status.value}, write {row.write_id}, revision {row.revision})"
    if not history:
        return [f"{holds} has no history event"]
    problems: list[str] = []
    if history[0].event not in CREATING:
        problems.append(
            f"the first event is {history[0].event.value} (id {history[0].id}), not a persist or a tombstone"
        )
    bearing = [e for e in history if e.event in IMPLIED]
    for e in bearing:
        if e.status is None or e.status not in IMPLIED[e.event].statuses:
            problems.append(f"event {e.event.value} (id {e.id}) recorded status {e.status}, which it cannot leave")
    if not bearing:
        return [*problems, f"{holds} has no state-bearing event, only {', '.join(e.event.value for e in history)}"]
    last = bearing[-1]
    implied, said = IMPLIED[last.event], f"its last state-bearing event {last.event.value} (id {last.id})"
    if row.status not in implied.statuses:
        wanted = "/".join(sorted(s.value for s in implied.statuses))
        problems.append(f"{holds} is {row.status.value}, but {said} leaves it {wanted}")
    decided = row.commit_decided_at is not None
    if implied.decided is not None and decided != implied.decided:
        problems.append(
            f"{holds} has {'a' if decided else 'no'} commit decision, but {said} leaves {'one' if implied.decided else 'none'}"
        )
    revising = row.replaces is not None
    if implied.revising is not None and revising != implied.revising:
        problems.append(
            f"{holds} {'has' if revising else 'has no'} revision in flight, but {said} leaves {'one' if implied.revising else 'none'}"
        )
    problems.extend(_write_and_revision(row, history, last, holds, said))
    return problems


def _write_and_revision(
    row: EpochRecord, history: list[HistoryEntry], last: HistoryEntry, holds: str, said: str
) -> list[str]:
    """The row's write and revision number, as the last state-bearing events name them. A given-up
    revision hands the epoch back to the write it replaced (an earlier event's), one revision down;
    every other transition leaves the row its event's write. The batch transitions record no
    revision number, so the number is the last event's that recorded one."""
    problems: list[str] = []
    if last.event is EpochEvent.REVISION_GIVEN_UP:
        earlier = {e.write_id for e in history if e.id < last.id}
        if row.write_id == last.write_id or row.write_id not in earlier:
            problems.append(f"{holds}: {said} gave write {last.write_id} up for a write no earlier event names")
    elif row.write_id != last.write_id:
        problems.append(f"{holds}, but {said} names write {last.write_id}")
    numbered = [(e, e.revision) for e in history if e.event in IMPLIED and e.revision is not None]
    if numbered:
        e, revision = numbered[-1]
        expected = revision - 1 if e.event is EpochEvent.REVISION_GIVEN_UP else revision
        if row.revision != expected:
            problems.append(
                f"{holds}, but event {e.event.value} (id {e.id}, revision {revision}) leaves revision {expected}"
            )
    return problems


#: The abort reason of a run whose failed task said nothing, before design.md D22.
NO_CAUSE = "an upstream step failed"
ABORTS = (EpochEvent.ABORTED.value, EpochEvent.ABORTED_UNPERSISTED.value)


def check_causes(eo_sink: Callable[..., str], store: SqlSinkStateStore, sink_id: str) -> tuple[list[Anomaly], int]:
    """Every epoch of the sink with an abort in its history, read through ``eo-sink history --json``
    (``eo_sink`` runs the CLI): the ``uncaused`` anomalies, and how many epochs were read."""
    with store.reading(f"listing the aborted epochs of sink {sink_id!r}") as session:
        found = session.scalars(
            select(EpochHistory.epoch).where(EpochHistory.sink_id == sink_id, EpochHistory.event.in_(ABORTS)).distinct()
        )
        aborted = sorted({int(e) for e in found})
    anomalies: list[Anomaly] = []
    for epoch in aborted:
        history = json.loads(eo_sink("history", sink_id, str(epoch), "--json"))["history"]
        anomalies.extend(Anomaly("uncaused", epoch, problem) for problem in uncaused(history))
    return anomalies, len(aborted)


def uncaused(history: Sequence[Mapping[str, Any]]) -> list[str]:
    """What is wrong with the causes of the aborts in one epoch's history (its events as
    ``eo-sink history --json`` prints them): an abort without a reason, one that says only that an
    upstream step failed, or an abort by a task whose reason names no task of its run that failed."""
    problems = []
    for n, event in enumerate(history):
        if event["event"] not in ABORTS:
            continue
        reason = event.get("reason") or ""
        said = f"the {event['event']} event of {event['at']} by {event['actor']} {event.get('actor_name')}"
        if not reason or NO_CAUSE in reason:
            problems.append(f"{said} gives no cause: {reason!r}")
            continue
        if event["actor"] != "task":
            continue  # an operator's or recovery's abort: its reason is theirs
        failed = {
            str(e.get("actor_name") or "").rsplit(".", 1)[-1]
            for e in history[:n]
            if e["event"] in (EpochEvent.ERROR.value, EpochEvent.TRY_FAILED.value)
            and e.get("run_id") == event.get("run_id")
        }
        named = any(
            re.search(rf"(^|[\s:,]){re.escape(task)} (failed|was refused|must wait)", reason) for task in failed
        )
        if not named and "without saying why" not in reason:
            problems.append(f"{said} names no task of its run that failed ({sorted(failed)}): {reason!r}")
    return problems
