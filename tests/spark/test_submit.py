"""The epoch writer as ``spark-submit`` runs it: local[2], a real standalone cluster, and failure exits."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.transforms import DayTransform

from airflow_provider_exactly_once.core.precommit import PreCommit
from airflow_provider_exactly_once.spark.epoch_writer import ERROR_PREFIX
from tests.spark.conftest import files_under, job_spec, land, make_table, sample_rows, submit
from tests.spark.test_epoch_writer import (
    check_descriptors_against_files,
    commit_iceberg,
    files_input,
    iceberg_target,
    sorted_rows,
)

REPO = Path(__file__).resolve().parents[2]


def test_submit_local_day_partitioned_table(tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str]) -> None:
    rows = sample_rows(1000)
    land(tmp_path / "landing", rows)
    table = make_table(catalog, "ns.daily", PartitionSpec(PartitionField(3, 1000, DayTransform(), "ts_day")))
    job = job_spec(tmp_path, input=files_input(tmp_path / "landing"), target=iceberg_target(catalog_props, "ns.daily"))

    result = submit(job, "local[2]", tmp_path)

    assert result.returncode == 0, result.stderr[-3000:]
    pre_commit = PreCommit.from_json(Path(job.output_path).read_text())
    assert pre_commit.write_id == job.write_id and pre_commit.record_count == 1000
    check_descriptors_against_files(pre_commit, table)
    commit_iceberg(catalog, pre_commit)
    assert sorted_rows(catalog.load_table("ns.daily").scan().to_arrow()) == sorted_rows(rows)


def test_submit_failure_exits_non_zero_names_the_fault_and_removes_its_files(
    tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    make_table(catalog, "ns.t")
    job = job_spec(
        tmp_path,
        input={"kind": "function", "callable": "tests.spark.user_functions:lazily_failing"},
        target=iceberg_target(catalog_props, "ns.t"),
    )
    before = files_under(tmp_path)

    result = _submit_with_repo_path(job, tmp_path)

    assert result.returncode == 1
    expected = (
        f"{ERROR_PREFIX} sink 'sink-a' epoch {job.epoch} write {job.write_id}: ValueError: row 7 cannot be parsed"
    )
    assert expected in result.stdout + result.stderr  # spark-submit forwards the Python driver's stderr to stdout
    assert Path(job.output_path + ".error").read_text().endswith("ValueError: row 7 cannot be parsed")
    assert not Path(job.output_path).exists()
    new = files_under(tmp_path) - before
    assert all(p.endswith((".json", ".error")) and "warehouse" not in p for p in new), new


def _submit_with_repo_path(job: Any, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """The user function lives in the test package, which the driver must be able to import."""
    import os

    previous = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(REPO)
    try:
        return submit(job, "local[2]", tmp_path)
    finally:
        if previous is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = previous


def test_bad_spec_exits_2(tmp_path: Path) -> None:
    from airflow_provider_exactly_once.spark.epoch_writer import main

    assert main([str(tmp_path / "nope.json")]) == 2
    assert main(['{"sink_id": "a b"}']) == 2


def test_submit_to_standalone_cluster(
    standalone: str, tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    rows = sample_rows(800)
    land(tmp_path / "landing", rows)
    table = make_table(catalog, "ns.daily", PartitionSpec(PartitionField(3, 1000, DayTransform(), "ts_day")))
    job = job_spec(tmp_path, input=files_input(tmp_path / "landing"), target=iceberg_target(catalog_props, "ns.daily"))

    result = submit(
        job, standalone, tmp_path, "--deploy-mode", "client", "--total-executor-cores", "1", "--executor-memory", "512m"
    )

    assert result.returncode == 0, result.stderr[-3000:]
    assert "Connected to Spark cluster with app ID" in result.stderr  # the cluster ran it, not local mode
    assert "Granted executor ID app-" in result.stderr
    pre_commit = PreCommit.from_json(Path(job.output_path).read_text())
    check_descriptors_against_files(pre_commit, table)
    commit_iceberg(catalog, pre_commit)
    assert sorted_rows(catalog.load_table("ns.daily").scan().to_arrow()) == sorted_rows(rows)
