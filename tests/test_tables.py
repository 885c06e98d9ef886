"""``ensure_table``: repeated declarations of the sink's table leave its metadata folder as the first left it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import DayTransform
from pyiceberg.types import LongType, NestedField, StringType, TimestamptzType

from airflow_provider_exactly_once.core.errors import InvalidSinkConfig
from airflow_provider_exactly_once.tables import ensure_table

SCHEMA = Schema(
    NestedField(1, "id", LongType()),
    NestedField(2, "name", StringType()),
    NestedField(3, "at", TimestamptzType()),
)
SPEC = PartitionSpec(PartitionField(3, 1000, DayTransform(), "at_day"))


@pytest.fixture
def catalog(tmp_path: Path) -> Catalog:
    (tmp_path / "warehouse").mkdir()
    return load_catalog(
        "default", type="sql", uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=f"file://{tmp_path / 'warehouse'}"
    )


def metadata_files(catalog: Catalog, name: str) -> list[str]:
    location = catalog.load_table(name).location().removeprefix("file://")
    return sorted(p.name for p in (Path(location) / "metadata").iterdir())


def test_repeated_declarations_leave_one_metadata_file_and_create_if_not_exists_does_not(catalog: Catalog) -> None:
    for _ in range(5):
        table = ensure_table(catalog, "events.clicks", SCHEMA, SPEC)
    assert table.spec().fields[0].name == "at_day"
    [only] = metadata_files(catalog, "events.clicks")
    assert only.startswith("00000-") and only.endswith(".metadata.json")

    # what the examples did before: one stray metadata file per run once the table exists
    for _ in range(3):
        catalog.create_table_if_not_exists("events.clicks", SCHEMA, partition_spec=SPEC)
    assert len(metadata_files(catalog, "events.clicks")) == 4


def test_an_existing_table_is_returned_as_it_is(catalog: Catalog) -> None:
    ensure_table(catalog, "events.clicks", SCHEMA, SPEC)
    other = Schema(NestedField(1, "only", StringType()))
    table = ensure_table(catalog, "events.clicks", other)
    assert [f.name for f in table.schema().fields] == ["id", "name", "at"]


def test_a_create_lost_to_a_concurrent_run_loads_the_winners_table(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    winner = ensure_table(catalog, "events.clicks", SCHEMA, SPEC)
    real_load = catalog.load_table
    calls: list[str] = []

    def load_missing_first(name: Any) -> Any:  # the table appears between our load and our create
        calls.append(str(name))
        if len(calls) == 1:
            raise NoSuchTableError(str(name))
        return real_load(name)

    monkeypatch.setattr(catalog, "load_table", load_missing_first)
    table = ensure_table(catalog, "events.clicks", SCHEMA, SPEC)
    assert len(calls) == 2 and table.metadata_location == winner.metadata_location


def test_a_name_without_namespace_is_refused(catalog: Catalog) -> None:
    with pytest.raises(InvalidSinkConfig, match=r"namespace\.table"):
        ensure_table(catalog, "clicks", SCHEMA)
