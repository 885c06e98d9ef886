"""The harness's action on an upsert pipeline: a concurrent compaction between an epoch's write and
its commit.

A maintenance job (Spark's ``rewrite_data_files``, say) replaces a data file of the table with a
file of equal content while an upsert epoch is between its write and its commit. The write rewrote
that very file (it holds keys the epoch changes), so committing the write as it is would bring the
compacted file's rows back beside the write's own copy of them, or undo the compaction: the commit
must refuse (``UpsertConflict``) and the epoch be written again against the table as it is now.

The moment is made, not hoped for: a ``pause`` rule of the fault plan holds the epoch's persist
right after its Pending row exists (``persist.inserted``; the write has read the table by then),
and the compaction lands during the pause, found from the persist task's log. The re-write's
persist (``persist_1``) replaces the Pending write and so does not pass that point again.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.expressions import AlwaysTrue, In
from pyiceberg.io.pyarrow import ArrowScan, parquet_file_to_data_file, schema_to_pyarrow
from pyiceberg.table import Table

from airflow_provider_exactly_once.sinks.layout import iceberg_data_root
from demo.world import hour_dir
from fault_harness.landed import COLUMNS
from fault_harness.plans import ACTION_TIMEOUT_S, Action, Context, Rule, wait_for
from fault_harness.upsert_changes import KEY, read_changes

#: Where the compaction waits: the epoch's persist, just after its Pending row was inserted.
COMPACTION_POINT = "persist.inserted"
#: How long the persist is held there: the compaction needs a few seconds, the log line a moment.
COMPACTION_PAUSE_S = 20.0
#: The snapshot-summary property naming the harness's compaction (it carries no sink marker).
COMPACTION_PROPERTY = "fault-harness.compaction"


def compaction_rule(epoch_index: int) -> Rule:
    """The pause that holds hour ``epoch_index``'s persist for the compaction: on any try, since a
    try may fail before inserting (a meta-store outage) and only the try that inserts reaches the
    point. Put it before the epoch's other rules: a kill at the same point then lands after the pause."""
    return Rule(epoch_index, COMPACTION_POINT, mode="pause", seconds=COMPACTION_PAUSE_S, try_number=None)


def concurrent_compaction(epoch_index: int, *, expect_conflict: bool = True) -> Action:
    """While hour ``epoch_index``'s persist is paused (``compaction_rule``), replace one data file
    holding a key the hour changes by an equal-content file, in a snapshot of its own; once every
    run ended, check the compaction stands (its snapshot an ancestor of the current one, the file
    it removed not live again) and the hour's run succeeded. ``expect_conflict``: fail unless a
    commit of the epoch met ``UpsertConflict`` (a random plan only notes it: a recovery run may
    commit the epoch before the compaction lands)."""

    def action(ctx: Context) -> None:
        p = ctx.pipeline
        epoch = p.epoch(epoch_index)
        # Until the run's own deadline: an upsert pipeline's hours run one at a time, so on a long
        # plan a late hour's persist may come after most of the run (as ``reprocessing._first_pass``).
        wait_for(
            ctx,
            f"hour {epoch_index}'s persist paused at {COMPACTION_POINT}",
            lambda: _logged(ctx, "events.persist", f"pause at {COMPACTION_POINT}", f"epoch={epoch}"),
            timeout=max(ACTION_TIMEOUT_S, ctx.deadline - time.monotonic()),
        )
        keys = {c.key for c in read_changes(hour_dir(p.landing, p.hours[epoch_index]))}
        done = _compact(ctx, keys)
        if done is None:
            ctx.note(f"compaction: no data file holds a key hour {epoch_index} changes; nothing compacted")
            if expect_conflict:
                raise RuntimeError(f"hour {epoch_index}: nothing to compact, the scenario cannot test the conflict")
            return
        snapshot_id, old, new, rows = done
        ctx.note(f"compaction: {old} ({rows} rows) replaced by {new} in snapshot {snapshot_id}, during the pause")
        ctx.settled.wait()
        _verify(ctx, epoch_index, snapshot_id, old, expect_conflict)

    return action


def _compact(ctx: Context, keys: set[str]) -> tuple[int, str, str, int] | None:
    return compact(lambda: ctx.harness.load_table(ctx.pipeline), keys, ctx.note)


def compact(
    load: Callable[[], Table], keys: set[str], note: Callable[[str], None] = lambda _: None
) -> tuple[int, str, str, int] | None:
    """One live data file holding any of ``keys`` replaced by an equal-content file, in a snapshot
    of its own without a sink marker: (that snapshot, the file replaced, the new file, rows), or
    ``None`` when no file holds any of them. A lost race with another commit is retried (the file
    is then looked for again), as a maintenance job would."""
    for attempt in range(1, 6):
        table = load()
        found = _file_holding(table, keys)
        if found is None:
            return None
        task_file, data = found
        schema = schema_to_pyarrow(table.schema(), include_field_ids=True)
        new = f"{iceberg_data_root(table.location(), table.properties)}/compacted-{uuid.uuid4()}.parquet"
        with table.io.new_output(new).create() as stream, pq.ParquetWriter(stream, schema) as writer:
            writer.write_table(pa.Table.from_arrays([data.column(f.name).cast(f.type) for f in schema], schema=schema))
        try:
            with table.transaction() as tx:
                update = tx.update_snapshot(snapshot_properties={COMPACTION_PROPERTY: "rewrite_data_files"})
                with update.overwrite() as overwrite:
                    overwrite.delete_data_file(task_file)
                    overwrite.append_data_file(parquet_file_to_data_file(table.io, table.metadata, new))
        except CommitFailedException as exc:
            note(f"compaction attempt {attempt} lost a race ({exc}); again")
            time.sleep(1)
            continue
        head = load().current_snapshot()
        assert head is not None
        return head.snapshot_id, task_file.file_path, new, data.num_rows
    raise RuntimeError("the compaction lost five races in a row")


def _file_holding(table: Table, keys: set[str]) -> tuple[Any, pa.Table] | None:
    """The first live data file (by path) whose rows hold one of ``keys``, and its rows."""
    if table.current_snapshot() is None or not keys:
        return None
    wanted = pa.array(sorted(keys), pa.string())
    scan = ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue())
    for task in sorted(
        table.scan(row_filter=In(term=KEY, literals=sorted(keys))).plan_files(), key=lambda t: t.file.file_path
    ):
        data = scan.to_table([task]).select(list(COLUMNS))
        if pc.any(pc.is_in(data.column(KEY), value_set=wanted)).as_py():
            return task.file, data
    return None


def _verify(ctx: Context, epoch_index: int, snapshot_id: int, old: str, expect_conflict: bool) -> None:
    table = ctx.harness.load_table(ctx.pipeline)
    ancestors: set[int] = set()
    current = table.current_snapshot()
    while current is not None:
        ancestors.add(current.snapshot_id)
        current = table.snapshot_by_id(current.parent_snapshot_id) if current.parent_snapshot_id else None
    live = {t.file.file_path for t in table.scan().plan_files()}
    conflicts = _logged_count(ctx, "events.commit", "UpsertConflict")
    run = ctx.harness.run_of(ctx.pipeline, epoch_index)
    states = {
        str(ti.task_id): str(ti.state)
        for ti in ctx.cluster.task_instances(ctx.pipeline.dag_id)
        if str(ti.run_id) == str(run.run_id) and str(ti.task_id).startswith("events.")
    }
    ctx.note(
        f"after the runs: compaction snapshot {snapshot_id} {'is' if snapshot_id in ancestors else 'is NOT'} an "
        f"ancestor of the current one; the replaced file {'is live again' if old in live else 'stays out'}; "
        f"{conflicts} commit log(s) name UpsertConflict; hour {epoch_index}'s run {run.state}, tasks {states}"
    )
    faults = []
    if snapshot_id not in ancestors:
        faults.append("the compaction's snapshot is no longer in the table's history: it was undone")
    if old in live:
        faults.append(f"the file the compaction replaced, {old}, is live again")
    if str(run.state) != "success":
        faults.append(f"hour {epoch_index}'s run ended {run.state}, not success")
    if expect_conflict and not conflicts:
        faults.append("no commit of the epoch met UpsertConflict: the compaction did not land between write and commit")
    if faults:
        raise RuntimeError("; ".join(faults))


def _task_logs(ctx: Context, task_id: str) -> list[str]:
    logs = ctx.cluster.root / "logs" / "tasks" / f"dag_id={ctx.pipeline.dag_id}"
    texts = []
    for path in sorted(logs.glob(f"run_id=*/task_id={task_id}/attempt=*.log")):
        try:
            texts.append(path.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            continue
    return texts


def _logged(ctx: Context, task_id: str, *needles: str) -> bool:
    """Whether one line of a log of the pipeline's ``task_id`` (any run, any try) holds every needle."""
    return any(all(n in line for n in needles) for text in _task_logs(ctx, task_id) for line in text.splitlines())


def _logged_count(ctx: Context, task_id: str, needle: str) -> int:
    return sum(1 for text in _task_logs(ctx, task_id) if needle in text)
