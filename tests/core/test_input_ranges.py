"""The rules of an incremental input's chain of ranges (``core.input_ranges``), as pure functions."""

from __future__ import annotations

import pytest

from airflow_provider_exactly_once.core.epochs import EpochStatus
from airflow_provider_exactly_once.core.errors import EarlierEpochUndecided, InputRangeRefused
from airflow_provider_exactly_once.core.input_ranges import (
    Link,
    Replay,
    Reserve,
    SnapshotRange,
    range_decision,
    range_read_elsewhere,
)

TABLE = "bronze.events"
COMMITTED, ABORTED, PENDING = EpochStatus.COMMITTED, EpochStatus.ABORTED, EpochStatus.PENDING


def link(epoch: int, position: int, after: int | None, to: int | None) -> Link:
    return Link(epoch, position, SnapshotRange(table=TABLE, after_snapshot_id=after, to_snapshot_id=to))


def decide(
    epoch: int, links: list[Link], statuses: dict[int, EpochStatus], start: int | None = None
) -> Replay | Reserve:
    return range_decision("s", epoch, TABLE, links, statuses.get, start)


def test_the_first_epoch_reads_from_the_tables_first_snapshot_or_the_inputs_start() -> None:
    assert decide(10, [], {}) == Reserve(0, None, decide(10, [], {}).why)
    assert isinstance(decide(10, [], {}, start=7), Reserve) and decide(10, [], {}, start=7).after_snapshot_id == 7  # type: ignore[union-attr]


def test_the_next_epoch_starts_where_the_last_committed_one_ended() -> None:
    chain = [link(10, 0, None, 100), link(20, 1, 100, 200)]
    decision = decide(30, chain, {10: COMMITTED, 20: COMMITTED})
    assert isinstance(decision, Reserve)
    assert (decision.position, decision.after_snapshot_id) == (2, 200)


def test_an_aborted_epochs_range_is_read_by_the_next_one() -> None:
    chain = [link(10, 0, None, 100), link(20, 1, 100, 200)]
    decision = decide(30, chain, {10: COMMITTED, 20: ABORTED})
    assert isinstance(decision, Reserve)
    assert (decision.position, decision.after_snapshot_id) == (2, 100)
    everything_aborted = decide(30, chain, {10: ABORTED, 20: ABORTED}, start=5)
    assert isinstance(everything_aborted, Reserve) and everything_aborted.after_snapshot_id == 5


@pytest.mark.parametrize("status", [PENDING, None])
def test_a_new_range_waits_until_the_newest_epoch_settles(status: EpochStatus | None) -> None:
    chain = [link(10, 0, None, 100)]
    statuses = {} if status is None else {10: status}
    with pytest.raises(EarlierEpochUndecided, match=r"epoch 10 .* is not committed or aborted yet") as caught:
        decide(20, chain, statuses)
    assert caught.value.retryable
    assert "eo-sink abort s 10" in str(caught.value)


@pytest.mark.parametrize("status", [PENDING, COMMITTED, ABORTED])
def test_an_epoch_that_reserved_reads_its_range_again(status: EpochStatus) -> None:
    chain = [link(10, 0, None, 100), link(20, 1, 100, 200)]
    decision = decide(20, chain, {10: COMMITTED, 20: status})
    assert isinstance(decision, Replay) and decision.range == chain[1].range


@pytest.mark.parametrize("status", [ABORTED, None])
def test_an_aborted_epoch_whose_range_a_later_epoch_read_is_refused(status: EpochStatus | None) -> None:
    chain = [link(10, 0, None, 100), link(20, 1, 100, 200), link(30, 2, 100, 300)]
    statuses = {10: COMMITTED, 30: PENDING} | ({} if status is None else {20: status})
    with pytest.raises(InputRangeRefused, match="read again by epoch 30") as caught:
        decide(20, chain, statuses)
    assert not caught.value.retryable


def test_a_committed_epoch_replays_even_with_later_links() -> None:
    """A reprocess of a committed epoch reads its own range: the same rows, a revision of them."""
    chain = [link(10, 0, None, 100), link(20, 1, 100, 200)]
    decision = decide(10, chain, {10: COMMITTED, 20: COMMITTED})
    assert isinstance(decision, Replay) and decision.range.to_snapshot_id == 100


def test_an_epoch_older_than_the_chain_is_refused() -> None:
    chain = [link(10, 0, None, 100), link(30, 1, 100, 300)]
    with pytest.raises(InputRangeRefused, match=r"epoch 30 was written before it .* up to snapshot 300"):
        decide(20, chain, {10: COMMITTED, 30: COMMITTED})


def test_another_upstream_table_is_refused() -> None:
    chain = [link(10, 0, None, 100)]
    with pytest.raises(InputRangeRefused, match=r"read bronze.events .* names bronze.other"):
        range_decision("s", 20, "bronze.other", chain, {10: COMMITTED}.get)


def test_a_range_describes_itself_and_round_trips_through_positions() -> None:
    ranged = SnapshotRange(table=TABLE, after_snapshot_id=1, to_snapshot_id=2)
    assert ranged.describe() == "bronze.events: after snapshot 1 to snapshot 2"
    assert SnapshotRange(table=TABLE, after_snapshot_id=2, to_snapshot_id=2).empty
    assert SnapshotRange(table=TABLE).empty
    assert SnapshotRange.of_positions(ranged.positions(files=3)) == ranged
    assert SnapshotRange.of_positions({"kind": "files"}) is None
    with pytest.raises(ValueError, match="ends nowhere"):
        SnapshotRange(table=TABLE, after_snapshot_id=1)


def test_the_commit_fence_refuses_a_range_another_epoch_read_from_the_same_start() -> None:
    ranged = SnapshotRange(table=TABLE, after_snapshot_id=100, to_snapshot_id=200)
    asked: list[SnapshotRange] = []

    def taken(reserved: SnapshotRange) -> int | None:
        asked.append(reserved)
        return 30

    refusal = range_read_elsewhere("s", 20, ranged.positions(), taken)
    assert isinstance(refusal, InputRangeRefused) and "starts where epoch 30's does" in str(refusal)
    assert asked == [ranged]
    assert range_read_elsewhere("s", 20, ranged.positions(), lambda _: None) is None
    empty = SnapshotRange(table=TABLE, after_snapshot_id=100, to_snapshot_id=100)
    assert range_read_elsewhere("s", 20, empty.positions(), taken) is None  # an empty range read nothing
    assert range_read_elsewhere("s", 20, {"kind": "files"}, taken) is None
    assert len(asked) == 1
