"""The protocol steps of one epoch as Airflow tasks: persist, commit, abort, and an audited sink's
audit commit, built-in checks and publish (design.md D23).

Thin on purpose: each resolves the meta-store connection, the sink's catalog and the run's epoch,
then calls one method of the coordinator, which alone decides the epoch's fate. What they add is
the Airflow mapping: a refusal fails the task without retries, a transient fault is retried, and a
small JSON summary goes to XCom so the run's outcome can be read in the UI.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from airflow_provider_exactly_once.checkpoints.config import CheckpointConfig
from airflow_provider_exactly_once.core.epochs import acting, failure_reason, run_failure
from airflow_provider_exactly_once.core.errors import (
    AbortRefused,
    AuditNotPassed,
    ExactlyOnceError,
    InvalidPreCommit,
    InvalidSinkConfig,
    WriteFailed,
)
from airflow_provider_exactly_once.observability.assets import commit_alias, emit_committed
from airflow_provider_exactly_once.observability.links import EpochLink
from airflow_provider_exactly_once.observability.run_origin import RunOrigin, task_actor
from airflow_provider_exactly_once.operators._common import (
    airflow_errors,
    check_write_matches,
    parse_pre_commit,
    pull_pre_commit,
    try_number,
)
from airflow_provider_exactly_once.runtime.assembly import as_checkpoint, as_sink, coordinator_for, open_meta_store
from airflow_provider_exactly_once.runtime.run_epochs import (
    epoch_for_context,
    epoch_interval,
    generation_for_context,
    record_run,
)
from airflow_provider_exactly_once.sinks.config import IcebergSinkConfig, SinkConfig
from airflow_provider_exactly_once.version_compat import AirflowFailException

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_exactly_once.core.coordinator import TwoPhaseCommitCoordinator
    from airflow_provider_exactly_once.core.outcomes import CommitResult
    from airflow_provider_exactly_once.core.precommit import PreCommit
    from airflow_provider_exactly_once.sinks.iceberg.audit_checks import CheckEngine
    from airflow_provider_exactly_once.store import SqlSinkStateStore


log = logging.getLogger(__name__)

#: How long an abort waits for a failed task's own record of its error (design.md D22): the task
#: writes it right after Airflow marked it failed, which is what scheduled the abort.
CAUSE_WAIT_S = 10.0


@dataclass(frozen=True)
class _Step:
    store: SqlSinkStateStore
    epoch: int
    coordinator: TwoPhaseCommitCoordinator


class _EpochOperator(BaseOperator):
    """Shared by the three steps: the sink, its checkpoint and the meta-store connection."""

    ui_color = "#e8f4ea"

    def __init__(
        self,
        *,
        sink: SinkConfig | Mapping[str, Any],
        checkpoint: CheckpointConfig | Mapping[str, Any] | None = None,
        meta_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.sink = as_sink(sink)
        self.checkpoint = None if checkpoint is None else as_checkpoint(checkpoint)
        self.meta_conn_id = meta_conn_id

    @contextmanager
    def _step(self, context: Mapping[str, Any]) -> Iterator[_Step]:
        """The store, the run's epoch and the coordinator, the task named as the actor of the epoch's
        history; the store's connections are closed after.

        The sink is registered first (idempotent, no write when unchanged): the recovery DAG finds
        every sink through the registry, without importing this DAG, and a sink must be known
        there before any of its epochs can be left half done.
        """
        with acting(task_actor(context)):
            store = open_meta_store(self.meta_conn_id)
            try:
                store.registry.register_sink(
                    self.sink.sink_id,
                    self.sink.model_dump(mode="json"),
                    None if self.checkpoint is None else self.checkpoint.model_dump(mode="json"),
                )
                epoch = epoch_for_context(context, self.sink.sink_id, store.epochs)
                self.log.info("sink %r %s", self.sink.sink_id, epoch_interval(epoch, context))
                coordinator = coordinator_for(
                    self.sink, self.checkpoint, store=store, epoch=epoch, try_number=try_number(context)
                )
                yield _Step(store, epoch, coordinator)
            finally:
                store.dispose()


class PersistPendingOperator(_EpochOperator):
    """Phase one: make the write task's pre-commit metadata durable as the epoch's Pending row.

    From here on the epoch can always be finished, whatever crashes. A retried persist of the same
    write is harmless; a new write (a retry or clear of the write task) replaces a Pending epoch,
    re-opens an Aborted one, and is itself removed when the epoch is already committed.

    :param sink: the sink the write belongs to (``IcebergSinkConfig``, ``FileSinkConfig`` or a dict).
    :param write_task_id: the task whose return value is the pre-commit (dict, JSON or compressed);
        when it returned none (a Spark operator that is not ours), the write it left in its write
        location is taken (``core/cleanups.py``).
    :param meta_conn_id: the ``exactly_once_meta`` connection of the meta store; by default
        ``[exactly_once] meta_conn_id``, read when the task runs.
    :return: ``{"sink_id", "epoch", "outcome", "write_id", "persisted_write_id"}``; ``write_id`` is
        the write the epoch holds, which differs from this run's when the epoch was already settled.
    """

    template_fields: Sequence[str] = ("write_task_id",)

    def __init__(self, *, write_task_id: str = "write", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.write_task_id = write_task_id

    def execute(self, context: Context) -> dict[str, Any]:
        value = pull_pre_commit(context, self.write_task_id)
        with airflow_errors(), self._step(context) as step:
            pre = parse_pre_commit(value) if value is not None else self._left_write(step)
            check_write_matches(pre, self.sink.sink_id, step.epoch, self.task_id)
            if pre.generation is None:
                # A write task of the author's own that did not stamp one: the run's generation now.
                pre = pre.model_copy(update={"generation": generation_for_context(context)})
            record_run(step.store, context, _dag_id(context))
            result = step.coordinator.persist(
                pre, run_id=context.get("run_id"), try_number=try_number(context), dag_id=_dag_id(context)
            )
        self.log.info("%s: %s (the epoch holds write %s)", pre.describe(), result.outcome.value, result.write_id)
        if result.warning:
            self.log.warning("%s", result.warning)
        return {
            "sink_id": pre.sink_id,
            "epoch": pre.epoch,
            "outcome": result.outcome.value,
            "write_id": result.write_id,
            "persisted_write_id": pre.write_id,
            **({"warning": result.warning} if result.warning else {}),
        }

    def _left_write(self, step: _Step) -> PreCommit:
        """The write a task that returned nothing left in the sink's write locations (a Spark operator
        that is not ours: ``core/cleanups.py``)."""
        from airflow_provider_exactly_once.core.cleanups import newest_left_write
        from airflow_provider_exactly_once.runtime.assembly import open_sink

        self.log.info(
            "Task %r returned no pre-commit: taking the write it left in the sink's write locations",
            self.write_task_id,
        )
        folders = open_sink(self.sink).write_folders.folders()
        return newest_left_write(self.sink.sink_id, step.epoch, folders, step.store.registry, self.write_task_id)


class CommitEpochOperator(_EpochOperator):
    """Phase two: make the epoch's persisted write visible, once, after its checkpoint completed.

    Give it retries: every failure left by a commit is safe to retry (the marker in the sink decides
    whether the write is already visible), and once the checkpoint completed the epoch must be
    committed, never aborted. Refusals (checkpoint failed, epoch aborted, files missing) fail at once.

    For an Iceberg sink the task's outlet is the alias ``exactly_once.<sink_id>.committed``: when
    (and only when) this task made the epoch visible it adds one event per table, for the asset
    ``iceberg://<iceberg_conn_id>/<namespace>/<table>`` (``observability.assets.iceberg_asset``),
    so DAGs scheduled on a table run on committed data only. A rerun that finds the epoch committed
    with another run's write (a sink with ``on_reprocess="keep"``) adds none: there is nothing new.
    A retry that finds *this run's* write already committed adds them: its earlier try may have died
    between the commit and the task's success, when Airflow records the events. So events are at
    least once: a downstream DAG may run twice for one commit (a cleared commit task), never zero times.

    :param write_task_id: the run's write task, whose write a retry finds already committed.
    :param emit_assets: add the alias outlet and its events (Iceberg sinks; default True).
    :return: ``{"sink_id", "epoch", "outcome", "write_id", "committed"}`` (per table: snapshot id or "empty").
    """

    operator_extra_links = (EpochLink(),)

    template_fields: Sequence[str] = ("write_task_id",)

    def __init__(
        self,
        *,
        checkpoint: CheckpointConfig | Mapping[str, Any],
        write_task_id: str = "write",
        emit_assets: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(checkpoint=checkpoint, **kwargs)
        self.write_task_id = write_task_id
        self.emit_assets = emit_assets and isinstance(self.sink, IcebergSinkConfig)
        if self.emit_assets:
            self.add_outlets([commit_alias(self.sink.sink_id)])
        self._committed: tuple[Any, bool, RunOrigin] | None = None  # (record, made visible now, run), for OpenLineage

    def execute(self, context: Context) -> dict[str, Any]:
        with airflow_errors(), self._step(context) as step:
            result = self._commit(step)
        record = result.record
        from airflow_provider_exactly_once.core.outcomes import CommitOutcome

        committed_now = result.outcome is CommitOutcome.COMMITTED
        self._committed = (record, committed_now, RunOrigin.of(context))
        if self.emit_assets and isinstance(self.sink, IcebergSinkConfig) and self._announces(context, result):
            emitted = emit_committed(context, commit_alias(self.sink.sink_id), self.sink.iceberg_conn_id, record)
            self.log.info("%d asset event(s) for the committed table(s)", emitted)
        self.log.info(
            "sink %r epoch %d: %s (write %s): %s",
            record.sink_id,
            record.epoch,
            result.outcome.value,
            record.write_id,
            dict(record.committed or {}),
        )
        return {
            "sink_id": record.sink_id,
            "epoch": record.epoch,
            "outcome": result.outcome.value,
            "write_id": record.write_id,
            "committed": dict(record.committed or {}),
        }

    def _commit(self, step: _Step) -> CommitResult:
        return step.coordinator.commit(self.sink.sink_id, step.epoch)

    def _announces(self, context: Mapping[str, Any], result: CommitResult) -> bool:
        """Whether the epoch's committed write is news of this run: committed now, or by an earlier try."""
        from airflow_provider_exactly_once.core.outcomes import CommitOutcome

        if result.outcome is CommitOutcome.COMMITTED:
            return True
        value = pull_pre_commit(context, self.write_task_id)
        try:
            return value is not None and parse_pre_commit(value).write_id == result.record.write_id
        except InvalidPreCommit:
            return False

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """Outputs: the tables committed to, with row, byte and file counts when this try made them visible."""
        from airflow_provider_exactly_once.observability.lineage import commit_lineage

        if self._committed is None:
            return commit_lineage(self.sink, None, committed_now=False)
        record, committed_now, origin = self._committed
        return commit_lineage(self.sink, record, committed_now=committed_now, origin=origin)


class AuditEpochOperator(_EpochOperator):
    """Write, audit, publish, step one (design.md D23): commit the epoch's write to its audit branch
    once its checkpoint completed, where the audit's tasks read it and ``main``'s readers do not.

    Idempotent like the commit: the marker on the audit branch tells a retry the commit happened.
    :return: ``{"sink_id", "epoch", "write_id", "branch", "snapshots"}``: per table, the audit
        snapshot's id (``"empty"`` where the write added nothing), for the audit's tasks to read
        exactly the epoch's data (``{{ ti.xcom_pull(task_ids='<group>.audit_commit') }}``, or the
        ``XComArg`` an ``audit=`` callable of ``exactly_once_epoch`` is given).
    """

    operator_extra_links = (EpochLink(),)

    def execute(self, context: Context) -> dict[str, Any]:
        with airflow_errors(), self._step(context) as step:
            record = step.coordinator.commit_audit(self.sink.sink_id, step.epoch)
        audit = record.audit_of_write
        if audit is None:  # published already (a cleared run): nothing is left to audit
            raise AirflowFailException(
                f"sink {self.sink.sink_id!r} epoch {record.epoch} is {record.stage} with write {record.write_id}: "
                "there is no audit to run; reprocess the run to write the epoch again"
            )
        self.log.info(
            "sink %r epoch %d on audit branch %s: %s", record.sink_id, record.epoch, audit.branch, audit.snapshots
        )
        return {
            "sink_id": record.sink_id,
            "epoch": record.epoch,
            "write_id": record.write_id,
            "branch": audit.branch,
            "snapshots": dict(audit.snapshots),
        }


class ChecksFailed(AirflowFailException):
    """Built-in audit checks failed, and the audit recorded each by name: not retried (the same
    snapshot would fail them again), and its failure callback adds nothing to the audit."""


class AuditChecksOperator(_EpochOperator):
    """The built-in audit (design.md D23): ``checks`` (``SqlCheck``: a name, a query returning the
    rows that break it, a message, the engine that runs it) over the epoch's audit snapshot, in
    order: DuckDB's in the task's memory (the ``[audit]`` extra), Spark's on the Spark Connect server
    of the checks' ``spark_conn_id`` or on a local session in the task (the ``[spark]`` extra;
    ``spark/check_engine.py``). Fails, naming every failed check with its message and first rows,
    when any returns a row; the epoch's audit then records them as failed.

    :return: per check, ``{"name", "passed", "message"}``.
    """

    ui_color = "#fff4d6"

    def __init__(self, *, checks: Sequence[Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        from airflow_provider_exactly_once.sinks.config import as_checks

        self.checks = as_checks(checks)
        if not isinstance(self.sink, IcebergSinkConfig):
            raise InvalidSinkConfig(f"task {self.task_id}: only an Iceberg sink is audited")

    def execute(self, context: Context) -> list[dict[str, Any]]:
        from airflow_provider_exactly_once.runtime.assembly import iceberg_catalog
        from airflow_provider_exactly_once.sinks.iceberg.audit_checks import run_checks

        assert isinstance(self.sink, IcebergSinkConfig)
        with airflow_errors(), self._step(context) as step:
            row = step.store.get(self.sink.sink_id, step.epoch)
            audit = None if row is None else row.audit_of_write
            if row is None or audit is None:
                raise AuditNotPassed(f"sink {self.sink.sink_id!r} epoch {step.epoch}: no audit snapshot to check")
            found = run_checks(
                iceberg_catalog(self.sink), row.pre_commit, audit, self.checks, {"spark": self._spark_engine}
            )
            for check in found:
                self.log.info("check %s: %s %s", check.name, "passed" if check.passed else "FAILED", check.message)
            failed = [c for c in found if not c.passed]
            if failed:
                # Each check kept on the audit by its own name (the history and eo-sink show list
                # them one by one), beside what other audit tasks found failed before.
                judged = audit.failed_by(found).checks
                step.coordinator.judge_audit(self.sink.sink_id, step.epoch, judged, write_id=row.write_id)
                raise ChecksFailed(
                    "; ".join(f"{c.name}: {c.message}" for c in failed)
                    + f". The sink's branch is untouched: fix the input and reprocess this run (its new write is"
                    f" audited again), or drop the write with eo-sink reject {self.sink.sink_id} {step.epoch}"
                    " --reason '...'"
                )
        return [c.model_dump() for c in found]

    def _spark_engine(self) -> AbstractContextManager[CheckEngine]:
        """Spark's engine, reached as the write reaches Spark from a task: the checks' connection
        must be a ``spark_connect`` one; none means a local session in this task's process."""
        from airflow_provider_exactly_once.extras import require

        require("pyspark", extra="spark", feature="the audit checks of engine='spark'")
        from airflow_provider_exactly_once.operators.spark_precommit import connect_retry_seconds, connect_url
        from airflow_provider_exactly_once.spark.check_engine import spark_engine

        conn_id = next(c.spark_conn_id for c in self.checks if c.engine == "spark")
        url = None if conn_id is None else connect_url(conn_id)
        if conn_id is not None and url is None:
            raise InvalidSinkConfig(
                f"task {self.task_id}: spark_conn_id {conn_id!r} is not a Spark Connect connection (type "
                "spark_connect): the Spark checks run in this task, as a client of a Connect server, or on a local "
                "session when no spark_conn_id is given"
            )
        return spark_engine(url, retry_seconds=connect_retry_seconds())


class PublishEpochOperator(CommitEpochOperator):
    """Write, audit, publish, the last step (design.md D23): runs only when every audit task
    succeeded, and commits the epoch to the sink's branch like ``CommitEpochOperator``, recording
    the audit as passed with the commit decision (the same decision, marker, retries and asset events: they fire here,
    never on the audit commit). A failed audit task records the audit as failed instead
    (``FailureRecorder``), and this task does not run.

    :param audit_task_ids: the audit's tasks, whose names the passed audit keeps.
    """

    def __init__(self, *, audit_task_ids: Sequence[str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.audit_task_ids = list(audit_task_ids)

    def _commit(self, step: _Step) -> CommitResult:
        """The commit, with the audit's tasks as its passed checks, recorded with the decision."""
        from airflow_provider_exactly_once.core.epochs import AuditCheck

        checks = [AuditCheck(name=task_id, passed=True) for task_id in self.audit_task_ids]
        return step.coordinator.commit(self.sink.sink_id, step.epoch, audit_checks=checks)


class AbortEpochOperator(_EpochOperator):
    """Give up on the run's epoch after its write, persist or wait failed, and remove the write's files.

    This run's write is passed to the coordinator when its XCom exists, so its files are removed
    even when it was never persisted (the coordinator leaves a tombstone so that a late persist of
    it fails). The coordinator refuses to abort an epoch whose checkpoint completed or whose commit
    was decided: that epoch will be committed (by a retry or clear of the commit, or the recovery
    DAG), so the refusal is reported and the task succeeds; the run still ends failed, because its
    commit did not run.

    :param write_task_id: the write task of the run (its XCom may be missing: the write failed).
    :param reason: recorded on the row; by default names this task and run.
    :param force: abort even though the checkpoint completed, dropping the epoch's data on purpose.
    :return: ``{"sink_id", "epoch", "outcome", "files_deleted", "write_id"}``; ``outcome`` is
        ``"refused"`` (with ``"refused_because"``) when the coordinator refused.
    """

    template_fields: Sequence[str] = ("write_task_id", "reason")
    operator_extra_links = (EpochLink(),)

    def __init__(
        self,
        *,
        checkpoint: CheckpointConfig | Mapping[str, Any],
        write_task_id: str = "write",
        reason: str | None = None,
        force: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(checkpoint=checkpoint, **kwargs)
        self.write_task_id = write_task_id
        self.reason = reason
        self.force = force

    def execute(self, context: Context) -> dict[str, Any]:
        with airflow_errors(), self._step(context) as step:
            reason = self.reason or self._cause(context, step)
            write = self._this_runs_write(context, step.epoch)
            summary: dict[str, Any] = {
                "sink_id": self.sink.sink_id,
                "epoch": step.epoch,
                "write_id": None if write is None else write.write_id,
            }
            try:
                result = step.coordinator.abort(
                    self.sink.sink_id, step.epoch, reason=reason, write=write, force=self.force, dag_id=_dag_id(context)
                )
            except AbortRefused as exc:
                self.log.warning(
                    "Abort refused, nothing was deleted: %s. The epoch is not lost: clear the run's wait and "
                    "commit tasks, or let the recovery DAG commit it.",
                    exc,
                )
                return {**summary, "outcome": "refused", "files_deleted": 0, "refused_because": str(exc)}
        self.log.info(
            "sink %r epoch %d: %s; %d file(s) deleted",
            self.sink.sink_id,
            step.epoch,
            result.outcome.value,
            result.files_deleted,
        )
        return {**summary, "outcome": result.outcome.value, "files_deleted": result.files_deleted}

    def _cause(self, context: Mapping[str, Any], step: _Step) -> str:
        """Why the run gives its epoch up: the error its failed task kept on the epoch (D22), waited
        for a while, since that task writes it just after Airflow marked it failed; else the tasks
        Airflow says failed, which then died before they could say why."""
        run_id = context.get("run_id")
        failed = _failed_tasks(context, self.upstream_task_ids)
        deadline = time.monotonic() + CAUSE_WAIT_S
        while True:
            cause = run_failure(step.store.history.events(self.sink.sink_id, step.epoch), run_id, failed)
            if cause is not None or not failed or time.monotonic() >= deadline:
                break
            time.sleep(1.0)
        if cause is not None:
            return cause
        if failed:
            tasks = ", ".join(sorted(task.rsplit(".", 1)[-1] for task in failed))
            return (
                f"{tasks} failed without saying why (its process ended first: killed, out of memory, or its worker "
                f"lost); its log in Airflow, run {run_id}, says what it did last"
            )
        return f"task {self.task_id} of run {run_id}: an upstream step failed"

    def _this_runs_write(self, context: Mapping[str, Any], epoch: int) -> PreCommit | None:
        """The run's write, when its XCom exists and is one of this sink's epoch; else ``None``."""
        value = pull_pre_commit(context, self.write_task_id)
        if value is None:
            self.log.info(
                "Task %r left no pre-commit in this run: aborting the epoch's persisted write, if any "
                "(an epoch with none is recorded Aborted without a write, with this task's reason)",
                self.write_task_id,
            )
            return None
        try:
            pre = parse_pre_commit(value)
            check_write_matches(pre, self.sink.sink_id, epoch, self.task_id)
        except (InvalidPreCommit, ExactlyOnceError) as exc:
            # Nothing of such a write can have been persisted (persist refuses the same mismatch),
            # and its files cannot be located safely from metadata we cannot read.
            self.log.warning("Ignoring the unusable XCom of task %r: %s", self.write_task_id, exc)
            return None
        return pre


class FailureRecorder:
    """The ``on_failure_callback`` and ``on_retry_callback`` the epoch group gives each of its tasks
    (design.md D22): the failed try's error kept on its epoch, as an ERROR event of that task (and
    the row's ``error``), where the abort, the views and ``eo-sink`` read it with a link to the log.

    It runs in the task's own process right after the failure, whatever the executor, or in the
    dag-processor for a task whose process died (then without an exception); it never fails the
    task's finalisation: an unreachable meta store leaves the task's log as the only record.
    """

    def __init__(self, sink_id: str, meta_conn_id: str | None, *, retried: bool = False, audit: bool = False) -> None:
        self.sink_id = sink_id
        self.meta_conn_id = meta_conn_id
        #: The ``on_retry_callback``: Airflow runs the task again.
        self.retried = retried
        #: A task of the epoch's audit: its final failure is a failed check of the audit (D23).
        self.audit = audit

    def __call__(self, context: Context) -> None:
        try:
            reason = failure_reason(*_described(context.get("exception")))
            with acting(task_actor(context)):
                store = open_meta_store(self.meta_conn_id)
                try:
                    epoch = epoch_for_context(context, self.sink_id, store.epochs)
                    store.history.record_failure(self.sink_id, epoch, reason, final=not self.retried)
                    if self.audit and not self.retried and not isinstance(context.get("exception"), ChecksFailed):
                        _fail_audit(
                            store, self.sink_id, epoch, str(getattr(context.get("ti"), "task_id", "audit")), reason
                        )
                finally:
                    store.dispose()
        except Exception:
            log.warning("could not keep the failure on sink %r's epoch", self.sink_id, exc_info=True)


def _fail_audit(store: SqlSinkStateStore, sink_id: str, epoch: int, task_id: str, reason: str) -> None:
    """The epoch's audit judged failed by one more of its tasks, beside those that failed before."""
    from airflow_provider_exactly_once.core.epochs import AuditCheck

    row = store.get(sink_id, epoch)
    audit = None if row is None else row.audit_of_write
    if row is None or audit is None or row.commit_decided_at is not None:
        return  # nothing committed to audit (the audit commit failed), or its publish decided
    store.record_audit(sink_id, epoch, audit.failed_by([AuditCheck(name=task_id, passed=False, message=reason[:1500])]))


def _described(error: object) -> tuple[str, str]:
    """The failed try's error as its class and message: the refusal an ``AirflowFailException``
    carries, the Spark error of a failed write; a task whose process died has none."""
    if isinstance(error, AirflowFailException) and isinstance(error.__cause__, ExactlyOnceError):
        error = error.__cause__
    if isinstance(error, WriteFailed):
        kind, _, message = (error.cause or "").partition(": ")
        return (kind, message) if message else ("WriteFailed", str(error))
    if isinstance(error, BaseException):
        return type(error).__name__, str(error)
    if isinstance(error, str) and error:  # the dag-processor's message for a task it found dead
        return "TaskDied", error
    return "TaskDied", "its process ended without reporting an error (killed, out of memory, or its worker lost)"


def _failed_tasks(context: Mapping[str, Any], upstream: Collection[str]) -> set[str]:
    """Which of ``upstream`` Airflow has as failed in this run; empty when it cannot tell."""
    ti = context.get("ti")
    try:
        states = ti.get_task_states(dag_id=ti.dag_id, task_ids=sorted(upstream), run_ids=[ti.run_id])  # type: ignore[union-attr]
        return {task for task, state in dict(states.get(ti.run_id, {})).items() if str(state) == "failed"}  # type: ignore[union-attr]
    except Exception:  # an Airflow without the call, or a context without a task instance
        log.debug("could not read the states of tasks %s", sorted(upstream), exc_info=True)
        return set()


def _dag_id(context: Mapping[str, Any]) -> str | None:
    """The run's DAG, recorded on the epoch's row so the sink view can link to the run and apply its access."""
    for key in ("dag_run", "dag"):
        dag_id = getattr(context.get(key), "dag_id", None)
        if isinstance(dag_id, str) and dag_id:
            return dag_id
    return None
