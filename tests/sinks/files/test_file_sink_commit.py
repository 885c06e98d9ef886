"""File-sink commits on the happy path: layout, naming, empty epochs, validation, other roots."""

from __future__ import annotations

import json
import os
import random
from datetime import UTC, datetime
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_exactly_once.core.errors import CommitRefused, InvalidPreCommit, InvalidSinkConfig
from airflow_provider_exactly_once.core.ports import EMPTY, CommitPlan, ReplacedWrite, SinkCommitter
from airflow_provider_exactly_once.core.precommit import (
    DataFileDescriptor,
    PartitionValue,
    PreCommit,
    TableWrite,
)
from airflow_provider_exactly_once.sinks.files import (
    HIVE_DEFAULT_PARTITION,
    FileSinkCommitter,
    escape_path_component,
    partition_path,
)

from .helpers import EPOCH, StagedFile, final_files, stage_write, staged_files

SINCE = datetime(2024, 1, 1, tzinfo=UTC)


def read_ids(root: Path | str, **kwargs: object) -> list[int]:
    schema = pa.schema([("id", pa.int64())])
    table = ds.dataset(str(root), format="parquet", schema=schema, **kwargs).to_table()
    return sorted(table.column("id").to_pylist())


def test_is_a_sink_committer(committer: FileSinkCommitter) -> None:
    assert isinstance(committer, SinkCommitter)


def test_happy_path_readers_see_exactly_the_committed_rows(committer: FileSinkCommitter, sink_root: Path) -> None:
    pre = stage_write(
        committer,
        [StagedFile([1, 2, 3], writer="0"), StagedFile([4, 5], writer="1"), StagedFile([6], writer="1")],
    )
    assert read_ids(sink_root) == []  # staged files are invisible: `_staging` is skipped by readers
    assert committer.find_committed(pre, SINCE).tables == {}

    assert committer.commit(committer.prepare(pre), SINCE) == {str(sink_root): "files:3"}

    assert read_ids(sink_root) == [1, 2, 3, 4, 5, 6]
    assert final_files(committer) == [f"{EPOCH}-0-0.parquet", f"{EPOCH}-1-0.parquet", f"{EPOCH}-1-1.parquet"]
    assert not (sink_root / "_staging" / pre.write_id).exists()
    visible = committer.find_committed(pre, SINCE)
    assert visible.tables == {str(sink_root): "files:3"}
    assert visible.write_ids == {str(sink_root): None}

    # idempotent: the same commit again, unprepared (a resumed commit), changes nothing
    assert committer.commit(CommitPlan(pre), SINCE) == {str(sink_root): "files:3"}
    assert read_ids(sink_root) == [1, 2, 3, 4, 5, 6]


def test_ordinals_follow_the_staged_paths(committer: FileSinkCommitter) -> None:
    pre = stage_write(
        committer, [StagedFile([1], writer="7"), StagedFile([2], writer="7"), StagedFile([3], writer="7")]
    )
    by_staged = sorted(committer.plan(pre), key=lambda m: m.descriptor.path)
    assert [os.path.basename(m.final) for m in by_staged] == [f"{EPOCH}-7-{n}.parquet" for n in range(3)]
    committer.commit(CommitPlan(pre), SINCE)
    first = pq.read_table(os.path.join(committer.root, f"{EPOCH}-7-0.parquet")).column("id").to_pylist()
    assert first == [1]  # part-00000 is the first staged path


def test_partitioned_layout_is_hive_style(committer: FileSinkCommitter, sink_root: Path) -> None:
    pre = stage_write(
        committer,
        [
            StagedFile([1, 2], partition={"day": 19_700, "country": "nl"}, writer="0"),
            StagedFile([3], partition={"day": 19_700, "country": "a/b:c"}, writer="0"),
            StagedFile([4], partition={"country": None, "day": 19_701}, writer="2"),
            StagedFile([5], partition={"day": 19_700, "country": "nl"}, writer="0"),
        ],
    )
    committer.commit(CommitPlan(pre), SINCE)
    assert final_files(committer) == [
        f"country=__HIVE_DEFAULT_PARTITION__/day=19701/{EPOCH}-2-0.parquet",
        f"country=a%2Fb%3Ac/day=19700/{EPOCH}-0-0.parquet",
        f"country=nl/day=19700/{EPOCH}-0-0.parquet",
        f"country=nl/day=19700/{EPOCH}-0-1.parquet",
    ]
    table = ds.dataset(str(sink_root), format="parquet", partitioning="hive").to_table()
    rows = sorted(zip(table.column("id").to_pylist(), table.column("country").to_pylist(), strict=True))
    assert rows == [(1, "nl"), (2, "nl"), (3, "a/b:c"), (4, None), (5, "nl")]


def test_partition_path_escaping() -> None:
    assert partition_path({}) == ""
    assert partition_path({"b": True, "a": 1.5}) == "a=1.5/b=true"
    assert partition_path({"k": ""}) == f"k={HIVE_DEFAULT_PARTITION}"
    assert escape_path_component("x=1/y%z\n") == "x%3D1%2Fy%25z%0A"
    with pytest.raises(InvalidPreCommit, match="empty name"):
        partition_path({"": 1})


@settings(max_examples=60, deadline=None)
@given(
    files=st.lists(
        st.tuples(
            st.sampled_from(["0", "1", "a/b", None]),
            st.dictionaries(
                st.sampled_from(["p", "q=r", "ü"]),
                st.one_of(st.none(), st.integers(-3, 3), st.text(max_size=4)),
            ),
        ),
        max_size=12,
    ),
    seed=st.integers(0, 1000),
)
def test_final_names_are_a_pure_function_of_the_metadata(
    files: list[tuple[str | None, dict[str, PartitionValue]]], seed: int
) -> None:
    """Same names whatever order the files or the partition keys come back in (a jsonb round trip)."""
    committer = FileSinkCommitter("/nonexistent/eo-sink")
    write_id = "5f0c6a4e-1d1b-4a57-9d43-0a3c4b8a2b11"
    location = committer.staging_location(write_id)
    descriptors = [
        DataFileDescriptor(
            path=f"{location}/f{i:03d}.parquet", record_count=1, file_size_in_bytes=1, partition=p, writer=w
        )
        for i, (w, p) in enumerate(files)
    ]
    pre = PreCommit(sink_id="s", epoch=EPOCH, write_id=write_id, tables=[committer.table_write(write_id, descriptors)])
    names = {m.descriptor.path: m.final for m in committer.plan(pre)}
    assert len(set(names.values())) == len(descriptors)  # no two files share a final name
    assert all(n.startswith("/nonexistent/eo-sink/") and "/_staging/" not in n for n in names.values())

    shuffled = pre.model_dump(mode="json")
    random.Random(seed).shuffle(shuffled["tables"][0]["data_files"])
    for data_file in shuffled["tables"][0]["data_files"]:
        data_file["partition"] = dict(reversed(list(data_file["partition"].items())))
    again = PreCommit.from_json(json.dumps(shuffled))
    assert {m.descriptor.path: m.final for m in committer.plan(again)} == names


def test_empty_epoch_commits_as_empty(committer: FileSinkCommitter, sink_root: Path) -> None:
    pre = stage_write(committer, [])
    assert committer.find_committed(pre, SINCE).tables == {}
    assert committer.commit(CommitPlan(pre), SINCE) == {str(sink_root): EMPTY}
    assert committer.commit(CommitPlan(pre), SINCE) == {str(sink_root): EMPTY}
    assert final_files(committer) == []


def test_staging_by_products_are_removed_after_commit(committer: FileSinkCommitter, sink_root: Path) -> None:
    pre = stage_write(committer, [StagedFile([1])])
    staging = sink_root / "_staging" / pre.write_id
    (staging / "_SUCCESS").write_bytes(b"")
    (staging / "task-0" / ".part-00000.parquet.crc").write_bytes(b"crc")
    committer.commit(CommitPlan(pre), SINCE)
    assert not staging.exists()
    assert final_files(committer) == [f"{EPOCH}-0-0.parquet"]


# -- validation --------------------------------------------------------------------------------------


def _pre(committer: FileSinkCommitter, table: str, location: str, paths: list[str], write_id: str) -> PreCommit:
    files = [DataFileDescriptor(path=p, record_count=1, file_size_in_bytes=1) for p in paths]
    return PreCommit(
        sink_id="s",
        epoch=EPOCH,
        write_id=write_id,
        tables=[TableWrite(table=table, location=location, data_files=files)],
    )


WID = "0b3d9a47-6f1c-4bb6-9a1e-2a9d3c1f8e55"
OTHER_WID = "7c9e6679-7425-40de-944b-e07fc1f90ae7"


def test_prepare_accepts_other_spellings_of_the_root(committer: FileSinkCommitter, sink_root: Path) -> None:
    location = f"file://{sink_root}/_staging/{WID}"
    committer.prepare(_pre(committer, f"file://{sink_root}/", location, [f"{location}/a.parquet"], WID))


def test_prepare_refuses_another_root(committer: FileSinkCommitter, tmp_path: Path) -> None:
    location = committer.staging_location(WID)
    pre = _pre(committer, str(tmp_path / "elsewhere"), location, [f"{location}/a.parquet"], WID)
    with pytest.raises(InvalidPreCommit, match=r"table '.*elsewhere' is not this file sink's root"):
        committer.prepare(pre)


def test_prepare_refuses_a_location_outside_staging(committer: FileSinkCommitter, sink_root: Path) -> None:
    location = str(sink_root / "data")
    pre = _pre(committer, committer.root, location, [f"{location}/a.parquet"], WID)
    with pytest.raises(InvalidPreCommit, match=r"write location '.*/sink/data' is not the write's staging folder"):
        committer.prepare(pre)
    with pytest.raises(InvalidPreCommit, match="staging folder"):
        committer.delete_write(pre, SINCE)  # nothing outside the staging folder is ever deleted
    assert not sink_root.exists()


def test_prepare_refuses_another_writes_staging(committer: FileSinkCommitter) -> None:
    location = committer.staging_location(OTHER_WID)
    pre = _pre(committer, committer.root, location, [f"{location}/a.parquet"], WID)
    with pytest.raises(InvalidPreCommit, match=OTHER_WID):
        committer.prepare(pre)


def test_prepare_normalises_dots_in_the_location(committer: FileSinkCommitter) -> None:
    location = f"{committer.staging_location(WID)}/."
    committer.prepare(_pre(committer, committer.root, location, [f"{location}/a.parquet"], WID))
    escaping = f"{committer.staging_location(WID)}/../.."  # an empty write naming the root itself
    with pytest.raises(ValueError, match=r"'\.\.' segment"):  # refused by the pre-commit model already
        committer.prepare(_pre(committer, committer.root, escaping, [], WID))


def test_prepare_refuses_another_filesystem(committer: FileSinkCommitter) -> None:
    location = f"memory:///sink/_staging/{WID}"
    pre = _pre(committer, committer.root, location, [f"{location}/a.parquet"], WID)
    with pytest.raises(InvalidPreCommit, match="on filesystem 'memory'"):
        committer.prepare(pre)


def test_prepare_refuses_two_tables(committer: FileSinkCommitter) -> None:
    location = committer.staging_location(WID)
    pre = PreCommit(
        sink_id="s",
        epoch=EPOCH,
        write_id=WID,
        tables=[
            TableWrite(table=committer.root, location=location),
            TableWrite(table="db.t", location=location),
        ],
    )
    with pytest.raises(InvalidPreCommit, match="exactly one table write"):
        committer.prepare(pre)


def test_a_revision_is_refused_by_prepare_and_by_commit(committer: FileSinkCommitter, sink_root: Path) -> None:
    first = stage_write(committer, [StagedFile([1])])
    committed = committer.commit(committer.prepare(first), SINCE)
    replaced = ReplacedWrite(first.write_id, first, committed, None, 0, SINCE)
    second = stage_write(committer, [StagedFile([2])])
    with pytest.raises(CommitRefused, match=f"cannot replace committed write {first.write_id}"):
        committer.prepare(second, replaces=replaced)
    with pytest.raises(CommitRefused, match="nothing was moved"):
        committer.commit(CommitPlan(second, replaced), SINCE)
    assert read_ids(sink_root) == [1]
    assert len(staged_files(committer, second)) == 1


@pytest.mark.parametrize(
    ("root", "match"),
    [
        ("", "non-empty"),
        ("nosuchprotocol://bucket/x", "cannot open its filesystem"),
        ("/", "top of its filesystem"),
        ("/data/_staging/x", "inside a '_staging' folder"),
    ],
)
def test_bad_roots_are_refused(root: str, match: str) -> None:
    with pytest.raises(InvalidSinkConfig, match=match):
        FileSinkCommitter(root)


def test_a_file_as_root_is_refused(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(InvalidSinkConfig, match="not a directory"):
        FileSinkCommitter(str(tmp_path / "f"))


# -- other roots and filesystems ---------------------------------------------------------------------


def test_two_roots_keep_to_themselves(tmp_path: Path) -> None:
    a, b = FileSinkCommitter(str(tmp_path / "a")), FileSinkCommitter(str(tmp_path / "b"))
    pre_a = stage_write(a, [StagedFile([1])])
    pre_b = stage_write(b, [StagedFile([2])])
    with pytest.raises(InvalidPreCommit, match="not this file sink's root"):
        b.commit(CommitPlan(pre_a), SINCE)
    a.commit(CommitPlan(pre_a), SINCE)
    b.commit(CommitPlan(pre_b), SINCE)
    assert read_ids(tmp_path / "a") == [1]
    assert read_ids(tmp_path / "b") == [2]


def test_memory_filesystem(memory_root: str) -> None:
    committer = FileSinkCommitter(memory_root)
    assert committer.root.startswith("memory:///")
    pre = stage_write(committer, [StagedFile([1, 2], partition={"h": 3}), StagedFile([3])])
    assert pre.tables[0].location.startswith("memory:///")
    assert committer.commit(CommitPlan(pre), SINCE) == {committer.root: "files:2"}
    assert final_files(committer) == [f"{EPOCH}-0-0.parquet", f"h=3/{EPOCH}-0-0.parquet"]
    assert staged_files(committer, pre) == []
    fs = fsspec.filesystem("memory")
    ids = sorted(
        i
        for path in final_files(committer)
        for i in pq.read_table(fs.open(f"{committer.root}/{path}")).column("id").to_pylist()
    )
    assert ids == [1, 2, 3]
    assert committer.find_committed(pre, SINCE).tables == {committer.root: "files:2"}
    assert committer.commit(CommitPlan(pre), SINCE) == {committer.root: "files:2"}
