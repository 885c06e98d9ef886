"""The checkpoint table (final statuses stay final) and run-keyed epoch allocation."""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from airflow_provider_exactly_once.core.epochs import CheckpointStatus, epoch_from_interval_start
from airflow_provider_exactly_once.core.errors import InvalidPreCommit, StateConflict
from airflow_provider_exactly_once.store import SqlSinkStateStore

EPOCH = 1_700_000_000_000


@pytest.fixture
def name() -> str:
    return f"upstream-{uuid.uuid4().hex[:8]}"


def test_unknown_checkpoint_is_pending(store: SqlSinkStateStore, name: str) -> None:
    assert store.checkpoints.get_checkpoint(name, EPOCH) is CheckpointStatus.PENDING


@pytest.mark.parametrize("final", [CheckpointStatus.COMPLETED, CheckpointStatus.FAILED])
def test_final_statuses_stay_final(store: SqlSinkStateStore, name: str, final: CheckpointStatus) -> None:
    store.checkpoints.set_checkpoint(name, EPOCH, CheckpointStatus.PENDING, detail="waiting")
    assert store.checkpoints.get_checkpoint(name, EPOCH) is CheckpointStatus.PENDING
    store.checkpoints.set_checkpoint(name, EPOCH, final, detail="done")
    assert store.checkpoints.get_checkpoint(name, EPOCH) is final
    store.checkpoints.set_checkpoint(name, EPOCH, final)  # the same word again is a no-op
    other = CheckpointStatus.FAILED if final is CheckpointStatus.COMPLETED else CheckpointStatus.COMPLETED
    for changed in (other, CheckpointStatus.PENDING):
        with pytest.raises(StateConflict) as raised:
            store.checkpoints.set_checkpoint(name, EPOCH, changed)
        assert str(final) in str(raised.value) and str(changed) in str(raised.value) and name in str(raised.value)
    assert store.checkpoints.get_checkpoint(name, EPOCH) is final
    assert store.checkpoints.get_checkpoint(name, EPOCH + 1) is CheckpointStatus.PENDING


def test_checkpoint_set_directly_to_final(store: SqlSinkStateStore, name: str) -> None:
    store.checkpoints.set_checkpoint(name, EPOCH, CheckpointStatus.COMPLETED)
    assert store.checkpoints.get_checkpoint(name, EPOCH) is CheckpointStatus.COMPLETED
    store.checkpoints.set_checkpoint(name, EPOCH, "COMPLETED")  # type: ignore[arg-type]
    with pytest.raises(InvalidPreCommit, match="checkpoint status 'DONE'"):
        store.checkpoints.set_checkpoint(name, EPOCH, "DONE")  # type: ignore[arg-type]
    with pytest.raises(InvalidPreCommit, match="checkpoint name"):
        store.checkpoints.get_checkpoint("", EPOCH)


def test_concurrent_final_words_one_wins(store: SqlSinkStateStore, name: str) -> None:
    statuses = [CheckpointStatus.COMPLETED, CheckpointStatus.FAILED] * 4
    barrier = threading.Barrier(len(statuses))

    def attempt(status: CheckpointStatus) -> bool:
        barrier.wait()
        try:
            store.checkpoints.set_checkpoint(name, EPOCH, status)
        except StateConflict:
            return False
        return True

    with ThreadPoolExecutor(len(statuses)) as pool:
        won = list(pool.map(attempt, statuses))
    final = store.checkpoints.get_checkpoint(name, EPOCH)
    assert final is not CheckpointStatus.PENDING
    assert all(ok == (status is final) for ok, status in zip(won, statuses, strict=True))


def test_allocate_epoch_is_idempotent_per_run(store: SqlSinkStateStore, sink_id: str) -> None:
    before = epoch_from_interval_start(store.now())
    first = store.epochs.allocate_epoch(sink_id, "manual__a")
    after = epoch_from_interval_start(store.now())
    assert before <= first <= after, "a new epoch is the database clock in milliseconds"
    assert store.epochs.allocate_epoch(sink_id, "manual__a") == first
    second = store.epochs.allocate_epoch(sink_id, "manual__b")
    assert second > first
    assert store.epochs.allocate_epoch(sink_id, "manual__a") == first
    # Another sink's allocations are independent (and may take the same number).
    assert store.epochs.allocate_epoch(f"{sink_id}-x", "manual__a") >= first
    with pytest.raises(InvalidPreCommit, match="run_id"):
        store.epochs.allocate_epoch(sink_id, "")


def test_allocate_epoch_stays_above_the_largest_allocated(store: SqlSinkStateStore, sink_id: str) -> None:
    far = epoch_from_interval_start(store.now()) + 10_000_000
    with store.engine.begin() as conn:
        conn.exec_driver_sql(
            f"INSERT INTO epoch_allocation (sink_id, run_id, epoch) VALUES ('{sink_id}', 'future', {far})"
        )
    assert store.epochs.allocate_epoch(sink_id, "next") == far + 1


def test_allocate_epoch_under_eight_concurrent_threads(store: SqlSinkStateStore, sink_id: str) -> None:
    runs = [f"manual__{n % 4}" if n < 8 else f"manual__{n}" for n in range(24)]
    barrier = threading.Barrier(8)

    def allocate(run_id: str) -> tuple[str, int]:
        if run_id in {f"manual__{n}" for n in range(4)}:
            barrier.wait(timeout=30)
        return run_id, store.epochs.allocate_epoch(sink_id, run_id)

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(allocate, runs))
    by_run: dict[str, set[int]] = {}
    for run_id, epoch in results:
        by_run.setdefault(run_id, set()).add(epoch)
    assert all(len(epochs) == 1 for epochs in by_run.values()), by_run
    epochs = [next(iter(e)) for e in by_run.values()]
    assert len(set(epochs)) == len(by_run) == 20, "every run has its own epoch"
    assert {store.epochs.allocate_epoch(sink_id, run) for run in by_run} == set(epochs)
