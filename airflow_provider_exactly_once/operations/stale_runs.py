"""Runs that will never finish: an unsettled epoch whose DAG run Airflow still calls running.

A killed ``airflow dags test`` or a lost worker can leave a run ``running`` for good, its epoch
unsettled and, with ``max_active_runs`` reached, the DAG silently stuck; ``eo-sink status`` and the
sink page name such a run and how to fail it (``StaleRunView``). Airflow's database is asked here
only, and only when there is a candidate; one that cannot be asked is said, never an error. The
criteria: docs/cli.md, "Runs that will never finish".
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from airflow_provider_exactly_once.core.epochs import AuditStage, CheckpointStatus
from airflow_provider_exactly_once.core.errors import ExactlyOnceError, InvalidSinkConfig, mask_userinfo
from airflow_provider_exactly_once.defaults import CONFIG_SECTION, DEFAULT_STALE_RUN
from airflow_provider_exactly_once.operations.views import RESERVED, RunCheck, StaleRunView, interval_start
from airflow_provider_exactly_once.store.queries import UNPARSABLE, pending_runs

if TYPE_CHECKING:
    from airflow_provider_exactly_once.operations.reads import SinkReads

#: ``[exactly_once] stale_run_minutes``: how long an unsettled epoch's run may show no live task.
STALE_RUN_OPTION = "stale_run_minutes"
#: Task states of a run that is alive whatever its timestamps: waiting for a slot, a trigger, a
#: person, a retry or a reschedule.
LIVE_STATES = frozenset(
    {"queued", "scheduled", "deferred", "awaiting_input", "up_for_retry", "up_for_reschedule", "restarting"}
)


def threshold_of(value: object) -> timedelta:
    """``[exactly_once] stale_run_minutes`` as a duration: a number of minutes greater than 0 (unset:
    the default), refused by name otherwise."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return DEFAULT_STALE_RUN
    try:
        minutes = float(str(value).strip())
    except ValueError:
        minutes = float("nan")
    if not minutes > 0 or minutes == float("inf"):
        raise InvalidSinkConfig(
            f"[{CONFIG_SECTION}] {STALE_RUN_OPTION} = {value!r}: give a number of minutes greater than 0 "
            f"(default {DEFAULT_STALE_RUN.total_seconds() / 60:g})"
        )
    return timedelta(minutes=minutes)


@dataclass(frozen=True)
class Candidate:
    """An unsettled epoch untouched for longer than the threshold, and the run that wrote it
    (its DAG ``None`` when the meta store cannot tell: a reservation names its run only)."""

    sink_id: str
    epoch: int
    status: str
    dag_id: str | None
    run_id: str
    range: str | None = None


@dataclass(frozen=True)
class RunActivity:
    """A DAG run as Airflow has it: its state, its newest task activity, whether a task is alive."""

    dag_id: str
    run_id: str
    state: str
    last_activity: datetime | None
    alive: bool


def check(
    reads: SinkReads, threshold: timedelta, *, sink_id: str | None = None, dag_ids: Collection[str] | None = None
) -> RunCheck:
    """The stale runs among the unsettled epochs (of ``sink_id``, of ``dag_ids``), or why Airflow
    could not be asked."""
    found = candidates(reads, threshold, sink_id=sink_id, dag_ids=dag_ids)
    if not found:
        return RunCheck(threshold=threshold)
    try:
        runs = airflow_runs([(c.dag_id, c.run_id) for c in found], threshold)
    except Exception as exc:  # no Airflow here, or its database unreachable: said, not raised
        lines = str(exc).strip().splitlines()
        return RunCheck(
            threshold=threshold, not_checked=mask_userinfo(f"{type(exc).__name__}: {lines[0] if lines else ''}")
        )
    now = datetime.now(UTC)
    stale = []
    for candidate in found:
        run = runs.get((candidate.dag_id, candidate.run_id))
        if run is None or run.alive or run.state != "running":
            continue
        if run.last_activity is not None and now - run.last_activity < threshold:
            continue
        since = run.last_activity
        dates = reads.store.runs.lookup([(run.dag_id, run.run_id)]).get((run.dag_id, run.run_id))
        holds_back = _holds_back(reads, candidate)
        stale.append(
            StaleRunView(
                sink_id=candidate.sink_id,
                epoch=candidate.epoch,
                status=candidate.status,
                dag_id=run.dag_id,
                run_id=run.run_id,
                run_state=run.state,
                last_activity=since,
                idle_seconds=0.0 if since is None else (now - since).total_seconds(),
                holds_back=holds_back,
                then=None if holds_back is None else _settling(reads, candidate, run.run_id),
                interval_start=interval_start(candidate.epoch) if dates is None else dates.interval_start,
                interval_end=None if dates is None else dates.interval_end,
                logical_date=None if dates is None else dates.logical_date,
            )
        )
    return RunCheck(threshold=threshold, stale=tuple(stale))


def candidates(
    reads: SinkReads, threshold: timedelta, *, sink_id: str | None = None, dag_ids: Collection[str] | None = None
) -> list[Candidate]:
    """The unsettled epochs untouched for longer than ``threshold`` by the meta store's clock: its
    Pending rows written by a DAG run, and its reservations without a row."""
    before = reads.store.now() - threshold
    found = [
        Candidate(p.sink_id, p.epoch, "Pending", p.dag_id, p.run_id)
        for p in pending_runs(reads.store, before=before, sink_id=sink_id, dag_ids=dag_ids)
    ]
    for view in reads.reserved_epochs(sink_id=sink_id, dag_ids=dag_ids):
        reservation = view.reservation
        if reservation is not None and reservation.run_id and reservation.reserved_at < before:
            found.append(Candidate(view.sink_id, view.epoch, RESERVED, view.dag_id, reservation.run_id, view.consumed))
    return found


def airflow_runs(
    wanted: Sequence[tuple[str | None, str]], threshold: timedelta
) -> dict[tuple[str | None, str], RunActivity]:
    """What Airflow's metadata database says of these runs, keyed as asked; a run asked without
    its DAG is the one running run of that id, if there is exactly one. Imports Airflow."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select, tuple_

    named = sorted({(d, r) for d, r in wanted if d is not None})
    unnamed = sorted({r for d, r in wanted if d is None})
    found: dict[tuple[str | None, str], tuple[str, str, str]] = {}
    with create_session() as session:
        if named:
            for dag_id, run_id, state in session.execute(
                select(DagRun.dag_id, DagRun.run_id, DagRun.state).where(
                    tuple_(DagRun.dag_id, DagRun.run_id).in_(named)
                )
            ):
                found[(str(dag_id), str(run_id))] = (str(dag_id), str(run_id), str(state))
        if unnamed:
            by_run: dict[str, list[tuple[str, str, str]]] = {}
            for dag_id, run_id, state in session.execute(
                select(DagRun.dag_id, DagRun.run_id, DagRun.state).where(
                    DagRun.run_id.in_(unnamed), DagRun.state == "running"
                )
            ):
                by_run.setdefault(str(run_id), []).append((str(dag_id), str(run_id), str(state)))
            found.update({(None, run_id): runs[0] for run_id, runs in by_run.items() if len(runs) == 1})
        running = sorted({(d, r) for d, r, state in found.values() if state == "running"})
        tasks = (
            session.execute(
                select(
                    TaskInstance.dag_id,
                    TaskInstance.run_id,
                    TaskInstance.state,
                    TaskInstance.start_date,
                    TaskInstance.end_date,
                    TaskInstance.last_heartbeat_at,
                    TaskInstance.updated_at,
                ).where(tuple_(TaskInstance.dag_id, TaskInstance.run_id).in_(running))
            ).all()
            if running
            else []
        )
    heard_after = datetime.now(UTC) - threshold
    alive: set[tuple[str, str]] = set()
    newest: dict[tuple[str, str], datetime] = {}
    for dag_id, run_id, state, *times in tasks:
        run = (str(dag_id), str(run_id))
        heartbeat = times[2]
        if str(state) in LIVE_STATES or (
            str(state) == "running" and heartbeat is not None and heartbeat >= heard_after
        ):
            alive.add(run)
        for at in times:
            if at is not None and (run not in newest or at > newest[run]):
                newest[run] = at
    return {
        key: RunActivity(dag_id, run_id, state, newest.get((dag_id, run_id)), (dag_id, run_id) in alive)
        for key, (dag_id, run_id, state) in found.items()
    }


def _settling(reads: SinkReads, candidate: Candidate, run_id: str) -> str:
    """The ``eo-sink`` command that settles the epoch once its run failed: a persisted write whose
    commit was decided or whose checkpoint completed is committed (an abort would be refused
    without ``--force`` and drop a write nothing is wrong with), an audited one rejected when its
    audit failed; any other is aborted."""
    command = f"eo-sink abort {candidate.sink_id} {candidate.epoch} --reason 'run {run_id} will never finish'"
    if candidate.status == RESERVED:
        return command
    try:
        row = reads.store.get(candidate.sink_id, candidate.epoch)
        completed = reads.checkpoint(candidate.sink_id, candidate.epoch).status == CheckpointStatus.COMPLETED.value
    except UNPARSABLE:  # a stored write that does not parse: nothing to commit
        return command
    except ExactlyOnceError:  # an unregistered sink: its checkpoint is unknown here
        return command
    if row is not None and row.commit_decided_at is None and row.audit_of_write is not None:
        # An audited write (design.md D23): one whose audit failed is rejected, not published; one
        # whose audit never concluded is audited again by the run's audit tasks, cleared.
        if row.stage == AuditStage.AUDIT_FAILED:
            return f"eo-sink reject {candidate.sink_id} {candidate.epoch} --reason 'its audit failed; run {run_id} will never finish'"
        if row.stage == AuditStage.AUDITING:
            return f"clear the audit tasks of run {run_id} (Clear on the run's page): the audit runs again on the same snapshot"
    if row is not None and (row.commit_decided_at is not None or completed):
        return f"eo-sink commit {candidate.sink_id} {candidate.epoch}"
    return command


def _holds_back(reads: SinkReads, candidate: Candidate) -> str | None:
    """What waits for the epoch: the sink's next epoch, for a reserved range (``core.input_ranges``)
    or a Pending upsert (upserts commit in epoch order); ``None`` when nothing does."""
    store = reads.store
    reserved = candidate.range
    if reserved is None and candidate.status != RESERVED:
        found = store.input_ranges.range_of(candidate.sink_id, candidate.epoch)
        reserved = None if found is None else found.describe()
    if reserved is not None:
        return f"its range ({mask_userinfo(reserved)}) is the sink's newest and the next epoch reserves only once it is settled"
    try:
        row = store.get(candidate.sink_id, candidate.epoch)
    except UNPARSABLE:
        return None
    if row is not None and row.kind.in_epoch_order:
        return "upsert epochs commit in epoch order and the sink's later epochs wait for it"
    return None
