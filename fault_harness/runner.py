"""The driver: run any number of scenarios at once on one cluster, then judge every table.

``run_scenarios`` starts every pipeline, runs the scenarios' actions beside the runs (an
incremental pipeline's producer among them, ``incremental.produce_upstream``; a fan-out's reader,
``table_reads.FanOutReader``, from the start of its runs until recovery ended), waits for
every run to finish, lets the recovery DAG run after the orphan grace period, and checks every table
(``checker.check``), telling it how many revisions each epoch went through, and each sink's
meta-store rows against their history (``history_check``). A report is JSON: the
seed and plan (random mode), per scenario the writer used, the actions taken, the runs' states, the
epochs reprocessed and the anomalies.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Sequence
from typing import Any

from fault_harness.actions import settle_late
from fault_harness.cluster import FINAL_ORPHAN_GRACE_S, Cluster
from fault_harness.harness import Harness, Pipeline
from fault_harness.incremental import produce_upstream
from fault_harness.plans import Action, Context, Scenario
from fault_harness.table_reads import FanOutReader

#: How a report names each writer of ``Scenario.writer``.
WRITERS = {
    "light": "light (pyarrow, no JVM)",
    "spark": "spark-submit (real Spark)",
    "connect": "Spark Connect (the stack's server)",
}


def run_scenarios(cluster: Cluster, scenarios: Sequence[Scenario], *, timeout: float = 1500) -> dict[str, Any]:
    """Run the scenarios at once on the cluster; the report (see the module docstring)."""
    started = time.monotonic()
    harness = Harness(cluster)
    logs: dict[str, list[str]] = {s.name: [] for s in scenarios}
    errors: dict[str, str] = {}
    settled = threading.Event()
    #: Each fan-out's reader, by scenario.
    readers: dict[str, FanOutReader] = {}
    try:
        for s in scenarios:
            s.pipeline = harness.add(
                Pipeline(
                    s.name,
                    s.epochs,
                    cluster.root / "landing" / s.name,
                    writer=s.writer,
                    write_pause_s=s.write_pause_s,
                    sensor=s.sensor,
                    failed_hours=s.failed_hours,
                    late_hours=s.late_hours,
                    max_active_runs=s.max_active_runs,
                    conn_id=s.conn_id,
                    mode=s.mode,
                    tables=s.tables,
                    audited=s.audited,
                    bad_hours=s.bad_hours,
                ),
                start_dag=False,
            )
        harness.arm(
            [
                {
                    "sink": s.pipeline.sink_id,
                    "epoch": s.pipeline.epoch(r.epoch),
                    "point": r.point,
                    "mode": r.mode,
                    "try": r.try_number,
                    "occurrence": r.occurrence,
                    "seconds": r.seconds,
                }
                for s in scenarios
                if s.pipeline is not None
                for r in s.rules
            ]
        )
        for s in scenarios:
            if s.pipeline is not None and s.tables > 1:
                readers[s.name] = FanOutReader(harness.open_catalog, s.pipeline.table_names, s.pipeline.sink_id)
                readers[s.name].start()
        for s in scenarios:
            assert s.pipeline is not None
            harness.start_dag(s.pipeline, wait=False)
        for s in scenarios:
            assert s.pipeline is not None
            cluster.wait_for_dag(s.pipeline.dag_id, timeout=300)

        def run_actions(s: Scenario, actions: Sequence[Action]) -> list[threading.Thread]:
            assert s.pipeline is not None
            ctx = Context(harness, s.pipeline, logs[s.name], settled, deadline)

            def one(action: Action) -> None:
                try:
                    action(ctx)
                except Exception:
                    errors[s.name] = traceback.format_exc(limit=3)
                    if ctx.pipeline.late_hours:
                        settle_late(ctx)  # so the runs can end; the scenario still fails on the error

            threads = [threading.Thread(target=one, args=(a,), daemon=True) for a in actions]
            for t in threads:
                t.start()
            return threads

        deadline = time.monotonic() + timeout
        # An incremental pipeline's producer is part of its mode: it appends to the upstream beside the runs.
        threads = [
            t
            for s in scenarios
            for t in run_actions(s, (produce_upstream(), *s.actions) if s.mode == "incremental" else s.actions)
        ]
        for s in scenarios:
            assert s.pipeline is not None
            harness.wait_finished(s.pipeline, timeout=max(10.0, deadline - time.monotonic()))
        settled.set()
        for t in threads:
            t.join(timeout=max(1.0, deadline - time.monotonic()))
        later = [t for s in scenarios if s.after for t in run_actions(s, s.after)]
        for t in later:
            t.join(timeout=max(1.0, deadline - time.monotonic()))
        for s in scenarios:  # again: an action (a backfill, a clear) may have re-opened runs
            assert s.pipeline is not None
            harness.wait_finished(s.pipeline, timeout=max(10.0, deadline - time.monotonic()))
        finished_at = time.monotonic()
        recovery_state = harness.run_recovery()
        for reader in readers.values():
            reader.stop.set()
            reader.join(timeout=60)
        time.sleep(max(0.0, finished_at + FINAL_ORPHAN_GRACE_S + 3 - time.monotonic()))
        collected = harness.collect_orphans()
        results = {}
        for s in scenarios:
            assert s.pipeline is not None
            checked = harness.check(s.pipeline, readers[s.name].reads if s.name in readers else None)
            results[s.name] = {
                "description": s.description,
                "writer": WRITERS[s.writer],
                "mode": s.mode,
                **({"audited": True, "bad_hours": sorted(s.bad_hours)} if s.audited else {}),
                "tables": s.pipeline.table_names,
                "runs": harness.runs(s.pipeline),
                "actions": logs[s.name],
                "action_error": errors.get(s.name),
                "reprocessed": {str(n): k for n, k in sorted(s.pipeline.reprocessed.items())},
                **checked.to_dict(),
            }
        return {
            "scenarios": results,
            "recovery_run": recovery_state,
            "orphans_collected": collected,
            "anomalies": sum(len(r["anomalies"]) for r in results.values()),
            "action_errors": sum(1 for r in results.values() if r["action_error"]),
            "faulted_epochs": sum(len({r.epoch for r in s.rules}) for s in scenarios),
            "reprocessed_epochs": sum(
                sum(s.pipeline.reprocessed.values()) for s in scenarios if s.pipeline is not None
            ),
            "epochs": sum(s.epochs for s in scenarios),
            "runs_seconds": round(finished_at - started, 1),
            "seconds": round(time.monotonic() - started, 1),
        }
    finally:
        settled.set()
        for reader in readers.values():
            reader.stop.set()
        harness.dispose()
