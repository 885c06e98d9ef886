"""Fan-out: one Spark job reads the epoch's input once and writes it into several tables of one
sink, each table taking its own part, as one pre-commit that the Iceberg committer commits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.transforms import DayTransform, IdentityTransform

from airflow_provider_exactly_once.core.errors import InvalidSinkConfig, SchemaMismatch
from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.sinks.config import IcebergSinkConfig, TableSelect, sink_config_from_dict
from airflow_provider_exactly_once.spark.epoch_writer import WriteLocation, describe_failure, run
from airflow_provider_exactly_once.spark.jobspec import EpochJobSpec, FileSinkTarget, IcebergTarget
from tests.spark.conftest import (
    EPOCH,
    INTERVAL_END,
    INTERVAL_START,
    files_under,
    job_spec,
    land,
    local,
    make_table,
    run_in_process,
    sample_rows,
    submit,
)
from tests.spark.test_epoch_writer import commit_iceberg, files_input, iceberg_target, sorted_rows


def test_two_tables_are_written_by_one_job_as_one_pre_commit_and_committed_as_the_input_split(
    tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    rows = sample_rows(600)
    land(tmp_path / "landing", rows)
    make_table(catalog, "ns.low", PartitionSpec(PartitionField(3, 1000, DayTransform(), "ts_day")))
    make_table(catalog, "ns.high", PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "name")))
    job = job_spec(
        tmp_path,
        input=files_input(tmp_path / "landing"),
        target=[
            {**iceberg_target(catalog_props, "ns.low"), "where": "id < 250"},
            {**iceberg_target(catalog_props, "ns.high"), "query": "SELECT * FROM epoch_input WHERE id >= 250"},
        ],
    )

    result = submit(job, "local[2]", tmp_path)  # the application spark-submit runs: one job, one session

    assert result.returncode == 0, result.stderr[-3000:]
    pre_commit = PreCommit.from_json(Path(job.output_path).read_text())
    assert pre_commit.write_id == job.write_id and pre_commit.epoch == EPOCH
    assert [t.table for t in pre_commit.tables] == ["ns.low", "ns.high"]
    assert [t.location for t in pre_commit.tables] == [
        f"file://{tmp_path}/warehouse/ns/{name}/data/_eo/{job.write_id}" for name in ("low", "high")
    ]
    assert [t.record_count for t in pre_commit.tables] == [250, 350]
    assert pre_commit.source_positions is not None and pre_commit.source_positions["file_count"] == 2
    commit_iceberg(catalog, pre_commit)
    for name, part in (("ns.low", rows.slice(0, 250)), ("ns.high", rows.slice(250))):
        table = catalog.load_table(name)
        assert sorted_rows(table.scan().to_arrow()) == sorted_rows(part), name
        assert table.current_snapshot().summary["exactly-once.write-id"] == job.write_id  # type: ignore[union-attr]


def test_every_table_is_written_from_the_same_read_of_the_input(
    spark: Any, tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    """The input draws a new random ``amount`` each time it is computed: the tables agree on every
    row only if the input was read once and kept for all of them."""
    make_table(catalog, "ns.every")
    make_table(catalog, "ns.small", PartitionSpec(PartitionField(3, 1000, DayTransform(), "ts_day")))
    job = job_spec(
        tmp_path,
        input={"kind": "function", "callable": "tests.spark.user_functions:random_amounts"},
        target=[
            iceberg_target(catalog_props, "ns.every"),
            {**iceberg_target(catalog_props, "ns.small"), "where": "amount < 0.5"},
        ],
    )

    pre_commit = run_in_process(spark, job)

    commit_iceberg(catalog, pre_commit)
    every = sorted_rows(catalog.load_table("ns.every").scan().to_arrow())
    small = sorted_rows(catalog.load_table("ns.small").scan().to_arrow())
    assert len(every) == 200 and 0 < len(small) < 200
    assert small == [row for row in every if row["amount"] < 0.5]


def test_a_failing_second_table_leaves_no_files_of_the_first(
    spark: Any, tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    land(tmp_path / "landing", sample_rows(300))
    make_table(catalog, "ns.first", PartitionSpec(PartitionField(3, 1000, DayTransform(), "ts_day")))
    make_table(catalog, "ns.second")
    # A nullable id for the required column: refused row by row, on the executors, while the
    # second table is written, after the first table's files are complete.
    nulls = "SELECT CASE WHEN id = 7 THEN NULL ELSE id END AS id, name, ts, amount FROM epoch_input"
    job = job_spec(
        tmp_path,
        input=files_input(tmp_path / "landing"),
        target=[
            iceberg_target(catalog_props, "ns.first"),
            {**iceberg_target(catalog_props, "ns.second"), "query": nulls},
        ],
    )
    before = files_under(tmp_path)
    written: list[WriteLocation] = []

    with pytest.raises(Exception) as caught:
        run(spark, job, written)

    assert describe_failure(caught.value).startswith("RequiredColumnHasNulls: required column 'id'")
    assert [Path(local(w.location)).parent.parent.parent.name for w in written] == ["first", "second"]
    assert files_under(tmp_path) == before
    assert not spark.catalog.tableExists("epoch_input")  # the view is the write's, not the session's


def test_a_second_table_the_input_does_not_fit_is_refused_before_any_table_is_written(
    spark: Any, tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    land(tmp_path / "landing", sample_rows(50))
    make_table(catalog, "ns.first")
    make_table(catalog, "ns.second")
    renamed = "SELECT id AS ident, name, ts, amount FROM epoch_input"
    job = job_spec(
        tmp_path,
        input=files_input(tmp_path / "landing"),
        target=[
            iceberg_target(catalog_props, "ns.first"),
            {**iceberg_target(catalog_props, "ns.second"), "query": renamed},
        ],
    )
    before = files_under(tmp_path)
    written: list[WriteLocation] = []

    with pytest.raises(SchemaMismatch, match=r"input does not fit table 'ns\.second': required table column 'id'"):
        run(spark, job, written)

    assert written == [] and files_under(tmp_path) == before


def test_an_empty_epoch_gives_every_table_an_empty_write(
    spark: Any, tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    make_table(catalog, "ns.a")
    make_table(catalog, "ns.b")
    job = job_spec(
        tmp_path,
        input=files_input(tmp_path / "nothing-landed"),
        target=[
            iceberg_target(catalog_props, "ns.a"),
            {**iceberg_target(catalog_props, "ns.b"), "query": "SELECT * FROM epoch_input WHERE id > 3"},
        ],
    )

    pre_commit = run_in_process(spark, job)

    assert [(t.table, t.is_empty) for t in pre_commit.tables] == [("ns.a", True), ("ns.b", True)]
    assert all(t.schema_written for t in pre_commit.tables)


def test_a_one_table_spec_still_loads(tmp_path: Path) -> None:
    """A spec written with a single ``target`` (the form before fan-out) loads as one target."""
    target = {"kind": "iceberg", "catalog_name": "lake", "catalog_properties": {"type": "sql"}, "table": "ns.t"}
    text = json.dumps(
        {
            "sink_id": "s",
            "epoch": EPOCH,
            "write_id": "0b6f5c1e-8d0a-4d35-9a8e-4f0b7f1d2c3e",
            "data_interval_start": INTERVAL_START.isoformat(),
            "data_interval_end": INTERVAL_END.isoformat(),
            "input": {"kind": "sql", "query": "select 1"},
            "target": target,
            "output_path": str(tmp_path / "out.json"),
        }
    )
    (tmp_path / "job.json").write_text(text)

    for source in (text, str(tmp_path / "job.json")):
        spec = EpochJobSpec.load(source)
        assert spec.targets == [IcebergTarget(catalog_name="lake", catalog_properties={"type": "sql"}, table="ns.t")]
        assert EpochJobSpec.load(spec.to_json()) == spec
    files = EpochJobSpec.load(text.replace(json.dumps(target), '{"kind": "files", "root": "/out/"}'))
    assert files.targets == [FileSinkTarget(root="/out")]


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        ({"target": {"kind": "files", "root": "/x"}, "targets": [{"root": "/x"}]}, "target or targets, not both"),
        ({"targets": []}, "at least 1"),
        ({"targets": [{"kind": "files", "root": "/x"}, {"kind": "files", "root": "/y"}]}, "a file sink is one target"),
        ({"targets": [{"table": "ns.a"}, {"table": "ns.a"}]}, "listed twice"),
        ({"targets": [{"table": "ns.a"}, {"table": "ns.b", "catalog_name": "other"}]}, "one catalog"),
        ({"targets": [{"table": "ns.a", "where": "x > 1", "query": "SELECT * FROM epoch_input"}]}, "not both"),
        ({"targets": [{"table": "ns.a", "where": "  "}]}, "where is blank"),
        ({"targets": [{"table": "ns.a", "query": "SELECT * FROM events"}]}, "does not read the epoch's input"),
    ],
)
def test_a_fan_out_spec_names_what_cannot_be_written(tmp_path: Path, change: dict[str, Any], refusal: str) -> None:
    spec: dict[str, Any] = {
        "sink_id": "s",
        "epoch": EPOCH,
        "write_id": "0b6f5c1e-8d0a-4d35-9a8e-4f0b7f1d2c3e",
        "data_interval_start": INTERVAL_START.isoformat(),
        "data_interval_end": INTERVAL_END.isoformat(),
        "input": {"kind": "sql", "query": "select 1"},
        "output_path": str(tmp_path / "out.json"),
        **change,
    }
    for target in spec.get("targets", []):
        target.setdefault("kind", "files" if "root" in target else "iceberg")
    with pytest.raises(InvalidSinkConfig, match=refusal):
        EpochJobSpec.load(json.dumps(spec))


def test_a_sinks_selections_are_validated_once_and_survive_its_dict_form() -> None:
    sink = IcebergSinkConfig(
        "fan",
        ("ns.a", "ns.b", "ns.c"),
        select={"ns.b": TableSelect(where="kind = 'x'"), "ns.c": TableSelect(query="SELECT id FROM epoch_input")},
    )
    data = sink.model_dump(mode="json")
    assert data["select"] == {"ns.b": {"where": "kind = 'x'"}, "ns.c": {"query": "SELECT id FROM epoch_input"}}
    assert sink_config_from_dict(json.loads(json.dumps(data))) == sink
    # a sink without selections keeps the dict form it was registered with
    assert "select" not in IcebergSinkConfig("one", ("ns.a",)).model_dump(mode="json")

    with pytest.raises(InvalidSinkConfig, match=r"'ns\.z', which is not one of"):
        IcebergSinkConfig("fan", ("ns.a",), select={"ns.z": TableSelect(where="true")})
    with pytest.raises(InvalidSinkConfig, match="exactly one of where= and query="):
        TableSelect()
    with pytest.raises(InvalidSinkConfig, match="exactly one of where= and query="):
        TableSelect(where="a", query="SELECT * FROM epoch_input")
    with pytest.raises(InvalidSinkConfig, match="does not read the epoch's input"):
        TableSelect(query="SELECT * FROM somewhere_else")
    with pytest.raises(InvalidSinkConfig, match=r"select of 'ns\.a'.*unexpected keyword"):
        sink_config_from_dict(
            {**IcebergSinkConfig("fan", ("ns.a",)).model_dump(mode="json"), "select": {"ns.a": {"filter": "x"}}}
        )
