"""Reprocessing at scale and across tables: generations racing in processes, and fan-out replacement.

Processes share nothing but the databases and the warehouse, like the tasks of a run and of its
cleared successor on two Airflow workers. Each round races an older and a newer generation's write
of one committed epoch; the newer must end visible, by one snapshot per replacement, every time.
"""

from __future__ import annotations

import multiprocessing
import os
from collections import Counter

import pytest

from airflow_provider_exactly_once.core.epochs import CheckpointStatus, EpochStatus
from airflow_provider_exactly_once.core.faults import SimulatedCrash
from airflow_provider_exactly_once.core.precommit import PreCommit
from tests.core.coordinator.test_reprocessing import (
    G1,
    G2,
    commit,
    generation,
    replacing,
    writes_per_epoch_in_every_snapshot,
)
from tests.support.faults import FaultSwitch
from tests.support.pipeline import Pipeline
from tests.support.racer import race_config, race_generations

#: Rounds of the process race (``EO_PROCESS_RACE_ROUNDS``; docs/faults.md gives the long run).
PROCESS_ROUNDS = int(os.environ.get("EO_PROCESS_RACE_ROUNDS", "20"))


def test_two_generations_racing_in_processes_end_with_the_newer_visible(pipeline: Pipeline, sink_id: str) -> None:
    pipeline.create_table("orders")
    first = generation(pipeline.write_iceberg(sink_id, 1, ["orders"]), G1)
    commit(pipeline, replacing(pipeline, sink_id), first)
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(2)
    results: multiprocessing.Queue[str] = context.Queue()
    queues: list[multiprocessing.Queue[str | None]] = [context.Queue(), context.Queue()]
    config = race_config(pipeline, sink_id)
    workers = [context.Process(target=race_generations, args=(config, q, results, barrier)) for q in queues]
    for worker in workers:
        worker.start()
    outcomes: Counter[str] = Counter()
    winners = [first.write_id]
    try:
        for n in range(PROCESS_ROUNDS):
            stamp = f"2024-07-01T00:{n // 60:02d}:{n % 60:02d}.000000Z"
            older = generation(pipeline.write_iceberg(sink_id, 1, ["orders"], rows=2), f"{stamp}/0000000001")
            newer = generation(pipeline.write_iceberg(sink_id, 1, ["orders"], rows=3), f"{stamp}/0000000002")
            pairs = [(older, newer), (newer, older)][n % 2]  # either process may hold the newer write
            for queue, write in zip(queues, pairs, strict=True):
                queue.put(write.to_json())
            round_outcomes = [results.get(timeout=180), results.get(timeout=180)]
            errors = [o for o in round_outcomes if o.startswith("error") or o == "gave up"]
            assert not errors, (n, errors[0])
            outcomes.update(round_outcomes)
            replacing(pipeline, sink_id).recover(sink_id)
            row = pipeline.store.get(sink_id, 1)
            assert row is not None and row.status is EpochStatus.COMMITTED, (n, row)
            assert row.write_id == newer.write_id, (n, round_outcomes)
            assert sorted(r["write_id"] for r in pipeline.rows("orders")) == [newer.write_id] * 3, n
            winners.append(newer.write_id)
    finally:
        for queue in queues:
            queue.put(None)
        for worker in workers:
            worker.join(timeout=60)

    # one marked snapshot per committed write (an older generation may commit first in a round,
    # then be replaced by the newer: the race's order is free, its end is not)
    history = pipeline.store.revisions.revisions(sink_id, 1)
    committed = [r.write_id for r in history if r.status in ("Replaced", "Committed")]
    assert pipeline.marker_snapshots("orders", sink_id)[1] == committed
    assert set(winners) <= set(committed) and committed[-1] == winners[-1]
    assert [r.status for r in history if r.write_id in committed][-1] == "Committed"
    for shown in writes_per_epoch_in_every_snapshot(pipeline, "orders"):
        assert all(len(writes) == 1 for writes in shown.values()), shown
    assert outcomes["REVISED"] + outcomes["REPLACED"] >= PROCESS_ROUNDS, outcomes  # a revision per round


def assert_replaced_in_every_table(
    pipeline: Pipeline, sink_id: str, first: PreCommit, second: PreCommit, rows: int
) -> None:
    """Each table shows the second write's rows alone, after one marked snapshot per write, and
    every snapshot of it shows one write per epoch."""
    for name in ("orders", "refunds"):
        assert sorted(r["write_id"] for r in pipeline.rows(name)) == [second.write_id] * rows
        assert pipeline.marker_snapshots(name, sink_id)[1] == [first.write_id, second.write_id]
        for shown in writes_per_epoch_in_every_snapshot(pipeline, name):
            assert all(len(writes) == 1 for writes in shown.values()), shown


def test_a_fan_out_epoch_is_replaced_in_every_table_by_one_snapshot_each(pipeline: Pipeline, sink_id: str) -> None:
    for name in ("orders", "refunds"):
        pipeline.create_table(name)
    coordinator = replacing(pipeline, sink_id)
    first = generation(pipeline.write_iceberg(sink_id, 1, ["orders", "refunds"], rows=4), G1)
    commit(pipeline, coordinator, first)
    second = generation(pipeline.write_iceberg(sink_id, 1, ["orders", "refunds"], rows=6), G2)
    commit(pipeline, coordinator, second)

    assert_replaced_in_every_table(pipeline, sink_id, first, second, rows=6)
    row = pipeline.store.get(sink_id, 1)
    assert (
        row is not None
        and row.revision == 1
        and set(row.committed)
        == {
            f"{pipeline.namespace}.orders",
            f"{pipeline.namespace}.refunds",
        }
    )


@pytest.mark.parametrize(
    ("point", "occurrence"),
    [
        ("iceberg.before_catalog_update", 2),  # table by table: the first table replaced, the second not yet
        ("iceberg.after_catalog_update", 1),  # one transaction: both replaced
        ("iceberg.after_catalog_update", 2),  # table by table: both replaced, not yet marked
        ("iceberg.metadata_written", 1),  # one transaction: neither replaced
        ("iceberg.in_catalog_transaction", 1),
    ],
)
def test_a_crash_between_the_tables_of_a_replacement_recovers(
    pipeline: Pipeline, sink_id: str, faults: FaultSwitch, point: str, occurrence: int
) -> None:
    """A revision of a fan-out crashed mid-way: on the SQL catalog its tables are one transaction;
    the points reached twice are those of a catalog committing table by table (Glue, or one switched to it)."""
    for name in ("orders", "refunds"):
        pipeline.create_table(name)
    coordinator = replacing(pipeline, sink_id)
    if occurrence == 2:
        committer = pipeline.table_by_table_committer()
        coordinator = pipeline.coordinator(sink_id, committer, on_reprocess={sink_id: "replace"})
    first = generation(pipeline.write_iceberg(sink_id, 1, ["orders", "refunds"], rows=4), G1)
    commit(pipeline, coordinator, first)
    second = generation(pipeline.write_iceberg(sink_id, 1, ["orders", "refunds"], rows=6), G2)
    coordinator.persist(second)
    pipeline.checkpoint(sink_id, 1, CheckpointStatus.COMPLETED)
    faults.crash_at(point, occurrence)
    with pytest.raises(SimulatedCrash, match=point):
        coordinator.commit(sink_id, 1)
    faults.disarm()
    for name in ("orders", "refunds"):  # each table shows one write, the old or the new, mid-way
        assert {r["write_id"] for r in pipeline.rows(name)} in ({first.write_id}, {second.write_id})

    report = replacing(pipeline, sink_id).recover(sink_id)
    assert report.ok and report.committed == [1], report
    assert_replaced_in_every_table(pipeline, sink_id, first, second, rows=6)
