"""The harness's side of an incremental pipeline (``mode="incremental"``): the producer that appends
to its upstream table while its epochs run, and its reprocessing (a committed epoch and an aborted
one cleared once the runs ended).

The producer's stopping rule, so that every row it appends is consumed: it appends until the run of
the third-to-last epoch has ended, then stops. The DAG runs one epoch at a time, so the last two
epochs' runs start after that; an epoch's range ends at the upstream snapshot current when it
reserves, and the last epoch cannot reserve before the one before it settled (its run ended), which
takes that run's whole write, persist and commit: the producer's last append, at most one batch
after it saw the third-to-last run end, lands before the last epoch reserves. The last committed
range then ends at the producer's last snapshot (the checker requires it); the last epoch most
often reads an empty range. That ordering is timing, not a lock, so the producer checks it once it
stopped: should the last epoch have reserved already, its action fails (a harness error, reported
as such), rather than the checker calling rows the last epoch never saw missing.
"""

from __future__ import annotations

import datetime as dt
import random
import time
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from airflow_provider_exactly_once.store import SqlSinkStateStore
from fault_harness.harness import START, TERMINAL
from fault_harness.incremental_checker import Produced
from fault_harness.layout import WRITE_POINT
from fault_harness.plans import Action, Context, Rule
from fault_harness.reprocessing import _first_pass, _rerun

#: Seconds between two appends (drawn uniformly) and rows per append: an epoch's run takes 10-30 s,
#: so its range holds several snapshots.
PRODUCER_PAUSE_S = (1.0, 4.0)
PRODUCER_ROWS = (1, 4)


def _run_ended(ctx: Context, n: int) -> bool:
    hour = ctx.pipeline.hours[n]
    for row in ctx.cluster.dag_runs(ctx.pipeline.dag_id):
        if row.data_interval_start is not None and row.data_interval_start.astimezone(dt.UTC) == hour:
            return str(row.state) in TERMINAL
    return False


def producer_row(rng: random.Random, n: int) -> dict[str, Any]:
    """The producer's ``n``-th row (a unique id), in the event table's columns."""
    return {
        "event_id": f"up-{n:06d}",
        "user_id": rng.randrange(1, 500),
        "event_type": rng.choice(("click", "view", "purchase")),
        "event_time": START + dt.timedelta(seconds=n, microseconds=rng.randrange(1_000_000)),
        "amount": None if rng.random() < 0.3 else round(rng.uniform(1, 200), 2),
    }


def produce_upstream(
    *, pause_s: tuple[float, float] = PRODUCER_PAUSE_S, rows: tuple[int, int] = PRODUCER_ROWS
) -> Action:
    """Append small batches of new rows to the pipeline's upstream table through the catalog, as
    another engine would, until the run of the third-to-last epoch ended (module docstring); the
    record (``Pipeline.produced``) is what the checker holds the upstream to."""

    def action(ctx: Context) -> None:
        p = ctx.pipeline
        rng = random.Random(f"{p.name}-producer")
        produced = Produced(p.upstream)
        stop_after = p.epochs - 3
        n = 0
        try:
            while not _run_ended(ctx, stop_after):
                if time.monotonic() > ctx.deadline:
                    raise TimeoutError(f"{p.name}: the run of epoch {stop_after} did not end before the deadline")
                batch = [producer_row(rng, n + i) for i in range(rng.randint(*rows))]
                n += len(batch)
                try:
                    table = ctx.harness.catalog.load_table(p.upstream)
                    table.append(pa.Table.from_pylist(batch, schema=table.schema().as_arrow()))
                except Exception as exc:  # like any writer, it goes on (its rows may have landed)
                    produced.failed_appends += 1
                    ctx.note(f"producer: an append failed: {type(exc).__name__}: {str(exc)[:200]}")
                else:
                    produced.appends += 1
                    produced.ids.extend(str(r["event_id"]) for r in batch)
                time.sleep(rng.uniform(*pause_s))
        finally:
            produced.last_snapshot_id = ctx.harness.catalog.load_table(p.upstream).metadata.current_snapshot_id
            p.produced = produced
        ctx.note(
            f"producer stopped once the run of epoch {stop_after} ended: {produced.appends} appends "
            f"({produced.failed_appends} failed), {len(produced.ids)} rows, last snapshot {produced.last_snapshot_id}"
        )
        last = p.epoch(p.epochs - 1)
        store = SqlSinkStateStore(ctx.cluster.meta.url())
        try:
            early = [link for link in store.input_ranges.chain(p.sink_id).links if link.epoch == last]
        finally:
            store.dispose()
        if early:
            raise AssertionError(
                f"{p.name}: the last epoch reserved {early[0].range.describe()} before the producer's last append "
                f"(snapshot {produced.last_snapshot_id}): the harness's stopping rule did not hold, so the run "
                "cannot tell whether every appended row was consumed"
            )

    return action


def reprocess_incremental(committed: int, aborted: int) -> Action:
    """Once the runs ended: clear the run of the committed epoch ``committed`` and of the aborted
    epoch ``aborted`` (whose range the epoch after it read). The first re-run reads its reserved
    range again and replaces its committed write with the same rows (a revision, with the same
    source summary); the second is refused (``InputRangeRefused``: its rows are delivered by the
    next epoch) and stays aborted. The reserved ranges do not change."""

    def action(ctx: Context) -> None:
        p, h = ctx.pipeline, ctx.harness
        before = _first_pass(ctx)
        if before.get(committed, ("", 0))[0] != "success" or before.get(aborted, ("", 0))[0] != "failed":
            raise AssertionError(
                f"{p.name}: before the clears, hour {committed} must be success and hour {aborted} failed: {before}"
            )
        ranges = _ranges(ctx)
        hours = sorted({committed, aborted})
        _rerun(
            ctx,
            before,
            lambda: h.clear_cli(p, hours),
            f"tasks clear of hours {hours}",
            expect=set(hours),
            origin="cleared",
            failing={aborted},
        )
        try_number = h.try_numbers(p, aborted).get("transform", 0)
        run_id = h.run_of(p, aborted).run_id
        log = ctx.cluster.root / "logs" / "tasks" / f"dag_id={p.dag_id}" / f"run_id={run_id}"
        text = _read(log / "task_id=transform" / f"attempt={try_number}.log")
        reason = f"read again by epoch {p.epoch(aborted + 1)}"
        if "InputRangeRefused" not in text or reason not in text:
            raise AssertionError(
                f"{p.name}: the re-run of the aborted hour {aborted} (transform try {try_number}) was not refused "
                f"for its range ({reason!r} not in its log)"
            )
        ctx.note(f"the re-run of the aborted hour {aborted} was refused: InputRangeRefused, its range {reason}")
        after = _ranges(ctx)
        if after != ranges:
            raise AssertionError(f"{p.name}: the clears changed the reserved ranges: {ranges} -> {after}")
        ctx.note(f"the reserved ranges of every epoch are as before the clears ({len(after)} links)")

    action.__qualname__ = f"reprocess_incremental(committed {committed}, aborted {aborted})"
    return action


def _ranges(ctx: Context) -> dict[int, tuple[int, int | None, int | None]]:
    store = SqlSinkStateStore(ctx.cluster.meta.url())
    try:
        chain = store.input_ranges.chain(ctx.pipeline.sink_id)
    finally:
        store.dispose()
    return {
        link.epoch: (link.position, link.range.after_snapshot_id, link.range.to_snapshot_id) for link in chain.links
    }


def _read(path: Any) -> str:
    try:
        return str(path.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return ""


#: The task that reaches each fault point of an epoch; in an audited pipeline (design.md D23) the
#: audit commit reaches ``audit.committed`` and the publish the audit's verdict and the commit's points.
def _task_of(point: str, audited: bool = False) -> str:
    if point == WRITE_POINT:
        return "transform"
    if point.startswith("persist."):
        return "events.persist"
    if audited:
        return "events.audit_commit" if point == "audit.committed" else "events.publish"
    return "events.commit"


def kills_fired(rules: Sequence[Rule], *, audited: bool = False) -> Action:
    """Once every run ended: each rule (a kill on try 1) fired, i.e. its task went on to a second
    try, except where the epoch never reached the point: an ``iceberg.*`` point of an epoch whose
    range was empty (an empty write commits no snapshot, so its commit passes no catalog update),
    noted. Notes the tries. ``audited``: the pipeline's commit is an audit commit and a publish."""

    def action(ctx: Context) -> None:
        ctx.settled.wait()
        p, h = ctx.pipeline, ctx.harness
        store = SqlSinkStateStore(ctx.cluster.meta.url())
        try:
            ranges = {link.epoch: link.range for link in store.input_ranges.chain(p.sink_id).links}
        finally:
            store.dispose()
        fired, unreached, missed = [], [], []
        for rule in rules:
            task = _task_of(rule.point, audited)
            tries = h.try_numbers(p, rule.epoch).get(task, 0)
            reserved = ranges.get(p.epoch(rule.epoch))
            if tries >= 2:
                fired.append(rule.epoch)
            elif rule.point.startswith("iceberg.") and reserved is not None and reserved.empty:
                unreached.append(f"hour {rule.epoch} {rule.point} (empty range)")
            else:
                missed.append(f"hour {rule.epoch} {rule.point} ({task} try {tries})")
        ctx.note(
            f"kills fired in {len(fired)} of {len(rules)} epochs"
            + (f"; not reached: {', '.join(unreached)}" if unreached else "")
        )
        if missed:
            raise AssertionError(f"{p.name}: armed kills that did not fire: {'; '.join(missed)}")

    return action
