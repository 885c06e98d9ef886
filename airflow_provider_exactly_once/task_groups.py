"""One epoch of one sink as a task group: write -> persist -> wait for checkpoint -> commit, or abort.

The group is the whole DAG of an epoch, stated once: given the sink, its checkpoint and the meta
store, it builds every task that needs them (and, for an upsert sink, the ``rewrites`` chains of
design.md D14). An aborted epoch leaves the commit ``upstream_failed``, so the run ends failed and
clearing it writes the epoch again. The tasks, their trigger rules and retries: docs/operators.md.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeAlias

from airflow.sdk import BaseOperator, TaskGroup, TriggerRule, XComArg

from airflow_provider_exactly_once.checkpoints.config import CheckpointConfig
from airflow_provider_exactly_once.core.errors import InvalidSinkConfig
from airflow_provider_exactly_once.operators.epoch import (
    AbortEpochOperator,
    CommitEpochOperator,
    FailureRecorder,
    PersistPendingOperator,
)
from airflow_provider_exactly_once.runtime.assembly import as_checkpoint, as_sink
from airflow_provider_exactly_once.sensors.checkpoint import CheckpointSensor, CheckpointSettledSensor
from airflow_provider_exactly_once.sinks.config import IcebergSinkConfig, SinkConfig
from airflow_provider_exactly_once.table_spec import DeclaredSchema, TableSpec, declare_table

if TYPE_CHECKING:
    from pyiceberg.partitioning import PartitionSpec
    from pyiceberg.schema import Schema

    from airflow_provider_exactly_once.spark.author_specs import (
        FilesInput,
        FunctionInput,
        IcebergTableInput,
        SqlInput,
        TableInput,
    )
    from airflow_provider_exactly_once.table_spec import DeclaredPartitioning


class SparkWrite:
    """The epoch's write for the group to build: a ``SparkPreCommitOperator`` of the group's sink
    and meta store, task ``write`` unless ``task_id`` says otherwise.

    :param input: where the epoch's rows come from (``FilesInput``, ``TableInput``, ``SqlInput``,
        ``FunctionInput``, ``IcebergTableInput`` or such a spec's dict). A JSON or CSV ``FilesInput`` without
        ``schema_ddl`` is read with the schema of the group's ``table`` (``type_mapping.spark_read_schema``).
    :param options: the operator's other parameters as it takes them (``conn_id``, ``conf``,
        ``partition_by``, ``retries``, ``retry_delay``...), checked when the group builds it.
    """

    __slots__ = ("input", "options")

    def __init__(
        self,
        input: FilesInput | TableInput | SqlInput | FunctionInput | IcebergTableInput | dict[str, Any],
        **options: Any,
    ) -> None:
        for name in ("sink", "sink_id", "meta_conn_id"):
            if name in options:
                raise InvalidSinkConfig(f"SparkWrite: {name} is exactly_once_epoch's, given once there; drop it here")
        self.input = input
        self.options = options


def exactly_once_epoch(
    write: BaseOperator | XComArg | SparkWrite,
    *,
    sink: SinkConfig | Mapping[str, Any],
    checkpoint: CheckpointConfig | Mapping[str, Any],
    table: TableSpec | Mapping[str, TableSpec] | None = None,
    wait_until_settled: bool = False,
    meta_conn_id: str | None = None,
    group_id: str | None = None,
    sensor_kwargs: Mapping[str, Any] | None = None,
    commit_retries: int = 8,
    commit_retry_delay: timedelta = timedelta(seconds=15),
    rewrites: int = 2,
    audit: Audit | None = None,
) -> TaskGroup:
    """Build the epoch's group around ``write``: an operator, a ``@task`` call's result, or a
    ``SparkWrite`` the group builds inside itself.

    The write must return the pre-commit metadata of the run's epoch (``epoch_for_context``).
    ``table``: the Iceberg sink's table to create when it is missing (``TableSpec``), or for a sink
    of several tables a mapping of table name to ``TableSpec``; each becomes an
    ``EnsureTableOperator`` before the write (``create_table``, or ``create_<name>`` per table).
    ``wait_until_settled``: a ``CheckpointSettledSensor`` (``settled``) before the write, so that it
    does not read an input still being landed. ``meta_conn_id``: by default
    ``[exactly_once] meta_conn_id``, read when the tasks run. ``sensor_kwargs`` go to both sensors
    (``deferrable``, ``mode``, ``poke_interval``, ``timeout``...). Persist, commit, abort and the
    table tasks are retried ``commit_retries`` times with exponential backoff from
    ``commit_retry_delay``: all are idempotent, and a transient fault in the meta store or the
    catalog must not leave a completed epoch uncommitted. The sensors get the same retries unless
    ``sensor_kwargs`` names its own: only a failed checkpoint and a timeout end the wait for good
    (Airflow never retries those), so a retry only answers a lost worker or a transient error,
    which must not abort an epoch whose checkpoint is pending.
    Task ids inside the group: ``persist``, ``wait_for_checkpoint``, ``commit``, ``abort``; for an
    upsert sink also ``rewrite_N``, ``persist_N``, ``wait_N`` and ``commit_N`` for N up to
    ``rewrites``: how many times the epoch is written again when another writer changed the files
    it rewrote (0: never; the run then fails and clearing it writes the epoch again).
    ``audit``: write, audit, publish (design.md D23). The epoch is committed to an audit branch of
    each table (``audit_commit``), the audit runs, and ``publish`` commits it to the sink's branch only
    when every audit task succeeded. Give ``SqlCheck``s (run over the audit snapshot as one task,
    ``audit_checks``, each by its engine: DuckDB, or Spark), your own operators or ``@task``
    results, or a callable that receives the audit commit's ``XComArg`` (branch and snapshot ids)
    and returns them; a mix in a list. An
    audited upsert sink gets no ``rewrite_N`` chain: a conflict fails the run, and clearing it writes
    the epoch again.
    Every argument is checked here, when the DAG is parsed; an error names the one at fault.
    """
    dag = None if isinstance(write, SparkWrite) else _operator_of(write).dag
    sink_cfg = as_sink(sink)
    checkpoint_cfg = as_checkpoint(checkpoint)
    if commit_retries < 0:
        raise InvalidSinkConfig(f"commit_retries must not be negative, got {commit_retries}")
    if rewrites < 0:
        raise InvalidSinkConfig(f"rewrites must not be negative, got {rewrites}")
    if audit is not None:
        if not isinstance(sink_cfg, IcebergSinkConfig):
            raise InvalidSinkConfig(f"audit: sink {sink_cfg.sink_id!r} is not an Iceberg sink; only tables are audited")
        sink_cfg = sink_cfg.model_copy(update={"audited": True})
        rewrites = 0
    elif getattr(sink_cfg, "audited", False):
        raise InvalidSinkConfig(
            f"sink {sink_cfg.sink_id!r} is audited: give exactly_once_epoch audit=[...], the checks its epochs must pass"
        )
    tables = _declared_tables(sink_cfg, table)
    group_id = group_id or "exactly_once_" + re.sub(r"[^\w-]", "_", sink_cfg.sink_id)
    common: dict[str, Any] = {"sink": sink_cfg, "meta_conn_id": meta_conn_id}
    retried: dict[str, Any] = {
        "retries": commit_retries,
        "retry_delay": commit_retry_delay,
        "retry_exponential_backoff": True,
    }
    # The group's retries unless the author gave others (found by the harness's kill_sensor_wait).
    sensing = {**retried, **dict(sensor_kwargs or {})}

    # A built write joins the DAG of the ``with DAG`` block, as the group itself then does.
    with TaskGroup(group_id=group_id) if dag is None else TaskGroup(group_id=group_id, dag=dag) as group:
        before: list[BaseOperator] = _table_tasks(sink_cfg, tables, retried)
        if wait_until_settled:
            before.append(CheckpointSettledSensor(task_id="settled", checkpoint=checkpoint_cfg, **common, **sensing))
        if isinstance(write, SparkWrite):
            write_op = _spark_write(write, sink_cfg, tables, meta_conn_id)
        else:
            write_op = _operator_of(write)
        write_op.set_upstream(before)
        upsert = getattr(sink_cfg, "upsert", None) is not None
        if upsert and rewrites and not getattr(write_op, "allow_nested_operators", True):
            raise InvalidSinkConfig(
                f"task {write_op.task_id}: a rewrite runs the write task's operator inside its own task, which "
                "allow_nested_operators=False forbids; allow it, or give exactly_once_epoch rewrites=0"
            )
        _warn_if_epochs_overlap(sink_cfg, write_op)
        # Persist is retried like commit and abort: it is idempotent, and a persist that failed on a
        # transient fault (the meta store restarting) would otherwise fail the run into its abort,
        # dropping an epoch whose checkpoint may have completed (the fault harness's meta-store outage).
        persist = PersistPendingOperator(
            task_id="persist", write_task_id=write_op.task_id, checkpoint=checkpoint_cfg, **common, **retried
        )
        wait = CheckpointSensor(task_id="wait_for_checkpoint", checkpoint=checkpoint_cfg, **common, **sensing)
        audit_tasks: list[BaseOperator] = []
        if audit is None:
            commit: BaseOperator = CommitEpochOperator(
                task_id="commit", checkpoint=checkpoint_cfg, write_task_id=write_op.task_id, **common, **retried
            )
            wait >> commit
        else:
            commit, audit_tasks = _audit_tasks(audit, wait, checkpoint_cfg, write_op, common, retried)
        abort = AbortEpochOperator(
            task_id="abort",
            checkpoint=checkpoint_cfg,
            write_task_id=write_op.task_id,
            trigger_rule=TriggerRule.ONE_FAILED,
            **common,
            **retried,
        )
        persist >> wait
        [persist, wait] >> abort
        if upsert:
            _rewrite_chain(commit, write_op, checkpoint_cfg, rewrites, common, retried, sensing)
    write_op >> persist
    write_op >> abort
    epoch_tasks: list[Any] = [write_op, *audit_tasks]
    epoch_tasks += [t for t in group.iter_tasks() if all(t is not known for known in epoch_tasks)]
    _keep_failures(epoch_tasks, sink_cfg.sink_id, meta_conn_id, audit_tasks)
    return group


def _audit_tasks(
    audit: Audit,
    wait: BaseOperator,
    checkpoint: CheckpointConfig,
    write_op: BaseOperator,
    common: Mapping[str, Any],
    retried: Mapping[str, Any],
) -> tuple[BaseOperator, list[BaseOperator]]:
    """``wait >> audit_commit >> [the audit's tasks] >> publish`` (design.md D23); the publish task
    and the audit's tasks."""
    from airflow_provider_exactly_once.operators.epoch import (
        AuditChecksOperator,
        AuditEpochOperator,
        PublishEpochOperator,
    )
    from airflow_provider_exactly_once.sinks.config import SqlCheck

    committed = AuditEpochOperator(task_id="audit_commit", checkpoint=checkpoint, **common, **retried)
    wait >> committed
    given = audit(committed.output) if callable(audit) else audit
    items = list(given) if isinstance(given, (list, tuple)) else [given]
    checks = [item for item in items if isinstance(item, (SqlCheck, Mapping))]
    tasks = [_operator_of(item) for item in items if not isinstance(item, (SqlCheck, Mapping))]
    if checks:
        # Retried like the group's other steps: a platform fault must not fail a good audit for good
        # (a failed check is an AirflowFailException, which no retry repeats).
        tasks.append(
            AuditChecksOperator(task_id="audit_checks", checks=checks, checkpoint=checkpoint, **common, **retried)
        )
    if not tasks:
        raise InvalidSinkConfig(
            "audit: give at least one check or task; an audit that checks nothing publishes everything"
        )
    for task in tasks:
        committed >> task
    publish = PublishEpochOperator(
        task_id="publish",
        checkpoint=checkpoint,
        write_task_id=write_op.task_id,
        audit_task_ids=[t.task_id for t in tasks],
        **common,
        **retried,
    )
    tasks >> publish
    return publish, tasks


def _keep_failures(tasks: list[Any], sink_id: str, meta_conn_id: str | None, audit: list[Any]) -> None:
    """Every task of the epoch, the author's write and audit among them, keeps its failed tries on
    the epoch (``FailureRecorder``, design.md D22), beside the callbacks it has; an audit task's
    final failure is also a failed check of the epoch's audit (D23)."""
    for task in tasks:
        audits = any(task is a for a in audit)
        task.on_failure_callback = [*task.on_failure_callback, FailureRecorder(sink_id, meta_conn_id, audit=audits)]
        task.on_retry_callback = [*task.on_retry_callback, FailureRecorder(sink_id, meta_conn_id, retried=True)]


def _operator_of(write: object) -> BaseOperator:
    write_op = getattr(write, "operator", None) if isinstance(write, XComArg) else write
    if not isinstance(write_op, BaseOperator):
        raise InvalidSinkConfig(
            f"write must be an operator, a task's output or a SparkWrite, got {type(write).__name__}"
        )
    return write_op


#: What ``exactly_once_epoch(audit=...)`` takes (design.md D23): checks, tasks, or a callable making
#: them from the audit commit's ``XComArg``.
Audit: TypeAlias = "Sequence[Any] | Callable[[XComArg], Any] | Any"

#: A table as the group checked it: its declared schema, partitioning and properties.
_Declared: TypeAlias = "tuple[Schema | DeclaredSchema, PartitionSpec | DeclaredPartitioning | None, dict[str, str]]"


def _declared_tables(sink: SinkConfig, table: TableSpec | Mapping[str, TableSpec] | None) -> dict[str, _Declared]:
    """``table=`` checked once, each table's declaration where its name is known (``declare_table``)."""
    if table is None:
        return {}
    if not isinstance(sink, IcebergSinkConfig):
        raise InvalidSinkConfig(f"table: sink {sink.sink_id!r} is not an Iceberg sink; it has no table to create")
    if isinstance(table, TableSpec):
        if len(sink.tables) != 1:
            raise InvalidSinkConfig(
                f"table: sink {sink.sink_id!r} has several tables; give table={{name: TableSpec(...), ...}}"
            )
        table = {sink.tables[0]: table}
    if not isinstance(table, Mapping):
        raise InvalidSinkConfig(f"table must be a TableSpec or a mapping of table name to TableSpec, got {table!r}")
    declared: dict[str, _Declared] = {}
    for name, spec in table.items():
        where = f"table {name!r}"
        if name not in sink.tables:
            raise InvalidSinkConfig(f"{where} is not a table of sink {sink.sink_id!r}: {list(sink.tables)}")
        if not isinstance(spec, TableSpec):
            raise InvalidSinkConfig(f"{where}: give a TableSpec(schema, partitioning), not {type(spec).__name__}")
        properties = dict(spec.properties or {})
        schema, partitioning = declare_table(spec.schema, spec.partitioning, where=where, properties=properties)
        declared[name] = (schema, partitioning, properties)
    return declared


def _table_tasks(sink: SinkConfig, tables: Mapping[str, _Declared], retried: Mapping[str, Any]) -> list[BaseOperator]:
    """One ``EnsureTableOperator`` per declared table: ``create_table`` for a sink of one table,
    ``create_<name>`` (the name's last part, or all of it where two share one) for a fan-out."""
    if not tables:
        return []
    # Only a DAG that declares a table pays for the operator's import at its parse.
    from airflow_provider_exactly_once.operators.tables import EnsureTableOperator

    short = {name: name.rsplit(".", 1)[-1] for name in tables}
    unique = len(set(short.values())) == len(short)
    return [
        EnsureTableOperator(
            task_id="create_table"
            if len(getattr(sink, "tables", ())) == 1
            else "create_" + re.sub(r"[^\w-]", "_", short[name] if unique else name),
            sink=sink,
            table=name,
            schema=schema,
            partition_spec=partitioning,
            properties=properties,
            **retried,
        )
        for name, (schema, partitioning, properties) in tables.items()
    ]


def _spark_write(
    write: SparkWrite, sink: SinkConfig, tables: Mapping[str, _Declared], meta_conn_id: str | None
) -> BaseOperator:
    """The ``SparkPreCommitOperator`` a ``SparkWrite`` stands for; a JSON or CSV input that names no
    schema is read with the tables' (``_read_schema``)."""
    from airflow_provider_exactly_once.operators.spark_precommit import SparkPreCommitOperator
    from airflow_provider_exactly_once.spark.author_specs import FilesInput

    spec = write.input
    if isinstance(spec, FilesInput) and spec.schema_ddl is None and spec.format != "parquet":
        ddl = _read_schema(sink, tables)
        if ddl is not None:
            spec = spec.model_copy(update={"schema_ddl": ddl})
    options = {"task_id": "write", **write.options}
    return SparkPreCommitOperator(sink=sink, input=spec, meta_conn_id=meta_conn_id, **options)


def _read_schema(sink: SinkConfig, tables: Mapping[str, _Declared]) -> str | None:
    """The Spark DDL of the declared tables that take the input as it is (those without a
    ``select``); ``None`` when none is declared (Spark then infers it, as without the group)."""
    from airflow_provider_exactly_once.type_mapping import spark_read_schema

    selected = getattr(sink, "select", {})
    ddls = {
        name: spark_read_schema(schema.json if isinstance(schema, DeclaredSchema) else schema, where=f"table {name!r}")
        for name, (schema, _, _) in tables.items()
        if name not in selected
    }
    if len(set(ddls.values())) > 1:
        raise InvalidSinkConfig(
            f"write: the tables {sorted(ddls)} take the input as it is but declare different schemas, so no read "
            "schema follows from them; give the input its schema_ddl"
        )
    return next(iter(ddls.values()), None)


def _rewrite_chain(
    commit: BaseOperator,
    write_op: BaseOperator,
    checkpoint: CheckpointConfig,
    rewrites: int,
    common: Mapping[str, Any],
    retried: Mapping[str, Any],
    sensing: Mapping[str, Any],
) -> None:
    """``commit -> rewrite_1 -> persist_1 -> wait_1 -> commit_1 -> rewrite_2 ...``: the bounded loop
    of an upsert epoch whose write conflicted, unrolled because Airflow runs no task twice in a run.

    A rewrite runs when the commit before it failed or could not run (``ONE_FAILED``: a persist
    that met the conflict leaves the commit ``upstream_failed``); it runs the write task's operator,
    so it takes that task's queue, pool, retries and timeout. Its wait costs one look when the
    checkpoint completed already, and waits as the first did when a persist's conflict came early.
    """
    # Only upsert sinks have the loop: an append sink's DAG file does not pay for its operator.
    from airflow_provider_exactly_once.operators.rewrite import RewriteEpochOperator

    previous = commit
    earlier: list[str] = []
    for n in range(1, rewrites + 1):
        rewrite = RewriteEpochOperator(
            task_id=f"rewrite_{n}",
            checkpoint=checkpoint,
            write_task_id=write_op.task_id,
            earlier_rewrite_task_ids=list(earlier),
            trigger_rule=TriggerRule.ONE_FAILED,
            queue=write_op.queue,
            pool=write_op.pool,
            retries=write_op.retries,
            retry_delay=write_op.retry_delay,
            execution_timeout=write_op.execution_timeout,
            **common,
        )
        persist = PersistPendingOperator(
            task_id=f"persist_{n}", write_task_id=rewrite.task_id, checkpoint=checkpoint, **common, **retried
        )
        wait = CheckpointSensor(task_id=f"wait_{n}", checkpoint=checkpoint, **common, **sensing)
        commit_n = CommitEpochOperator(
            task_id=f"commit_{n}", checkpoint=checkpoint, write_task_id=rewrite.task_id, **common, **retried
        )
        previous >> rewrite >> persist >> wait >> commit_n
        previous = commit_n
        earlier.append(rewrite.task_id)


def _warn_if_epochs_overlap(sink: SinkConfig, write_op: BaseOperator) -> None:
    """An upsert epoch written while an earlier one is not yet committed has not seen its rows, and
    meets a conflict whenever their key ranges overlap, costing a rewrite (design.md D14); an
    incremental epoch cannot start its range before the earlier one settled (D21). Both said when
    the DAG is parsed, where the author can still set ``max_active_runs=1``."""
    if write_op.dag is None or write_op.dag.max_active_runs == 1:
        return
    runs = write_op.dag.max_active_runs
    if getattr(sink, "upsert", None) is not None:
        warnings.warn(
            f"sink {sink.sink_id!r} is an upsert sink, and DAG {write_op.dag.dag_id!r} runs up to {runs} epochs at "
            "once: an epoch written before the previous one committed conflicts with it (UpsertConflict) and is "
            "written again, or fails once its rewrites are used up. Give the DAG max_active_runs=1.",
            UserWarning,
            stacklevel=3,
        )
    elif (getattr(write_op, "input_spec", None) or {}).get("kind") == "iceberg_table":
        warnings.warn(
            f"sink {sink.sink_id!r} reads an upstream table incrementally, and DAG {write_op.dag.dag_id!r} runs up "
            f"to {runs} epochs at once: an epoch's range starts where the last committed one ended, so its write "
            "waits, failing and retrying (EarlierEpochUndecided), until the epoch before it settled. Give the DAG "
            "max_active_runs=1.",
            UserWarning,
            stacklevel=3,
        )
