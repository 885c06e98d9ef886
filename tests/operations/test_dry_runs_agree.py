"""A dry run never promises what the action refuses (issue 31): every refusal of ``commit``, ``abort``
and ``recover`` is met first through the dry run, which must raise (or, for a recovery, list) the same
error in the same words and write nothing; then through the action itself.

Real stores (SQLite and PostgreSQL), a real pyiceberg SQL catalog, real Parquet files; the upsert
epochs come from the tests' copy-on-write writer (``tests/support/upsert_writer.py``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from airflow_provider_exactly_once.checkpoints.config import MetaStoreCheckpoint
from airflow_provider_exactly_once.core.coordinator import TwoPhaseCommitCoordinator
from airflow_provider_exactly_once.core.decisions import revision_basis
from airflow_provider_exactly_once.core.epochs import CheckpointStatus
from airflow_provider_exactly_once.core.errors import (
    AbortRefused,
    CheckpointFailed,
    CheckpointNotReady,
    EarlierEpochUndecided,
    EpochAborted,
    EpochNotFound,
    ExactlyOnceError,
    ReprocessRefused,
    UpsertConflict,
)
from airflow_provider_exactly_once.core.outcomes import CommitOutcome, PersistOutcome
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.core.upserts import UpsertSpec
from airflow_provider_exactly_once.operations import SinkOperations
from airflow_provider_exactly_once.sinks.config import IcebergSinkConfig
from tests.operations.helpers import coordinator, write
from tests.recovery.helpers import E1
from tests.support.airflow_world import World
from tests.support.upsert_writer import ARROW, KEYED, Changes, write_upsert

COMPLETED, FAILED = CheckpointStatus.COMPLETED, CheckpointStatus.FAILED
G0 = "2024-06-01T01:00:00.000000Z/0000000000"
G1 = "2024-06-02T09:30:00.000000Z/0000000001"


@dataclass
class Upserts:
    """An upsert sink registered beside the world's append sink, on a keyed table of its catalog."""

    world: World
    sink_id: str
    table: str
    coordinator: TwoPhaseCommitCoordinator

    @classmethod
    def of(cls, world: World) -> Upserts:
        sink_id, table = f"{world.sink_id}-upserts", f"{world.pipeline.namespace}.keyed"
        world.pipeline.catalog.create_table(table, schema=KEYED)
        config = IcebergSinkConfig(
            sink_id, (table,), iceberg_conn_id=world.iceberg_conn_id, upsert=UpsertSpec(key=("id",))
        )
        world.pipeline.store.registry.register_sink(
            sink_id, config.model_dump(mode="json"), MetaStoreCheckpoint().model_dump(mode="json")
        )
        driver = world.pipeline.coordinator(
            sink_id, world.pipeline.iceberg_committer(), on_reprocess={sink_id: "replace"}
        )
        return cls(world, sink_id, table, driver)

    def write(self, epoch: int, changes: Changes, generation: str = G0, *, revise: bool = False) -> PreCommit:
        basis = None
        if revise:
            found = revision_basis(self.world.pipeline.store.get(self.sink_id, epoch), generation, "replace")
            assert found is not None
            basis = found[self.table]
        pre = write_upsert(
            self.world.pipeline.catalog, self.table, self.sink_id, epoch, changes, str(uuid.uuid4()), revision=basis
        )
        return pre.model_copy(update={"generation": generation})

    def persist(self, pre: PreCommit, checkpoint: CheckpointStatus | None = None) -> None:
        self.coordinator.persist(pre)
        if checkpoint is not None:
            self.world.pipeline.checkpoint(self.sink_id, pre.epoch, checkpoint)

    def commit(self, pre: PreCommit) -> None:
        self.persist(pre, COMPLETED)
        assert self.coordinator.commit(self.sink_id, pre.epoch).outcome is CommitOutcome.COMMITTED


def _ops(world: World) -> SinkOperations:
    return SinkOperations(world.pipeline.store)


def _written(world: World, sink_id: str) -> tuple[Any, ...]:
    """What a dry run must not change: the sink's rows, its clean-up queue, the tables' snapshots."""
    store, catalog = world.pipeline.store, world.pipeline.catalog
    rows = []
    for epoch in (0, 1, 2, E1):  # every epoch the cases below write
        row = store.get(sink_id, epoch)
        rows.append(
            None if row is None else (row.status, row.write_id, row.commit_decided_at, row.error, row.updated_at)
        )
    snapshots = [
        sorted(s.snapshot_id for s in catalog.load_table(t).snapshots())
        for t in catalog.list_tables(world.pipeline.namespace)
    ]
    cleanups = sorted((c.id, c.write_id) for c in store.cleanups(sink_id))
    return tuple(rows), tuple(cleanups), tuple(map(tuple, snapshots))


def agree(world: World, sink_id: str, dry: Callable[[], object], act: Callable[[], object]) -> ExactlyOnceError:
    """The dry run raises what the action raises, word for word, and writes nothing."""
    before = _written(world, sink_id)
    with pytest.raises(ExactlyOnceError) as planned:
        dry()
    assert _written(world, sink_id) == before, "the dry run wrote something"
    with pytest.raises(ExactlyOnceError) as refused:
        act()
    assert (type(planned.value), str(planned.value)) == (type(refused.value), str(refused.value))
    return refused.value


# -- commit -------------------------------------------------------------------------------------------


def _no_row(world: World) -> tuple[str, int]:
    return world.sink_id, E1


def _aborted(world: World) -> tuple[str, int]:
    coord = coordinator(world)
    coord.persist(write(world, E1))
    coord.abort(world.sink_id, E1, reason="given up")
    return world.sink_id, E1


def _waiting(world: World) -> tuple[str, int]:
    coordinator(world).persist(write(world, E1))
    return world.sink_id, E1


def _failed(world: World) -> tuple[str, int]:
    coordinator(world).persist(write(world, E1))
    world.mark(E1, FAILED)
    return world.sink_id, E1


def _table_moved(world: World) -> tuple[str, int]:
    """The sink's own check before the commit decision (``SinkCommitter.prepare``): another writer
    compacted the upsert epoch's table after its write read it."""
    upserts = Upserts.of(world)
    upserts.commit(upserts.write(0, {k: "v0" for k in range(4)}))
    upserts.persist(upserts.write(1, {1: "e"}), COMPLETED)
    table = world.pipeline.catalog.load_table(upserts.table)
    table.overwrite(table.scan().to_arrow().cast(ARROW))
    return upserts.sink_id, 1


def _earlier_upsert_undecided(world: World) -> tuple[str, int]:
    upserts = Upserts.of(world)
    upserts.persist(upserts.write(1, {1: "a"}))  # its checkpoint still PENDING
    upserts.persist(upserts.write(2, {2: "b"}), COMPLETED)
    return upserts.sink_id, 2


def _revision_after_a_later_delete(world: World) -> tuple[str, int]:
    """Epoch 2 deletes key 21, which the table never held, and commits after the revision of epoch 1
    was persisted (its commit was decided before): nothing in the table shows that delete."""
    upserts = Upserts.of(world)
    upserts.commit(upserts.write(0, {k: "v0" for k in range(4)}))
    upserts.commit(upserts.write(1, {1: "e"}))
    revision = upserts.write(1, {3: "r", 21: "r"}, G1, revise=True)
    later = upserts.write(2, {21: None})
    upserts.persist(later, COMPLETED)
    world.pipeline.store.decide_commit(upserts.sink_id, 2, write_id=later.write_id)  # a commit that crashed
    assert upserts.coordinator.persist(revision).outcome is PersistOutcome.REVISED
    assert upserts.coordinator.commit(upserts.sink_id, 2).outcome is CommitOutcome.COMMITTED
    world.pipeline.checkpoint(upserts.sink_id, 1, COMPLETED)
    return upserts.sink_id, 1


COMMIT_REFUSALS: dict[str, tuple[Callable[[World], tuple[str, int]], type[ExactlyOnceError], str]] = {
    "no row": (_no_row, EpochNotFound, "was never persisted"),
    "aborted": (_aborted, EpochAborted, "is Aborted"),
    "checkpoint pending": (_waiting, CheckpointNotReady, "checkpoint still PENDING"),
    "checkpoint failed": (_failed, CheckpointFailed, "checkpoint FAILED"),
    "the table moved under an upsert": (_table_moved, UpsertConflict, "the table changed since the write read it"),
    "an earlier upsert epoch undecided": (_earlier_upsert_undecided, EarlierEpochUndecided, "undecided (Pending): 1"),
    "a revision after a later delete": (_revision_after_a_later_delete, ReprocessRefused, "later epoch(s) 2 deleted"),
}


@pytest.mark.parametrize("case", sorted(COMMIT_REFUSALS))
def test_every_refusal_of_the_commit_is_the_dry_runs(world: World, case: str) -> None:
    setup, error, words = COMMIT_REFUSALS[case]
    sink_id, epoch = setup(world)
    ops = _ops(world)
    refused = agree(
        world, sink_id, lambda: ops.commit(sink_id, epoch, dry_run=True), lambda: ops.commit(sink_id, epoch)
    )
    assert isinstance(refused, error) and words in str(refused)


# -- abort --------------------------------------------------------------------------------------------


def _decided(world: World) -> None:
    pre = write(world, E1)
    coordinator(world).persist(pre)
    world.pipeline.store.decide_commit(world.sink_id, E1, write_id=pre.write_id)


def _completed(world: World) -> None:
    coordinator(world).persist(write(world, E1))
    world.mark(E1, COMPLETED)


ABORT_REFUSALS: dict[str, tuple[Callable[[World], None], dict[str, bool], type[ExactlyOnceError], str]] = {
    "no row": (lambda world: None, {}, EpochNotFound, "was never persisted"),
    "commit decided": (_decided, {}, AbortRefused, "was decided"),
    "checkpoint completed": (_completed, {}, AbortRefused, "checkpoint COMPLETED"),
    "files lost, yet all there": (_decided, {"files_lost": True}, AbortRefused, "nothing is lost"),
}


@pytest.mark.parametrize("case", sorted(ABORT_REFUSALS))
def test_every_refusal_of_the_abort_is_the_dry_runs(world: World, case: str) -> None:
    setup, options, error, words = ABORT_REFUSALS[case]
    setup(world)
    ops = _ops(world)
    refused = agree(
        world,
        world.sink_id,
        lambda: ops.abort(world.sink_id, E1, reason="r", dry_run=True, **options),
        lambda: ops.abort(world.sink_id, E1, reason="r", **options),
    )
    assert isinstance(refused, error) and words in str(refused)


# -- recover ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["an earlier upsert epoch undecided", "a revision after a later delete"])
def test_what_the_recovery_would_fail_is_refused_in_its_dry_run_not_listed_to_commit(world: World, case: str) -> None:
    setup, error, words = COMMIT_REFUSALS[case]
    sink_id, epoch = setup(world)
    ops = _ops(world)
    before = _written(world, sink_id)
    plan = ops.recover(sink_id, dry_run=True)
    assert _written(world, sink_id) == before
    assert plan.report["commit"] == [] and epoch not in plan.report["waiting"]
    assert list(plan.report["refused"]) == [str(epoch)]
    assert plan.report["refused"][str(epoch)].startswith(f"{error.__name__}: ")
    assert plan.outcome == "would recover" and f"refuse [{epoch}]" in plan.detail

    result = ops.recover(sink_id)
    assert not result.ok and result.report["committed"] == []
    failed = {e.removeprefix("epoch "): why for e, why in result.report["failed"].items()}
    assert failed == plan.report["refused"]
    assert words in failed[str(epoch)]
