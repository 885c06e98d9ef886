"""An upsert epoch's files and tasks follow the epoch's size and the target file size, not Spark's
shuffle partitions.

The shared session runs with 2 shuffle partitions; these tests put back Spark's default of 200,
with adaptive execution as Spark ships it, as a job submitted without settings has them. A day of
20 changes once wrote 20 files, one per shuffle partition that held a row, in over a thousand tasks.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.partitioning import PartitionSpec

from airflow_provider_exactly_once.spark.upsert import STAGING
from tests.spark.test_upsert import BY_REGION, SCHEMA, Model, Upserts, apply_to_model, changes_of

TWO_REGIONS = ("eu", "us")
#: Spark's estimate of a row of ``SCHEMA`` (a long and two strings), which the target size is
#: measured in: Spark's writer rolls its files by it, an upsert sizes its write tasks by it.
ROW_BYTES = 8 + 20 + 20
T = TypeVar("T")
Change = tuple[int, str, str | None, str]


@pytest.fixture
def default_shuffle_partitions(spark: Any) -> Iterator[None]:
    before = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "200")
    try:
        yield
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", before)


def tasks_per_stage(spark: Any, action: Callable[[], T]) -> tuple[T, list[int]]:
    """``action``'s result, and how many tasks each stage of the Spark jobs it ran completed."""
    context = spark.sparkContext
    group = f"eo-test-{uuid.uuid4().hex}"
    context.setJobGroup(group, "counted")
    try:
        result = action()
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
    tracker = context.statusTracker()
    counts = []
    for job in tracker.getJobIdsForGroup(group):
        info = tracker.getJobInfo(job)
        for stage_id in info.stageIds if info is not None else ():
            stage = tracker.getStageInfo(stage_id)
            if stage is not None and stage.numCompletedTasks:
                counts.append(stage.numCompletedTasks)
    return result, counts


def ordered(rows: list[Change]) -> pa.Table:
    """Changes with an ``order_by`` column, the usual CDC feed: the last change per key is picked
    by a shuffle, whose partitions the cached change rows keep."""
    return changes_of(rows).append_column("seq", pa.array(range(len(rows)), pa.int64()))


@pytest.mark.parametrize(("spec", "files"), [(PartitionSpec(), 1), (BY_REGION, 2)], ids=["unpartitioned", "by_region"])
def test_a_small_epoch_writes_a_file_per_partition_value_in_a_few_tasks(
    spark: Any,
    tmp_path: Path,
    catalog: Catalog,
    catalog_props: dict[str, str],
    default_shuffle_partitions: None,
    spec: PartitionSpec,
    files: int,
) -> None:
    catalog.create_table("ns.small", SCHEMA, partition_spec=spec)
    sink = Upserts(spark, tmp_path, catalog, catalog_props, "ns.small")
    model: Model = {}
    # Day 1 inserts 20 keys; day 2 updates 10 of them and inserts 10, rewriting day 1's files.
    days: list[list[Change]] = [
        [(k, TWO_REGIONS[k % 2], f"d1-{k}", "I") for k in range(20)],
        [(k, TWO_REGIONS[k % 2], f"d2-{k}", "U" if k < 20 else "I") for k in range(10, 30)],
    ]
    for day, rows in enumerate(days, start=1):
        pre_commit, tasks = tasks_per_stage(spark, functools.partial(sink.write, ordered(rows), order_by="seq"))
        (write,) = pre_commit.tables
        assert len(write.data_files) == files, f"day {day}: {[f.record_count for f in write.data_files]}"
        # A stage's tasks follow the epoch's inputs (a file, the cores, a union of two), not the 200.
        assert max(tasks) <= 2 * spark.sparkContext.defaultParallelism, f"day {day}: tasks per stage {tasks}"
        sink.persist(pre_commit)
        sink.commit(pre_commit)
        apply_to_model(model, rows)
        assert sink.rows() == model


@pytest.mark.parametrize("spec", [PartitionSpec(), BY_REGION], ids=["unpartitioned", "by_region"])
def test_a_larger_epoch_is_split_by_the_target_file_size(
    spark: Any,
    tmp_path: Path,
    catalog: Catalog,
    catalog_props: dict[str, str],
    default_shuffle_partitions: None,
    spec: PartitionSpec,
) -> None:
    catalog.create_table("ns.large", SCHEMA, partition_spec=spec)
    sink = Upserts(spark, tmp_path, catalog, catalog_props, "ns.large", target_file_size_bytes=50 * ROW_BYTES)
    rows: list[Change] = [(k, TWO_REGIONS[k % 2], f"v-{k}", "I") for k in range(200)]
    pre_commit = sink.write(ordered(rows), order_by="seq")
    (write,) = pre_commit.tables
    # 200 rows of 50 per file: four files, each a range of keys within one region.
    assert sorted(f.record_count for f in write.data_files) == [50] * 4
    # The rows were staged by partition value on their way to the files; nothing of that is left.
    location = Path(write.location.removeprefix("file://"))
    assert not (location / STAGING).exists() or not any((location / STAGING).iterdir())
    assert {p.name for p in location.rglob("*.parquet") if not p.name.startswith("_")} == {
        Path(f.path).name for f in write.data_files
    }
    if spec.fields:
        assert sorted(str(f.partition["region"]) for f in write.data_files) == ["eu", "eu", "us", "us"]
    sink.persist(pre_commit)
    sink.commit(pre_commit)
    model: Model = {}
    apply_to_model(model, rows)
    assert sink.rows() == model
